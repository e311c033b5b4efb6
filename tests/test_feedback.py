"""FEEDBACK (extension): an agent's judgements of units, and the relevance that learns them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from field.client import FieldClient
from field.contract.errors import Code, FieldError
from field.core import snapshot
from field.core.field import Field
from field.ranking.embedding import load_embedder
from field.ranking.learning import EXEMPLARS, Judged

from .conftest import ThreadedServer
from .core_util import Harness
from .test_matcher import check_splits, events_of, matcher_of, notified, subscribe
from .test_snapshot import FINGERPRINT, snapshot_of

WORDLLAMA = load_embedder("wordllama")
CONTENTS = {
    "churn": "Churn rose among small customers this quarter",
    "steel": "The price of steel fell in March",
    "cancel": "More small customers churned again this month",
    "lunch": "The lunch menu for Friday has soup",
    "leave": "Several small accounts left us for a cheaper rival",
    "party": "The office party moves to the roof terrace",
}


def _field() -> tuple[Harness, dict[str, str], str]:
    h = Harness(embedder=WORDLLAMA)
    h.register("w", "analyst")
    h.register("r", "researcher", interests=["market prices"])
    sub = subscribe(h, "r", ["memory.recorded"], min_relevance=0)
    ids = {name: h.record("w", text)["memory_unit_id"] for name, text in CONTENTS.items()}
    return h, ids, sub


def _judge(h: Harness, agent: str, **judged: bool) -> dict[str, Any]:
    items = [{"memory_unit_id": unit, "useful": useful} for unit, useful in judged.items()]
    return h.send("FEEDBACK", agent, {"items": items})


def _same(one: Judged, other: Judged) -> None:
    np.testing.assert_array_equal(one.useful, other.useful)
    np.testing.assert_array_equal(one.not_useful, other.not_useful)
    assert (one.liked, one.disliked, one.generation) == (
        other.liked,
        other.disliked,
        other.generation,
    )
    assert (one.useful_count, one.not_useful_count) == (other.useful_count, other.not_useful_count)


def _scores(h: Harness) -> dict[str, tuple[float, str]]:
    """Each unit's ATTUNE score (a poll: no source diversity) and reason for ``r``."""
    page = h.attune("r", max_units=20, since_epoch=0)["record"]
    return {r["memory_unit"]["id"]: (r["relevance_score"], r["relevance_reason"]) for r in page}


def test_units_like_the_useful_ones_rise_and_like_the_others_fall() -> None:
    h, ids, _ = _field()
    before = _scores(h)
    answer = _judge(h, "r", **{ids["churn"]: True, ids["lunch"]: False})
    assert answer == {
        "status": "ok",
        "judged": 2,
        "useful_total": 1,
        "not_useful_total": 1,
        "epoch": answer["epoch"],
    }
    after = _scores(h)
    assert after[ids["churn"]][0] > before[ids["churn"]][0] + 0.3
    # a unit the agent never judged, close in meaning to the useful one, rises past the rest
    assert after[ids["cancel"]][0] > max(after[ids["steel"]][0], after[ids["leave"]][0])
    assert after[ids["cancel"]][0] > before[ids["cancel"]][0]
    assert after[ids["lunch"]][0] < before[ids["lunch"]][0]
    assert "close in meaning to the units you found useful" in after[ids["churn"]][1]
    assert "closer than 100%" not in after[ids["churn"]][1]
    # the interests stay: the unit about market prices still ranks above the others
    unjudged = [ids[name] for name in ("leave", "party")]
    assert all(after[ids["steel"]][0] > after[unit][0] for unit in unjudged)


def test_pushes_score_as_attune_does_after_feedback_and_a_replay_learns_the_same() -> None:
    h, ids, sub = _field()
    _judge(h, "r", **{ids["churn"]: True, ids["cancel"]: True, ids["lunch"]: False})
    h.record("w", "Small customers say the renewal price is too high")  # after the feedback
    newest = h.field.state.index.ids[-1]
    pushed = notified(h, sub)
    position = max(pushed)
    assert pushed[position][1] == pytest.approx(_scores(h)[newest][0], abs=1e-6)  # 6 digits
    check_splits(h)  # every path of the matcher, the one ATTUNE's code among them
    replayed = Field(embedder=WORDLLAMA, read_entries=h.read_positions)
    replayed.replay(h.stored())
    _same(replayed.state.feedback["r"], h.field.state.feedback["r"])
    copy = Harness(embedder=WORDLLAMA)
    copy.field, copy.tokens = replayed, h.tokens
    assert _scores(copy) == _scores(h)


def test_what_an_agent_taught_is_kept_in_a_snapshot_and_forgotten_when_it_leaves() -> None:
    h, ids, _ = _field()
    _judge(h, "r", **{ids["churn"]: True})
    state = h.field.state
    data = snapshot_of(h.field)
    _, restored = snapshot.decode(data, FINGERPRINT, limits=h.field.limits, embedder=WORDLLAMA)
    _same(restored.feedback["r"], state.feedback["r"])
    h.send("DEREGISTER", "r", {"agent_id": "r"})
    assert "r" not in h.field.state.feedback


def test_the_latest_units_of_each_kind_are_kept_and_a_unit_judged_again_moves() -> None:
    h, ids, _ = _field()
    units = [
        h.record("w", f"Finding number {n} about pricing")["memory_unit_id"] for n in range(70)
    ]
    for start in range(0, 70, 35):
        _judge(h, "r", **{unit: True for unit in units[start : start + 35]})
    judged = h.field.state.feedback["r"]
    rows = h.field.state.index.rows
    assert judged.liked == [rows[u] for u in units[-EXEMPLARS:]]
    assert judged.useful_count == 70
    _judge(h, "r", **{units[-1]: False})
    assert rows[units[-1]] not in judged.liked and judged.disliked == [rows[units[-1]]]
    answer = _judge(h, "r", **{units[0]: True, units[0]: False})  # noqa: F601 - the last counts
    assert (answer["judged"], answer["not_useful_total"]) == (1, 2)


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({}, Code.INVALID_PAYLOAD),
        ({"items": []}, Code.INVALID_PAYLOAD),
        ({"items": [{"memory_unit_id": "x", "useful": True}] * 65}, Code.INVALID_PAYLOAD),
        ({"items": [{"memory_unit_id": "x", "useful": "yes"}]}, Code.INVALID_PAYLOAD),
        ({"items": [{"memory_unit_id": "x"}]}, Code.INVALID_PAYLOAD),
        ({"items": [{"memory_unit_id": "x", "useful": True, "why": "."}]}, Code.INVALID_PAYLOAD),
        ({"items": [{"memory_unit_id": "mem-none", "useful": True}]}, Code.UNIT_NOT_FOUND),
    ],
)
def test_a_malformed_feedback_is_refused_and_changes_nothing(
    payload: dict[str, Any], code: str
) -> None:
    h, _, _ = _field()
    position = len(h.entries)
    with pytest.raises(FieldError) as refused:
        h.send("FEEDBACK", "r", payload)
    assert refused.value.code == code
    assert len(h.entries) == position and "r" not in h.field.state.feedback


def test_a_unit_of_a_session_the_agent_is_not_in_cannot_be_judged() -> None:
    h, _, _ = _field()
    created = h.send("SESSION", "w", {"action": "create", "name": "private"})
    unit = {
        "type": "finding",
        "content": "A secret plan",
        "intent": {"purpose": "p"},
        "confidence": {"score": 0.8, "reasoning": "r"},
    }
    hidden = h.send("RECORD", "w", unit, session_id=created["session"]["id"])["memory_unit_id"]
    with pytest.raises(FieldError) as refused:
        h.send("FEEDBACK", "r", {"items": [{"memory_unit_id": hidden, "useful": True}]})
    assert refused.value.code == Code.UNIT_NOT_FOUND


async def _write(agent: Any, content: str) -> Any:
    return await agent.record("finding", content, purpose="p", confidence=0.7, reasoning="r")


async def test_an_agent_gives_feedback_over_http_and_its_pushes_learn(
    server_factory: Any,
) -> None:
    server: ThreadedServer = server_factory()
    async with FieldClient(server.url) as field:
        writer = await field.register("w", "analyst")
        reader = await field.register("r", "researcher", interests=["market prices"])
        churn = (
            await writer.record(
                "finding", CONTENTS["churn"], purpose="p", confidence=0.7, reasoning="r"
            )
        )["memory_unit_id"]
        answer = await reader.feedback(useful=[churn])
        assert (answer["judged"], answer["useful_total"]) == (1, 1)
        news = await reader.subscribe(["memory.recorded"], min_relevance=0)
        async with reader.notifications(news) as stream:
            leave = await writer.record(
                "finding", CONTENTS["leave"], purpose="p", confidence=0.7, reasoning="r"
            )
            pushed = await anext(stream)
        assert pushed.memory_unit_id == leave["memory_unit_id"]
        page = await reader.attune(max_units=5, since_epoch=0)
        item = next(i for i in page["record"] if i["memory_unit"]["id"] == leave["memory_unit_id"])
        assert item["relevance_score"] == pytest.approx(pushed.relevance_score, abs=1e-6)


def test_the_operator_may_judge_too_and_its_subscriptions_learn() -> None:
    h = Harness(embedder=WORDLLAMA, operator_token="operator-secret")
    h.register("w", "analyst")
    churn = h.record("w", CONTENTS["churn"])["memory_unit_id"]
    items = [{"memory_unit_id": churn, "useful": True}]
    answer = h.send("FEEDBACK", "operator", {"items": items}, token="operator-secret")
    assert answer["useful_total"] == 1
    assert h.field.state.feedback["operator"].liked == [h.field.state.index.rows[churn]]
    assert not h.field.broken


def test_what_feedback_adds_to_the_registry_is_bounded_and_written_over_exactly() -> None:
    h = Harness(embedder=WORDLLAMA)
    h.register("w", "analyst")
    readers = [f"r{n}" for n in range(6)]  # more profiles than the matcher's few
    for reader in readers:
        h.register(reader, "researcher", interests=["market prices", f"topic {reader}"])
        subscribe(h, reader, ["memory.recorded"], min_relevance=0)
    units = [
        h.record("w", f"Finding {n} about prices and churn")["memory_unit_id"] for n in range(80)
    ]
    registry = h.field.state.registry
    sizes = []
    for start in range(0, 80, 8):  # 8 judgements a time, both kinds, past the lists' bound
        batch = units[start : start + 8]
        _judge(h, "r0", **{unit: n % 2 == 0 for n, unit in enumerate(batch)})
        matcher_of(h).match(events_of(h))  # the registry keeps scales between judgements
        sizes.append(registry.squares.size)
    assert len(set(sizes[-3:])) == 1  # once the lists are full, every FEEDBACK writes over
    check_splits(h)  # the rows written over, and their kept scales, score as computed afresh
    newest = h.field.state.index.ids[-1]
    sub = next(s for s in h.field.state.subscriptions.values() if s["agent_id"] == "r0")
    pushed = notified(h, sub["id"])
    page = h.attune("r0", max_units=100, since_epoch=0)["record"]
    attuned = {r["memory_unit"]["id"]: r["relevance_score"] for r in page}
    assert pushed[max(pushed)][1] == pytest.approx(attuned[newest], abs=1e-6)
