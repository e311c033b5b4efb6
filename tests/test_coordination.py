"""The Coordination Extension in the pure core: SESSION, COORDINATE and HANDOFF.

Every operation runs through the Harness (no event loop, no I/O). Both
state machines are tested from their tables: every (status, action) pair
is tried, the legal ones must land where the table says and the others
must be refused with 409 INVALID_TRANSITION. Every test that changes
state ends by proving that replaying the log rebuilds the same state.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.errors import FieldError, ValidationError
from field.contract.model import Limits
from field.core import sessions, tasks, validation
from field.core.authority import effective_authority
from field.ranking import relevance
from field.subscriptions.events import FieldEvent, event_of
from field.subscriptions.matcher import Matcher
from field.subscriptions.stream import Notification, encode_event, encode_notification

from . import coordination_cases
from .core_util import Harness
from .schema_util import assert_valid, is_valid
from .test_matcher import check_against_reference, check_splits
from .test_validation_schema import _mutate

OPERATOR_TOKEN = "operator-token-0123456789"


# -- helpers -------------------------------------------------------------------


def field() -> Harness:
    """A Field with a lead (senior, 6), two workers and an outsider (all standard)."""
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.register("lead", "lead", via=OPERATOR_TOKEN, authority=6)
    h.register("worker", "analyst", interests=["market sizing"])
    h.register("other", "analyst", interests=["pricing"])
    h.register("outsider", "auditor")
    h.tokens["operator"] = OPERATOR_TOKEN
    return h


def send(h: Harness, op: str, agent: str, payload: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """One operation whose request and response must match their schemas."""
    assert is_valid(f"{op.lower()}.request", payload), payload
    response = h.send(op, agent, payload, **kw)
    assert_valid(f"{op.lower()}.response", response)
    return response


def refused(h: Harness, op: str, agent: str, payload: dict[str, Any], code: str, **kw: Any) -> Any:
    """The operation fails with ``code``, changes nothing and consumes no epoch."""
    before = (len(h.entries), h.field.epoch, copy.deepcopy(h.field.state.tasks))
    with pytest.raises(FieldError) as caught:
        h.send(op, agent, payload, **kw)
    error = caught.value
    assert error.code == code, (error.code, error.message)
    assert_valid("error", error.to_response(op))
    assert (len(h.entries), h.field.epoch, h.field.state.tasks) == before
    return error


def session(h: Harness, agent: str, action: str, session_id: str | None = None, **kw: Any) -> Any:
    payload = {"action": action, **kw}
    if session_id is not None:
        payload["session_id"] = session_id
    return send(h, "SESSION", agent, payload)["session"]


def create_task(h: Harness, agent: str = "lead", **kw: Any) -> dict[str, Any]:
    payload = {"action": "create", "title": kw.pop("title", "Size the EU market"), **kw}
    session_id = payload.pop("session_id", None)
    task: dict[str, Any] = send(h, "COORDINATE", agent, payload, session_id=session_id)["task"]
    return task


def act(h: Harness, agent: str, action: str, task_id: str, **kw: Any) -> dict[str, Any]:
    task: dict[str, Any] = send(
        h, "COORDINATE", agent, {"action": action, "task_id": task_id, **kw}
    )["task"]
    return task


def kinds(h: Harness, since: int) -> list[str]:
    return [e.kind for e in h.entries[since:] if e.kind != "clock.reserved"]


def assert_replays(h: Harness) -> None:
    """The state rebuilt from the log equals the state the Field holds."""
    live, replayed = h.field.state, h.replayed().state
    assert replayed.tasks == live.tasks
    assert replayed.sessions == live.sessions
    assert replayed.open_tasks_by_agent == {k: v for k, v in live.open_tasks_by_agent.items()}
    assert replayed.sessions_by_member == live.sessions_by_member
    assert replayed.invitations == live.invitations
    assert replayed.dependent_tasks == live.dependent_tasks
    assert [a.to_wire() for a in replayed.agents.values()] == [
        a.to_wire() for a in live.agents.values()
    ]


# -- SESSION ---------------------------------------------------------------------


def test_session_life_cycle() -> None:
    h = field()
    mark = len(h.entries)
    created = session(
        h, "worker", "create", name="Pricing review", purpose="EU prices", invitees=["other"]
    )
    assert created["id"].startswith("session-")
    assert (created["status"], created["created_by"], created["members"], created["invited"]) == (
        "active",
        "worker",
        ["worker"],
        ["other"],
    )
    sid = created["id"]
    joined = session(h, "other", "join", sid)
    assert (joined["members"], joined["invited"]) == (["worker", "other"], [])
    paused = session(h, "worker", "pause", sid, reason="waiting for data")
    assert paused["status"] == "paused"
    assert paused["updated_epoch"] > created["created_epoch"]
    assert session(h, "worker", "invite", sid, invitees=["outsider"])["invited"] == ["outsider"]
    assert session(h, "outsider", "join", sid)["status"] == "paused"
    assert session(h, "outsider", "leave", sid)["members"] == ["worker", "other"]
    assert session(h, "worker", "resume", sid)["status"] == "active"
    assert session(h, "worker", "end", sid)["status"] == "ended"
    listed = send(h, "SESSION", "other", {"action": "list"})["sessions"]
    assert [s["id"] for s in listed] == [sid]
    assert send(h, "SESSION", "outsider", {"action": "list"})["sessions"] == []
    assert kinds(h, mark) == [
        "session.created",
        "session.joined",
        "session.paused",
        "session.invited",
        "session.joined",
        "session.left",
        "session.resumed",
        "session.ended",
    ]
    assert_replays(h)


def _session_in(h: Harness, status: str) -> str:
    """A session of lead's in ``status``; worker is a member, other is invited (until it ends)."""
    sid: str = session(h, "lead", "create", name="s", invitees=["worker", "other"])["id"]
    session(h, "worker", "join", sid)
    if status in ("paused", "ended"):
        session(h, "lead", "pause", sid)
    if status == "ended":
        session(h, "lead", "end", sid)
    return sid


@pytest.mark.parametrize("status", sessions.SESSION_STATUSES)
@pytest.mark.parametrize("action", [a for a in sessions.ACTIONS if a not in ("create", "list")])
def test_every_session_transition(status: str, action: str) -> None:
    h = field()
    sid = _session_in(h, status)
    # join by an invited agent, leave by a member, the rest by the creator
    agent = {"join": "other", "leave": "worker"}.get(action, "lead")
    invitees = {"invite": {"invitees": ["outsider"]}, "uninvite": {"invitees": ["other"]}}
    extra = invitees.get(action, {})
    after = sessions.TRANSITIONS[status].get(action)
    payload = {"action": action, "session_id": sid, **extra}
    if after is None:
        error = refused(h, "SESSION", agent, payload, "INVALID_TRANSITION")
        assert error.details["from"] == status
        assert error.details["action"] == action
        assert error.details["allowed_actions"] == list(sessions.TRANSITIONS[status])
    else:
        assert session(h, agent, action, sid, **extra)["status"] == after
    assert_replays(h)


def test_session_authority() -> None:
    h = field()
    h.register("boss", "manager", via=OPERATOR_TOKEN, authority=8)
    sid = session(h, "worker", "create", name="s", invitees=["other"])["id"]
    session(h, "other", "join", sid)
    pause = {"action": "pause", "session_id": sid}
    refused(h, "SESSION", "other", pause, "INSUFFICIENT_AUTHORITY")  # a member, not the creator
    refused(h, "SESSION", "lead", pause, "INSUFFICIENT_AUTHORITY")  # senior is not enough
    assert session(h, "boss", "pause", sid)["status"] == "paused"  # globally 8
    assert session(h, "operator", "resume", sid)["status"] == "active"  # the operator
    assert session(h, "worker", "pause", sid)["status"] == "paused"  # the creator
    state = h.field.state
    assert effective_authority(state, state.agents["worker"], sid) == 8
    assert effective_authority(state, state.agents["worker"], None) == 4
    assert effective_authority(state, state.agents["other"], sid) == 4
    session(h, "worker", "leave", sid)  # leaving gives the creator's authority up
    assert effective_authority(state, state.agents["worker"], sid) == 4
    refused(
        h, "SESSION", "worker", {"action": "resume", "session_id": sid}, "INSUFFICIENT_AUTHORITY"
    )
    refused(h, "SESSION", "observer", pause, "UNAUTHENTICATED")  # never registered
    h.register("watcher", "observer", authority=2)
    refused(h, "SESSION", "watcher", {"action": "create", "name": "x"}, "INSUFFICIENT_AUTHORITY")
    assert_replays(h)


def test_session_refusals() -> None:
    h = field()
    sid = session(h, "worker", "create", name="s")["id"]
    missing = {"action": "join", "session_id": "session-none"}
    error = refused(h, "SESSION", "other", missing, "SESSION_NOT_FOUND")
    assert error.http_status == 404
    refused(h, "SESSION", "worker", {"action": "join", "session_id": sid}, "INVALID_TRANSITION")
    refused(h, "SESSION", "other", {"action": "leave", "session_id": sid}, "INVALID_TRANSITION")
    refused(h, "SESSION", "worker", {"action": "create"}, "INVALID_PAYLOAD")
    refused(
        h,
        "SESSION",
        "worker",
        {"action": "create", "name": "n", "session_id": sid},
        "INVALID_PAYLOAD",
    )


def test_record_in_a_session() -> None:
    h = field()
    sid = session(h, "worker", "create", name="s")["id"]
    unit = {
        "type": "finding",
        "content": "EU market is 4bn",
        "intent": {"purpose": "size"},
        "confidence": {"score": 0.8, "reasoning": "reports"},
    }
    accepted = h.send("RECORD", "worker", unit, session_id=sid)
    assert h.field.state.units[accepted["memory_unit_id"]]["source"]["session_id"] == sid
    refused(h, "RECORD", "worker", unit, "SESSION_NOT_FOUND", session_id="session-x")
    refused(h, "RECORD", "other", unit, "FORBIDDEN", session_id=sid)
    session(h, "worker", "pause", sid)
    error = refused(h, "RECORD", "worker", unit, "INVALID_TRANSITION", session_id=sid)
    assert error.recoverable and error.details == {"session_id": sid, "status": "paused"}
    session(h, "worker", "end", sid)
    error = refused(h, "RECORD", "worker", unit, "INVALID_TRANSITION", session_id=sid)
    assert not error.recoverable
    assert h.send("RECORD", "worker", unit)["status"] == "accepted"  # outside any session
    assert_replays(h)


# -- COORDINATE: the task state machine --------------------------------------------


def _task_in(h: Harness, status: str) -> dict[str, Any]:
    """A task in ``status``, assigned to "worker" unless pending."""
    if status == "pending":
        return create_task(h)
    task = create_task(h, assignee="worker")
    if status == "cancelled":
        return act(h, "operator", "cancel", task["id"])
    if status == "assigned":
        return task
    task = act(h, "worker", "start", task["id"])
    if status in ("blocked", "failed"):
        task = act(h, "worker", "block" if status == "blocked" else "fail", task["id"])
    if status == "completed":
        task = act(h, "worker", "complete", task["id"], result="4bn")
    assert task["status"] == status
    return task


@pytest.mark.parametrize("status", tasks.TASK_STATUSES)
@pytest.mark.parametrize("action", tasks.TRANSITION_ACTIONS)
def test_every_task_transition(status: str, action: str) -> None:
    h = field()
    task = _task_in(h, status)
    extra = {"assignee": "other"} if action == "assign" else {}
    payload = {"action": action, "task_id": task["id"], "reason": "because", **extra}
    after = tasks.TRANSITIONS[status].get(action)
    start = len(h.entries)
    if after is None:
        error = refused(h, "COORDINATE", "operator", payload, "INVALID_TRANSITION")
        assert error.details == {
            "task_id": task["id"],
            "from": status,
            "action": action,
            "allowed_actions": list(tasks.TRANSITIONS[status]),
        }
        return
    changed = send(h, "COORDINATE", "operator", payload)["task"]
    assert changed["status"] == after
    assert changed["reason"] == "because"
    assert changed["updated_epoch"] > task["updated_epoch"]
    expected_assignee = {"assign": "other", "release": None}.get(action, task["assignee"])
    assert changed["assignee"] == expected_assignee
    expected = ["task.state_changed"] if after != status else []
    if action == "assign":
        expected.append("task.assigned")
    if action == "complete":
        expected.append("task.completed")
    assert kinds(h, start) == expected
    assert h.field.state.tasks[task["id"]] == changed
    assert_replays(h)


def test_table_is_complete_and_closed() -> None:
    assert set(tasks.TRANSITIONS) == set(tasks.TASK_STATUSES)
    for status, moves in tasks.TRANSITIONS.items():
        assert set(moves) <= set(tasks.TRANSITION_ACTIONS)
        assert set(moves.values()) <= set(tasks.TASK_STATUSES)
        assert (status in tasks.TERMINAL) == (not moves)
    assert set(sessions.TRANSITIONS) == set(sessions.SESSION_STATUSES)


def test_task_creation() -> None:
    h = field()
    start = len(h.entries)
    task = create_task(h, "worker", description="all of the EU", priority="high")
    assert task["id"].startswith("task-")
    assert task == {
        **task,
        "status": "pending",
        "created_by": "worker",
        "assignee": None,
        "session_id": None,
        "depends_on": [],
        "priority": "high",
        "result": None,
        "description": "all of the EU",
    }
    assert kinds(h, start) == ["task.created"]
    mine = create_task(h, "worker", assignee="worker", depends_on=[task["id"], task["id"]])
    assert (mine["status"], mine["depends_on"]) == ("assigned", [task["id"]])
    listed = send(h, "COORDINATE", "worker", {"action": "list"})["tasks"]
    assert [t["id"] for t in listed] == [task["id"], mine["id"]]
    assert send(h, "COORDINATE", "other", {"action": "list"})["tasks"] == []
    assert_replays(h)


def test_task_authority() -> None:
    h = field()
    h.register("boss", "manager", via=OPERATOR_TOKEN, authority=8)
    for_other = {"action": "create", "title": "t", "assignee": "other"}
    refused(h, "COORDINATE", "worker", for_other, "INSUFFICIENT_AUTHORITY")
    task = create_task(h, "lead", assignee="worker")  # senior: for another agent
    tid = task["id"]
    refused(h, "COORDINATE", "other", {"action": "start", "task_id": tid}, "FORBIDDEN")
    refused(h, "COORDINATE", "lead", {"action": "start", "task_id": tid}, "FORBIDDEN")
    steal = {"action": "assign", "task_id": tid, "assignee": "other"}
    refused(h, "COORDINATE", "other", steal, "INSUFFICIENT_AUTHORITY")
    refused(
        h, "COORDINATE", "worker", {"action": "cancel", "task_id": tid}, "INSUFFICIENT_AUTHORITY"
    )
    refused(h, "COORDINATE", "lead", {"action": "cancel", "task_id": tid}, "INSUFFICIENT_AUTHORITY")
    assert act(h, "boss", "start", tid)["status"] == "in_progress"  # 8 overrides the assignee
    assert act(h, "worker", "block", tid, reason="no data")["status"] == "blocked"
    # a pending task anyone may claim for itself; a claimed one only a senior may take over
    free = create_task(h, "worker")
    claimed = act(h, "other", "assign", free["id"], assignee="other")
    assert claimed["assignee"] == "other"
    take = {"action": "assign", "task_id": free["id"], "assignee": "worker"}
    refused(h, "COORDINATE", "worker", take, "INSUFFICIENT_AUTHORITY")
    assert act(h, "lead", "assign", free["id"], assignee="worker")["assignee"] == "worker"
    refused(h, "COORDINATE", "lead", take, "INVALID_TRANSITION")  # already the assignee
    assert act(h, "boss", "cancel", tid)["status"] == "cancelled"
    assert_replays(h)


def test_task_refusals() -> None:
    h = field()
    refused(h, "COORDINATE", "lead", {"action": "start", "task_id": "task-x"}, "TASK_NOT_FOUND")
    unknown = {"action": "create", "title": "t", "assignee": "nobody"}
    assert refused(h, "COORDINATE", "lead", unknown, "AGENT_NOT_FOUND").http_status == 404
    deps = {"action": "create", "title": "t", "depends_on": ["task-x"]}
    assert refused(h, "COORDINATE", "lead", deps, "TASK_NOT_FOUND").details == {
        "missing_tasks": ["task-x"]
    }
    task = create_task(h)
    to_operator = {"action": "assign", "task_id": task["id"], "assignee": "operator"}
    refused(h, "COORDINATE", "lead", to_operator, "AGENT_NOT_FOUND")
    bad = {"action": "create", "title": " "}
    refused(h, "COORDINATE", "lead", bad, "INVALID_PAYLOAD")


def test_dependencies_gate_start() -> None:
    h = field()
    first = create_task(h, "worker", assignee="worker", title="collect data")
    second = create_task(h, "lead", assignee="other", depends_on=[first["id"]], title="model")
    start = {"action": "start", "task_id": second["id"]}
    error = refused(h, "COORDINATE", "other", start, "INVALID_TRANSITION")
    assert error.details["unfinished_dependencies"] == [first["id"]]
    assert first["id"] in error.message
    act(h, "worker", "start", first["id"])
    mark = len(h.entries)
    act(h, "worker", "complete", first["id"], result="done")
    completed = h.entries[-1]
    assert kinds(h, mark) == ["task.state_changed", "task.completed"]
    assert completed.data["dependents"] == [
        {"task_id": second["id"], "assignee": "other", "ready": True}
    ]
    assert act(h, "other", "start", second["id"])["status"] == "in_progress"
    assert_replays(h)


def test_agent_status_follows_its_work() -> None:
    h = field()
    agents = h.field.state.agents
    task = create_task(h, "worker", assignee="worker")
    assert agents["worker"].status == "idle"
    act(h, "worker", "start", task["id"])
    assert agents["worker"].status == "working"
    act(h, "worker", "block", task["id"])
    assert agents["worker"].status == "idle"
    act(h, "worker", "unblock", task["id"])
    act(h, "worker", "complete", task["id"])
    assert agents["worker"].status == "idle"
    assert_replays(h)


def test_tasks_in_a_session() -> None:
    h = field()
    sid = session(h, "worker", "create", name="s")["id"]
    refused(
        h, "COORDINATE", "other", {"action": "create", "title": "t"}, "FORBIDDEN", session_id=sid
    )
    task = create_task(h, "worker", session_id=sid, assignee="worker")
    assert task["session_id"] == sid
    # within its session the creator acts at 8: it may assign to members and cancel
    to_other = {"action": "assign", "task_id": task["id"], "assignee": "other"}
    refused(h, "COORDINATE", "worker", to_other, "FORBIDDEN")  # other is no member
    session(h, "worker", "invite", sid, invitees=["other"])
    session(h, "other", "join", sid)
    assert act(h, "worker", "assign", task["id"], assignee="other")["assignee"] == "other"
    session(h, "worker", "pause", sid)
    start = {"action": "start", "task_id": task["id"]}
    error = refused(h, "COORDINATE", "other", start, "INVALID_TRANSITION")
    assert error.details == {"session_id": sid, "status": "paused"}
    create = {"action": "create", "title": "t"}
    refused(h, "COORDINATE", "worker", create, "INVALID_TRANSITION", session_id=sid)
    session(h, "worker", "resume", sid)
    act(h, "other", "start", task["id"])
    assert act(h, "worker", "cancel", task["id"])["status"] == "cancelled"
    assert_replays(h)


def test_deregister_returns_tasks_and_leaves_sessions() -> None:
    h = field()
    sid = session(h, "worker", "create", name="s")["id"]
    one = create_task(h, "worker", assignee="worker", session_id=sid)
    two = create_task(h, "worker", assignee="worker")
    act(h, "worker", "start", two["id"])
    done = create_task(h, "worker", assignee="worker")
    act(h, "worker", "start", done["id"])
    act(h, "worker", "complete", done["id"])
    state = h.field.state
    assert [t["id"] for t in tasks.open_tasks(state, "worker")] == [one["id"], two["id"]]
    mark = len(h.entries)
    response = send(h, "DEREGISTER", "worker", {"agent_id": "worker"})
    assert response["cleanup"]["tasks_reassigned"] == 2
    assert kinds(h, mark) == [
        "task.state_changed",
        "task.state_changed",
        "session.left",
        "agent.deregistered",
    ]
    for tid in (one["id"], two["id"]):
        assert state.tasks[tid]["status"] == "pending"
        assert state.tasks[tid]["assignee"] is None
        assert state.tasks[tid]["reason"] == "assignee deregistered"
    assert state.tasks[done["id"]]["status"] == "completed"
    assert state.sessions[sid]["members"] == []
    assert tasks.open_tasks(state, "worker") == []
    # an agent that registers the same id later inherits neither tasks nor authority
    h.register("worker", "analyst")
    assert effective_authority(state, state.agents["worker"], sid) == 4
    assert_replays(h)


def test_release_tasks_is_pure() -> None:
    h = field()
    task = create_task(h, "worker", assignee="worker")
    entries = tasks.release_tasks(
        h.field.state, "worker", reason="agent failed", epoch=99, actor="operator", ts=h.time
    )
    assert h.field.state.tasks[task["id"]]["status"] == "assigned"  # nothing applied
    (entry,) = entries
    assert (entry.kind, entry.data["task"]["status"], entry.data["reason"]) == (
        "task.state_changed",
        "pending",
        "agent failed",
    )


# -- HANDOFF -------------------------------------------------------------------------


def _record(h: Harness, agent: str, content: str, **kw: Any) -> str:
    return str(h.record(agent, content, **kw)["memory_unit_id"])


def test_handoff_packages_context() -> None:
    h = field()
    task = create_task(h, "worker", assignee="worker", title="Size the EU market")
    tid = task["id"]
    act(h, "worker", "start", tid)
    for_task = _record(h, "worker", "DACH market is 1bn", task_id=tid)
    relevant = _record(h, "lead", "EU market sizing needs Nordics", memory_type="decision")
    unrelated = _record(h, "lead", "office plants need water", memory_type="observation")
    disputed = _record(
        h, "lead", "DACH is 2bn", relations=[{"type": "contradicts", "target_id": for_task}]
    )
    payload = {
        "task_id": tid,
        "to_agent_id": "other",
        "notes": "DACH done, Nordics next",
        "context": {"max_units": 3, "include_units": [unrelated]},
    }
    mark = len(h.entries)
    response = send(h, "HANDOFF", "worker", payload)
    handoff = response["handoff"]
    assert handoff["id"].startswith("handoff-")
    assert (handoff["from_agent_id"], handoff["to_agent_id"], handoff["task_id"]) == (
        "worker",
        "other",
        tid,
    )
    assert handoff["notes"] == handoff["context"]["notes"] == "DACH done, Nordics next"
    units = [u["memory_unit"]["id"] for u in handoff["context"]["units"]]
    # included first, then the task's own unit, then the best for the target
    assert units[:2] == [unrelated, for_task]
    assert len(units) == 3 and units[2] in (relevant, disputed)
    reasons = [u["relevance_reason"] for u in handoff["context"]["units"]]
    assert reasons[0].startswith("included by worker")
    assert reasons[1].startswith(f"recorded for {tid}")
    assert [c["unit_b"] for c in handoff["context"]["conflicts"]] == [disputed]
    assert response["task"]["assignee"] == "other"
    assert response["task"]["status"] == "assigned"
    assert kinds(h, mark) == ["task.state_changed", "task.assigned", "handoff.incoming"]
    logged = h.entries[-1].data
    assert logged["task_id"] == tid
    assert [u["memory_unit_id"] for u in logged["handoff"]["units"]] == units
    assert '"memory_unit":' not in orjson.dumps(logged).decode()  # ids: units are logged
    assert h.field.state.agents["worker"].status == "idle"
    assert act(h, "other", "start", tid)["status"] == "in_progress"
    assert_replays(h)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_handoffs_best_units_are_the_exhaustive_rankings(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target's best units (ATTUNE's ranking, scored only where they can make the
    package, in steps of a few rows) are those of every candidate scored and diversified."""
    monkeypatch.setattr(relevance, "STEP_CELLS", 1)
    monkeypatch.setattr(relevance, "FIRST_ROWS", 0)
    rng = random.Random(seed)
    words = ["pricing", "churn", "market", "sizing", "nordics", "dach", "risk", "plants"]
    h = field()
    task = create_task(h, "worker", assignee="worker", title="Pricing for the Nordics")
    for n in range(1500):
        agent = rng.choice(["lead", "worker"])
        content = " ".join(rng.choices(words, k=6)) + f" {n}"
        h.record(agent, content, memory_type=rng.choice(["finding", "decision", "observation"]))
    state = h.field.state
    index = state.index
    query = relevance.Query(
        agent_id="other",
        role="analyst",
        interests=["pricing"],
        context_hint=task["title"],
        task_id=task["id"],
        recency_weight=0.25,
        include_own=False,
        since_epoch=None,
    )
    rows = relevance.candidates(index, query)
    scores = relevance.score(index, query, rows)
    best, _, _ = relevance.best_diversified(index, rows, scores, count=8, threshold=0.0)
    expected = [index.ids[row] for row in rows[best].tolist()]
    payload = {"task_id": task["id"], "to_agent_id": "other", "context": {"max_units": 8}}
    handoff = send(h, "HANDOFF", "worker", payload)["handoff"]
    units = handoff["context"]["units"]
    assert all(u["relevance_reason"].startswith("best for you") for u in units)
    assert [u["memory_unit"]["id"] for u in units] == expected


def test_handoff_refusals() -> None:
    h = field()
    task = create_task(h, "worker", assignee="worker")
    tid = task["id"]
    to = {"task_id": tid, "to_agent_id": "other"}
    refused(h, "HANDOFF", "other", to, "FORBIDDEN")  # not the assignee
    refused(h, "HANDOFF", "worker", {**to, "to_agent_id": "nobody"}, "AGENT_NOT_FOUND")
    refused(h, "HANDOFF", "worker", {**to, "to_agent_id": "worker"}, "INVALID_PAYLOAD")
    refused(h, "HANDOFF", "lead", {**to, "to_agent_id": "worker"}, "INVALID_TRANSITION")
    refused(h, "HANDOFF", "worker", {**to, "task_id": "task-x"}, "TASK_NOT_FOUND")
    bad_unit = {**to, "context": {"include_units": ["mem-x"]}}
    refused(h, "HANDOFF", "worker", bad_unit, "UNIT_NOT_FOUND")
    assert send(h, "HANDOFF", "lead", to)["task"]["assignee"] == "other"  # senior may
    act(h, "other", "start", tid)
    act(h, "other", "complete", tid)
    error = refused(h, "HANDOFF", "other", {**to, "to_agent_id": "worker"}, "INVALID_TRANSITION")
    assert error.details["from"] == "completed"
    assert_replays(h)


# -- events ------------------------------------------------------------------------------


def subscribe(h: Harness, agent: str, events: list[str], **options: Any) -> str:
    body = {"action": "subscribe", "subscription": {"events": events, **options}}
    return str(h.send("SUBSCRIBE", agent, body)["subscription_id"])


def notified(h: Harness, since: int = 0) -> dict[str, list[tuple[str, float, bool, str]]]:
    """Per subscription: (event, relevance, requires_action, reason), schema-checked."""
    state = h.field.state
    events = [e for e in (event_of(x, state.units) for x in h.stored()[since:]) if e is not None]
    out: dict[str, list[tuple[str, float, bool, str]]] = {}
    for match in Matcher(state.registry, state.index, state.units).match(events):
        shared = encode_event(match.event, f"{h.field.field_tag}-{match.event.position}")
        for i, row in enumerate(match.rows.tolist()):
            sub_id = state.registry.ids[row]
            n = Notification(
                sub_id,
                match.event,
                float(match.relevance[i]),
                match.reason(i),
                bool(match.requires_action[i]),
                shared=shared,
            )
            assert_valid("notification", orjson.loads(encode_notification(n)))
            out.setdefault(sub_id, []).append(
                (n.event.name, n.relevance, n.requires_action, n.reason)
            )
    return out


COORDINATION_EVENTS = [
    "task.state_changed",
    "task.assigned",
    "task.completed",
    "handoff.incoming",
    "session.paused",
    "session.ended",
]


def test_coordination_events_reach_the_agents_they_concern() -> None:
    h = field()
    subs = {
        a: subscribe(h, a, COORDINATION_EVENTS) for a in ("lead", "worker", "other", "outsider")
    }
    sid = session(h, "lead", "create", name="EU market sizing", invitees=["worker", "other"])["id"]
    session(h, "worker", "join", sid)
    first = create_task(h, "lead", assignee="worker", session_id=sid, title="collect market data")
    session(h, "other", "join", sid)
    second = create_task(h, "lead", assignee="other", depends_on=[first["id"]], session_id=sid)
    act(h, "worker", "start", first["id"])
    act(h, "worker", "complete", first["id"], result="4bn")
    send(h, "HANDOFF", "other", {"task_id": second["id"], "to_agent_id": "worker"})
    session(h, "lead", "pause", sid, reason="review")
    session(h, "lead", "end", sid)
    got = notified(h)

    def of(agent: str, event: str) -> list[tuple[float, bool, str]]:
        return [
            (rel, act, why) for name, rel, act, why in got.get(subs[agent], []) if name == event
        ]

    # the worker: assigned (must act), its dependency's completion concerns the other agent
    # (the second task.assigned gives the other agent its task: the worker only reads about it)
    assigned = [(r, a) for r, a, _ in of("worker", "task.assigned")]
    assert assigned[0] == assigned[2] == (1.0, True)
    assert assigned[1][0] < 1.0 and not assigned[1][1]
    assert of("worker", "task.assigned")[0][2].startswith("task.assigned: it needs your action")
    assert [(r, a) for r, a, _ in of("other", "task.completed")] == [(1.0, True)]  # now ready
    assert [(r, a) for r, a, _ in of("lead", "task.completed")] == [(1.0, False)]  # creator
    assert [(r, a) for r, a, _ in of("worker", "handoff.incoming")] == [(1.0, True)]
    assert [(r, a) for r, a, _ in of("lead", "handoff.incoming")] == [(1.0, False)]
    assert of("other", "handoff.incoming") == []  # its own action
    for member in ("worker", "other"):
        assert [name for name, *_ in got[subs[member]] if name.startswith("session.")] == [
            "session.paused",
            "session.ended",
        ]
        assert all(
            rel == 1.0 and not act
            for r in ("session.paused", "session.ended")
            for rel, act, _ in of(member, r)
        )
    assert of("lead", "session.paused") == []  # the lead paused it itself
    # the outsider is concerned by none of it: topic relevance, never must-act
    outsider = got.get(subs["outsider"], [])
    assert outsider and all(rel < 1.0 and not act for _, rel, act, _ in outsider)
    assert all("no match with your role" in why for *_, why in outsider)
    check_against_reference(h)
    check_splits(h)


def test_topic_relevance_for_bystanders() -> None:
    h = field()
    h.register("sizer", "market analyst", interests=["market sizing"])
    h.register("gardener", "gardener", interests=["plants"])
    sizer = subscribe(h, "sizer", ["task.state_changed"])
    gardener = subscribe(h, "gardener", ["task.state_changed"])
    create_task(h, "lead", title="EU market sizing", description="by country")
    got = notified(h)
    ((_, sizer_rel, _, why),) = got[sizer]
    ((_, gardener_rel, _, _),) = got[gardener]
    assert sizer_rel > gardener_rel
    assert "matches your interests" in why
    check_against_reference(h)


# -- schemas and validators ---------------------------------------------------------

LIMITS = Limits()
CHECKS = {
    "session.request": lambda v: validation.session_payload(v, LIMITS, sessions.ACTIONS),
    "coordinate.request": lambda v: validation.coordinate_payload(
        v, LIMITS, tasks.ACTIONS, tasks.PRIORITIES
    ),
    "handoff.request": lambda v: validation.handoff_payload(v, LIMITS),
}
REQUEST_CASES = [
    p for p in coordination_cases.VALID + coordination_cases.INVALID if p.values[0] in CHECKS
]


def _server_accepts(name: str, value: Any) -> bool:
    try:
        CHECKS[name](copy.deepcopy(value))
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(("name", "instance"), REQUEST_CASES)
def test_validators_accept_exactly_the_valid_cases(name: str, instance: Any) -> None:
    assert _server_accepts(name, instance) == is_valid(name, instance)


SEEDS = {
    "session.request": {
        "action": "create",
        "name": "n",
        "purpose": "p",
        "reason": None,
        "invitees": ["a-1"],
    },
    "coordinate.request": {
        "action": "create",
        "title": "t",
        "description": "d",
        "assignee": "a-1",
        "depends_on": ["task-1"],
        "priority": "high",
        "reason": "r",
        "result": None,
    },
    "handoff.request": {
        "task_id": "task-1",
        "to_agent_id": "a-1",
        "notes": "n",
        "context": {"max_units": 5, "include_units": ["mem-1"]},
    },
}


@pytest.mark.parametrize("name", sorted(SEEDS))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_validators_and_schemas_agree_on_mutations(name: str, data: st.DataObject) -> None:
    value = _mutate(SEEDS[name], data)
    assert _server_accepts(name, value) == is_valid(name, value), value


# -- the matcher against the reference, on random coordination ----------------------

AGENTS = ("a0", "a1", "a2", "a3")
ROLES = ("analyst", "market analyst", "strategist")
WORDS = ("market", "sizing", "pricing", "churn", "analyst", "plants")
phrase = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
step = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 9), phrase, st.integers(0, 9), st.booleans()),
    st.tuples(
        st.just("act"),
        st.integers(0, 9),
        st.sampled_from(tasks.TRANSITION_ACTIONS),
        st.integers(0, 99),
        st.integers(0, 9),
    ),
    st.tuples(st.just("handoff"), st.integers(0, 99), st.integers(0, 9)),
    st.tuples(st.just("session"), st.integers(0, 9), st.sampled_from(sessions.ACTIONS[:-1])),
    st.tuples(st.just("subscribe"), st.integers(0, 9), st.sampled_from([0.0, 0.3, 0.6, 1.0])),
    st.tuples(st.just("deregister"), st.integers(0, 9)),
)
setup = st.lists(
    st.tuples(st.sampled_from(ROLES), st.lists(phrase, max_size=2)),
    min_size=len(AGENTS),
    max_size=len(AGENTS),
)


@settings(max_examples=60, deadline=None)
@given(setup, st.lists(step, min_size=5, max_size=30))
def test_matcher_agrees_with_the_reference_on_coordination(
    profiles: list[tuple[str, list[str]]], steps: list[tuple[Any, ...]]
) -> None:
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.tokens["operator"] = OPERATOR_TOKEN
    for agent, (role, interests) in zip(AGENTS, profiles, strict=True):
        h.register(agent, role, via=OPERATOR_TOKEN, authority=6, interests=interests)
        subscribe(h, agent, COORDINATION_EVENTS)
    live = list(AGENTS)
    state = h.field.state

    def pick(i: int) -> str:
        return live[i % len(live)]

    def ids() -> list[str]:
        return sorted(state.tasks)

    for kind, *args in steps:
        if not live:
            break
        try:
            if kind == "create":
                who, title, target, assigned = args
                payload = {"action": "create", "title": title}
                if assigned:
                    payload["assignee"] = pick(target)
                h.send("COORDINATE", pick(who), payload)
            elif kind == "act" and ids():
                who, action, task, target = args
                payload = {"action": action, "task_id": ids()[task % len(ids())]}
                if action == "assign":
                    payload["assignee"] = pick(target)
                h.send("COORDINATE", "operator" if who == 0 else pick(who), payload)
            elif kind == "handoff" and ids():
                task, target = args
                tid = ids()[task % len(ids())]
                sender = state.tasks[tid]["assignee"] or "operator"
                h.send("HANDOFF", sender, {"task_id": tid, "to_agent_id": pick(target)})
            elif kind == "session":
                who, action = args
                mine = sorted(state.sessions)
                payload = {"action": action, "name": "market sizing"}
                if action != "create":
                    if not mine:
                        continue
                    payload = {"action": action, "session_id": mine[-1]}
                h.send("SESSION", pick(who), payload)
            elif kind == "subscribe":
                who, floor = args
                subscribe(h, pick(who), COORDINATION_EVENTS, min_relevance=floor)
            elif kind == "deregister":
                (who,) = args
                agent = pick(who)
                h.send("DEREGISTER", agent, {"agent_id": agent})
                live.remove(agent)
        except FieldError:
            pass  # refused steps change nothing
    check_against_reference(h)
    check_splits(h)
    assert_replays(h)


def test_events_are_built_from_the_entry_alone() -> None:
    """event_of reads the entry (and unit contents): the same live and when replayed."""
    h = field()
    task = create_task(h, "lead", assignee="worker")
    _record(h, "worker", "DACH market is 1bn", task_id=task["id"])
    send(h, "HANDOFF", "worker", {"task_id": task["id"], "to_agent_id": "other"})
    live = [event_of(e, h.field.state.units) for e in h.stored()]
    replayed = h.replayed()
    again = [event_of(e, replayed.state.units) for e in h.stored()]
    assert live == again
    handoff = [e for e in live if isinstance(e, FieldEvent) and e.name == "handoff.incoming"]
    assert len(handoff) == 1 and handoff[0].entity_type == "handoff"
    assert handoff[0].acting == ("other",)
