"""The vectorized relevance scorer agrees with the plain reference scorer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.model import MEMORY_TYPES
from field.ranking import relevance

from .reference_relevance import reference_diversify, reference_scores

WORDS = ["market", "size", "pricing", "growth", "competitor", "churn", "hr", "saas", "risk"]
ROLES = ["strategist", "market_researcher", "analyst", "risk officer"]
AGENTS = ["a1", "a2", "a3", "a4"]
TASKS = [None, "t1", "t2"]

unit_strategy = st.fixed_dictionaries(
    {
        "agent": st.sampled_from(AGENTS),
        "role": st.sampled_from(ROLES),
        "type": st.sampled_from(sorted(MEMORY_TYPES)),
        "content": st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join),
        "purpose": st.lists(st.sampled_from(WORDS), max_size=3).map(lambda w: " ".join(w) or "p"),
        "task": st.sampled_from(TASKS),
        "score": st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
        "status": st.sampled_from(["active", "draft", "contested", "superseded"]),
    }
)

query_strategy = st.fixed_dictionaries(
    {
        "agent_id": st.sampled_from(AGENTS),
        "role": st.sampled_from(ROLES),
        "interests": st.lists(
            st.lists(st.sampled_from(WORDS), min_size=1, max_size=2).map(" ".join), max_size=3
        ),
        "context_hint": st.one_of(st.none(), st.sampled_from(WORDS)),
        "task_id": st.sampled_from(TASKS),
        "recency_weight": st.floats(min_value=0, max_value=1),
        "include_own": st.booleans(),
        "since_epoch": st.one_of(st.none(), st.integers(min_value=0, max_value=40)),
    }
)


def _unit(i: int, spec: dict[str, Any]) -> dict[str, Any]:
    unit: dict[str, Any] = {
        "id": f"mem-{i}",
        "mode": "committed",
        "type": spec["type"],
        "content": spec["content"],
        "intent": {"purpose": spec["purpose"], "task_id": spec["task"], "question": None},
        "relations": [],
        "source": {"agent_id": spec["agent"], "agent_role": spec["role"]},
        "status": spec["status"],
        "epoch": 2 * i + 1,
    }
    if spec["score"] is not None:
        unit["confidence"] = {"score": spec["score"], "reasoning": "r"}
    return unit


@pytest.mark.parametrize("weights", [relevance.LEXICAL, relevance.SENTENCE], ids=lambda w: w.name)
@settings(max_examples=120, deadline=None)
@given(st.lists(unit_strategy, max_size=40), query_strategy)
def test_vectorized_scores_match_the_reference(
    weights: relevance.Weights, specs: list[dict[str, Any]], query_spec: dict[str, Any]
) -> None:
    units = [_unit(i, spec) for i, spec in enumerate(specs)]
    index = relevance.UnitIndex(weights=weights)
    for unit in units:
        index.add(unit)
    query = relevance.Query(**query_spec)

    rows = relevance.candidates(index, query)
    scores = relevance.score(index, query, rows)
    got = {index.ids[r]: float(s) for r, s in zip(rows, scores, strict=True)}
    expected = reference_scores(units, query, weights=weights)
    assert got.keys() == expected.keys()
    for unit_id, value in expected.items():
        assert abs(got[unit_id] - value) < 1e-5, unit_id
        assert 0.0 <= got[unit_id] <= 1.0

    diversified = relevance.diversify(index, rows, scores)
    got_div = {index.ids[r]: float(s) for r, s in zip(rows, diversified, strict=True)}
    by_id = {u["id"]: u for u in units}
    expected_div = reference_diversify(by_id, got)
    for unit_id, value in expected_div.items():
        assert abs(got_div[unit_id] - value) < 1e-9, unit_id


def test_keywords() -> None:
    assert relevance.keywords("The Competitors' pricing, and growth!") == [
        "competitor",
        "pricing",
        "growth",
    ]
    assert relevance.keywords(None) == []


def test_interest_match_outranks_the_rest_at_scale() -> None:
    """Thousands of units score in one call, one array in row order."""
    index = relevance.UnitIndex()
    for i in range(5000):
        index.add(
            _unit(
                i,
                {
                    "agent": AGENTS[i % 4],
                    "role": ROLES[i % 4],
                    "type": "finding",
                    "content": WORDS[i % len(WORDS)],
                    "purpose": "p",
                    "task": None,
                    "score": 0.5,
                    "status": "active",
                },
            )
        )
    query = relevance.Query(
        agent_id="zz",
        role="strategist",
        interests=["pricing"],
        context_hint=None,
        task_id=None,
        recency_weight=0.0,
        include_own=False,
        since_epoch=None,
    )
    rows = relevance.candidates(index, query)
    scores = relevance.score(index, query, rows)
    assert scores.shape == (5000,)
    pricing = np.array([WORDS[r % len(WORDS)] == "pricing" for r in rows])
    assert scores[pricing].min() > scores[~pricing].max()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(AGENTS),
            st.one_of(st.sampled_from([0.1, 0.5, 0.9]), st.floats(min_value=0, max_value=1)),
        ),
        max_size=400,
    ),
    st.integers(min_value=1, max_value=20),
    st.sampled_from([0.0, 0.0, 0.3, 0.6, 0.95]),
)
def test_best_diversified_matches_diversifying_everything(
    units: list[tuple[str, float]], count: int, threshold: float
) -> None:
    index = relevance.UnitIndex()
    for i, (agent, _) in enumerate(units):
        index.add(
            _unit(
                i,
                {
                    "agent": agent,
                    "role": "r",
                    "type": "finding",
                    "content": "c",
                    "purpose": "p",
                    "task": None,
                    "score": 0.5,
                    "status": "active",
                },
            )
        )
    rows = np.arange(len(units))
    scores = np.array([s for _, s in units], dtype=np.float64)

    positions, got, available = relevance.best_diversified(
        index, rows, scores, count=count, threshold=threshold
    )

    everything = relevance.diversify(index, rows, scores)
    ranked = sorted(
        (i for i in range(len(units)) if everything[i] >= threshold),
        key=lambda i: (-everything[i], i),
    )
    assert available == len(ranked)
    assert positions.tolist() == ranked[:count]
    assert np.allclose(got, everything[ranked[:count]])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(unit_strategy, min_size=1, max_size=30),
    st.lists(st.sampled_from([*WORDS, "absent"]), min_size=1, max_size=5),
    st.data(),
)
def test_hits_of_a_few_rows_equal_the_postings_path(
    specs: list[dict[str, Any]], words: list[str], data: st.DataObject
) -> None:
    index = relevance.UnitIndex()
    for i, spec in enumerate(specs):
        index.add(_unit(i, spec))
    rows = np.array(
        data.draw(st.lists(st.integers(0, len(specs) - 1), max_size=len(specs))), dtype=np.intp
    )
    everywhere = index.hits(words)
    assert everywhere is not None
    few = index.hits(words, rows)  # a few rows: read from the rows' keyword sets
    assert few is not None and np.array_equal(few, everywhere[rows])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 400_000), max_size=50))
def test_recency_from_its_table_is_the_exponential_itself(ages: list[int]) -> None:
    """Ages past the table's end make it grow, up to where the exponential is 0.0."""
    array = np.array(ages, dtype=np.int64)
    expected = np.exp2(-array.astype(np.float64) / relevance.RECENCY_HALF_LIFE)
    assert np.array_equal(relevance.recency(array), expected)
    assert len(relevance._recency_table) <= relevance._RECENCY_ZERO + 1
    for odd in (array.astype(np.float64), array - 1):  # fractional or negative: computed
        assert np.array_equal(
            relevance.recency(odd), np.exp2(-odd.astype(np.float64) / relevance.RECENCY_HALF_LIFE)
        )


def test_recency_reaches_zero_where_the_table_stops() -> None:
    zero = relevance._RECENCY_ZERO
    ages = np.array([zero - 1, zero, zero + 1, 10 * zero], dtype=np.int64)
    exact = np.exp2(-ages.astype(np.float64) / relevance.RECENCY_HALF_LIFE)
    assert exact[0] > 0.0 and not exact[1:].any()
    assert np.array_equal(relevance.recency(ages), exact)


def test_role_factors_are_kept_for_a_bounded_number_of_roles() -> None:
    """The table per attuning role is bounded; an evicted role's table is made again, the same,
    and a kept one grows as new recorder roles appear."""
    spec = {"type": "finding", "content": "a", "purpose": "p", "task": None, "score": 0.5}
    spec |= {"status": "active", "agent": "w", "role": "market_researcher"}
    index = relevance.UnitIndex()
    index.add(_unit(0, spec))
    assert index.role_factor("senior_researcher").tolist() == [0.5]
    for i in range(relevance.QUERY_TEXTS + 5):
        index.role_factor(f"role_{i}")
    assert len(index._role_factors) == relevance.QUERY_TEXTS
    assert "senior_researcher" not in index._role_factors  # the least recently used went first
    assert index.role_factor("senior_researcher").tolist() == [0.5]
    index.add(_unit(1, {**spec, "role": "senior_researcher"}))
    assert index.role_factor("senior_researcher").tolist() == [0.5, 1.0]


_WORDS = st.sampled_from(["market", "size", "office", "coffee", "churn", "price", "deploy"])


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.frozensets(_WORDS, max_size=6), max_size=12),
    query=st.sets(st.one_of(_WORDS, st.just("unknown")), max_size=5),
    picked=st.lists(st.integers(0, 11), max_size=8),
)
def test_keyword_rows_hold_each_rows_words_and_count_as_sets_do(
    rows: list[frozenset[str]], query: set[str], picked: list[int]
) -> None:
    """The flat keyword column gives back every row's words, and counts a query's words in
    any rows (repeated, in any order) as a frozenset per row would."""
    keywords = relevance.KeywordRows()
    for words in rows:
        keywords.append(sorted(words))
    assert len(keywords) == len(rows)
    assert [keywords[row] for row in range(len(rows))] == rows
    chosen = np.array([row for row in picked if row < len(rows)], dtype=np.intp)
    expected = [len(query & rows[row]) for row in chosen.tolist()]
    assert keywords.count(query, chosen).tolist() == expected


def _counted_matrix(width: int) -> tuple[relevance.Matrix, list[int]]:
    """A matrix whose row copies (moves and growths) are counted, copy by copy."""
    matrix, copied = relevance.Matrix(width), []
    real_copy = matrix._copy

    def counted(to: Any, start: int, stop: int) -> None:
        copied.append(max(0, stop - start))
        real_copy(to, start, stop)

    matrix._copy = counted  # type: ignore[method-assign]
    return matrix, copied


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=60), st.integers(0, 2**32 - 1))
def test_a_matrix_grown_ahead_holds_its_rows_and_no_append_copies_them_all(
    blocks: list[int], seed: int
) -> None:
    """Rows appended ahead (the unit index's) read back as appended at every step, through
    every growth; past :data:`relevance.AHEAD_FROM` rows, no append copies more than
    AHEAD_ROWS rows for each it appends, its own and those of the largest block before it
    (not yet movable when it came), where growing at once copies them all."""
    width = 3
    matrix, copied = _counted_matrix(width)
    expected = np.empty((0, width), dtype=np.float32)
    rng = np.random.default_rng(seed)
    for count in blocks * 12:
        rows = rng.integers(-127, 128, size=(count, width)).astype(np.float32)
        copied.clear()
        matrix.extend(rows, ahead=True)
        expected = np.concatenate([expected, rows])
        assert np.array_equal(matrix.view, expected)
        if len(expected) - count >= relevance.AHEAD_FROM:
            assert sum(copied) <= (relevance.AHEAD_ROWS + 1) * count + max(blocks)


def test_a_matrix_grown_at_once_copies_every_row_in_one_append() -> None:
    """Without ``ahead`` (rows that may change in place: the registry's) the append that
    fills the buffer copies every row, as the bound above would not allow."""
    matrix, copied = _counted_matrix(2)
    rows = np.arange(8192 * 2, dtype=np.float32).reshape(-1, 2)
    most = 0
    for start in range(0, len(rows), 64):
        copied.clear()
        matrix.extend(rows[start : start + 64])
        most = max(most, sum(copied))
    assert np.array_equal(matrix.view, rows)
    assert most >= relevance.AHEAD_FROM > (relevance.AHEAD_ROWS + 2) * 64
