"""Server configuration: typed, bounded, read once at start-up.

Every setting has a command-line flag (``field serve --help``) and an
environment variable ``FIELD_<NAME>``; a flag wins over the environment,
and the environment over the default. A ``FIELD_`` variable that nothing
reads is named at start-up (:func:`unknown_variables`): a misspelt setting
would otherwise be ignored without a word.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..contract.model import Limits
from ..contract.ratelimit import Rate
from ..core.egress import EgressPolicy, parse_networks
from ..core.field import DEFAULT_MAX_AGENTS
from ..core.registration import POLICIES, REGISTER_BURST, REGISTER_RATE
from ..core.validation import duration_seconds
from ..engine.admission import AdmissionPolicy
from ..engine.delivery import DeliverySettings
from ..engine.ratelimits import (
    DEFAULT_AGENT_BURST,
    DEFAULT_AGENT_RATE,
    DEFAULT_NOTIFY_BURST,
    DEFAULT_NOTIFY_RATE,
    rate_of,
)
from ..engine.router import DEFAULT_MAX_PER_AGENT, PushLimits
from ..engine.snapshotter import DEFAULT_ENTRIES as DEFAULT_SNAPSHOT_ENTRIES
from ..engine.snapshotter import DEFAULT_SECONDS as DEFAULT_SNAPSHOT_SECONDS
from ..engine.snapshotter import SnapshotPolicy
from ..subscriptions.delivery import RetryPolicy
from ..subscriptions.filtering import FilterTime
from ..transports.connections import ConnectionLimits
from ..transports.cors import parse_origins
from ..transports.hosts import AllowedHosts, parse_allowed_hosts


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Settings of one ``field serve`` process."""

    host: str = "127.0.0.1"
    port: int = 8765
    #: Directory of the SQLite log; ``None`` keeps the log in memory (tests, demos).
    data_dir: Path | None = Path("./field-data")
    #: SQLite synchronous mode: "full" survives power loss, "normal" a process crash.
    sync: str = "full"
    #: Bound on requests waiting for the writer; past it requests get OVERLOADED.
    max_queue: int = 10_000
    #: Most operations committed in one group commit.
    max_batch: int = 512
    log_level: str = "info"
    #: Seconds an agent whose last push connection dropped has to come back.
    failure_grace: float = 30.0
    #: Seconds of silence (no request, no connection) before an agent fails; 0: never.
    heartbeat_timeout: float = 300.0
    #: The operator's bearer token (authority 10, spec 11.2); None: no operator.
    operator_token: str | None = field(default=None, repr=False)
    #: Embedder of semantic relevance: "wordllama" (a small sentence model shipped inside the
    #: server's wheel), "hashing" (no model: the fastest writes), "minilm" or
    #: "sentence-transformers:<model or path>".
    embedder: str = "wordllama"
    #: Accept WebSocket permessage-deflate when a client offers it (browsers always do). Off:
    #: its zlib state costs about 37 KB per connection, and every notification is then
    #: compressed once per subscriber.
    ws_deflate: bool = False
    #: Most open connections, HTTP and WebSocket together (``field serve`` keeps it
    #: below the open-file limit). Past it a connection is answered 503 and closed.
    max_connections: int = 50_000
    #: Most open connections from one client address (an IPv6 /64); past it, 429.
    max_connections_per_client: int = 5_000
    #: Most push connections (WebSocket and SSE together) of one agent; past it, 429 / 4429.
    max_push_per_agent: int = DEFAULT_MAX_PER_AGENT
    #: Seconds from accept (or the first byte after an idle spell) to a complete
    #: request head; past it, 408 and the connection closes.
    header_timeout: float = 10.0
    #: Seconds from a request's head to the end of its body; past it, 408.
    body_timeout: float = 30.0
    #: Seconds a kept-alive connection may wait for its next request.
    idle_timeout: float = 30.0
    #: Networks webhooks and RAP callbacks may reach although they are not public
    #: (``--webhook-allow-net``, repeatable; e.g. 10.0.0.0/8 for receivers on a LAN).
    webhook_allow_net: tuple[str, ...] = ()
    #: File of the key that seals webhook secrets in the log; None: ``<data-dir>/webhook.key``
    #: (made at first start), or a key of this process only for an in-memory log.
    webhook_key_file: Path | None = None
    #: Seconds to connect to a receiver, and for a whole delivery request.
    webhook_connect_timeout: float = 5.0
    webhook_timeout: float = 15.0
    #: Bytes of a receiver's answer that are read (the rest is not).
    webhook_max_response_bytes: int = 65_536
    #: Each agent's share of the time subscription filters take: the fraction of one core
    #: its filters may use on average, and the seconds they may use at once (0: no share,
    #: filters run as they come). An agent past it has its filtered streams catch up from
    #: the log at the pace its share allows (protocol/README.md, "Filters").
    filter_share: float = 0.05
    filter_burst: float = 0.02
    #: Delivery requests under way at once, in all and to one host.
    webhook_concurrency: int = 256
    webhook_concurrency_per_host: int = 32
    #: Delivery requests of one agent under way at once (its share of the ones in all,
    #: which go to the agents waiting in turn); at most ``webhook_concurrency``.
    webhook_concurrency_per_agent: int = 64
    #: A notification failing this many times, or for this many seconds, makes its
    #: delivery ``failing``; failing, it is tried every ``failing_interval`` seconds and
    #: ``suspended`` after ``suspend_after`` seconds.
    #: A failed attempt waits a random part of ``retry_base * 2**(n-1)`` seconds, at
    #: most ``retry_cap`` (and never less than the receiver's Retry-After).
    webhook_retry_base: float = 1.0
    webhook_retry_cap: float = 60.0
    webhook_max_attempts: int = 10
    webhook_max_age: float = 3600.0
    webhook_failing_interval: float = 300.0
    webhook_suspend_after: float = 86_400.0
    #: Notifications one durable delivery sends per second at most, and in a burst.
    delivery_rate: float = 50.0
    delivery_burst: int = 100
    #: Seconds a caught-up delivery stays attached to the push hub before it lets go of
    #: its outbox and stream, dormant until a match wakes it (``--delivery-rest-after``).
    delivery_rest_after: float = 30.0
    #: RAP invocations running at once (from their 200 to their tool result); past it, 503.
    rap_max_invocations: int = 256
    #: Longest a subscription lives without activity from its agent (a duration such as
    #: "72h"; ``--max-subscription-timeout``); None: subscriptions expire only by their own
    #: ``timeout``. Sets ``limits.max_subscription_timeout_s``.
    max_subscription_timeout: str | None = None
    #: Seconds a Standard Webhooks ``webhook-timestamp`` of an inbound event may be from
    #: the Field's time (either way); past it the event is refused as stale.
    source_tolerance: float = 300.0
    #: Seconds between WebSocket pings, and the seconds a consumer has to answer one, or
    #: to take bytes while a send waits for its socket; past either it is stalled and
    #: closed with an ``overflow`` frame (4008).
    ws_ping_interval: float = 20.0
    ws_ping_timeout: float = 20.0
    #: Seconds of standing delay (the event loop's lag, or the oldest queued request's
    #: wait) past which writes, and past the second target reads too, are refused with
    #: ``503 OVERLOADED`` until it falls (``field.engine.admission``); 0 turns shedding off.
    overload_write_target: float = 0.02
    overload_read_target: float = 0.25
    #: Seconds of the writer's work (commit and push fan-out, as measured) that writes
    #: admitted and not yet answered may stand for; past it one more write is refused at
    #: once with ``503 OVERLOADED``. 0 turns that bound off.
    overload_write_budget: float = 0.1
    #: Who may REGISTER: "open" (anyone), "token" (with a registration token the operator
    #: issued) or "closed" (the operator alone); "token" and "closed" need an operator token.
    registration: str = "open"
    #: Most registered agents (not counting deregistered ones); past it REGISTER is 409
    #: AGENT_LIMIT. About 0.5 KB of memory each, 3 KB with a subscription: a few hundred MB.
    max_agents: int = DEFAULT_MAX_AGENTS
    #: REGISTER requests one client address (an IPv6 /64) may make per second, and at
    #: once; past it, 429 RATE_LIMITED with Retry-After. The operator is not limited.
    register_rate: float = REGISTER_RATE
    register_burst: int = REGISTER_BURST
    #: Operations one agent may send a second on average, and at once; past them
    #: ``429 RATE_LIMITED``. 0: no limit.
    agent_rate: float = DEFAULT_AGENT_RATE
    agent_burst: int = DEFAULT_AGENT_BURST
    #: Notifications one agent's push connections are written a second, all together,
    #: and at once; past them they wait in the outbox. 0: no limit.
    notify_rate: float = DEFAULT_NOTIFY_RATE
    notify_burst: int = DEFAULT_NOTIFY_BURST
    #: Origins whose browser pages may call the Field, open SSE streams and WebSockets
    #: (``--cors-origin``, repeatable; ``*``: any); none by default (``field.transports.cors``).
    cors_origin: tuple[str, ...] = ()
    #: Host names the Field answers to besides the loopback names (``--allowed-host``,
    #: repeatable; ``field.transports.hosts``). Bound to loopback, or with any given, a
    #: request whose ``Host`` is another is 421; bound elsewhere with none, not checked.
    allowed_host: tuple[str, ...] = ()
    #: Most MCP sessions open at once over HTTP (``/mcp``); past it a new one is 503. The
    #: operator's are not counted (it is never locked out).
    mcp_max_sessions: int = 1000
    #: Most MCP sessions of one client address (an IPv6 /64); past it, 429.
    mcp_max_sessions_per_client: int = 100
    #: Seconds an MCP session may go with no request in flight (an open GET stream is one)
    #: before it ends.
    mcp_idle_timeout: float = 60.0
    limits: Limits = field(default_factory=Limits)
    push: PushLimits = field(default_factory=PushLimits)
    #: Serve ``GET /metrics`` and count what it shows; off (``--no-metrics``): neither.
    metrics: bool = True
    #: The bearer token ``GET /metrics`` asks for (``--metrics-token-file``); None: open.
    metrics_token: str | None = field(default=None, repr=False)
    #: "text" (one line of text per record) or "json" (one JSON object per line).
    log_format: str = "text"
    #: Log every HTTP request in one line (its request id, agent, operation, status,
    #: duration), every operation sent on a WebSocket, and each push connection's opening
    #: and closing (:mod:`field.transports.access`).
    access_log: bool = False
    #: The event log in PostgreSQL (``postgresql://user@host/db``); None: SQLite in
    #: ``data_dir``. Kept out of repr: the URL may carry a password.
    log: str | None = field(default=None, repr=False)
    #: Seconds between a node's presence flushes and delivery-lease tries when several
    #: servers share one ``log`` database; a dead node's deliveries move within about
    #: twice this, its connections stop counting after five times this.
    cluster_interval: float = 1.0
    #: This process's name among the nodes of a Field on a shared log (status, logs);
    #: None: ``<host name>:<port>``.
    node_id: str | None = None
    #: A snapshot of the state is written (by a process of its own) once this many entries
    #: were appended since the newest one, or once this many seconds passed since the last
    #: one if any were; start-up then folds only the entries after it. 0 turns either off.
    snapshot_entries: int = DEFAULT_SNAPSHOT_ENTRIES
    snapshot_seconds: float = DEFAULT_SNAPSHOT_SECONDS

    def __post_init__(self) -> None:
        if self.max_subscription_timeout is not None:
            seconds = duration_seconds(self.max_subscription_timeout)
            if seconds is None:
                raise ValueError(
                    "max_subscription_timeout must be a duration such as 90s, 30m, 72h or "
                    f"1h30m, not {self.max_subscription_timeout[:40]!r}"
                )
            limits = replace(self.limits, max_subscription_timeout_s=math.ceil(seconds))
            object.__setattr__(self, "limits", limits)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, not {self.port}")
        if self.sync not in ("full", "normal"):
            raise ValueError(f'sync must be "full" or "normal", not {self.sync!r}')
        if self.max_queue < 1 or self.max_batch < 1:
            raise ValueError("max_queue and max_batch must be positive")
        if self.failure_grace <= 0 or self.heartbeat_timeout < 0:
            raise ValueError("failure_grace must be positive and heartbeat_timeout not negative")
        if self.operator_token is not None and len(self.operator_token) < 16:
            raise ValueError("operator_token must be at least 16 characters")
        if self.limits.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if self.push.outbox_bytes < self.limits.max_response_bytes:
            # a read's response frame must fit one WebSocket outbox, or it cuts the socket
            raise ValueError(
                f"outbox_bytes ({self.push.outbox_bytes}) must be at least max_response_bytes "
                f"({self.limits.max_response_bytes})"
            )
        for name in ("max_connections", "max_connections_per_client", "max_push_per_agent"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in (
            *_TIMEOUTS,
            *_DELIVERY_SECONDS,
            "delivery_rate",
            "source_tolerance",
            "ws_ping_interval",
            "ws_ping_timeout",
        ):
            seconds = getattr(self, name)
            if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
                raise ValueError(f"{name} must be a positive number, at most {MAX_TIMEOUT:g}")
        for name in _DELIVERY_COUNTS:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.limits.max_subscriptions_per_thread < 1:
            raise ValueError("max_subscriptions_per_thread must be at least 1")
        parse_networks(self.webhook_allow_net)  # ValueError naming a bad one
        for name in _OVERLOAD_TARGETS:
            seconds = getattr(self, name)
            if not (math.isfinite(seconds) and 0 <= seconds <= MAX_TIMEOUT):
                raise ValueError(f"{name} must be a number of seconds (0: off), not {seconds!r}")
        for name in ("agent_rate", "notify_rate"):
            rate = getattr(self, name)
            if not (math.isfinite(rate) and rate >= 0):
                raise ValueError(f"{name} must be a number, 0 (no limit) or more, not {rate}")
        for name in (
            "agent_burst",
            "notify_burst",
            "mcp_max_sessions",
            "mcp_max_sessions_per_client",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not (math.isfinite(self.filter_share) and 0 <= self.filter_share <= 1):
            raise ValueError(f"filter_share must be from 0 (off) to 1, not {self.filter_share}")
        if not (math.isfinite(self.filter_burst) and 0.001 <= self.filter_burst <= 10):
            raise ValueError(f"filter_burst must be 0.001 to 10 seconds, not {self.filter_burst}")
        if not (math.isfinite(self.mcp_idle_timeout) and 0 < self.mcp_idle_timeout <= MAX_TIMEOUT):
            raise ValueError(f"mcp_idle_timeout must be a positive number, at most {MAX_TIMEOUT:g}")
        self._check_registration()
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be text or json, not {self.log_format[:20]!r}")
        if self.metrics_token is not None and len(self.metrics_token) < 16:
            raise ValueError("metrics_token must be at least 16 characters")
        object.__setattr__(self, "cors_origin", parse_origins(self.cors_origin))
        object.__setattr__(self, "allowed_host", parse_allowed_hosts(self.allowed_host))
        if self.log is not None and not self.log.startswith(("postgresql://", "postgres://")):
            raise ValueError("log must be a postgresql:// URL")
        if not (math.isfinite(self.cluster_interval) and 0.05 <= self.cluster_interval <= 60):
            raise ValueError(
                f"cluster_interval must be between 0.05 and 60 seconds, not {self.cluster_interval}"
            )
        if self.snapshot_entries < 0:
            raise ValueError(
                f"snapshot_entries must be 0 (off) or more, not {self.snapshot_entries}"
            )
        seconds = self.snapshot_seconds
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_SNAPSHOT_SECONDS):
            raise ValueError(
                f"snapshot_seconds must be 0 (off) to {MAX_SNAPSHOT_SECONDS:g}, not {seconds!r}"
            )

    def snapshot_policy(self) -> SnapshotPolicy:
        """When the server writes a snapshot of the state."""
        return SnapshotPolicy(entries=self.snapshot_entries, seconds=self.snapshot_seconds)

    def filter_time(self) -> FilterTime | None:
        """Each agent's share of filter time (None: off)."""
        if self.filter_share == 0:
            return None
        return FilterTime(self.filter_share, self.filter_burst)

    def admission_policy(self) -> AdmissionPolicy:
        """The targets of admission control."""
        return AdmissionPolicy(
            write_target=self.overload_write_target,
            read_target=self.overload_read_target,
            write_budget=self.overload_write_budget,
        )

    def _check_registration(self) -> None:
        if self.registration not in POLICIES:
            raise ValueError(
                f"registration must be one of {', '.join(POLICIES)}, not {self.registration!r}"
            )
        if self.registration != "open" and self.operator_token is None:
            raise ValueError(
                f"registration {self.registration!r} needs an operator token "
                "(--operator-token-file or FIELD_OPERATOR_TOKEN): without one nobody could "
                "register an agent or issue a registration token"
            )
        if self.max_agents < 1 or self.register_burst < 1:
            raise ValueError("max_agents and register_burst must be at least 1")
        if not (math.isfinite(self.register_rate) and self.register_rate > 0):
            raise ValueError("register_rate must be a positive number")

    def agent_rate_limit(self) -> Rate | None:
        """The rate of each agent's operations; None: not limited."""
        return rate_of(self.agent_rate, self.agent_burst)

    def notify_rate_limit(self) -> Rate | None:
        """The rate of the notifications written to each agent; None: not limited."""
        return rate_of(self.notify_rate, self.notify_burst)

    def allowed_hosts(self) -> AllowedHosts:
        """The host names the Field answers to, bound where it is."""
        return AllowedHosts(self.host, self.allowed_host)

    def egress_policy(self) -> EgressPolicy:
        """Where webhooks and RAP callbacks may be delivered."""
        return EgressPolicy(parse_networks(self.webhook_allow_net))

    def connection_limits(self) -> ConnectionLimits:
        """The bounds the connection guard enforces."""
        return ConnectionLimits(
            max_connections=self.max_connections,
            max_connections_per_client=self.max_connections_per_client,
            header_timeout=self.header_timeout,
            body_timeout=self.body_timeout,
            idle_timeout=self.idle_timeout,
        )

    def delivery_settings(self) -> DeliverySettings:
        """The bounds of durable deliveries."""
        return DeliverySettings(
            connect_timeout=self.webhook_connect_timeout,
            timeout=self.webhook_timeout,
            max_response_bytes=self.webhook_max_response_bytes,
            concurrency=self.webhook_concurrency,
            concurrency_per_host=self.webhook_concurrency_per_host,
            concurrency_per_agent=self.webhook_concurrency_per_agent,
            rate=self.delivery_rate,
            rest_after=self.delivery_rest_after,
            burst=self.delivery_burst,
            retry=RetryPolicy(
                base=self.webhook_retry_base,
                cap=self.webhook_retry_cap,
                max_attempts=self.webhook_max_attempts,
                max_age=self.webhook_max_age,
                failing_interval=self.webhook_failing_interval,
                suspend_after=self.webhook_suspend_after,
            ),
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Defaults, then ``FIELD_*`` variables, then ``overrides`` (None means unset).

        ``max_body_bytes`` and ``max_subscriptions_per_thread`` set those
        ``limits``; ``outbox_frames`` and ``outbox_bytes`` set the push limits
        of every connection. ``in_memory`` (``FIELD_IN_MEMORY``, ``--in-memory``)
        keeps the log in memory: ``data_dir`` None, whatever ``FIELD_DATA_DIR`` says
        (a ``data_dir`` given wins over ``FIELD_IN_MEMORY``, not over ``in_memory``).
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in setting_names():
            raw = environ.get(f"FIELD_{name.upper()}")
            if raw is not None:
                values[name] = _parse(name, raw)
        if values.pop("in_memory", False):  # over FIELD_DATA_DIR; a data_dir given wins
            values["data_dir"] = None
        values.update({k: v for k, v in overrides.items() if v is not None})
        if values.pop("in_memory", False):  # given: over a data_dir given too
            values["data_dir"] = None
        nested = {name: int(values.pop(name)) for name in _NESTED if name in values}
        config = cls(**values)
        in_limits = {k: nested.pop(k) for k in _IN_LIMITS if k in nested}
        if in_limits:
            config = replace(config, limits=replace(config.limits, **in_limits))
        if nested:
            config = replace(config, push=replace(config.push, **nested))
        return config


def setting_names() -> tuple[str, ...]:
    """The name of every setting ``FIELD_<NAME>`` sets (``in_memory`` among them)."""
    names = tuple(f.name for f in fields(Config) if f.name not in ("limits", "push"))
    return (*names, *_NESTED, "in_memory")


#: ``FIELD_`` variables that are no setting of ``field serve`` but that something of this
#: project reads: ``field mcp`` and ``field source`` (``FIELD_URL``, ``FIELD_TOKEN``), the
#: examples (``FIELD_AGENT_DIR``) and the tests.
OTHER_VARIABLES = frozenset(
    {
        "FIELD_URL",
        "FIELD_TOKEN",
        "FIELD_AGENT_DIR",
        "FIELD_TEST_POSTGRES",
        "FIELD_FAULTS_SEED",
        "FIELD_ARTIFACTS",
        "FIELD_UPDATE_SCREENSHOTS",
    }
)


def known_variables() -> frozenset[str]:
    """Every ``FIELD_`` variable something reads: the settings' and :data:`OTHER_VARIABLES`."""
    return OTHER_VARIABLES | {f"FIELD_{name.upper()}" for name in setting_names()}


def unknown_variables(names: Iterable[str]) -> list[tuple[str, str | None]]:
    """The ``FIELD_`` names among ``names`` (an environment's) that nothing reads, sorted,
    each with the known name nearest to it (a likely misspelling), or None if none is near.
    """
    known = known_variables()
    candidates = sorted(known)
    unknown = sorted({n for n in names if n.startswith("FIELD_") and n not in known})
    return [(name, _nearest(name, candidates)) for name in unknown]


def _nearest(name: str, candidates: list[str]) -> str | None:
    """The candidate most like ``name`` after the ``FIELD_`` they share, if it is alike."""
    prefix = len("FIELD_")
    close = difflib.get_close_matches(
        name[prefix:], [c[prefix:] for c in candidates], n=1, cutoff=0.7
    )
    return f"FIELD_{close[0]}" if close else None


#: Settings that live inside ``limits`` or ``push``.
_IN_LIMITS = ("max_body_bytes", "max_subscriptions_per_thread")
_NESTED = (*_IN_LIMITS, "outbox_frames", "outbox_bytes")
_DELIVERY_SECONDS = (
    "webhook_connect_timeout",
    "webhook_timeout",
    "webhook_retry_base",
    "webhook_retry_cap",
    "webhook_max_age",
    "webhook_failing_interval",
    "webhook_suspend_after",
    "delivery_rest_after",
)
_DELIVERY_COUNTS = (
    "webhook_max_response_bytes",
    "webhook_concurrency",
    "webhook_concurrency_per_host",
    "webhook_concurrency_per_agent",
    "webhook_max_attempts",
    "delivery_burst",
    "rap_max_invocations",
)
#: The delays admission control holds to, in seconds.
_OVERLOAD_TARGETS = ("overload_write_target", "overload_read_target", "overload_write_budget")
#: The connection deadlines, in seconds.
_TIMEOUTS = ("header_timeout", "body_timeout", "idle_timeout")
#: Longest connection deadline (a day): a larger one is no deadline at all.
MAX_TIMEOUT = 86_400.0
#: Longest time between snapshots (a week).
MAX_SNAPSHOT_SECONDS = 604_800.0
_INTEGERS = (
    "port",
    "max_queue",
    "max_batch",
    "max_connections",
    "max_connections_per_client",
    "max_push_per_agent",
    *_NESTED,
    *_DELIVERY_COUNTS,
    "max_agents",
    "register_burst",
    "agent_burst",
    "notify_burst",
    "mcp_max_sessions",
    "mcp_max_sessions_per_client",
    "snapshot_entries",
)
_FLOATS = (
    "failure_grace",
    "heartbeat_timeout",
    *_TIMEOUTS,
    *_DELIVERY_SECONDS,
    "delivery_rate",
    "source_tolerance",
    "ws_ping_interval",
    "ws_ping_timeout",
    *_OVERLOAD_TARGETS,
    "register_rate",
    "agent_rate",
    "notify_rate",
    "mcp_idle_timeout",
    "filter_share",
    "filter_burst",
    "cluster_interval",
    "snapshot_seconds",
)


def _parse(name: str, raw: str) -> Any:
    if name == "data_dir":
        return None if raw in ("", ":memory:") else Path(raw)
    if name == "log":
        return raw or None
    if name == "webhook_key_file":
        return Path(raw) if raw else None
    if name == "webhook_allow_net":  # comma- or space-separated CIDRs
        return tuple(part for part in raw.replace(",", " ").split() if part)
    if name in _INTEGERS or name in _FLOATS:
        kind = int if name in _INTEGERS else float
        try:
            return kind(raw)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ValueError(f"FIELD_{name.upper()} must be {what}, not {raw[:40]!r}") from None
    if name in ("cors_origin", "allowed_host"):  # comma- or space-separated
        return tuple(part for part in raw.replace(",", " ").split() if part)
    if name in _SWITCHES:
        flag = raw.strip().lower()
        if flag not in _BOOLEANS:
            raise ValueError(
                f"FIELD_{name.upper()} must be one of {', '.join(_BOOLEANS)}, not {raw[:40]!r}"
            )
        return _BOOLEANS[flag]
    return raw


#: How a yes/no setting may be spelled in the environment.
_BOOLEANS = {
    **dict.fromkeys(("1", "true", "yes", "on"), True),
    **dict.fromkeys(("0", "false", "no", "off"), False),
}

#: The yes/no settings.
_SWITCHES = ("ws_deflate", "metrics", "access_log", "in_memory")
#: What ``--log-format`` may be.
LOG_FORMATS = ("text", "json")
