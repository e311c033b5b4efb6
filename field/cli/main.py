"""The ``field`` command: ``field serve`` starts a Field on uvicorn; ``field mcp``
serves a running Field's operations as MCP tools on stdio."""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib
import importlib.util
import logging
import os
import resource
import socket
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from . import sources as sources_cli

if TYPE_CHECKING:
    import uvicorn

    from ..server.config import Config
    from ..store import EventLog
    from ..transports.access import Responses
    from ..transports.connections import ConnectionGuard

logger = logging.getLogger("field")

#: What ``field serve`` and ``field snapshot`` import besides what every command does
#: (``field --help``, ``field mcp`` and ``field source`` need none of it): an install of
#: the client alone lacks them. Imported by :func:`_server_missing`, before anything else.
SERVER_MODULES = (
    "uvicorn",
    "starlette",
    "field.server.config",
    "field.store",
    "field.ranking.embedding",
    "field.transports.http",
    "field.transports.connections",
    "field.transports.wsprotocol",
    "field.transports.index",
    "field.server.serving",
)
#: How to install them.
SERVER_INSTALL = "pip install 'akashik-field[server]'"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="field", description="Host an Akashik Protocol Field.")
    parser.add_argument("--version", action="version", version=f"field {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    _serve_parser(commands)
    sources_cli.add_parser(commands)
    mcp = commands.add_parser(
        "mcp",
        help="serve a running Field's operations as MCP tools on stdio (needs the mcp extra)",
    )
    mcp.add_argument(
        "--url",
        default=os.environ.get("FIELD_URL", "http://127.0.0.1:8765"),
        help="the Field's base URL (or set FIELD_URL; default http://127.0.0.1:8765)",
    )
    mcp.add_argument(
        "--agent-id", help="act for this agent, registered elsewhere; its token from --token"
    )
    mcp.add_argument(
        "--token",
        default=os.environ.get("FIELD_TOKEN"),
        help="bearer token of --agent-id (better: set FIELD_TOKEN, which ps does not show)",
    )
    mcp.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the Field (30)"
    )
    mcp.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        default="warning",
        help="log verbosity on stderr (default warning)",
    )
    # listed for --help only: main() hands everything after "conformance" to the suite's own
    # parser (its --help included), before this one reads anything
    commands.add_parser(
        "conformance",
        help="check a running Field (this one or any other) against the Akashik protocol, "
        "over the wire; field conformance --help says more",
    )
    snapshot = commands.add_parser(
        "snapshot",
        help="write a snapshot of a log's state now (what field serve does every "
        "--snapshot-entries entries); prints what it wrote as one JSON line",
    )
    snapshot.add_argument(
        "--data-dir",
        type=Path,
        help="directory of the SQLite event log (default ./field-data); a running server "
        "may be using it",
    )
    snapshot.add_argument(
        "--log",
        metavar="URL",
        help="the event log in PostgreSQL instead (or set FIELD_LOG), as field serve takes it",
    )
    snapshot.add_argument(
        "--embedder", help="the embedder the server runs with (default wordllama)"
    )
    snapshot.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        default="warning",
        help="log verbosity on stderr (default warning)",
    )
    return parser


#: What ``field serve --help`` says after the flags: how the environment sets them.
_SERVE_EPILOG = """\
environment:
  Every flag --some-name can be set as the variable FIELD_SOME_NAME instead
  (--port 9000: FIELD_PORT=9000; --in-memory: FIELD_IN_MEMORY=1). A flag wins
  over the environment, the environment over the default. Yes/no settings take
  1, true, yes or on, and 0, false, no or off (--no-metrics: FIELD_METRICS=0);
  list settings (--cors-origin, --allowed-host, --webhook-allow-net) take their
  values separated by commas or spaces. The two token files are the exception:
  FIELD_OPERATOR_TOKEN and FIELD_METRICS_TOKEN hold the tokens themselves.
  A FIELD_ variable that no setting reads is named in a warning at start-up.

  The field mcp and field source commands read FIELD_URL, FIELD_TOKEN and
  FIELD_OPERATOR_TOKEN.
"""


class _ServeHelp(argparse.RawDescriptionHelpFormatter):
    """The epilog as written, and a value's kind in place of its flag's name: N, SECONDS,
    NUMBER, FILE or DIR (``--idle-timeout SECONDS``, not ``IDLE_TIMEOUT``)."""

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        if action.type is int:
            return "N"
        if action.type is float:
            return "SECONDS" if "seconds" in (action.help or "") else "NUMBER"
        if action.type is Path:
            return "DIR" if action.dest.endswith("_dir") else "FILE"
        return super()._get_default_metavar_for_optional(action)


def _serve_parser(commands: Any) -> None:
    """``field serve`` and its flags, in groups a reader looks through in turn."""
    serve = commands.add_parser(
        "serve",
        help="start the Field server",
        usage="field serve [options]",
        description="Start the Field server. By default it listens on http://127.0.0.1:8765\n"
        "and keeps its log in ./field-data; it says where its console, API and\n"
        "metrics are once it listens.",
        epilog=_SERVE_EPILOG,
        formatter_class=_ServeHelp,
    )
    network = serve.add_argument_group("network", "where the Field listens, whom it answers")
    network.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    network.add_argument("--port", type=int, help="port to listen on; 0 picks a free one (8765)")
    network.add_argument(
        "--allowed-host",
        action="append",
        metavar="HOST",
        help="a host name the Field answers to besides localhost and loopback addresses, "
        "e.g. field.example.com:8765, field.example.com:* (any port) or *.example.com; "
        "repeat for more. Bound to loopback, or with any given, a request for another "
        "host is 421 (none; bound elsewhere without any, Host is not checked)",
    )
    network.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="an origin whose browser pages may call the Field, open SSE streams and "
        "WebSockets, e.g. https://app.example.com (* for any); repeat for more (none)",
    )
    network.add_argument(
        "--max-connections",
        type=int,
        help="most open connections, HTTP and WebSocket; past it 503 (50000, "
        "kept below the open-file limit)",
    )
    network.add_argument(
        "--max-connections-per-client",
        type=int,
        help="most open connections from one client address (IPv6: one /64); past it 429 (5000)",
    )
    network.add_argument(
        "--header-timeout",
        type=float,
        help="seconds for a complete request head, from accept or the first byte after "
        "an idle spell; past it 408 (10)",
    )
    network.add_argument(
        "--body-timeout",
        type=float,
        help="seconds for a whole request body, from its head; past it 408 (30)",
    )
    network.add_argument(
        "--idle-timeout",
        type=float,
        help="seconds a kept-alive connection may wait for its next request (30)",
    )
    network.add_argument(
        "--ws-deflate",
        action=argparse.BooleanOptionalAction,
        help="accept WebSocket permessage-deflate when clients offer it: less bandwidth, "
        "about 37 KB more memory per connection and a compression per notification "
        "per subscriber (default off)",
    )
    network.add_argument(
        "--ws-ping-interval",
        type=float,
        help="seconds between WebSocket pings (20)",
    )
    network.add_argument(
        "--ws-ping-timeout",
        type=float,
        help="seconds a WebSocket consumer has to answer a ping, or to take bytes when its "
        "socket is full; past it: an overflow frame and close 4008 (20)",
    )
    storage = serve.add_argument_group(
        "storage and cluster", "where the event log is kept; several servers on one log"
    )
    storage.add_argument(
        "--data-dir",
        type=Path,
        help="directory of the SQLite event log (default ./field-data)",
    )
    storage.add_argument(
        "--in-memory",
        action="store_true",
        default=None,
        help="keep the log in memory only: nothing survives a restart",
    )
    storage.add_argument(
        "--sync",
        choices=["full", "normal"],
        help="SQLite durability: full survives power loss, normal a crash (default full)",
    )
    storage.add_argument(
        "--log",
        metavar="URL",
        help="keep the event log in PostgreSQL, e.g. postgresql://user@host/db (needs the "
        "postgres extra); the data directory still holds the webhook key (default: SQLite "
        "in the data directory)",
    )
    storage.add_argument(
        "--cluster-interval",
        type=float,
        help="with several servers on one --log database: seconds between a server's "
        "presence flushes (1); the delivery lease lasts twice this and is renewed or tried "
        "four times as often, so deliveries move off a dead or hung server within 2.5 times "
        "this",
    )
    storage.add_argument(
        "--node-id",
        help="this server's name among the nodes of one Field on a --log database, shown "
        "by GET /v1/field/status (default <host name>:<port>)",
    )
    storage.add_argument(
        "--snapshot-entries",
        type=int,
        metavar="N",
        help="write a snapshot of the state, in a process of its own, once N entries were "
        "appended since the newest; start-up then replays only the entries after it; 0 never "
        "(100000)",
    )
    storage.add_argument(
        "--snapshot-seconds",
        type=float,
        metavar="M",
        help="also write one M seconds after the last (or start-up) if any entry was "
        "appended; 0 never (600)",
    )
    storage.add_argument(
        "--webhook-key-file",
        type=Path,
        help="key that seals webhook secrets in the log (<data-dir>/webhook.key, made at first "
        "start)",
    )
    the_field = serve.add_argument_group("the Field", "its operator, its relevance, its sources")
    the_field.add_argument(
        "--operator-token-file",
        type=Path,
        help="file holding the operator's bearer token, at least 16 characters (or set "
        "FIELD_OPERATOR_TOKEN); without one the Field has no operator, and what needs "
        "authority 10 is refused (default none)",
    )
    the_field.add_argument(
        "--embedder",
        help="semantic relevance embedder: wordllama[-64|-128] (default: a small sentence "
        "model inside its wheel), hashing (no model: the fastest writes), "
        "sentence-transformers:<model or local path> (installed locally, never downloaded), "
        "or minilm[-<max tokens>] (all-MiniLM-L6-v2 in NumPy: the minilm extra and its model "
        "wheel)",
    )
    the_field.add_argument(
        "--source-tolerance",
        type=float,
        help="seconds a Standard Webhooks timestamp of an inbound event may be off (300)",
    )
    logging_ = serve.add_argument_group("logging and metrics")
    logging_.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        help="log verbosity (default info)",
    )
    logging_.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="log lines as text, or one JSON object per line (default text)",
    )
    logging_.add_argument(
        "--access-log",
        action="store_const",
        const=True,
        help="log every HTTP request and every operation, with its agent, status and "
        "duration (default off)",
    )
    logging_.add_argument(
        "--no-metrics",
        dest="metrics",
        action="store_const",
        const=False,
        help="serve no GET /metrics and count nothing for it (default: metrics on)",
    )
    logging_.add_argument(
        "--metrics-token-file",
        type=Path,
        help="file holding the bearer token GET /metrics asks for (or set "
        "FIELD_METRICS_TOKEN; default: open to whoever reaches the port)",
    )
    limits = serve.add_argument_group(
        "limits", "how much one request, one agent and the writer may take"
    )
    limits.add_argument("--max-body-bytes", type=int, help="largest request body (1 MiB)")
    limits.add_argument("--max-queue", type=int, help="requests waiting for the writer (10000)")
    limits.add_argument(
        "--overload-write-target",
        type=float,
        metavar="SECONDS",
        help="standing delay (event loop lag or queue wait) past which writes are refused "
        "with 503 OVERLOADED and Retry-After until it falls; 0 never (0.02)",
    )
    limits.add_argument(
        "--overload-read-target",
        type=float,
        metavar="SECONDS",
        help="the same for reads (ATTUNE, REPLAY, listings); 0 never (0.25)",
    )
    limits.add_argument(
        "--overload-write-budget",
        type=float,
        metavar="SECONDS",
        help="the writer's work, as measured, that writes admitted and not yet answered may "
        "stand for; past it writes are refused at once; 0 never (0.1)",
    )
    limits.add_argument(
        "--agent-rate",
        type=float,
        help="operations one agent may send per second on average; past it 429; 0 no limit (200)",
    )
    limits.add_argument(
        "--agent-burst", type=int, help="operations one agent may send at once (2000)"
    )
    limits.add_argument(
        "--notify-rate",
        type=float,
        help="notifications written per second to one agent's push connections together; "
        "past it they wait (never dropped); 0 no limit (1000)",
    )
    limits.add_argument(
        "--notify-burst", type=int, help="notifications written to one agent at once (2000)"
    )
    registering = serve.add_argument_group("registration", "who may REGISTER, how many, how fast")
    registering.add_argument(
        "--registration",
        choices=["open", "token", "closed"],
        help="open: anyone registers; token: with a registration token the operator issued; "
        "closed: the operator alone. token and closed need an operator token (open)",
    )
    registering.add_argument(
        "--max-agents",
        type=int,
        help="most registered agents; past it REGISTER is 409 AGENT_LIMIT (100000)",
    )
    registering.add_argument(
        "--register-rate",
        type=float,
        help="REGISTER requests per second from one client address; the operator is not "
        "limited (10)",
    )
    registering.add_argument(
        "--register-burst",
        type=int,
        help="REGISTER requests one client address may make at once (100)",
    )
    push = serve.add_argument_group(
        "push and delivery", "push connections, agents' liveness, subscriptions, MCP sessions"
    )
    push.add_argument("--outbox-frames", type=int, help="frames queued per push connection (10000)")
    push.add_argument("--outbox-bytes", type=int, help="bytes queued per push connection (8388608)")
    push.add_argument(
        "--max-push-per-agent",
        type=int,
        help="most push connections (WebSocket and SSE) of one agent; past it 429 (16)",
    )
    push.add_argument(
        "--failure-grace",
        type=float,
        help="seconds an agent that lost its push connection has to come back (30)",
    )
    push.add_argument(
        "--heartbeat-timeout",
        type=float,
        help="seconds of silence before an agent is declared failed; 0 never (300)",
    )
    push.add_argument(
        "--max-subscription-timeout",
        metavar="DURATION",
        help="longest a subscription lives without activity from its agent, e.g. 72h "
        "(default: only a subscription's own timeout)",
    )
    push.add_argument(
        "--filter-share",
        type=float,
        help="the fraction of one core each agent's subscription filters may use on "
        "average; past it its filtered streams catch up from the log at that pace "
        "(0: no share) (0.05)",
    )
    push.add_argument(
        "--filter-burst",
        type=float,
        help="seconds of filter time an agent may use at once (0.02)",
    )
    push.add_argument(
        "--mcp-max-sessions",
        type=int,
        help="most MCP sessions open at once over HTTP (/mcp), the operator's not counted; "
        "past it 503 (1000)",
    )
    push.add_argument(
        "--mcp-max-sessions-per-client",
        type=int,
        help="most MCP sessions of one client address (IPv6: one /64); past it 429 (100)",
    )
    push.add_argument(
        "--mcp-idle-timeout",
        type=float,
        help="seconds an MCP session may go with no request in flight and no open stream "
        "before it ends (60)",
    )
    webhooks = serve.add_argument_group(
        "webhook and RAP delivery", "the Field's own requests to webhooks and RAP runtimes"
    )
    webhooks.add_argument(
        "--webhook-allow-net",
        action="append",
        metavar="CIDR",
        help="a network receivers may be in although it is not public (loopback, private, "
        "link-local...); repeat for more (none)",
    )
    for name, kind, text in _DELIVERY_FLAGS:
        webhooks.add_argument(f"--{name}", type=kind, help=text)


def _snapshot(args: argparse.Namespace) -> int:
    """``field snapshot``: the same start-up as the server's, then a snapshot written."""
    import orjson

    from ..contract.errors import FieldError
    from ..core.field import Field
    from ..engine.snapshotter import write_snapshot
    from ..ranking.embedding import EmbedderError, load_embedder
    from ..server.config import Config
    from ..store import DB_FILENAME
    from ..store.sqlite import SQLiteEventLog
    from . import redaction

    redaction.install()
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,  # stdout carries the report
    )
    try:
        config = Config.from_env(data_dir=args.data_dir, log=args.log, embedder=args.embedder)
        embedder = load_embedder(config.embedder)
    except (ValueError, OSError, EmbedderError) as exc:
        print(f"field snapshot: {exc}", file=sys.stderr)
        return 2
    try:
        if config.log is not None:
            from ..store.postgres import PostgresEventLog  # the driver is an optional extra

            log: EventLog = PostgresEventLog(config.log)  # beside the server that owns it
        elif config.data_dir is not None:
            log = SQLiteEventLog(config.data_dir / DB_FILENAME, readonly=True)
        else:
            print("field snapshot: a log kept in memory has no snapshots", file=sys.stderr)
            return 2
    except FieldError as exc:
        print(f"field snapshot: {exc.message}", file=sys.stderr)
        return 2
    gc.set_threshold(*GC_THRESHOLDS)  # the server's: a fold makes millions of objects
    try:
        written = write_snapshot(log, Field(limits=config.limits, embedder=embedder))
    except FieldError as exc:
        print(f"field snapshot: {exc.message}", file=sys.stderr)
        return 1
    finally:
        log.close()
    sys.stdout.write(orjson.dumps(written.to_json()).decode() + "\n")
    return 0


def _mcp(args: argparse.Namespace) -> int:
    if (args.agent_id is None) != (args.token is None):
        print("field mcp: --agent-id and --token (or FIELD_TOKEN) go together", file=sys.stderr)
        return 2
    if not args.timeout > 0:
        print("field mcp: --timeout must be positive", file=sys.stderr)
        return 2
    from . import redaction

    redaction.install()
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,  # stdout carries the MCP messages
    )
    if importlib.util.find_spec("mcp") is None:
        print("field mcp: needs the mcp package: pip install 'akashik-field[mcp]'", file=sys.stderr)
        return 2
    from .mcp_bridge import run

    return run(args.url, agent_id=args.agent_id, token=args.token, timeout=args.timeout)


def _conformance(arguments: list[str]) -> int:
    """``field conformance``: the suite in ``conformance/``, imported only when asked for."""
    try:
        from akashik_conformance.cli import main as conformance
    except ModuleNotFoundError:
        print(
            "field conformance: the suite (akashik_conformance) is not installed: "
            "pip install . from a checkout, or run python -m akashik_conformance from its "
            "folder conformance/",
            file=sys.stderr,
        )
        return 2
    result: int = conformance(arguments, prog="field conformance")
    return result


#: The delivery flags given as they are: (flag, type, help with the default).
_DELIVERY_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("webhook-connect-timeout", float, "seconds to connect to a receiver (5)"),
    ("webhook-timeout", float, "seconds for a whole delivery request (15)"),
    ("webhook-max-response-bytes", int, "bytes of a receiver's answer read at most (65536)"),
    ("webhook-concurrency", int, "delivery requests under way at once (256)"),
    ("webhook-concurrency-per-host", int, "delivery requests under way to one host (32)"),
    ("webhook-concurrency-per-agent", int, "delivery requests of one agent under way (64)"),
    ("webhook-retry-base", float, "seconds of the first retry's longest wait (1)"),
    ("webhook-retry-cap", float, "seconds of the longest wait between retries (60)"),
    ("webhook-max-attempts", int, "failed attempts of a notification before failing (10)"),
    ("webhook-max-age", float, "seconds a notification may fail before failing (3600)"),
    ("webhook-failing-interval", float, "seconds between attempts while failing (300)"),
    ("webhook-suspend-after", float, "seconds of failing before suspended (86400)"),
    ("delivery-rate", float, "notifications per second one delivery sends at most (50)"),
    ("delivery-burst", int, "notifications one delivery may send in a burst (100)"),
    ("delivery-rest-after", float, "seconds a caught-up delivery stays attached (30)"),
    ("max-subscriptions-per-thread", int, "active subscriptions one RAP thread may hold (32)"),
    ("rap-max-invocations", int, "RAP invocations running at once; past it 503 (256)"),
)


def _config(args: argparse.Namespace) -> Config:
    from ..server.config import Config

    delivery = {
        name.replace("-", "_"): getattr(args, name.replace("-", "_"))
        for name, _, _ in _DELIVERY_FLAGS
    }
    return Config.from_env(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        sync=args.sync,
        max_body_bytes=args.max_body_bytes,
        max_queue=args.max_queue,
        overload_write_target=args.overload_write_target,
        overload_read_target=args.overload_read_target,
        overload_write_budget=args.overload_write_budget,
        outbox_frames=args.outbox_frames,
        outbox_bytes=args.outbox_bytes,
        log_level=args.log_level,
        failure_grace=args.failure_grace,
        heartbeat_timeout=args.heartbeat_timeout,
        max_subscription_timeout=args.max_subscription_timeout,
        embedder=args.embedder,
        ws_deflate=args.ws_deflate,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        max_push_per_agent=args.max_push_per_agent,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        idle_timeout=args.idle_timeout,
        webhook_allow_net=tuple(args.webhook_allow_net) if args.webhook_allow_net else None,
        webhook_key_file=args.webhook_key_file,
        source_tolerance=args.source_tolerance,
        ws_ping_interval=args.ws_ping_interval,
        ws_ping_timeout=args.ws_ping_timeout,
        registration=args.registration,
        max_agents=args.max_agents,
        register_rate=args.register_rate,
        register_burst=args.register_burst,
        agent_rate=args.agent_rate,
        agent_burst=args.agent_burst,
        notify_rate=args.notify_rate,
        notify_burst=args.notify_burst,
        cors_origin=tuple(args.cors_origin) if args.cors_origin else None,
        allowed_host=tuple(args.allowed_host) if args.allowed_host else None,
        mcp_max_sessions=args.mcp_max_sessions,
        mcp_max_sessions_per_client=args.mcp_max_sessions_per_client,
        mcp_idle_timeout=args.mcp_idle_timeout,
        filter_share=args.filter_share,
        filter_burst=args.filter_burst,
        **delivery,
        operator_token=(
            args.operator_token_file.read_text().strip() if args.operator_token_file else None
        ),
        metrics=args.metrics,
        metrics_token=(
            args.metrics_token_file.read_text().strip() if args.metrics_token_file else None
        ),
        log_format=args.log_format,
        access_log=args.access_log,
        log=args.log,
        cluster_interval=args.cluster_interval,
        node_id=args.node_id,
        snapshot_entries=args.snapshot_entries,
        snapshot_seconds=args.snapshot_seconds,
        in_memory=args.in_memory,
    )


def __getattr__(name: str) -> Any:
    """``_Server``, the name :class:`field.server.serving.FieldServer` had here, imported when asked
    for: uvicorn is the server's dependency, not every command's."""
    if name == "_Server":
        from ..server.serving import FieldServer

        return FieldServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Garbage-collector thresholds of ``field serve``. Fanning out makes many short-lived
#: objects (notifications, frames); at Python's default (700, 10, 10) the young
#: generations are collected hundreds of times a second and survivors queued in
#: outboxes reach the old generation, whose full collections stall every stream.
GC_THRESHOLDS = (50_000, 20, 100)


def _tune_gc() -> None:
    """Fewer collections, and none of them through what start-up left behind."""
    gc.collect()
    gc.freeze()  # modules and the app: never garbage
    gc.set_threshold(*GC_THRESHOLDS)


#: Pending connections the kernel queues for ``accept``. The event loop accepts as
#: many in one go before it can refuse any, so they are part of the reserve below.
LISTEN_BACKLOG = 2048
#: File descriptors kept from connections: stdio, the listening socket, the event
#: loop's, the SQLite files, a model's files, lingering refusals (at most
#: ``connections.MAX_LINGERING``), and one burst of accepts (the backlog).
FD_RESERVE = LISTEN_BACKLOG + 256


def connection_cap(wanted: int, open_files: int) -> int:
    """The most connections that ``open_files`` descriptors leave room for, at most
    ``wanted``: :data:`FD_RESERVE` is kept (half the descriptors, if they are few)."""
    reserve = min(FD_RESERVE, open_files // 2)
    return max(1, min(wanted, open_files - reserve))


def raise_open_file_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # e.g. macOS: OPEN_MAX
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _fit_connections(config: Config) -> Config:
    """``config`` with ``max_connections`` lowered to what the open-file limit allows."""
    open_files = raise_open_file_limit()
    cap = connection_cap(config.max_connections, open_files)
    if cap < config.max_connections:
        # a warning if the user asked for more; below the default, a note for debugging
        default = next(f.default for f in fields(config) if f.name == "max_connections")
        asked = config.max_connections != default
        logger.log(
            logging.WARNING if asked else logging.DEBUG,
            "at most %d connections, not %d: the open-file limit is %d",
            cap,
            config.max_connections,
            open_files,
        )
        config = replace(config, max_connections=cap)
    return config


#: ``log_config`` of :func:`uvicorn_config` by default: uvicorn's own logging configuration.
UVICORN_LOGGING: Any = object()


def uvicorn_config(
    app: Any,
    config: Config,
    *,
    guard: ConnectionGuard | None = None,
    responses: Responses | None = None,
    log_config: Any = UVICORN_LOGGING,
) -> uvicorn.Config:
    """uvicorn's settings for serving ``app``, for ``field serve`` and the tests' servers.

    HTTP is :class:`FieldHttpProtocol` (connection caps and deadlines, one guard
    for the server), whose ``idle_timeout`` replaces uvicorn's keep-alive timer.
    The app is served behind :class:`~field.transports.access.AccessLog`: each request's
    id, and with ``--access-log`` the Field's access lines (uvicorn's own are off).
    ``guard`` and ``responses`` are the app's (``create_app`` makes them: its metrics
    read them); else a guard of ``config``'s bounds is made here, counted nowhere.
    ``log_config`` None leaves logging as the caller set it up (``field serve``:
    :mod:`field.cli.logs`).
    """
    import uvicorn

    from ..transports.access import AccessLog
    from ..transports.connections import ConnectionGuard, FieldHttpProtocol
    from ..transports.wsprotocol import FieldWebSocketProtocol

    if log_config is UVICORN_LOGGING:
        log_config = uvicorn.config.LOGGING_CONFIG
    if guard is None:
        guard = ConnectionGuard(config.connection_limits())
    return uvicorn.Config(
        AccessLog(app, enabled=config.access_log, responses=responses),
        interface="asgi3",  # AccessLog returns a coroutine; uvicorn cannot tell by looking
        # with the caller's logging (log_config None), the levels are the caller's too
        log_level=config.log_level if log_config is not None else None,
        log_config=log_config,
        lifespan="on",
        access_log=False,  # the Field logs each request itself (AccessLog)
        timeout_graceful_shutdown=10,
        backlog=LISTEN_BACKLOG,
        http=functools.partial(FieldHttpProtocol, guard=guard),  # type: ignore[arg-type]
        ws=FieldWebSocketProtocol,
        ws_per_message_deflate=config.ws_deflate,
        ws_max_size=config.limits.max_body_bytes,
        ws_ping_interval=config.ws_ping_interval,
        ws_ping_timeout=config.ws_ping_timeout,
    )


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on such sockets,
    # and without it every kept-alive response waits for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def serve(config: Config) -> int:
    """Run the server until SIGINT or SIGTERM; returns the exit status."""
    from ..contract.errors import FieldError
    from ..ranking.embedding import EmbedderError, load_embedder
    from ..server.app import create_app, webhook_key_of
    from ..server.config import unknown_variables
    from ..server.serving import FieldServer
    from ..store import open_log
    from . import logs, redaction

    redaction.install()  # no secret in any log line, at any level
    logs.configure(config.log_level, config.log_format)
    for name, nearest in unknown_variables(os.environ):
        logger.warning(
            "%s is set but no setting reads it: ignored%s",
            name,
            f" (did you mean {nearest}?)" if nearest else "",
        )
    try:
        embedder = load_embedder(config.embedder)
    except EmbedderError as exc:
        logger.error("%s", exc)
        return 2
    try:
        sock = _bind(config.host, config.port)
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", config.host, config.port, exc)
        return 2
    config = _fit_connections(replace(config, port=sock.getsockname()[1]))
    try:
        log = open_log(config.data_dir, synchronous=config.sync, url=config.log)
    except FieldError as exc:
        if config.log is None:
            logger.error("cannot open the event log in %s: %s", config.data_dir, exc.message)
        else:  # the message names the database, without credentials: say what to do
            stop = "" if exc.message.endswith((".", "?", "!")) else "."
            logger.error("%s%s %s", exc.message, stop, exc.suggested_action or "")
        sock.close()
        return 2
    try:
        key = webhook_key_of(config)  # after the log's lock: one process makes the key
    except FieldError as exc:
        logger.error("cannot read the webhook key: %s", exc.message)
        log.close()
        sock.close()
        return 2
    app = create_app(config, log=log, embedder=embedder, webhook_key=key)
    settings = uvicorn_config(
        app,
        config,
        guard=app.state.guard,
        responses=app.state.responses,
        log_config=None,
    )

    def started() -> None:
        for line in ready_lines(config, mcp=getattr(app.state, "mcp", None) is not None):
            logger.info("%s", line)

    server = FieldServer(settings, app, on_started=started)
    _tune_gc()
    try:
        server.run(sockets=[sock])
    finally:
        log.close()
    return 0 if server.started else 1


#: Host addresses that mean every interface, and the loopback address to reach them by.
_EVERY_INTERFACE = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def ready_lines(config: Config, *, mcp: bool = False) -> list[str]:
    """What ``field serve`` says once it takes connections: where it listens, where its
    console, API and metrics are, where its log is kept and whether it has an operator."""
    from ..store import redact_log_url
    from ..transports.index import CONSOLE_PATH, MCP_PATH, METRICS_PATH, OPENAPI_PATH

    host = _EVERY_INTERFACE.get(config.host, config.host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{config.port}"
    where = f" (bound to {config.host}: every interface)" if host != config.host else ""
    if not config.metrics:
        metrics = "off (--no-metrics)"
    elif config.metrics_token is not None:
        metrics = f"{url}{METRICS_PATH}, with the metrics token (bearer)"
    else:
        metrics = (
            f"{url}{METRICS_PATH}, open to whoever reaches the port "
            "(--metrics-token-file or FIELD_METRICS_TOKEN asks for a token)"
        )
    if config.log is not None:
        log = f"PostgreSQL, {redact_log_url(config.log)}"
    elif config.data_dir is not None:
        log = f"SQLite, in {config.data_dir.resolve()}"
    else:
        log = "in memory: nothing survives a restart (--data-dir DIR keeps it)"
    if config.operator_token is not None:
        operator = "token set: the operator acts at authority 10"
    else:
        operator = (
            "none: what needs the operator (REGISTER above authority 4, the MERGE of an "
            "escalated conflict, sources, registration tokens) is refused; set a token "
            "with --operator-token-file FILE or FIELD_OPERATOR_TOKEN"
        )
    lines = [
        f"Field ready at {url}{where}",
        f"  console:  {url}{CONSOLE_PATH} (GET / leads there)",
        f"  API:      {url}{OPENAPI_PATH} (OpenAPI 3.1)",
        f"  metrics:  {metrics}",
        f"  log:      {log}",
        f"  operator: {operator}",
    ]
    if mcp:
        lines.insert(3, f"  MCP:      {url}{MCP_PATH} (Streamable HTTP)")
    return lines


def _server_missing(command: str) -> str | None:
    """Why ``command`` cannot run here: the server's dependency it lacks, and how to
    install them; None if it has them all."""
    for name in SERVER_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = exc.name or name
            if missing == "field" or missing.startswith("field."):
                raise  # a module of this package: a bug, not an install to fix
            return (
                f"field {command} needs the server's dependencies: {SERVER_INSTALL} "
                f"(missing: {missing})"
            )
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["conformance"]:  # every argument after it is the suite's
        return _conformance(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "mcp":
        return _mcp(args)
    if args.command == "source":
        return sources_cli.run(args)
    missing = _server_missing(args.command)  # serve and snapshot
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    if args.command == "snapshot":
        return _snapshot(args)
    try:
        config = _config(args)
    except (ValueError, OSError) as exc:
        print(f"field: {exc}", file=sys.stderr)
        return 2
    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
