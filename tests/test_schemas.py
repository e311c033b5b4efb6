"""The JSON Schemas of the wire contract (protocol/schemas) and protocol/README.md."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from . import console_cases, coordination_cases, operator_cases, rap_cases
from .schema_util import (
    SCHEMA_DIR,
    URN_PREFIX,
    assert_valid,
    errors,
    is_valid,
    load_schemas,
    registry,
    validator,
)

README = SCHEMA_DIR.parent / "README.md"

TYPES = [
    "envelope",
    "error",
    "memory-unit",
    "relation",
    "agent",
    "scope",
    "conflict",
    "field-capabilities",
    "scoped-memory-unit",
    "subscription",
    "notification",
    "ws-frame",
    "source",
    "filter-context",
    *coordination_cases.SCHEMAS["types"],
    *rap_cases.SCHEMAS["types"],
    "registration-token",
]
REQUESTS = [
    "register.request",
    "deregister.request",
    "record.request",
    "attune.request",
    "detect.request",
    "subscribe.request",
    "replay.request",
    "compact.request",
    "feedback.request",
    *coordination_cases.SCHEMAS["requests"],
    "merge.request",
    "source.request",
    *rap_cases.SCHEMAS["requests"],
    "registration-token.request",
    *operator_cases.SCHEMAS["requests"],
]
RESPONSES = [
    "register.response",
    "deregister.response",
    "record.response",
    "attune.response",
    "detect.response",
    "subscribe.response",
    "field-status.response",
    "agents.response",
    "conflicts.response",
    "replay.response",
    "compact.response",
    "feedback.response",
    *coordination_cases.SCHEMAS["responses"],
    "merge.response",
    "source.response",
    "sources.response",
    "source-remove.response",
    "source-event.response",
    *rap_cases.SCHEMAS["responses"],
    "registration-token.response",
    "registration-tokens.response",
    "registration-token-revoke.response",
    *console_cases.SCHEMAS["responses"],
    *operator_cases.SCHEMAS["responses"],
]
ALL = TYPES + REQUESTS + RESPONSES

MAX_EPOCH = 2**53 - 1
AGENT_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


# --------------------------------------------------------------------------- helpers


def put(obj: Any, path: str, value: Any) -> Any:
    """A deep copy of obj with the value at a dotted path set ("a.b.0.c")."""
    out = copy.deepcopy(obj)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


def drop(obj: Any, path: str) -> Any:
    """A deep copy of obj without the key at a dotted path."""
    out = copy.deepcopy(obj)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    del node[last]
    return out


def walk(node: Any, path: str = "") -> Any:
    """Yield (json-pointer, subschema) for every dict in a schema."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}/{i}")


def missing_only(name: str, instance: Any) -> set[str]:
    """The required properties instance lacks; fails if it has any other problem."""
    missing: set[str] = set()
    for err in validator(name).iter_errors(instance):
        assert err.validator == "required", f"{name}: unexpected error {err.message}"
        missing |= {p for p in err.validator_value if p not in err.instance}
    return missing


# --------------------------------------------------------------------------- spec examples
# Appendix A of the spec, verbatim.

A1_REGISTER = {
    "protocol": "akashik",
    "version": "0.1.0",
    "id": "msg-001",
    "operation": "REGISTER",
    "agent_id": "researcher-01",
    "session_id": None,
    "epoch": 0,
    "payload": {
        "id": "researcher-01",
        "role": "market_researcher",
        "interests": ["market size", "competitors", "growth trends"],
    },
}
A1_REGISTER_RESPONSE = {
    "status": "registered",
    "agent": {
        "id": "researcher-01",
        "role": "market_researcher",
        "status": "idle",
        "interests": ["market size", "competitors", "growth trends"],
    },
    "field_capabilities": {
        "conformance_level": 1,
        "supported_operations": [
            "REGISTER",
            "DEREGISTER",
            "RECORD",
            "ATTUNE",
            "DETECT",
            "SUBSCRIBE",
        ],
        "protocol_version": "0.1.0",
        "persistence": True,
        "conflict_strategies": [],
    },
}
A1_RECORD = {
    "protocol": "akashik",
    "version": "0.1.0",
    "id": "msg-002",
    "operation": "RECORD",
    "agent_id": "researcher-01",
    "session_id": None,
    "epoch": 1,
    "payload": {
        "mode": "committed",
        "type": "finding",
        "content": "European SaaS market for SMB HR tools is growing at 23% CAGR, expected to "
        "reach $4.2B by 2027. Primary growth driver is regulatory compliance "
        "automation post-EU AI Act.",
        "intent": {
            "purpose": "Validate market size assumption for go-to-market strategy",
            "task_id": "task-market-sizing",
            "question": "Is the European HR SaaS market large enough to justify a dedicated "
            "go-to-market?",
        },
        "confidence": {
            "score": 0.82,
            "reasoning": "Based on three independent analyst reports with consistent "
            "estimates. Slight uncertainty on AI Act impact timeline.",
            "evidence": ["https://example.com/report-a", "https://example.com/report-b"],
            "assumptions": [
                "EU AI Act enforcement begins Q3 2026",
                "No major EU recession in 2026-2027",
            ],
        },
        "relations": [{"type": "answers", "target_id": "mem-question-001"}],
    },
}
A1_RECORD_RESPONSE = {
    "status": "accepted",
    "memory_unit_id": "mem-002",
    "epoch": 2,
    "conflicts_detected": [],
}
A1_ATTUNE = {
    "protocol": "akashik",
    "version": "0.1.0",
    "id": "msg-003",
    "operation": "ATTUNE",
    "agent_id": "strategist-01",
    "session_id": None,
    "epoch": 3,
    "payload": {
        "scope": {"role": "strategist", "max_units": 10},
        "context_hint": "About to draft competitive positioning section",
    },
}
A1_UNIT = {
    "id": "mem-002",
    "mode": "committed",
    "type": "finding",
    "content": A1_RECORD["payload"]["content"],
    "intent": A1_RECORD["payload"]["intent"],
    "confidence": A1_RECORD["payload"]["confidence"],
    "source": {
        "agent_id": "researcher-01",
        "agent_role": "market_researcher",
        "session_id": None,
        "timestamp": "2026-03-01T10:30:00Z",
    },
    "relations": [{"type": "answers", "target_id": "mem-question-001"}],
    "status": "active",
    "epoch": 2,
}
A1_ATTUNE_RESPONSE = {
    "status": "ok",
    "record": [
        {
            "memory_unit": A1_UNIT,
            "relevance_score": 0.85,
            "relevance_reason": "Recent finding from market_researcher. Market sizing is relevant "
            "to strategy.",
            "format": "full",
        }
    ],
    "conflicts": [],
    "context_budget": {
        "units_returned": 1,
        "units_available": 1,
        "tokens_used": None,
        "tokens_budget": None,
    },
    "epoch": 3,
}
A2_RECORD = {
    "protocol": "akashik",
    "version": "0.1.0",
    "id": "msg-010",
    "operation": "RECORD",
    "agent_id": "researcher-02",
    "session_id": None,
    "epoch": 10,
    "payload": {
        "mode": "committed",
        "type": "finding",
        "content": "European SaaS market growth is decelerating to 14% CAGR due to enterprise "
        "budget cuts in Q4 2026.",
        "intent": {
            "purpose": "Update market growth projection with latest data",
            "question": "Has the market growth trajectory changed?",
        },
        "confidence": {
            "score": 0.75,
            "reasoning": "Based on a single Q4 earnings report from a major player. May not "
            "represent the full market.",
            "assumptions": ["Q4 trends are indicative of 2027 trajectory"],
        },
        "relations": [
            {
                "type": "contradicts",
                "target_id": "mem-002",
                "description": "Original estimate was 23% CAGR; new data suggests 14%",
            }
        ],
    },
}
A2_RECORD_RESPONSE = {
    "status": "accepted",
    "memory_unit_id": "mem-010",
    "epoch": 11,
    "conflicts_detected": ["conflict-001"],
}
A2_CONFLICT = {
    "id": "conflict-001",
    "type": "factual",
    "status": "detected",
    "unit_a": "mem-002",
    "unit_b": "mem-010",
    "description": "Conflicting market growth estimates: 23% CAGR vs 14% CAGR",
    "detected_by": "explicit",
}
# Section 6.7 of the spec, verbatim.
S67_SUBSCRIBE = {
    "protocol": "akashik",
    "version": "0.1.0",
    "id": "msg-030",
    "operation": "SUBSCRIBE",
    "agent_id": "strategist-01",
    "session_id": None,
    "epoch": 30,
    "payload": {
        "action": "subscribe",
        "subscription": {
            "events": ["conflict.detected", "memory.recorded"],
            "min_relevance": 0.6,
            "debounce_ms": 2000,
        },
    },
}
S67_SUBSCRIBE_RESPONSE = {"status": "ok", "subscription_id": "sub-xyz789"}
# The spec's push notification format, filled in.
S67_NOTIFICATION = {
    "subscription_id": "sub-xyz789",
    "event": "conflict.detected",
    "epoch": 31,
    "relevance_score": 0.9,
    "summary": "Conflicting market growth estimates",
    "memory_unit_id": None,
    "conflict_id": "conflict-001",
    "requires_action": True,
}

# --------------------------------------------------------------------------- server-shaped bases

CAPABILITIES = {
    "conformance_level": 1,
    "supported_operations": ["REGISTER", "DEREGISTER", "RECORD", "ATTUNE", "DETECT", "SUBSCRIBE"],
    "protocol_version": "0.1.0",
    "persistence": True,
    "conflict_strategies": [],
    "field_id": "field-7f3a",
    "detect_modes": ["list"],
    "limits": {"max_body_bytes": 1048576, "max_units": 1000, "max_epoch_skew": 2**32},
}
AGENT = {
    "id": "researcher-01",
    "role": "market_researcher",
    "status": "idle",
    "interests": ["market size"],
    "current_task_id": None,
    "registered_epoch": 1,
}
UNIT = {
    "id": "mem-0123456789abcdef0123",
    "mode": "committed",
    "type": "finding",
    "content": "Churn fell to 2%.",
    "intent": {"purpose": "Track churn", "task_id": "task-1", "question": None},
    "confidence": {
        "score": 0.9,
        "reasoning": "From the billing export.",
        "evidence": [],
        "assumptions": [],
    },
    "source": {
        "agent_id": "analyst-1",
        "agent_role": "analyst",
        "session_id": None,
        "timestamp": "2026-03-01T10:30:00.123Z",
    },
    "relations": [],
    "status": "active",
    "epoch": 5,
}
DRAFT_UNIT = {**drop(UNIT, "confidence"), "mode": "draft", "status": "draft"}
CONFLICT = {
    "id": "conflict-0123456789abcdef0123",
    "type": "factual",
    "status": "detected",
    "unit_a": "mem-0123456789abcdef0123",
    "unit_b": "mem-89abcdef0123456789ab",
    "description": "mem-89abcdef0123456789ab contradicts mem-0123456789abcdef0123",
    "detected_by": "explicit",
    "epoch": 9,
}
RESOLVED_CONFLICT = {
    **CONFLICT,
    "status": "resolved",
    "resolution": {
        "strategy": "last_write_wins",
        "winner_id": "mem-89abcdef0123456789ab",
        "rationale": "newer",
        "resolved_by": "lead-1",
        "epoch_resolved": 12,
    },
}
RECORD = {
    "mode": "committed",
    "type": "decision",
    "content": "Ship on Monday.",
    "intent": {"purpose": "Fix the release date", "task_id": None, "question": None},
    "confidence": {"score": 0.7, "reasoning": "Tests are green."},
}
DRAFT = {
    "mode": "draft",
    "type": "observation",
    "content": "Looks slow.",
    "intent": {"purpose": "Note a hunch"},
}
SCOPED_FULL = {
    "memory_unit": UNIT,
    "relevance_score": 0.5,
    "relevance_reason": "recent",
    "format": "full",
}
SCOPED_IDS = {
    "memory_unit_id": UNIT["id"],
    "epoch": 5,
    "relevance_score": 0.5,
    "relevance_reason": "recent",
    "format": "ids_only",
}
ERROR = {
    "code": "MISSING_INTENT",
    "message": "intent.purpose is required",
    "operation": "RECORD",
    "recoverable": True,
    "suggested_action": "Add intent.purpose.",
}
REJECTION = {
    "code": "UNSUPPORTED_OPERATION",
    "message": "missing operations: MERGE",
    "operation": "REGISTER",
    "recoverable": False,
    "suggested_action": None,
    "details": {
        "status": "rejected",
        "rejection_reason": "Unsupported: MERGE",
        "missing_operations": ["MERGE"],
        "field_capabilities": CAPABILITIES,
    },
}
ATTUNE_RESPONSE = {
    "status": "ok",
    "record": [SCOPED_FULL, {**SCOPED_FULL, "format": "summary"}],
    "conflicts": [CONFLICT],
    "context_budget": {
        "units_returned": 2,
        "units_available": 7,
        "tokens_used": 120,
        "tokens_budget": 500,
    },
    "epoch": 14,
}
FIELD_STATUS = {
    "status": "ok",
    "field_id": "field-7f3a",
    "protocol_version": "0.1.0",
    "server_version": "0.1.0",
    "conformance_level": 1,
    "epoch": 42,
    "persistence": True,
    "log": {"backend": "sqlite", "last_position": 17, "writable": True, "refusing": None},
    "writer": {
        "running": True,
        "queued": 0,
        "admission": {
            "delay_ms": 0.4,
            "writes_in_flight": 3,
            "writes_limit": 12,
            "write": {"mode": "admitting", "refused": 0, "episodes": 0},
            "read": {"mode": "admitting", "refused": 0, "episodes": 0},
        },
    },
    "embedding": {"after_commit": True, "queued": 4, "held_entries": 2},
    "counts": {
        "agents": 2,
        "memory_units": {"active": 3, "contested": 2, "draft": 1},
        "conflicts": {"total": 1, "unresolved": 1},
    },
    "sources": {"github": {"scheme": "github", "accepted": 3, "filtered": 1, "refused": 0}},
    "limits": {"max_body_bytes": 1048576},
    "uptime_seconds": 12.5,
    "snapshot": None,
}
SNAPSHOT = {
    "position": 17,
    "written_at": "2026-11-24T09:05:47.713Z",
    "size": 18982,
    "started_from": None,
}
SOURCE = {
    "name": "github",
    "scheme": "github",
    "filter": "payload.action == 'opened'",
    "unit": {
        "type": "observation",
        "content": "PR {payload.pull_request.title}",
        "purpose": "Follow pull requests",
        "confidence": 0.9,
        "task_id": None,
        "session_id": None,
    },
    "max_payload_bytes": 65536,
    "events_url": "http://127.0.0.1:8765/v1/sources/github/events",
}
SOURCE_REQUEST = {
    "name": "github",
    "scheme": "standard",
    "secret": "whsec_" + "A" * 44,
    "unit": {"type": "finding", "content": "{payload.type}"},
}
TOKEN = "Zk3x9Qm2-vB8_nT4rL6yW1cH5jD7sA0eGuPoIiKkMmN"
EVENTS = [
    "memory.recorded",
    "memory.superseded",
    "memory.contested",
    "conflict.detected",
    "conflict.resolved",
    "task.state_changed",
    "task.assigned",
    "task.completed",
    "handoff.incoming",
    "agent.joined",
    "agent.failed",
    "session.paused",
    "session.ended",
]
SUB_ID = "sub-0123456789abcdef0123"
CURSOR = "4c3c3355a2f4-57"
SUBSCRIPTION = {
    "id": SUB_ID,
    "agent_id": "strategist-01",
    "events": ["memory.recorded", "conflict.detected"],
    "min_relevance": 0.6,
    "debounce_ms": 2000,
    "include_own": False,
    "status": "active",
    "created_epoch": 31,
}
CANCELLED = {**SUBSCRIPTION, "status": "cancelled"}
SUBSCRIBE = {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}}
UNSUBSCRIBE = {"action": "unsubscribe", "subscription": {"id": SUB_ID}}
SUBSCRIBED = {
    "status": "ok",
    "subscription_id": SUB_ID,
    "subscription": SUBSCRIPTION,
    "epoch": 31,
    "cursor": CURSOR,
    "ws_url": "ws://127.0.0.1:8765/v1/ws",
    "sse_url": f"http://127.0.0.1:8765/v1/subscriptions/{SUB_ID}/events",
    "created": True,
}
UNSUBSCRIBED = {"status": "ok", "subscription_id": SUB_ID, "subscription": CANCELLED, "epoch": 40}
LISTED = {"status": "ok", "subscriptions": [SUBSCRIPTION], "epoch": 41}
NOTIFICATION = {
    "subscription_id": SUB_ID,
    "relevance_score": 1.0,
    "relevance_reason": "conflict.detected: it involves your unit; same role as you",
    "requires_action": True,
    "folded": 0,
    "event": "conflict.detected",
    "epoch": 9,
    "summary": "conflict between mem-0123456789abcdef0123 and mem-89abcdef0123456789ab: ...",
    "memory_unit_id": None,
    "conflict_id": CONFLICT["id"],
    "cursor": CURSOR,
    "entity": {"type": "conflict", "id": CONFLICT["id"]},
    "agent_id": "analyst-2",
}
RECORDED = {
    **NOTIFICATION,
    "relevance_score": 0.4,
    "relevance_reason": "memory.recorded: general relevance (type, confidence, recency)",
    "requires_action": False,
    "event": "memory.recorded",
    "summary": "finding from analyst-1: Churn fell to 2%.",
    "memory_unit_id": UNIT["id"],
    "conflict_id": None,
    "entity": {"type": "memory_unit", "id": UNIT["id"]},
    "agent_id": "analyst-1",
}
CONTESTED = {
    **RECORDED,
    "event": "memory.contested",
    "requires_action": True,
    "conflict_id": CONFLICT["id"],
}
JOINED = {
    **RECORDED,
    "event": "agent.joined",
    "summary": "agent carol joined as analyst",
    "memory_unit_id": None,
    "entity": {"type": "agent", "id": "carol"},
    "agent_id": "carol",
}
FAILED_REASON = "not heard from for 300 s (heartbeat_timeout 300 s) and no push connection open"
FAILED = {
    **JOINED,
    "event": "agent.failed",
    "summary": "agent carol (analyst) failed: " + FAILED_REASON,
    "requires_action": True,
    "detail": {
        "agent": {**AGENT, "id": "carol", "status": "failed", "failure_reason": FAILED_REASON},
        "reason": FAILED_REASON,
        "released_tasks": [{"task_id": "task-1", "created_by": "lead"}],
    },
}
WINDOW = {"start": "2026-03-01T10:30:00.500Z", "end": "2026-03-01T10:30:01.000Z"}
FILTER_EVENT = {
    "name": "memory.recorded",
    "epoch": 7,
    "cursor": CURSOR,
    "actor": "analyst-1",
    "summary": "finding from analyst-1: x",
    "entity": {"type": "memory_unit", "id": UNIT["id"]},
    "memory_unit_id": UNIT["id"],
    "conflict_id": None,
    "unit": UNIT,
}
SUBSCRIBER = {
    "id": "analyst-1",
    "role": "analyst",
    "interests": ["markets"],
    "authority": 3,
    "current_task": None,
}
FILTER_CONTEXT = {
    "event": FILTER_EVENT,
    "subscriber": SUBSCRIBER,
    "parameters": {"task_id": {"t-1": True}, "unit_id": {}},
}
RESUME = {"subscription_id": SUB_ID, "recovered": True, "from": CURSOR}
LIVE = {"subscription_id": SUB_ID, "replayed": 3, "cursor": CURSOR}
END = {"subscription_id": SUB_ID, "reason": "subscription cancelled", "cursor": CURSOR}
OVERFLOW = {"reason": "outbox overflow", "cursors": {SUB_ID: CURSOR}}


# --------------------------------------------------------------------------- structure


def test_every_listed_schema_exists_and_nothing_else() -> None:
    assert set(load_schemas()) == set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_schema_is_valid_2020_12(name: str) -> None:
    schema = load_schemas()[name]
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == URN_PREFIX + name
    assert schema.get("title") and schema.get("description")


@pytest.mark.parametrize("name", ALL)
def test_every_ref_resolves(name: str) -> None:
    resolver = registry().resolver(base_uri=URN_PREFIX + name)
    refs = [node["$ref"] for _, node in walk(load_schemas()[name]) if "$ref" in node]
    for ref in refs:
        assert ref.startswith(("#", URN_PREFIX)), ref
        resolver.lookup(ref)  # raises if unresolvable


# Objects that are deliberately open: the MemoryUnit top level (future extensions).
OPEN_OBJECTS = {("memory-unit", "")} | rap_cases.OPEN_OBJECTS


@pytest.mark.parametrize("name", ALL)
def test_object_schemas_are_closed(name: str) -> None:
    for pointer, node in walk(load_schemas()[name]):
        types = node.get("type")
        if "object" in (types if isinstance(types, list) else [types]) and "properties" in node:
            if (name, pointer) in OPEN_OBJECTS:
                assert "additionalProperties" not in node
            else:
                assert node.get("additionalProperties") is False, f"{name}{pointer} is open"


def test_agent_id_pattern_is_defined_once() -> None:
    definitions = [
        (name, pointer)
        for name, schema in load_schemas().items()
        for pointer, node in walk(schema)
        if node.get("pattern", "").startswith("^[A-Za-z0-9][A-Za-z0-9._:@-]")
    ]
    assert definitions == [("agent", "/$defs/agent_id")]


# --------------------------------------------------------------------------- Appendix A


def test_spec_a1_envelopes_and_payloads() -> None:
    for message, payload_schema in [
        (A1_REGISTER, "register.request"),
        (A1_RECORD, "record.request"),
        (A1_ATTUNE, "attune.request"),
        (A2_RECORD, "record.request"),
    ]:
        assert_valid("envelope", message)
        assert_valid(payload_schema, message["payload"])


def test_spec_a1_attune_response_is_valid_as_is() -> None:
    assert_valid("attune.response", A1_ATTUNE_RESPONSE)
    assert_valid("memory-unit", A1_UNIT)


def test_spec_a1_register_response_lacks_only_our_extensions() -> None:
    # The spec's example predates this server's extensions: current_task_id on the agent,
    # field_id/detect_modes/limits in the capabilities, and token/epoch/rejection_reason.
    # Everything it does carry must validate; the only errors allowed are those omissions.
    assert missing_only("agent", A1_REGISTER_RESPONSE["agent"]) == {"current_task_id"}
    assert missing_only("field-capabilities", A1_REGISTER_RESPONSE["field_capabilities"]) == {
        "field_id",
        "detect_modes",
        "limits",
    }
    adapted = {
        "status": "registered",
        "agent": {**A1_REGISTER_RESPONSE["agent"], "current_task_id": None},
        "field_capabilities": {
            **A1_REGISTER_RESPONSE["field_capabilities"],
            "field_id": "field-1",
            "detect_modes": ["list"],
            "limits": {"max_units": 1000},
        },
        "rejection_reason": None,
        "token": TOKEN,
        "epoch": 1,
    }
    assert_valid("register.response", adapted)


def test_spec_record_responses_lack_only_rejection_reason() -> None:
    # The spec's examples omit rejection_reason, which this server always sends (null).
    for response in (A1_RECORD_RESPONSE, A2_RECORD_RESPONSE):
        assert missing_only("record.response", response) == {"rejection_reason"}
        assert_valid("record.response", {**response, "rejection_reason": None})


def test_spec_subscribe_request_is_valid_as_is() -> None:
    assert_valid("envelope", S67_SUBSCRIBE)
    assert_valid("subscribe.request", S67_SUBSCRIBE["payload"])


def test_spec_subscribe_response_lacks_only_our_extensions() -> None:
    # The spec's response has only status and subscription_id; this server adds the stored
    # subscription, the epoch, the cursor of its creation, the push URLs and whether it was
    # created (a named subscription may exist already).
    subscribe_branch = Draft202012Validator(
        {"$ref": URN_PREFIX + "subscribe.response#/oneOf/0"}, registry=registry()
    )
    missing: set[str] = set()
    for err in subscribe_branch.iter_errors(S67_SUBSCRIBE_RESPONSE):
        assert err.validator == "required", err.message
        missing |= {p for p in err.validator_value if p not in err.instance}
    assert missing == {"subscription", "epoch", "cursor", "ws_url", "sse_url", "created"}
    assert not is_valid("subscribe.response", S67_SUBSCRIBE_RESPONSE)


def test_spec_notification_lacks_only_our_extensions() -> None:
    assert missing_only("notification", S67_NOTIFICATION) == {
        "relevance_reason",
        "cursor",
        "entity",
        "agent_id",
        "folded",
    }
    extended = {
        **S67_NOTIFICATION,
        "relevance_reason": "conflict.detected: it involves your unit",
        "cursor": CURSOR,
        "entity": {"type": "conflict", "id": "conflict-001"},
        "agent_id": "researcher-02",
        "folded": 0,
    }
    assert_valid("notification", extended)


def test_spec_a2_conflict_lacks_only_epoch() -> None:
    # epoch (when the conflict was detected) is an extension.
    assert missing_only("conflict", A2_CONFLICT) == {"epoch"}
    assert_valid("conflict", {**A2_CONFLICT, "epoch": 11})


# --------------------------------------------------------------------------- valid / invalid cases


def case(name: str, instance: Any, label: str) -> Any:
    return pytest.param(name, instance, id=f"{name}:{label}")


# -- MERGE (spec 6.6) ------------------------------------------------------------------
WINNER = "mem-89abcdef0123456789ab"
MERGE = {
    "conflict_id": CONFLICT["id"],
    "strategy": "authority",
    "resolution": {"winner_id": WINNER, "synthesis": None, "rationale": "the lead decides"},
}
VOTE_CONFLICT = {
    **CONFLICT,
    "status": "resolving",
    "vote": {
        "quorum": 3,
        "opened_by": "lead-1",
        "ballots": [{"agent_id": "lead-1", "winner_id": WINNER, "rationale": "r", "epoch": 10}],
    },
}
ESCALATED_CONFLICT = {
    **CONFLICT,
    "status": "escalated",
    "escalation": {"escalated_by": "lead-1", "rationale": "needs a human", "epoch": 10},
}
SYNTHESIZED = put(
    put(RESOLVED_CONFLICT, "resolution.strategy", "synthesis"),
    "resolution.synthesis_unit_id",
    "mem-00000000000000000009",
)
MERGED = {
    "status": "resolved",
    "conflict": RESOLVED_CONFLICT,
    "side_effects": {
        "superseded_units": [CONFLICT["unit_a"]],
        "new_unit_id": None,
        "notified_agents": ["analyst-1", "researcher-01"],
    },
    "epoch": 12,
}
RESOLVED_EVENT = {**NOTIFICATION, "event": "conflict.resolved", "requires_action": False}
SUPERSEDED_EVENT = {**RECORDED, "event": "memory.superseded", "conflict_id": CONFLICT["id"]}
NOTHING_YET = {"superseded_units": [], "new_unit_id": None, "notified_agents": []}
MERGE_VALID = [
    case("merge.request", MERGE, "authority"),
    case("merge.request", put(MERGE, "strategy", "last_write_wins"), "computed-with-check"),
    case(
        "merge.request",
        {"conflict_id": "c", "strategy": "confidence_weighted", "resolution": {"rationale": "r"}},
        "computed",
    ),
    case(
        "merge.request",
        {
            "conflict_id": "c",
            "strategy": "synthesis",
            "resolution": {"synthesis": "Both, per plan.", "rationale": "r", "winner_id": None},
        },
        "synthesis",
    ),
    case(
        "merge.request",
        {"conflict_id": "c", "strategy": "human_escalation", "resolution": {"rationale": "r"}},
        "escalation",
    ),
    case("merge.request", put(put(MERGE, "strategy", "vote"), "resolution.quorum", 5), "vote"),
    case("merge.response", MERGED, "resolved"),
    case(
        "merge.response",
        {
            **MERGED,
            "conflict": SYNTHESIZED,
            "side_effects": {
                **NOTHING_YET,
                "superseded_units": ["m1", "m2"],
                "new_unit_id": "mem-00000000000000000009",
            },
        },
        "synthesis",
    ),
    case(
        "merge.response",
        {
            **MERGED,
            "status": "escalated",
            "conflict": ESCALATED_CONFLICT,
            "side_effects": NOTHING_YET,
        },
        "escalated",
    ),
    case(
        "merge.response",
        {
            **MERGED,
            "status": "pending_vote",
            "conflict": VOTE_CONFLICT,
            "side_effects": NOTHING_YET,
        },
        "pending-vote",
    ),
    case("conflict", VOTE_CONFLICT, "vote"),
    case("conflict", ESCALATED_CONFLICT, "escalation"),
    case("conflict", SYNTHESIZED, "synthesis"),
    case("notification", RESOLVED_EVENT, "conflict-resolved"),
    case("notification", {**SUPERSEDED_EVENT, "conflict_id": None}, "superseded"),
    case("notification", SUPERSEDED_EVENT, "superseded-by-merge"),
]
MERGE_INVALID = [
    case("merge.request", drop(MERGE, "resolution"), "missing-resolution"),
    case("merge.request", drop(MERGE, "resolution.rationale"), "missing-rationale"),
    case("merge.request", put(MERGE, "resolution.rationale", " "), "blank-rationale"),
    case("merge.request", put(MERGE, "strategy", "coin_flip"), "unknown-strategy"),
    case("merge.request", put(MERGE, "conflict_id", ""), "conflict-empty"),
    case("merge.request", put(MERGE, "resolution.winner_id", None), "authority-without-winner"),
    case("merge.request", put(MERGE, "strategy", "synthesis"), "synthesis-without-text"),
    case("merge.request", put(MERGE, "strategy", "human_escalation"), "escalation-with-winner"),
    case("merge.request", put(MERGE, "resolution.synthesis", "x"), "synthesis-text-elsewhere"),
    case("merge.request", put(MERGE, "resolution.quorum", 3), "quorum-without-vote"),
    case(
        "merge.request",
        put(put(MERGE, "strategy", "vote"), "resolution.quorum", 1),
        "quorum-1",
    ),
    case("merge.request", {**MERGE, "priority": 1}, "extra-property"),
    case("merge.request", put(MERGE, "resolution.weight", 1), "resolution-extra"),
    case("merge.response", {**MERGED, "status": "merged"}, "unknown-status"),
    case("merge.response", {**MERGED, "conflict": CONFLICT}, "resolved-but-detected"),
    case("merge.response", {**MERGED, "status": "pending_vote"}, "pending-but-resolved"),
    case("merge.response", drop(MERGED, "side_effects.new_unit_id"), "missing-new-unit"),
    case("merge.response", drop(MERGED, "epoch"), "missing-epoch"),
    case("conflict", put(VOTE_CONFLICT, "vote.quorum", 1), "vote-quorum-1"),
    case("conflict", put(VOTE_CONFLICT, "vote.ballots", [{"agent_id": "a"}]), "ballot-partial"),
    case("conflict", put(ESCALATED_CONFLICT, "escalation.by", "x"), "escalation-extra"),
    case("notification", {**RESOLVED_EVENT, "conflict_id": None}, "resolved-without-conflict"),
    case("notification", {**RESOLVED_EVENT, "memory_unit_id": UNIT["id"]}, "resolved-with-unit"),
    case("notification", {**SUPERSEDED_EVENT, "memory_unit_id": None}, "superseded-no-unit"),
]


VALID = [
    # envelope
    case("envelope", A1_REGISTER, "spec"),
    case("envelope", put(A1_REGISTER, "agent_id", "a" * 128), "agent-id-128"),
    case("envelope", put(A1_REGISTER, "agent_id", "a.b_c:d@e-f9"), "agent-id-punct"),
    case("envelope", put(A1_REGISTER, "agent_id", "7"), "agent-id-1"),
    case("envelope", put(A1_REGISTER, "epoch", MAX_EPOCH), "epoch-max"),
    case("envelope", put(A1_REGISTER, "session_id", "s" * 256), "session-256"),
    case("envelope", put(A1_REGISTER, "payload", {}), "empty-payload"),
    *[
        case("envelope", put(A1_REGISTER, "operation", op), op)
        for op in [
            "DEREGISTER",
            "DETECT",
            "MERGE",
            "SUBSCRIBE",
            "REPLAY",
            "COMPACT",
            "COORDINATE",
            "HANDOFF",
            "SESSION",
        ]
    ],
    # error
    case("error", ERROR, "basic"),
    case("error", {**ERROR, "operation": None, "suggested_action": None}, "nulls"),
    case("error", {**ERROR, "details": {"field": "intent.purpose", "n": [1]}}, "details-open"),
    case("error", REJECTION, "register-rejection"),
    case(
        "error",
        {**ERROR, "code": "UNSUPPORTED_OPERATION", "operation": "DETECT"},
        "unsupported-detect-without-details",
    ),
    case("error", {**ERROR, "code": "SOME_FUTURE_CODE"}, "unknown-code"),
    # relation
    case("relation", {"type": "supports", "target_id": "mem-1"}, "minimal"),
    case("relation", {"type": "contradicts", "target_id": "x", "description": None}, "null-desc"),
    case("relation", {"type": "informs", "target_id": "x", "description": "d" * 4096}, "desc-4096"),
    # memory-unit
    case("memory-unit", UNIT, "committed"),
    case("memory-unit", DRAFT_UNIT, "draft-without-confidence"),
    case("memory-unit", {**DRAFT_UNIT, "confidence": {"evidence": ["x"]}}, "draft-partial-conf"),
    case("memory-unit", {**UNIT, "x_future_field": {"a": 1}}, "open-top-level"),
    case("memory-unit", {**UNIT, "status": "contested"}, "contested"),
    case("memory-unit", {**UNIT, "confidence": {"score": 0.9, "reasoning": "r"}}, "summary-conf"),
    case("memory-unit", put(UNIT, "source.timestamp", "2026-03-01T10:30:00Z"), "ts-no-fraction"),
    case(
        "memory-unit",
        put(UNIT, "relations", [{"type": "supersedes", "target_id": "m"}]),
        "relation",
    ),
    # agent
    case("agent", AGENT, "full"),
    case("agent", drop(AGENT, "registered_epoch"), "no-registered-epoch"),
    case("agent", {**AGENT, "interests": [], "current_task_id": "task-1"}, "task"),
    case("agent", {**AGENT, "interests": ["i" * 256] * 64}, "interests-max"),
    case("agent", {**AGENT, "status": "failed", "failure_reason": "silent"}, "failed"),
    # scope
    case("scope", {"role": "strategist", "max_units": 10}, "minimal"),
    case(
        "scope",
        {
            "role": "r",
            "max_units": 1000,
            "max_tokens": 500,
            "interests": ["x"],
            "active_task_id": None,
            "temporal_layers": ["past", "present", "future"],
            "relevance_threshold": 0,
            "recency_weight": 1,
            "since_epoch": 0,
            "include_own": True,
        },
        "full",
    ),
    case("scope", {"role": "r", "max_units": 1, "since_epoch": None}, "since-null"),
    # conflict
    case("conflict", CONFLICT, "detected"),
    case("conflict", {**CONFLICT, "status": "escalated"}, "escalated"),
    case("conflict", RESOLVED_CONFLICT, "resolved"),
    case("conflict", put(RESOLVED_CONFLICT, "resolution.winner_id", None), "no-winner"),
    # field-capabilities
    case("field-capabilities", CAPABILITIES, "level-1"),
    case("field-capabilities", {**CAPABILITIES, "limits": {}, "detect_modes": []}, "empty"),
    case(
        "field-capabilities",
        {**CAPABILITIES, "conformance_level": 3, "conflict_strategies": ["vote", "synthesis"]},
        "strategies",
    ),
    # scoped-memory-unit
    case("scoped-memory-unit", SCOPED_FULL, "full"),
    case("scoped-memory-unit", {**SCOPED_FULL, "format": "summary"}, "summary"),
    case("scoped-memory-unit", SCOPED_IDS, "ids-only"),
    case("scoped-memory-unit", {**SCOPED_IDS, "relevance_score": 1}, "score-1"),
    # register.request
    case("register.request", A1_REGISTER["payload"], "spec"),
    case("register.request", {"id": "a", "role": "r"}, "minimal"),
    case(
        "register.request",
        {
            "id": "a",
            "role": "r",
            "interests": [],
            "required_operations": ["RECORD", "TELEPORT"],
            "current_task_id": "task-1",
        },
        "unknown-op-name-is-schema-valid",
    ),
    case("register.request", {"id": "a", "role": "r", "current_task_id": None}, "task-null"),
    case(
        "register.request",
        {"id": "a", "role": "r", "required_operations": ["R" * 64] * 32},
        "required-ops-max",
    ),
    # deregister.request
    case("deregister.request", {"agent_id": "researcher-01"}, "basic"),
    # record.request
    case("record.request", A1_RECORD["payload"], "spec-a1"),
    case("record.request", A2_RECORD["payload"], "spec-a2"),
    case("record.request", RECORD, "committed"),
    case("record.request", drop(RECORD, "mode"), "mode-defaults-to-committed"),
    case("record.request", DRAFT, "draft-without-confidence"),
    case("record.request", {**DRAFT, "confidence": {}}, "draft-empty-confidence"),
    case("record.request", {**DRAFT, "confidence": {"score": 0.3}}, "draft-score-only"),
    case("record.request", {**DRAFT, "confidence": {"reasoning": "r"}}, "draft-reasoning-only"),
    case("record.request", put(RECORD, "confidence.score", 0), "score-0"),
    case("record.request", put(RECORD, "confidence.score", 1), "score-1-int"),
    case("record.request", put(RECORD, "confidence.score", 1.0), "score-1.0"),
    case("record.request", put(RECORD, "content", "c" * 65536), "content-65536"),
    case("record.request", put(RECORD, "content", " x "), "content-padded"),
    case("record.request", put(RECORD, "intent.purpose", "p" * 4096), "purpose-4096"),
    case("record.request", put(RECORD, "confidence.evidence", ["e" * 4096] * 64), "evidence-max"),
    case(
        "record.request",
        {
            **RECORD,
            "relations": [
                {"type": t, "target_id": "mem-x"}
                for t in [
                    "supports",
                    "contradicts",
                    "depends_on",
                    "supersedes",
                    "caused_by",
                    "elaborates",
                    "answers",
                    "blocks",
                    "informs",
                ]
            ],
        },
        "all-relation-types",
    ),
    case(
        "record.request",
        {**RECORD, "relations": [{"type": "informs", "target_id": "m"}] * 64},
        "relations-64",
    ),
    *[
        case("record.request", put(RECORD, "type", t), f"type-{t}")
        for t in [
            "finding",
            "observation",
            "intention",
            "assumption",
            "constraint",
            "question",
            "contradiction",
            "synthesis",
            "correction",
            "human_directive",
        ]
    ],
    # attune.request
    case("attune.request", A1_ATTUNE["payload"], "spec"),
    case(
        "attune.request",
        {
            "scope": {"role": "r", "max_units": 5},
            "context_hint": None,
            "format": "ids_only",
            "since_epoch": 12,
        },
        "ids-only-since",
    ),
    case(
        "attune.request",
        {"scope": {"role": "r", "max_units": 5, "since_epoch": 12}, "since_epoch": 12},
        "since-both-equal",
    ),
    case(
        "attune.request",
        {"scope": {"role": "r", "max_units": 5}, "format": "summary", "since_epoch": None},
        "summary",
    ),
    # detect.request
    case("detect.request", {"mode": "list"}, "minimal"),
    case("detect.request", {"mode": "list", "target_id": None, "filter": {}}, "empty-filter"),
    case(
        "detect.request",
        {
            "mode": "list",
            "filter": {
                "status": ["detected", "resolved"],
                "types": ["factual", "priority"],
                "involving_agents": ["a", "b"],
            },
        },
        "full-filter",
    ),
    case("detect.request", {"mode": "check", "target_id": "mem-1"}, "check-schema-valid"),
    case("detect.request", {"mode": "list", "filter": None}, "filter-null"),
    case("detect.request", {"mode": "list", "after": "conflict-1", "limit": 10}, "page"),
    case("detect.request", {"mode": "scan", "after": None, "limit": None}, "page-null"),
    # responses
    case(
        "register.response",
        {
            "status": "registered",
            "agent": AGENT,
            "field_capabilities": CAPABILITIES,
            "rejection_reason": None,
            "token": TOKEN,
            "epoch": 1,
        },
        "basic",
    ),
    case(
        "register.response",
        {
            "status": "registered",
            "agent": AGENT,
            "field_capabilities": CAPABILITIES,
            "rejection_reason": None,
            "token": "0123456789abcdef" * 4,
            "epoch": 1,
        },
        "hex-token",
    ),
    case(
        "deregister.response",
        {"status": "ok", "cleanup": {"units_orphaned": 3, "tasks_reassigned": 0}, "epoch": 20},
        "basic",
    ),
    case(
        "record.response",
        {
            "status": "accepted",
            "memory_unit_id": UNIT["id"],
            "epoch": 5,
            "conflicts_detected": [CONFLICT["id"]],
            "rejection_reason": None,
        },
        "basic",
    ),
    case("attune.response", ATTUNE_RESPONSE, "basic"),
    case(
        "attune.response", {**ATTUNE_RESPONSE, "record": [SCOPED_IDS], "conflicts": []}, "ids-only"
    ),
    case("attune.response", {**ATTUNE_RESPONSE, "conflicts": [CONFLICT] * 100}, "conflicts-100"),
    case(
        "detect.response",
        {
            "status": "ok",
            "conflicts": [CONFLICT, RESOLVED_CONFLICT],
            "scan_coverage": {"units_scanned": 0, "new_conflicts_found": 0},
            "epoch": 3,
        },
        "basic",
    ),
    case(
        "detect.response",
        {
            "status": "ok",
            "conflicts": [CONFLICT],
            "scan_coverage": {"units_scanned": 0, "new_conflicts_found": 0},
            "next": CONFLICT["id"],
            "epoch": 3,
        },
        "list-page",
    ),
    case(
        "attune.response",
        put(ATTUNE_RESPONSE, "context_budget.limited_by", "max_response_bytes"),
        "limited-by-bytes",
    ),
    case("field-status.response", FIELD_STATUS, "basic"),
    case("field-status.response", put(FIELD_STATUS, "counts.memory_units", {}), "no-units"),
    case(
        "field-status.response",
        put(
            put(FIELD_STATUS, "log.writable", False),
            "log.refusing",
            {"code": "STORAGE_FULL", "message": "The event log's disk is full"},
        ),
        "refusing-writes",
    ),
    case("field-status.response", put(FIELD_STATUS, "snapshot", SNAPSHOT), "snapshot"),
    case(
        "field-status.response",
        put(FIELD_STATUS, "snapshot", {**SNAPSHOT, "started_from": 17}),
        "started-from-snapshot",
    ),
    case("agents.response", {"status": "ok", "agents": [AGENT], "next": None, "epoch": 4}, "basic"),
    case("agents.response", {"status": "ok", "agents": [], "next": None, "epoch": 0}, "empty"),
    case(
        "agents.response",
        {"status": "ok", "agents": [AGENT], "next": AGENT["id"], "epoch": 4},
        "page",
    ),
    case(
        "conflicts.response",
        {"status": "ok", "conflicts": [CONFLICT], "next": None, "epoch": 4},
        "basic",
    ),
    case(
        "conflicts.response",
        {"status": "ok", "conflicts": [], "next": CONFLICT["id"], "epoch": 4},
        "page",
    ),
    *MERGE_VALID,
    # subscription
    case("subscription", SUBSCRIPTION, "active"),
    case("subscription", CANCELLED, "cancelled"),
    case("subscription", {**SUBSCRIPTION, "events": EVENTS}, "all-events"),
    case(
        "subscription",
        {**SUBSCRIPTION, "min_relevance": 0.0, "debounce_ms": 0, "include_own": True},
        "defaults-own",
    ),
    case("subscription", {**SUBSCRIPTION, "debounce_ms": 3600000, "min_relevance": 1}, "max"),
    # notification
    case("notification", NOTIFICATION, "conflict-detected"),
    case("notification", RECORDED, "memory-recorded"),
    case("notification", {**RECORDED, "event": "memory.superseded", "folded": 2}, "superseded"),
    case("notification", CONTESTED, "memory-contested"),
    case("notification", JOINED, "agent-joined"),
    case("notification", FAILED, "agent-failed"),
    case("notification", {**RECORDED, "folded": 3, "window": WINDOW}, "debounced"),
    case(
        "notification",
        {**FAILED, "detail": {**FAILED["detail"], "released_tasks": []}},
        "agent-failed-no-tasks",
    ),
    case("notification", {**RECORDED, "agent_id": None}, "no-actor"),
    case("notification", {**RECORDED, "cursor": "abc-def-0"}, "opaque-cursor"),
    # ws-frame
    case("ws-frame", {"type": "notification", "data": NOTIFICATION}, "notification"),
    case(
        "ws-frame",
        {"type": "response", "id": "msg-7", "status": 200, "body": LISTED},
        "response-ok",
    ),
    case(
        "ws-frame", {"type": "response", "id": None, "status": 400, "body": ERROR}, "response-error"
    ),
    case(
        "ws-frame",
        {"type": "response", "id": 5, "status": 422, "body": ERROR},
        "response-id-as-sent",
    ),
    case("ws-frame", {"type": "resume", "data": RESUME}, "resume"),
    case(
        "ws-frame",
        {"type": "resume", "data": {**RESUME, "recovered": False, "reason": "not a cursor"}},
        "resume-unrecovered",
    ),
    case("ws-frame", {"type": "live", "data": LIVE}, "live"),
    case("ws-frame", {"type": "live", "data": {**LIVE, "replayed": 0}}, "live-nothing-replayed"),
    case("ws-frame", {"type": "end", "data": END}, "end"),
    case("ws-frame", {"type": "overflow", "data": OVERFLOW}, "overflow"),
    case("ws-frame", {"type": "overflow", "data": {**OVERFLOW, "cursors": {}}}, "overflow-empty"),
    case("ws-frame", {"type": "error", "data": {**ERROR, "code": "UNAUTHENTICATED"}}, "error"),
    # subscribe.request
    case("subscribe.request", S67_SUBSCRIBE["payload"], "spec"),
    case("subscribe.request", SUBSCRIBE, "minimal"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.filter", "true"), "filter"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.filter", None), "filter-null"),
    case(
        "subscribe.request",
        put(SUBSCRIBE, "subscription.bindings", {"task_id": ["t-1"], "session_id": []}),
        "bindings",
    ),
    case("filter-context", FILTER_CONTEXT, "unit"),
    case("filter-context", put(FILTER_CONTEXT, "parameters", {}), "no-lists"),
    case(
        "subscribe.request",
        {
            "action": "subscribe",
            "subscription": {
                "id": None,
                "events": EVENTS,
                "min_relevance": 0,
                "debounce_ms": 3600000,
                "include_own": True,
            },
        },
        "full",
    ),
    case(
        "subscribe.request",
        put(put(SUBSCRIBE, "subscription.min_relevance", None), "subscription.debounce_ms", None),
        "nulls",
    ),
    case("subscribe.request", put(SUBSCRIBE, "subscription.min_relevance", 1), "relevance-1"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.debounce_ms", 0), "debounce-0"),
    case(
        "subscribe.request",
        put(SUBSCRIBE, "subscription.events", ["memory.recorded"] * 64),
        "64-duplicates",
    ),
    case("subscribe.request", UNSUBSCRIBE, "unsubscribe"),
    case("subscribe.request", put(UNSUBSCRIBE, "subscription.id", "x" * 256), "unsubscribe-id-256"),
    case(
        "subscribe.request",
        {
            "action": "unsubscribe",
            "subscription": {"id": SUB_ID, "events": "ignored", "include_own": 3},
        },
        "unsubscribe-ignores-the-rest",
    ),
    case(
        "subscribe.request", put(SUBSCRIBE, "subscription.delivery", {"type": "stream"}), "stream"
    ),
    case(
        "subscribe.request",
        put(SUBSCRIBE, "subscription.delivery", {"type": "webhook", "url": "https://h.example/x"}),
        "webhook",
    ),
    case(
        "subscribe.request",
        put(
            SUBSCRIBE,
            "subscription.delivery",
            {"type": "webhook", "url": "https://h.example/x", "secret": "whsec_" + "A" * 32},
        ),
        "webhook-secret",
    ),
    case("subscribe.request", {**UNSUBSCRIBE, "action": "resume"}, "resume"),
    case("subscribe.request", {"action": "list"}, "list"),
    case("subscribe.request", {"action": "list", "subscription": None}, "list-null"),
    case("subscribe.request", {"action": "list", "subscription": {"events": 5}}, "list-ignores"),
    # subscribe.response
    case("subscribe.response", SUBSCRIBED, "subscribe"),
    case(
        "subscribe.response",
        {
            **SUBSCRIBED,
            "ws_url": "wss://field.example.com/akashik/v1/ws",
            "sse_url": f"https://field.example.com/akashik/v1/subscriptions/{SUB_ID}/events",
        },
        "subscribe-tls-prefix",
    ),
    case("subscribe.response", UNSUBSCRIBED, "unsubscribe"),
    case("subscribe.response", LISTED, "list"),
    case("subscribe.response", {**LISTED, "subscriptions": []}, "list-empty"),
    case("subscribe.response", {**LISTED, "subscriptions": [SUBSCRIPTION] * 100}, "list-100"),
]

INVALID = [
    # envelope
    case("envelope", put(A1_REGISTER, "protocol", "other"), "protocol-other"),
    case("envelope", put(A1_REGISTER, "version", "0.2.0"), "version"),
    case("envelope", put(A1_REGISTER, "operation", "FLY"), "unknown-operation"),
    case("envelope", put(A1_REGISTER, "operation", "register"), "lowercase-operation"),
    case("envelope", drop(A1_REGISTER, "session_id"), "missing-session-id"),
    case("envelope", drop(A1_REGISTER, "payload"), "missing-payload"),
    case("envelope", {**A1_REGISTER, "token": "x"}, "extra-property"),
    case("envelope", put(A1_REGISTER, "epoch", -1), "epoch--1"),
    case("envelope", put(A1_REGISTER, "epoch", MAX_EPOCH + 1), "epoch-2^53"),
    case("envelope", put(A1_REGISTER, "epoch", 1.5), "epoch-fraction"),
    case("envelope", put(A1_REGISTER, "epoch", True), "epoch-bool"),
    case("envelope", put(A1_REGISTER, "epoch", "1"), "epoch-string"),
    case("envelope", put(A1_REGISTER, "epoch", None), "epoch-null"),
    case("envelope", put(A1_REGISTER, "agent_id", "a b"), "agent-id-space"),
    case("envelope", put(A1_REGISTER, "agent_id", "-a"), "agent-id-leading-dash"),
    case("envelope", put(A1_REGISTER, "agent_id", "a" * 129), "agent-id-129"),
    case("envelope", put(A1_REGISTER, "agent_id", "agent\n"), "agent-id-trailing-newline"),
    case("envelope", put(A1_REGISTER, "agent_id", ""), "agent-id-empty"),
    case("envelope", put(A1_REGISTER, "agent_id", "agent/1"), "agent-id-slash"),
    case("envelope", put(A1_REGISTER, "id", ""), "id-empty"),
    case("envelope", put(A1_REGISTER, "id", "m" * 257), "id-257"),
    case("envelope", put(A1_REGISTER, "session_id", ""), "session-empty"),
    case("envelope", put(A1_REGISTER, "payload", None), "payload-null"),
    case("envelope", put(A1_REGISTER, "payload", []), "payload-array"),
    case("envelope", [A1_REGISTER], "array"),
    # error
    case("error", drop(ERROR, "operation"), "missing-operation"),
    case("error", drop(ERROR, "suggested_action"), "missing-suggested-action"),
    case("error", {**ERROR, "recoverable": "yes"}, "recoverable-string"),
    case("error", {**ERROR, "stack": "Traceback"}, "extra-property"),
    case("error", {**ERROR, "details": []}, "details-array"),
    case("error", {**ERROR, "code": ""}, "code-empty"),
    case("error", drop(REJECTION, "details"), "register-rejection-without-details"),
    case("error", drop(REJECTION, "details.field_capabilities"), "rejection-no-capabilities"),
    case("error", put(REJECTION, "details.status", "registered"), "rejection-status"),
    # relation
    case("relation", {"type": "refutes", "target_id": "x"}, "unknown-type"),
    case("relation", {"type": "supports"}, "missing-target"),
    case("relation", {"type": "supports", "target_id": ""}, "target-empty"),
    case("relation", {"type": "supports", "target_id": "x", "weight": 1}, "extra-property"),
    case(
        "relation", {"type": "supports", "target_id": "x", "description": "d" * 4097}, "desc-4097"
    ),
    # memory-unit
    case("memory-unit", put(UNIT, "status", "deleted"), "unknown-status"),
    case("memory-unit", put(UNIT, "type", "rumor"), "unknown-type"),
    case("memory-unit", put(UNIT, "mode", "final"), "unknown-mode"),
    case("memory-unit", drop(UNIT, "relations"), "missing-relations"),
    case("memory-unit", drop(UNIT, "source"), "missing-source"),
    case("memory-unit", put(UNIT, "epoch", -1), "epoch--1"),
    case("memory-unit", put(UNIT, "confidence.score", 1.5), "score-1.5"),
    case("memory-unit", put(UNIT, "intent.extra", 1), "intent-extra"),
    case("memory-unit", put(UNIT, "source.extra", 1), "source-extra"),
    case("memory-unit", put(UNIT, "confidence.extra", 1), "confidence-extra"),
    case("memory-unit", drop(UNIT, "source.session_id"), "source-missing-session"),
    case("memory-unit", put(UNIT, "source.timestamp", "2026-03-01 10:30:00"), "ts-no-T"),
    case("memory-unit", put(UNIT, "source.timestamp", "2026-03-01T10:30:00+01:00"), "ts-not-utc"),
    case("memory-unit", put(UNIT, "source.timestamp", "2026-03-01T10:30:00Z\n"), "ts-newline"),
    case("memory-unit", put(UNIT, "content", ""), "content-empty"),
    # agent
    case("agent", {**AGENT, "status": "busy"}, "unknown-status"),
    case("agent", drop(AGENT, "current_task_id"), "missing-current-task"),
    case("agent", drop(AGENT, "interests"), "missing-interests"),
    case("agent", {**AGENT, "interests": ["x"] * 65}, "interests-65"),
    case("agent", {**AGENT, "interests": [""]}, "interest-empty"),
    case("agent", {**AGENT, "interests": ["i" * 257]}, "interest-257"),
    case("agent", {**AGENT, "role": "   "}, "role-blank"),
    case("agent", {**AGENT, "role": "r" * 129}, "role-129"),
    case("agent", {**AGENT, "token": "t"}, "extra-property"),
    case("agent", {**AGENT, "registered_epoch": -1}, "registered-epoch--1"),
    case("agent", {**AGENT, "status": "failed"}, "failed-without-reason"),
    case("agent", {**AGENT, "failure_reason": "silent"}, "reason-while-idle"),
    case("agent", {**AGENT, "status": "failed", "failure_reason": ""}, "failure-reason-empty"),
    # scope
    case("scope", {"role": "r"}, "missing-max-units"),
    case("scope", {"max_units": 3}, "missing-role"),
    case("scope", {"role": "r", "max_units": 0}, "max-units-0"),
    case("scope", {"role": "r", "max_units": 1001}, "max-units-1001"),
    case("scope", {"role": "r", "max_units": 2.5}, "max-units-fraction"),
    case("scope", {"role": "r", "max_units": True}, "max-units-bool"),
    case("scope", {"role": "", "max_units": 3}, "role-empty"),
    case("scope", {"role": "r", "max_units": 3, "max_tokens": 0}, "max-tokens-0"),
    case("scope", {"role": "r", "max_units": 3, "relevance_threshold": 1.5}, "threshold-1.5"),
    case("scope", {"role": "r", "max_units": 3, "recency_weight": -0.1}, "recency--0.1"),
    case("scope", {"role": "r", "max_units": 3, "temporal_layers": ["later"]}, "layer"),
    case("scope", {"role": "r", "max_units": 3, "temporal_layers": ["past"] * 65}, "layers-65"),
    case("scope", {"role": "r", "max_units": 3, "since_epoch": -1}, "since--1"),
    case("scope", {"role": "r", "max_units": 3, "since_epoch": "5"}, "since-string"),
    case("scope", {"role": "r", "max_units": 3, "include_own": "yes"}, "include-own-string"),
    case("scope", {"role": "r", "max_units": 3, "active_task_id": ""}, "task-empty"),
    case("scope", {"role": "r", "max_units": 3, "query": "x"}, "extra-property"),
    # conflict
    case("conflict", {**CONFLICT, "type": "moral"}, "unknown-type"),
    case("conflict", {**CONFLICT, "status": "open"}, "unknown-status"),
    case("conflict", {**CONFLICT, "detected_by": "magic"}, "unknown-detector"),
    case("conflict", drop(CONFLICT, "epoch"), "missing-epoch"),
    case("conflict", drop(CONFLICT, "unit_b"), "missing-unit-b"),
    case("conflict", {**CONFLICT, "severity": 1}, "extra-property"),
    case("conflict", {**RESOLVED_CONFLICT, "status": "detected"}, "unresolved-with-resolution"),
    case("conflict", {**CONFLICT, "status": "resolved"}, "resolved-without-resolution"),
    case("conflict", put(RESOLVED_CONFLICT, "resolution.strategy", "coin_flip"), "strategy"),
    case("conflict", put(RESOLVED_CONFLICT, "resolution.extra", 1), "resolution-extra"),
    # field-capabilities
    case("field-capabilities", {**CAPABILITIES, "conformance_level": 4}, "level-4"),
    case("field-capabilities", {**CAPABILITIES, "conformance_level": "1"}, "level-string"),
    case("field-capabilities", {**CAPABILITIES, "supported_operations": ["FLY"]}, "op"),
    case(
        "field-capabilities",
        {**CAPABILITIES, "supported_operations": ["RECORD", "RECORD"]},
        "op-duplicate",
    ),
    case("field-capabilities", {**CAPABILITIES, "protocol_version": "0.2.0"}, "version"),
    case("field-capabilities", {**CAPABILITIES, "persistence": "yes"}, "persistence-string"),
    case("field-capabilities", {**CAPABILITIES, "conflict_strategies": ["coin_flip"]}, "strategy"),
    case("field-capabilities", {**CAPABILITIES, "detect_modes": ["grep"]}, "detect-mode"),
    case("field-capabilities", {**CAPABILITIES, "limits": {"max_units": 1.5}}, "limit-float"),
    case("field-capabilities", {**CAPABILITIES, "limits": {"max_units": "1"}}, "limit-string"),
    case("field-capabilities", drop(CAPABILITIES, "field_id"), "missing-field-id"),
    case("field-capabilities", {**CAPABILITIES, "auth": "token"}, "extra-property"),
    # scoped-memory-unit
    case("scoped-memory-unit", drop(SCOPED_FULL, "memory_unit"), "full-without-unit"),
    case("scoped-memory-unit", {**SCOPED_FULL, "format": "ids_only"}, "ids-only-with-unit"),
    case("scoped-memory-unit", {**SCOPED_IDS, "format": "full"}, "full-with-id-only"),
    case("scoped-memory-unit", {**SCOPED_IDS, "memory_unit": UNIT}, "ids-only-plus-unit"),
    case("scoped-memory-unit", drop(SCOPED_IDS, "epoch"), "ids-only-without-epoch"),
    case("scoped-memory-unit", {**SCOPED_FULL, "relevance_score": 1.2}, "score-1.2"),
    case("scoped-memory-unit", {**SCOPED_FULL, "relevance_score": -0.1}, "score-negative"),
    case("scoped-memory-unit", {**SCOPED_FULL, "relevance_reason": ""}, "reason-empty"),
    case("scoped-memory-unit", drop(SCOPED_FULL, "relevance_reason"), "reason-missing"),
    case("scoped-memory-unit", {**SCOPED_FULL, "format": "compact"}, "format"),
    case("scoped-memory-unit", put(SCOPED_FULL, "memory_unit.status", "gone"), "bad-unit"),
    # register.request
    case("register.request", {"id": "a"}, "missing-role"),
    case("register.request", {"role": "r"}, "missing-id"),
    case("register.request", {"id": "a b", "role": "r"}, "bad-id"),
    case("register.request", {"id": "a", "role": " \t"}, "role-blank"),
    case("register.request", {"id": "a", "role": "r", "interests": "x"}, "interests-string"),
    case(
        "register.request",
        {"id": "a", "role": "r", "required_operations": ["R"] * 33},
        "required-ops-33",
    ),
    case(
        "register.request",
        {"id": "a", "role": "r", "required_operations": [""]},
        "required-op-empty",
    ),
    case(
        "register.request",
        {"id": "a", "role": "r", "required_operations": ["R" * 65]},
        "required-op-65",
    ),
    case("register.request", {"id": "a", "role": "r", "status": "working"}, "extra-property"),
    case("register.request", {"id": "a", "role": "r", "current_task_id": ""}, "task-empty"),
    # deregister.request
    case("deregister.request", {}, "missing"),
    case("deregister.request", {"agent_id": "a", "force": True}, "extra-property"),
    case("deregister.request", {"agent_id": "a b"}, "bad-id"),
    # record.request
    case("record.request", put(RECORD, "confidence.score", 1.5), "confidence-1.5"),
    case("record.request", put(RECORD, "confidence.score", -0.01), "confidence-negative"),
    case("record.request", put(RECORD, "confidence.score", True), "confidence-bool"),
    case("record.request", put(RECORD, "confidence.score", "0.5"), "confidence-string"),
    case("record.request", put(RECORD, "confidence.score", None), "confidence-null"),
    case("record.request", drop(RECORD, "confidence"), "committed-without-confidence"),
    case("record.request", drop(drop(RECORD, "confidence"), "mode"), "default-without-confidence"),
    case("record.request", drop(RECORD, "confidence.score"), "committed-without-score"),
    case("record.request", drop(RECORD, "confidence.reasoning"), "committed-without-reasoning"),
    case("record.request", put(RECORD, "confidence.reasoning", "  "), "reasoning-blank"),
    case("record.request", put(RECORD, "confidence", None), "confidence-null-object"),
    case("record.request", {**DRAFT, "confidence": {"score": 1.5}}, "draft-confidence-1.5"),
    case("record.request", {**DRAFT, "confidence": {"score": 0.5, "extra": 1}}, "draft-conf-extra"),
    case("record.request", put(RECORD, "type", "rumor"), "unknown-type"),
    case("record.request", drop(RECORD, "type"), "missing-type"),
    case("record.request", put(RECORD, "type", None), "type-null"),
    case("record.request", put(RECORD, "mode", "final"), "unknown-mode"),
    case("record.request", drop(RECORD, "intent"), "missing-intent"),
    case("record.request", put(RECORD, "intent", {}), "intent-empty"),
    case("record.request", put(RECORD, "intent", "because"), "intent-string"),
    case("record.request", put(RECORD, "intent.purpose", ""), "purpose-empty"),
    case("record.request", put(RECORD, "intent.purpose", " \n\t"), "purpose-blank"),
    case("record.request", put(RECORD, "intent.purpose", "p" * 4097), "purpose-4097"),
    case("record.request", put(RECORD, "intent.task_id", ""), "task-empty"),
    case("record.request", put(RECORD, "intent.why", "x"), "intent-extra"),
    case("record.request", drop(RECORD, "content"), "missing-content"),
    case("record.request", put(RECORD, "content", ""), "content-empty"),
    case("record.request", put(RECORD, "content", "  \n "), "content-blank"),
    case("record.request", put(RECORD, "content", "c" * 65537), "content-65537"),
    case("record.request", put(RECORD, "content", 42), "content-number"),
    case("record.request", {**RECORD, "id": "mem-mine"}, "agent-set-id"),
    case("record.request", {**RECORD, "epoch": 5}, "agent-set-epoch"),
    case("record.request", {**RECORD, "source": {"agent_id": "a"}}, "agent-set-source"),
    case("record.request", {**RECORD, "status": "active"}, "agent-set-status"),
    case("record.request", {**RECORD, "tags": ["x"]}, "extra-property"),
    case(
        "record.request",
        {**RECORD, "relations": [{"type": "informs", "target_id": "m"}] * 65},
        "relations-65",
    ),
    case(
        "record.request",
        {**RECORD, "relations": [{"type": "refutes", "target_id": "m"}]},
        "relation-type",
    ),
    case(
        "record.request",
        {**RECORD, "relations": {"type": "informs", "target_id": "m"}},
        "relations-object",
    ),
    case("record.request", put(RECORD, "confidence.evidence", ["e"] * 65), "evidence-65"),
    case("record.request", put(RECORD, "confidence.assumptions", ["a" * 4097]), "assumption-4097"),
    case("record.request", put(RECORD, "confidence.evidence", [1]), "evidence-number"),
    # attune.request
    case("attune.request", {}, "missing-scope"),
    case("attune.request", {"scope": {"role": "r"}}, "scope-missing-max-units"),
    case("attune.request", {"scope": {"role": "r", "max_units": 1001}}, "max-units-1001"),
    case("attune.request", {"scope": {"role": "r", "max_units": 5}, "since_epoch": -1}, "since--1"),
    case(
        "attune.request",
        {"scope": {"role": "r", "max_units": 5}, "since_epoch": 1.5},
        "since-fraction",
    ),
    case("attune.request", {"scope": {"role": "r", "max_units": 5}, "format": "brief"}, "format"),
    case(
        "attune.request",
        {"scope": {"role": "r", "max_units": 5}, "context_hint": "h" * 4097},
        "hint-4097",
    ),
    case(
        "attune.request", {"scope": {"role": "r", "max_units": 5}, "query": "x"}, "extra-property"
    ),
    # detect.request
    case("detect.request", {}, "missing-mode"),
    case("detect.request", {"mode": "check"}, "check-without-target"),
    case("detect.request", {"mode": "check", "target_id": None}, "check-target-null"),
    case("detect.request", {"mode": "watch"}, "unknown-mode"),
    case("detect.request", {"mode": "list", "target_id": ""}, "target-empty"),
    case("detect.request", {"mode": "list", "filter": {"status": ["open"]}}, "filter-status"),
    case("detect.request", {"mode": "list", "filter": {"types": ["moral"]}}, "filter-type"),
    case(
        "detect.request", {"mode": "list", "filter": {"involving_agents": ["a b"]}}, "filter-agent"
    ),
    case("detect.request", {"mode": "list", "filter": {"units": ["m"]}}, "filter-extra"),
    case("detect.request", {"mode": "list", "filter": {"status": "detected"}}, "filter-string"),
    case("detect.request", {"mode": "list", "page": 5}, "extra-property"),
    case("detect.request", {"mode": "list", "limit": 0}, "limit-0"),
    case("detect.request", {"mode": "list", "limit": 1001}, "limit-1001"),
    case("detect.request", {"mode": "list", "after": ""}, "after-empty"),
    case(
        "detect.request",
        {"mode": "list", "filter": {"status": ["detected"] * 65}},
        "filter-65-items",
    ),
    # register.response
    case(
        "register.response",
        {
            "status": "rejected",
            "agent": AGENT,
            "field_capabilities": CAPABILITIES,
            "rejection_reason": "no",
            "token": TOKEN,
            "epoch": 1,
        },
        "rejected-as-200",
    ),
    case(
        "register.response",
        {
            "status": "registered",
            "agent": AGENT,
            "field_capabilities": CAPABILITIES,
            "rejection_reason": None,
            "epoch": 1,
        },
        "missing-token",
    ),
    case(
        "register.response",
        {
            "status": "registered",
            "agent": AGENT,
            "field_capabilities": CAPABILITIES,
            "rejection_reason": None,
            "token": "short",
            "epoch": 1,
        },
        "short-token",
    ),
    case(
        "register.response",
        {
            "status": "registered",
            "agent": AGENT,
            "field_capabilities": CAPABILITIES,
            "rejection_reason": None,
            "token": TOKEN[:-2] + " x",
            "epoch": 1,
        },
        "token-space",
    ),
    case(
        "register.response",
        {
            "status": "registered",
            "agent": AGENT,
            "field_capabilities": CAPABILITIES,
            "rejection_reason": None,
            "token": TOKEN,
        },
        "missing-epoch",
    ),
    # deregister.response
    case(
        "deregister.response",
        {
            "status": "not_found",
            "cleanup": {"units_orphaned": 0, "tasks_reassigned": 0},
            "epoch": 2,
        },
        "not-found-is-an-error",
    ),
    case(
        "deregister.response",
        {"status": "ok", "cleanup": {"units_orphaned": -1, "tasks_reassigned": 0}, "epoch": 2},
        "negative-count",
    ),
    case(
        "deregister.response",
        {"status": "ok", "cleanup": {"units_orphaned": 0}, "epoch": 2},
        "missing-tasks",
    ),
    case("deregister.response", {"status": "ok", "epoch": 2}, "missing-cleanup"),
    # record.response
    case(
        "record.response",
        {
            "status": "rejected",
            "memory_unit_id": "m",
            "epoch": 5,
            "conflicts_detected": [],
            "rejection_reason": "x",
        },
        "rejected",
    ),
    case(
        "record.response",
        {"status": "accepted", "epoch": 5, "conflicts_detected": [], "rejection_reason": None},
        "missing-id",
    ),
    case(
        "record.response",
        {
            "status": "accepted",
            "memory_unit_id": "m",
            "epoch": -1,
            "conflicts_detected": [],
            "rejection_reason": None,
        },
        "epoch--1",
    ),
    case(
        "record.response",
        {
            "status": "accepted",
            "memory_unit_id": "m",
            "epoch": 5,
            "conflicts_detected": [],
            "rejection_reason": None,
            "warning": "x",
        },
        "extra-property",
    ),
    # attune.response
    case("attune.response", {**ATTUNE_RESPONSE, "status": "error"}, "status"),
    case("attune.response", {**ATTUNE_RESPONSE, "conflicts": [CONFLICT] * 101}, "conflicts-101"),
    case(
        "attune.response", {**ATTUNE_RESPONSE, "conflicts": [drop(CONFLICT, "id")]}, "bad-conflict"
    ),
    case(
        "attune.response",
        drop(ATTUNE_RESPONSE, "context_budget.tokens_used"),
        "budget-missing-tokens-used",
    ),
    case(
        "attune.response",
        put(ATTUNE_RESPONSE, "context_budget.units_returned", -1),
        "negative-count",
    ),
    case("attune.response", put(ATTUNE_RESPONSE, "record.0.relevance_score", 2), "bad-item"),
    case(
        "attune.response",
        put(ATTUNE_RESPONSE, "context_budget.limited_by", "max_bytes"),
        "limited-by-unknown",
    ),
    case("attune.response", drop(ATTUNE_RESPONSE, "epoch"), "missing-epoch"),
    *MERGE_INVALID,
    # detect.response
    case("detect.response", {"status": "ok", "conflicts": [], "epoch": 3}, "missing-coverage"),
    case(
        "detect.response",
        {"status": "ok", "conflicts": [], "scan_coverage": {"units_scanned": 0}, "epoch": 3},
        "coverage-incomplete",
    ),
    # field-status.response
    case(
        "field-status.response",
        put(FIELD_STATUS, "counts.memory_units", {"deleted": 1}),
        "unknown-unit-status",
    ),
    case(
        "field-status.response",
        put(FIELD_STATUS, "counts.memory_units", {"active": -1}),
        "negative-unit-count",
    ),
    case(
        "field-status.response",
        drop(FIELD_STATUS, "counts.conflicts.unresolved"),
        "conflicts-incomplete",
    ),
    case("field-status.response", put(FIELD_STATUS, "uptime_seconds", -1), "uptime--1"),
    case("field-status.response", put(FIELD_STATUS, "log.path", "/data"), "log-extra"),
    case("field-status.response", drop(FIELD_STATUS, "snapshot"), "snapshot-missing"),
    case(
        "field-status.response",
        put(FIELD_STATUS, "snapshot", {**SNAPSHOT, "path": "/data/snapshots"}),
        "snapshot-extra",
    ),
    case(
        "field-status.response",
        put(FIELD_STATUS, "snapshot", drop(SNAPSHOT, "size")),
        "snapshot-incomplete",
    ),
    case(
        "field-status.response",
        put(FIELD_STATUS, "log.refusing", {"code": "INTERNAL_ERROR", "message": "x"}),
        "refusing-other-code",
    ),
    case("field-status.response", drop(FIELD_STATUS, "writer"), "missing-writer"),
    case(
        "field-status.response",
        {**FIELD_STATUS, "embedding": {"after_commit": True, "queued": -1, "held_entries": 0}},
        "negative-embedding-queue",
    ),
    case(
        "field-status.response",
        put(FIELD_STATUS, "writer.admission.write.mode", "refusing"),
        "admission-mode",
    ),
    case("field-status.response", put(FIELD_STATUS, "limits", {"x": 0.5}), "limit-float"),
    case("field-status.response", put(FIELD_STATUS, "protocol_version", "0.2.0"), "version"),
    case("field-status.response", drop(FIELD_STATUS, "field_id"), "missing-field-id"),
    # agents.response / conflicts.response
    case(
        "agents.response",
        {"status": "ok", "agents": [drop(AGENT, "role")], "epoch": 4},
        "bad-agent",
    ),
    case("agents.response", {"status": "ok", "agents": [AGENT], "next": None}, "missing-epoch"),
    case("agents.response", {"status": "ok", "agents": [AGENT], "epoch": 4}, "missing-next"),
    case(
        "agents.response",
        {"status": "ok", "agents": [AGENT] * 1001, "next": None, "epoch": 4},
        "1001-agents",
    ),
    case(
        "conflicts.response",
        {"status": "ok", "conflicts": [{**CONFLICT, "type": "x"}], "next": None, "epoch": 4},
        "bad-conflict",
    ),
    case(
        "conflicts.response",
        {"status": "ok", "conflicts": [], "epoch": 4, "next": None, "cursor": "c"},
        "extra-property",
    ),
    # subscription
    case("subscription", drop(SUBSCRIPTION, "created_epoch"), "missing-created-epoch"),
    case("subscription", {**SUBSCRIPTION, "status": "paused"}, "status"),
    case("subscription", {**SUBSCRIPTION, "events": []}, "no-events"),
    case("subscription", {**SUBSCRIPTION, "events": ["memory.nope"]}, "unknown-event"),
    case(
        "subscription",
        {**SUBSCRIPTION, "events": ["memory.recorded", "memory.recorded"]},
        "duplicate-events",
    ),
    case("subscription", {**SUBSCRIPTION, "min_relevance": None}, "relevance-null"),
    case("subscription", {**SUBSCRIPTION, "debounce_ms": None}, "debounce-null"),
    case("subscription", {**SUBSCRIPTION, "debounce_ms": 3600001}, "debounce-too-long"),
    case("subscription", {**CANCELLED, "cancel_reason": "unsubscribed"}, "internal-field"),
    case("subscription", {**SUBSCRIPTION, "agent_id": "a b"}, "agent-id"),
    case("subscription", {**SUBSCRIPTION, "id": ""}, "empty-id"),
    # notification
    case("notification", drop(NOTIFICATION, "cursor"), "missing-cursor"),
    case("notification", drop(NOTIFICATION, "folded"), "missing-folded"),
    case("notification", {**NOTIFICATION, "relevance_score": 1.2}, "relevance-1.2"),
    case("notification", {**NOTIFICATION, "folded": -1}, "folded--1"),
    case("notification", {**NOTIFICATION, "requires_action": "yes"}, "requires-action-string"),
    case("notification", {**NOTIFICATION, "event": "memory.deleted"}, "unknown-event"),
    case("notification", {**NOTIFICATION, "cursor": "57"}, "cursor-without-tag"),
    case("notification", {**NOTIFICATION, "cursor": "4c3c3355a2f4-x"}, "cursor-not-position"),
    case("notification", put(NOTIFICATION, "entity.type", "unit"), "entity-type"),
    case("notification", put(NOTIFICATION, "entity.name", "x"), "entity-extra"),
    case("notification", {**NOTIFICATION, "agent_id": ""}, "agent-id-empty"),
    case("notification", {**NOTIFICATION, "relevance_reason": ""}, "reason-empty"),
    case("notification", {**NOTIFICATION, "memory_unit_id": UNIT["id"]}, "conflict-with-unit"),
    case("notification", {**NOTIFICATION, "conflict_id": None}, "conflict-without-id"),
    case("notification", {**RECORDED, "memory_unit_id": None}, "recorded-without-unit"),
    case("notification", {**RECORDED, "conflict_id": CONFLICT["id"]}, "recorded-with-conflict"),
    case("notification", {**CONTESTED, "conflict_id": None}, "contested-without-conflict"),
    case("notification", {**RECORDED, "entity": NOTIFICATION["entity"]}, "recorded-entity"),
    case("notification", {**JOINED, "entity": RECORDED["entity"]}, "joined-entity"),
    case("notification", {**JOINED, "detail": FAILED["detail"]}, "joined-with-detail"),
    case("notification", drop(FAILED, "detail"), "failed-without-detail"),
    case("notification", {**RECORDED, "window": drop(WINDOW, "end")}, "window-without-end"),
    case("notification", {**RECORDED, "window": {**WINDOW, "k": 1}}, "window-extra"),
    case(
        "notification",
        {**RECORDED, "window": {**WINDOW, "start": "2026-03-01T10:30:00Z"}},
        "window-start-not-milliseconds",
    ),
    case("notification", {**RECORDED, "window": 500}, "window-number"),
    case("notification", drop(FAILED, "detail.released_tasks"), "failed-without-tasks"),
    case(
        "notification",
        put(FAILED, "detail.agent", {**AGENT, "status": "failed"}),
        "failed-agent-without-reason",
    ),
    case("notification", {**NOTIFICATION, "unit": UNIT}, "extra-property"),
    # ws-frame
    case("ws-frame", {"type": "ping", "data": {}}, "unknown-type"),
    case("ws-frame", {"type": "notification", "data": drop(NOTIFICATION, "event")}, "bad-data"),
    case("ws-frame", {"type": "notification"}, "missing-data"),
    case("ws-frame", NOTIFICATION, "unwrapped-notification"),
    case(
        "ws-frame",
        {"type": "notification", "data": NOTIFICATION, "cursor": CURSOR},
        "extra-property",
    ),
    case(
        "ws-frame",
        {"type": "response", "id": "m", "status": 404, "body": {"status": "ok"}},
        "error-status-without-error",
    ),
    case("ws-frame", {"type": "response", "id": "m", "body": LISTED}, "response-missing-status"),
    case("ws-frame", {"type": "response", "status": 200, "body": LISTED}, "response-missing-id"),
    case(
        "ws-frame",
        {"type": "resume", "data": {**RESUME, "recovered": False}},
        "unrecovered-without-reason",
    ),
    case(
        "ws-frame", {"type": "resume", "data": {**RESUME, "reason": "x"}}, "recovered-with-reason"
    ),
    case("ws-frame", {"type": "resume", "data": drop(RESUME, "from")}, "resume-missing-from"),
    case("ws-frame", {"type": "live", "data": drop(LIVE, "replayed")}, "live-missing-replayed"),
    case("ws-frame", {"type": "live", "data": {**LIVE, "replayed": -1}}, "live-negative"),
    case("ws-frame", {"type": "end", "data": drop(END, "cursor")}, "end-missing-cursor"),
    case(
        "ws-frame",
        {"type": "overflow", "data": {**OVERFLOW, "cursors": {SUB_ID: 57}}},
        "overflow-cursor-number",
    ),
    case(
        "ws-frame", {"type": "overflow", "data": drop(OVERFLOW, "cursors")}, "overflow-no-cursors"
    ),
    case("ws-frame", {"type": "error", "data": drop(ERROR, "code")}, "error-missing-code"),
    # subscribe.request
    case("subscribe.request", {}, "missing-action"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.delivery", {"type": "mail"}), "mail"),
    case(
        "subscribe.request", put(SUBSCRIBE, "subscription.delivery", {"type": "webhook"}), "no-url"
    ),
    case(
        "subscribe.request",
        put(SUBSCRIBE, "subscription.delivery", {"type": "stream", "url": "https://h.example"}),
        "stream-url",
    ),
    case(
        "subscribe.request",
        put(
            SUBSCRIBE,
            "subscription.delivery",
            {"type": "webhook", "url": "https://h.example", "secret": "hunter2"},
        ),
        "secret-form",
    ),
    case(
        "subscribe.request",
        put(SUBSCRIBE, "subscription.delivery", {"type": "webhook", "url": "https://h", "x": 1}),
        "delivery-extra",
    ),
    case("subscribe.request", {"action": "resume"}, "resume-without-id"),
    case("subscribe.request", {**SUBSCRIBE, "action": "watch"}, "unknown-action"),
    case("subscribe.request", {**SUBSCRIBE, "action": "SUBSCRIBE"}, "action-case"),
    case("subscribe.request", {"action": "subscribe"}, "subscribe-without-subscription"),
    case("subscribe.request", {"action": "subscribe", "subscription": None}, "subscribe-null"),
    case("subscribe.request", {"action": "subscribe", "subscription": {}}, "missing-events"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.events", []), "no-events"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.events", None), "events-null"),
    case(
        "subscribe.request",
        put(SUBSCRIBE, "subscription.events", "memory.recorded"),
        "events-string",
    ),
    case("subscribe.request", put(SUBSCRIBE, "subscription.events", ["memory.nope"]), "unknown"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.events", [""]), "empty-event"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.events", [7]), "event-number"),
    case(
        "subscribe.request",
        put(SUBSCRIBE, "subscription.events", ["memory.recorded"] * 65),
        "65-events",
    ),
    case("subscribe.request", put(SUBSCRIBE, "subscription.id", SUB_ID), "client-chosen-id"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.id", ""), "empty-id"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.min_relevance", 1.5), "relevance-1.5"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.min_relevance", -0.1), "relevance-neg"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.min_relevance", True), "relevance-bool"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.min_relevance", "0.5"), "relevance-str"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.debounce_ms", 3600001), "debounce-max"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.debounce_ms", -1), "debounce--1"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.debounce_ms", 1.5), "debounce-1.5"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.debounce_ms", "2s"), "debounce-str"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.include_own", None), "own-null"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.include_own", "yes"), "own-string"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.scope", {}), "subscription-extra"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.filter", {}), "filter-object"),
    case("subscribe.request", put(SUBSCRIBE, "subscription.filter", "x" * 2049), "filter-2049"),
    case(
        "subscribe.request", put(SUBSCRIBE, "subscription.bindings", {"repo": ["a"]}), "bind-name"
    ),
    case(
        "subscribe.request", put(SUBSCRIBE, "subscription.bindings", {"task_id": "t"}), "bind-str"
    ),
    case(
        "subscribe.request",
        put(SUBSCRIBE, "subscription.bindings", {"task_id": ["t"] * 101}),
        "bind-101",
    ),
    case("subscribe.request", put(SUBSCRIBE, "subscription.bindings", {"task_id": [""]}), "bind-0"),
    case("filter-context", {"event": FILTER_EVENT, "subscriber": SUBSCRIBER}, "no-parameters"),
    case("filter-context", put(FILTER_CONTEXT, "parameters.repo", {}), "unknown-list"),
    case("filter-context", put(FILTER_CONTEXT, "parameters.task_id.t", 1), "not-true"),
    case("filter-context", put(FILTER_CONTEXT, "event.entity.type", "thing"), "entity-type"),
    case("filter-context", put(FILTER_CONTEXT, "subscriber.current_task", 3), "task-number"),
    case("subscribe.request", {**SUBSCRIBE, "agent_id": "a"}, "extra-property"),
    case("subscribe.request", {"action": "unsubscribe"}, "unsubscribe-without-subscription"),
    case("subscribe.request", {"action": "unsubscribe", "subscription": None}, "unsubscribe-null"),
    case("subscribe.request", {"action": "unsubscribe", "subscription": {}}, "unsubscribe-no-id"),
    case("subscribe.request", put(UNSUBSCRIBE, "subscription.id", ""), "unsubscribe-empty-id"),
    case("subscribe.request", put(UNSUBSCRIBE, "subscription.id", None), "unsubscribe-null-id"),
    case("subscribe.request", put(UNSUBSCRIBE, "subscription.id", "x" * 257), "unsubscribe-257"),
    case("subscribe.request", put(UNSUBSCRIBE, "subscription.id", 5), "unsubscribe-id-number"),
    case("subscribe.request", put(UNSUBSCRIBE, "subscription.why", "x"), "unsubscribe-extra"),
    case("subscribe.request", {"action": "list", "subscription": "x"}, "list-string"),
    case("subscribe.request", {"action": "list", "subscription": []}, "list-array"),
    case("subscribe.request", {"action": "list", "subscription": {"x": 1}}, "list-extra"),
    # subscribe.response
    case("subscribe.response", S67_SUBSCRIBE_RESPONSE, "spec-minimal"),
    case("subscribe.response", drop(SUBSCRIBED, "cursor"), "missing-cursor"),
    case("subscribe.response", {**SUBSCRIBED, "cursor": None}, "cursor-null"),
    case("subscribe.response", {**SUBSCRIBED, "ws_url": "/v1/ws"}, "relative-ws-url"),
    case(
        "subscribe.response",
        {**SUBSCRIBED, "sse_url": f"/v1/subscriptions/{SUB_ID}/events"},
        "relative-sse-url",
    ),
    case("subscribe.response", {**SUBSCRIBED, "ws_url": "http://h/v1/ws"}, "ws-url-scheme"),
    case("subscribe.response", {**SUBSCRIBED, "subscription": CANCELLED}, "subscribed-cancelled"),
    case("subscribe.response", {**SUBSCRIBED, "status": "subscribed"}, "status"),
    case("subscribe.response", {**SUBSCRIBED, "token": TOKEN}, "extra-property"),
    case("subscribe.response", drop(SUBSCRIBED, "epoch"), "missing-epoch"),
    case(
        "subscribe.response", {**UNSUBSCRIBED, "subscription": SUBSCRIPTION}, "unsubscribed-active"
    ),
    case("subscribe.response", drop(UNSUBSCRIBED, "subscription"), "unsubscribed-bare"),
    case("subscribe.response", {**LISTED, "subscriptions": [CANCELLED]}, "list-cancelled"),
    case("subscribe.response", {**LISTED, "subscriptions": [SUBSCRIPTION] * 101}, "list-101"),
    case("subscribe.response", drop(LISTED, "epoch"), "list-missing-epoch"),
    case(
        "subscribe.response",
        {**LISTED, "subscriptions": [{**SUBSCRIPTION, "cancel_reason": None}]},
        "list-internal-field",
    ),
]

# -- REPLAY / COMPACT

REPLAY = {"target_type": "decision", "target_id": "mem-1", "depth": "full_trace"}
REPLAY_EVENT = {
    "epoch": 7,
    "event_type": "memory.recorded",
    "agent_id": "agent-1",
    "description": "agent-1 recorded decision mem-1",
    "memory_unit_id": "mem-1",
    "task_id": None,
}
REPLAYED = {
    "status": "ok",
    "timeline": [REPLAY_EVENT, {**REPLAY_EVENT, "agent_id": "field", "memory_unit_id": None}],
    "summary": "decision mem-1 by agent-1",
    "agents_involved": ["agent-1"],
    "total_events": 2,
    "epoch": 9,
}
COMPACT = {
    "strategy": "archive",
    "filter": {"max_age_epochs": 10, "session_id": None, "types": [], "status": []},
}
COMPACTED = {
    "status": "ok",
    "units_affected": 3,
    "synthesis_units_created": 0,
    "storage_reclaimed_bytes": 0,
    "units_remaining": 0,
    "units_skipped": {"in_conflict": 0, "authority": 0},
    "epoch": 12,
}
FEEDBACK = {
    "items": [
        {"memory_unit_id": "mem-1", "useful": True},
        {"memory_unit_id": "mem-2", "useful": False},
    ]
}
FEEDBACK_ANSWER = {
    "status": "ok",
    "judged": 2,
    "useful_total": 5,
    "not_useful_total": 3,
    "epoch": 12,
}
VALID += [
    case("replay.request", REPLAY, "decision"),
    case("replay.request", {**REPLAY, "target_type": "session", "depth": "summary"}, "session"),
    case("replay.response", REPLAYED, "full"),
    case("replay.response", {**REPLAYED, "timeline": [], "total_events": 0}, "empty"),
    case("compact.request", COMPACT, "age"),
    case("compact.request", {"strategy": "purge", "filter": {"session_id": "s-1"}}, "session"),
    case("compact.request", {"strategy": "summarize", "filter": {"types": ["finding"]}}, "types"),
    case("compact.request", {"strategy": "archive", "filter": {"status": ["archived"]}}, "status"),
    case("compact.response", COMPACTED, "archive"),
    case("compact.response", {**COMPACTED, "storage_reclaimed_bytes": None}, "null-bytes"),
    case("scope", {"role": "r", "max_units": 1, "include_archived": True}, "include-archived"),
    case("memory-unit", {**UNIT, "status": "archived"}, "archived"),
    case("feedback.request", FEEDBACK, "basic"),
    case("feedback.request", {"items": FEEDBACK["items"] * 32}, "64-items"),
    case("feedback.response", FEEDBACK_ANSWER, "basic"),
]
INVALID += [
    case("replay.request", drop(REPLAY, "depth"), "no-depth"),
    case("replay.request", {**REPLAY, "target_type": "agent"}, "target-type"),
    case("replay.request", {**REPLAY, "depth": "deep"}, "depth"),
    case("replay.request", {**REPLAY, "target_id": ""}, "empty-id"),
    case("replay.request", {**REPLAY, "extra": 1}, "extra"),
    case("replay.response", drop(REPLAYED, "summary"), "no-summary"),
    case("replay.response", {**REPLAYED, "timeline": [drop(REPLAY_EVENT, "task_id")]}, "event"),
    case("replay.response", {**REPLAYED, "agents_involved": ["a", "a"]}, "duplicate-agents"),
    case("compact.request", {"strategy": "archive"}, "no-filter"),
    case("compact.request", {"strategy": "archive", "filter": {}}, "empty-filter"),
    case(
        "compact.request",
        {"strategy": "archive", "filter": {"max_age_epochs": None, "types": []}},
        "nothing-named",
    ),
    case("compact.request", {**COMPACT, "strategy": "delete"}, "strategy"),
    case("compact.request", put(COMPACT, "filter.max_age_epochs", -1), "negative-age"),
    case("compact.request", put(COMPACT, "filter.types", ["rumour"]), "type"),
    case("compact.request", put(COMPACT, "filter.status", ["purged"]), "status"),
    case("compact.response", drop(COMPACTED, "units_remaining"), "no-remaining"),
    case("compact.response", drop(COMPACTED, "units_skipped"), "no-skipped"),
    case("compact.response", drop(COMPACTED, "units_skipped.authority"), "skipped-no-authority"),
    case("compact.response", put(COMPACTED, "units_skipped.in_conflict", -1), "skipped-negative"),
    case("compact.response", {**COMPACTED, "units_affected": -1}, "negative"),
    case("scope", {"role": "r", "max_units": 1, "include_archived": 1}, "include-archived"),
    case("memory-unit", {**UNIT, "status": "purged"}, "purged"),
    case("feedback.request", {"items": []}, "no-items"),
    case("feedback.request", {"items": FEEDBACK["items"] * 33}, "66-items"),
    case("feedback.request", {"items": [{"memory_unit_id": "mem-1"}]}, "no-useful"),
    case("feedback.request", {"items": [{"memory_unit_id": "m", "useful": 1}]}, "useful-int"),
    case("feedback.request", {**FEEDBACK, "why": "x"}, "extra"),
    case("feedback.response", {**FEEDBACK_ANSWER, "judged": 0}, "none-judged"),
    case("feedback.response", drop(FEEDBACK_ANSWER, "useful_total"), "no-total"),
]
VALID += [
    case("source", SOURCE, "basic"),
    case("source", {**SOURCE, "filter": None, "secret": "whsec_x"}, "made-secret"),
    case("source", {**SOURCE, "counts": {"accepted": 1, "filtered": 0, "refused": 2}}, "counts"),
    case("source.request", SOURCE_REQUEST, "basic"),
    case("source.request", drop(SOURCE_REQUEST, "secret"), "no-secret"),
    case(
        "source.response", {"status": "ok", "source": SOURCE, "replaced": False, "epoch": 3}, "ok"
    ),
    case("sources.response", {"status": "ok", "sources": [SOURCE], "epoch": 3}, "ok"),
    case("source-remove.response", {"status": "ok", "name": "github", "epoch": 4}, "ok"),
    case(
        "source-event.response",
        {"status": "accepted", "memory_unit_id": "mem-1", "epoch": 5},
        "accepted",
    ),
    case("source-event.response", {"status": "filtered"}, "filtered"),
    case("memory-unit", {**UNIT, "payload": {"action": "opened"}}, "payload"),
]
INVALID += [
    case("source", {**SOURCE, "name": "GitHub"}, "name-case"),
    case("source", {**SOURCE, "scheme": "svix"}, "scheme"),
    case("source", put(SOURCE, "unit.content", " "), "blank-template"),
    case("source.request", {**SOURCE_REQUEST, "extra": 1}, "extra"),
    case("source.request", drop(SOURCE_REQUEST, "unit.content"), "no-content"),
    case("source.response", {"status": "ok", "source": SOURCE, "epoch": 3}, "no-replaced"),
    case("sources.response", {"status": "ok", "sources": [{}], "epoch": 3}, "empty-source"),
    case("source-remove.response", {"status": "ok", "name": "github"}, "no-epoch"),
    case("source-event.response", {"status": "accepted"}, "no-unit"),
    case("field-status.response", put(FIELD_STATUS, "sources.github.accepted", -1), "neg-count"),
    case("memory-unit", {**UNIT, "payload": [1]}, "payload-array"),
]
REGISTRATION_TOKEN = {
    "id": "regtok-0123456789abcdef0123",
    "uses": 5,
    "uses_left": 4,
    "expires_at": "2030-01-01T00:00:00.000Z",
    "expired": False,
    "authority": 4,
    "note": "pilot",
    "created_at": "2026-01-01T00:00:00.000Z",
}
ISSUED = {**REGISTRATION_TOKEN, "token": "fieldreg_" + "A" * 43}
VALID += [
    case("registration-token", REGISTRATION_TOKEN, "basic"),
    case("registration-token.request", {}, "empty"),
    case("registration-token.request", {"uses": 3, "expires_at": None, "note": None}, "basic"),
    case(
        "registration-token.response",
        {"status": "ok", "registration_token": ISSUED, "epoch": 3},
        "ok",
    ),
    case(
        "registration-tokens.response",
        {
            "status": "ok",
            "registration": "token",
            "registration_tokens": [REGISTRATION_TOKEN],
            "epoch": 3,
        },  # fmt: skip
        "ok",
    ),
    case(
        "registration-token-revoke.response", {"status": "ok", "id": ISSUED["id"], "epoch": 4}, "ok"
    ),
    case("register.request", {"id": "a", "role": "r", "registration_token": "fieldreg_x"}, "rt"),
]
INVALID += [
    case("registration-token", {**REGISTRATION_TOKEN, "token": "fieldreg_x"}, "secret-shown"),
    case("registration-token", {**REGISTRATION_TOKEN, "uses_left": 0}, "used-up"),
    case("registration-token.request", {"uses": 0}, "no-uses"),
    case("registration-token.request", {"secret": "mine"}, "extra"),
    case(
        "registration-token.response",
        {"status": "ok", "registration_token": REGISTRATION_TOKEN, "epoch": 3},
        "no-secret",
    ),
    case(
        "registration-tokens.response",
        {"status": "ok", "registration": "invite", "registration_tokens": [], "epoch": 3},
        "policy",
    ),
    case(
        "registration-token-revoke.response", {"status": "ok", "id": "regtok-1", "epoch": 4}, "id"
    ),
]
VALID += coordination_cases.VALID + rap_cases.VALID + console_cases.VALID + operator_cases.VALID
INVALID += (
    coordination_cases.INVALID + rap_cases.INVALID + console_cases.INVALID + operator_cases.INVALID
)


@pytest.mark.parametrize(("name", "instance"), VALID)
def test_valid(name: str, instance: Any) -> None:
    assert_valid(name, instance)


@pytest.mark.parametrize(("name", "instance"), INVALID)
def test_invalid(name: str, instance: Any) -> None:
    assert not is_valid(name, instance), f"unexpectedly valid {name}: {instance!r}"[:500]


def test_every_schema_has_valid_and_invalid_cases() -> None:
    valid = {p.values[0] for p in VALID}
    invalid = {p.values[0] for p in INVALID}
    assert valid == set(ALL)
    assert invalid == set(ALL)


def test_errors_helper_reports_paths() -> None:
    problems = errors("record.request", put(RECORD, "confidence.score", 1.5))
    assert problems and problems[0].startswith("confidence/score:")
    with pytest.raises(AssertionError, match="record.request"):
        assert_valid("record.request", {})
    with pytest.raises(KeyError):
        validator("no-such-schema")
    assert validator("envelope.json") is validator("envelope")
    assert validator(URN_PREFIX + "envelope") is validator("envelope")


# --------------------------------------------------------------------------- properties


@given(st.floats(allow_nan=False))
def test_confidence_score_valid_iff_in_unit_interval(score: float) -> None:
    assert is_valid("record.request", put(RECORD, "confidence.score", score)) == (
        0.0 <= score <= 1.0
    )


@given(st.integers())
def test_epoch_valid_iff_in_range(epoch: int) -> None:
    assert is_valid("envelope", put(A1_REGISTER, "epoch", epoch)) == (0 <= epoch <= MAX_EPOCH)


@given(st.from_regex(AGENT_ID_RE, fullmatch=True))
def test_generated_agent_ids_are_valid(agent_id: str) -> None:
    assert is_valid("envelope", put(A1_REGISTER, "agent_id", agent_id))


@given(st.text(alphabet=st.sampled_from("aZ09._:@-/ \n\t\u00e9"), max_size=140))
def test_agent_id_valid_iff_fullmatch(agent_id: str) -> None:
    assert is_valid("deregister.request", {"agent_id": agent_id}) == bool(
        AGENT_ID_RE.fullmatch(agent_id)
    )


@given(st.text(max_size=140))
def test_role_valid_iff_length_and_not_blank(role: str) -> None:
    expected = 1 <= len(role) <= 128 and any(not c.isspace() for c in role)
    assert is_valid("scope", {"role": role, "max_units": 1}) == expected


# --------------------------------------------------------------------------- README

# The error table of the contract: code -> (HTTP status, recoverable).
ERROR_TABLE = {
    "INVALID_JSON": (400, "Yes"),
    "INVALID_ENVELOPE": (400, "Yes"),
    "INVALID_PAYLOAD": (422, "Yes"),
    "INVALID_FILTER": (422, "Yes"),
    "MISSING_INTENT": (422, "Yes"),
    "MISSING_CONFIDENCE": (422, "Yes"),
    "INVALID_CONFIDENCE": (422, "Yes"),
    "INVALID_TYPE": (422, "Yes"),
    "INVALID_EPOCH": (422, "Yes"),
    "UNSUPPORTED_OPERATION": (422, "No"),
    "UNAUTHENTICATED": (401, "Yes"),
    "AGENT_NOT_REGISTERED": (401, "Yes"),
    "FORBIDDEN": (403, "Yes"),
    "NOT_FOUND": (404, "No"),
    "UNIT_NOT_FOUND": (404, "No"),
    "CONFLICT_NOT_FOUND": (404, "No"),
    "SUBSCRIPTION_NOT_FOUND": (404, "No"),
    "TASK_NOT_FOUND": (404, "No"),
    "SESSION_NOT_FOUND": (404, "No"),
    "AGENT_NOT_FOUND": (404, "No"),
    "INSUFFICIENT_AUTHORITY": (403, "No"),
    "METHOD_NOT_ALLOWED": (405, "No"),
    "AGENT_ID_TAKEN": (409, "Yes"),
    "INVALID_TRANSITION": (409, "Yes"),
    "MERGE_FAILED": (409, "Yes"),
    "SUBSCRIPTION_LIMIT": (409, "Yes"),
    "PAYLOAD_TOO_LARGE": (413, "Yes"),
    "UNSUPPORTED_MEDIA_TYPE": (415, "Yes"),
    "STORAGE_FULL": (507, "Yes"),
    "EPOCH_OVERFLOW": (503, "No"),
    "OVERLOADED": (503, "Yes"),
    "INTERNAL_ERROR": (500, "No"),
    "REQUEST_TIMEOUT": (408, "Yes"),
    "TOO_MANY_CONNECTIONS": (429, "Yes"),
    "INVALID_HANDSHAKE": (400, "Yes"),
    "TOOLSET_CHANGED": (409, "Yes"),
    "LOG_UNAVAILABLE": (503, "Yes"),
    "REPLAY_TOO_LARGE": (422, "Yes"),
    "SOURCE_NOT_FOUND": (404, "No"),
    "SOURCE_LIMIT": (409, "Yes"),
    "INVALID_SIGNATURE": (401, "No"),
    "STALE_TIMESTAMP": (401, "No"),
    "INVALID_HTTP": (400, "Yes"),
    "MISDIRECTED_REQUEST": (421, "No"),
    "RATE_LIMITED": (429, "Yes"),
    "REGISTRATION_CLOSED": (403, "No"),
    "REGISTRATION_TOKEN_INVALID": (403, "No"),
    "REGISTRATION_TOKEN_LIMIT": (409, "Yes"),
    "AGENT_LIMIT": (409, "Yes"),
    "SUBSCRIPTION_NAME_TAKEN": (409, "No"),
}


def readme_error_rows() -> dict[str, tuple[int, str]]:
    rows = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\|\s*`([A-Z_]+)`\s*\|\s*(\d{3})\s*\|\s*(Yes|No)\b", line)
        if m:
            rows[m.group(1)] = (int(m.group(2)), m.group(3))
    return rows


def test_readme_indexes_every_schema() -> None:
    text = README.read_text(encoding="utf-8")
    for name in ALL:
        assert f"schemas/{name}.json" in text, name


def test_readme_error_table_matches_the_contract() -> None:
    rows = readme_error_rows()
    for code, expected in ERROR_TABLE.items():
        assert rows.get(code) == expected, code


def server_errors_module() -> Any:
    try:
        return importlib.import_module("field.contract.errors")
    except ImportError:
        path = SCHEMA_DIR.parent.parent / "field" / "errors.py"
        if not path.exists():
            pytest.skip("field/contract/errors.py not present")
        spec = importlib.util.spec_from_file_location("_field_errors_for_readme_check", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


def test_server_error_statuses_match_the_readme() -> None:
    errors_module = server_errors_module()
    for code, (status, _) in readme_error_rows().items():
        assert errors_module.HTTP_STATUS.get(code) == status, code


# Codes the spec defines for features this Field does not implement: never returned, and
# the README says so instead of listing them in the table.
UNRETURNED_CODES = {"ENRICHMENT_FAILED", "DETECTION_TIMEOUT"}


def test_readme_error_table_lists_every_code_the_server_returns() -> None:
    errors_module = server_errors_module()
    codes = {v for k, v in vars(errors_module.Code).items() if k.isupper()}
    assert codes == set(errors_module.HTTP_STATUS), "every code needs an HTTP status"
    assert set(readme_error_rows()) == codes - UNRETURNED_CODES
    assert set(ERROR_TABLE) == codes - UNRETURNED_CODES
    text = README.read_text(encoding="utf-8")
    for code in UNRETURNED_CODES:
        assert f"`{code}`" in text, code


def test_readme_states_subscribe_is_implemented() -> None:
    text = README.read_text(encoding="utf-8")
    assert "MERGE, SUBSCRIBE" not in text
    for heading in (
        "## SUBSCRIBE",
        "## Relevance of events",
        "## Push",
        "### Cursors",
        "### Debounce",
        "### WebSocket",
        "### Server-Sent Events",
        "### Resuming",
        "### Backpressure",
        "## Polling and pushing see the same events",
    ):
        assert f"\n{heading}\n" in text, heading
    for event in EVENTS:
        assert f"`{event}`" in text, event


# --------------------------------------------------------------------------- SUBSCRIBE vs server
# The schemas are the contract; these check that the server's SUBSCRIBE code produces and
# accepts exactly what they describe.


def test_subscription_events_match_the_server() -> None:
    events = pytest.importorskip("field.subscriptions.events")
    schema = load_schemas()["subscription"]["$defs"]["event"]
    assert schema["enum"] == EVENTS == list(events.SUBSCRIPTION_EVENTS)


def test_subscribe_limits_match_the_server() -> None:
    model = pytest.importorskip("field.contract.model")
    limits = model.Limits()
    schemas = load_schemas()
    assert schemas["subscription"]["$defs"]["debounce_ms"]["maximum"] == limits.max_debounce_ms
    listed = schemas["subscribe.response"]["oneOf"][2]["properties"]["subscriptions"]
    assert listed["maxItems"] == limits.max_subscriptions_per_agent


SUBSCRIBE_CASES = [p for p in VALID + INVALID if p.values[0] == "subscribe.request"]


@pytest.mark.parametrize(("name", "instance"), SUBSCRIBE_CASES)
def test_server_accepts_exactly_the_valid_subscribe_payloads(name: str, instance: Any) -> None:
    validation = pytest.importorskip("field.core.validation")
    events = pytest.importorskip("field.subscriptions.events")
    model = pytest.importorskip("field.contract.model")
    errors_module = server_errors_module()
    try:
        validation.subscribe_payload(
            copy.deepcopy(instance), model.Limits(), events.SUBSCRIPTION_EVENTS
        )
        accepted = True
    except errors_module.ValidationError:
        accepted = False
    assert accepted == is_valid(name, instance)


def _core_harness(**kwargs: Any) -> Any:
    core_util = pytest.importorskip("tests.core_util")
    return core_util.Harness(**kwargs)


def _subscribe(h: Any, agent_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """SUBSCRIBE through the core as the HTTP binding sends it: cursor set, URLs absolute."""
    web = pytest.importorskip("field.transports.web")
    envelope = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "msg-sub",
        "operation": "SUBSCRIBE",
        "agent_id": agent_id,
        "session_id": None,
        "epoch": 0,
        "payload": payload,
    }
    outcome = h.field.handle(envelope, token=h.tokens[agent_id], operation="SUBSCRIBE")
    h.entries.extend(outcome.entries)
    if outcome.on_durable is not None:
        outcome.on_durable([len(h.entries) - len(outcome.entries) + 1])
    response: dict[str, Any] = web.absolute_urls(outcome.response, "http://127.0.0.1:8765")
    return response


def test_core_subscribe_responses_match_the_schema() -> None:
    h = _core_harness()
    h.register("analyst-1", role="analyst", interests=["churn"])
    subscribed = _subscribe(
        h,
        "analyst-1",
        {"action": "subscribe", "subscription": {"events": ["memory.recorded", "agent.joined"]}},
    )
    assert_valid("subscribe.response", subscribed)
    assert subscribed["subscription"]["min_relevance"] == 0
    assert subscribed["subscription"]["debounce_ms"] == 0
    assert subscribed["ws_url"] == "ws://127.0.0.1:8765/v1/ws"
    listed = _subscribe(h, "analyst-1", {"action": "list"})
    assert_valid("subscribe.response", listed)
    assert listed["subscriptions"] == [subscribed["subscription"]]
    cancelled = _subscribe(
        h,
        "analyst-1",
        {"action": "unsubscribe", "subscription": {"id": subscribed["subscription_id"]}},
    )
    assert_valid("subscribe.response", cancelled)
    assert cancelled["subscription"]["status"] == "cancelled"
    assert_valid("subscribe.response", _subscribe(h, "analyst-1", {"action": "list"}))


def test_core_subscribe_refusals_match_the_readme() -> None:
    model = pytest.importorskip("field.contract.model")
    errors_module = server_errors_module()
    h = _core_harness(limits=model.Limits(max_subscriptions_per_agent=1))
    h.register("analyst-1")
    h.register("analyst-2")
    subscribe = {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}}
    first = _subscribe(h, "analyst-1", subscribe)
    unsubscribe = {"action": "unsubscribe", "subscription": {"id": first["subscription_id"]}}
    rows = readme_error_rows()
    refusals = [
        ("analyst-1", subscribe, "SUBSCRIPTION_LIMIT"),
        ("analyst-2", unsubscribe, "FORBIDDEN"),
        (
            "analyst-1",
            {**unsubscribe, "subscription": {"id": "sub-none"}},
            "SUBSCRIPTION_NOT_FOUND",
        ),
        ("analyst-1", {**subscribe, "subscription": {"events": ["x.y"]}}, "INVALID_PAYLOAD"),
    ]
    _subscribe(h, "analyst-1", unsubscribe)
    refusals.append(("analyst-1", unsubscribe, "INVALID_TRANSITION"))
    _subscribe(h, "analyst-1", subscribe)  # back at the cap of 1
    for agent_id, payload, code in refusals:
        with pytest.raises(errors_module.FieldError) as caught:
            _subscribe(h, agent_id, payload)
        error = caught.value
        assert error.code == code
        assert_valid("error", error.to_response())
        assert error.http_status == rows[code][0], code
        if code in ("SUBSCRIPTION_LIMIT", "SUBSCRIPTION_NOT_FOUND"):
            assert error.recoverable == (rows[code][1] == "Yes"), code


def test_core_notifications_match_the_schema() -> None:
    orjson = pytest.importorskip("orjson")
    events_module = pytest.importorskip("field.subscriptions.events")
    matcher_module = pytest.importorskip("field.subscriptions.matcher")
    stream_module = pytest.importorskip("field.subscriptions.stream")
    streaming = pytest.importorskip("field.transports.streaming")
    outbox = pytest.importorskip("field.engine.outbox")
    h = _core_harness()
    h.register("analyst-1", role="analyst", interests=["churn"])
    h.register("analyst-2", role="analyst")
    every = {"events": EVENTS, "include_own": True, "debounce_ms": 60_000}
    _subscribe(h, "analyst-1", {"action": "subscribe", "subscription": every})
    first = h.record("analyst-2", "Churn fell to 2%.")["memory_unit_id"]
    mine = h.record("analyst-1", "Churn rose to 3%.")["memory_unit_id"]
    h.record(
        "analyst-2",
        "Churn did not rise.",
        relations=[
            {"type": "contradicts", "target_id": mine},
            {"type": "supersedes", "target_id": first},
        ],
    )
    h.register("analyst-3", role="analyst", interests=["churn"])
    state = h.field.state
    stored = h.stored()
    found = [events_module.event_of(entry, state.units) for entry in stored]
    events = [e for e in found if e is not None]
    matches = matcher_module.Matcher(state.registry, state.index, state.units).match(events)
    tag = h.field.field_tag
    seen = set()
    folding = stream_module.Stream("sub", window_ms=60_000, after=0)
    for match in matches:
        cursor = stream_module.format_cursor(tag, match.event.position)
        shared = stream_module.encode_event(match.event, cursor)
        for i, row in enumerate(match.rows.tolist()):
            notification = stream_module.Notification(
                state.registry.ids[row],
                match.event,
                float(match.relevance[i]),
                match.reason(i),
                bool(match.requires_action[i]),
                shared=shared,
            )
            folding.offer(notification)
            body = orjson.loads(stream_module.encode_notification(notification))
            assert_valid("notification", body)
            seen.add(body["event"])
            ws_frame = getattr(streaming, "_ws_frame", None)  # how the WebSocket wraps it
            if ws_frame is not None:
                frame = outbox.Frame(
                    stream_module.encode_notification(notification), body["event"], cursor
                )
                assert_valid("ws-frame", orjson.loads(ws_frame(frame)))
    assert seen == {
        "memory.recorded",
        "memory.superseded",
        "memory.contested",
        "conflict.detected",
        "agent.joined",
    }
    folded = folding.advance(h.time + 120.0)  # past the one-minute window
    assert any(n.folded for n in folded)
    for notification in folded:
        assert_valid("notification", orjson.loads(stream_module.encode_notification(notification)))
