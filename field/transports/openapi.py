"""The OpenAPI 3.1 document of ``field serve`` (``GET /openapi.json``).

The document is built at run time from two sources, and only from them:

* **The JSON Schemas** of ``protocol/schemas``: each file is one entry of
  ``components/schemas`` named by its stem (``memory-unit``, ``record.request``).
  OpenAPI 3.1 speaks JSON Schema 2020-12, so a schema goes in as it is, less its
  ``$schema`` and ``$id`` (a base URI would change what the document's own
  ``#/components/...`` references mean), with every ``$ref`` rewritten from
  ``urn:akashik-field:0.1.0:<stem>#<pointer>`` (or ``#<pointer>`` inside the file)
  to ``#/components/schemas/<stem><pointer>``. Nothing else is copied or restated.
* **One table**, :data:`ENDPOINTS`: for each method and path, who may call it, the
  schemas of its request and its response, its parameters, and the error codes it
  may answer beyond those every endpoint may (:data:`ANY_ENDPOINT`). The statuses
  of the error responses come from :data:`field.contract.errors.HTTP_STATUS`; each is the
  error schema, with its codes listed (``x-error-codes``) and ``Retry-After``
  documented where the server sends it.

Adding an endpoint is adding one :class:`Endpoint` to the table.
``tests/test_openapi.py`` fails, naming the route, when the app serves a route
the table lacks, and when the document and the schema files disagree.
"""

from __future__ import annotations

import copy
import functools
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .. import __version__
from ..contract.errors import HTTP_STATUS, Code
from ..contract.model import OPERATIONS

#: How one schema file names another (its ``$id``).
URN_PREFIX = "urn:akashik-field:0.1.0:"
#: Where the document keeps the schemas.
COMPONENTS = "#/components/schemas/"


# -- the schemas -----------------------------------------------------------------------------


def schema_dir() -> Path:
    """The protocol schemas: packaged in the wheel, or in the source tree."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_schemas", package.parent / "protocol" / "schemas"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("the protocol schemas are not installed")


def load_schemas() -> dict[str, dict[str, Any]]:
    """Every schema file by its stem, as the file holds it."""
    return {
        path.name.removesuffix(".json"): json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(schema_dir().glob("*.json"))
    }


def component_ref(ref: str, stem: str | None = None) -> str:
    """``ref``, written in schema file ``stem`` (None: outside any file), as a reference
    to the document's components."""
    location, _, pointer = ref.partition("#")
    if location:
        if not location.startswith(URN_PREFIX):
            raise ValueError(f"a reference outside the protocol schemas: {ref!r}")
        stem = location.removeprefix(URN_PREFIX)
    if stem is None:
        raise ValueError(f"a relative reference outside a schema file: {ref!r}")
    return COMPONENTS + stem + pointer


def as_component(node: Any, stem: str | None = None) -> Any:
    """A copy of ``node`` with every ``$ref`` pointing into the components, and the
    top level's ``$schema`` and ``$id`` dropped."""
    if isinstance(node, list):
        return [as_component(item, stem) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: component_ref(value, stem) if key == "$ref" else as_component(value, stem)
        for key, value in node.items()
        if key not in ("$schema", "$id")
    }


def components(schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``components/schemas`` of the document: every file, references rewritten."""
    return {stem: as_component(schema, stem) for stem, schema in schemas.items()}


def ref(stem: str, pointer: str = "") -> dict[str, str]:
    """A reference to schema file ``stem`` (and a place in it, ``"/$defs/epoch"``)."""
    return {"$ref": COMPONENTS + stem + pointer}


# -- the table of endpoints ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    """A query, path or header parameter."""

    name: str
    where: str  # "query", "path" or "header"
    schema: dict[str, Any]
    description: str
    required: bool = False
    #: may be given more than once (``?id=a&id=b``); the schema is then an item's
    repeated: bool = False

    def document(self) -> dict[str, Any]:
        schema = as_component(self.schema)
        if self.repeated:
            schema = {"type": "array", "items": schema}
        doc: dict[str, Any] = {
            "name": self.name,
            "in": self.where,
            "description": self.description,
            "required": self.required or self.where == "path",
            "schema": schema,
        }
        if self.repeated:
            doc |= {"style": "form", "explode": True}
        return doc


#: Who may call an endpoint, as OpenAPI security requirements (any one of them suffices).
SECURITY: dict[str, list[dict[str, list[str]]]] = {
    "public": [],
    "agent": [{"agentToken": []}],
    #: a push stream: the header, or ``?token=`` for browsers (EventSource, WebSocket)
    "push": [{"agentToken": []}, {"queryToken": []}],
    "operator": [{"operatorToken": []}],
    #: ``GET /metrics``: open, or its own token with ``--metrics-token-file``
    "metrics": [{}, {"metricsToken": []}],
    #: REGISTER: none; the operator's token, or a retired id's last token, when given
    "register": [{}, {"operatorToken": []}, {"agentToken": []}],
    #: an inbound event: no token, a signature of its sender (the parameters say which)
    "signed": [],
    #: the console's stream: an agent's token or the operator's, as for a push stream
    "console": [{"agentToken": []}, {"operatorToken": []}, {"queryToken": []}],
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """One method and path of ``field serve``, as the document shows it."""

    method: str
    path: str
    #: the ``operationId``
    name: str
    summary: str
    tag: str
    auth: str  # a key of SECURITY
    description: str = ""
    #: the JSON body: a schema file's stem, or a schema (``$ref``\\ s to ``urn:...`` allowed)
    request: str | dict[str, Any] | None = None
    #: whether the body must be sent (an optional one may be left out, or be empty)
    request_required: bool = True
    #: the body of the success response: a stem or a schema; None: no body described
    response: str | dict[str, Any] | None = None
    #: the media type of that body
    media: str = "application/json"
    #: the status of success
    status: int = 200
    #: error codes beyond :data:`ANY_ENDPOINT`
    errors: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    #: headers of the success response
    headers: dict[str, Any] = field(default_factory=dict)
    #: responses besides success and the errors, by status (a redirect)
    more_responses: dict[str, Any] = field(default_factory=dict)
    #: more keys of the Operation Object (``x-...`` extensions)
    extra: dict[str, Any] = field(default_factory=dict)


#: Codes any request may be answered, at the connection (``field.transports.connections``),
#: for its ``Host`` (``field.transports.hosts``) or when the Field fails unexpectedly.
ANY_ENDPOINT = (
    Code.INVALID_HTTP,
    Code.REQUEST_TIMEOUT,
    Code.TOO_MANY_CONNECTIONS,
    Code.MISDIRECTED_REQUEST,
    Code.OVERLOADED,
    Code.INTERNAL_ERROR,
)
#: Codes of reading a JSON body (``http.read_json``).
JSON_BODY = (
    Code.INVALID_JSON,
    Code.PAYLOAD_TOO_LARGE,
    Code.UNSUPPORTED_MEDIA_TYPE,
)
#: Codes of a request with an agent's token.
AUTHENTICATED = (Code.UNAUTHENTICATED, Code.AGENT_NOT_REGISTERED)
#: Codes of a request that goes to the single writer and may write.
WRITES = (Code.LOG_UNAVAILABLE, Code.STORAGE_FULL, Code.EPOCH_OVERFLOW)
#: Codes of a request counted against the agent's rate (``--agent-rate``).
RATED = (Code.RATE_LIMITED,)
#: Codes every ``POST /v1/<operation>`` may answer.
OPERATION = (
    *JSON_BODY,
    Code.INVALID_ENVELOPE,
    Code.INVALID_PAYLOAD,
    Code.INVALID_EPOCH,
    Code.FORBIDDEN,
    Code.INSUFFICIENT_AUTHORITY,
    *RATED,
    *WRITES,
)
#: Codes of the operator's endpoints.
OPERATOR = (*AUTHENTICATED, Code.INSUFFICIENT_AUTHORITY)

#: The codes of each operation beyond :data:`OPERATION`.
OPERATION_ERRORS: dict[str, tuple[str, ...]] = {
    "REGISTER": (
        Code.AGENT_ID_TAKEN,
        Code.AGENT_LIMIT,
        Code.UNSUPPORTED_OPERATION,
        Code.REGISTRATION_CLOSED,
        Code.REGISTRATION_TOKEN_INVALID,
    ),
    "DEREGISTER": AUTHENTICATED,
    "RECORD": (
        *AUTHENTICATED,
        Code.MISSING_INTENT,
        Code.MISSING_CONFIDENCE,
        Code.INVALID_CONFIDENCE,
        Code.INVALID_TYPE,
        Code.UNIT_NOT_FOUND,
        Code.SESSION_NOT_FOUND,
        Code.TASK_NOT_FOUND,
        Code.INVALID_TRANSITION,
    ),
    "ATTUNE": (*AUTHENTICATED, Code.SESSION_NOT_FOUND),
    "DETECT": (*AUTHENTICATED, Code.UNIT_NOT_FOUND),
    "MERGE": (
        *AUTHENTICATED,
        Code.CONFLICT_NOT_FOUND,
        Code.UNIT_NOT_FOUND,
        Code.SESSION_NOT_FOUND,
        Code.INVALID_TRANSITION,
        Code.MERGE_FAILED,
    ),
    "SUBSCRIBE": (
        *AUTHENTICATED,
        Code.SUBSCRIPTION_NOT_FOUND,
        Code.SUBSCRIPTION_LIMIT,
        Code.SUBSCRIPTION_NAME_TAKEN,
        Code.INVALID_FILTER,
        Code.INVALID_TRANSITION,
    ),
    "REPLAY": (
        *AUTHENTICATED,
        Code.UNIT_NOT_FOUND,
        Code.CONFLICT_NOT_FOUND,
        Code.TASK_NOT_FOUND,
        Code.SESSION_NOT_FOUND,
        Code.REPLAY_TOO_LARGE,
        Code.UNSUPPORTED_OPERATION,
    ),
    "COMPACT": (
        *AUTHENTICATED,
        Code.UNIT_NOT_FOUND,
        Code.SESSION_NOT_FOUND,
        Code.INVALID_TRANSITION,
    ),
    "FEEDBACK": (
        *AUTHENTICATED,
        Code.UNIT_NOT_FOUND,
    ),
    "SESSION": (
        *AUTHENTICATED,
        Code.SESSION_NOT_FOUND,
        Code.AGENT_NOT_FOUND,
        Code.INVALID_TRANSITION,
    ),
    "COORDINATE": (
        *AUTHENTICATED,
        Code.TASK_NOT_FOUND,
        Code.AGENT_NOT_FOUND,
        Code.SESSION_NOT_FOUND,
        Code.UNIT_NOT_FOUND,
        Code.INVALID_TRANSITION,
    ),
    "HANDOFF": (
        *AUTHENTICATED,
        Code.TASK_NOT_FOUND,
        Code.AGENT_NOT_FOUND,
        Code.SESSION_NOT_FOUND,
        Code.UNIT_NOT_FOUND,
        Code.INVALID_TRANSITION,
    ),
}


def _operation(operation: str) -> Endpoint:
    name = operation.lower()
    return Endpoint(
        method="POST",
        path=f"/v1/{name}",
        name=name,
        summary=f"{operation} (spec 6): one envelope in, the operation's response out",
        tag="operations",
        auth="register" if operation == "REGISTER" else "agent",
        description=(
            f"The body is the complete envelope whose `operation` is `{operation}` and "
            f"whose `payload` is a `{name}.request`; success is the `{name}.response` "
            "itself, not wrapped in an envelope. See protocol/README.md, "
            f"section {operation}."
        ),
        request={
            "allOf": [
                {"$ref": URN_PREFIX + "envelope"},
                {
                    "properties": {
                        "operation": {"const": operation},
                        "payload": {"$ref": f"{URN_PREFIX}{name}.request"},
                    }
                },
            ]
        },
        response=f"{name}.response",
        errors=(*OPERATION, *OPERATION_ERRORS[operation]),
    )


def _page_params(*filters: Param) -> tuple[Param, ...]:
    return (
        *filters,
        Param(
            name="after",
            where="query",
            schema={"$ref": URN_PREFIX + "envelope#/$defs/after"},
            description="Where the page starts: the `next` of the previous page.",
        ),
        Param(
            name="limit",
            where="query",
            schema={"$ref": URN_PREFIX + "envelope#/$defs/limit"},
            description="The most items of the page (100 by default).",
        ),
    )


def _values(name: str, item: dict[str, Any], description: str) -> Param:
    return Param(
        name=name,
        where="query",
        schema=item,
        repeated=True,
        description=description + " Repeat it, or separate values with commas (at most 1000).",
    )


_TOKEN = Param(
    name="token",
    where="query",
    schema={"type": "string", "minLength": 1},
    description="The agent's token, for browsers (EventSource and WebSocket cannot send "
    "headers); the Authorization header wins when both are given.",
)
_OPERATOR_JSON = (*OPERATOR, *JSON_BODY, Code.INVALID_PAYLOAD, *WRITES)

#: Every endpoint of ``field serve``. Keep one entry per method and path.
ENDPOINTS: tuple[Endpoint, ...] = (
    *(_operation(operation) for operation in OPERATIONS),
    Endpoint(
        method="GET",
        path="/v1/ws",
        name="websocket",
        summary="The WebSocket: push of every subscription of the agent, and operations",
        tag="push",
        auth="push",
        description=(
            "A WebSocket handshake (GET, HTTP/1.1, `Connection: Upgrade`, `Upgrade: "
            "websocket`, `Sec-WebSocket-Version: 13`, no body) is answered 101 and the "
            "connection speaks WebSocket: the client sends envelopes, the Field sends "
            "`ws-frame` messages (`x-websocket`). A failed authentication is an `error` "
            "frame and close code 4401, after the upgrade. Any other request for this path "
            "is 400 INVALID_HANDSHAKE; a browser's handshake from an origin not allowed "
            "(`--cors-origin`) is 403 FORBIDDEN. See protocol/README.md, WebSocket."
        ),
        response=None,
        status=101,
        errors=(Code.INVALID_HANDSHAKE, Code.FORBIDDEN),
        params=(
            _TOKEN,
            Param(
                name="since",
                where="query",
                schema={"type": "string", "minLength": 1},
                repeated=True,
                description="Where to resume: `<cursor>` for every subscription, or "
                "`<subscription_id>@<cursor>` for one.",
            ),
        ),
        extra={
            "x-websocket": {
                "client-messages": ref("envelope"),
                "server-messages": ref("ws-frame"),
            }
        },
    ),
    Endpoint(
        method="GET",
        path="/v1/subscriptions/{subscription_id}/events",
        name="subscription_events",
        summary="Server-Sent Events: one subscription's notifications",
        tag="push",
        auth="push",
        description=(
            "A `text/event-stream`: each notification is an event named after its event "
            "(`memory.recorded`...) whose `id` is its cursor and whose data is a "
            "`notification`; `resume`, `live`, `end` and `overflow` are events with the "
            "data of the `ws-frame` of that type. See protocol/README.md, Server-Sent "
            "Events."
        ),
        response={"type": "string"},
        media="text/event-stream",
        headers={"Cache-Control": {"schema": {"const": "no-store"}}},
        errors=(
            *AUTHENTICATED,
            Code.FORBIDDEN,
            Code.SUBSCRIPTION_NOT_FOUND,
            Code.INVALID_TRANSITION,
        ),
        params=(
            Param(
                name="subscription_id",
                where="path",
                schema={"$ref": URN_PREFIX + "subscription#/$defs/subscription_id"},
                description="The subscription (one of the caller's).",
            ),
            _TOKEN,
            Param(
                name="since",
                where="query",
                schema={"type": "string", "minLength": 1},
                description="The cursor to resume after, on a first connection.",
            ),
            Param(
                name="Last-Event-ID",
                where="header",
                schema={"type": "string"},
                description="The cursor to resume after (EventSource sends it when it "
                "reconnects); wins over `since`.",
            ),
        ),
        extra={"x-events": {"notification": ref("notification"), "control": ref("ws-frame")}},
    ),
    Endpoint(
        method="GET",
        path="/v1/field/status",
        name="field_status",
        summary="The Field's status, counts and limits",
        tag="reads",
        auth="public",
        response="field-status.response",
    ),
    Endpoint(
        method="GET",
        path="/healthz",
        name="healthz",
        summary="The process answers (a liveness probe)",
        tag="operating",
        auth="public",
        response={
            "type": "object",
            "required": ["status"],
            "properties": {"status": {"const": "ok"}},
        },
    ),
    Endpoint(
        method="GET",
        path="/readyz",
        name="readyz",
        summary="The Field can take writes now (a readiness probe); 503 with the reason if not",
        tag="operating",
        auth="public",
        response={"type": "object", "required": ["status"]},
        errors=(Code.LOG_UNAVAILABLE, Code.STORAGE_FULL),
    ),
    Endpoint(
        method="GET",
        path="/metrics",
        name="metrics",
        summary="The Field's numbers in the Prometheus text format",
        tag="operating",
        auth="metrics",
        response={"type": "string"},
        media="text/plain",
        errors=(Code.UNAUTHENTICATED,),
    ),
    Endpoint(
        method="GET",
        path="/v1/agents",
        name="list_agents",
        summary="A page of the registered agents, by id",
        tag="reads",
        auth="agent",
        response="agents.response",
        errors=(*AUTHENTICATED, Code.INVALID_PAYLOAD, *RATED),
        params=_page_params(
            _values(
                "id",
                {"$ref": URN_PREFIX + "agent#/$defs/agent_id"},
                "Only these agents.",
            )
        ),
    ),
    Endpoint(
        method="GET",
        path="/v1/conflicts",
        name="list_conflicts",
        summary="A page of the conflicts, oldest first (unresolved ones by default)",
        tag="reads",
        auth="agent",
        response="conflicts.response",
        errors=(*AUTHENTICATED, Code.INVALID_PAYLOAD, *RATED),
        params=_page_params(
            _values(
                "status",
                {"$ref": URN_PREFIX + "conflict#/$defs/conflict_status"},
                "Only conflicts in these statuses.",
            ),
            _values(
                "type",
                {"$ref": URN_PREFIX + "conflict#/$defs/conflict_type"},
                "Only conflicts of these types.",
            ),
            _values(
                "involving_agent",
                {"$ref": URN_PREFIX + "agent#/$defs/agent_id"},
                "Only conflicts involving these agents.",
            ),
        ),
    ),
    Endpoint(
        method="GET",
        path="/.well-known/rap-toolset",
        name="rap_toolset",
        summary="RAP: the toolset of the Field",
        tag="rap",
        auth="public",
        response="rap-toolset",
    ),
    Endpoint(
        method="POST",
        path="/rap/invoke",
        name="rap_invoke",
        summary="RAP: invoke a tool; its result is POSTed to the callback_url later",
        tag="rap",
        auth="agent",
        request="rap-invocation",
        response="rap-invoke.response",
        errors=(
            *AUTHENTICATED,
            *JSON_BODY,
            *RATED,
            Code.INVALID_ENVELOPE,
            Code.INVALID_PAYLOAD,
            Code.TOOLSET_CHANGED,
        ),
    ),
    Endpoint(
        method="POST",
        path="/cancel_tool_call",
        name="rap_cancel_tool_call",
        summary="RAP: cancel the subscriptions of one tool call",
        tag="rap",
        auth="agent",
        description="200 whatever was cancelled; a body that is no cancel request is 200 "
        "`ignored`, with the reason.",
        request="rap-cancel-tool-call.request",
        response="rap-cancel.response",
        errors=(*AUTHENTICATED, *WRITES),
    ),
    Endpoint(
        method="POST",
        path="/close_thread",
        name="rap_close_thread",
        summary="RAP: cancel the subscriptions of a thread",
        tag="rap",
        auth="agent",
        description="200 whatever was cancelled; a body that is no close request is 200 "
        "`ignored`, with the reason.",
        request="rap-close-thread.request",
        response="rap-cancel.response",
        errors=(*AUTHENTICATED, *WRITES),
    ),
    Endpoint(
        method="GET",
        path="/v1/sources",
        name="list_sources",
        summary="The inbound event sources, with their counts",
        tag="sources",
        auth="operator",
        response="sources.response",
        errors=OPERATOR,
    ),
    Endpoint(
        method="POST",
        path="/v1/sources",
        name="define_source",
        summary="Define or redefine an inbound event source",
        tag="sources",
        auth="operator",
        request="source.request",
        response="source.response",
        errors=(*_OPERATOR_JSON, Code.INVALID_FILTER, Code.SOURCE_LIMIT, Code.SESSION_NOT_FOUND),
    ),
    Endpoint(
        method="DELETE",
        path="/v1/sources/{name}",
        name="remove_source",
        summary="Remove an inbound event source",
        tag="sources",
        auth="operator",
        response="source-remove.response",
        errors=(*OPERATOR, *WRITES, Code.SOURCE_NOT_FOUND),
        params=(
            Param(
                name="name",
                where="path",
                schema={"$ref": URN_PREFIX + "source#/$defs/name"},
                description="The source.",
            ),
        ),
    ),
    Endpoint(
        method="POST",
        path="/v1/sources/{name}/events",
        name="source_event",
        summary="An inbound event, signed by its sender, recorded as a memory unit",
        tag="sources",
        auth="signed",
        description=(
            "No token: the body is signed with the source's secret, by its scheme: "
            "Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`) or "
            "GitHub (`X-Hub-Signature-256`, `X-GitHub-Delivery`). The body is the sender's "
            "JSON object, at most the source's `max_payload_bytes`. See protocol/README.md, "
            "Inbound event sources."
        ),
        request={"type": "object"},
        response="source-event.response",
        errors=(
            *JSON_BODY,
            *WRITES,
            Code.INVALID_PAYLOAD,
            Code.SOURCE_NOT_FOUND,
            Code.INVALID_SIGNATURE,
            Code.STALE_TIMESTAMP,
            Code.SESSION_NOT_FOUND,
            Code.INVALID_TRANSITION,
        ),
        params=(
            Param(
                name="name",
                where="path",
                schema={"$ref": URN_PREFIX + "source#/$defs/name"},
                description="The source.",
            ),
            *(
                Param(
                    name=header,
                    where="header",
                    schema={"type": "string"},
                    description=text,
                )
                for header, text in (
                    (
                        "webhook-id",
                        "Standard Webhooks: the delivery id (duplicates are not stored again).",
                    ),
                    ("webhook-timestamp", "Standard Webhooks: seconds since the epoch."),
                    ("webhook-signature", "Standard Webhooks: `v1,<base64 HMAC-SHA256>`."),
                    ("X-Hub-Signature-256", "GitHub: `sha256=<hex HMAC-SHA256>`."),
                    ("X-GitHub-Delivery", "GitHub: the delivery id."),
                )
            ),
        ),
    ),
    Endpoint(
        method="POST",
        path="/v1/agents/{agent_id}/fail",
        name="declare_agent_failed",
        summary="Declare an agent failed, as liveness does (its tasks go back to pending)",
        tag="operator",
        auth="operator",
        description=(
            'Extension. The body is optional (`{"reason": "..."}`, at most 500 '
            "characters). Writes the `agent.failed` entry a liveness failure writes, with "
            "the reason `declared failed by the operator` (and the given one); a failed "
            "agent heard from again recovers. See protocol/README.md, Declaring an agent failed."
        ),
        request="agent-fail.request",
        request_required=False,
        response="agent-fail.response",
        errors=(*_OPERATOR_JSON, *RATED, Code.AGENT_NOT_FOUND),
        params=(
            Param(
                name="agent_id",
                where="path",
                schema={"$ref": URN_PREFIX + "agent#/$defs/agent_id"},
                description="The agent.",
            ),
        ),
    ),
    Endpoint(
        method="GET",
        path="/v1/events",
        name="list_events",
        summary="A page of the Field's events read from the log, newest first",
        tag="operator",
        auth="operator",
        description=(
            "Extension. At most `limit` events (1 to 200, default 50) among the 2000 log "
            "entries before `before` (default: the end of the log), newest first; `next` is "
            "the `before` of the page further back, null at the start of the log. See "
            "protocol/README.md, The recent past."
        ),
        response="events.response",
        errors=(*OPERATOR, Code.INVALID_PAYLOAD, *RATED),
        params=(
            Param(
                name="before",
                where="query",
                schema={"$ref": URN_PREFIX + "subscription#/$defs/cursor"},
                description="Only events before this cursor (a page's `next`).",
            ),
            Param(
                name="limit",
                where="query",
                schema={"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
                description="Most events returned.",
            ),
        ),
    ),
    Endpoint(
        method="GET",
        path="/v1/registration-tokens",
        name="list_registration_tokens",
        summary="The registration tokens held (never their secrets)",
        tag="registration",
        auth="operator",
        response="registration-tokens.response",
        errors=OPERATOR,
    ),
    Endpoint(
        method="POST",
        path="/v1/registration-tokens",
        name="issue_registration_token",
        summary="Issue a registration token; its secret is in this response only",
        tag="registration",
        auth="operator",
        request="registration-token.request",
        response="registration-token.response",
        errors=(*_OPERATOR_JSON, Code.REGISTRATION_TOKEN_LIMIT),
    ),
    Endpoint(
        method="DELETE",
        path="/v1/registration-tokens/{token_id}",
        name="revoke_registration_token",
        summary="Revoke a registration token",
        tag="registration",
        auth="operator",
        response="registration-token-revoke.response",
        errors=(*OPERATOR, *WRITES, Code.NOT_FOUND),
        params=(
            Param(
                name="token_id",
                where="path",
                schema={"$ref": URN_PREFIX + "registration-token#/$defs/id"},
                description="The token's id (not its secret).",
            ),
        ),
    ),
    Endpoint(
        method="GET",
        path="/",
        name="index",
        summary="The Field's entry points, as JSON",
        tag="meta",
        auth="public",
        description="With an `Accept` that names `application/json` and not `text/html`: "
        "the paths of the Field's entry points (`/metrics` and `/mcp` only when this server "
        "serves them). Otherwise (a browser, `*/*`) a 307 to the console, `/console`.",
        response={
            "type": "object",
            "required": ["name", "version", "protocol_version", "links"],
            "properties": {
                "name": {"const": "Akashik Field"},
                "version": {"type": "string"},
                "protocol_version": {"type": "string"},
                "links": {
                    "type": "object",
                    "required": ["console", "openapi", "status", "health", "ready", "websocket"],
                    "additionalProperties": {"type": "string", "pattern": "^/"},
                },
            },
        },
        more_responses={
            "307": {
                "description": "To the console, for a request that does not ask for JSON.",
                "headers": {"Location": {"schema": {"const": "/console"}}},
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    ),
    Endpoint(
        method="GET",
        path="/openapi.json",
        name="openapi",
        summary="This document",
        tag="meta",
        auth="public",
        response={"type": "object", "required": ["openapi", "paths"]},
    ),
    *(
        Endpoint(
            method="GET",
            path=path,
            name=name,
            summary=summary,
            tag="console",
            auth="public",
            description="A file of the console, a page for people that signs in with a "
            "token (protocol/README.md, Console). It loads nothing from anywhere else.",
            response={"type": "string"},
            media=media,
        )
        for path, name, media, summary in (
            ("/console", "console", "text/html", "The console: the Field live in a browser"),
            ("/console/console.js", "console_script", "text/javascript", "The console's script"),
            ("/console/console.css", "console_style", "text/css", "The console's style sheet"),
        )
    ),
    Endpoint(
        method="GET",
        path="/v1/console/stream",
        name="console_stream",
        summary="The console's snapshots, as Server-Sent Events",
        tag="console",
        auth="console",
        description=(
            "A `text/event-stream` of `snapshot` events, once a second and soon after every "
            "change: the status, agents, open conflicts, subscriptions with their lag, and "
            "rates, as the viewer (an agent, or the operator) may see them; an `end` event "
            "when the viewer's token stops being valid, a `shutdown` event when the server "
            "stops. See protocol/README.md, Console."
        ),
        response={"type": "string"},
        media="text/event-stream",
        headers={"Cache-Control": {"schema": {"const": "no-store"}}},
        errors=(*AUTHENTICATED, *RATED),
        params=(_TOKEN,),
        extra={
            "x-events": {
                "snapshot": ref("console-snapshot"),
                "end": ref("console-snapshot", "/$defs/end"),
                "shutdown": ref("console-snapshot", "/$defs/end"),
            }
        },
    ),
    Endpoint(
        method="GET",
        path="/v1/console/history",
        name="console_history",
        summary="The console's last hour of rates, a sample per 10 seconds",
        tag="console",
        auth="console",
        description=(
            "The rates the console charts over 5 and 60 minutes: operations a second, their "
            "latency, log entries a second and delivery latency, sampled once a second from "
            "the server's start and kept as one sample per `step_seconds` (10) for an hour, "
            "oldest first. See protocol/README.md, Console."
        ),
        response="console-history.response",
        headers={"Cache-Control": {"schema": {"const": "no-store"}}},
        errors=(*AUTHENTICATED, *RATED),
        params=(_TOKEN,),
    ),
)


# -- the document ------------------------------------------------------------------------------

#: What each status answers in general; the codes follow in each response.
_STATUS_TEXT = {
    400: "Bad request",
    401: "Unauthenticated",
    403: "Forbidden",
    404: "Not found",
    408: "Request timeout",
    409: "Conflict with the Field's state",
    413: "Payload too large",
    415: "Unsupported media type",
    421: "Misdirected request (a host name the Field does not answer to)",
    422: "Invalid payload",
    429: "Too many requests",
    500: "Internal error",
    503: "Unavailable for now",
    507: "Storage full",
}
#: Statuses whose refusals say when to retry.
_RETRY_STATUSES = (429, 503, 507)
_RETRY_AFTER = {
    "description": "Whole seconds to wait before retrying, when the refusal is temporary.",
    "schema": {"type": "integer", "minimum": 1},
}


def _error_responses(codes: Iterable[str]) -> dict[str, Any]:
    by_status: dict[int, list[str]] = defaultdict(list)
    for code in dict.fromkeys((*codes, *ANY_ENDPOINT)):
        by_status[HTTP_STATUS[code]].append(code)
    responses: dict[str, Any] = {}
    for status in sorted(by_status):
        listed = sorted(by_status[status])
        response: dict[str, Any] = {
            "description": f"{_STATUS_TEXT[status]}: " + ", ".join(f"`{code}`" for code in listed),
            "content": {"application/json": {"schema": ref("error")}},
            "x-error-codes": listed,
        }
        if status in _RETRY_STATUSES:
            response["headers"] = {"Retry-After": _RETRY_AFTER}
        if status == 401:
            response["headers"] = {
                "WWW-Authenticate": {"description": "`Bearer`.", "schema": {"type": "string"}}
            }
        responses[str(status)] = response
    return responses


#: The header every answer carries (field/transports/access.py), whatever its status.
_REQUEST_ID = {
    "description": "The request's id: the request's own `X-Request-Id` if it is 1 to 128 "
    "token characters (RFC 9110) or `/:=@`, else 32 hex digits the Field makes. With "
    "`--access-log`, the request's log line names it.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 128},
}


def _with_request_id(response: dict[str, Any]) -> dict[str, Any]:
    """``response`` (a copy) with the ``X-Request-Id`` header every answer carries."""
    request_id = {"$ref": "#/components/headers/RequestId"}
    return {**response, "headers": {**response.get("headers", {}), "X-Request-Id": request_id}}


def _body(schema: str | dict[str, Any]) -> dict[str, Any]:
    return ref(schema) if isinstance(schema, str) else as_component(schema)


def _operation_object(endpoint: Endpoint) -> dict[str, Any]:
    success: dict[str, Any] = {"description": endpoint.summary}
    if endpoint.response is not None:
        success["content"] = {endpoint.media: {"schema": _body(endpoint.response)}}
    if endpoint.headers:
        success["headers"] = endpoint.headers
    if endpoint.status == 101:
        success["description"] = "Switching Protocols: the connection is a WebSocket."
    responses = {
        str(endpoint.status): success,
        **endpoint.more_responses,
        **_error_responses(endpoint.errors),
    }
    if endpoint.path == "/v1/ws":
        responses["400"]["headers"] = {
            "Sec-WebSocket-Version": {
                "description": "The WebSocket version the Field speaks.",
                "schema": {"const": "13"},
            }
        }
    doc: dict[str, Any] = {
        "operationId": endpoint.name,
        "summary": endpoint.summary,
        "tags": [endpoint.tag],
        "security": SECURITY[endpoint.auth],
    }
    if endpoint.description:
        doc["description"] = endpoint.description
    if endpoint.params:
        doc["parameters"] = [param.document() for param in endpoint.params]
    if endpoint.request is not None:
        doc["requestBody"] = {
            "required": endpoint.request_required,
            "content": {"application/json": {"schema": _body(endpoint.request)}},
        }
    doc["responses"] = {status: _with_request_id(r) for status, r in responses.items()}
    return doc | endpoint.extra


_SECURITY_SCHEMES = {
    "agentToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "The agent's token, from its REGISTER response.",
    },
    "operatorToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "The operator's token (`--operator-token-file` or "
        "`FIELD_OPERATOR_TOKEN`): authority 10.",
    },
    "metricsToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "The token `GET /metrics` asks for when the server has one "
        "(`--metrics-token-file` or `FIELD_METRICS_TOKEN`).",
    },
    "queryToken": {
        "type": "apiKey",
        "in": "query",
        "name": "token",
        "description": "The agent's token as a query parameter: the push endpoints only, "
        "for browsers.",
    },
}

_TAGS = [
    {"name": "operations", "description": "The twelve operations of the protocol."},
    {"name": "push", "description": "Notifications pushed over a WebSocket or SSE."},
    {"name": "reads", "description": "GET endpoints: status and lists."},
    {"name": "sources", "description": "Inbound event sources (the operator's)."},
    {"name": "registration", "description": "Registration tokens (the operator's)."},
    {"name": "operator", "description": "The operator's actions on agents, and the log's events."},
    {"name": "rap", "description": "The Field as a tool server of the Reactive Agent Protocol."},
    {"name": "meta", "description": "About the API itself."},
    {"name": "operating", "description": "Health probes and metrics, for those who run it."},
    {"name": "console", "description": "The console: the Field live in a browser."},
]


def build_document(
    endpoints: Iterable[Endpoint] = ENDPOINTS,
    schemas: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``endpoints`` over ``schemas`` (the files, by default)."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        operations = paths.setdefault(endpoint.path, {})
        method = endpoint.method.lower()
        if method in operations:
            raise ValueError(f"{endpoint.method} {endpoint.path} is in the table twice")
        operations[method] = _operation_object(endpoint)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Akashik Field",
            "version": __version__,
            "summary": "Shared memory and coordination for multi-agent AI systems.",
            "description": "The HTTP binding of an Akashik Protocol 0.1.0 Field. The wire "
            "contract, with every rule the schemas cannot say, is protocol/README.md; the "
            "schemas here are its protocol/schemas.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": _TAGS,
        "paths": paths,
        "components": {
            "schemas": components(copy.deepcopy(schemas) if schemas else load_schemas()),
            "securitySchemes": _SECURITY_SCHEMES,
            "headers": {"RequestId": _REQUEST_ID},
        },
    }


@functools.cache
def document_bytes() -> bytes:
    """The document as served (built once)."""
    return orjson.dumps(build_document())


async def openapi_endpoint(request: Request) -> Response:
    """``GET /openapi.json``."""
    return Response(document_bytes(), media_type="application/json")
