"""The MCP binding (spec 10.2): Akashik operations as MCP tools.

``field mcp --url URL`` runs an MCP server on stdio that is a *client* of
a running Field: each tool call becomes one operation sent over the HTTP
binding with the SDK (:mod:`field.client`). It is not a transport of the
Field server (those live in :mod:`field.transports`); it is a separate
process an MCP host starts, so one Field serves many such bridges.

Three parts, outermost last:

- :data:`TOOLS`, one table: tool name → operation and description. Each
  tool's input schema is the operation's request schema from
  ``protocol/schemas`` (references inlined, conditional rules left to the
  Field, which checks them and says what is wrong), plus ``agent_id``.
- :class:`Bridge`: holds each agent's token and the polling cursors, turns
  tool arguments into operations and every outcome into a
  :class:`ToolOutcome`: the response payload, or the spec error body
  (code, message, operation, recoverable, suggested_action).
- :func:`build_server` and :func:`serve_stdio`: the MCP protocol, from the
  ``mcp`` package (an optional dependency: ``pip install 'akashik-field[mcp]'``).

MCP is request/response: it cannot carry SUBSCRIBE's push notifications,
so there is no subscribe tool, and MCP agents poll with
``akashik_attune`` (``poll: true``; spec 10.2).

Tokens: an agent's bearer token is held here, never shown in a tool
result (REGISTER's included: the ``token`` field is removed), and never
logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from . import __version__
from .client import AgentClient, FieldClient, FieldClientError

__all__ = ["TOOLS", "Bridge", "ToolOutcome", "build_server", "serve_stdio", "tool_definitions"]

logger = logging.getLogger("field.mcp")

URN_PREFIX = "urn:akashik-field:0.1.0:"


@dataclass(frozen=True)
class Tool:
    """One MCP tool: the operation it sends and what the model is told about it."""

    operation: str
    description: str
    extension: bool = False  # not among the tools spec 10.2 names


_AGENT_NOTE = " agent_id: the acting agent; may be left out while this server acts for exactly one."

TOOLS: dict[str, Tool] = {
    "akashik_register": Tool(
        "REGISTER",
        "Join the Field as a new agent (id, role, interests). Call this first. The server keeps "
        "the agent's token; the result shows the agent and the Field's capabilities.",
    ),
    "akashik_record": Tool(
        "RECORD",
        "Write a memory unit: type, content, intent.purpose (why), and for a committed unit "
        "confidence {score 0..1, reasoning}. Relations link it to earlier units "
        "(e.g. contradicts). session_id: the envelope's session (default: the session this "
        "agent last created or joined here; null for none)." + _AGENT_NOTE,
    ),
    "akashik_attune": Tool(
        "ATTUNE",
        "Read what is relevant to you, ranked. scope defaults to your role and max_units 10. "
        "To see only what is new, set poll: true: each poll returns the units recorded since "
        "this agent's previous poll (the first poll starts from epoch 0), oldest first, "
        "max_units at a time. Or pass since_epoch yourself: the epoch of the previous "
        "response." + _AGENT_NOTE,
    ),
    "akashik_detect": Tool(
        "DETECT",
        "Conflicts: mode list (with an optional filter), check (target_id: one unit) or scan "
        "(the whole Field)." + _AGENT_NOTE,
    ),
    "akashik_merge": Tool(
        "MERGE",
        "Resolve a conflict with a strategy (last_write_wins, confidence_weighted, authority, "
        "synthesis, vote, human_escalation, ...); resolution.rationale is required, winner_id "
        "for authority and vote, synthesis text for synthesis. Most strategies need "
        "authority 6; a vote ballot 4." + _AGENT_NOTE,
    ),
    "akashik_replay": Tool(
        "REPLAY",
        "The history of a task, memory_unit, decision, conflict or session: depth summary, "
        "detailed or full_trace." + _AGENT_NOTE,
    ),
    "akashik_compact": Tool(
        "COMPACT",
        "Archive, summarize or purge units matching a filter (at least one criterion: "
        "max_age_epochs, session_id, types, status). Needs authority 6 (purge 8)." + _AGENT_NOTE,
    ),
    "akashik_deregister": Tool(
        "DEREGISTER",
        "Leave the Field: the agent's token is revoked; its units stay." + _AGENT_NOTE,
        extension=True,
    ),
    "akashik_session": Tool(
        "SESSION",
        "Sessions: create (name), join, leave, pause, resume, end (session_id), or list "
        "yours. Work recorded while in a session belongs to it." + _AGENT_NOTE,
        extension=True,
    ),
    "akashik_coordinate": Tool(
        "COORDINATE",
        "Tasks: create (title), assign (assignee), start, block, unblock, complete (result), "
        "fail, release, cancel (task_id), or list yours. session_id as for akashik_record."
        + _AGENT_NOTE,
        extension=True,
    ),
    "akashik_handoff": Tool(
        "HANDOFF",
        "Hand a task to another agent with notes; the Field packages the relevant units for "
        "it." + _AGENT_NOTE,
        extension=True,
    ),
}

_SESSION_TOOLS = {"akashik_record", "akashik_coordinate"}  # take the envelope's session_id

INSTRUCTIONS = (
    "Tools of an Akashik Field: shared memory and coordination for agents. Register once with "
    "akashik_register, then record what you learn (akashik_record, with intent and "
    "confidence) and read what others learned (akashik_attune). There are no push "
    "notifications over MCP: poll with akashik_attune {poll: true}. A failed call returns "
    "the Field's error body: code, message, recoverable and suggested_action say what to fix."
)


# -- input schemas, derived from protocol/schemas ---------------------------------------------


def _schema_dir() -> Path:
    """The protocol schemas: packaged in the wheel, or in the source tree."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_schemas", here.parent / "protocol" / "schemas"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("the protocol schemas are not installed")


@functools.cache
def _schemas() -> dict[str, dict[str, Any]]:
    return {
        path.name.removesuffix(".json"): json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(_schema_dir().glob("*.json"))
    }


# Conditional rules (which fields an action needs) are left to the Field: it
# checks them and answers with an error that says what is missing, and some
# MCP hosts refuse tool schemas that use these keywords. The descriptions
# state the rules in words.
_DROPPED = {"$schema", "$id", "$defs", "if", "then", "else", "allOf"}


def _resolve(ref: str, file: str) -> tuple[Any, str]:
    """The schema a ``$ref`` points at, and the file it is in."""
    location, _, pointer = ref.partition("#")
    if location:
        file = location.removeprefix(URN_PREFIX)
    node: Any = _schemas()[file]
    for part in filter(None, pointer.split("/")):
        node = node[part]
    return node, file


def _inline(node: Any, file: str) -> Any:
    """``node`` with every ``$ref`` replaced by what it points at."""
    if isinstance(node, list):
        return [_inline(item, file) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target, target_file = _resolve(node["$ref"], file)
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **siblings}, target_file)
    return {k: _inline(v, file) for k, v in node.items() if k not in _DROPPED}


def _input_schema(name: str) -> dict[str, Any]:
    operation = TOOLS[name].operation
    stem = f"{operation.lower()}.request"
    schema: dict[str, Any] = _inline(copy.deepcopy(_schemas()[stem]), stem)
    properties: dict[str, Any] = schema.setdefault("properties", {})
    if operation != "REGISTER":
        properties["agent_id"] = {
            "type": "string",
            "description": "The acting agent (registered through this server, or --agent-id). "
            "May be left out while this server acts for exactly one agent.",
        }
        schema["required"] = [f for f in schema.get("required", []) if f != "agent_id"]
    if name in _SESSION_TOOLS:
        properties["session_id"] = {
            "type": ["string", "null"],
            "description": "The envelope's session_id. Default: the session this agent last "
            "created or joined through this server; null for none.",
        }
    if operation == "ATTUNE":
        schema["required"] = []
        scope = properties["scope"]
        scope["required"] = []
        scope["description"] = "Defaults: role = the agent's role, max_units = 10."
        properties["poll"] = {
            "type": "boolean",
            "default": False,
            "description": "Return only units newer than this agent's previous poll "
            "(since_epoch kept by this server, starting at 0).",
        }
    return schema


@functools.cache
def tool_definitions() -> dict[str, dict[str, Any]]:
    """Every tool: ``{name: {"description", "inputSchema"}}``."""
    return {
        name: {"description": tool.description, "inputSchema": _input_schema(name)}
        for name, tool in TOOLS.items()
    }


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


class _ToolError(Exception):
    """A call refused by the bridge itself, before reaching the Field."""

    def __init__(self, outcome: ToolOutcome) -> None:
        super().__init__(outcome.body["message"])
        self.outcome = outcome


class Bridge:
    """Tool calls in, Field operations out; holds the agents' tokens.

    ``agents`` maps agent id → :class:`AgentClient` (token, Lamport clock,
    current session). ``cursors`` maps agent id → the ``epoch`` of its last
    poll: the ``since_epoch`` of its next one.
    """

    def __init__(self, field: FieldClient) -> None:
        self.field = field
        self.agents: dict[str, AgentClient] = {}
        self.cursors: dict[str, int] = {}

    def adopt(self, agent_id: str, token: str) -> AgentClient:
        """Act for an agent registered elsewhere (``--agent-id`` and ``--token``)."""
        agent = self.field.agent(agent_id, token)
        self.agents[agent_id] = agent
        return agent

    async def call(self, name: str, arguments: Mapping[str, Any] | None) -> ToolOutcome:
        """Run one tool call; never raises for a bad call or an unreachable Field."""
        tool = TOOLS.get(name)
        if tool is None:
            return _error(
                "NOT_FOUND",
                f"no tool named {name!r}",
                operation=None,
                recoverable=False,
                suggested_action="Call one of: " + ", ".join(TOOLS),
            )
        args = dict(arguments or {})
        try:
            if tool.operation == "REGISTER":
                return await self._register(args)
            agent = self._agent(args.pop("agent_id", None), tool.operation)
            return await self._send(name, tool.operation, agent, args)
        except _ToolError as refused:
            return refused.outcome
        except FieldClientError as exc:
            return ToolOutcome(exc.body, is_error=True)
        except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError) as exc:
            # A body that is not JSON: something else than a Field answers at that URL.
            return self._unreachable(tool.operation, exc)

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
        agent_id = args.get("id")
        body = self.field.envelope("REGISTER", str(agent_id), args)
        response = await self.field.request("POST", "/v1/register", body=body)
        token = response.pop("token")
        agent = self.field.agent(response["agent"]["id"], token, role=response["agent"]["role"])
        agent.epoch = response["epoch"]
        self.agents[agent.id] = agent
        self.cursors.pop(agent.id, None)
        return ToolOutcome(response)

    async def _send(
        self, name: str, operation: str, agent: AgentClient, args: dict[str, Any]
    ) -> ToolOutcome:
        session_id = args.pop("session_id", agent.session_id) if name in _SESSION_TOOLS else None
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
            _follow_session(agent, args, response)
        if operation == "DEREGISTER":
            del self.agents[agent.id]
            self.cursors.pop(agent.id, None)
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


def _follow_session(agent: AgentClient, args: dict[str, Any], response: dict[str, Any]) -> None:
    """Track the agent's current session: set by create/join, cleared by leave/end of it."""
    action = args.get("action")
    session = response.get("session")
    if not isinstance(session, dict):
        return
    if action in ("create", "join"):
        agent.session_id = session["id"]
    elif action in ("leave", "end") and agent.session_id == session["id"]:
        agent.session_id = None


# -- the MCP server ---------------------------------------------------------------------------


def build_server(bridge: Bridge) -> Any:
    """An ``mcp`` low-level server whose tools call ``bridge``.

    The handlers are installed directly (not with the ``call_tool``
    decorator) so that the Field, not the MCP library, validates the
    arguments: its errors carry the spec's codes and suggested actions.
    """
    from mcp import types
    from mcp.server.lowlevel import Server

    server: Server[Any] = Server("akashik-field", version=__version__, instructions=INSTRUCTIONS)
    tools = [
        types.Tool(name=name, description=d["description"], inputSchema=d["inputSchema"])
        for name, d in tool_definitions().items()
    ]

    async def list_tools(_: types.ListToolsRequest) -> types.ServerResult:
        return types.ServerResult(types.ListToolsResult(tools=tools))

    async def call_tool(request: types.CallToolRequest) -> types.ServerResult:
        outcome = await bridge.call(request.params.name, request.params.arguments)
        text = types.TextContent(type="text", text=outcome.text)
        return types.ServerResult(types.CallToolResult(content=[text], isError=outcome.is_error))

    handlers: dict[type, Callable[[Any], Any]] = server.request_handlers
    handlers[types.ListToolsRequest] = list_tools
    handlers[types.CallToolRequest] = call_tool
    return server


async def serve_stdio(
    url: str, *, agent_id: str | None = None, token: str | None = None, timeout: float = 30
) -> None:
    """Serve MCP on stdin/stdout until the host closes stdin."""
    from mcp.server.stdio import stdio_server

    async with FieldClient(url, timeout=timeout) as field:
        bridge = Bridge(field)
        if agent_id is not None and token is not None:
            bridge.adopt(agent_id, token)
        server = build_server(bridge)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def run(url: str, *, agent_id: str | None, token: str | None, timeout: float) -> int:
    """Entry point of ``field mcp``; returns the exit status."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_stdio(url, agent_id=agent_id, token=token, timeout=timeout))
    return 0
