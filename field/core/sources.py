"""Inbound event sources: signed webhooks from elsewhere that become memory units.

The operator defines a source (``source.defined``): a name, a secret, a signature
scheme, an optional CEL filter over the payload and how a passing event becomes a
unit. An event posted to ``/v1/sources/<name>/events`` is checked here, in pure
functions the transport calls *before* anything is parsed or queued:

1. :func:`verify_github` or :func:`verify_standard`: the HMAC over the raw body, in
   constant time;
2. :func:`check_timestamp` (Standard Webhooks): the sender's clock within tolerance;

then the body is parsed, the filter evaluated, and :func:`ingest` runs in the single
writer: it refuses a delivery id the source has already seen, and, for a scheme whose
signature covers the body alone (GitHub's), a body it has already seen, by its
:func:`body_digest` (:class:`Deliveries`, a projection of the log, so it survives
restarts); then it records the unit, with the payload, as ``source:<name>``.

Entry kinds (projected in :mod:`field.core.state`):

===================== ===============================================
``source.defined``    ``{source}``: the definition, its secret sealed
``source.removed``    ``{name}``
``memory.recorded``   ``{unit, delivery: {source, id, timestamp, digest}}`` for an event
                      (``digest``: of the raw body under :data:`BODY_SIGNED`, else null)
===================== ===============================================

No function here repeats a secret in an error.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from ..contract.clock import iso_timestamp
from ..contract.errors import AuthError, Code, FieldError, InvalidPayload, NotFound, StateError
from ..contract.model import MEMORY_TYPES, Limits, LogEntry
from ..expressions import costs
from ..expressions.filters import Expression, check_types, compile_expression
from . import authority
from .authority import OPERATOR_ID
from .secrets import hub_signature, new_secret, secret_key, standard_signature

if TYPE_CHECKING:
    from .context import Outcome
    from .field import Field
    from .state import AgentRecord, FieldState

#: The signature schemes a source may use.
SCHEMES = ("github", "standard")
#: The schemes whose signature covers the body alone, with no id or time: a captured event
#: could be sent again under any delivery id, so its body's digest is remembered too.
BODY_SIGNED = frozenset({"github"})
#: A source's name: lower-case letters, digits, ``_`` and ``-``, 1 to 64 characters.
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
#: The agent id prefix of units recorded by a source; no REGISTER may take such an id.
AGENT_PREFIX = "source:"
#: Most sources a Field holds.
MAX_SOURCES = 1000
#: Delivery ids, and body digests, each source remembers (the newest), to refuse replays.
MAX_REMEMBERED = 100_000
#: The default, and the largest, body of one event (bytes); the operator may set less.
DEFAULT_MAX_PAYLOAD_BYTES = 65_536
#: Longest template, and most placeholders in one.
MAX_TEMPLATE_CHARS = 4096
MAX_PLACEHOLDERS = 64
#: A structured value (object, array) inserted by a template: JSON, cut to this many characters.
MAX_INSERTED_CHARS = 1024
#: Length of a GitHub-scheme secret.
MAX_GITHUB_SECRET_CHARS = 1024
#: A delivery id: visible ASCII without spaces or commas, 1 to 256 characters.
DELIVERY_ID = re.compile(r"[!-+\--~]{1,256}")
#: The variables a source filter may read.
FILTER_VARIABLES = ("payload", "headers")
#: Most headers of an event a filter may read, and all of them together.
MAX_HEADERS = 100
MAX_HEADER_CHARS = 65536


def filter_shapes(max_payload_bytes: int, limits: Limits) -> dict[str, costs.Shape]:
    """The largest values a source's filter can be given (:mod:`field.expressions.costs`): the
    event as any JSON document of the source's ``max_payload_bytes``, and its headers."""
    header = costs.string(MAX_HEADER_CHARS)
    headers = replace(costs.map_of(costs.string(256), header, MAX_HEADERS), total=MAX_HEADER_CHARS)
    return {
        "payload": costs.document(max_payload_bytes, limits.max_json_items),
        "headers": headers,
    }


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_PATH = re.compile(r"(payload|headers)((?:\.[A-Za-z0-9_-]+)*)")


# -- signatures (pure, constant time) ------------------------------------------


def verify_github(secret: bytes, body: bytes, header: str | None) -> bool:
    """``X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>``."""
    if not header or not header.startswith("sha256="):
        return False
    expected = hub_signature(secret, body)
    return hmac.compare_digest(expected, header.strip().lower().encode("ascii", "replace"))


def verify_standard(key: bytes, message_id: str, timestamp: str, header: str, body: bytes) -> bool:
    """``webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}." + body)>``,
    one of a space-separated list (keys being rotated)."""
    expected = standard_signature(key, message_id, timestamp, body)
    found = False
    for candidate in header.split(" ")[:16]:  # a few keys at most
        found |= hmac.compare_digest(expected, candidate.encode("ascii", "replace"))
    return found


def body_digest(body: bytes) -> str:
    """The SHA-256 of an event's raw body, in hex: what tells a replay apart when the
    signature covers nothing else (:data:`BODY_SIGNED`)."""
    return hashlib.sha256(body).hexdigest()


def check_timestamp(raw: str, now: float, tolerance: float) -> int:
    """The ``webhook-timestamp``, which must be within ``tolerance`` seconds of ``now``."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 12):
        raise stale("webhook-timestamp is not an integer number of seconds")
    timestamp = int(raw)
    if abs(now - timestamp) > tolerance:
        raise stale(f"webhook-timestamp is more than {tolerance:g} seconds from the Field's time")
    return timestamp


def bad_signature(reason: str) -> AuthError:
    return AuthError(
        f"the event's signature does not verify: {reason}",
        code=Code.INVALID_SIGNATURE,
        recoverable=False,
        suggested_action="Sign the raw body with the source's secret (see protocol/README.md, "
        "'Inbound event sources').",
    )


def stale(reason: str) -> AuthError:
    return AuthError(
        reason,
        code=Code.STALE_TIMESTAMP,
        recoverable=False,
        suggested_action="Send events as they happen, from a clock that is on time.",
    )


# -- templates -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Template:
    """Text with ``{payload.a.b}`` / ``{headers.x}`` placeholders; ``{{`` and ``}}`` are
    braces. A path step that is a number indexes an array."""

    parts: tuple[str | tuple[str, ...], ...]

    def render(self, context: Mapping[str, Any], limit: int) -> str:
        """The text with each placeholder's value, at most ``limit`` characters."""
        out: list[str] = []
        size = 0
        for part in self.parts:
            text = part if isinstance(part, str) else _shown(_lookup(context, part))
            out.append(text)
            size += len(text)
            if size >= limit:
                break
        return "".join(out)[:limit]


def compile_template(text: Any, field_name: str) -> Template:
    """Parse a template; raises INVALID_PAYLOAD naming ``field_name``."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidPayload(f"{field_name} must be a non-blank string")
    if len(text) > MAX_TEMPLATE_CHARS:
        raise InvalidPayload(f"{field_name} is longer than {MAX_TEMPLATE_CHARS} characters")
    parts: list[str | tuple[str, ...]] = []
    at = placeholders = 0
    for match in _PLACEHOLDER.finditer(text):
        parts.append(text[at : match.start()])
        at = match.end()
        token = match.group(0)
        if token in ("{{", "}}"):
            parts.append(token[0])
            continue
        path = match.group(1)
        if path is None or not _PATH.fullmatch(path.strip()):
            raise InvalidPayload(
                f"{field_name}: {token[:40]!r} at offset {match.start()} is not a placeholder "
                "such as {payload.pull_request.title}; write {{ and }} for braces",
                details={"field": field_name, "offset": match.start()},
            )
        placeholders += 1
        if placeholders > MAX_PLACEHOLDERS:
            raise InvalidPayload(f"{field_name} has more than {MAX_PLACEHOLDERS} placeholders")
        parts.append(tuple(path.strip().split(".")))
    parts.append(text[at:])
    return Template(tuple(p for p in parts if p != ""))


def _lookup(context: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = context
    for step in path:
        if isinstance(value, Mapping):
            value = value.get(step)
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return None
    return value


def _shown(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return orjson.dumps(value).decode()[:MAX_INSERTED_CHARS]


# -- definitions -------------------------------------------------------------------


@dataclass(slots=True)
class Deliveries:
    """What a source has accepted, to refuse replays: the delivery ids, oldest first, at
    most ``MAX_REMEMBERED``, each with its ``webhook-timestamp`` (None for the GitHub
    scheme); and the digests of the bodies accepted under :data:`BODY_SIGNED`, oldest
    first, at most ``MAX_REMEMBERED`` too (the raw 32 bytes: half the size of the hex).

    ``horizon`` is the newest timestamp among the ids forgotten: a Standard Webhooks
    event at or before it is refused as stale, so an id that was forgotten can never be
    replayed (its signed timestamp is at most the horizon).
    """

    ids: OrderedDict[str, int | None] = field(default_factory=OrderedDict)
    horizon: int = -1
    bodies: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def note(self, delivery_id: str | None, timestamp: int | None, digest: str | None) -> None:
        """An accepted event, as its log entry names it (any part may be missing)."""
        if delivery_id is not None:
            self.ids[delivery_id] = timestamp
            while len(self.ids) > MAX_REMEMBERED:
                _, old = self.ids.popitem(last=False)
                if old is not None:
                    self.horizon = max(self.horizon, old)
        if digest is not None:
            self.bodies[bytes.fromhex(digest)] = None
            while len(self.bodies) > MAX_REMEMBERED:
                self.bodies.popitem(last=False)

    def repeats(self, delivery_id: str | None, digest: str | None) -> bool:
        """Whether an event with this delivery id, or (if given) this body, was accepted."""
        if delivery_id is not None and delivery_id in self.ids:
            return True
        return digest is not None and bytes.fromhex(digest) in self.bodies


@dataclass(slots=True)
class Source:
    """A defined source as the state holds it: its definition and compiled parts."""

    definition: dict[str, Any]
    filter: Expression | None
    content: Template
    purpose: Template
    deliveries: Deliveries = field(default_factory=Deliveries)
    #: events recorded since the source was (first) defined: a count of the log
    accepted: int = 0

    @property
    def name(self) -> str:
        return str(self.definition["name"])

    @property
    def scheme(self) -> str:
        return str(self.definition["scheme"])

    def public(self) -> dict[str, Any]:
        """The definition as the operator reads it: never its secret."""
        return {k: v for k, v in self.definition.items() if k != "secret"}


def compiled(definition: dict[str, Any]) -> Source:
    """A stored definition with its filter and templates compiled (already validated)."""
    unit = definition["unit"]
    text = definition.get("filter")
    return Source(
        definition,
        None
        if text is None
        else compile_expression(
            text,
            FILTER_VARIABLES,
            field="filter",
            shapes=filter_shapes(definition["max_payload_bytes"], Limits()),
            stored=True,
        ),
        compile_template(unit["content"], "unit.content"),
        compile_template(unit["purpose"], "unit.purpose"),
    )


_FIELDS = {"name", "scheme", "secret", "filter", "unit", "max_payload_bytes"}
_UNIT_FIELDS = {"type", "content", "purpose", "confidence", "task_id", "session_id"}


def validate_definition(
    body: Any, state: FieldState, limits: Limits
) -> tuple[dict[str, Any], str, bool]:
    """The definition a request asks for, the secret in clear, and whether the Field
    made the secret; raises INVALID_PAYLOAD / INVALID_FILTER / SESSION_NOT_FOUND."""
    if not isinstance(body, dict):
        raise InvalidPayload("a source definition is a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise InvalidPayload(f"unknown field(s) {', '.join(repr(u[:64]) for u in unknown[:5])}")
    name = body.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidPayload(
            "name must be 1 to 64 lower-case letters, digits, '_' or '-', starting with a "
            "letter or digit"
        )
    scheme = body.get("scheme")
    if scheme not in SCHEMES:
        raise InvalidPayload(f"scheme must be one of {', '.join(SCHEMES)}")
    secret, made = _secret(body.get("secret"), scheme)
    most = min(DEFAULT_MAX_PAYLOAD_BYTES * 16, limits.max_body_bytes)
    size = body.get("max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES)
    if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= most:
        raise InvalidPayload(f"max_payload_bytes must be an integer from 2 to {most}")
    text = body.get("filter")
    if text is not None:
        shapes = filter_shapes(size, limits)
        expression = compile_expression(text, FILTER_VARIABLES, field="filter", shapes=shapes)
        check_types(expression, [{"payload": {}, "headers": {}}], "filter")
    definition = {
        "name": name,
        "scheme": scheme,
        "filter": text,
        "unit": _unit(body.get("unit"), state, name),
        "max_payload_bytes": size,
    }
    return definition, secret, made


def _secret(secret: Any, scheme: str) -> tuple[str, bool]:
    if secret is None:
        return (new_secret() if scheme == "standard" else secrets.token_hex(32)), True
    if scheme == "standard":
        try:
            secret_key(secret)
        except ValueError as exc:
            raise InvalidPayload(f"secret is not a Standard Webhooks secret: {exc}") from None
    elif not isinstance(secret, str) or not secret.strip():
        raise InvalidPayload("secret must be a non-blank string")
    elif len(secret) > MAX_GITHUB_SECRET_CHARS:
        raise InvalidPayload(f"secret is longer than {MAX_GITHUB_SECRET_CHARS} characters")
    return secret, False


def _unit(unit: Any, state: FieldState, name: str) -> dict[str, Any]:
    if not isinstance(unit, dict):
        raise InvalidPayload("unit must be an object: type, content, confidence, ...")
    unknown = sorted(set(unit) - _UNIT_FIELDS)
    if unknown:
        raise InvalidPayload(f"unknown unit field(s) {', '.join(repr(u[:64]) for u in unknown)}")
    kind = unit.get("type")
    if not isinstance(kind, str) or kind not in MEMORY_TYPES:
        raise InvalidPayload(f"unit.type must be one of {', '.join(sorted(MEMORY_TYPES))}")
    compile_template(unit.get("content"), "unit.content")
    purpose = unit.get("purpose", f"Event from source {name}")
    compile_template(purpose, "unit.purpose")
    score = unit.get("confidence", 0.5)
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        raise InvalidPayload("unit.confidence must be a number from 0 to 1")
    for key in ("task_id", "session_id"):
        value = unit.get(key)
        if value is not None and (not isinstance(value, str) or not 1 <= len(value) <= 256):
            raise InvalidPayload(f"unit.{key} must be null or 1 to 256 characters")
    session_id = unit.get("session_id")
    if session_id is not None and session_id not in state.sessions:
        raise NotFound(
            f"no session {session_id[:64]!r} in this Field",
            code=Code.SESSION_NOT_FOUND,
            suggested_action="Name a session that exists, or none.",
        )
    return {
        "type": unit["type"],
        "content": unit["content"],
        "purpose": purpose,
        "confidence": float(score),
        "task_id": unit.get("task_id"),
        "session_id": session_id,
    }


# -- operations (run by the single writer) ------------------------------------------


def require_operator(field: Field, token: str | None) -> AgentRecord:
    """The operator, by its bearer token; any other caller is refused."""
    agent = field.authenticate(token)
    authority.require_operator(agent, "defining and reading sources needs the operator token")
    return agent


def define(field: Field, token: str | None, body: Any) -> Outcome:
    """``source.defined``: a new source, or a new definition of one (its secret too)."""
    require_operator(field, token)
    state = field.state
    definition, secret, made = validate_definition(body, state, field.limits)
    name = definition["name"]
    replaced = name in state.sources
    if not replaced and len(state.sources) >= MAX_SOURCES:
        raise StateError(
            f"the Field already has {MAX_SOURCES} sources",
            code=Code.SOURCE_LIMIT,
            suggested_action="Remove a source first.",
        )
    stored = {**definition, "secret": field.secret_box.seal(secret, context=name)}

    def build(epoch: int, now: float) -> list[LogEntry]:
        return [LogEntry(epoch, "source.defined", {"source": stored}, OPERATOR_ID, now)]

    outcome = field.system(build)
    shown = {k: v for k, v in stored.items() if k != "secret"}
    if made:
        shown["secret"] = secret  # shown once: the Field keeps it sealed
    outcome.response = {
        "status": "ok",
        "source": shown,
        "replaced": replaced,
        "epoch": outcome.response["epoch"],
    }
    return outcome


def remove(field: Field, token: str | None, name: str) -> Outcome:
    """``source.removed``: the source and the deliveries it remembered are gone."""
    require_operator(field, token)
    source_of(field.state, name)

    def build(epoch: int, now: float) -> list[LogEntry]:
        return [LogEntry(epoch, "source.removed", {"name": name}, OPERATOR_ID, now)]

    outcome = field.system(build)
    outcome.response = {"status": "ok", "name": name, "epoch": outcome.response["epoch"]}
    return outcome


def source_of(state: FieldState, name: str) -> Source:
    source = state.sources.get(name)
    if source is None:
        raise NotFound(
            f"no source {name[:64]!r} in this Field",
            code=Code.SOURCE_NOT_FOUND,
            suggested_action="Send events to a source the operator defined.",
        )
    return source


@dataclass(frozen=True, slots=True)
class Event:
    """A verified, parsed inbound event on its way to the writer."""

    source: Source
    delivery_id: str | None
    timestamp: int | None
    payload: Any
    headers: Mapping[str, str]
    #: :func:`body_digest` of the raw body
    digest: str


def ingest(field: Field, event: Event) -> Outcome:
    """Record a verified event that passed its filter as a unit of ``source:<name>``."""
    state = field.state
    source = source_of(state, event.source.name)
    if source is not event.source:
        raise FieldError(
            f"source {source.name!r} was redefined while the event was checked",
            code=Code.OVERLOADED,
            recoverable=True,
            suggested_action="Send the event again.",
        )
    seen = source.deliveries
    # the body tells a replay apart only where nothing else is signed: under Standard
    # Webhooks two events may share a body, and a new id cannot be signed by a replayer
    digest = event.digest if source.scheme in BODY_SIGNED else None
    if seen.repeats(event.delivery_id, digest):
        # accepted before (its answer may have been lost, or it was captured and sent
        # again under another delivery id or none): acknowledged, not stored; a sender
        # that retries until a 2xx stops here
        outcome = field.system(lambda epoch, now: [])  # nothing is written
        outcome.response = {"status": "duplicate", "delivery_id": event.delivery_id}
        return outcome
    if event.timestamp is not None and event.timestamp <= seen.horizon:
        raise stale("the event is older than the deliveries the source still remembers")
    spec = source.definition["unit"]
    session_id = spec["session_id"]
    if session_id is not None and state.sessions.get(session_id, {}).get("status") != "active":
        raise StateError(
            f"session {session_id!r} of source {source.name!r} is not active",
            code=Code.INVALID_TRANSITION,
            suggested_action="Have the operator redefine the source without the session.",
        )
    context = {"payload": event.payload, "headers": event.headers}
    agent_id = AGENT_PREFIX + source.name

    def build(epoch: int, now: float) -> list[LogEntry]:
        unit = {
            "id": field.new_id("mem"),
            "mode": "committed",
            "type": spec["type"],
            "content": _text(source.content, context, field.limits.max_content_chars, source),
            "intent": {
                "purpose": _text(source.purpose, context, field.limits.max_text_chars, source),
                "task_id": spec["task_id"],
                "question": None,
            },
            "confidence": {
                "score": spec["confidence"],
                "reasoning": f"Signed event of source {source.name} ({source.scheme})",
                "evidence": [],
                "assumptions": [],
            },
            "relations": [],
            "source": {
                "agent_id": agent_id,
                "agent_role": "source",
                "session_id": session_id,
                "timestamp": iso_timestamp(now),
            },
            "status": "active",
            "epoch": epoch,
            "payload": event.payload,
        }
        delivery = {
            "source": source.name,
            "id": event.delivery_id,
            "timestamp": event.timestamp,
            "digest": digest,
        }
        data = {"unit": unit, "delivery": delivery}
        return [LogEntry(epoch, "memory.recorded", data, agent_id, now)]

    outcome = field.system(build)
    unit = outcome.entries[0].data["unit"]
    outcome.response = {
        "status": "accepted",
        "memory_unit_id": unit["id"],
        "epoch": outcome.response["epoch"],
    }
    return outcome


def _text(template: Template, context: Mapping[str, Any], limit: int, source: Source) -> str:
    text = template.render(context, limit)
    return text if text.strip() else f"Event from source {source.name}"


def decode_key(source: Source, secret: str) -> bytes:
    """The HMAC key of a source's secret: Standard Webhooks decodes ``whsec_``."""
    if source.scheme == "standard":
        try:
            return secret_key(secret)
        except ValueError:  # validated when defined: never happens
            return b""
    return secret.encode()
