"""Conflicts in the pure core: the lifecycle table, MERGE's seven strategies, DETECT check/scan."""

from __future__ import annotations

import itertools
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.errors import Code, FieldError
from field.contract.model import CONFLICT_STATUSES, CONFLICT_STRATEGIES
from field.core import authority, conflicts

from . import test_matcher
from .core_util import Harness
from .schema_util import assert_valid

OPERATOR_TOKEN = "operator-secret-0123456789"
RATIONALE = "the newer measurement is the better one"


@pytest.fixture
def h() -> Harness:
    """alice and bob record; lead and lead2 are senior; v1..v3 vote; watcher observes."""
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.register("alice")
    h.register("bob", "engineer")
    for lead in ("lead", "lead2"):
        h.register(lead, "lead", via=OPERATOR_TOKEN, authority=authority.SENIOR)
    for voter in ("v1", "v2", "v3"):
        h.register(voter, "reviewer")
    h.register("watcher", "observer", authority=authority.OBSERVER)
    h.tokens["operator"] = OPERATOR_TOKEN
    return h


def fails(code: str, call: Any, *args: Any, **kwargs: Any) -> FieldError:
    """``call`` raises a FieldError with ``code`` and changes nothing."""
    h = call.__self__  # a Harness method
    before = (len(h.entries), h.field.epoch)
    with pytest.raises(FieldError) as info:
        call(*args, **kwargs)
    assert info.value.code == code, info.value.message
    assert (len(h.entries), h.field.epoch) == before, "a refused request changed the Field"
    assert_valid("error", info.value.to_response("MERGE"))
    return info.value


def pair(
    h: Harness,
    a: str = "Churn is 2% a month.",
    b: str = "Churn is 5% a month.",
    *,
    scores: tuple[float, float] = (0.8, 0.8),
) -> tuple[str, str, str]:
    """alice records ``a``, bob records ``b`` contradicting it: (unit a, unit b, conflict)."""
    unit_a = h.record("alice", a, score=scores[0])["memory_unit_id"]
    relation = {"type": "contradicts", "target_id": unit_a}
    response = h.record("bob", b, score=scores[1], relations=[relation])
    return unit_a, response["memory_unit_id"], response["conflicts_detected"][0]


def merge(h: Harness, agent: str, conflict_id: str, strategy: str, **resolution: Any) -> Any:
    resolution.setdefault("rationale", RATIONALE)
    payload = {"conflict_id": conflict_id, "strategy": strategy, "resolution": resolution}
    assert_valid("merge.request", payload)
    response = h.send("MERGE", agent, payload)
    assert_valid("merge.response", response)
    return response


def status(h: Harness, unit_id: str) -> str:
    return str(h.field.state.units[unit_id]["status"])


def kinds_since(h: Harness, start: int) -> list[tuple[str, Any]]:
    """(kind, detail) of the entries after position ``start``; detail shows the move."""
    out = []
    for entry in h.entries[start:]:
        data = entry.data
        if entry.kind == "conflict.transitioned":
            out.append((entry.kind, (data["from"], data["to"])))
        elif entry.kind == "conflict.resolved":
            out.append((entry.kind, (data["from"], "resolved")))
        else:
            out.append((entry.kind, data.get("memory_unit_id")))
    return out


def same_after_replay(h: Harness) -> None:
    replayed = h.replayed().state
    live = h.field.state
    assert replayed.conflicts == live.conflicts
    assert replayed.units == live.units
    assert replayed.unit_statuses == live.unit_statuses


# -- the lifecycle table -----------------------------------------------------------------


def test_the_table_is_the_spec_lifecycle() -> None:
    edges = {
        (a, b): need for a, moves in conflicts.TRANSITIONS.items() for b, need in moves.items()
    }
    assert edges == {
        ("detected", "resolving"): authority.SENIOR,
        ("detected", "escalated"): authority.SENIOR,
        ("resolving", "resolved"): authority.SENIOR,
        ("resolving", "escalated"): authority.SENIOR,
        ("escalated", "resolved"): authority.OPERATOR,
    }
    assert set(conflicts.TRANSITIONS) == set(CONFLICT_STATUSES)


def reach(h: Harness, state: str) -> tuple[str, str, str]:
    """A fresh conflict brought to ``state`` by MERGEs."""
    a, b, cid = pair(h)
    if state == "resolving":
        merge(h, "lead", cid, "vote", winner_id=a)
    elif state == "escalated":
        merge(h, "lead", cid, "human_escalation")
    elif state == "resolved":
        merge(h, "lead", cid, "last_write_wins")
    assert h.field.state.conflicts[cid]["status"] == state
    return a, b, cid


#: A MERGE that makes each legal move: (agent, strategy, resolution).
LEGAL_MOVES = {
    ("detected", "resolving"): ("lead", "vote", {"winner_id": "a"}),
    ("detected", "escalated"): ("lead", "human_escalation", {}),
    ("resolving", "resolved"): ("lead2", "last_write_wins", {}),
    ("resolving", "escalated"): ("lead2", "human_escalation", {}),
    ("escalated", "resolved"): ("operator", "authority", {"winner_id": "a"}),
}
ALL_MOVES = list(itertools.product(CONFLICT_STATUSES, CONFLICT_STATUSES))


@pytest.mark.parametrize(("source", "target"), ALL_MOVES)
def test_every_move_is_allowed_exactly_when_the_table_says(
    h: Harness, source: str, target: str
) -> None:
    legal = target in conflicts.TRANSITIONS[source]
    assert legal == ((source, target) in LEGAL_MOVES)
    if not legal:
        with pytest.raises(FieldError) as info:
            conflicts.check_path({"id": "c", "status": source}, "any", [target])
        assert info.value.code == Code.INVALID_TRANSITION
        assert info.value.details == {
            "from": source,
            "to": target,
            "strategy": "any",
            "allowed": sorted(conflicts.TRANSITIONS[source]),
        }
        return
    a, _, cid = reach(h, source)
    agent, strategy, resolution = LEGAL_MOVES[(source, target)]
    resolution = {k: a if v == "a" else v for k, v in resolution.items()}
    start = len(h.entries)
    merge(h, agent, cid, strategy, **resolution)
    assert h.field.state.conflicts[cid]["status"] == target
    moves = [
        d for k, d in kinds_since(h, start) if k in ("conflict.transitioned", "conflict.resolved")
    ]
    assert moves[-1] == (source, target)
    same_after_replay(h)


#: MERGEs that ask for a move the table forbids: (status, strategy) -> the move refused.
ILLEGAL_REQUESTS = [
    *[("resolved", s) for s in CONFLICT_STRATEGIES],
    ("escalated", "human_escalation"),
    ("escalated", "vote"),
]


@pytest.mark.parametrize(("source", "strategy"), ILLEGAL_REQUESTS)
def test_merges_the_table_forbids_are_refused(h: Harness, source: str, strategy: str) -> None:
    a, _, cid = reach(h, source)
    resolution: dict[str, Any] = {}
    if strategy in ("authority", "vote", "confidence_weighted"):
        resolution["winner_id"] = a if strategy != "confidence_weighted" else None
    if strategy == "synthesis":
        resolution["synthesis"] = "Both are right for different plans."
    payload = {
        "conflict_id": cid,
        "strategy": strategy,
        "resolution": {"rationale": "r", **resolution},
    }
    error = fails(Code.INVALID_TRANSITION, h.send, "MERGE", "operator", payload)
    details = error.details
    assert details is not None
    assert details["from"] == source and details["strategy"] == strategy
    assert details["to"] == conflicts.path_of(source, strategy)[0]
    assert details["allowed"] == sorted(conflicts.TRANSITIONS[source])
    assert error.http_status == 409


def test_unknown_conflict_is_404(h: Harness) -> None:
    payload = {
        "conflict_id": "conflict-nope",
        "strategy": "vote",
        "resolution": {"rationale": "r", "winner_id": "m"},
    }
    error = fails(Code.CONFLICT_NOT_FOUND, h.send, "MERGE", "lead", payload)
    assert error.http_status == 404


# -- authority ---------------------------------------------------------------------------


def test_merge_needs_a_senior_agent(h: Harness) -> None:
    _, _, cid = pair(h)
    payload = {"conflict_id": cid, "strategy": "last_write_wins", "resolution": {"rationale": "r"}}
    error = fails(Code.INSUFFICIENT_AUTHORITY, h.send, "MERGE", "alice", payload)
    assert "MERGE needs authority 6" in error.message
    fails(Code.INSUFFICIENT_AUTHORITY, h.send, "MERGE", "watcher", payload)
    merge(h, "lead", cid, "last_write_wins")


def test_only_the_operator_resolves_an_escalated_conflict(h: Harness) -> None:
    a, b, cid = reach(h, "escalated")
    conflict = h.field.state.conflicts[cid]
    assert conflict["escalation"]["escalated_by"] == "lead"
    assert (status(h, a), status(h, b)) == ("contested", "contested")
    payload = {
        "conflict_id": cid,
        "strategy": "authority",
        "resolution": {"rationale": "r", "winner_id": a},
    }
    error = fails(Code.INSUFFICIENT_AUTHORITY, h.send, "MERGE", "lead", payload)
    assert "needs authority 10" in error.message
    response = merge(h, "operator", cid, "authority", winner_id=a)
    assert response["conflict"]["resolution"]["resolved_by"] == "operator"
    assert (status(h, a), status(h, b)) == ("active", "superseded")


# -- the strategies ----------------------------------------------------------------------


def test_last_write_wins_goes_through_resolving_in_one_merge(h: Harness) -> None:
    a, b, cid = pair(h)
    start = len(h.entries)
    response = merge(h, "lead", cid, "last_write_wins")
    assert response["status"] == "resolved"
    assert response["side_effects"] == {
        "superseded_units": [a],
        "new_unit_id": None,
        "notified_agents": ["alice", "bob"],
    }
    resolution = response["conflict"]["resolution"]
    assert resolution == {
        "strategy": "last_write_wins",
        "winner_id": b,
        "rationale": RATIONALE,
        "resolved_by": "lead",
        "epoch_resolved": response["epoch"],
        "synthesis_unit_id": None,
    }
    assert kinds_since(h, start) == [
        ("conflict.transitioned", ("detected", "resolving")),
        ("memory.superseded", a),
        ("conflict.resolved", ("resolving", "resolved")),
        ("memory.reinstated", b),
    ]
    assert (status(h, a), status(h, b)) == ("superseded", "active")
    assert h.field.state.conflicts[cid] == response["conflict"]
    same_after_replay(h)


def test_a_winner_named_for_a_computed_strategy_is_a_check(h: Harness) -> None:
    a, b, cid = pair(h)
    payload = {
        "conflict_id": cid,
        "strategy": "last_write_wins",
        "resolution": {"rationale": "r", "winner_id": a},
    }
    error = fails(Code.MERGE_FAILED, h.send, "MERGE", "lead", payload)
    assert error.recoverable and error.details == {"computed_winner_id": b}
    assert merge(h, "lead", cid, "last_write_wins", winner_id=b)["status"] == "resolved"


def test_confidence_weighted_and_its_tie(h: Harness) -> None:
    a, b, cid = pair(h, scores=(0.9, 0.6))
    response = merge(h, "lead", cid, "confidence_weighted")
    assert response["conflict"]["resolution"]["winner_id"] == a
    assert (status(h, a), status(h, b)) == ("active", "superseded")
    a2, b2, tied = pair(h, "Latency is 20 ms.", "Latency is 80 ms.", scores=(0.7, 0.7))
    payload = {
        "conflict_id": tied,
        "strategy": "confidence_weighted",
        "resolution": {"rationale": "r"},
    }
    error = fails(Code.MERGE_FAILED, h.send, "MERGE", "lead", payload)
    assert error.recoverable and error.http_status == 409
    assert error.details == {"scores": {a2: 0.7, b2: 0.7}}
    assert "another strategy" in (error.suggested_action or "")
    same_after_replay(h)


def test_evidence_count_counts_standing_supporters(h: Harness) -> None:
    a, b, cid = pair(h)

    def support(target: str, text: str) -> str:
        relation = {"type": "supports", "target_id": target}
        return str(h.record("v1", text, relations=[relation])["memory_unit_id"])

    support(a, "Billing shows 2%.")
    support(b, "The survey shows 5%.")
    # a third supporter of b is superseded, so it no longer counts: a tie
    extra = support(b, "The board deck says 5%.")
    h.record(
        "v1", "The board deck was wrong.", relations=[{"type": "supersedes", "target_id": extra}]
    )
    payload = {"conflict_id": cid, "strategy": "evidence_count", "resolution": {"rationale": "r"}}
    error = fails(Code.MERGE_FAILED, h.send, "MERGE", "lead", payload)
    assert error.details == {"scores": {a: 1.0, b: 1.0}}
    support(b, "The churn dashboard shows 5%.")
    response = merge(h, "lead", cid, "evidence_count")
    assert response["conflict"]["resolution"]["winner_id"] == b
    same_after_replay(h)


def test_authority_needs_a_winner_of_the_conflict(h: Harness) -> None:
    a, b, cid = pair(h)
    no_winner = {"conflict_id": cid, "strategy": "authority", "resolution": {"rationale": "r"}}
    fails(Code.INVALID_PAYLOAD, h.send, "MERGE", "lead", no_winner)
    stranger = h.record("alice", "unrelated")["memory_unit_id"]
    wrong = {**no_winner, "resolution": {"rationale": "r", "winner_id": stranger}}
    fails(Code.INVALID_PAYLOAD, h.send, "MERGE", "lead", wrong)
    response = merge(h, "lead", cid, "authority", winner_id=a)
    assert response["side_effects"]["superseded_units"] == [b]
    assert (status(h, a), status(h, b)) == ("active", "superseded")


def test_synthesis_creates_a_unit_superseding_both(h: Harness) -> None:
    a, b, cid = pair(h, scores=(0.9, 0.6))
    text = "Churn is 2% for annual plans and 5% for monthly plans."
    start = len(h.entries)
    response = merge(h, "lead", cid, "synthesis", synthesis=text)
    new_id = response["side_effects"]["new_unit_id"]
    assert response["side_effects"]["superseded_units"] == [a, b]
    assert response["conflict"]["resolution"]["synthesis_unit_id"] == new_id
    assert response["conflict"]["resolution"]["winner_id"] is None
    unit = h.field.state.units[new_id]
    assert_valid("memory-unit", unit)
    assert unit["type"] == "synthesis" and unit["content"] == text
    assert unit["status"] == "active" and unit["epoch"] == response["epoch"]
    assert unit["source"]["agent_id"] == "lead" and unit["source"]["agent_role"] == "lead"
    assert unit["confidence"]["score"] == 0.9 and unit["confidence"]["reasoning"] == RATIONALE
    assert [(r["type"], r["target_id"]) for r in unit["relations"]] == [
        ("supersedes", a),
        ("supersedes", b),
    ]
    assert (status(h, a), status(h, b)) == ("superseded", "superseded")
    assert kinds_since(h, start) == [
        ("conflict.transitioned", ("detected", "resolving")),
        ("memory.recorded", None),
        ("memory.superseded", a),
        ("memory.superseded", b),
        ("conflict.resolved", ("resolving", "resolved")),
    ]
    seen = [r["memory_unit"]["id"] for r in h.attune("v1")["record"]]
    assert new_id in seen and a not in seen and b not in seen
    same_after_replay(h)


@pytest.mark.parametrize(
    ("strategy", "resolution"),
    [
        ("synthesis", {}),
        ("synthesis", {"synthesis": "   "}),
        ("last_write_wins", {"synthesis": "x"}),
        ("human_escalation", {"winner_id": "m"}),
        ("vote", {}),
        ("authority", {"winner_id": "m", "quorum": 3}),
        ("vote", {"winner_id": "m", "quorum": 1}),
        ("last_write_wins", {"rationale": " "}),
        ("last_write_wins", {"rationale": None}),
    ],
)
def test_strategy_fields_are_validated(h: Harness, strategy: str, resolution: Any) -> None:
    _, _, cid = pair(h)
    payload = {
        "conflict_id": cid,
        "strategy": strategy,
        "resolution": {"rationale": "r", **resolution},
    }
    fails(Code.INVALID_PAYLOAD, h.send, "MERGE", "lead", payload)


def test_human_escalation_then_the_operator(h: Harness) -> None:
    a, b, cid = pair(h)
    start = len(h.entries)
    response = merge(h, "lead", cid, "human_escalation", rationale="needs a product decision")
    assert response["status"] == "escalated"
    assert response["side_effects"] == {
        "superseded_units": [],
        "new_unit_id": None,
        "notified_agents": [],
    }
    assert response["conflict"]["escalation"] == {
        "escalated_by": "lead",
        "rationale": "needs a product decision",
        "epoch": response["epoch"],
    }
    assert kinds_since(h, start) == [("conflict.transitioned", ("detected", "escalated"))]
    response = merge(h, "operator", cid, "synthesis", synthesis="Both, per plan.")
    assert response["conflict"]["status"] == "resolved"
    assert response["conflict"]["escalation"]["escalated_by"] == "lead"
    same_after_replay(h)


def test_vote_reaches_quorum(h: Harness) -> None:
    a, b, cid = pair(h)
    payload = {
        "conflict_id": cid,
        "strategy": "vote",
        "resolution": {"rationale": "r", "winner_id": a},
    }
    fails(Code.INSUFFICIENT_AUTHORITY, h.send, "MERGE", "v1", payload)  # opening needs 6
    opened = merge(h, "lead", cid, "vote", winner_id=a, rationale="let the reviewers decide")
    assert opened["status"] == "pending_vote"
    assert opened["conflict"]["status"] == "resolving"
    assert opened["conflict"]["vote"]["quorum"] == conflicts.DEFAULT_QUORUM == 3
    assert merge(h, "v1", cid, "vote", winner_id=b)["status"] == "pending_vote"
    fails(
        Code.MERGE_FAILED,
        h.send,
        "MERGE",
        "v1",
        {**payload, "resolution": {"rationale": "again", "winner_id": a}},
    )
    fails(Code.INSUFFICIENT_AUTHORITY, h.send, "MERGE", "watcher", payload)  # ballots need 4
    start = len(h.entries)
    closed = merge(h, "v2", cid, "vote", winner_id=a)
    assert closed["status"] == "resolved"
    resolution = closed["conflict"]["resolution"]
    assert resolution["winner_id"] == a and resolution["resolved_by"] == "v2"
    assert resolution["rationale"] == f"vote ({a}: 2, {b}: 1; quorum 3): let the reviewers decide"
    assert [b["agent_id"] for b in closed["conflict"]["vote"]["ballots"]] == ["lead", "v1", "v2"]
    assert kinds_since(h, start) == [
        ("conflict.vote_cast", None),
        ("memory.superseded", b),
        ("conflict.resolved", ("resolving", "resolved")),
        ("memory.reinstated", a),
    ]
    fails(Code.INVALID_TRANSITION, h.send, "MERGE", "v3", payload)  # the vote is over
    same_after_replay(h)


def test_a_tied_vote_waits_for_the_next_ballot(h: Harness) -> None:
    a, b, cid = pair(h)
    merge(h, "lead", cid, "vote", winner_id=a, quorum=2)
    assert merge(h, "v1", cid, "vote", winner_id=b)["status"] == "pending_vote"
    assert merge(h, "v2", cid, "vote", winner_id=b)["conflict"]["resolution"]["winner_id"] == b


def test_a_senior_may_close_an_open_vote_otherwise(h: Harness) -> None:
    a, b, cid = pair(h)
    merge(h, "lead", cid, "vote", winner_id=a)
    start = len(h.entries)
    response = merge(h, "lead2", cid, "last_write_wins", rationale="no time to vote")
    assert response["conflict"]["vote"]["ballots"][0]["agent_id"] == "lead"
    assert kinds_since(h, start)[0] == ("memory.superseded", a)  # no second trip to resolving


def test_a_winner_stays_contested_while_another_conflict_holds_it(h: Harness) -> None:
    a, b, first = pair(h)
    relation = {"type": "contradicts", "target_id": b}
    second = h.record("alice", "Churn is 9%.", relations=[relation])["conflicts_detected"][0]
    merge(h, "lead", first, "authority", winner_id=b)
    assert status(h, b) == "contested"
    merge(h, "lead", second, "authority", winner_id=b)
    assert status(h, b) == "active"
    same_after_replay(h)


def test_capabilities_report_every_strategy_and_mode(h: Harness) -> None:
    caps = h.register("newcomer")["field_capabilities"]
    assert caps["conflict_strategies"] == list(CONFLICT_STRATEGIES)
    assert caps["detect_modes"] == ["check", "scan", "list"]
    assert "MERGE" in caps["supported_operations"]
    assert_valid("field-capabilities", caps)


# -- events ------------------------------------------------------------------------------


def test_conflict_resolved_is_an_event_for_both_authors(h: Harness) -> None:
    a, b, cid = pair(h)
    subscription = {"events": ["conflict.resolved", "memory.superseded"]}
    h.send("SUBSCRIBE", "alice", {"action": "subscribe", "subscription": subscription})
    merge(h, "lead", cid, "last_write_wins")
    events = test_matcher.events_of(h)
    resolved = [e for e in events if e.name == "conflict.resolved"]
    assert len(resolved) == 1 and resolved[0].units == (a, b) and resolved[0].conflict_id == cid
    assert "resolved by last_write_wins" in resolved[0].summary
    matches = {m.event.name: m for m in test_matcher.matcher_of(h).match(events)}
    assert float(matches["conflict.resolved"].relevance[0]) == 1.0
    assert not bool(matches["conflict.resolved"].requires_action[0])
    assert matches["memory.superseded"].event.conflict_id == cid
    test_matcher.check_against_reference(h)


merge_step = st.tuples(
    st.sampled_from([*CONFLICT_STRATEGIES]), st.integers(0, 99), st.integers(0, 1)
)


@settings(max_examples=40, deadline=None)
@given(test_matcher.program, st.lists(merge_step, min_size=1, max_size=6))
def test_matcher_agrees_with_the_reference_on_resolved_conflicts(
    steps: list[Any], merges: list[tuple[str, int, int]]
) -> None:
    """Random Fields, then MERGEs by the operator: conflict.resolved matches like the reference."""
    with mock.patch.object(test_matcher, "Harness", lambda: Harness(operator_token=OPERATOR_TOKEN)):
        h = test_matcher.run(steps)
    h.tokens["operator"] = OPERATOR_TOKEN
    for strategy, which, side in merges:
        open_ = [c for c in h.field.state.conflicts.values() if c["status"] != "resolved"]
        if not open_:
            break
        conflict = open_[which % len(open_)]
        winner = conflict[("unit_a", "unit_b")[side]]
        resolution: dict[str, Any] = {"rationale": "r"}
        if strategy in ("authority", "vote"):
            resolution["winner_id"] = winner
        if strategy == "synthesis":
            resolution["synthesis"] = "both hold in part"
        payload = {"conflict_id": conflict["id"], "strategy": strategy, "resolution": resolution}
        try:
            h.send("MERGE", "operator", payload)
        except FieldError as error:
            assert error.code in (Code.MERGE_FAILED, Code.INVALID_TRANSITION), error.message
    test_matcher.check_against_reference(h)
    test_matcher.check_splits(h)
    same_after_replay(h)


# -- DETECT check and scan ---------------------------------------------------------------


def detect(h: Harness, agent: str, mode: str, **payload: Any) -> Any:
    body = {"mode": mode, **payload}
    assert_valid("detect.request", body)
    response = h.send("DETECT", agent, body)
    assert_valid("detect.response", response)
    return response


NUMBERS = (
    "The payments API rate limit is 100 requests per minute.",
    "The payments API rate limit is 500 requests per minute.",
)
NEGATION = ("The cache client is thread-safe.", "The cache client is not thread-safe.")


@pytest.mark.parametrize("texts", [NUMBERS, NEGATION], ids=["numbers", "negation"])
def test_scan_finds_similar_units_that_disagree(h: Harness, texts: tuple[str, str]) -> None:
    a = h.record("alice", texts[0])["memory_unit_id"]
    b = h.record("bob", texts[1])["memory_unit_id"]
    h.record("v1", "Deploys happen on Tuesdays.")
    start = len(h.entries)
    response = detect(h, "v1", "scan")
    assert response["scan_coverage"] == {
        "units_scanned": 3,
        "new_conflicts_found": 1,
        "units_in_scope": 3,
    }
    (conflict,) = response["conflicts"]
    assert (conflict["unit_a"], conflict["unit_b"]) == (a, b)
    assert conflict["detected_by"] == "semantic" and conflict["status"] == "detected"
    assert "disagree on" in conflict["description"] and "cosine" in conflict["description"]
    assert [e.kind for e in h.entries[start:]] == [
        "conflict.detected",
        "memory.contested",
        "memory.contested",
    ]
    assert (status(h, a), status(h, b)) == ("contested", "contested")
    again = detect(h, "v2", "scan")  # no duplicate for a pair with an unresolved conflict
    assert again["conflicts"] == [] and again["scan_coverage"]["new_conflicts_found"] == 0
    same_after_replay(h)


@pytest.mark.parametrize(
    "texts",
    [
        (
            "The payments API rate limit is 100 requests per minute.",
            "The payments API rate limit is 100 requests per minute, per key.",
        ),
        ("Deploys happen on Tuesdays.", "Deploys happen on Tuesdays and Thursdays."),
        ("Churn fell to 2% in March.", "The cache holds 500 entries."),
        ("The cache client is not thread-safe.", "The cache client is not thread safe at all."),
    ],
    ids=["agree-on-number", "agree-no-number", "dissimilar-numbers", "agree-on-negation"],
)
def test_scan_leaves_agreeing_or_unrelated_units_alone(h: Harness, texts: tuple[str, str]) -> None:
    for agent, text in zip(("alice", "bob"), texts, strict=True):
        h.record(agent, text, score=0.9 if agent == "alice" else 0.5)
    start = len(h.entries)
    response = detect(h, "v1", "scan")
    assert response["conflicts"] == [] and response["scan_coverage"]["units_scanned"] == 2
    assert h.entries[start:] == []


BACKUP = (
    "The nightly backup job runs at 2 am.",
    "The nightly backup job runs at 4 am since the migration.",
)


def test_temporal_detection_needs_an_established_more_confident_older_unit(h: Harness) -> None:
    vectors = conflicts.vectors_for  # the pair is below the semantic bar, above the temporal
    a = h.record("alice", BACKUP[0], score=0.9)["memory_unit_id"]
    b = h.record("bob", BACKUP[1], score=0.6)["memory_unit_id"]
    va, vb = vectors(h.field.state, [a, b])
    assert conflicts.TEMPORAL_THRESHOLD <= float(va @ vb) < conflicts.SEMANTIC_THRESHOLD
    (conflict,) = detect(h, "v1", "scan")["conflicts"]
    assert conflict["detected_by"] == "temporal"
    assert (conflict["unit_a"], conflict["unit_b"]) == (a, b)
    assert conflict["description"].startswith(f"newer {b} (confidence 0.6) contradicts established")


@pytest.mark.parametrize(("old", "new"), [(0.6, 0.9), (0.6, 0.5), (0.8, 0.8)])
def test_no_temporal_conflict_without_an_established_more_confident_unit(
    h: Harness, old: float, new: float
) -> None:
    h.record("alice", BACKUP[0], score=old)
    h.record("bob", BACKUP[1], score=new)
    assert detect(h, "v1", "scan")["conflicts"] == []


def test_check_compares_one_unit_with_the_field(h: Harness) -> None:
    a = h.record("alice", NUMBERS[0])["memory_unit_id"]
    b = h.record("bob", NUMBERS[1])["memory_unit_id"]
    other = h.record("bob", "Deploys happen on Tuesdays.")["memory_unit_id"]
    assert detect(h, "v1", "check", target_id=other)["conflicts"] == []
    response = detect(h, "v1", "check", target_id=a)
    assert response["scan_coverage"] == {
        "units_scanned": 2,
        "new_conflicts_found": 1,
        "units_in_scope": 2,
    }
    (conflict,) = response["conflicts"]
    assert (conflict["unit_a"], conflict["unit_b"]) == (a, b)
    # checking the other side finds the same conflict, now a known one, and creates none
    again = detect(h, "v2", "check", target_id=b)
    assert again["conflicts"] == [h.field.state.conflicts[conflict["id"]]]
    assert again["scan_coverage"]["new_conflicts_found"] == 0


def test_check_refusals(h: Harness) -> None:
    fails(Code.INVALID_PAYLOAD, h.send, "DETECT", "v1", {"mode": "check"})
    fails(Code.INVALID_PAYLOAD, h.send, "DETECT", "v1", {"mode": "check", "target_id": None})
    error = fails(
        Code.UNIT_NOT_FOUND, h.send, "DETECT", "v1", {"mode": "check", "target_id": "mem-nope"}
    )
    assert error.http_status == 404
    fails(Code.INSUFFICIENT_AUTHORITY, h.send, "DETECT", "watcher", {"mode": "scan"})
    assert "units_in_scope" not in detect(h, "watcher", "list")["scan_coverage"]


def test_scan_filter_and_resolved_pairs(h: Harness) -> None:
    a = h.record("alice", NUMBERS[0])["memory_unit_id"]
    b = h.record("alice", NUMBERS[1])["memory_unit_id"]
    response = detect(h, "v1", "scan", filter={"involving_agents": ["bob"]})
    assert response["conflicts"] == []
    (conflict,) = detect(h, "v1", "scan", filter={"involving_agents": ["alice"]})["conflicts"]
    merge(h, "lead", conflict["id"], "last_write_wins")
    assert (status(h, a), status(h, b)) == ("superseded", "active")
    assert detect(h, "v1", "scan")["conflicts"] == []  # the loser no longer stands


def test_scan_is_capped_and_blocks_give_the_same_pairs(h: Harness) -> None:
    for i in range(4):
        h.record("alice", f"Deploy step {i} takes {10 * (i + 1)} minutes on the build server.")
    whole = detect(h, "v1", "scan")
    found = {(c["unit_a"], c["unit_b"]) for c in whole["conflicts"]}
    assert whole["scan_coverage"]["new_conflicts_found"] == len(found) > 0
    h2 = Harness(operator_token=OPERATOR_TOKEN)
    h2.register("alice")
    h2.register("v1")
    for i in range(4):
        h2.record("alice", f"Deploy step {i} takes {10 * (i + 1)} minutes on the build server.")
    with mock.patch.object(conflicts, "BLOCK_ROWS", 1):
        blocked = detect(h2, "v1", "scan")
    assert {(c["unit_a"], c["unit_b"]) for c in blocked["conflicts"]} == found
    h3 = Harness(operator_token=OPERATOR_TOKEN)
    h3.register("alice")
    h3.register("v1")
    for i in range(4):
        h3.record("alice", f"Deploy step {i} takes {10 * (i + 1)} minutes on the build server.")
    with (
        mock.patch.object(conflicts, "MAX_SCAN_UNITS", 2),
        mock.patch.object(conflicts, "MAX_NEW_CONFLICTS", 1),
    ):
        capped = detect(h3, "v1", "scan")
    assert capped["scan_coverage"] == {
        "units_scanned": 2,
        "new_conflicts_found": 1,
        "units_in_scope": 4,
    }
    newest = set(h3.field.state.index.ids[2:])
    (conflict,) = capped["conflicts"]
    assert {conflict["unit_a"], conflict["unit_b"]} == newest


def test_numbers_and_negations() -> None:
    assert conflicts.numbers_of("1,000 users and 2.5 GB, 1000 again") == {1000.0, 2.5}
    assert conflicts.numbers_of("no digits") == frozenset()
    assert conflicts.negated("It isn't thread-safe.") and conflicts.negated("It is not safe.")
    assert not conflicts.negated("It was never not safe.")
    assert not conflicts.negated("It is safe.")
