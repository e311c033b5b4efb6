"""ATTUNE's ranking in bounded steps: the same page as scoring every candidate, fewer rows
multiplied, and the event loop free between the steps."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.core.field import Field
from field.engine.service import FieldService
from field.ranking import relevance
from field.ranking.embedding import HashingEmbedder
from field.store import MemoryEventLog

from .conftest import UNLOADED_POLICY
from .core_util import Harness
from .test_relevance import _unit, query_strategy, unit_strategy
from .test_service import envelope


@pytest.fixture
def small_steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Steps of a few rows, and a first round of the pool alone: many rounds and steps."""
    with monkeypatch.context() as patch:
        patch.setattr(relevance, "STEP_CELLS", 1)  # the smallest step: 1,024 rows
        patch.setattr(relevance, "FIRST_ROWS", 0)
        yield


def exhaustive(
    index: relevance.UnitIndex, query: relevance.Query, count: int, threshold: float
) -> tuple[list[int], list[float], int]:
    """Every candidate scored and diversified, then sorted: what a ranking must give."""
    rows = relevance.candidates(index, query)
    scores = relevance.score(index, query, rows)
    everything = relevance.diversify(index, rows, scores)
    ranked = sorted(
        (i for i in range(len(rows)) if everything[i] >= threshold),
        key=lambda i: (-everything[i], i),
    )
    return ranked[:count], everything[ranked[:count]].tolist(), len(ranked)


def ranked(
    index: relevance.UnitIndex, query: relevance.Query, count: int, threshold: float
) -> tuple[list[int], list[float], int, int]:
    """A :class:`~field.ranking.relevance.Ranking`'s answer, and how many steps it paused."""
    rows = relevance.candidates(index, query)
    ranking = relevance.Ranking(index, query, rows, count=count, threshold=threshold)
    pauses = sum(1 for _ in ranking.steps())
    return ranking.positions.tolist(), ranking.scores.tolist(), ranking.available, pauses


@settings(max_examples=300, deadline=None)
@given(
    st.lists(unit_strategy, max_size=80),
    query_strategy,
    st.integers(min_value=1, max_value=12),
    st.sampled_from([0.0, 0.0, 0.2, 0.45, 0.7]),
)
def test_a_pruned_ranking_is_the_exhaustive_one(
    specs: list[dict[str, Any]], q: dict[str, Any], count: int, threshold: float
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(relevance, "FIRST_ROWS", 0)  # rounds of a few rows: pruning decides
        index = relevance.UnitIndex(HashingEmbedder())
        for i, spec in enumerate(specs):
            index.add(_unit(i, spec))
        query = relevance.Query(**{**q, "since_epoch": None})
        expected = exhaustive(index, query, count, threshold)
        positions, scores, available, _ = ranked(
            index, relevance.Query(**{**q, "since_epoch": None}), count, threshold
        )
    assert (positions, scores, available) == expected  # the same bits


def field_of(units: int, seed: int = 5) -> relevance.UnitIndex:
    """An index of ``units`` units of 40 agents over 60 tasks, contents of 8 random words."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(300)] + ["pricing", "churn", "market", "growth"]
    index = relevance.UnitIndex(HashingEmbedder())
    for i in range(units):
        spec = {
            "agent": f"a{rng.randrange(40)}",
            "role": rng.choice(["strategist", "analyst", "engineer"]),
            "type": rng.choice(["finding", "decision", "observation", "question"]),
            "content": " ".join(rng.choices(words, k=8)),
            "purpose": " ".join(rng.choices(words, k=3)),
            "task": f"t{rng.randrange(60)}",
            "score": rng.random(),
            "status": "active",
        }
        index.add(_unit(i, spec))
    return index


def query_of(**extra: Any) -> relevance.Query:
    base: dict[str, Any] = {
        "agent_id": "reader",
        "role": "strategist",
        "interests": ["pricing", "churn"],
        "context_hint": "pricing for smb enterprise",
        "task_id": "t7",
        "recency_weight": 0.25,
        "include_own": False,
        "since_epoch": None,
    }
    return relevance.Query(**{**base, **extra})


@pytest.mark.parametrize(
    "extra",
    [{}, {"task_id": None}, {"recency_weight": 0.0}, {"interests": [], "context_hint": "churn"}],
)
@pytest.mark.parametrize("count", [1, 10, 200])
@pytest.mark.parametrize("threshold", [0.0, 0.45])
def test_a_large_ranking_in_steps_is_the_exhaustive_one(
    small_steps: None, extra: dict[str, Any], count: int, threshold: float
) -> None:
    index = field_of(6000)
    expected = exhaustive(index, query_of(**extra), count, threshold)
    positions, scores, available, _ = ranked(index, query_of(**extra), count, threshold)
    assert (positions, scores, available) == expected


def test_a_top_ten_multiplies_few_of_the_rows() -> None:
    index = field_of(20_000)
    query = query_of()
    rows = relevance.candidates(index, query)
    ranking = relevance.Ranking(index, query, rows, count=10, threshold=0.0).run()
    assert len(ranking.positions) == 10
    # the rows whose semantic factor was computed (those a page may explain)
    assert query._scored is not None
    assert len(query._scored[0]) < len(rows) // 4


def alike(units: int) -> relevance.UnitIndex:
    """Units alike but for their contents (random words none of :func:`plain` names):
    every row has the same bound, so none is pruned before it is multiplied."""
    index = relevance.UnitIndex(HashingEmbedder())
    rng = random.Random(2)
    for i in range(units):
        spec = {
            "agent": f"a{i % 50}",
            "role": "analyst",
            "type": "finding",
            "content": " ".join(f"w{rng.randrange(500)}" for _ in range(6)),
            "purpose": "p",
            "task": None,
            "score": 0.5,
            "status": "active",
        }
        index.add(_unit(i, spec))
    return index


def plain() -> relevance.Query:
    """A query of one interest no unit of :func:`alike` holds as a keyword."""
    return query_of(interests=["zebra"], context_hint=None, task_id=None, recency_weight=0.0)


def test_rows_that_bound_alike_are_all_scored_in_steps(small_steps: None) -> None:
    index = alike(5000)
    expected = exhaustive(index, plain(), 10, 0.0)
    positions, scores, available, pauses = ranked(index, plain(), 10, 0.0)
    assert (positions, scores, available) == expected
    assert pauses >= 4  # 5,000 rows, 1,024 a step


def test_a_ranking_reads_the_rows_as_they_were_when_it_was_made(small_steps: None) -> None:
    index = alike(3000)
    expected = exhaustive(index, plain(), 10, 0.0)
    rows = relevance.candidates(index, plain())
    ranking = relevance.Ranking(index, plain(), rows, count=10, threshold=0.0)
    steps = ranking.steps()
    next(steps)
    # the index goes on: more units (its matrix grows, the calibration moves on)
    rng = random.Random(9)
    for i in range(3000, 9000):
        spec = {
            "agent": "a1",
            "role": "analyst",
            "type": "finding",
            "content": f"zebra zebras {rng.randrange(10)}",
            "purpose": "zebra",
            "task": None,
            "score": 1.0,
            "status": "active",
        }
        index.add(_unit(i, spec))
    for _ in steps:
        pass
    got = (ranking.positions.tolist(), ranking.scores.tolist(), ranking.available)
    assert got == expected


async def test_the_loop_turns_between_the_steps_of_a_large_ranking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full ATTUNE's ranking pauses between its steps, and the service gives the loop a
    turn at each: another task runs while the ranking is under way."""
    monkeypatch.setattr(relevance, "STEP_CELLS", 1)  # 1,024 rows a step
    monkeypatch.setattr(relevance, "FIRST_ROWS", 0)
    steps = 0
    real_steps = relevance.Ranking.steps

    def counted(self: relevance.Ranking) -> Iterator[None]:
        nonlocal steps
        for _ in real_steps(self):
            steps += 1
            yield

    monkeypatch.setattr(relevance.Ranking, "steps", counted)
    service = FieldService(
        MemoryEventLog(), lambda: Field(embedder=HashingEmbedder()), admission=UNLOADED_POLICY
    )
    await service.start()
    try:
        field = service.field
        tokens: dict[str, str] = {}

        async def run(agent: str, operation: str, payload: dict[str, Any]) -> Any:
            body = envelope(operation, agent, payload)
            token = tokens.get(agent)
            outcome = await service.execute(
                lambda f: f.handle(body, token=token, operation=operation), operation=operation
            )
            return outcome.response

        for agent in ("writer", "reader"):
            answer = await run(agent, "REGISTER", {"id": agent, "role": "analyst"})
            tokens[agent] = answer["token"]
        for i in range(5000):
            payload = {
                "type": "finding",
                "content": f"note {i % 97} about w{i % 13} and v{i % 89}",
                "intent": {"purpose": "p"},
                "confidence": {"score": 0.5, "reasoning": "r"},
            }
            await run("writer", "RECORD", payload)
        assert field.sliced_reads
        turns: list[int] = []

        async def watch() -> None:
            while True:
                turns.append(steps)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        scope = {"role": "analyst", "max_units": 10, "interests": ["zebra"], "recency_weight": 0.0}
        page = await run("reader", "ATTUNE", {"scope": scope})
        watcher.cancel()
        assert page["context_budget"]["units_returned"] == 10
        assert steps >= 4
        # the watcher ran while the ranking was part-way through (between two steps)
        assert any(0 < seen < steps for seen in turns)
    finally:
        await service.stop()


def test_a_bound_is_never_below_the_score() -> None:
    # whatever the factors, a row's bound (float32, with its slack) is at least its score
    index = field_of(2000)
    query = query_of()
    rows = relevance.candidates(index, query)
    ranking = relevance.Ranking(index, query, rows, count=10, threshold=0.0)
    scores = relevance.score(index, query_of(), rows)
    assert np.all(ranking._bounds >= scores)


def stepped_twins(units: int) -> tuple[Harness, Harness]:
    """Two Fields given the same units, alike but for their contents; the first builds
    its pages in steps."""
    stepped, whole = Harness(embedder=HashingEmbedder()), Harness(embedder=HashingEmbedder())
    stepped.field.sliced_reads = True
    rng = random.Random(4)
    contents = [" ".join(f"w{rng.randrange(500)}" for _ in range(6)) for _ in range(units)]
    for h in (stepped, whole):
        h.register("writer", "analyst")
        h.register("reader", "analyst", interests=["zebra"])
        for content in contents:
            h.record("writer", content, score=0.5)
    return stepped, whole


def test_what_changes_during_a_ranking_does_not_change_its_page(small_steps: None) -> None:
    stepped, whole = stepped_twins(2500)
    scope = {"role": "analyst", "max_units": 10, "recency_weight": 0.0}
    body = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "m",
        "operation": "ATTUNE",
        "agent_id": "reader",
        "session_id": None,
        "epoch": 0,
        "payload": {"scope": scope, "format": "full"},
    }
    expected = whole.field.handle(body, token=whole.tokens["reader"], operation="ATTUNE")
    assert expected.rest is None
    outcome = stepped.field.handle(body, token=stepped.tokens["reader"], operation="ATTUNE")
    assert outcome.rest is not None
    next(outcome.rest)  # part-way through the ranking: no unit read yet
    shown = [item["memory_unit"]["id"] for item in expected.response["record"]]
    # the Field goes on: units of the page contested and superseded, new units
    relation = {"type": "contradicts", "target_id": shown[0], "description": "no"}
    stepped.record("writer", "zebra zebra, not that", relations=[relation])
    stepped.record(
        "writer", "zebra, revised", relations=[{"type": "supersedes", "target_id": shown[1]}]
    )
    assert stepped.field.state.units[shown[0]]["status"] == "contested"
    assert stepped.field.state.units[shown[1]]["status"] == "superseded"
    pauses = 1 + sum(1 for _ in outcome.rest)
    assert pauses >= 2  # 2,500 rows of one bound, 1,024 a step: the first pause was mid-ranking
    assert outcome.response == expected.response


def test_the_kept_query_scales_are_bounded_and_the_least_recently_used_go_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every agent's queries share the kept scales: a flood of distinct ones keeps at most
    QUERY_TEXTS, dropping the one used longest ago, and a kept one is the same values."""
    monkeypatch.setattr(relevance, "QUERY_TEXTS", 3)
    index = Harness(embedder=HashingEmbedder()).field.state.index
    squares = np.ones(1)

    def row(k: int) -> Any:
        vector = np.zeros((1, index.embedder.dim), dtype=np.float32)
        vector[0, k] = 1.0
        return vector

    first = index._scales(row(0), squares, 0)
    for k in (1, 2):
        index._scales(row(k), squares, 0)
    index._scales(row(0), squares, 0)  # used again: now the most recent
    index._scales(row(3), squares, 0)  # one too many: row 1's go
    kept = relevance._SCALED[index.calibration]
    assert len(kept) == 3
    held = {key[0] for key in kept}
    assert row(1).tobytes() not in held and row(0).tobytes() in held
    again = index._scales(row(0), squares, 0)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
