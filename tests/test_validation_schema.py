"""The server's validators and the protocol schemas agree.

``field.core.validation`` is the compiled form of ``protocol/schemas``:
on valid requests and on many random mutations of them, a request passes
the server's checks exactly when it validates against its schema.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.errors import ValidationError
from field.contract.model import Limits
from field.core import validation

from .schema_util import validator

LIMITS = Limits()

VALID: dict[str, dict[str, Any]] = {
    "envelope": {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "msg-1",
        "operation": "RECORD",
        "agent_id": "agent-1",
        "session_id": None,
        "epoch": 3,
        "payload": {},
    },
    "register.request": {
        "id": "researcher-01",
        "role": "market_researcher",
        "interests": ["market size", "competitors"],
        "required_operations": ["RECORD"],
        "current_task_id": "task-1",
    },
    "deregister.request": {"agent_id": "researcher-01"},
    "record.request": {
        "mode": "committed",
        "type": "finding",
        "content": "Growth is 23%.",
        "intent": {"purpose": "size the market", "task_id": "t-1", "question": "how big?"},
        "confidence": {
            "score": 0.8,
            "reasoning": "three reports",
            "evidence": ["report a"],
            "assumptions": ["no recession"],
        },
        "relations": [{"type": "answers", "target_id": "mem-1", "description": "why"}],
    },
    "attune.request": {
        "scope": {
            "role": "strategist",
            "max_units": 10,
            "max_tokens": 500,
            "interests": ["pricing"],
            "active_task_id": "t-1",
            "temporal_layers": ["past", "present"],
            "relevance_threshold": 0.2,
            "recency_weight": 0.4,
            "since_epoch": 4,
            "include_own": False,
            "include_archived": True,
        },
        "context_hint": "positioning",
        "format": "summary",
        "since_epoch": 4,
    },
    "detect.request": {
        "mode": "list",
        "target_id": None,
        "filter": {"status": ["detected"], "types": ["factual"], "involving_agents": ["a-1"]},
    },
    "replay.request": {"target_type": "decision", "target_id": "mem-1", "depth": "detailed"},
    "compact.request": {
        "strategy": "summarize",
        "filter": {"max_age_epochs": 5, "session_id": "s-1", "types": ["finding"], "status": []},
    },
    "merge.request": {
        "conflict_id": "conflict-1",
        "strategy": "vote",
        "resolution": {"winner_id": "mem-1", "synthesis": None, "rationale": "r", "quorum": 3},
    },
}

CHECKS: dict[str, Callable[[Any], Any]] = {
    "envelope": lambda v: validation.envelope(v, expected_operation=None, limits=LIMITS),
    "register.request": lambda v: validation.register_payload(v, LIMITS),
    "deregister.request": validation.deregister_payload,
    "record.request": lambda v: validation.record_payload(v, LIMITS),
    "attune.request": lambda v: validation.attune_payload(v, LIMITS),
    "detect.request": lambda v: validation.detect_payload(v, LIMITS),
    "replay.request": lambda v: validation.replay_payload(v, LIMITS),
    "compact.request": lambda v: validation.compact_payload(v, LIMITS),
    "merge.request": lambda v: validation.merge_payload(v, LIMITS),
}

#: Values that probe types, emptiness, bounds and enums. Whole-number floats
#: are left out: JSON Schema counts 3.0 as an integer, the server wants 3.
ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    5,
    1001,
    2**53,
    0.5,
    1.5,
    -0.1,
    "",
    " ",
    "x",
    "draft",
    "committed",
    "decision",
    "rumour",
    "supersedes",
    "list",
    "scan",
    "check",
    "vote",
    "synthesis",
    "authority",
    "human_escalation",
    "full",
    "ids_only",
    "present",
    "resolved",
    "bad id!",
    "a" * 300,
    "akashik",
    "0.1.0",
    "ATTUNE",
    [],
    [""],
    ["x"],
    ["x"] * 65,
    [1],
    {},
    {"purpose": "p"},
    {"score": 0.5, "reasoning": "r"},
    {"type": "supports", "target_id": "m"},
]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            paths.extend(_paths(child, (*prefix, key)))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            paths.extend(_paths(child, (*prefix, i)))
    return paths


def _mutate(doc: Any, data: st.DataObject) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "extra"]))
        if action == "replace":
            parent[path[-1]] = copy.deepcopy(data.draw(st.sampled_from(ODD_VALUES)))
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.sampled_from(["extra", "id", "status", "colour"]))] = 1
    return doc


def _since_epochs_differ(name: str, value: Any) -> bool:
    """The one rule a schema cannot state: both since_epoch fields, if given, agree."""
    if name != "attune.request" or not isinstance(value.get("scope"), dict):
        return False
    top, inner = value.get("since_epoch"), value["scope"].get("since_epoch")
    return top is not None and inner is not None and top != inner


def _server_accepts(name: str, value: Any) -> bool:
    try:
        CHECKS[name](value)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_examples_pass_both(name: str) -> None:
    assert validator(name).is_valid(VALID[name])
    assert _server_accepts(name, VALID[name])


@pytest.mark.parametrize("name", sorted(VALID))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_server_and_schema_agree_on_mutations(name: str, data: st.DataObject) -> None:
    value = _mutate(VALID[name], data)
    schema_says = validator(name).is_valid(value) and not _since_epochs_differ(name, value)
    server_says = _server_accepts(name, value)
    assert schema_says == server_says, (
        f"schema says {'valid' if schema_says else 'invalid'}, server says "
        f"{'valid' if server_says else 'invalid'} for {value!r}"
    )
