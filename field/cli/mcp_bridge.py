"""The MCP binding (spec 10.2): Akashik operations as MCP tools.

``field mcp --url URL`` runs an MCP server on stdio that is a *client* of
a running Field: each tool call becomes one operation sent over the HTTP
binding with the SDK (:mod:`field.client`). It is not a transport of the
Field server (those live in :mod:`field.transports`); it is a separate
process an MCP host starts, so one Field serves many such bridges.

Three parts, outermost last:

- :data:`TOOLS` (from :mod:`field.contract.tools`, shared with the RAP binding), one
  table: tool name → operation and description. Each tool's input schema
  is the operation's request schema from ``protocol/schemas`` (references
  inlined, conditional rules left to the Field, which checks them and says
  what is wrong), plus ``agent_id``.
- :class:`Bridge`: holds each agent's token and the polling cursors, turns
  tool arguments into operations and every outcome into a
  :class:`ToolOutcome`: the response payload, or the spec error body
  (code, message, operation, recoverable, suggested_action). A tool it does
  not have is no outcome but :class:`UnknownTool`, which the MCP server
  answers as MCP says: a protocol error (JSON-RPC ``-32602``), not a result.
- :func:`build_server` and :func:`serve_stdio`: the MCP protocol, from the
  ``mcp`` package (an optional dependency: ``pip install 'akashik-field[mcp]'``).

Resources and push: those of ``field serve``'s own MCP endpoint (``/mcp``,
:mod:`field.transports.mcp.streamable_http`), relayed for the bridge's agent by
:mod:`field.cli.mcp_push` (``resources/subscribe`` on the 2025 protocol revisions,
``subscriptions/listen`` on 2026-07-28). There is no subscribe tool: subscriptions
are made elsewhere (``/mcp``'s ``akashik_subscribe``, ``POST /v1/subscribe``), and
listed here as resources; or the agents poll with ``akashik_attune``
(``poll: true``; spec 10.2).

Tokens: an agent's bearer token is held here, never shown in a tool
result (REGISTER's included: the ``token`` field is removed), and never
logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from .. import __version__
from ..client import AgentClient, FieldClient, FieldClientError
from ..contract.tools import SESSION_TOOLS, TOOLS, definitions, session_after

if TYPE_CHECKING:
    from .mcp_push import Push

__all__ = [
    "TOOLS",
    "Bridge",
    "ToolOutcome",
    "UnknownTool",
    "build_server",
    "serve_stdio",
    "tool_definitions",
]

logger = logging.getLogger("field.mcp")

INSTRUCTIONS = (
    "Tools of an Akashik Field: shared memory and coordination for agents. Register once with "
    "akashik_register, then record what you learn (akashik_record, with intent and "
    "confidence) and read what others learned (akashik_attune). To see what is new, poll "
    "with akashik_attune {poll: true}, or subscribe to a subscription resource "
    "field://subscriptions/{id} (listed by resources/list) and read it whenever "
    "notifications/resources/updated names it: each read returns the notifications since "
    "the previous one. A failed call returns the Field's error body: code, message, "
    "recoverable and suggested_action say what to fix."
)


def tool_definitions() -> dict[str, dict[str, Any]]:
    """Every tool: ``{name: {"description", "inputSchema"}}``."""
    return definitions("mcp")


# -- the bridge -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool call returns: a response payload, or an error body."""

    body: dict[str, Any]
    is_error: bool = False

    @property
    def text(self) -> str:
        return orjson.dumps(self.body).decode()


def _error(
    code: str,
    message: str,
    *,
    operation: str | None,
    recoverable: bool,
    suggested_action: str | None,
) -> ToolOutcome:
    body = {
        "code": code,
        "message": message,
        "operation": operation,
        "recoverable": recoverable,
        "suggested_action": suggested_action,
    }
    return ToolOutcome(body, is_error=True)


class UnknownTool(LookupError):
    """A call of a tool this server does not have. MCP makes it a protocol error (a
    JSON-RPC error, ``-32602``, naming the tool), not a tool result: ``body`` is its
    ``data``, the spec error body (``NOT_FOUND``, and the tools there are)."""

    def __init__(self, name: str) -> None:
        message = f"Unknown tool: {name[:64]}"
        super().__init__(message)
        self.message = message
        self.body = _error(
            "NOT_FOUND",
            message,
            operation=None,
            recoverable=False,
            suggested_action="Call one of: " + ", ".join(TOOLS),
        ).body


class _ToolError(Exception):
    """A call refused by the bridge itself, before reaching the Field."""

    def __init__(self, outcome: ToolOutcome) -> None:
        super().__init__(outcome.body["message"])
        self.outcome = outcome


class Bridge:
    """Tool calls in, Field operations out; holds the agents' tokens.

    ``agents`` maps agent id → :class:`AgentClient` (token, Lamport clock,
    current session). ``cursors`` maps agent id → the ``epoch`` of its last
    poll: the ``since_epoch`` of its next one. ``retired`` maps the id of
    an agent deregistered through this server → its last token, the proof
    the Field asks for to register that id again.
    """

    def __init__(self, field: FieldClient) -> None:
        self.field = field
        self.agents: dict[str, AgentClient] = {}
        self.cursors: dict[str, int] = {}
        self.retired: dict[str, str] = {}

    def resource_token(self) -> str:
        """The token resources are read with: the agent's when this server acts for one
        (raises :class:`_ToolError` otherwise)."""
        return self._agent(None, "resources").token

    def adopt(self, agent_id: str, token: str) -> AgentClient:
        """Act for an agent registered elsewhere (``--agent-id`` and ``--token``)."""
        agent = self.field.agent(agent_id, token)
        self.agents[agent_id] = agent
        return agent

    async def call(self, name: str, arguments: Mapping[str, Any] | None) -> ToolOutcome:
        """Run one tool call; never raises for bad arguments or an unreachable Field (those
        are error outcomes), only :class:`UnknownTool` for a tool this server lacks."""
        tool = TOOLS.get(name)
        if tool is None:
            raise UnknownTool(name)
        outcome = await self._call(name, tool.operation, dict(arguments or {}))
        logger.debug(
            "%s: %s", name, outcome.body.get("code", "error") if outcome.is_error else "ok"
        )
        return outcome

    async def _call(self, name: str, operation: str, args: dict[str, Any]) -> ToolOutcome:
        try:
            if operation == "REGISTER":
                return await self._register(args)
            agent = self._agent(args.pop("agent_id", None), operation)
            return await self._send(name, operation, agent, args)
        except _ToolError as refused:
            return refused.outcome
        except FieldClientError as exc:
            return ToolOutcome(exc.body, is_error=True)
        except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError) as exc:
            # A body that is not JSON: something else than a Field answers at that URL.
            return self._unreachable(operation, exc)

    def _agent(self, agent_id: Any, operation: str) -> AgentClient:
        if agent_id is None and len(self.agents) == 1:
            return next(iter(self.agents.values()))
        if agent_id is None:
            held = ", ".join(sorted(self.agents)) or "none"
            raise _ToolError(
                _error(
                    "INVALID_PAYLOAD" if self.agents else "UNAUTHENTICATED",
                    f"agent_id is required: this server acts for {held}",
                    operation=operation,
                    recoverable=True,
                    suggested_action="Pass agent_id; register with akashik_register first "
                    "if you have no agent.",
                )
            )
        if not isinstance(agent_id, str) or agent_id not in self.agents:
            raise _ToolError(
                _error(
                    "UNAUTHENTICATED",
                    f"this server holds no token for agent {agent_id!r}",
                    operation=operation,
                    recoverable=True,
                    suggested_action="Register it with akashik_register, or use one of: "
                    + (", ".join(sorted(self.agents)) or "(none yet)"),
                )
            )
        return self.agents[agent_id]

    async def _register(self, args: dict[str, Any]) -> ToolOutcome:
        agent_id = str(args.get("id"))
        body = self.field.envelope("REGISTER", agent_id, args)
        last = self.retired.get(agent_id)  # an id this server deregistered: take it back
        response = await self.field.request("POST", "/v1/register", body=body, token=last)
        self.retired.pop(agent_id, None)
        token = response.pop("token")
        agent = self.field.agent(response["agent"]["id"], token, role=response["agent"]["role"])
        agent.epoch = response["epoch"]
        self.agents[agent.id] = agent
        self.cursors.pop(agent.id, None)
        return ToolOutcome(response)

    async def _send(
        self, name: str, operation: str, agent: AgentClient, args: dict[str, Any]
    ) -> ToolOutcome:
        session_id = args.pop("session_id", agent.session_id) if name in SESSION_TOOLS else None
        poll = False
        if operation == "ATTUNE":
            poll = args.pop("poll", False) is True
            await self._attune_defaults(agent, args, poll)
        if operation == "DEREGISTER":
            args["agent_id"] = agent.id
        response = await agent.send(operation, args, session_id=session_id)
        if poll:
            self.cursors[agent.id] = response["epoch"]
        if operation == "SESSION":
            agent.session_id = session_after(agent.session_id, args, response)
        if operation == "DEREGISTER":
            del self.agents[agent.id]
            self.cursors.pop(agent.id, None)
            self.retired[agent.id] = agent.token
        return ToolOutcome(response)

    async def _attune_defaults(self, agent: AgentClient, args: dict[str, Any], poll: bool) -> None:
        scope = args.get("scope")
        if scope is None:
            scope = args["scope"] = {}
        if isinstance(scope, dict):
            if "role" not in scope:
                if agent.role is None:
                    await agent.refresh()
                scope["role"] = agent.role
            scope.setdefault("max_units", 10)
            given = "since_epoch" in args or "since_epoch" in scope
            if poll and not given:
                args["since_epoch"] = self.cursors.get(agent.id, 0)

    def _unreachable(self, operation: str, exc: Exception) -> ToolOutcome:
        reason = str(exc) or type(exc).__name__
        logger.warning("no answer from the Field at %s: %s", self.field.base_url, reason)
        return _error(
            "FIELD_UNAVAILABLE",
            f"no answer from the Field at {self.field.base_url}: {reason}",
            operation=operation,
            recoverable=True,
            suggested_action="Check that the Field is running, then retry. If the connection "
            "broke mid-call the operation may have been applied: check with akashik_attune "
            "(scope.include_own) before recording again.",
        )


# -- the MCP server ---------------------------------------------------------------------------


def build_server(bridge: Bridge, push: Push | None = None) -> Any:
    """An ``mcp`` low-level server whose tools call ``bridge``.

    The low-level server does not check tool arguments against their input
    schemas: the Field does, so a bad call gets the Field's error code and
    suggested action, as a tool result with ``isError`` (MCP 2025-11-25: the
    model reads it and corrects the call). A tool that does not exist is a
    JSON-RPC error, ``-32602`` (Invalid params), as MCP says.

    Its resources, ``resources/subscribe`` and ``subscriptions/listen`` are those of the
    Field's ``/mcp``, relayed by ``push`` (:func:`relay`'s, if not given).
    """
    from mcp import types
    from mcp.server.lowlevel import Server
    from mcp.shared.exceptions import MCPError

    tools = [
        types.Tool(name=name, description=d["description"], input_schema=d["inputSchema"])
        for name, d in tool_definitions().items()
    ]

    async def list_tools(_: Any, __: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(_: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            outcome = await bridge.call(params.name, params.arguments)
        except UnknownTool as unknown:
            raise MCPError(types.INVALID_PARAMS, unknown.message, unknown.body) from None
        text = types.TextContent(type="text", text=outcome.text)
        return types.CallToolResult(content=[text], is_error=outcome.is_error)

    from mcp.client.subscriptions import ResourceUpdated, SubscriptionLost
    from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

    push = push or relay(bridge)
    upstream = push.upstream

    async def list_resources(_: Any, params: types.PaginatedRequestParams | None) -> Any:
        cursor = None if params is None else params.cursor
        return await upstream.request(lambda client: client.list_resources(cursor=cursor))

    async def list_templates(_: Any, params: types.PaginatedRequestParams | None) -> Any:
        cursor = None if params is None else params.cursor
        return await upstream.request(lambda client: client.list_resource_templates(cursor=cursor))

    async def read_resource(_: Any, params: types.ReadResourceRequestParams) -> Any:
        return await upstream.read(str(params.uri))

    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> Any:
        await push.subscribe(str(params.uri), ctx.session.send_resource_updated)
        return types.EmptyResult()

    async def unsubscribe(_: Any, params: types.UnsubscribeRequestParams) -> Any:
        await push.unsubscribe(str(params.uri))
        return types.EmptyResult()

    async def listen(ctx: Any, params: types.SubscriptionsListenRequestParams) -> Any:
        uris = list(dict.fromkeys(map(str, params.notifications.resource_subscriptions or ())))
        meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        async with upstream.listen(uris) as stream:
            honored = types.SubscriptionFilter(
                resource_subscriptions=stream.honored.resource_subscriptions
            )
            acknowledged = types.SubscriptionsAcknowledgedNotificationParams(
                notifications=honored, _meta=meta
            )
            await ctx.session.send_notification(
                types.SubscriptionsAcknowledgedNotification(params=acknowledged),
                related_request_id=ctx.request_id,
            )
            try:
                async for event in stream:
                    if isinstance(event, ResourceUpdated):
                        updated = types.ResourceUpdatedNotificationParams(uri=event.uri, _meta=meta)
                        await ctx.session.send_notification(
                            types.ResourceUpdatedNotification(params=updated),
                            related_request_id=ctx.request_id,
                        )
            except SubscriptionLost:
                raise MCPError(
                    types.INTERNAL_ERROR,
                    "the Field's stream ended without its graceful close: listen again, then "
                    "read each subscription resource once (nothing is lost)",
                ) from None
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
        on_subscriptions_listen=listen,
    )


def relay(bridge: Bridge) -> Push:
    """The resources and push of the Field's ``/mcp``, for the bridge's agent."""
    from mcp import types
    from mcp.shared.exceptions import MCPError

    from .mcp_push import Push, Upstream

    def token() -> str:
        try:
            return bridge.resource_token()
        except _ToolError as refused:
            body = refused.outcome.body
            message = f"{body['code']}: {body['message']}"
            raise MCPError(types.INVALID_PARAMS, message, body) from None

    return Push(Upstream(bridge.field.base_url, token, timeout=bridge.field.timeout))


async def serve_stdio(
    url: str, *, agent_id: str | None = None, token: str | None = None, timeout: float = 30
) -> None:
    """Serve MCP on stdin/stdout until the host closes stdin."""
    from mcp.server.stdio import stdio_server

    async with FieldClient(url, timeout=timeout) as field:
        bridge = Bridge(field)
        if agent_id is not None and token is not None:
            bridge.adopt(agent_id, token)
        push = relay(bridge)
        server = build_server(bridge, push)
        try:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        finally:
            await push.close()


def run(url: str, *, agent_id: str | None, token: str | None, timeout: float) -> int:
    """Entry point of ``field mcp``; returns the exit status."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_stdio(url, agent_id=agent_id, token=token, timeout=timeout))
    return 0
