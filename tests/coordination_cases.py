"""Valid and invalid instances of the Coordination Extension's schemas.

``tests/test_schemas.py`` checks them with every other schema case;
``tests/test_coordination.py`` also feeds the request cases to the
server's validators, which must accept exactly the valid ones.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

SCHEMAS = {
    "types": ["session", "task"],
    "requests": ["session.request", "coordinate.request", "handoff.request"],
    "responses": ["session.response", "coordinate.response", "handoff.response"],
}

SESSION = {
    "id": "session-0123456789abcdef0123",
    "name": "Q3 pricing review",
    "purpose": "Agree on the EU price list",
    "status": "active",
    "created_by": "lead-1",
    "members": ["lead-1", "analyst-1"],
    "invited": ["analyst-2"],
    "created_epoch": 3,
    "updated_epoch": 7,
    "visibility": {"decision": {"roles": ["lead"], "min_authority": 0}},
}
TASK = {
    "id": "task-0123456789abcdef0123",
    "title": "Size the EU market",
    "description": None,
    "status": "in_progress",
    "created_by": "lead-1",
    "assignee": "analyst-1",
    "session_id": SESSION["id"],
    "depends_on": ["task-89abcdef0123456789ab"],
    "priority": "high",
    "result": None,
    "reason": None,
    "created_epoch": 4,
    "updated_epoch": 9,
}
PENDING = {**TASK, "status": "pending", "assignee": None, "session_id": None, "depends_on": []}
UNIT = {
    "id": "mem-0123456789abcdef0123",
    "mode": "committed",
    "type": "finding",
    "content": "Churn fell to 2%.",
    "intent": {"purpose": "Track churn", "task_id": TASK["id"], "question": None},
    "confidence": {"score": 0.9, "reasoning": "From the billing export."},
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
HANDOFF = {
    "id": "handoff-0123456789abcdef0123",
    "task_id": TASK["id"],
    "from_agent_id": "analyst-1",
    "to_agent_id": "analyst-2",
    "notes": "Halfway: the DACH numbers are in.",
    "context": {
        "units": [
            {
                "memory_unit": UNIT,
                "relevance_score": 0.8,
                "relevance_reason": "recorded for the task",
                "format": "full",
            }
        ],
        "conflicts": [],
        "notes": "Halfway: the DACH numbers are in.",
    },
    "epoch": 12,
}


def case(name: str, instance: Any, label: str) -> Any:
    return pytest.param(name, instance, id=f"{name}:{label}")


def without(obj: dict[str, Any], key: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    del out[key]
    return out


VALID = [
    case("session", SESSION, "active"),
    case(
        "session",
        {**SESSION, "status": "ended", "members": [], "invited": [], "purpose": None},
        "ended",
    ),
    case("task", TASK, "in-progress"),
    case("task", PENDING, "pending"),
    case("task", {**TASK, "status": "completed", "result": "done", "reason": ""}, "completed"),
    case("session.request", {"action": "create", "name": "n"}, "create"),
    case(
        "session.request",
        {"action": "create", "name": "n", "purpose": None, "session_id": None, "reason": "r"},
        "create-full",
    ),
    case(
        "session.request",
        {"action": "create", "name": "n", "invitees": ["analyst-1", "analyst-1"]},
        "create-inviting",
    ),
    case("session.request", {"action": "invite", "session_id": "s", "invitees": ["a"]}, "invite"),
    case(
        "session.request",
        {"action": "uninvite", "session_id": "s", "invitees": ["a", "b"], "reason": "r"},
        "uninvite",
    ),
    case("session.request", {"action": "join", "session_id": "s"}, "join"),
    case("session.request", {"action": "pause", "session_id": "s", "reason": "lunch"}, "pause"),
    case("session.request", {"action": "list"}, "list"),
    case("session.request", {"action": "list", "session_id": "s"}, "list-ignores-id"),
    case("session.request", {"action": "list", "after": "session-1", "limit": 1000}, "list-page"),
    case("session.request", {"action": "list", "after": None, "limit": None}, "list-page-null"),
    case("coordinate.request", {"action": "create", "title": "t"}, "create"),
    case(
        "coordinate.request",
        {
            "action": "create",
            "title": "t",
            "description": "d",
            "assignee": "analyst-1",
            "depends_on": ["task-1", "task-1"],
            "priority": "low",
            "task_id": None,
        },
        "create-full",
    ),
    case("coordinate.request", {"action": "assign", "task_id": "t", "assignee": "a"}, "assign"),
    case("coordinate.request", {"action": "complete", "task_id": "t", "result": "r"}, "complete"),
    case("coordinate.request", {"action": "list"}, "list"),
    case("coordinate.request", {"action": "list", "after": "task-1", "limit": 1}, "list-page"),
    case("handoff.request", {"task_id": "t", "to_agent_id": "a"}, "minimal"),
    case(
        "handoff.request",
        {
            "task_id": "t",
            "to_agent_id": "a",
            "notes": "n",
            "context": {"max_units": 0, "include_units": ["mem-1"]},
        },
        "full",
    ),
    case("handoff.request", {"task_id": "t", "to_agent_id": "a", "context": None}, "no-context"),
    case("session.response", {"status": "ok", "session": SESSION, "epoch": 7}, "one"),
    case(
        "session.response",
        {"status": "ok", "sessions": [SESSION], "next": None, "epoch": 7},
        "list",
    ),
    case(
        "session.response",
        {"status": "ok", "sessions": [SESSION], "next": SESSION["id"], "epoch": 7},
        "list-page",
    ),
    case("coordinate.response", {"status": "ok", "task": TASK, "epoch": 9}, "one"),
    case("coordinate.response", {"status": "ok", "tasks": [], "next": None, "epoch": 9}, "list"),
    case(
        "coordinate.response",
        {"status": "ok", "tasks": [], "next": "task-1", "epoch": 9},
        "list-page",
    ),
    case(
        "handoff.response",
        {"status": "ok", "handoff": HANDOFF, "task": {**TASK, "status": "assigned"}, "epoch": 12},
        "basic",
    ),
]

INVALID = [
    case("session", {**SESSION, "status": "closed"}, "status"),
    case("session", without(SESSION, "members"), "missing-members"),
    case("session", without(SESSION, "invited"), "missing-invited"),
    case("session", {**SESSION, "invited": ["a", "a"]}, "invited-twice"),
    case("session", {**SESSION, "name": " "}, "blank-name"),
    case("task", {**TASK, "status": "done"}, "status"),
    case("task", {**TASK, "assignee": None}, "in-progress-without-assignee"),
    case("task", {**PENDING, "assignee": "a"}, "pending-with-assignee"),
    case("task", {**TASK, "priority": 3}, "priority"),
    case("task", {**TASK, "extra": 1}, "extra"),
    case("session.request", {"action": "create"}, "create-without-name"),
    case("session.request", {"action": "create", "name": "n", "session_id": "s"}, "create-id"),
    case("session.request", {"action": "join"}, "join-without-id"),
    case("session.request", {"action": "join", "session_id": "s", "name": None}, "name-null"),
    case("session.request", {"action": "close", "session_id": "s"}, "action"),
    case("session.request", {"action": "invite", "session_id": "s"}, "invite-without-invitees"),
    case(
        "session.request",
        {"action": "invite", "session_id": "s", "invitees": []},
        "invite-nobody",
    ),
    case("session.request", {"action": "invite", "invitees": ["a"]}, "invite-without-id"),
    case(
        "session.request",
        {"action": "uninvite", "session_id": "s", "invitees": ["-a"]},
        "uninvite-bad-id",
    ),
    case(
        "session.request",
        {"action": "join", "session_id": "s", "invitees": ["a"]},
        "join-inviting",
    ),
    case("session.request", {"action": "list", "invitees": []}, "list-inviting"),
    case(
        "session.request",
        {"action": "create", "name": "n", "invitees": [f"a{i}" for i in range(65)]},
        "too-many-invitees",
    ),
    case("session.request", {"action": "create", "name": "n", "invitees": "a"}, "invitees-string"),
    case("session.request", {"action": "list", "colour": 1}, "extra"),
    case("session.request", {"action": "list", "limit": 0}, "limit-0"),
    case("session.request", {"action": "list", "limit": 1001}, "limit-1001"),
    case("session.request", {"action": "list", "limit": "5"}, "limit-string"),
    case("session.request", {"action": "list", "limit": True}, "limit-bool"),
    case("session.request", {"action": "list", "after": ""}, "after-empty"),
    case("session.request", {"action": "list", "after": 7}, "after-number"),
    case("coordinate.request", {"action": "list", "limit": 2.5}, "limit-float"),
    case("coordinate.request", {"action": "list", "after": "t" * 257}, "after-257"),
    case("session.response", {"status": "ok", "sessions": [], "epoch": 7}, "list-without-next"),
    case("coordinate.request", {"action": "create"}, "create-without-title"),
    case("coordinate.request", {"action": "create", "title": "t", "task_id": "x"}, "create-id"),
    case("coordinate.request", {"action": "assign", "task_id": "t"}, "assign-no-assignee"),
    case("coordinate.request", {"action": "start"}, "start-without-id"),
    case(
        "coordinate.request",
        {"action": "create", "title": "t", "priority": "urgent"},
        "priority",
    ),
    case(
        "coordinate.request",
        {"action": "create", "title": "t", "assignee": "bad id!"},
        "assignee",
    ),
    case("coordinate.request", {"action": "create", "title": "t", "depends_on": [""]}, "dep"),
    case("handoff.request", {"task_id": "t"}, "no-target"),
    case(
        "handoff.request", {"task_id": "t", "to_agent_id": "a", "context": {"max_units": 51}}, "max"
    ),
    case(
        "handoff.request",
        {"task_id": "t", "to_agent_id": "a", "context": {"include_units": ["m"] * 51}},
        "include-51",
    ),
    case("session.response", {"status": "ok", "session": SESSION}, "no-epoch"),
    case("coordinate.response", {"status": "ok", "task": TASK, "tasks": [], "epoch": 1}, "both"),
    case(
        "handoff.response",
        {"status": "ok", "handoff": without(HANDOFF, "context"), "task": TASK, "epoch": 12},
        "no-context",
    ),
]
