"""Valid and invalid instances of the console's schema (``console-snapshot``).

``tests/test_schemas.py`` checks them with every other schema case;
``tests/test_console_stream.py`` validates what a real server streams against
the same schema.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

SCHEMAS = {
    "types": [],
    "requests": [],
    "responses": ["console-snapshot", "console-history.response"],
}

FIELD_STATUS = {
    "status": "ok",
    "field_id": "field-7f3a",
    "protocol_version": "0.1.0",
    "server_version": "0.1.0",
    "conformance_level": 3,
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
    "embedding": {"after_commit": False, "queued": 0, "held_entries": 0},
    "counts": {
        "agents": 2,
        "memory_units": {"active": 1, "contested": 2},
        "conflicts": {"total": 1, "unresolved": 1},
    },
    "sources": {},
    "limits": {"max_body_bytes": 1048576},
    "uptime_seconds": 12.5,
    "snapshot": None,
}
FAILED = "not heard from for 300 s (heartbeat_timeout 300 s) and no push connection open"
AGENTS = [
    {
        "agent": {
            "id": "bob",
            "role": "strategist",
            "status": "failed",
            "interests": [],
            "current_task_id": None,
            "registered_epoch": 2,
            "authority": 4,
            "failure_reason": FAILED,
        },
        "connections": {},
    },
    {
        "agent": {
            "id": "alice",
            "role": "researcher",
            "status": "idle",
            "interests": ["churn"],
            "current_task_id": None,
            "registered_epoch": 1,
            "authority": 4,
        },
        "connections": {"ws": 1, "sse": 2},
    },
]
EXCERPT = {
    "id": "mem-0123456789abcdef0123",
    "type": "finding",
    "status": "contested",
    "agent_id": "alice",
    "confidence": 0.9,
    "content": "Churn fell to 2% in March.",
}
CONFLICT = {
    "conflict": {
        "id": "conflict-0123456789abcdef0123",
        "type": "factual",
        "status": "detected",
        "unit_a": "mem-0123456789abcdef0123",
        "unit_b": "mem-89abcdef0123456789ab",
        "description": "mem-89abcdef0123456789ab contradicts mem-0123456789abcdef0123",
        "detected_by": "explicit",
        "epoch": 9,
    },
    "units": {
        "unit_a": EXCERPT,
        "unit_b": {**EXCERPT, "id": "mem-89abcdef0123456789ab", "agent_id": "bob"},
    },
}
SUBSCRIPTION = {
    "subscription": {
        "id": "sub-0123456789abcdef0123",
        "agent_id": "operator",
        "events": ["memory.recorded", "conflict.detected"],
        "min_relevance": 0.0,
        "debounce_ms": 0,
        "include_own": True,
        "status": "active",
        "created_epoch": 31,
        "name": "console",
    },
    "readers": {"sse": 1},
    "outbox": 3,
    "lag": 2,
    "replaying": False,
}
SAMPLE = {
    "t": 1795484056.5,
    "operations_per_s": 12.0,
    "operation_latency_ms": {"mean": 0.4},
    "entries_per_s": 9.0,
    "delivery_latency_ms": {"mean": 0.8, "max": 2.1},
}
SNAPSHOT = {
    "at": "2026-03-01T10:30:00.123Z",
    "viewer": {
        "id": "operator",
        "role": "human_operator",
        "authority": 10,
        "operator": True,
        "may_merge": True,
    },
    "field": FIELD_STATUS,
    "agents": {"total": 2, "by_status": {"idle": 1, "failed": 1}, "listed": AGENTS},
    "connections": {"ws": 1, "sse": 3, "console": 1},
    "conflicts": {"open": 1, "listed": [CONFLICT]},
    "subscriptions": {"total": 1, "listed": [SUBSCRIPTION]},
    "rates": SAMPLE,
    "history": [
        {**SAMPLE, "t": 1795484055.5, "operation_latency_ms": None, "delivery_latency_ms": None},
        SAMPLE,
    ],
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """A copy of :data:`SNAPSHOT` with the value at a dotted path (``a.0.b``) set."""
    out = copy.deepcopy(SNAPSHOT)
    *parents, last = path.split(".")
    node: Any = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return out


def case(instance: Any, label: str, schema: str = "console-snapshot") -> Any:
    return pytest.param(schema, instance, id=f"{schema}:{label}")


HOUR = {"step_seconds": 10, "samples": [SAMPLE] * 3}


VALID = [
    case(SNAPSHOT, "operator"),
    case(
        _with("viewer", {**SNAPSHOT["viewer"], "id": "alice", "operator": False}),  # type: ignore[dict-item]
        "agent",
    ),
    case(_with("rates", None), "no-rates"),
    case(_with("history", []), "no-history"),
    case(_with("subscriptions.listed.0.lag", None), "lag-unknown"),
    case(_with("conflicts.listed.0.units", {}), "no-units"),
    case(_with("agents.by_status", {}), "no-agents"),
    case(HOUR, "hour", "console-history.response"),
    case({**HOUR, "samples": []}, "empty-hour", "console-history.response"),
]
INVALID = [
    case({k: v for k, v in SNAPSHOT.items() if k != "field"}, "no-field"),
    case(_with("extra", 1), "extra"),
    case(_with("connections", {"carrier-pigeon": 1}), "unknown-kind"),
    case(_with("connections", {"ws": 0}), "zero-count"),
    case(_with("agents.by_status", {"sleeping": 1}), "unknown-status"),
    case(_with("agents.listed.0.agent.status", "asleep"), "bad-agent"),
    case(_with("subscriptions.listed.0.lag", -1), "negative-lag"),
    case(_with("conflicts.listed.0.units.unit_a.content", "x" * 241), "long-excerpt"),
    case(_with("history", [SAMPLE] * 121), "long-history"),
    case(_with("rates.delivery_latency_ms", {"mean": 1}), "latency-without-max"),
    case(_with("rates.operation_latency_ms", {"mean": -1}), "negative-latency"),
    case(_with("viewer.may_merge", "yes"), "may-merge-not-boolean"),
    case({**HOUR, "samples": [SAMPLE] * 361}, "over-an-hour", "console-history.response"),
    case({**HOUR, "step_seconds": 0}, "no-step", "console-history.response"),
    case({"samples": []}, "step-missing", "console-history.response"),
]
