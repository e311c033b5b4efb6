"""REPLAY and COMPACT in the pure core (no event loop, no I/O), and reads by position."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from field.contract.errors import FieldError
from field.contract.model import UNIT_STATUSES, Limits
from field.core.context import Outcome
from field.core.entities import entities_of
from field.core.field import Field
from field.core.history import COMPACT_AUTHORITY, COMPACT_TRANSITIONS, SUMMARY_KEY_EVENTS
from field.engine.service import FieldService
from field.store import EventLog, LogEntry, MemoryEventLog, SQLiteEventLog, StoredEntry
from field.subscriptions.events import event_of
from field.subscriptions.matcher import Matcher

from .conftest import UNLOADED_POLICY
from .core_util import Harness
from .schema_util import assert_valid

OPERATOR_TOKEN = "operator-token-for-history-tests"


def make(**kwargs: Any) -> Harness:
    h = Harness(operator_token=OPERATOR_TOKEN, **kwargs)
    h.register("a", "researcher")
    h.register("b", "analyst")
    h.register("lead", "lead", via=OPERATOR_TOKEN, authority=8)
    h.register("senior", "lead", via=OPERATOR_TOKEN, authority=6)
    h.register("auditor", "auditor", authority=0)
    return h


def replay(h: Harness, target_type: str, target_id: str, depth: str, agent: str = "a") -> Any:
    payload = {"target_type": target_type, "target_id": target_id, "depth": depth}
    response = h.send("REPLAY", agent, payload)
    assert_valid("replay.response", response)
    return response


def compact(h: Harness, strategy: str, agent: str = "lead", **flt: Any) -> Any:
    response = h.send("COMPACT", agent, {"strategy": strategy, "filter": flt})
    assert_valid("compact.response", response)
    return response


def refused(h: Harness, operation: str, agent: str, payload: Any, code: str) -> FieldError:
    entries = len(h.entries)
    with pytest.raises(FieldError) as info:
        h.send(operation, agent, payload)
    assert info.value.code == code, info.value.message
    assert_valid("error", info.value.to_response())
    assert len(h.entries) == entries  # a refusal changes nothing
    return info.value


def about(h: Harness, *ids: str) -> list[StoredEntry]:
    """The stored entries naming any of ``ids`` (units, conflicts, tasks, sessions)."""
    wanted = set(ids)
    return [e for e in h.stored() if {i for _, i in entities_of(e.data)} & wanted]


def assert_same_state(h: Harness) -> None:
    """The projection equals the replay of the log, for everything COMPACT touches."""
    live, replayed = h.field.state, h.replayed().state
    assert replayed.units == live.units
    assert replayed.purged == live.purged
    assert +replayed.unit_statuses == +live.unit_statuses
    assert +replayed.units_by_agent == +live.units_by_agent
    assert replayed.index.status.view.tolist() == live.index.status.view.tolist()
    assert replayed.applied_position == live.applied_position == len(h.entries)
    for entity in [("unit", u) for u in live.known_units] + [("task", "t-1")]:
        assert replayed.history.positions(entity) == live.history.positions(entity)


class Chain:
    """d1 (decision, task t-1) <-contradicts- f2 (conflict c); f3 elaborates f2; f4 on f3."""

    def __init__(self, h: Harness) -> None:
        self.d1 = h.record("a", "We launch in March. Pricing later.", memory_type="decision",
                           task_id="t-1")["memory_unit_id"]  # fmt: skip
        written = h.record("b", "March is too early", relations=[contra(self.d1)])
        self.f2, self.c = written["memory_unit_id"], written["conflicts_detected"][0]
        self.f3 = h.record("a", "Because of QA", relations=[rel("elaborates", self.f2)])[
            "memory_unit_id"
        ]
        self.f4 = h.record("b", "QA needs 6 weeks", relations=[rel("elaborates", self.f3)])[
            "memory_unit_id"
        ]
        self.other = h.record("a", "unrelated finding")["memory_unit_id"]


def rel(kind: str, target: str) -> dict[str, Any]:
    return {"type": kind, "target_id": target}


def contra(target: str) -> dict[str, Any]:
    return rel("contradicts", target)


# -- the entity convention -------------------------------------------------------------


def test_entities_by_the_data_key_convention() -> None:
    unit = {"id": "m1", "intent": {"task_id": "t1"}, "source": {"session_id": "s1"}}
    assert entities_of({"unit": unit}) == [("unit", "m1"), ("task", "t1"), ("session", "s1")]
    assert entities_of({"memory_unit_id": "m1", "conflict_id": "c1"}) == [
        ("unit", "m1"),
        ("conflict", "c1"),
    ]
    assert entities_of({"conflict": {"id": "c1", "unit_a": "x"}}) == [("conflict", "c1")]
    assert entities_of({"task": {"id": "t1"}, "session_id": "s1"}) == [
        ("task", "t1"),
        ("session", "s1"),
    ]
    assert entities_of({"task_id": "t1", "session": {"id": "s1"}}) == [
        ("task", "t1"),
        ("session", "s1"),
    ]
    assert entities_of({"agent": {"id": "a"}, "until": 4, "unit": "not an object"}) == []


# -- REPLAY of units and decisions ---------------------------------------------------------


def test_detailed_is_the_unit_and_its_direct_links_in_log_order() -> None:
    h = make()
    chain = Chain(h)
    response = replay(h, "memory_unit", chain.d1, "detailed")
    expected = about(h, chain.d1, chain.f2, chain.c)
    assert [e["epoch"] for e in response["timeline"]] == [e.epoch for e in expected]
    assert [e["event_type"] for e in response["timeline"]] == [e.kind for e in expected]
    assert response["total_events"] == len(expected) == 5
    assert response["agents_involved"] == ["a", "b"]
    first = response["timeline"][0]
    assert first == {
        "epoch": expected[0].epoch,
        "event_type": "memory.recorded",
        "agent_id": "a",
        "description": f"a recorded decision {chain.d1}: We launch in March. Pricing later.",
        "memory_unit_id": chain.d1,
        "task_id": "t-1",
    }
    units = {e["memory_unit_id"] for e in response["timeline"]}
    assert chain.f3 not in units and chain.f4 not in units


def test_full_trace_follows_links_transitively() -> None:
    h = make()
    chain = Chain(h)
    response = replay(h, "decision", chain.d1, "full_trace")
    expected = about(h, chain.d1, chain.f2, chain.c, chain.f3, chain.f4)
    assert [(e["epoch"], e["event_type"]) for e in response["timeline"]] == [
        (e.epoch, e.kind) for e in expected
    ]
    assert response["total_events"] == len(expected)
    assert chain.other not in {e["memory_unit_id"] for e in response["timeline"]}
    # the chain is symmetric: the far end reaches the decision
    back = replay(h, "memory_unit", chain.f4, "full_trace")
    assert back["total_events"] == response["total_events"]


def test_summary_has_the_whole_chain_counted_and_only_key_events_shown() -> None:
    h = make()
    chain = Chain(h)
    response = replay(h, "decision", chain.d1, "summary")
    own = about(h, chain.d1)
    assert [e["event_type"] for e in response["timeline"]] == [e.kind for e in own]
    assert response["total_events"] == replay(h, "decision", chain.d1, "full_trace")["total_events"]
    assert response["agents_involved"] == ["a", "b"]
    summary = response["summary"]
    assert summary.startswith(f"decision {chain.d1} by a, now contested")
    assert "4 units and 1 conflict" in summary and "by a, b" in summary


def test_summary_keeps_the_first_and_last_key_events_of_a_busy_target() -> None:
    h = make()
    for i in range(SUMMARY_KEY_EVENTS + 5):
        h.record("a", f"step {i}", task_id="t-busy")
    response = replay(h, "task", "t-busy", "summary")
    assert response["total_events"] == SUMMARY_KEY_EVENTS + 5
    shown = [e["description"] for e in response["timeline"]]
    assert len(shown) == SUMMARY_KEY_EVENTS
    assert shown[0].endswith("step 0") and shown[-1].endswith(f"step {SUMMARY_KEY_EVENTS + 4}")


def test_a_unit_that_is_not_a_decision_is_not_a_decision() -> None:
    h = make()
    chain = Chain(h)
    payload = {"target_type": "decision", "target_id": chain.f2, "depth": "summary"}
    error = refused(h, "REPLAY", "a", payload, "UNIT_NOT_FOUND")
    assert "finding, not a decision" in error.message
    assert error.http_status == 404


@pytest.mark.parametrize(
    ("target_type", "code"),
    [
        ("memory_unit", "UNIT_NOT_FOUND"),
        ("decision", "UNIT_NOT_FOUND"),
        ("conflict", "CONFLICT_NOT_FOUND"),
        ("task", "TASK_NOT_FOUND"),
        ("session", "SESSION_NOT_FOUND"),
    ],
)
def test_unknown_targets_get_their_not_found_code(target_type: str, code: str) -> None:
    h = make()
    Chain(h)
    payload = {"target_type": target_type, "target_id": "nothing-1", "depth": "detailed"}
    assert refused(h, "REPLAY", "a", payload, code).http_status == 404


def test_bad_replay_payloads_are_invalid() -> None:
    h = make()
    for payload in (
        {"target_type": "unit", "target_id": "m", "depth": "summary"},
        {"target_type": "task", "target_id": "m"},
        {"target_type": "task", "target_id": "m", "depth": "all"},
        {"target_type": "task", "target_id": "", "depth": "summary"},
    ):
        refused(h, "REPLAY", "a", payload, "INVALID_PAYLOAD")


# -- REPLAY of conflicts, tasks, sessions ---------------------------------------------------


def test_conflict_at_each_depth() -> None:
    h = make()
    chain = Chain(h)
    detailed = replay(h, "conflict", chain.c, "detailed")
    assert detailed["total_events"] == len(about(h, chain.c, chain.d1, chain.f2))
    full = replay(h, "conflict", chain.c, "full_trace")
    assert full["total_events"] == len(about(h, chain.c, chain.d1, chain.f2, chain.f3, chain.f4))
    summary = replay(h, "conflict", chain.c, "summary")
    assert [e["event_type"] for e in summary["timeline"]] == [
        "conflict.detected",
        "memory.contested",
        "memory.contested",
    ]
    assert summary["summary"].startswith(
        f"conflict {chain.c} (factual, detected) between {chain.d1} and {chain.f2}"
    )


def test_task_and_session_at_each_depth() -> None:
    h = make()
    opening = {"action": "create", "name": "launch", "invitees": ["b"]}
    session_id = h.send("SESSION", "a", opening)["session"]["id"]
    h.send("SESSION", "b", {"action": "join", "session_id": session_id})
    created = h.send(
        "COORDINATE", "a", {"action": "create", "title": "size it"}, session_id=session_id
    )
    task_id = created["task"]["id"]
    x = h.send("RECORD", "a", unit_payload("in session", task_id=task_id), session_id=session_id)
    h.send("RECORD", "b", unit_payload("also in session"), session_id=session_id)
    y = h.record("b", "builds on x", relations=[rel("elaborates", x["memory_unit_id"])])
    h.record("a", "builds on y", relations=[rel("supports", y["memory_unit_id"])])
    h.record("a", "elsewhere")
    task = {d: replay(h, "task", task_id, d) for d in ("summary", "detailed", "full_trace")}
    kinds = [e["event_type"] for e in task["detailed"]["timeline"]]
    assert kinds == ["task.created", "memory.recorded"]  # the task and its unit x
    assert task["full_trace"]["total_events"] == 4  # and y linked to x, and the unit on y
    assert task["summary"]["total_events"] == 4
    assert task["summary"]["timeline"][0]["task_id"] == task_id
    session = {
        d: replay(h, "session", session_id, d) for d in ("summary", "detailed", "full_trace")
    }
    kinds = [e["event_type"] for e in session["detailed"]["timeline"]]
    assert kinds == ["session.created", "session.joined", "memory.recorded", "memory.recorded"]
    assert session["full_trace"]["total_events"] == 6  # with y and the unit on y
    assert session["summary"]["agents_involved"] == ["a", "b"]
    assert len(session["summary"]["timeline"]) == 4  # the session's own events


def unit_payload(content: str, task_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "finding",
        "content": content,
        "intent": {"purpose": "test", "task_id": task_id},
        "confidence": {"score": 0.6, "reasoning": "r"},
    }


# -- bounds, authority, reading the log ------------------------------------------------------


def test_past_the_bound_full_trace_is_too_large_and_summary_still_answers() -> None:
    h = make(limits=Limits(max_replay_events=4))
    chain = Chain(h)
    payload = {"target_type": "decision", "target_id": chain.d1, "depth": "full_trace"}
    error = refused(h, "REPLAY", "a", payload, "REPLAY_TOO_LARGE")
    assert error.recoverable and error.http_status == 422
    assert "summary" in (error.suggested_action or "")
    refused(h, "REPLAY", "a", {**payload, "depth": "detailed"}, "REPLAY_TOO_LARGE")
    summary = replay(h, "decision", chain.d1, "summary")
    assert summary["total_events"] == 7
    small = replay(h, "memory_unit", chain.other, "full_trace")
    assert small["total_events"] == 1


def test_summary_past_its_own_bound_says_it_read_part() -> None:
    h = make(limits=Limits(max_replay_events=1))  # a summary reads up to 10 events
    hub = h.record("a", "hub", memory_type="decision")["memory_unit_id"]
    for i in range(12):
        h.record("b", f"spoke {i}", relations=[rel("supports", hub)])
    summary = replay(h, "decision", hub, "summary")
    assert summary["total_events"] == 10  # the walk stopped at 10 units
    assert summary["summary"].endswith("only its first 10 units and conflicts were walked.)")


def test_an_audit_agent_may_replay() -> None:
    h = make()
    chain = Chain(h)
    assert replay(h, "decision", chain.d1, "detailed", agent="auditor")["total_events"] == 5


def test_replay_reads_exactly_the_chain_from_the_log() -> None:
    h = make()
    chain = Chain(h)
    asked: list[list[int]] = []

    def reader(positions: Any, *, max_bytes: int | None = None) -> list[StoredEntry]:
        asked.append(list(positions))
        return h.read_positions(asked[-1], max_bytes=max_bytes)

    h.field.read_entries = reader
    replay(h, "memory_unit", chain.f4, "detailed")
    expected = [e.position for e in about(h, chain.f4, chain.f3)]
    assert asked == [expected]
    # what the timeline says comes from the log, not from the state
    h.field.read_entries = lambda ps, max_bytes=None: [
        StoredEntry(e.position, e.epoch, e.kind, e.data, "someone-else", e.ts)
        for e in h.read_positions(ps, max_bytes=max_bytes)
    ]
    assert replay(h, "memory_unit", chain.f4, "detailed")["agents_involved"] == ["someone-else"]


def test_a_field_without_a_log_reader_refuses_replay() -> None:
    h = make()
    chain = Chain(h)
    h.field.read_entries = None
    payload = {"target_type": "memory_unit", "target_id": chain.d1, "depth": "summary"}
    refused(h, "REPLAY", "a", payload, "UNSUPPORTED_OPERATION")


def test_replay_in_the_same_batch_as_the_write_it_reads() -> None:
    """The service serves positions its batch has applied but not yet stored."""

    async def run() -> tuple[Outcome, bool]:
        service = FieldService(MemoryEventLog(), Field, admission=UNLOADED_POLICY)
        await service.start()
        try:
            registered = await service.execute(
                lambda f: f.handle(envelope("REGISTER", {"id": "a", "role": "r"}), token=None)
            )
            token = registered.response["token"]
            unstored: list[bool] = []

            def replay_job(f: Field) -> Outcome:
                unit_id = next(reversed(f.state.units))
                unstored.append(f.state.applied_position > service.log.last_position())
                payload = {
                    "target_type": "memory_unit",
                    "target_id": unit_id,
                    "depth": "full_trace",
                }
                return f.handle(envelope("REPLAY", payload), token=token)

            _, replayed = await asyncio.gather(
                service.execute(
                    lambda f: f.handle(envelope("RECORD", unit_payload("x")), token=token)
                ),
                service.execute(replay_job),
            )
        finally:
            await service.stop()
        return replayed, unstored == [True]

    replayed, same_batch = asyncio.run(run())
    assert same_batch
    assert [e["event_type"] for e in replayed.response["timeline"]] == ["memory.recorded"]
    assert replayed.response["agents_involved"] == ["a"]


def envelope(operation: str, payload: dict[str, Any], agent_id: str = "a") -> dict[str, Any]:
    return {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": f"msg-{operation}",
        "operation": operation,
        "agent_id": agent_id,
        "session_id": None,
        "epoch": 0,
        "payload": payload,
    }


# -- COMPACT: authority, filters, bounds ---------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "strategy", "allowed"),
    [
        ("a", "archive", False),
        ("a", "summarize", False),
        ("a", "purge", False),
        ("senior", "archive", True),
        ("senior", "summarize", True),
        ("senior", "purge", False),
        ("lead", "purge", True),
    ],
)
def test_compact_authority(agent: str, strategy: str, allowed: bool) -> None:
    h = make()
    h.record("a", "old finding")
    payload = {"strategy": strategy, "filter": {"types": ["finding"]}}
    level = h.field.state.agents[agent].authority
    assert allowed == (level >= COMPACT_AUTHORITY[strategy])
    if allowed:
        assert compact(h, strategy, agent, types=["finding"])["units_affected"] == 1
    else:
        error = refused(h, "COMPACT", agent, payload, "INSUFFICIENT_AUTHORITY")
        assert error.http_status == 403 and not error.recoverable


@pytest.mark.parametrize(
    "flt",
    [{}, {"max_age_epochs": None, "session_id": None, "types": [], "status": []}],
)
def test_a_filter_that_names_nothing_is_refused(flt: dict[str, Any]) -> None:
    h = make()
    h.record("a", "x")
    payload = {"strategy": "archive", "filter": flt}
    error = refused(h, "COMPACT", "lead", payload, "INVALID_PAYLOAD")
    assert "names nothing" in error.message


def test_max_age_epochs_is_inclusive_of_the_boundary() -> None:
    h = make()
    units = [h.record("a", f"unit {i}") for i in range(3)]
    epochs = [u["epoch"] for u in units]
    # the next operation runs at epoch E = current + 1; match iff epoch <= E - age
    age = (h.field.epoch + 1) - epochs[1]
    response = compact(h, "archive", max_age_epochs=age)
    assert response["units_affected"] == 2
    statuses = [h.field.state.units[u["memory_unit_id"]]["status"] for u in units]
    assert statuses == ["archived", "archived", "active"]


def test_session_types_and_status_filters_must_all_match() -> None:
    h = make()
    s1 = h.send("SESSION", "a", {"action": "create", "name": "s-1"})["session"]["id"]
    in_session = h.send("RECORD", "a", unit_payload("in s-1"), session_id=s1)
    h.send("RECORD", "a", {**unit_payload("decision in s-1"), "type": "decision"}, session_id=s1)
    h.record("a", "no session")
    # the lead sees nothing of a session it is not in (spec 11.3): nothing to compact
    response = compact(h, "archive", session_id=s1, types=["finding"], status=["active"])
    assert response["units_affected"] == 0
    h.send("SESSION", "a", {"action": "invite", "session_id": s1, "invitees": ["lead"]})
    h.send("SESSION", "lead", {"action": "join", "session_id": s1})
    response = compact(h, "archive", session_id=s1, types=["finding"], status=["active"])
    assert response["units_affected"] == 1
    archived = [u["id"] for u in h.field.state.units.values() if u["status"] == "archived"]
    assert archived == [in_session["memory_unit_id"]]


def test_units_in_unresolved_conflicts_are_never_compacted() -> None:
    h = make()
    chain = Chain(h)
    response = compact(h, "purge", status=["contested", "active"])
    assert response["units_affected"] == 3  # f3, f4, other; not d1 nor f2
    assert set(h.field.state.units) == {chain.d1, chain.f2}


def test_one_compact_changes_at_most_max_compact_units_oldest_first() -> None:
    h = make(limits=Limits(max_compact_units=2))
    ids = [h.record("a", f"unit {i}")["memory_unit_id"] for i in range(5)]
    first = compact(h, "archive", types=["finding"])
    assert (first["units_affected"], first["units_remaining"]) == (2, 3)
    assert [h.field.state.units[i]["status"] for i in ids[:3]] == ["archived", "archived", "active"]
    compact(h, "archive", types=["finding"])
    last = compact(h, "archive", types=["finding"])
    assert (last["units_affected"], last["units_remaining"]) == (1, 0)
    assert compact(h, "archive", types=["finding"])["units_affected"] == 0


# -- COMPACT: the transition table, every status under every strategy ------------------------


def plant(h: Harness, status: str) -> str:
    """A unit recorded directly in ``status`` (as a later operation may leave one)."""
    unit_id = f"mem-planted-{status}"
    unit = {
        "id": unit_id,
        "mode": "committed",
        "type": "observation",
        "content": f"planted {status}",
        "intent": {"purpose": "test", "task_id": None, "question": None},
        "confidence": {"score": 0.5, "reasoning": "r"},
        "relations": [],
        "source": {
            "agent_id": "a",
            "agent_role": "researcher",
            "session_id": None,
            "timestamp": "2026-01-01T00:00:00.000Z",
        },
        "status": status,
        "epoch": h.field.epoch + 1,
    }
    entry = LogEntry(unit["epoch"], "memory.recorded", {"unit": unit}, "a", h.time)
    h.field.state.apply(entry)
    h.entries.append(entry)
    return unit_id


@pytest.mark.parametrize("strategy", sorted(COMPACT_TRANSITIONS))
@pytest.mark.parametrize("status", UNIT_STATUSES)
def test_every_status_under_every_strategy(strategy: str, status: str) -> None:
    h = make()
    unit_id = plant(h, status)
    response = compact(h, strategy, status=[status])
    after = COMPACT_TRANSITIONS[strategy].get(status)
    state = h.field.state
    if after is None:  # an illegal transition: the unit is left alone
        assert response["units_affected"] == 0
        assert state.units[unit_id]["status"] == status
    elif after == "purged":
        assert response["units_affected"] == 1
        assert unit_id not in state.units and state.purged[unit_id]["status"] == "purged"
    else:
        assert response["units_affected"] == 1
        assert state.units[unit_id]["status"] == after
    assert_same_state(h)


# -- archive ------------------------------------------------------------------------------


def test_archived_units_leave_attune_unless_asked_for() -> None:
    h = make()
    kept = h.record("a", "market pricing kept")["memory_unit_id"]
    old = h.record("a", "market pricing old", memory_type="observation")["memory_unit_id"]
    compact(h, "archive", types=["observation"])

    def seen(**scope: Any) -> set[str]:
        response = h.attune("b", **scope)
        assert_valid("attune.response", response)
        return {item["memory_unit"]["id"] for item in response["record"]}

    assert seen() == {kept}
    assert seen(include_archived=True) == {kept, old}
    assert h.field.status()["counts"]["memory_units"] == {"active": 1, "archived": 1}
    entry = h.stored()[-1]
    assert (entry.kind, entry.data) == (
        "memory.archived",
        {"memory_unit_id": old, "reason": "archived by COMPACT"},
    )
    assert_same_state(h)


# -- summarize ---------------------------------------------------------------------------


def test_summarize_groups_originals_into_synthesis_units_then_archives_them() -> None:
    h = make()
    findings = [h.record("a", f"finding {i}. detail", task_id="t-1") for i in range(20)]
    notes = [h.record("b", f"note {i}", memory_type="observation") for i in range(3)]
    before = len(h.entries)
    response = compact(h, "summarize", "senior", types=["finding", "observation"])
    assert (response["units_affected"], response["synthesis_units_created"]) == (23, 3)
    assert response["storage_reclaimed_bytes"] == 0
    state = h.field.state
    syntheses = [u for u in state.units.values() if u["type"] == "synthesis"]
    assert [len(u["relations"]) for u in syntheses] == [16, 4, 3]  # (task, type) groups of <= 16
    for synthesis in syntheses:
        assert_valid("memory-unit", synthesis)
        assert synthesis["status"] == "active" and synthesis["source"]["agent_id"] == "senior"
        assert {r["type"] for r in synthesis["relations"]} == {"caused_by"}
        for relation in synthesis["relations"]:
            assert relation["target_id"] in synthesis["content"]
            assert state.units[relation["target_id"]]["status"] == "archived"
    assert syntheses[0]["intent"]["task_id"] == "t-1"
    assert syntheses[0]["content"].startswith("Summary of 16 finding units, task t-1:")
    assert "finding 0. detail" in syntheses[0]["content"]
    originals = {u["memory_unit_id"] for u in findings + notes}
    assert {r["target_id"] for s in syntheses for r in s["relations"]} == originals
    kinds = [e.kind for e in h.stored()[before:]]
    assert kinds.count("memory.recorded") == 3 and kinds.count("memory.archived") == 23
    # the synthesis is the chain that leads back to its originals
    trace = replay(h, "memory_unit", syntheses[2]["id"], "detailed")
    assert {e["memory_unit_id"] for e in trace["timeline"]} == {
        syntheses[2]["id"],
        *(n["memory_unit_id"] for n in notes),
    }
    # ATTUNE shows the syntheses instead of the originals
    record = h.attune("lead", max_units=100)["record"]
    assert {item["memory_unit"]["id"] for item in record} == {s["id"] for s in syntheses}
    assert_same_state(h)


# -- purge --------------------------------------------------------------------------------


def test_purge_leaves_a_tombstone_in_the_log_and_the_unit_leaves_the_active_store() -> None:
    h = make()
    kept = h.record("a", "market kept")["memory_unit_id"]
    gone = h.record("a", "market gone", memory_type="observation")
    gone_id = gone["memory_unit_id"]
    unit = dict(h.field.state.units[gone_id])
    log_before = h.stored()
    response = compact(h, "purge", types=["observation"])
    assert response["units_affected"] == 1
    tombstone_bytes = len(orjson.dumps(h.field.state.purged[gone_id]))
    assert response["storage_reclaimed_bytes"] == len(orjson.dumps(unit)) - tombstone_bytes > 0
    # the log only grew: every old entry is still there, unchanged
    assert h.stored()[: len(log_before)] == log_before
    entry = h.stored()[-1]
    assert entry.kind == "memory.purged" and entry.agent_id == "lead"
    assert entry.data == {
        "memory_unit_id": gone_id,
        "reason": "purged by COMPACT (lead)",
        "purged_at": "2026-05-28T20:26:40.000Z",
    }
    state = h.field.state
    assert gone_id not in state.units and "content" not in state.purged[gone_id]
    assert {i["memory_unit"]["id"] for i in h.attune("b", include_archived=True)["record"]} == {
        kept
    }
    assert state.units_by_agent["a"] == 1
    assert h.field.status()["counts"]["memory_units"] == {"active": 1}
    payload = {**unit_payload("relates to the purged"), "relations": [rel("supports", gone_id)]}
    refused(h, "RECORD", "a", payload, "UNIT_NOT_FOUND")
    # its history is still in the log, and REPLAY reads it
    trace = replay(h, "memory_unit", gone_id, "full_trace")
    assert [e["event_type"] for e in trace["timeline"]] == ["memory.recorded", "memory.purged"]
    assert trace["summary"].startswith(f"observation {gone_id} by a, now purged.")
    assert_same_state(h)


def test_readers_of_old_entries_still_resolve_purged_units() -> None:
    """Conflict listings and replayed notification streams after a purge."""
    h = make()
    h.send("SUBSCRIBE", "b", {"action": "subscribe", "subscription": {"events": ALL_MEMORY}})
    x = plant(h, "active")
    y = h.record("a", "contradicts x", relations=[contra(x)])
    z = h.record("a", "supersedes y", relations=[rel("supersedes", y["memory_unit_id"])])
    conflict = {**h.field.state.conflicts[y["conflicts_detected"][0]], "status": "resolved"}
    resolved = LogEntry(h.field.epoch + 1, "conflict.detected", {"conflict": conflict}, "a", h.time)
    h.field.state.apply(resolved)  # as a resolution would leave it
    h.entries.append(resolved)
    before = notifications(h)
    compact(h, "purge", status=["contested", "superseded", "active"])
    assert {x, y["memory_unit_id"], z["memory_unit_id"]} <= set(h.field.state.purged)
    after = notifications(h)
    assert [n[:2] for n in after] == [n[:2] for n in before]  # same events, same scores
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert changed and all(b[2].endswith("(since purged)") for _, b in changed)
    assert len(h.field.list_conflicts(h.field.state.agents["a"], involving_agents=["a"])) == 1
    assert h.attune("b")["conflicts"] == []
    assert_same_state(h)


ALL_MEMORY = ["memory.recorded", "memory.superseded", "memory.contested", "conflict.detected"]


def notifications(h: Harness) -> list[tuple[int, float, str]]:
    """The whole stream of every subscription, replayed from the log as push does it."""
    state = h.field.state
    events = [e for e in (event_of(s, state.known_units) for s in h.stored()) if e is not None]
    matcher = Matcher(state.registry, state.index, state.known_units)
    return [
        (m.event.position, round(float(score), 9), m.event.summary)
        for m in matcher.match(events)
        for score in m.relevance.tolist()
    ]


# -- reading the log by position, on every backend -----------------------------------------


@pytest.fixture(params=["memory", "sqlite", "fallback"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        backend: EventLog = SQLiteEventLog(tmp_path / "log.db")
    else:
        backend = MemoryEventLog()
    backend.append([LogEntry(n, "test", {"n": n}, f"agent-{n}", n / 2) for n in range(1, 1201)])
    yield backend
    backend.close()


def read(log: EventLog, positions: Any, fallback: bool) -> list[StoredEntry]:
    return EventLog.read_positions(log, positions) if fallback else log.read_positions(positions)


@pytest.mark.parametrize("fallback", [False, True])
def test_read_positions_returns_those_entries_ascending_once(log: EventLog, fallback: bool) -> None:
    wanted = [1200, 3, 700, 3, 1, 0, -4, 1201, 99999]
    entries = read(log, iter(wanted), fallback)
    assert [e.position for e in entries] == [1, 3, 700, 1200]
    assert entries == [log.read(p - 1, 1)[0] for p in (1, 3, 700, 1200)]
    assert entries[2].data == {"n": 700} and entries[2].agent_id == "agent-700"


@pytest.mark.parametrize("fallback", [False, True])
def test_read_positions_spans_many_queries(log: EventLog, fallback: bool) -> None:
    every_other = range(2, 1201, 2)
    assert [e.position for e in read(log, every_other, fallback)] == list(every_other)
    assert read(log, [], fallback) == []


@pytest.mark.parametrize("fallback", [False, True])
def test_read_positions_within_a_byte_budget_reads_a_prefix(log: EventLog, fallback: bool) -> None:
    """Each entry's stored data here is ``{"n":<n>}``: 7 to 10 bytes."""

    def bounded(positions: Any, max_bytes: int) -> list[int]:
        reader = EventLog.read_positions if fallback else type(log).read_positions
        return [e.position for e in reader(log, positions, max_bytes=max_bytes)]

    size = {n: len(f'{{"n":{n}}}') for n in range(1, 1201)}
    wanted = [5, 1000, 12, 800]
    assert bounded(wanted, 10**6) == [5, 12, 800, 1000]
    assert bounded(wanted, size[5] + size[12]) == [5, 12]  # exactly full
    assert bounded(wanted, size[5] + size[12] + size[800] - 1) == [5, 12]
    assert bounded(wanted, 0) == [5], "the first entry is always read"
    assert bounded([], 0) == []


def test_a_replay_reads_a_bounded_part_of_a_huge_chain() -> None:
    """A session of units of 4,000 characters, against a read budget of 8 x 2,048 bytes:
    the summary reads a prefix and says so; a detailed timeline is refused."""
    h = make(limits=Limits(max_response_bytes=2048))
    session = h.send("SESSION", "a", {"action": "create", "name": "big"})["session"]["id"]
    for i in range(12):
        payload = {
            "type": "finding",
            "content": f"{i} " + "x" * 4000,
            "intent": {"purpose": "fill"},
            "confidence": {"score": 0.5, "reasoning": "r"},
        }
        h.send("RECORD", "a", payload, session_id=session)
    summary = replay(h, "session", session, "summary")
    assert summary["total_events"] >= 13
    assert "events of the chain were read" in summary["summary"]
    with pytest.raises(FieldError) as info:
        h.send("REPLAY", "a", {"target_type": "session", "target_id": session, "depth": "detailed"})
    assert info.value.code == "REPLAY_TOO_LARGE" and info.value.recoverable
