"""Request validation with the spec's error codes.

These checks are the compiled form of the JSON Schemas in ``protocol/``:
the schemas are the contract, and ``tests/test_validation_schema.py``
keeps this module in step with them on generated inputs. They run on
every request, so they are plain Python rather than a generic schema
interpreter, and each failure raises the most specific code the spec
names (``MISSING_INTENT`` rather than a generic "required property").

Each ``*_payload`` function returns a normalized copy of its payload
(defaults filled in) or raises a :class:`~field.contract.errors.ValidationError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..contract.errors import Code, InvalidEnvelope, InvalidPayload, ValidationError
from ..contract.model import (
    ATTUNE_FORMATS,
    CONFLICT_STATUSES,
    CONFLICT_STRATEGIES,
    CONFLICT_TYPES,
    DETECT_MODES,
    MAX_EPOCH,
    MEMORY_TYPES,
    OPERATIONS,
    RELATION_TYPES,
    UNIT_STATUSES,
    Limits,
)
from ..expressions.filters import MAX_FILTER_CHARS, InvalidFilter
from ..subscriptions.allow_lists import ALLOW_LIST_NAMES
from . import pages

#: Authority of an agent that does not ask for another (spec 11.2, standard agent).
STANDARD_AUTHORITY = 4
AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
_ENVELOPE_KEYS = frozenset(
    {"protocol", "version", "id", "operation", "agent_id", "session_id", "epoch", "payload"}
)


@dataclass(frozen=True, slots=True)
class Envelope:
    """A validated message envelope (spec 5.1)."""

    id: str
    operation: str
    agent_id: str
    session_id: str | None
    epoch: int
    payload: dict[str, Any]


# -- primitive checks ---------------------------------------------------------


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _member(value: Any, allowed: frozenset[str] | tuple[str, ...]) -> bool:
    """``value in allowed`` for any JSON value (lists and objects are unhashable)."""
    return isinstance(value, str) and value in allowed


def shown(value: Any, limit: int = 64) -> str:
    """A client's value for an error message: a short string's repr, else its JSON type.

    Messages never echo a client's document at length (nor walk a nested one).
    """
    if isinstance(value, str):
        return repr(value if len(value) <= limit else value[:limit] + "…")
    if isinstance(value, bool) or value is None or isinstance(value, int | float):
        return repr(value)[:limit]
    return f"a JSON {'object' if isinstance(value, dict) else 'array'}"


def _fail(message: str, code: str = Code.INVALID_PAYLOAD) -> ValidationError:
    return InvalidPayload(message, code=code)


def _object(value: Any, where: str, code: str = Code.INVALID_PAYLOAD) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(f"{where} must be an object", code)
    return value


def _closed(obj: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    extra = obj.keys() - allowed
    if extra:
        names = ", ".join(sorted(extra))
        raise _fail(f"{where} has unknown field(s): {names}")


def _string(
    value: Any,
    where: str,
    *,
    max_chars: int,
    nonblank: bool = False,
    allow_empty: bool = False,
    code: str = Code.INVALID_PAYLOAD,
) -> str:
    if not isinstance(value, str):
        raise _fail(f"{where} must be a string", code)
    if (not value and not allow_empty) or (nonblank and not value.strip()):
        raise _fail(f"{where} must not be empty", code)
    if len(value) > max_chars:
        raise _fail(f"{where} is longer than {max_chars} characters", code)
    return value


def _optional_string(
    value: Any, where: str, *, max_chars: int, allow_empty: bool = False
) -> str | None:
    if value is None:
        return None
    return _string(value, where, max_chars=max_chars, allow_empty=allow_empty)


def _string_list(
    value: Any, where: str, *, max_items: int, max_chars: int, allow_empty_items: bool = False
) -> list[str]:
    if not isinstance(value, list):
        raise _fail(f"{where} must be an array of strings")
    if len(value) > max_items:
        raise _fail(f"{where} has more than {max_items} items")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _fail(f"{where}[{i}] must be a string")
        if not allow_empty_items and not item:
            raise _fail(f"{where}[{i}] must not be empty")
        if len(item) > max_chars:
            raise _fail(f"{where}[{i}] is longer than {max_chars} characters")
    return list(value)


def _enum_list(value: Any, where: str, allowed: frozenset[str] | tuple[str, ...]) -> list[str]:
    items = _string_list(value, where, max_items=64, max_chars=64)
    for item in items:
        if item not in allowed:
            raise _fail(f"{where} contains unknown value {item!r}")
    return items


def _epoch(value: Any, where: str, *, nullable: bool = True) -> int | None:
    if value is None and nullable:
        return None
    if not _is_int(value) or not 0 <= value <= MAX_EPOCH:
        raise _fail(f"{where} must be an integer between 0 and {MAX_EPOCH}")
    return int(value)


def agent_id(value: Any, where: str = "agent_id") -> str:
    if not isinstance(value, str) or not AGENT_ID.fullmatch(value):
        raise _fail(
            f"{where} must be 1 to 128 characters of letters, digits and . _ : @ -, "
            "starting with a letter or digit"
        )
    return value


# -- envelope -----------------------------------------------------------------


def envelope(value: Any, *, expected_operation: str | None, limits: Limits) -> Envelope:
    """Validate the message envelope of spec 5.1 (schema ``envelope``)."""
    if not isinstance(value, dict):
        raise InvalidEnvelope("the request body must be a JSON object (the message envelope)")
    missing = [key for key in sorted(_ENVELOPE_KEYS) if key not in value]
    if missing:
        raise InvalidEnvelope(f"envelope is missing field(s): {', '.join(missing)}")
    extra = value.keys() - _ENVELOPE_KEYS
    if extra:
        raise InvalidEnvelope(f"envelope has unknown field(s): {', '.join(sorted(extra))}")
    if value["protocol"] != "akashik":
        raise InvalidEnvelope('envelope protocol must be "akashik"')
    if value["version"] != "0.1.0":
        raise InvalidEnvelope('envelope version must be "0.1.0"')
    msg_id = value["id"]
    if not isinstance(msg_id, str) or not 1 <= len(msg_id) <= limits.max_id_chars:
        raise InvalidEnvelope(f"envelope id must be a string of 1 to {limits.max_id_chars} chars")
    operation = value["operation"]
    if not _member(operation, OPERATIONS):
        raise InvalidEnvelope(f"unknown operation {shown(operation)}")
    if expected_operation is not None and operation != expected_operation:
        raise InvalidEnvelope(
            f"this endpoint takes {expected_operation}, the envelope says {operation}"
        )
    sender = value["agent_id"]
    if not isinstance(sender, str) or not AGENT_ID.fullmatch(sender):
        raise InvalidEnvelope("envelope agent_id is not a valid agent id")
    session = value["session_id"]
    if session is not None and (
        not isinstance(session, str) or not 1 <= len(session) <= limits.max_id_chars
    ):
        raise InvalidEnvelope("envelope session_id must be null or a non-empty string")
    epoch = value["epoch"]
    if not _is_int(epoch) or not 0 <= epoch <= MAX_EPOCH:
        raise InvalidEnvelope(f"envelope epoch must be an integer between 0 and {MAX_EPOCH}")
    payload = value["payload"]
    if not isinstance(payload, dict):
        raise InvalidEnvelope("envelope payload must be an object")
    return Envelope(msg_id, operation, sender, session, int(epoch), payload)


# -- REGISTER / DEREGISTER ----------------------------------------------------

_REGISTER_KEYS = frozenset(
    {
        "id",
        "role",
        "interests",
        "required_operations",
        "current_task_id",
        "authority",
        "registration_token",
    }
)


def register_payload(payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
    _closed(payload, _REGISTER_KEYS, "REGISTER payload")
    if "id" not in payload:
        raise _fail("REGISTER payload needs id")
    if "role" not in payload:
        raise _fail("REGISTER payload needs role")
    return {
        "id": agent_id(payload["id"], "id"),
        "role": _string(payload["role"], "role", max_chars=limits.max_role_chars, nonblank=True),
        "interests": _string_list(
            payload.get("interests", []),
            "interests",
            max_items=limits.max_list_items,
            max_chars=limits.max_interest_chars,
        ),
        "required_operations": _string_list(
            payload.get("required_operations", []),
            "required_operations",
            max_items=32,
            max_chars=64,
        ),
        "current_task_id": _optional_string(
            payload.get("current_task_id"), "current_task_id", max_chars=limits.max_id_chars
        ),
        "authority": _authority(payload.get("authority", STANDARD_AUTHORITY)),
        # the operator's admission ticket when registration needs one (never logged)
        "registration_token": _optional_string(
            payload.get("registration_token"), "registration_token", max_chars=256
        ),
    }


def _authority(value: Any) -> int:
    if not _is_int(value) or not 0 <= value <= 10:
        raise _fail("authority must be an integer from 0 to 10")
    return value


def deregister_payload(payload: dict[str, Any]) -> str:
    _closed(payload, frozenset({"agent_id"}), "DEREGISTER payload")
    if "agent_id" not in payload:
        raise _fail("DEREGISTER payload needs agent_id")
    return agent_id(payload["agent_id"])


#: Longest reason the operator may give when declaring an agent failed.
MAX_FAIL_REASON_CHARS = 500


def fail_request(body: Any) -> str | None:
    """The body of the operator's ``POST /v1/agents/{id}/fail``: ``{"reason"?}``, or
    None (no body); the reason, if given, non-blank and at most
    :data:`MAX_FAIL_REASON_CHARS` characters."""
    if body is None:
        return None
    request = _object(body, "the request body")
    _closed(request, frozenset({"reason"}), "the request body")
    reason = request.get("reason")
    if reason is None:
        return None
    return _string(reason, "reason", max_chars=MAX_FAIL_REASON_CHARS, nonblank=True)


# -- REPLAY / COMPACT ---------------------------------------------------------

REPLAY_TARGETS: tuple[str, ...] = ("task", "memory_unit", "decision", "conflict", "session")
REPLAY_DEPTHS: tuple[str, ...] = ("summary", "detailed", "full_trace")
COMPACT_STRATEGIES: tuple[str, ...] = ("summarize", "archive", "purge")
_REPLAY_KEYS = frozenset({"target_type", "target_id", "depth"})
_COMPACT_KEYS = frozenset({"strategy", "filter"})
_COMPACT_FILTER_KEYS = frozenset({"max_age_epochs", "session_id", "types", "status"})


# -- FEEDBACK (extension) -------------------------------------------------------

#: Units one FEEDBACK judges at most.
MAX_FEEDBACK_ITEMS = 64
_FEEDBACK_KEYS = frozenset({"items"})
_FEEDBACK_ITEM_KEYS = frozenset({"memory_unit_id", "useful"})


def feedback_payload(payload: dict[str, Any], limits: Limits) -> list[tuple[str, bool]]:
    """Validate a FEEDBACK payload: 1 to :data:`MAX_FEEDBACK_ITEMS` items, each a unit id and
    whether it was useful (a unit given twice counts once: its last judgement)."""
    _closed(payload, _FEEDBACK_KEYS, "FEEDBACK payload")
    items = payload.get("items")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_FEEDBACK_ITEMS:
        raise _fail(f"items must be a list of 1 to {MAX_FEEDBACK_ITEMS} judgements")
    judged: dict[str, bool] = {}
    for n, item in enumerate(items):
        where = f"items[{n}]"
        _closed(_object(item, where), _FEEDBACK_ITEM_KEYS, where)
        if "memory_unit_id" not in item or "useful" not in item:
            raise _fail(f"{where} needs memory_unit_id and useful")
        unit_id = _string(
            item["memory_unit_id"], f"{where}.memory_unit_id", max_chars=limits.max_id_chars
        )
        if not isinstance(item["useful"], bool):
            raise _fail(f"{where}.useful must be true or false")
        judged.pop(unit_id, None)
        judged[unit_id] = item["useful"]
    return list(judged.items())


def replay_payload(payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Validate a REPLAY payload (spec 6.8); every field is required."""
    _closed(payload, _REPLAY_KEYS, "REPLAY payload")
    missing = sorted(_REPLAY_KEYS - payload.keys())
    if missing:
        raise _fail(f"REPLAY payload needs {', '.join(missing)}")
    if not _member(payload["target_type"], REPLAY_TARGETS):
        raise _fail(f"target_type must be one of {', '.join(REPLAY_TARGETS)}")
    if not _member(payload["depth"], REPLAY_DEPTHS):
        raise _fail(f"depth must be one of {', '.join(REPLAY_DEPTHS)}")
    return {
        "target_type": payload["target_type"],
        "target_id": _string(payload["target_id"], "target_id", max_chars=limits.max_id_chars),
        "depth": payload["depth"],
    }


def compact_payload(payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Validate a COMPACT payload (spec 6.9); the filter must name at least one criterion."""
    _closed(payload, _COMPACT_KEYS, "COMPACT payload")
    if "strategy" not in payload or "filter" not in payload:
        raise _fail("COMPACT payload needs strategy and filter")
    if not _member(payload["strategy"], COMPACT_STRATEGIES):
        raise _fail(f"strategy must be one of {', '.join(COMPACT_STRATEGIES)}")
    flt = _object(payload["filter"], "filter")
    _closed(flt, _COMPACT_FILTER_KEYS, "filter")
    age = flt.get("max_age_epochs")
    if age is not None and (not _is_int(age) or not 0 <= age <= MAX_EPOCH):
        raise _fail(f"filter.max_age_epochs must be null or an integer from 0 to {MAX_EPOCH}")
    request = {
        "strategy": payload["strategy"],
        "max_age_epochs": age,
        "session_id": _optional_string(
            flt.get("session_id"), "filter.session_id", max_chars=limits.max_id_chars
        ),
        "types": _enum_list(flt.get("types", []), "filter.types", MEMORY_TYPES),
        "status": _enum_list(flt.get("status", []), "filter.status", UNIT_STATUSES),
    }
    if age is None and request["session_id"] is None and not request["types"] + request["status"]:
        raise _fail(
            "filter names nothing to compact: give max_age_epochs, session_id, types or status"
        )
    return request


# -- RECORD -------------------------------------------------------------------

_RECORD_KEYS = frozenset({"mode", "type", "content", "intent", "confidence", "relations"})
_ABSENT = object()
_GENERATED_KEYS = frozenset({"id", "epoch", "source", "status"})
_INTENT_KEYS = frozenset({"purpose", "task_id", "question"})
_CONFIDENCE_KEYS = frozenset({"score", "reasoning", "evidence", "assumptions"})
_RELATION_KEYS = frozenset({"type", "target_id", "description"})


def record_payload(payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Validate a RECORD payload (spec 6.3 rules 1 to 5)."""
    generated = payload.keys() & _GENERATED_KEYS
    if generated:
        raise _fail(
            f"{', '.join(sorted(generated))} are generated by the Field; agents must not set them"
        )
    _closed(payload, _RECORD_KEYS, "RECORD payload")
    mode = payload.get("mode", "committed")
    if not _member(mode, ("draft", "committed")):
        raise _fail('mode must be "draft" or "committed"')
    memory_type = payload.get("type")
    if memory_type is None:
        raise _fail("type is required", Code.INVALID_TYPE)
    if not _member(memory_type, MEMORY_TYPES):
        raise _fail(
            f"unknown memory type {shown(memory_type)}; "
            f"use one of {', '.join(sorted(MEMORY_TYPES))}",
            Code.INVALID_TYPE,
        )
    if "content" not in payload:
        raise _fail("content is required")
    content = _string(
        payload["content"], "content", max_chars=limits.max_content_chars, nonblank=True
    )
    unit = {
        "mode": mode,
        "type": memory_type,
        "content": content,
        "intent": _intent(payload.get("intent"), limits),
    }
    confidence = _confidence(
        payload.get("confidence", _ABSENT), committed=mode == "committed", limits=limits
    )
    if confidence is not None:
        unit["confidence"] = confidence
    unit["relations"] = _relations(payload.get("relations", []), limits)
    return unit


def _intent(value: Any, limits: Limits) -> dict[str, Any]:
    if value is None:
        raise _fail("intent is required: say why this unit is recorded", Code.MISSING_INTENT)
    intent = _object(value, "intent", Code.MISSING_INTENT)
    purpose = intent.get("purpose")
    if not isinstance(purpose, str) or not purpose.strip():
        raise _fail("intent.purpose is required and must not be empty", Code.MISSING_INTENT)
    _closed(intent, _INTENT_KEYS, "intent")
    return {
        "purpose": _string(purpose, "intent.purpose", max_chars=limits.max_text_chars),
        "task_id": _optional_string(
            intent.get("task_id"), "intent.task_id", max_chars=limits.max_id_chars
        ),
        "question": _optional_string(
            intent.get("question"),
            "intent.question",
            max_chars=limits.max_text_chars,
            allow_empty=True,
        ),
    }


def _confidence(value: Any, *, committed: bool, limits: Limits) -> dict[str, Any] | None:
    if value is _ABSENT:
        if committed:
            raise _fail(
                "committed units need confidence.score and confidence.reasoning",
                Code.MISSING_CONFIDENCE,
            )
        return None
    confidence = _object(value, "confidence")
    _closed(confidence, _CONFIDENCE_KEYS, "confidence")
    result: dict[str, Any] = {}
    if "score" in confidence:
        score = confidence["score"]
        if not _is_number(score) or not 0.0 <= score <= 1.0:
            raise _fail(
                "confidence.score must be a number between 0.0 and 1.0", Code.INVALID_CONFIDENCE
            )
        result["score"] = float(score)
    elif committed:
        raise _fail("committed units need confidence.score", Code.MISSING_CONFIDENCE)
    if "reasoning" in confidence:
        reasoning = confidence["reasoning"]
        if committed and (not isinstance(reasoning, str) or not reasoning.strip()):
            raise _fail(
                "committed units need a non-empty confidence.reasoning", Code.MISSING_CONFIDENCE
            )
        result["reasoning"] = _string(
            reasoning, "confidence.reasoning", max_chars=limits.max_text_chars, nonblank=True
        )
    elif committed:
        raise _fail("committed units need confidence.reasoning", Code.MISSING_CONFIDENCE)
    for key in ("evidence", "assumptions"):
        if key in confidence:
            result[key] = _string_list(
                confidence[key],
                f"confidence.{key}",
                max_items=limits.max_list_items,
                max_chars=limits.max_text_chars,
                allow_empty_items=True,
            )
    return result


def _relations(value: Any, limits: Limits) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _fail("relations must be an array")
    if len(value) > limits.max_relations:
        raise _fail(f"relations has more than {limits.max_relations} items")
    relations = []
    for i, item in enumerate(value):
        relation = _object(item, f"relations[{i}]")
        _closed(relation, _RELATION_KEYS, f"relations[{i}]")
        if not _member(relation.get("type"), RELATION_TYPES):
            raise _fail(f"relations[{i}].type must be one of {', '.join(sorted(RELATION_TYPES))}")
        if "target_id" not in relation:
            raise _fail(f"relations[{i}].target_id is required")
        relations.append(
            {
                "type": relation["type"],
                "target_id": _string(
                    relation["target_id"],
                    f"relations[{i}].target_id",
                    max_chars=limits.max_id_chars,
                ),
                "description": _optional_string(
                    relation.get("description"),
                    f"relations[{i}].description",
                    max_chars=limits.max_text_chars,
                    allow_empty=True,
                ),
            }
        )
    return relations


# -- ATTUNE -------------------------------------------------------------------

_ATTUNE_KEYS = frozenset({"scope", "context_hint", "format", "since_epoch"})
_SCOPE_KEYS = frozenset(
    {
        "role",
        "max_units",
        "max_tokens",
        "interests",
        "active_task_id",
        "temporal_layers",
        "relevance_threshold",
        "recency_weight",
        "since_epoch",
        "include_own",
        "include_archived",
    }
)


def attune_payload(payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Validate an ATTUNE payload; returns the scope with every default filled in."""
    _closed(payload, _ATTUNE_KEYS, "ATTUNE payload")
    if "scope" not in payload:
        raise _fail("ATTUNE payload needs scope (at least role and max_units)")
    scope = _object(payload["scope"], "scope")
    _closed(scope, _SCOPE_KEYS, "scope")
    if "role" not in scope or "max_units" not in scope:
        raise _fail("scope needs role and max_units")
    max_units = scope["max_units"]
    if not _is_int(max_units) or not 1 <= max_units <= limits.max_attune_units:
        raise _fail(f"scope.max_units must be an integer from 1 to {limits.max_attune_units}")
    max_tokens = scope.get("max_tokens")
    if "max_tokens" in scope and (not _is_int(max_tokens) or not 1 <= max_tokens <= MAX_EPOCH):
        raise _fail(f"scope.max_tokens must be an integer from 1 to {MAX_EPOCH}")
    layers = scope.get("temporal_layers", ["past", "present", "future"])
    _enum_list(layers, "scope.temporal_layers", ("past", "present", "future"))
    include_own = scope.get("include_own", False)
    if not isinstance(include_own, bool):
        raise _fail("scope.include_own must be a boolean")
    include_archived = scope.get("include_archived", False)
    if not isinstance(include_archived, bool):
        raise _fail("scope.include_archived must be a boolean")
    fmt = payload.get("format", "full")
    if not _member(fmt, ATTUNE_FORMATS):
        raise _fail('format must be "full", "summary" or "ids_only"')
    hint = _optional_string(
        payload.get("context_hint"),
        "context_hint",
        max_chars=limits.max_text_chars,
        allow_empty=True,
    )
    return {
        "role": _string(
            scope["role"], "scope.role", max_chars=limits.max_role_chars, nonblank=True
        ),
        "max_units": int(max_units),
        "max_tokens": max_tokens,
        "interests": _string_list(
            scope.get("interests", []),
            "scope.interests",
            max_items=limits.max_list_items,
            max_chars=limits.max_interest_chars,
        )
        if "interests" in scope
        else None,
        "active_task_id": _optional_string(
            scope.get("active_task_id"), "scope.active_task_id", max_chars=limits.max_id_chars
        ),
        "relevance_threshold": _unit_interval(scope, "relevance_threshold", 0.0),
        "recency_weight": _unit_interval(scope, "recency_weight", 0.25),
        "since_epoch": _since_epoch(payload, scope),
        "include_own": include_own,
        "include_archived": include_archived,
        "format": fmt,
        "context_hint": hint,
    }


def _unit_interval(scope: dict[str, Any], key: str, default: float) -> float:
    if key not in scope:
        return default
    value = scope[key]
    if not _is_number(value) or not 0.0 <= value <= 1.0:
        raise _fail(f"scope.{key} must be a number between 0.0 and 1.0")
    return float(value)


def _since_epoch(payload: dict[str, Any], scope: dict[str, Any]) -> int | None:
    top = _epoch(payload.get("since_epoch"), "since_epoch")
    inner = _epoch(scope.get("since_epoch"), "scope.since_epoch")
    if top is not None and inner is not None and top != inner:
        raise _fail("since_epoch and scope.since_epoch differ; give one of them")
    return top if top is not None else inner


# -- DETECT -------------------------------------------------------------------

_DETECT_KEYS = frozenset({"mode", "target_id", "filter", "after", "limit"})
_FILTER_KEYS = frozenset({"status", "types", "involving_agents"})


def detect_payload(payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
    _closed(payload, _DETECT_KEYS, "DETECT payload")
    mode = payload.get("mode")
    if not _member(mode, DETECT_MODES):
        raise _fail('DETECT mode must be "check", "scan" or "list"')
    target = _optional_string(payload.get("target_id"), "target_id", max_chars=limits.max_id_chars)
    if mode == "check" and target is None:
        raise _fail('DETECT mode "check" needs target_id: the unit to check')
    raw_filter = payload.get("filter")
    flt = {} if raw_filter is None else _object(raw_filter, "filter")
    _closed(flt, _FILTER_KEYS, "filter")
    return {
        "mode": mode,
        "target_id": target,
        "status": _enum_list(flt.get("status", []), "filter.status", CONFLICT_STATUSES),
        "types": _enum_list(flt.get("types", []), "filter.types", CONFLICT_TYPES),
        "involving_agents": [
            agent_id(a, "filter.involving_agents[]")
            for a in _string_list(
                flt.get("involving_agents", []),
                "filter.involving_agents",
                max_items=limits.max_list_items,
                max_chars=128,
            )
        ],
        "page": pages.page_request(payload, limits),  # read by list only
    }


# -- MERGE --------------------------------------------------------------------

_MERGE_KEYS = frozenset({"conflict_id", "strategy", "resolution"})
_RESOLUTION_KEYS = frozenset({"winner_id", "synthesis", "rationale", "quorum"})
#: Bounds of ``resolution.quorum`` (the number of ballots that closes a vote).
MIN_QUORUM, MAX_QUORUM = 2, 64
_NEEDS_WINNER = ("authority", "vote")
_NO_WINNER = ("synthesis", "human_escalation")


def merge_payload(payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Validate a MERGE payload (spec 6.6) and the strategy-specific resolution fields."""
    _closed(payload, _MERGE_KEYS, "MERGE payload")
    conflict_id = _string(payload.get("conflict_id"), "conflict_id", max_chars=limits.max_id_chars)
    strategy = payload.get("strategy")
    if not _member(strategy, CONFLICT_STRATEGIES):
        raise _fail(f"strategy must be one of {', '.join(CONFLICT_STRATEGIES)}")
    if "resolution" not in payload:
        raise _fail("resolution is required: at least its rationale")
    resolution = _object(payload["resolution"], "resolution")
    _closed(resolution, _RESOLUTION_KEYS, "resolution")
    if resolution.get("rationale") is None:
        raise _fail("resolution.rationale is required: why this resolution was chosen")
    rationale = _string(
        resolution["rationale"],
        "resolution.rationale",
        max_chars=limits.max_text_chars,
        nonblank=True,
    )
    winner = _optional_string(
        resolution.get("winner_id"), "resolution.winner_id", max_chars=limits.max_id_chars
    )
    synthesis = resolution.get("synthesis")
    if synthesis is not None:
        synthesis = _string(
            synthesis, "resolution.synthesis", max_chars=limits.max_content_chars, nonblank=True
        )
    quorum = resolution.get("quorum")
    if quorum is not None and (not _is_int(quorum) or not MIN_QUORUM <= quorum <= MAX_QUORUM):
        raise _fail(f"resolution.quorum must be an integer from {MIN_QUORUM} to {MAX_QUORUM}")
    if strategy in _NEEDS_WINNER and winner is None:
        raise _fail(f"strategy {strategy} needs resolution.winner_id: the prevailing unit")
    if strategy in _NO_WINNER and winner is not None:
        raise _fail(f"strategy {strategy} names no winner; leave resolution.winner_id out")
    if (strategy == "synthesis") != (synthesis is not None):
        raise _fail("resolution.synthesis is required by strategy synthesis and only by it")
    if strategy != "vote" and quorum is not None:
        raise _fail("resolution.quorum belongs to strategy vote only")
    return {
        "conflict_id": conflict_id,
        "strategy": strategy,
        "winner_id": winner,
        "synthesis": synthesis,
        "rationale": rationale,
        "quorum": quorum,
    }


# -- SUBSCRIBE ----------------------------------------------------------------

_SUBSCRIBE_KEYS = frozenset({"action", "subscription"})
_SUBSCRIPTION_KEYS = frozenset(
    {
        "id",
        "events",
        "min_relevance",
        "debounce_ms",
        "include_own",
        "delivery",
        "timeout",
        "filter",
        "bindings",
        "name",
    }
)
#: A subscription's ``name``: what an agent calls it, unique among its active ones.
SUBSCRIPTION_NAME = re.compile(r"[A-Za-z0-9._:-]{1,100}")
#: Most values ``subscription.bindings`` may seal one allow list to.
MAX_BINDING_VALUES = 100
_DELIVERY_KEYS = frozenset({"type", "url", "secret"})
#: SUBSCRIBE actions that name an existing subscription by ``subscription.id``.
_NAMING_ACTIONS = ("unsubscribe", "resume")
#: Longest webhook URL, and longest secret text.
MAX_URL_CHARS = 2048
MAX_SECRET_CHARS = 128


def subscribe_payload(
    payload: dict[str, Any], limits: Limits, event_names: tuple[str, ...]
) -> dict[str, Any]:
    """Validate a SUBSCRIBE payload (spec 6.7); returns action and normalized fields."""
    _closed(payload, _SUBSCRIBE_KEYS, "SUBSCRIBE payload")
    action = payload.get("action")
    if not _member(action, ("subscribe", "unsubscribe", "resume", "list")):
        raise _fail('action must be "subscribe", "unsubscribe", "resume" or "list"')
    raw = payload.get("subscription")
    if raw is None:
        if action != "list":
            raise _fail(f"{action} needs a subscription object")
        return {"action": action}
    sub = _object(raw, "subscription")
    _closed(sub, _SUBSCRIPTION_KEYS, "subscription")
    if action in _NAMING_ACTIONS:
        return {
            "action": action,
            "id": _string(sub.get("id"), "subscription.id", max_chars=limits.max_id_chars),
        }
    if action == "list":
        return {"action": action}
    if sub.get("id") is not None:
        raise _fail("subscription.id is assigned by the Field; leave it out or null")
    if "events" not in sub:
        raise _fail("subscription.events is required: the event types to be notified of")
    events = _string_list(sub["events"], "subscription.events", max_items=64, max_chars=64)
    if not events:
        raise _fail("subscription.events must name at least one event type")
    unknown = sorted({e for e in events if e not in event_names})
    if unknown:
        raise InvalidPayload(
            f"unknown event type(s): {', '.join(unknown)}",
            details={"unknown_events": unknown, "valid_events": list(event_names)},
            suggested_action=f"Use event types from: {', '.join(event_names)}.",
        )
    min_relevance = sub.get("min_relevance")
    if min_relevance is not None and (
        not _is_number(min_relevance) or not 0.0 <= min_relevance <= 1.0
    ):
        raise _fail("subscription.min_relevance must be a number between 0.0 and 1.0, or null")
    debounce = sub.get("debounce_ms")
    if debounce is not None and (
        not _is_int(debounce) or not 0 <= debounce <= limits.max_debounce_ms
    ):
        raise _fail(
            f"subscription.debounce_ms must be an integer from 0 to {limits.max_debounce_ms}, "
            "or null"
        )
    include_own = sub.get("include_own", False)
    if not isinstance(include_own, bool):
        raise _fail("subscription.include_own must be a boolean")
    timeout = sub.get("timeout")
    if timeout is not None and duration_seconds(timeout) is None:
        raise _fail(
            'subscription.timeout must be a duration such as "90s", "30m", "72h" or "1h30m" '
            f"(from 1 s to {MAX_DURATION_S // 86_400} days), or null"
        )
    return {
        "action": action,
        "events": sorted(set(events), key=event_names.index),
        "min_relevance": float(min_relevance or 0.0),
        "debounce_ms": int(debounce or 0),
        "include_own": include_own,
        "delivery": _delivery(sub.get("delivery")),
        "timeout": timeout,
        # the text; compiled and checked by the SUBSCRIBE handler (INVALID_FILTER)
        "filter": _filter_text(sub.get("filter")),
        "bindings": _bindings(sub.get("bindings"), limits),
        "name": _subscription_name(sub.get("name")),
    }


def _subscription_name(value: Any) -> str | None:
    """``subscription.name``: null, or 1 to 100 of ``A-Z a-z 0-9 . _ : -``."""
    if value is None:
        return None
    if not isinstance(value, str) or SUBSCRIPTION_NAME.fullmatch(value) is None:
        raise _fail(
            "subscription.name must be 1 to 100 characters of letters, digits and . _ : -, or null"
        )
    return value


def _filter_text(value: Any) -> str | None:
    """``subscription.filter``: null, or a string within the length limit."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidFilter("subscription.filter must be a string holding a CEL expression")
    if len(value) > MAX_FILTER_CHARS:
        raise InvalidFilter(
            f"subscription.filter is {len(value)} characters long; the limit is {MAX_FILTER_CHARS}",
            details={"field": "subscription.filter", "max_chars": MAX_FILTER_CHARS},
        )
    return value


def _bindings(value: Any, limits: Limits) -> dict[str, list[str]] | None:
    """``subscription.bindings``: allow list name -> the values it is sealed to."""
    if value is None:
        return None
    bindings = _object(value, "subscription.bindings")
    unknown = sorted(set(bindings) - set(ALLOW_LIST_NAMES))
    if unknown:
        raise InvalidPayload(
            f"subscription.bindings names unknown allow list(s): {', '.join(unknown)[:300]}",
            details={"unknown_bindings": unknown[:16], "allow_lists": list(ALLOW_LIST_NAMES)},
            suggested_action=f"Bind only {', '.join(ALLOW_LIST_NAMES)}.",
        )
    return {
        name: list(
            dict.fromkeys(
                _string_list(
                    bindings[name],
                    f"subscription.bindings.{name}",
                    max_items=MAX_BINDING_VALUES,
                    max_chars=limits.max_id_chars,
                )
            )
        )
        for name in ALLOW_LIST_NAMES
        if name in bindings
    }


#: Longest duration (ten years), and the form of one: numbers with units, largest first.
MAX_DURATION_S = 3650 * 86_400
_DURATION = re.compile(r"(?:\d{1,9}d)?(?:\d{1,9}h)?(?:\d{1,9}m(?!s))?(?:\d{1,9}s)?(?:\d{1,9}ms)?")
_UNIT_SECONDS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1, "ms": 0.001}


def duration_seconds(value: Any) -> float | None:
    """Seconds in a duration such as ``"72h"`` or ``"1h30m"`` (units ``d h m s ms``, each
    at most once, largest first), or None if ``value`` is no such duration, or is shorter
    than a second or longer than :data:`MAX_DURATION_S`."""
    if not isinstance(value, str) or len(value) > 64 or not value:
        return None
    if _DURATION.fullmatch(value) is None:
        return None
    seconds = sum(
        int(number) * _UNIT_SECONDS[unit]
        for number, unit in re.findall(r"(\d+)(ms|d|h|m|s)", value)
    )
    return float(seconds) if 1 <= seconds <= MAX_DURATION_S else None


def _delivery(value: Any) -> dict[str, Any]:
    """``subscription.delivery``: absent or ``stream``, or a ``webhook`` with its URL and an
    optional secret (checked further by the Field: the URL's destination, the secret's form)."""
    if value is None:
        return {"type": "stream"}
    delivery = _object(value, "subscription.delivery")
    _closed(delivery, _DELIVERY_KEYS, "subscription.delivery")
    kind = delivery.get("type", "stream")
    if not _member(kind, ("stream", "webhook")):
        raise _fail('subscription.delivery.type must be "stream" or "webhook", not ' + shown(kind))
    if kind == "stream":
        if delivery.keys() - {"type"}:
            raise _fail("a stream delivery takes no url or secret")
        return {"type": "stream"}
    if "url" not in delivery:
        raise _fail("a webhook delivery needs subscription.delivery.url")
    url = _string(delivery["url"], "subscription.delivery.url", max_chars=MAX_URL_CHARS)
    secret = _optional_string(
        delivery.get("secret"), "subscription.delivery.secret", max_chars=MAX_SECRET_CHARS
    )
    if secret is not None and not secret.startswith("whsec_"):
        raise _fail('subscription.delivery.secret must start with "whsec_"')
    return {"type": "webhook", "url": url, "secret": secret}


# -- SESSION, COORDINATE, HANDOFF (Coordination Extension) --------------------

#: Longest session name or task title.
TITLE_CHARS = 256
#: Most units a HANDOFF packages (``context.max_units`` and ``context.include_units``).
MAX_HANDOFF_UNITS = 50
DEFAULT_HANDOFF_UNITS = 10
_SESSION_KEYS = frozenset(
    {
        "action",
        "session_id",
        "name",
        "purpose",
        "reason",
        "visibility",
        "invitees",
        "after",
        "limit",
    }
)
#: SESSION actions that take ``invitees``; those that need it.
_INVITING_ACTIONS = frozenset({"create", "invite", "uninvite"})
_INVITEES_REQUIRED = frozenset({"invite", "uninvite"})
_VISIBILITY_RULE_KEYS = frozenset({"roles", "min_authority"})
_COORDINATE_KEYS = frozenset(
    {
        "action",
        "task_id",
        "title",
        "description",
        "assignee",
        "depends_on",
        "priority",
        "reason",
        "result",
        "after",
        "limit",
    }
)
_HANDOFF_KEYS = frozenset({"task_id", "to_agent_id", "notes", "context"})
_HANDOFF_CONTEXT_KEYS = frozenset({"max_units", "include_units"})


def _action(payload: dict[str, Any], actions: tuple[str, ...], operation: str) -> str:
    action = payload.get("action")
    if not _member(action, actions):
        raise _fail(f"{operation} action must be one of {', '.join(actions)}")
    return str(action)


def _text(payload: dict[str, Any], key: str, limits: Limits) -> str | None:
    return _optional_string(
        payload.get(key), key, max_chars=limits.max_text_chars, allow_empty=True
    )


def _title(value: Any, where: str) -> str:
    return _string(value, where, max_chars=TITLE_CHARS, nonblank=True)


def _new_or_existing(
    payload: dict[str, Any], key: str, action: str, limits: Limits, *, new: bool
) -> str | None:
    """An id that ``create`` must leave out (the Field assigns it) and other actions need."""
    value = _optional_string(payload.get(key), key, max_chars=limits.max_id_chars)
    if new and value is not None:
        raise _fail(f"{key} is assigned by the Field; leave it out or null for {action}")
    if not new and value is None:
        raise _fail(f"{action} needs {key}")
    return value


def session_payload(
    payload: dict[str, Any], limits: Limits, actions: tuple[str, ...]
) -> dict[str, Any]:
    """Validate a SESSION payload (schema ``session.request``)."""
    _closed(payload, _SESSION_KEYS, "SESSION payload")
    action = _action(payload, actions, "SESSION")
    name = payload.get("name")
    if action == "list":  # reads no session: an id that is given is only type-checked
        session_id = _optional_string(
            payload.get("session_id"), "session_id", max_chars=limits.max_id_chars
        )
    else:
        session_id = _new_or_existing(payload, "session_id", action, limits, new=action == "create")
    return {
        "action": action,
        "session_id": session_id,
        "name": _title(name, "name") if "name" in payload or action == "create" else None,
        "purpose": _text(payload, "purpose", limits),
        "reason": _text(payload, "reason", limits),
        "visibility": _session_visibility(payload, action, limits),
        "invitees": _invitees(payload, action, limits),
        "page": pages.page_request(payload, limits),  # read by list only
    }


def _invitees(payload: dict[str, Any], action: str, limits: Limits) -> list[str]:
    """The agent ids a ``create``, ``invite`` or ``uninvite`` names; repeats are ignored."""
    if "invitees" not in payload:
        if action in _INVITEES_REQUIRED:
            raise _fail(f"{action} needs invitees: the agent ids to {action}")
        return []
    if action not in _INVITING_ACTIONS:
        raise _fail("invitees belong to create, invite and uninvite only")
    value = payload["invitees"]
    if not isinstance(value, list) or len(value) > limits.max_list_items:
        raise _fail(f"invitees must be an array of at most {limits.max_list_items} agent ids")
    if action in _INVITEES_REQUIRED and not value:
        raise _fail(f"{action} needs at least one agent id in invitees")
    return list(dict.fromkeys(agent_id(a, "invitees[]") for a in value))


def _session_visibility(
    payload: dict[str, Any], action: str, limits: Limits
) -> dict[str, dict[str, Any]]:
    """A session's role-based visibility rules, per memory type (only at ``create``)."""
    if "visibility" not in payload:
        return {}
    if action != "create":
        raise _fail("visibility is set when a session is created, and only then")
    rules = _object(payload["visibility"], "visibility")
    normalized: dict[str, dict[str, Any]] = {}
    for memory_type, rule in rules.items():
        if memory_type not in MEMORY_TYPES:
            raise _fail(f"visibility names {shown(memory_type)}, which is not a memory type")
        where = f"visibility.{memory_type}"
        rule = _object(rule, where)
        _closed(rule, _VISIBILITY_RULE_KEYS, where)
        roles = rule.get("roles")
        if roles is not None:
            if not isinstance(roles, list) or len(roles) > limits.max_list_items:
                raise _fail(f"{where}.roles must be an array of at most {limits.max_list_items}")
            roles = [
                _string(r, f"{where}.roles[]", max_chars=limits.max_role_chars, nonblank=True)
                for r in roles
            ]
        floor = rule.get("min_authority", 0)
        if not _is_int(floor) or not 0 <= floor <= 10:
            raise _fail(f"{where}.min_authority must be an integer from 0 to 10")
        normalized[memory_type] = {"roles": roles, "min_authority": floor}
    return normalized


def coordinate_payload(
    payload: dict[str, Any], limits: Limits, actions: tuple[str, ...], priorities: tuple[str, ...]
) -> dict[str, Any]:
    """Validate a COORDINATE payload (schema ``coordinate.request``)."""
    _closed(payload, _COORDINATE_KEYS, "COORDINATE payload")
    action = _action(payload, actions, "COORDINATE")
    title = payload.get("title")
    assignee = payload.get("assignee")
    priority = payload.get("priority", "normal")
    if not _member(priority, priorities):
        raise _fail(f"priority must be one of {', '.join(priorities)}")
    depends_on = _string_list(
        payload.get("depends_on", []),
        "depends_on",
        max_items=limits.max_list_items,
        max_chars=limits.max_id_chars,
    )
    task_id = (
        _optional_string(payload.get("task_id"), "task_id", max_chars=limits.max_id_chars)
        if action == "list"
        else _new_or_existing(payload, "task_id", action, limits, new=action == "create")
    )
    if action == "assign" and assignee is None:
        raise _fail("assign needs assignee: the agent to assign the task to")
    return {
        "action": action,
        "task_id": task_id,
        "title": _title(title, "title") if "title" in payload or action == "create" else None,
        "description": _text(payload, "description", limits),
        "assignee": None if assignee is None else agent_id(assignee, "assignee"),
        "depends_on": list(dict.fromkeys(depends_on)),
        "priority": priority,
        "reason": _text(payload, "reason", limits),
        "result": _text(payload, "result", limits),
        "page": pages.page_request(payload, limits),  # read by list only
    }


def handoff_payload(payload: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Validate a HANDOFF payload (schema ``handoff.request``)."""
    _closed(payload, _HANDOFF_KEYS, "HANDOFF payload")
    if "task_id" not in payload or "to_agent_id" not in payload:
        raise _fail("HANDOFF payload needs task_id and to_agent_id")
    raw = payload.get("context")
    context = {} if raw is None else _object(raw, "context")
    _closed(context, _HANDOFF_CONTEXT_KEYS, "context")
    max_units = context.get("max_units", DEFAULT_HANDOFF_UNITS)
    if not _is_int(max_units) or not 0 <= max_units <= MAX_HANDOFF_UNITS:
        raise _fail(f"context.max_units must be an integer from 0 to {MAX_HANDOFF_UNITS}")
    include = _string_list(
        context.get("include_units", []),
        "context.include_units",
        max_items=MAX_HANDOFF_UNITS,
        max_chars=limits.max_id_chars,
    )
    return {
        "task_id": _string(payload["task_id"], "task_id", max_chars=limits.max_id_chars),
        "to_agent_id": agent_id(payload["to_agent_id"], "to_agent_id"),
        "notes": _text(payload, "notes", limits),
        "max_units": int(max_units),
        "include_units": list(dict.fromkeys(include)),
    }
