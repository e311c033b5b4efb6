"""Valid and invalid instances of the schemas of the operator's actions
(``agent-fail.request``, ``agent-fail.response``, ``events.response``).

``tests/test_schemas.py`` checks them with every other schema case;
``tests/test_operator_actions.py`` validates what a real server answers against the
same schemas.
"""

from __future__ import annotations

from typing import Any

import pytest

SCHEMAS = {
    "types": [],
    "requests": ["agent-fail.request"],
    "responses": ["agent-fail.response", "events.response"],
}

EVENT = {
    "event": "agent.failed",
    "epoch": 12,
    "summary": "agent alice (analyst) failed: declared failed by the operator",
    "memory_unit_id": None,
    "conflict_id": None,
    "cursor": "7f3a-12",
    "entity": {"type": "agent", "id": "alice"},
    "agent_id": "alice",
    "ts": 1780000000.25,
}
RECORDED = {
    **EVENT,
    "event": "memory.recorded",
    "summary": "finding from alice: churn fell",
    "memory_unit_id": "mem-1",
    "entity": {"type": "memory_unit", "id": "mem-1"},
    "cursor": "7f3a-11",
}
PAGE = {"events": [EVENT, RECORDED], "next": "7f3a-11"}


def case(name: str, instance: Any, label: str) -> Any:
    return pytest.param(name, instance, id=f"{name}:{label}")


VALID = [
    case("agent-fail.request", {}, "empty"),
    case("agent-fail.request", {"reason": "stuck in a loop"}, "reason"),
    case("agent-fail.request", {"reason": "x" * 500}, "longest"),
    case("agent-fail.response", {"status": "failed", "epoch": 12}, "failed"),
    case("agent-fail.response", {"status": "unchanged"}, "unchanged"),
    case("events.response", PAGE, "page"),
    case("events.response", {"events": [], "next": None}, "start"),
]

INVALID = [
    case("agent-fail.request", {"reason": ""}, "empty-reason"),
    case("agent-fail.request", {"reason": "   "}, "blank-reason"),
    case("agent-fail.request", {"reason": "x" * 501}, "long-reason"),
    case("agent-fail.request", {"why": "no"}, "unknown-key"),
    case("agent-fail.response", {"status": "failed"}, "no-epoch"),
    case("agent-fail.response", {"status": "unchanged", "epoch": 3}, "unchanged-epoch"),
    case("agent-fail.response", {"status": "ok", "epoch": 3}, "status"),
    case("events.response", {"events": []}, "no-next"),
    case("events.response", {**PAGE, "events": [{**EVENT, "relevance_score": 1}]}, "relevance"),
    case("events.response", {**PAGE, "events": [{**EVENT, "event": "agent.left"}]}, "event"),
    case(
        "events.response",
        {**PAGE, "events": [{k: v for k, v in EVENT.items() if k != "ts"}]},
        "no-ts",
    ),
]
