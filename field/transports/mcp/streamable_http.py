"""MCP over Streamable HTTP at ``/mcp`` of ``field serve`` (protocol/README.md, "MCP over HTTP").

The same tools as ``field mcp`` (:mod:`field.contract.tools`, binding ``mcp_http``),
run in process: a tool call is an operation handed to the writer like a
``POST /v1/<operation>``, with the per-agent rate and admission control of
every operation. Every request carries ``Authorization: Bearer <token>`` of a
registered agent, and acts as that agent (the tools take no ``agent_id``).

Sessions. A POST of ``initialize`` without ``Mcp-Session-Id`` opens a session
(the answer's ``Mcp-Session-Id`` names it), which belongs to the agent that
opened it: a request naming it with another agent's token is answered as if
it did not exist. A session holds the agent's ``poll`` cursor, its default
Field session, its subscription resources and resource subscriptions
(:mod:`.mcp_resources`), all released when it ends: DELETE, ``--mcp-idle-timeout``
seconds with no request in flight (an open GET stream counts as one), the
server stopping. Its requests must name one of the protocol versions a
session may have (``MCP-Protocol-Version``), or none; another is ``400``
with a JSON-RPC error, as the SDK answers it outside a session. Any other
POST without a session id is stateless: served on its own, as the SDK's
stateless mode serves it (no ``initialize`` needed), with no cursor to keep.
Every POST is answered with one JSON body: the Field sends nothing in the
course of a request, and what it sends unasked
(``notifications/resources/updated``) goes on the session's GET stream.

Bounds. At most ``--max-push-per-agent`` sessions of one agent, at most
``--mcp-max-sessions-per-client`` of one client address (an IPv6 /64, as
:func:`~.connections.client_key` counts connections), at most
``--mcp-max-sessions`` in all. The operator's sessions count against none
but the first, so that it is never locked out. A new session that would pass
a bound first ends the session of the same agent (from the same address, for
that bound) that has waited longest with no request in flight and no open
stream, if that is :data:`ROOM_AFTER` seconds at least: a client that goes
away without DELETE (killed, or one of the SDK clients that never send it)
and comes back is not locked out by the sessions it left behind. Only if the
agent has none is the session refused.

MCP 2026-07-28 (``MCP-Protocol-Version: 2026-07-28``, no session): every request is
served on its own by an SDK session manager in stateless mode; ``subscriptions/listen``
is a stream of its own (:mod:`.listen`), and the subscription resources read outside a
session are the agent's, one cursor per subscription (:class:`~.listen.AgentResources`).
Results carry ``resultType`` and listings their freshness hints (:data:`CACHE_HINTS`),
as the SDK writes them for that revision.

Everything the Field answers itself is its error body (code, message,
recoverable, suggested_action) with the HTTP status of the code: a missing
or bad token (401 and ``WWW-Authenticate: Bearer``), a body past
``--max-body-bytes`` (413), an unknown session (404), no room for another
session (503, or 429 for the agent or the client address). What is wrong
with the MCP messages themselves is MCP's to answer, as JSON-RPC errors, and
so is a call of a tool that does not exist (``-32602``, naming it); a
failed tool call is a tool result with ``isError`` and the Field's error
body; a failed resource read is a JSON-RPC error whose message starts with
the Field's code and whose ``data`` is its error body.

The sessions are driven with the SDK's own parts (its Streamable HTTP
transport, dispatcher and connection), not its session manager: the manager
keeps nothing per session that a handler can reach, and its refusals are not
the Field's error body. Stateless requests (and requests of the 2026
per-request protocol) go to an SDK session manager in stateless mode.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import orjson
from mcp import types
from mcp.server.caching import CacheHint
from mcp.server.connection import Connection
from mcp.server.lowlevel import Server
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER, unsupported_protocol_version_rejection
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ... import __version__
from ...contract.errors import (
    AuthError,
    Code,
    FieldError,
    InvalidPayload,
    NotFound,
    Overloaded,
    StateError,
    internal_error,
)
from ...contract.model import Limits, StoredEntry
from ...contract.tools import (
    MCP_HTTP_TOOLS,
    SESSION_TOOLS,
    SUBSCRIPTION_FIELDS,
    definitions,
    session_after,
    tool_envelope,
)
from ...core.authority import OPERATOR_ID
from ...core.context import Outcome
from ...core.field import Field
from ...engine.admission import Work
from ..access import access_of
from ..connections import client_key
from ..index import MCP_PATH
from ..web import absolute_urls, bearer_token, error_response, read_body
from . import listen, resources

if TYPE_CHECKING:
    from ...engine.service import FieldService
    from ..door import FrontDoor, Visit
    from ..runtime import Runtime

logger = logging.getLogger("field.mcp")

#: The key of a request's :class:`Caller` in its ASGI scope.
CALLER = "field.mcp"
#: Subscriptions made in a session whose start the session keeps until it reads them.
MAX_CREATED = 256
#: Entity resources one session may be subscribed to.
MAX_WATCHES = 256
#: Freshness hints of listings and reads (MCP 2026-07-28, ``ttlMs``/``cacheScope``): the
#: tools and templates are the same for every agent while the Field runs; what an agent
#: lists or reads is its own and may change at any moment.
CACHE_HINTS: dict[Any, CacheHint] = {
    "tools/list": CacheHint(ttl_ms=300_000, scope="public"),
    "resources/templates/list": CacheHint(ttl_ms=300_000, scope="public"),
    "resources/list": CacheHint(ttl_ms=0, scope="private"),
    "resources/read": CacheHint(ttl_ms=0, scope="private"),
}
#: Seconds a session must have gone with no request in flight and no open stream before it
#: is ended to make room for its agent's new one (at most half ``--mcp-idle-timeout``): a
#: client between two requests, or whose GET stream is on its way, keeps its session.
ROOM_AFTER = 5.0

INSTRUCTIONS = (
    "Tools of an Akashik Field: shared memory and coordination for agents. This connection "
    "acts for one registered agent (its bearer token): record what you learn (akashik_record, "
    "with intent and confidence) and read what others learned (akashik_attune). To be told as "
    "things happen: create a subscription with akashik_subscribe, subscribe to its resource "
    "field://subscriptions/{id} (resources/subscribe, or subscriptions/listen on MCP "
    "2026-07-28), and read that resource whenever notifications/resources/updated names it: "
    "each read returns the notifications since your previous read (read again while more is "
    "true; after a reconnect, read once: nothing missed is lost). Or poll with akashik_attune "
    "{poll: true}. field://agent is "
    "your agent; field://units/{id}, field://conflicts/{id} and field://tasks/{id} are the "
    "Field's entities (subscribe to one to be told when it changes). A failed call returns the "
    "Field's error body: code, message, recoverable and suggested_action say what to fix."
)


@dataclass(eq=False)
class McpSession:
    """One MCP session of one agent: its transport, and what the Field keeps for it."""

    id: str
    agent_id: str
    transport: StreamableHTTPServerTransport
    #: the client address it counts against (None: the operator's, counted against none)
    client: str | None = None
    connection: Connection | None = None
    #: its requests in flight (an open GET stream is one); none: it is idle
    busy: int = 0
    #: when its last request ended (or it opened), on the monotonic clock
    used: float = field(default_factory=time.monotonic)
    #: the epoch of the last ``poll``: the next one's ``since_epoch``
    poll_epoch: int = 0
    #: the Field session RECORD and COORDINATE default to (created or joined here)
    field_session: str | None = None
    #: the cursor a subscription made in this session starts from, until it is read
    created: dict[str, str] = field(default_factory=dict)
    feeds: dict[str, resources.SubscriptionFeed] = field(default_factory=dict)
    watches: dict[str, resources.Watch] = field(default_factory=dict)
    #: notifications/resources/updated being sent
    sending: set[asyncio.Task[None]] = field(default_factory=set)

    def updated(self, uri: str) -> None:
        """Tell the client that ``uri`` has something new (in a task: never waits)."""
        connection = self.connection
        if connection is None:
            return
        task = asyncio.get_running_loop().create_task(connection.send_resource_updated(uri))
        self.sending.add(task)
        task.add_done_callback(self.sending.discard)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: the agent of its token, and its session (None: stateless)."""

    agent_id: str
    token: str
    session: McpSession | None
    #: the Field's URL as the client reached it (SUBSCRIBE's ws_url and sse_url)
    base_url: str = ""


def _tell_access(ctx: Any, name: str, body: dict[str, Any], failed: bool) -> None:
    """Tell the access record of the request that carried a tool call what it ran."""
    request = getattr(ctx, "request", None)
    access = None if request is None else access_of(request.scope)
    if access is not None:
        tool = MCP_HTTP_TOOLS.get(name)
        access.operation = None if tool is None else tool.operation
        access.outcome = str(body.get("code")) if failed else "ok"


def _caller(ctx: Any) -> Caller:
    request = getattr(ctx, "request", None)
    caller = None if request is None else request.scope.get(CALLER)
    if not isinstance(caller, Caller):  # only ever reached through McpHttpBinding
        raise MCPError(types.INTERNAL_ERROR, "the request reached the Field without its agent")
    return caller


class McpHttpBinding:
    """``/mcp``: the ASGI endpoint, the sessions, and the MCP server whose handlers call the
    Field in process."""

    def __init__(
        self,
        runtime: Runtime,
        door: FrontDoor,
        *,
        limits: Limits,
        max_sessions: int,
        max_per_agent: int,
        max_per_client: int,
        idle_timeout: float,
    ) -> None:
        #: the Field's parts, while it runs
        self._runtime = runtime
        #: the way in of every operation, whatever its transport
        self.door = door
        self.limits = limits
        self.max_sessions = max_sessions
        self.max_per_agent = max_per_agent
        self.max_per_client = max_per_client
        self.idle_timeout = idle_timeout
        #: seconds a session must have been idle before it may be ended for room
        self.room_after = min(ROOM_AFTER, self.idle_timeout / 2)
        self.server = self._server()
        self.sessions: dict[str, McpSession] = {}
        self._per_agent: Counter[str] = Counter()
        self._per_client: Counter[str] = Counter()
        self.watches = resources.Watches()
        #: each agent's subscription resources outside a session, and its listen streams
        self.agents: dict[str, listen.AgentResources] = {}
        self._group: anyio.abc.TaskGroup | None = None
        self._runner: asyncio.Task[None] | None = None
        self.stateless: StreamableHTTPSessionManager | None = None

    # -- lifetime ----------------------------------------------------------------------

    async def start(self, service: FieldService) -> None:
        """Start serving (in the app's lifespan, once ``service`` and the hub have
        started): the sessions' task group, and the entity watches told of every batch
        ``service`` commits."""
        self.stateless = StreamableHTTPSessionManager(
            self.server,
            stateless=True,
            json_response=True,  # one POST, one JSON answer
            max_request_body_size=self.limits.max_body_bytes,
        )
        ready = asyncio.get_running_loop().create_future()
        self._runner = asyncio.create_task(self._serve(ready), name="field-mcp")
        await ready
        service.listeners.add(self.published)

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        """Hold the task group of the sessions (and the stateless requests') until stopped:
        a task of its own, so that ending them all cancels nothing else."""
        assert self.stateless is not None
        try:
            async with self.stateless.run(), anyio.create_task_group() as group:
                self._group = group
                ready.set_result(None)
                await self._rest_idle_agents()
        finally:
            if not ready.done():
                ready.set_result(None)

    async def _rest_idle_agents(self) -> None:
        """Now and then, let go of the push connections of agents' subscription resources
        that no listen stream names and nobody read for ``--mcp-idle-timeout`` (their
        cursors stay)."""
        while True:
            await anyio.sleep(max(self.idle_timeout / 2, 0.05))
            since = time.monotonic() - self.idle_timeout
            for agent_id, held in list(self.agents.items()):
                held.rest(since)
                if held.idle(since) and not held.created:
                    del self.agents[agent_id]

    def published(self, entries: list[StoredEntry]) -> None:
        """Tell the entity watches of a committed batch; an agent that deregistered lets go
        of its sessions' feeds (and its own, outside a session) at once (its token opens
        none of them again); the agents forget the subscriptions that ended."""
        self.watches.published(entries)
        for entry in entries:
            if entry.kind == "subscription.cancelled":
                for resting in self.agents.values():
                    resting.ended(entry.data["subscription_id"])
            if entry.kind != "agent.deregistered":
                continue
            agent_id: str = entry.data["agent_id"]
            held = self.agents.pop(agent_id, None)
            if held is not None:
                held.release()
            if agent_id in self._per_agent:
                for session in list(self.sessions.values()):
                    if session.agent_id == agent_id:
                        self._release(session)

    def _release(self, session: McpSession) -> None:
        """Let go of a session's feeds and watches (the session itself stays)."""
        for feed in session.feeds.values():
            feed.release()
        session.feeds.clear()
        for watch in session.watches.values():
            self.watches.remove(watch)
        session.watches.clear()

    def shutdown(self) -> None:
        """End every session now (the server is stopping): their GET streams end too; every
        listen stream ends gracefully (with its result)."""
        for held in self.agents.values():
            for stream in held.streams:
                stream.close()
        if self._group is not None:
            self._group.cancel_scope.cancel()

    async def stop(self) -> None:
        """End every session and wait for them."""
        self.shutdown()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner

    # -- the endpoint ------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        access = access_of(scope)
        if access is not None:
            access.transport = "mcp"
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._handle(scope, receive, watched)
        except ClientDisconnect:  # nobody is left to answer
            return
        except Exception as exc:
            if started:  # the transport answered already; nothing more can be said
                logger.exception("an MCP request failed while answered")
                return
            error = exc if isinstance(exc, FieldError) else internal_error()
            if not isinstance(exc, FieldError):
                logger.exception("an MCP request failed")
            response = error_response(error)
            if error.code == Code.METHOD_NOT_ALLOWED:
                response.headers["Allow"] = "GET, POST, DELETE"
            await response(scope, receive, send)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if request.method not in ("GET", "POST", "DELETE"):
            raise _not_allowed(request.method)
        if self._group is None or self._group.cancel_scope.cancel_called:
            raise Overloaded("the Field is not running")
        token = bearer_token(request)
        service = self._runtime.running().service
        agent = service.field.authenticate(token)  # 401 without a valid token
        assert token is not None
        access = access_of(scope)
        if access is not None:
            access.agent = agent.id
        session_id = request.headers.get(MCP_SESSION_ID_HEADER)
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
        refusal = None if session_id is None else _version_refusal(version)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        body = b""
        if request.method == "POST":
            body = await read_body(request, self.limits.max_body_bytes)
        replay = _replaying(body, receive)
        base = str(request.base_url).rstrip("/")
        if session_id is not None:
            session = self.sessions.get(session_id)
            if session is None or session.agent_id != agent.id:
                raise NotFound(
                    "no MCP session with that Mcp-Session-Id: it ended, expired or never was",
                    suggested_action="Start a new session: POST initialize without Mcp-Session-Id.",
                )
            if request.method == "DELETE":  # released before the client hears it is
                await self._discard(session)
                await Response(status_code=200)(scope, receive, send)
                return
            scope[CALLER] = Caller(agent.id, token, session, base)
            await self._serve_in(session, scope, replay, send)
            return
        if request.method != "POST":
            raise _not_allowed(request.method, "without an Mcp-Session-Id")
        if _is_initialize(body) and _of_sessions(version):  # else the SDK's to answer
            self.door.admit(token, None)  # a session costs what an operation does
            client = None if request.client is None else request.client.host
            address = None if agent.id == OPERATOR_ID else client_key(client)
            session = await self._open(agent.id, address)
            scope[CALLER] = Caller(agent.id, token, session, base)
            await self._serve_opening(session, scope, replay, send)
            return
        scope[CALLER] = Caller(agent.id, token, None, base)
        assert self.stateless is not None
        await self.stateless.handle_request(scope, replay, send)

    # -- sessions ----------------------------------------------------------------------

    async def _open(self, agent_id: str, client: str | None) -> McpSession:
        """A new session of ``agent_id`` from ``client`` (None: the operator's), once the
        agent's idle sessions that stand in its way have ended; refused if others do."""
        while (bound := self._bound_passed(agent_id, client)) is not None:
            victim = self._oldest_idle(agent_id, client if bound == "client" else None)
            if victim is None:
                raise self._refusal(bound, agent_id, client)
            logger.info(
                "an idle MCP session of agent %s ended to make room for its new one", agent_id
            )
            await self._discard(victim)
        transport = StreamableHTTPServerTransport(
            mcp_session_id=uuid.uuid4().hex,
            is_json_response_enabled=True,
            idle_timeout=self.idle_timeout,
        )
        assert transport.mcp_session_id is not None
        session = McpSession(transport.mcp_session_id, agent_id, transport, client)
        self.sessions[session.id] = session
        self._per_agent[agent_id] += 1
        if client is not None:
            self._per_client[client] += 1
        return session

    def _bound_passed(self, agent_id: str, client: str | None) -> str | None:
        """The bound one more session of ``agent_id`` from ``client`` would pass: "agent",
        "client" or "total"; None if it fits. The operator's (``client`` None) pass only
        its own."""
        if self._per_agent[agent_id] >= self.max_per_agent:
            return "agent"
        if client is None:
            return None
        if self._per_client[client] >= self.max_per_client:
            return "client"
        if len(self.sessions) - self._per_agent[OPERATOR_ID] >= self.max_sessions:
            return "total"
        return None

    def _oldest_idle(self, agent_id: str, client: str | None) -> McpSession | None:
        """The session of ``agent_id`` (from ``client``, unless None) that has waited
        longest with no request in flight, if that is :attr:`room_after` at least."""
        since = time.monotonic() - self.room_after
        idle = [
            session
            for session in self.sessions.values()
            if session.agent_id == agent_id
            and not session.busy
            and session.used <= since
            and (client is None or session.client == client)
        ]
        return min(idle, key=lambda session: session.used, default=None)

    def _refusal(self, bound: str, agent_id: str, client: str | None) -> FieldError:
        """The refusal of a new session past ``bound``."""
        if bound == "total":
            return Overloaded(
                f"the Field holds {self.max_sessions} MCP sessions, as many as it allows",
                suggested_action="Retry later, end sessions you no longer use (DELETE), or "
                "send stateless requests (no initialize, no Mcp-Session-Id).",
            )
        held, whose = (
            (self._per_agent[agent_id], "the agent")
            if bound == "agent"
            else (self._per_client[client or ""], "this client address")
        )
        return FieldError(
            f"{whose} already holds {held} MCP sessions, as many as the Field allows, and "
            "the agent has none idle for long enough to end",
            code=Code.TOO_MANY_CONNECTIONS,
            recoverable=True,
            suggested_action="End one first (DELETE /mcp with its Mcp-Session-Id), or retry "
            f"once one has gone {self.room_after:g} s with no request and no stream; one "
            "session carries all of an agent's tools and resources.",
        )

    async def _serve_in(
        self, session: McpSession, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Serve a request of ``session``: it is busy meanwhile (never ended for room)."""
        session.busy += 1
        try:
            await session.transport.handle_request(scope, receive, send)
        finally:
            session.busy -= 1
            session.used = time.monotonic()

    async def _serve_opening(
        self, session: McpSession, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Start the session's loop and answer its ``initialize``; a session whose opening
        failed is not kept."""
        opened = False
        try:
            assert self._group is not None
            await self._group.start(self._run, session)
            status = await _status_of(
                functools.partial(self._serve_in, session), scope, receive, send
            )
            opened = status is not None and status < 400
        finally:
            if not opened:
                await self._discard(session)

    async def _run(
        self,
        session: McpSession,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The session's message loop, until it ends however it ends."""
        transport = session.transport
        try:
            async with transport.connect() as (read, write):
                dispatcher: JSONRPCDispatcher[Any] = JSONRPCDispatcher(
                    read, write, inline_methods=frozenset({"initialize"})
                )
                session.connection = Connection.for_loop(dispatcher, session_id=session.id)
                task_status.started()
                idle = transport.idle_scope or anyio.CancelScope()
                with idle:
                    await serve_connection(
                        self.server, dispatcher, connection=session.connection, lifespan_state={}
                    )
                if idle.cancelled_caught:
                    logger.info("an MCP session of agent %s expired", session.agent_id)
        except Exception:
            logger.exception("an MCP session of agent %s failed", session.agent_id)
        finally:
            await self._discard(session)

    async def _discard(self, session: McpSession) -> None:
        """Forget the session and release what it held (idempotent)."""
        if self.sessions.pop(session.id, None) is not None:
            self._per_agent[session.agent_id] -= 1
            if not self._per_agent[session.agent_id]:
                del self._per_agent[session.agent_id]
            if session.client is not None:
                self._per_client[session.client] -= 1
                if not self._per_client[session.client]:
                    del self._per_client[session.client]
        self._release(session)
        for task in list(session.sending):
            task.cancel()
        session.connection = None
        if not session.transport.is_terminated:
            with anyio.CancelScope(shield=True):
                await session.transport.terminate()

    # -- the MCP server ----------------------------------------------------------------

    def _server(self) -> Server[Any]:
        tools = [
            types.Tool(name=name, description=d["description"], input_schema=d["inputSchema"])
            for name, d in definitions("mcp_http").items()
        ]
        templates = [
            types.ResourceTemplate(
                name=kind[:-1],
                uri_template=f"field://{kind}/{{id}}",
                description=text,
                mime_type="application/json",
            )
            for kind, text in resources.TEMPLATES.items()
        ]

        async def list_tools(_: Any, __: types.PaginatedRequestParams | None) -> Any:
            return types.ListToolsResult(tools=tools)

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
            if params.name not in MCP_HTTP_TOOLS:
                unknown = _unknown_tool(params.name)
                _tell_access(ctx, params.name, unknown.data, True)
                raise unknown
            body, failed = await self.call(_caller(ctx), params.name, params.arguments or {})
            _tell_access(ctx, params.name, body, failed)
            text = types.TextContent(type="text", text=orjson.dumps(body).decode())
            return types.CallToolResult(content=[text], is_error=failed)

        async def list_resources(ctx: Any, _: types.PaginatedRequestParams | None) -> Any:
            return types.ListResourcesResult(resources=await self.resource_list(_caller(ctx)))

        async def list_templates(_: Any, __: types.PaginatedRequestParams | None) -> Any:
            return types.ListResourceTemplatesResult(resource_templates=templates)

        async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> Any:
            uri = str(params.uri)
            body = await _mcp_errors(self.read(_caller(ctx), uri))
            contents = types.TextResourceContents(
                uri=uri, mime_type="application/json", text=orjson.dumps(body).decode()
            )
            return types.ReadResourceResult(contents=[contents])

        async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> Any:
            await _mcp_errors(self.subscribe(_caller(ctx), str(params.uri)))
            return types.EmptyResult()

        async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> Any:
            self.unsubscribe(_caller(ctx), str(params.uri))
            return types.EmptyResult()

        async def listen_to(ctx: Any, params: types.SubscriptionsListenRequestParams) -> Any:
            uris = list(dict.fromkeys(map(str, params.notifications.resource_subscriptions or ())))
            held, stream, watches = await _mcp_errors(
                self.open_stream(_caller(ctx), ctx.request_id, uris)
            )
            meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
            try:
                honored = types.SubscriptionFilter(resource_subscriptions=uris or None)
                acknowledged = types.SubscriptionsAcknowledgedNotificationParams(
                    notifications=honored, _meta=meta
                )
                await ctx.session.send_notification(
                    types.SubscriptionsAcknowledgedNotification(params=acknowledged),
                    related_request_id=ctx.request_id,
                )
                while (uri := await stream.next()) is not None:
                    updated = types.ResourceUpdatedNotificationParams(uri=uri, _meta=meta)
                    await ctx.session.send_notification(
                        types.ResourceUpdatedNotification(params=updated),
                        related_request_id=ctx.request_id,
                    )
            finally:
                self.close_stream(held, stream, watches)
            return types.SubscriptionsListenResult(_meta=meta)

        return Server(
            "akashik-field",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            on_list_resources=list_resources,
            on_list_resource_templates=list_templates,
            on_read_resource=read_resource,
            on_subscribe_resource=subscribe,
            on_unsubscribe_resource=unsubscribe,
            on_subscriptions_listen=listen_to,
            cache_hints=CACHE_HINTS,
        )

    # -- tools -------------------------------------------------------------------------

    async def call(
        self, caller: Caller, name: str, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Run one tool call as ``caller``: (the response, False) or (the error body, True).
        ``name`` is one of the tools (another is MCP's protocol error: :func:`_unknown_tool`)."""
        operation = MCP_HTTP_TOOLS[name].operation
        try:
            response = await self._run_tool(caller, name, operation, dict(arguments))
        except FieldError as error:
            return error.to_response(operation), True
        except Exception:
            logger.exception("the MCP tool call %s failed", name[:64])
            return internal_error(operation).to_response(), True
        return response, False

    async def _run_tool(
        self, caller: Caller, name: str, operation: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """A tool call through the front door: admitted, run and observed (refusals too)."""
        with self.door.visit("mcp", operation) as visit:
            return await self._tool_call(visit, caller, name, operation, args)

    async def _tool_call(
        self, visit: Visit, caller: Caller, name: str, operation: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        claimed = args.pop("agent_id", None)
        if claimed is not None and claimed != caller.agent_id:
            raise AuthError(
                f"this MCP session acts for agent {caller.agent_id!r}, not {str(claimed)[:64]!r}",
                code=Code.FORBIDDEN,
                recoverable=False,
                operation=operation,
                suggested_action="Leave agent_id out: a session acts for the agent of its "
                "token. Connect with another agent's token to act for it.",
            )
        session = caller.session
        self.door.admit(caller.token, operation)
        session_id = None
        if name in SESSION_TOOLS:
            default = session.field_session if session is not None else None
            session_id = args.pop("session_id", default)
        poll = False
        if operation == "ATTUNE":
            poll = args.pop("poll", False) is True
            if poll and session is None:
                raise _needs_session("poll")
            scope = args.get("scope")
            given = "since_epoch" in args or (isinstance(scope, dict) and "since_epoch" in scope)
            if poll and session is not None and not given:
                args["since_epoch"] = session.poll_epoch
        if operation == "SUBSCRIBE":
            args = _subscribe_payload(args)
        token = caller.token

        def job(field: Field) -> Outcome:
            agent = field.authenticate(token)
            envelope = tool_envelope(
                operation,
                args,
                agent_id=agent.id,
                role=agent.role,
                session_id=session_id,
                message_id=uuid.uuid4().hex,
            )
            return field.handle(envelope, token=token, operation=operation)

        # the envelope as far as the transport knows it: its webhook, if any, is checked
        # before the writer, as every transport's is
        visit.body = {"operation": operation, "payload": args}
        visit.result = outcome = await self.door.run(job, operation, visit.body)
        response = outcome.response
        if session is not None or operation == "SUBSCRIBE":
            self._follow(self._holder(caller), operation, args, response, poll)
        if operation == "SUBSCRIBE" and args["action"] == "subscribe":
            uri = resources.subscription_uri(response["subscription_id"])
            response = {**absolute_urls(response, caller.base_url), "resource": uri}
        return response

    @staticmethod
    def _follow(
        holder: McpSession | listen.AgentResources,
        operation: str,
        args: dict[str, Any],
        response: dict[str, Any],
        poll: bool,
    ) -> None:
        """What the session (or the agent, outside one) keeps of a response: the poll
        cursor, the current Field session, where a new subscription starts."""
        session = holder if isinstance(holder, McpSession) else None
        if poll and session is not None:
            session.poll_epoch = response["epoch"]
        elif operation == "SESSION" and session is not None:
            session.field_session = session_after(session.field_session, args, response)
        elif operation == "SUBSCRIBE" and response.get("cursor"):
            created = holder.created
            created[response["subscription_id"]] = response["cursor"]
            if len(created) > MAX_CREATED:  # made here and never read: forget the oldest
                del created[next(iter(created))]

    # -- resources ---------------------------------------------------------------------

    async def _reading(self, caller: Caller, job: Callable[..., Outcome]) -> dict[str, Any]:
        """A read job as the caller's agent: rate-limited and admitted like a GET list."""
        self.door.admit(caller.token, None)
        token = caller.token

        def authenticated(field: Field) -> Outcome:
            return job(field, field.authenticate(token))

        outcome = await self._runtime.running().service.execute(authenticated, work=Work.READ)
        return outcome.response

    async def resource_list(self, caller: Caller) -> list[types.Resource]:
        listed = await _mcp_errors(self._reading(caller, resources.subscription_resources))
        agent = types.Resource(
            name="agent",
            uri=resources.AGENT_URI,
            description="Your agent, as the Field knows it.",
            mime_type="application/json",
        )
        return [
            agent,
            *(
                types.Resource(
                    name=f"subscription {s['id']}",
                    uri=resources.subscription_uri(s["id"]),
                    description="Notifications of events " + ", ".join(s["events"])[:200],
                    mime_type="application/json",
                )
                for s in listed["subscriptions"]
            ),
        ]

    def _holder(self, caller: Caller) -> McpSession | listen.AgentResources:
        """Whose subscription resources a request reads: its session's, or outside one
        its agent's."""
        if caller.session is not None:
            return caller.session
        held = self.agents.get(caller.agent_id)
        if held is None:
            held = self.agents[caller.agent_id] = listen.AgentResources(caller.agent_id)
        held.used = time.monotonic()
        return held

    async def read(self, caller: Caller, uri: str) -> dict[str, Any]:
        uri, since = resources.split_since(uri)
        kind, ident = resources.parse_uri(uri)
        session = caller.session
        if kind == "subscriptions":
            assert ident is not None
            feed = await self._feed(caller, self._holder(caller), ident)
            self.door.admit(caller.token, None)
            page = self.limits.max_response_bytes // 2
            return await feed.read(resources.READ_PAGE, page, since=since)
        body = await self._reading(
            caller, lambda field, agent: resources.read_entity(field, agent, kind, ident)
        )
        watch = session.watches.get(uri) if session is not None else None
        if watch is not None:
            watch.told = False
        return body

    async def _feed(
        self, caller: Caller, session: listen.FeedHolder, subscription_id: str
    ) -> resources.SubscriptionFeed:
        """The feed of a subscription of the session (or of the agent, outside one),
        attached at its first use."""
        feed = session.feeds.get(subscription_id)
        if feed is not None:
            return feed

        def check(field: Field) -> Outcome:
            agent = field.authenticate(caller.token)
            field.active_subscription(subscription_id, agent.id)
            return Outcome({}, agent_id=agent.id)

        await self._runtime.running().service.execute(check, work=Work.READ)
        feed = session.feeds.get(subscription_id)  # made meanwhile by another request
        if feed is None:
            running = self._runtime.current
            if running is None:
                raise Overloaded("the Field is not running")
            hub = running.hub
            feed = resources.SubscriptionFeed(
                hub, caller.agent_id, subscription_id, lambda f: session.updated(f.uri)
            )
            feed.attach(session.created.get(subscription_id))
            session.created.pop(subscription_id, None)
            session.feeds[subscription_id] = feed
            if isinstance(session, listen.AgentResources):
                session.added(feed)
        return feed

    async def subscribe(self, caller: Caller, uri: str) -> None:
        kind, ident = resources.parse_uri(uri)
        session = caller.session
        if session is None:
            raise _needs_session("resources/subscribe")
        if kind == "subscriptions":
            assert ident is not None
            (await self._feed(caller, session, ident)).subscribe()
            return
        await self.read(caller, uri)  # it exists and the agent may see it
        if uri not in session.watches:
            if len(session.watches) >= MAX_WATCHES:
                raise StateError(
                    f"this session is subscribed to {MAX_WATCHES} resources, as many as it may be",
                    code=Code.SUBSCRIPTION_LIMIT,
                    suggested_action="Unsubscribe from resources you no longer follow.",
                )
            key = resources.watch_key(kind, ident, caller.agent_id)
            watch = resources.Watch(uri, key, lambda w: session.updated(w.uri))
            session.watches[uri] = watch
            self.watches.add(watch)

    async def open_stream(
        self, caller: Caller, request_id: Any, uris: list[str]
    ) -> tuple[listen.AgentResources, listen.ListenStream, list[resources.Watch]]:
        """Open a ``subscriptions/listen`` stream of ``caller``'s agent on ``uris``, each
        checked as a read checks it (it exists, the agent may see it); refused past the
        agent's (or the Field's) bound on listen streams."""
        if request_id is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen needs a request id")
        if len(uris) > listen.MAX_LISTEN_URIS:
            raise StateError(
                f"a listen stream names at most {listen.MAX_LISTEN_URIS} resources",
                code=Code.SUBSCRIPTION_LIMIT,
                suggested_action="Listen to fewer resources at once, or make one "
                "subscription whose resource carries all you follow.",
            )
        held = self._holder(caller)
        if not isinstance(held, listen.AgentResources):
            raise MCPError(
                types.INVALID_REQUEST,
                "subscriptions/listen is MCP 2026-07-28's: a session subscribes with "
                "resources/subscribe",
            )
        if len(held.streams) >= self.max_per_agent:
            raise FieldError(
                f"the agent already holds {len(held.streams)} listen streams, as many as the "
                "Field allows",
                code=Code.TOO_MANY_CONNECTIONS,
                recoverable=True,
                suggested_action="Close one of its listen streams first, or name every "
                "resource it follows in one stream.",
            )
        if sum(len(h.streams) for h in self.agents.values()) >= self.max_sessions:
            raise Overloaded(
                f"the Field holds {self.max_sessions} MCP listen streams, as many as it "
                "allows (--mcp-max-sessions)",
                suggested_action="Retry later, or poll with akashik_attune {poll: true}.",
            )
        stream = listen.ListenStream(frozenset(uris))
        watches: list[resources.Watch] = []
        for uri in uris:
            kind, ident = resources.parse_uri(uri)
            if kind == "subscriptions":
                assert ident is not None
                await self._feed(caller, held, ident)
                continue
            await self.read(caller, uri)  # it exists and the agent may see it
            key = resources.watch_key(kind, ident, caller.agent_id)
            watches.append(resources.Watch(uri, key, functools.partial(_told, stream)))
        held.listen(stream)
        for watch in watches:
            self.watches.add(watch)
        return held, stream, watches

    def close_stream(
        self, held: listen.AgentResources, stream: listen.ListenStream, watches: list[Any]
    ) -> None:
        held.unlisten(stream)
        for watch in watches:
            self.watches.remove(watch)

    def unsubscribe(self, caller: Caller, uri: str) -> None:
        """Stop telling the session about ``uri`` (nothing to stop is no error)."""
        session = caller.session
        if session is None:
            return
        watch = session.watches.pop(uri, None)
        if watch is not None:
            self.watches.remove(watch)
        for feed in session.feeds.values():
            if feed.uri == uri:
                feed.unsubscribe()


# -- helpers ----------------------------------------------------------------------------


def _needs_session(what: str) -> FieldError:
    """The refusal of what the Field keeps per session, asked for outside one."""
    return StateError(
        f"{what} needs an MCP session: the Field keeps its cursor for each session",
        code=Code.UNSUPPORTED_OPERATION,
        recoverable=False,
        suggested_action="Initialize a session first (a stateless request has none), or "
        "poll with akashik_attune and since_epoch.",
    )


def _subscribe_payload(args: dict[str, Any]) -> dict[str, Any]:
    """SUBSCRIBE's payload from ``akashik_subscribe``'s flat arguments."""
    action = args.pop("action", "subscribe")
    subscription_id = args.pop("subscription_id", None)
    unknown = sorted(args.keys() - set(SUBSCRIPTION_FIELDS))
    if unknown:
        raise InvalidPayload(
            f"akashik_subscribe takes no argument {unknown[0][:64]!r}",
            operation="SUBSCRIBE",
            suggested_action="Pass only action, subscription_id, "
            + ", ".join(SUBSCRIPTION_FIELDS)
            + ".",
        )
    if action == "subscribe":
        return {"action": action, "subscription": args}
    if action == "unsubscribe":
        return {"action": action, "subscription": {"id": subscription_id}}
    return {"action": action}


def _of_sessions(version: str | None) -> bool:
    """Whether ``MCP-Protocol-Version`` (None: not sent) names a version a session may have
    (those ``initialize`` negotiates); another is the per-request protocol's or unknown."""
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS


def _version_refusal(version: str | None) -> Response | None:
    """MCP's answer to a request of a session whose ``MCP-Protocol-Version`` is not a version
    a session may have: 400 and a JSON-RPC error, the one the SDK answers outside a
    session; None if it is one, or not sent."""
    if _of_sessions(version):
        return None
    rejection = unsupported_protocol_version_rejection(
        str(version)[:64], HANDSHAKE_PROTOCOL_VERSIONS
    )
    if rejection is None:
        return None
    error = {"code": rejection.code, "message": rejection.message, "data": rejection.data}
    body = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": error})
    return Response(body, status_code=400, media_type="application/json")


def _is_initialize(body: bytes) -> bool:
    """Whether a POST body is an ``initialize`` request (a new session)."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(message, dict) and message.get("method") == "initialize"


def _replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` as if the body, read already, had not been."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _status_of(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    scope: Scope,
    receive: Receive,
    send: Send,
) -> int | None:
    """Run ``app`` for one request; the HTTP status it answered (None: no answer)."""
    status: int | None = None

    async def watched(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    await app(scope, receive, watched)
    return status


def _not_allowed(method: str, why: str = "") -> FieldError:
    error = FieldError(
        f"{method[:16]} is not allowed on {MCP_PATH}" + (f" {why}" if why else ""),
        code=Code.METHOD_NOT_ALLOWED,
        recoverable=False,
        suggested_action="POST MCP messages; GET (the session's stream) and DELETE (its end) "
        "need the Mcp-Session-Id that initialize answered.",
    )
    return error


def _unknown_tool(name: str) -> MCPError:
    """A call of a tool the session does not have: MCP's protocol error (``-32602``, Invalid
    params, naming the tool), not a tool result; its data is the Field's error body."""
    error = NotFound(
        f"Unknown tool: {name[:64]}",
        suggested_action="Call one of: " + ", ".join(MCP_HTTP_TOOLS),
    )
    return MCPError(types.INVALID_PARAMS, error.message, error.to_response())


def _told(stream: listen.ListenStream, watch: resources.Watch) -> None:
    """An entity a listen stream names changed: tell it (each change: the stream sends a
    URI once however often it changed before it was sent)."""
    watch.told = False
    stream.updated(watch.uri)


async def _mcp_errors(work: Awaitable[Any]) -> Any:
    """``work``'s result; a Field error becomes an MCP error with the Field's error body (an
    unexpected one, ``INTERNAL_ERROR``'s)."""
    try:
        return await work
    except MCPError:  # MCP's own answer already
        raise
    except Exception as exc:
        if isinstance(exc, FieldError):
            error = exc
        else:
            logger.exception("an MCP resource request failed")
            error = internal_error()
        code = types.INTERNAL_ERROR if error.http_status >= 500 else types.INVALID_PARAMS
        raise MCPError(code, f"{error.code}: {error.message}", error.to_response()) from None
