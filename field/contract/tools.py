"""The Field's operations as tools: what the MCP and the RAP bindings both offer.

One table, :data:`TOOLS`: tool name → the operation it sends and what the
model is told about it. Each tool's input schema is the operation's request
schema from ``protocol/schemas`` (references inlined, conditional rules
left to the Field, which checks them and says what is wrong), plus the
arguments the binding adds.

Two bindings use it, and differ where their hosts differ:

* ``mcp`` (:mod:`field.cli.mcp_bridge`): a bridge process holds the agents' tokens, so
  every tool but ``akashik_register`` takes ``agent_id``; ATTUNE takes
  ``poll`` (MCP cannot push); the session of RECORD and COORDINATE defaults
  to the one the agent last joined through the bridge.
* ``rap`` (:mod:`field.transports.rap`): the runtime acts for one agent,
  named by its bearer token, never by an argument; there is no register
  tool (its result is a secret the model must not see) and there is
  ``akashik_subscribe`` (:data:`SUBSCRIBE_TOOL`), whose notifications come
  back as RAP subscription events.
* ``mcp_http`` (:mod:`field.transports.mcp.streamable_http`, ``/mcp`` of ``field serve``):
  an MCP session acts for the agent of its bearer token, as RAP does, so no
  register tool and no ``agent_id``; ``poll`` and the default session are
  kept per MCP session; ``akashik_subscribe`` (:data:`MCP_SUBSCRIBE_TOOL`)
  makes a subscription whose notifications are read from its resource
  ``field://subscriptions/{id}``.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import PROTOCOL_VERSION

__all__ = [
    "MCP_HTTP_TOOLS",
    "MCP_SUBSCRIBE_TOOL",
    "RAP_TOOLS",
    "SESSION_TOOLS",
    "SUBSCRIBE_TOOL",
    "TOOLS",
    "Tool",
    "describe",
    "input_schema",
    "rap_tools",
]

Binding = Literal["mcp", "mcp_http", "rap"]

URN_PREFIX = "urn:akashik-field:0.1.0:"


@dataclass(frozen=True)
class Tool:
    """One tool: the operation it sends and what the model is told about it."""

    operation: str
    description: str
    extension: bool = False  # not among the tools spec 10.2 names
    #: the description in one binding, where it differs from ``description``
    variants: Mapping[str, str] = field(default_factory=dict)


_POLL = (
    "To see only what is new, set poll: true: each poll returns the units recorded since "
    "this agent's previous poll (the first poll starts from epoch 0), oldest first, "
    "max_units at a time. Or pass since_epoch yourself: the epoch of the previous "
    "response. A page also ends where the response would pass the Field's size bound "
    "(context_budget.limited_by says which bound ended it); a poll then continues there."
)
_SINCE = (
    "To see only what is new, pass since_epoch: the epoch of an earlier response (or "
    "subscribe with akashik_subscribe to be told). A page also ends where the response "
    "would pass the Field's size bound (context_budget.limited_by says which bound ended "
    "it); send the response's epoch as since_epoch to read on."
)
_RECORD = (
    "Write a memory unit: type, content, intent.purpose (why), and for a committed unit "
    "confidence {score 0..1, reasoning}. Relations link it to earlier units "
    "(e.g. contradicts)."
)
_COORDINATE = (
    "Tasks: create (title), assign (assignee), start, block, unblock, complete (result), "
    "fail, release, cancel (task_id), or list yours (in pages: send a non-null next as "
    "after)."
)
_MCP_SESSION = (
    " session_id: the envelope's session (default: the session this agent last created or "
    "joined here; null for none)."
)
_RAP_SESSION = " session_id: the session the work belongs to (default null: none)."
_HTTP_SESSION = (
    " session_id: the envelope's session (default: the session this agent last created or "
    "joined in this MCP session; null for none)."
)
_HTTP_POLL = (
    "To see only what is new, set poll: true: each poll returns the units recorded since "
    "this MCP session's previous poll (the first poll starts from epoch 0), oldest first, "
    "max_units at a time. Or pass since_epoch yourself: the epoch of the previous "
    "response. A page also ends where the response would pass the Field's size bound "
    "(context_budget.limited_by says which bound ended it); a poll then continues there."
)

TOOLS: dict[str, Tool] = {
    "akashik_register": Tool(
        "REGISTER",
        "Join the Field as a new agent (id, role, interests). Call this first. The server keeps "
        "the agent's token; the result shows the agent and the Field's capabilities. An id "
        "is never reused by another agent: one that deregistered can be registered again "
        "only through the server that deregistered it.",
    ),
    "akashik_record": Tool(
        "RECORD",
        _RECORD,
        variants={
            "mcp": _RECORD + _MCP_SESSION,
            "mcp_http": _RECORD + _HTTP_SESSION,
            "rap": _RECORD + _RAP_SESSION,
        },
    ),
    "akashik_attune": Tool(
        "ATTUNE",
        "Read what is relevant to you, ranked. scope defaults to your role and max_units 10.",
        variants={
            "mcp": "Read what is relevant to you, ranked. scope defaults to your role and "
            "max_units 10. " + _POLL,
            "mcp_http": "Read what is relevant to you, ranked. scope defaults to your role and "
            "max_units 10. " + _HTTP_POLL,
            "rap": "Read what is relevant to you, ranked. scope defaults to your role and "
            "max_units 10. " + _SINCE,
        },
    ),
    "akashik_detect": Tool(
        "DETECT",
        "Conflicts: mode list (with an optional filter), check (target_id: one unit) or scan "
        "(the whole Field). list comes in pages: while the response's next is not null, "
        "send it as after for the next page.",
    ),
    "akashik_merge": Tool(
        "MERGE",
        "Resolve a conflict with a strategy (last_write_wins, confidence_weighted, authority, "
        "synthesis, vote, human_escalation, ...); resolution.rationale is required, winner_id "
        "for authority and vote, synthesis text for synthesis. Most strategies need "
        "authority 6; a vote ballot 4.",
    ),
    "akashik_replay": Tool(
        "REPLAY",
        "The history of a task, memory_unit, decision, conflict or session: depth summary, "
        "detailed or full_trace.",
    ),
    "akashik_compact": Tool(
        "COMPACT",
        "Archive, summarize or purge units matching a filter (at least one criterion: "
        "max_age_epochs, session_id, types, status). Needs authority 6 (purge 8).",
    ),
    "akashik_feedback": Tool(
        "FEEDBACK",
        "Tell the Field which units it pushed or returned to you were useful (useful: true) "
        "and which were not (false), 1 to 64 at a time: your relevance learns from them, in "
        "pushes and in akashik_attune alike.",
        extension=True,
    ),
    "akashik_deregister": Tool(
        "DEREGISTER",
        "Leave the Field: the agent's token is revoked; its units stay.",
        extension=True,
        variants={
            "rap": "Leave the Field: the agent's token is revoked (every later call of these "
            "tools fails) and its subscriptions end; its units stay.",
            "mcp_http": "Leave the Field: the agent's token is revoked (every later request of "
            "this MCP connection fails) and its subscriptions end; its units stay.",
        },
    ),
    "akashik_session": Tool(
        "SESSION",
        "Sessions: create (name; invitees to invite agents at once), invite and uninvite "
        "(session_id, invitees: agent ids), join, leave, pause, resume, end (session_id), or "
        "list yours and those you are invited to (in pages: send a non-null next as after). "
        "A session is closed: only invited agents (and its creator) may join; inviting, "
        "pausing and ending need its creator or authority 8. Work recorded while in a session "
        "belongs to it and is seen by its members only.",
        extension=True,
    ),
    "akashik_coordinate": Tool(
        "COORDINATE",
        _COORDINATE,
        extension=True,
        variants={
            "mcp": _COORDINATE + _MCP_SESSION,
            "mcp_http": _COORDINATE + _HTTP_SESSION,
            "rap": _COORDINATE + _RAP_SESSION,
        },
    ),
    "akashik_handoff": Tool(
        "HANDOFF",
        "Hand a task to another agent with notes; the Field packages the relevant units for it.",
        extension=True,
    ),
}

#: The tools that take the envelope's ``session_id`` as an argument.
SESSION_TOOLS = frozenset({"akashik_record", "akashik_coordinate"})


def session_after(current: str | None, args: Mapping[str, Any], response: Any) -> str | None:
    """The caller's current Field session after a ``SESSION`` call with ``args`` answered
    ``response``: the one it created or joined, none once it left or ended it, else
    ``current``."""
    action, session = args.get("action"), response.get("session")
    if not isinstance(session, dict):
        return current
    if action in ("create", "join"):
        return str(session["id"])
    if action in ("leave", "end") and current == session["id"]:
        return None
    return current


def tool_envelope(
    operation: str,
    args: dict[str, Any],
    *,
    agent_id: str,
    role: str,
    session_id: str | None,
    message_id: str,
) -> dict[str, Any]:
    """The envelope a tool call sends as the agent ``agent_id`` (of ``role``), the one
    translation of MCP (stdio bridge aside, which sends through the SDK) and RAP: ATTUNE's
    scope defaults to the agent's role and 10 units, DEREGISTER to the agent itself.
    ``args`` becomes the payload (changed in place)."""
    if operation == "ATTUNE":
        scope = args.get("scope")
        if scope is None:
            scope = args["scope"] = {}
        if isinstance(scope, dict):
            scope.setdefault("role", role)
            scope.setdefault("max_units", 10)
    elif operation == "DEREGISTER":
        args.setdefault("agent_id", agent_id)
    return {
        "protocol": "akashik",
        "version": PROTOCOL_VERSION,
        "id": message_id,
        "operation": operation,
        "agent_id": agent_id,
        "session_id": session_id,
        "epoch": 0,
        "payload": args,
    }


#: RAP only: SUBSCRIBE, its notifications delivered as the call's subscription events.
SUBSCRIBE_TOOL = Tool(
    "SUBSCRIBE",
    "Be told when something happens in the Field: events (memory.recorded, "
    "conflict.detected, task.assigned, handoff.incoming, ...), min_relevance 0..1, "
    "debounce_ms, include_own (your own actions too). The result names the subscription; "
    "each notification then arrives as an event of this call, in a new thread each "
    "(associative: true: in this thread). To stop, cancel the subscription (this call's "
    "id); it ends with one final event. A thread holds a limited number at once.",
    extension=True,
)

#: MCP over HTTP only: SUBSCRIBE, its notifications read from the subscription's resource.
MCP_SUBSCRIBE_TOOL = Tool(
    "SUBSCRIBE",
    "Be told when something happens in the Field: action subscribe (the default) with events "
    "(memory.recorded, conflict.detected, task.assigned, handoff.incoming, ...), "
    "min_relevance 0..1, debounce_ms, include_own (your own actions too). The result names "
    "the subscription and its resource field://subscriptions/{id}: subscribe to that "
    "resource to be sent notifications/resources/updated when notifications are ready, then "
    "read it: each read returns the notifications since this session's previous read (read "
    "again while more is true). action unsubscribe (subscription_id) ends a subscription; "
    "action list shows yours.",
    extension=True,
)

_MCP_AGENT_NOTE = (
    " agent_id: the acting agent; may be left out while this server acts for exactly one."
)


def rap_tools() -> dict[str, Tool]:
    """The RAP binding's tools: every operation but REGISTER, and ``akashik_subscribe``."""
    names = [name for name in TOOLS if name != "akashik_register"]
    names.insert(names.index("akashik_attune") + 1, "akashik_subscribe")
    return {name: TOOLS.get(name, SUBSCRIBE_TOOL) for name in names}


RAP_TOOLS: dict[str, Tool] = rap_tools()
#: The tools of an MCP session over HTTP: RAP's, with its own ``akashik_subscribe``.
MCP_HTTP_TOOLS: dict[str, Tool] = {
    name: MCP_SUBSCRIBE_TOOL if name == "akashik_subscribe" else tool
    for name, tool in RAP_TOOLS.items()
}
_BINDING_TOOLS: dict[Binding, dict[str, Tool]] = {
    "mcp": TOOLS,
    "mcp_http": MCP_HTTP_TOOLS,
    "rap": RAP_TOOLS,
}


def describe(name: str, binding: Binding) -> str:
    """What the model is told about tool ``name`` in ``binding``."""
    tool = _BINDING_TOOLS[binding].get(name) or TOOLS.get(name) or RAP_TOOLS[name]
    text = tool.variants.get(binding, tool.description)
    if binding == "mcp" and tool.operation != "REGISTER":
        text += _MCP_AGENT_NOTE
    return text


# -- input schemas, derived from protocol/schemas ---------------------------------------------


def _schema_dir() -> Path:
    """The protocol schemas: packaged in the wheel, or in the source tree."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_schemas", package.parent / "protocol" / "schemas"):
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
# hosts refuse tool schemas that use these keywords. The descriptions state
# the rules in words.
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


def request_schema(operation: str) -> dict[str, Any]:
    """The payload schema of ``operation``, self-contained (a fresh copy)."""
    stem = f"{operation.lower()}.request"
    schema: dict[str, Any] = _inline(copy.deepcopy(_schemas()[stem]), stem)
    return schema


#: The fields of a new subscription ``akashik_subscribe`` takes (SUBSCRIBE ``subscribe``).
SUBSCRIPTION_FIELDS = ("events", "min_relevance", "debounce_ms", "include_own", "timeout")


def _subscribe_schema() -> dict[str, Any]:
    """``akashik_subscribe``: a new subscription's fields, and ``associative``."""
    new, file = _resolve("#/$defs/new_subscription", "subscribe.request")
    fields = _inline(copy.deepcopy(new), file)["properties"]
    properties = {name: fields[name] for name in SUBSCRIPTION_FIELDS}
    properties["associative"] = {
        "type": "boolean",
        "default": False,
        "description": "true: each notification is an event in this thread; false: the "
        "runtime handles each in a new thread.",
    }
    return {
        "type": "object",
        "required": ["events"],
        "properties": properties,
        "additionalProperties": False,
    }


def _mcp_subscribe_schema() -> dict[str, Any]:
    """``akashik_subscribe`` over MCP: the SUBSCRIBE actions, a new subscription's fields
    flat beside them."""
    fields = _subscribe_schema()["properties"]
    del fields["associative"]
    properties = {
        "action": {
            "type": "string",
            "enum": ["subscribe", "unsubscribe", "list"],
            "default": "subscribe",
            "description": "subscribe: a new subscription (events needed); unsubscribe: end "
            "subscription_id; list: your active subscriptions.",
        },
        "subscription_id": {
            "type": "string",
            "description": "The subscription to end (action unsubscribe).",
        },
        **fields,
    }
    return {"type": "object", "properties": properties, "additionalProperties": False}


def input_schema(name: str, binding: Binding) -> dict[str, Any]:
    """The ``inputSchema`` of tool ``name`` in ``binding`` (a fresh copy)."""
    if name == "akashik_subscribe":
        return _mcp_subscribe_schema() if binding == "mcp_http" else _subscribe_schema()
    operation = TOOLS[name].operation
    schema = request_schema(operation)
    properties: dict[str, Any] = schema.setdefault("properties", {})
    if binding == "mcp" and operation != "REGISTER":
        properties["agent_id"] = {
            "type": "string",
            "description": "The acting agent (registered through this server, or --agent-id). "
            "May be left out while this server acts for exactly one agent.",
        }
        schema["required"] = [f for f in schema.get("required", []) if f != "agent_id"]
    if binding != "mcp" and operation == "DEREGISTER":  # the token's agent, always
        del properties["agent_id"]
        schema["required"] = []
        schema["description"] = (
            "No arguments: the agent "
            + ("the runtime acts for" if binding == "rap" else "this MCP session acts for")
            + " leaves."
        )
    if name in SESSION_TOOLS:
        properties["session_id"] = {
            "type": ["string", "null"],
            "description": _SESSION_ARGUMENT[binding],
        }
    if operation == "ATTUNE":
        schema["required"] = []
        scope = properties["scope"]
        scope["required"] = []
        scope["description"] = "Defaults: role = the agent's role, max_units = 10."
        if binding != "rap":
            properties["poll"] = {
                "type": "boolean",
                "default": False,
                "description": _POLL_ARGUMENT[binding],
            }
    return schema


_SESSION_ARGUMENT: dict[Binding, str] = {
    "mcp": "The envelope's session_id. Default: the session this agent last created or joined "
    "through this server; null for none.",
    "mcp_http": "The envelope's session_id. Default: the session this agent last created or "
    "joined in this MCP session; null for none.",
    "rap": "The envelope's session_id: the session the work belongs to. Default: null (none).",
}
_POLL_ARGUMENT: dict[Binding, str] = {
    "mcp": "Return only units newer than this agent's previous poll (since_epoch kept by this "
    "server, starting at 0).",
    "mcp_http": "Return only units newer than this MCP session's previous poll (since_epoch "
    "kept by the Field for the session, starting at 0).",
}


@functools.cache
def definitions(binding: Binding) -> dict[str, dict[str, Any]]:
    """Every tool of ``binding``: ``{name: {"description", "inputSchema"}}``."""
    names = _BINDING_TOOLS[binding]
    return {
        name: {"description": describe(name, binding), "inputSchema": input_schema(name, binding)}
        for name in names
    }
