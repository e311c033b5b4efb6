"""The matcher's int8 interest rows decide every case as the float32 rows do.

The registry keeps each interest row twice: as the quantized float32 row and packed
as int8 (:func:`field.subscriptions.registry.packed`). The matcher multiplies the
packed rows a block at a time (:func:`field.subscriptions.matcher.products`). These
tests hold that the packed products are the float32 products to the bit, that the
packed rows follow the registry through every change, and that a Field matched from
the packed rows notifies exactly the rows, with exactly the relevance, of the same
Field matched from the float32 rows, threshold cases included.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from field.ranking.embedding import quantize_scale
from field.ranking.relevance import Interests
from field.subscriptions import matcher as matcher_module
from field.subscriptions.matcher import Matcher, products
from field.subscriptions.registry import SubscriptionRegistry, packed

from .core_util import Harness
from .test_matcher import (
    events_of,
    key,
    many_subscriptions,
    matcher_of,
    program,
    run,
    subscribe,
)

WIDTHS = st.sampled_from([8, 16, 128])


@st.composite
def quantized_rows(draw: st.DrawFn) -> tuple[Any, Any]:
    """Quantized interest rows and unit rows of one width (a zero row among them at times)."""
    width = draw(WIDTHS)
    peak = quantize_scale(width)
    cells = st.integers(min_value=-peak, max_value=peak)
    rows = draw(hnp.arrays(np.float32, (draw(st.integers(0, 700)), width), elements=cells))
    units = draw(hnp.arrays(np.float32, (draw(st.integers(1, 5)), width), elements=cells))
    return rows, units


@settings(max_examples=60, deadline=None)
@given(quantized_rows(), st.sampled_from([1, 7, 64, 1 << 17]))
def test_packed_products_are_the_float32_products(drawn: tuple[Any, Any], block: int) -> None:
    """Whatever the block size, one unit or several: the same bits as the float32 product."""
    rows, units = drawn
    small = packed(rows)
    assert small is not None and small.dtype == np.int8
    assert np.array_equal(small.astype(np.float32), rows)
    exact = rows.astype(np.float64) @ units.astype(np.float64).T
    with mock.patch.object(matcher_module, "PRODUCT_BLOCK_CELLS", block):
        for some in (units[:1], units):
            got = products(small, some)
            want = products(rows, some)
            assert got.shape == want.shape == (len(rows), len(some))
            assert np.array_equal(got, want)
            assert np.array_equal(got.astype(np.float64), exact[:, : len(some)])


def test_rows_that_do_not_fit_int8_are_not_packed() -> None:
    assert packed(np.array([[1.0, 2.5]], dtype=np.float32)) is None
    assert packed(np.array([[128.0, 0.0]], dtype=np.float32)) is None
    assert packed(np.array([[np.nan, 0.0]], dtype=np.float32)) is None
    fits = packed(np.array([[127.0, -127.0]], dtype=np.float32))
    assert fits is not None and fits.tolist() == [[127, -127]]


def check_packed(h: Harness) -> None:
    """The packed rows mirror the float32 rows, and matching from either is the same."""
    registry: SubscriptionRegistry = h.field.state.registry
    assert registry.packed is not None
    assert np.array_equal(registry.packed.view.astype(np.float32), registry.vectors.view)
    events = events_of(h)
    state = h.field.state
    fast = key(Matcher(registry, state.index, state.units).match(events))
    kept = registry.packed
    try:
        registry.packed = None
        slow = key(Matcher(registry, state.index, state.units).match(events))
        # one event at a time and in chunks of a few events, each product made apart
        with mock.patch.object(matcher_module, "PRODUCT_CELLS", 1):
            single = key(Matcher(registry, state.index, state.units).match(events))
    finally:
        registry.packed = kept
    assert fast == slow
    assert single == slow
    with (
        mock.patch.object(matcher_module, "PRODUCT_BLOCK_CELLS", 3),
        mock.patch.object(matcher_module, "PRODUCT_CELLS", 5),
    ):
        assert key(Matcher(registry, state.index, state.units).match(events)) == slow


@settings(max_examples=60, deadline=None)
@given(program)
def test_packed_rows_match_as_the_float32_rows(steps: list[Any]) -> None:
    check_packed(run(steps))


@settings(max_examples=10, deadline=None)
@given(many_subscriptions)
def test_packed_rows_match_as_the_float32_rows_over_many_subscriptions(
    prog: tuple[list[Any], list[Any], list[Any]],
) -> None:
    registrations, subscriptions, steps = prog
    check_packed(run(registrations + subscriptions + steps))


def test_packed_rows_follow_compaction() -> None:
    """Cancelled rows dropped and profiles renumbered: the packed rows follow."""
    h = Harness()
    interests = ([], ["pricing churn"], ["pricing churn", "market size"], ["risk"])
    for i, theirs in enumerate(interests):
        h.register(f"a{i}", "analyst", interests=theirs)
    ids = [subscribe(h, f"a{i}", ["memory.recorded"]) for i in range(4)]
    h.record("a0", "pricing churn size market", score=0.75)
    h.send("SUBSCRIBE", "a2", {"action": "unsubscribe", "subscription": {"id": ids[2]}})
    registry = h.field.state.registry
    rows = registry.packed.view.shape[0] if registry.packed is not None else 0
    registry.compact(set())
    assert registry.packed is not None and registry.packed.view.shape[0] < rows
    check_packed(h)


def test_a_registry_with_a_row_that_is_not_int8_matches_from_float32() -> None:
    """A row that does not fit int8 drops the packed rows: the matcher reads float32 rows."""
    h = Harness()
    h.register("a0", "analyst", interests=["pricing churn"])
    h.register("a1", "analyst", interests=["market size", "pricing"])
    subscribe(h, "a1", ["memory.recorded"])
    h.record("a0", "pricing churn market", score=0.75)
    registry = h.field.state.registry
    before = key(matcher_of(h).match(events_of(h)))
    odd = {"id": "a2", "role": "analyst", "interests": [], "registered_epoch": 99}
    with mock.patch("field.subscriptions.registry.interest_vectors") as made:
        width = registry.vectors.view.shape[1]
        made.return_value = Interests(
            np.full((1, width), 0.5, dtype=np.float32), np.array([width / 4]), ("",), None
        )
        registry.add(
            {"id": "s-odd", "status": "cancelled", "events": ["memory.recorded"],
             "min_relevance": 0.0, "include_own": False, "created_epoch": 99},
            odd,
        )  # fmt: skip
    assert registry.packed is None
    assert key(matcher_of(h).match(events_of(h))) == before
