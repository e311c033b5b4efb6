"""The Field core, driven directly: no event loop, no socket, no database."""

from __future__ import annotations

from typing import Any

import pytest

from field.contract.clock import RESERVATION_BLOCK
from field.contract.errors import Code, FieldError
from field.contract.model import MAX_EPOCH, OPERATIONS
from field.core.field import SUPPORTED_OPERATIONS, Field

from .core_util import Harness


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.register("alice", "market_researcher", interests=["market size"])
    harness.register("bob", "strategist", interests=["pricing"])
    return harness


def error_of(fn: Any, *args: Any, **kwargs: Any) -> FieldError:
    with pytest.raises(FieldError) as info:
        fn(*args, **kwargs)
    return info.value


def snapshot(h: Harness) -> tuple[Any, ...]:
    state = h.field.state
    return (
        state.clock.value,
        len(h.entries),
        len(state.units),
        len(state.agents),
        len(state.conflicts),
        [u["status"] for u in state.units.values()],
    )


# -- REGISTER / DEREGISTER ----------------------------------------------------


def test_register_returns_agent_capabilities_and_token() -> None:
    h = Harness()
    response = h.register("alice", "market_researcher", interests=["market size"])
    assert response["status"] == "registered"
    assert response["agent"]["status"] == "idle"
    assert response["agent"]["interests"] == ["market size"]
    caps = response["field_capabilities"]
    assert caps["conformance_level"] == 3
    assert caps["supported_operations"] == list(SUPPORTED_OPERATIONS)
    assert caps["protocol_version"] == "0.1.0"
    assert response["token"] == "token-1"
    registered = [e for e in h.entries if e.kind == "agent.registered"]
    assert "token-1" not in repr(registered), "the token itself must never be logged"


def test_register_duplicate_id_is_refused(h: Harness) -> None:
    error = error_of(h.register, "alice", "other")
    assert error.code == Code.AGENT_ID_TAKEN
    assert error.recoverable


def test_register_with_unsupported_required_operations_is_rejected(h: Harness) -> None:
    error = error_of(h.register, "carol", "x", required_operations=["RECORD", "REPLAY", "NOPE"])
    assert error.code == Code.UNSUPPORTED_OPERATION
    assert error.details is not None
    assert error.details["missing_operations"] == ["NOPE"]
    assert error.details["status"] == "rejected"
    assert "carol" not in h.field.state.agents


def test_register_payload_id_must_be_the_sender(h: Harness) -> None:
    error = error_of(h.send, "REGISTER", "carol", {"id": "dave", "role": "x"})
    assert error.code == Code.FORBIDDEN


def test_deregister_keeps_units_and_revokes_token(h: Harness) -> None:
    h.record("alice")
    h.record("alice")
    response = h.send("DEREGISTER", "alice", {"agent_id": "alice"})
    assert response["cleanup"] == {"units_orphaned": 2, "tasks_reassigned": 0}
    assert "alice" not in h.field.state.agents
    assert len(h.attune("bob")["record"]) == 2
    error = error_of(h.record, "alice")
    assert error.code == Code.AGENT_NOT_REGISTERED
    # the id is free again, with a new token
    assert h.register("alice", "market_researcher")["token"] != "token-1"


def test_deregister_of_another_agent_is_forbidden(h: Harness) -> None:
    assert error_of(h.send, "DEREGISTER", "alice", {"agent_id": "bob"}).code == Code.FORBIDDEN


# -- authentication -------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "code"),
    [(None, Code.UNAUTHENTICATED), ("", Code.UNAUTHENTICATED), ("forged", Code.UNAUTHENTICATED)],
)
def test_requests_without_a_valid_token_are_refused(
    h: Harness, token: str | None, code: str
) -> None:
    before = snapshot(h)
    payload = {"scope": {"role": "x", "max_units": 1}}
    error = error_of(h.field.handle, _envelope("ATTUNE", "alice", payload), token=token)
    assert error.code == code
    assert snapshot(h) == before


def test_an_agent_cannot_act_as_another(h: Harness) -> None:
    error = error_of(h.send, "RECORD", "alice", {}, token=h.tokens["bob"])
    assert error.code == Code.FORBIDDEN


def _envelope(operation: str, agent_id: str, payload: dict[str, Any], epoch: int = 0) -> Any:
    return {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "m",
        "operation": operation,
        "agent_id": agent_id,
        "session_id": None,
        "epoch": epoch,
        "payload": payload,
    }


# -- RECORD -------------------------------------------------------------------


def test_record_generates_id_epoch_source_and_status(h: Harness) -> None:
    response = h.record("alice", "EU HR SaaS grows 23%", task_id="t1")
    unit = h.field.state.units[response["memory_unit_id"]]
    assert response["status"] == "accepted"
    assert unit["epoch"] == response["epoch"]
    assert unit["status"] == "active"
    assert unit["source"] == {
        "agent_id": "alice",
        "agent_role": "market_researcher",
        "session_id": None,
        "timestamp": "2026-05-28T20:26:40.000Z",
    }


def test_draft_needs_no_confidence_and_is_draft(h: Harness) -> None:
    payload = {"mode": "draft", "type": "observation", "content": "c", "intent": {"purpose": "p"}}
    response = h.send("RECORD", "alice", payload)
    assert h.field.state.units[response["memory_unit_id"]]["status"] == "draft"


def _record_payload(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "mode": "committed",
        "type": "finding",
        "content": "c",
        "intent": {"purpose": "p"},
        "confidence": {"score": 0.5, "reasoning": "r"},
    }
    for key, value in changes.items():
        if value is _DROP:
            payload.pop(key)
        else:
            payload[key] = value
    return payload


_DROP = object()


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (_record_payload(intent=_DROP), Code.MISSING_INTENT),
        (_record_payload(intent={"purpose": ""}), Code.MISSING_INTENT),
        (_record_payload(intent={"purpose": "  "}), Code.MISSING_INTENT),
        (_record_payload(intent="why"), Code.MISSING_INTENT),
        (_record_payload(confidence=_DROP), Code.MISSING_CONFIDENCE),
        (_record_payload(confidence={"score": 0.5}), Code.MISSING_CONFIDENCE),
        (_record_payload(confidence={"reasoning": "r"}), Code.MISSING_CONFIDENCE),
        (_record_payload(confidence={"score": 1.5, "reasoning": "r"}), Code.INVALID_CONFIDENCE),
        (_record_payload(confidence={"score": -0.1, "reasoning": "r"}), Code.INVALID_CONFIDENCE),
        (_record_payload(confidence={"score": "hi", "reasoning": "r"}), Code.INVALID_CONFIDENCE),
        (_record_payload(confidence={"score": True, "reasoning": "r"}), Code.INVALID_CONFIDENCE),
        (_record_payload(type="rumour"), Code.INVALID_TYPE),
        (_record_payload(type=_DROP), Code.INVALID_TYPE),
        (_record_payload(content=""), Code.INVALID_PAYLOAD),
        (_record_payload(content=_DROP), Code.INVALID_PAYLOAD),
        (_record_payload(mode="final"), Code.INVALID_PAYLOAD),
        (_record_payload(id="mem-mine"), Code.INVALID_PAYLOAD),
        (_record_payload(status="active"), Code.INVALID_PAYLOAD),
        (_record_payload(epoch=5), Code.INVALID_PAYLOAD),
        (_record_payload(source={}), Code.INVALID_PAYLOAD),
        (_record_payload(confidance={}), Code.INVALID_PAYLOAD),
        (_record_payload(relations=[{"type": "likes", "target_id": "x"}]), Code.INVALID_PAYLOAD),
        (_record_payload(relations=[{"type": "supports"}]), Code.INVALID_PAYLOAD),
        (
            _record_payload(relations=[{"type": "supports", "target_id": "mem-0"}]),
            Code.UNIT_NOT_FOUND,
        ),
    ],
)
def test_invalid_records_get_the_spec_code_and_change_nothing(
    h: Harness, payload: dict[str, Any], code: str
) -> None:
    before = snapshot(h)
    error = error_of(h.send, "RECORD", "alice", payload)
    assert error.code == code
    assert error.operation == "RECORD"
    assert error.to_response()["suggested_action"]
    assert snapshot(h) == before


def test_contradicts_creates_a_conflict_and_contests_both_units(h: Harness) -> None:
    first = h.record("alice", "growth is 23%")["memory_unit_id"]
    response = h.record(
        "bob",
        "growth is 14%",
        relations=[{"type": "contradicts", "target_id": first, "description": "23 vs 14"}],
    )
    [conflict_id] = response["conflicts_detected"]
    conflict = h.field.state.conflicts[conflict_id]
    assert conflict["unit_a"] == first
    assert conflict["unit_b"] == response["memory_unit_id"]
    assert (conflict["status"], conflict["detected_by"], conflict["type"]) == (
        "detected",
        "explicit",
        "factual",
    )
    assert conflict["description"] == "23 vs 14"
    units = h.field.state.units
    assert units[first]["status"] == units[response["memory_unit_id"]]["status"] == "contested"
    seen = h.attune("alice")
    assert [c["id"] for c in seen["conflicts"]] == [conflict_id]


def test_supersedes_hides_the_target_from_attune(h: Harness) -> None:
    old = h.record("alice", "old estimate")["memory_unit_id"]
    new = h.record("alice", "new estimate", relations=[{"type": "supersedes", "target_id": old}])
    assert h.field.state.units[old]["status"] == "superseded"
    ids = [r["memory_unit"]["id"] for r in h.attune("bob")["record"]]
    assert ids == [new["memory_unit_id"]]


# -- ATTUNE -------------------------------------------------------------------


def test_attune_excludes_own_units_unless_asked(h: Harness) -> None:
    mine = h.record("alice", "mine")["memory_unit_id"]
    theirs = h.record("bob", "theirs")["memory_unit_id"]
    assert [r["memory_unit"]["id"] for r in h.attune("alice")["record"]] == [theirs]
    everything = {r["memory_unit"]["id"] for r in h.attune("alice", include_own=True)["record"]}
    assert everything == {mine, theirs}


def test_attune_ranks_scores_explains_and_truncates(h: Harness) -> None:
    for _ in range(12):
        h.record("bob", "a note about market size", memory_type="observation")
    # as topical as the notes: its type (and recency) rank it first
    h.record("bob", "a note about market size", memory_type="decision")
    response = h.attune("alice", max_units=5)
    scores = [r["relevance_score"] for r in response["record"]]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert all(r["relevance_reason"] for r in response["record"])
    assert response["record"][0]["memory_unit"]["type"] == "decision"
    budget = response["context_budget"]
    assert (budget["units_returned"], budget["units_available"]) == (5, 13)


def test_interests_and_task_raise_relevance(h: Harness) -> None:
    plain = h.record("bob", "the office coffee machine is broken")["memory_unit_id"]
    interesting = h.record("bob", "pricing of competitors rose")["memory_unit_id"]
    on_task = h.record("bob", "an unrelated note", task_id="t-9")["memory_unit_id"]
    by_interest = _scores(h.attune("alice", interests=["pricing"], recency_weight=0.0))
    assert by_interest[interesting] > by_interest[plain]
    by_task = _scores(h.attune("alice", active_task_id="t-9", recency_weight=0.0))
    assert by_task[on_task] > by_task[plain]
    by_hint = _scores(h.attune("alice", context_hint="coffee machine", recency_weight=0.0))
    assert by_hint[plain] > by_hint[interesting]


def test_same_role_scores_higher(h: Harness) -> None:
    h.register("carol", "market_researcher")
    h.register("dave", "lawyer")
    peer = h.record("carol", "a note")["memory_unit_id"]
    other = h.record("dave", "a note")["memory_unit_id"]
    scores = _scores(h.attune("alice", recency_weight=0.0))
    assert scores[peer] > scores[other]


def _scores(response: dict[str, Any]) -> dict[str, float]:
    return {r["memory_unit"]["id"]: r["relevance_score"] for r in response["record"]}


def test_source_diversity_lets_a_second_agent_onto_the_page(h: Harness) -> None:
    h.register("carol", "strategist")
    for _ in range(5):
        h.record("bob", "a decision on the plan", memory_type="decision")
    # alike but for its type: it scores below each of bob's, above his third after the discount
    quiet = h.record("carol", "a decision on the plan", memory_type="finding")["memory_unit_id"]
    ids = [r["memory_unit"]["id"] for r in h.attune("alice", max_units=3)["record"]]
    assert quiet in ids


def test_relevance_threshold_filters(h: Harness) -> None:
    h.record("bob", "pricing pricing", memory_type="decision", score=1.0)
    h.record("bob", "misc", memory_type="observation", score=0.0)
    response = h.attune("alice", relevance_threshold=0.6, interests=["pricing"])
    assert len(response["record"]) == 1
    assert all(r["relevance_score"] >= 0.6 for r in response["record"])


def test_formats(h: Harness) -> None:
    long = "First sentence is short. " + "More words follow here. " * 30
    unit_id = h.record("bob", long)["memory_unit_id"]
    summary = h.attune("alice", format="summary")["record"][0]
    assert summary["format"] == "summary"
    assert summary["memory_unit"]["content"] == "First sentence is short."
    ids = h.attune("alice", format="ids_only")["record"][0]
    assert ids["memory_unit_id"] == unit_id
    assert ids["format"] == "ids_only"
    assert "memory_unit" not in ids


def test_max_tokens_budget(h: Harness) -> None:
    for i in range(10):
        h.record("bob", f"unit {i} " + "word " * 100)
    response = h.attune("alice", max_tokens=300)
    budget = response["context_budget"]
    assert budget["tokens_budget"] == 300
    assert 0 < budget["tokens_used"] <= 300
    assert 0 < len(response["record"]) < 10


def test_since_epoch_is_strictly_after(h: Harness) -> None:
    first = h.record("bob", "one")
    second = h.record("bob", "two")
    response = h.attune("alice", since_epoch=first["epoch"])
    assert [r["memory_unit"]["id"] for r in response["record"]] == [second["memory_unit_id"]]


def test_polling_pages_through_new_units_without_gap_or_repeat(h: Harness) -> None:
    expected = [h.record("bob", f"unit {i}")["memory_unit_id"] for i in range(23)]
    seen: list[str] = []
    cursor = 0
    for _ in range(10):
        response = h.attune("alice", max_units=5, since_epoch=cursor)
        seen.extend(r["memory_unit"]["id"] for r in response["record"])
        cursor = response["epoch"]
        if response["context_budget"]["units_available"] <= 5:
            break
    assert sorted(seen) == sorted(expected)
    assert len(seen) == len(set(seen))


def test_invalid_scope_is_refused(h: Harness) -> None:
    for scope in (
        {"role": "x"},
        {"role": "x", "max_units": 0},
        {"role": "x", "max_units": 1001},
        {"role": "x", "max_units": 2, "relevance_threshold": 2},
        {"role": "x", "max_units": 2, "colour": "red"},
    ):
        assert error_of(h.send, "ATTUNE", "alice", {"scope": scope}).code == Code.INVALID_PAYLOAD
    mismatch = {"scope": {"role": "x", "max_units": 2, "since_epoch": 1}, "since_epoch": 2}
    assert error_of(h.send, "ATTUNE", "alice", mismatch).code == Code.INVALID_PAYLOAD


# -- DETECT -------------------------------------------------------------------


def test_detect_lists_conflicts_with_filters(h: Harness) -> None:
    h.register("carol", "x")
    a = h.record("alice", "a")["memory_unit_id"]
    h.record("bob", "b", relations=[{"type": "contradicts", "target_id": a}])
    c = h.record("carol", "c")["memory_unit_id"]
    h.record("carol", "d", relations=[{"type": "contradicts", "target_id": c}])

    def listed(**flt: Any) -> int:
        response = h.send("DETECT", "alice", {"mode": "list", "filter": flt})
        return len(response["conflicts"])

    assert listed() == 2
    assert listed(involving_agents=["bob"]) == 1
    assert listed(status=["resolved"]) == 0
    assert listed(types=["factual"], status=["detected"]) == 2
    error = error_of(h.send, "DETECT", "alice", {"mode": "check", "target_id": "mem-nope"})
    assert error.code == Code.UNIT_NOT_FOUND  # check and scan: tests/test_conflicts.py


def test_every_operation_of_the_spec_is_supported() -> None:
    assert SUPPORTED_OPERATIONS == OPERATIONS
    assert set(Field()._handlers) == set(OPERATIONS)  # each has its handler


# -- Lamport clock ------------------------------------------------------------


def test_every_operation_advances_the_epoch(h: Harness) -> None:
    recorded = h.record("alice")["epoch"]
    attuned = h.attune("bob")["epoch"]
    detected = h.send("DETECT", "bob", {"mode": "list"})["epoch"]
    assert detected > recorded + 1  # the ATTUNE between them took an epoch of its own
    assert h.record("bob")["epoch"] > detected
    # ATTUNE answers with the epoch of what it holds, the newest unit: its cursor
    assert attuned == recorded


def test_received_epoch_moves_the_clock(h: Harness) -> None:
    response = h.record("alice")
    ahead = response["epoch"] + 1000
    payload = _record_payload()
    assert h.send("RECORD", "alice", payload, epoch=ahead)["epoch"] == ahead + 1
    # an epoch behind the clock still advances it by one
    assert h.send("RECORD", "alice", payload, epoch=0)["epoch"] == ahead + 2


def test_epoch_far_ahead_is_refused(h: Harness) -> None:
    before = snapshot(h)
    error = error_of(h.send, "RECORD", "alice", _record_payload(), epoch=MAX_EPOCH)
    assert error.code == Code.INVALID_EPOCH
    assert snapshot(h) == before


def test_epoch_overflow_is_reported() -> None:
    h = Harness()
    h.field.state.clock.value = MAX_EPOCH
    error = error_of(h.register, "alice", "x")
    assert error.code == Code.EPOCH_OVERFLOW
    assert not error.recoverable


def test_reads_reserve_epochs_durably(h: Harness) -> None:
    last = 0
    for _ in range(RESERVATION_BLOCK + 10):
        last = h.attune("alice")["epoch"]
    reservations = [e.data["until"] for e in h.entries if e.kind == "clock.reserved"]
    assert len(reservations) >= 2
    assert max(reservations) >= last
    assert h.replayed().state.clock.value >= last


# -- replay ---------------------------------------------------------------------


def test_replay_rebuilds_the_same_state(h: Harness) -> None:
    a = h.record("alice", "a")["memory_unit_id"]
    h.record("bob", "b", relations=[{"type": "contradicts", "target_id": a}])
    h.record("bob", "c", relations=[{"type": "supersedes", "target_id": a}])
    h.send("DEREGISTER", "bob", {"agent_id": "bob"})
    last_epoch = h.attune("alice")["epoch"]
    rebuilt = h.replayed()
    assert rebuilt.state.units == h.field.state.units
    assert rebuilt.state.conflicts == h.field.state.conflicts
    assert rebuilt.list_agents() == h.field.list_agents()
    assert rebuilt.state.field_id == h.field.state.field_id
    assert rebuilt.state.clock.value >= last_epoch
    # the old tokens still authenticate after the rebuild
    assert rebuilt.authenticate(h.tokens["alice"]).id == "alice"
