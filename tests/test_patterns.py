"""A ``matches`` pattern's DFA, counted before the pattern is accepted.

The count tells the patterns RE2 searches with its DFA whatever the text from those whose
DFA a text can make outgrow RE2's memory (then it simulates the pattern's program, about
its width in steps a character): the first are costed at the DFA's rate, the second at the
worst. ``benchmarks/filters_hostile.py calibrate`` times both kinds.
"""

from __future__ import annotations

import pytest

from field.expressions.filters import DFA_STATES, InvalidFilter
from field.expressions.patterns import dfa_states
from field.subscriptions.filtering import compile_filter


@pytest.mark.parametrize(
    "pattern",
    [
        "(?i)outage|incident",
        r"(?i)\bsev[12]\b|\boutage\b",
        r"\b[A-Z]{2,6}-[0-9]{1,6}\b",
        r"\b[0-9a-f]{40}\b",
        r"\pL+ \pL+",
        "^sev[0-9]$",
        r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}",
    ],
)
def test_the_patterns_people_write_have_small_dfas(pattern: str) -> None:
    states = dfa_states(pattern, DFA_STATES)
    assert states is not None and states <= DFA_STATES


@pytest.mark.parametrize(
    "pattern",
    [
        "a[ab]{20}c",  # the last 21 characters: 2^21 states
        "c[ab]{20}a",  # the same, found by the search back for a match's start
        "(a|b)*a(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)",  # written out
        ".*a.{20}",
        r"[a-q][^u-z]{13}x",
    ],
)
def test_patterns_whose_dfa_a_text_can_make_outgrow_memory_are_found(pattern: str) -> None:
    states = dfa_states(pattern, DFA_STATES)
    assert states is None or states > DFA_STATES


def test_a_small_dfa_is_what_lets_a_pattern_search_a_units_content() -> None:
    admitted = compile_filter('event.unit.content.matches("(?i)outage|incident")')
    assert admitted.expression.cost < 25_000
    with pytest.raises(InvalidFilter) as refused:
        compile_filter('event.unit.content.matches("a[ab]{20}c")')
    assert refused.value.details["estimated_cost"] > 100_000
    # the same pattern over a summary (4,096 characters) is within the limit
    compile_filter('event.summary.matches("a[ab]{20}c")')


def test_a_filter_holds_at_most_eight_patterns() -> None:
    eight = " || ".join(f'event.summary.matches("p{n}")' for n in range(8))
    compile_filter(eight)
    with pytest.raises(InvalidFilter, match="more than 8 matches patterns"):
        compile_filter(eight + ' || event.summary.matches("p8")')
