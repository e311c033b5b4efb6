"""CEL expressions: what compiles, what is refused and where, and evaluation never raising."""

from __future__ import annotations

from typing import Any

import pytest
import re2
from hypothesis import given
from hypothesis import strategies as st

from field.contract.errors import HTTP_STATUS
from field.contract.model import Limits
from field.expressions import filters
from field.expressions.filters import (
    MAX_FILTER_CHARS,
    MAX_PATTERN_CHARS,
    MAX_PATTERN_WIDTH,
    Context,
    Expression,
    InvalidFilter,
    check_types,
)
from field.subscriptions.filtering import filter_shapes

ALLOWED = ("event", "subscriber", "parameters")
#: the largest values a subscription filter is given
SHAPES = filter_shapes(Limits())


def compile_expression(text: object, allowed: tuple[str, ...], **options: Any) -> Expression:
    return filters.compile_expression(text, allowed, shapes=SHAPES, **options)


def refused(text: object) -> InvalidFilter:
    with pytest.raises(InvalidFilter) as caught:
        compile_expression(text, ALLOWED, field="subscription.filter")
    assert caught.value.code == "INVALID_FILTER" and HTTP_STATUS[caught.value.code] == 422
    return caught.value


def test_a_filter_compiles_once_and_evaluates_against_contexts() -> None:
    expression = compile_expression(
        'event.name == "memory.recorded" && event.unit.confidence > 0.5',
        ALLOWED,
        field="subscription.filter",
    )
    assert expression.variables == {"event"}
    high = {"event": {"name": "memory.recorded", "unit": {"confidence": 0.9}}}
    low = {"event": {"name": "memory.recorded", "unit": {"confidence": 0.1}}}
    assert expression.evaluate(high) is True
    assert expression.evaluate(low) is False


def test_a_syntax_error_names_line_and_column() -> None:
    error = refused('event.name ==\n  "a" &&')
    assert error.details["line"] == 2 and error.details["column"] == 9
    assert "line 2, column 9" in error.message


def test_unknown_variables_are_refused_by_name() -> None:
    error = refused("agent.id == 'a' && event.name == 'x'")
    assert error.details["unknown_variables"] == ["agent"]


def test_comprehension_variables_are_not_context_variables() -> None:
    expression = compile_expression(
        "event.unit.relations.exists(r, r.target_id in parameters.unit_id)",
        ALLOWED,
        field="f",
    )
    assert expression.variables == {"event", "parameters"}
    context = {
        "event": {"unit": {"relations": [{"target_id": "mu-2"}]}},
        "parameters": {"unit_id": ["mu-2"]},
    }
    assert expression.evaluate(context) is True


def test_size_and_shape_limits() -> None:
    assert "limit" in refused("true && " * (MAX_FILTER_CHARS // 8 + 1) + "true").message
    # one comprehension may hold another, not a third
    compile_expression("[1].all(x, [2].exists(y, x == y))", ALLOWED, field="f")
    assert "nests" in refused("[1].all(x, [2].exists(y, [3].exists(z, z == y)))").message
    five = " && ".join(f"[1].all({v}, {v} > 0)" for v in "abcde")
    assert "more than" in refused(five).message
    # a macro name inside a string literal is no comprehension
    compile_expression('event.name == ".all(x, x)" && [1].all(x, x > 0)', ALLOWED, field="f")
    assert "empty" in refused("   ").message
    assert "string" in refused(42).message


def test_a_type_error_no_event_can_avoid_is_refused() -> None:
    samples = [{"event": {"epoch": 3, "name": "memory.recorded"}}]
    expression = compile_expression('event.epoch + "x" == 1', ALLOWED, field="f")
    with pytest.raises(InvalidFilter, match="type error"):
        check_types(expression, samples, "f")
    # a field the sample lacks is no type error: another event may hold it
    check_types(compile_expression("event.unit.confidence > 1", ALLOWED, field="f"), samples, "f")


def test_evaluation_errors_are_no_match_never_an_exception() -> None:
    missing = compile_expression("event.unit.confidence > 0.5", ALLOWED, field="f")
    assert missing.evaluate({"event": {"name": "agent.joined"}}) is None
    not_boolean = compile_expression("event.epoch", ALLOWED, field="f")
    assert not_boolean.evaluate({"event": {"epoch": 3}}) is None
    wrong_type = compile_expression("event.epoch > 'x'", ALLOWED, field="f")
    assert wrong_type.evaluate({"event": {"epoch": 3}}) is None


@given(st.text(max_size=200))
def test_any_text_compiles_or_is_refused_cleanly(text: str) -> None:
    try:
        expression = compile_expression(text, ALLOWED, field="f")
    except InvalidFilter:
        return
    assert expression.evaluate({"event": {}, "subscriber": {}, "parameters": {}}) in (
        True,
        False,
        None,
    )


def test_matches_searches_with_re2_in_both_call_forms() -> None:
    deploy = {"event": {"summary": "we Deploy checkout-7 \u2192 now", "tags": ["sev2", "db"]}}
    cases = {
        'event.summary.matches("Deploy")': True,
        'event.summary.matches("^Deploy")': False,  # a search, anchored only when asked
        r'matches(event.summary, r"\bcheckout-\d+")': True,
        "event.summary . matches ( '(?i)deploy' )": True,
        'event.tags.exists(t, t.matches("^sev[12]$"))': True,
        r'event.summary.matches("matches\\(") || "matches(x)" == event.summary': False,
        r'event.summary.matches(r"\pL+ \pL+")': True,
        r'event.summary.matches(r"\x{2192} now$")': True,  # a code point beyond Latin-1
    }
    for text, expected in cases.items():
        assert compile_expression(text, ALLOWED, field="f").evaluate(deploy) is expected, text
    # not a string: an evaluation error, so no match
    number = compile_expression('event.epoch.matches("1")', ALLOWED, field="f")
    assert number.evaluate({"event": {"epoch": 1}}) is None


def test_a_pattern_is_compiled_once_not_on_every_evaluation() -> None:
    expression = compile_expression(
        'event.summary.matches("(?i)incident|outage|sev[0-9]+")', ALLOWED, field="f"
    )
    context = Context(expression.bind_all({"event": {"summary": "an outage of the checkout"}}))
    before = filters._compiled.cache_info()
    for _ in range(200):
        assert expression.evaluate(context) is True
    after = filters._compiled.cache_info()
    assert after.misses <= before.misses + 1
    assert after.hits >= before.hits + 199


def test_patterns_the_field_would_compile_per_event_or_run_slowly_are_refused() -> None:
    not_literal = refused("event.summary.matches(event.actor)")
    assert "string literal" in not_literal.message
    assert not_literal.details["offset"] == len("event.summary.matches(")
    assert "string literal" in refused('["a"].exists(p, event.summary.matches(p))').message
    assert "does not compile" in refused('event.summary.matches("(?<=a)b")').message
    assert "does not compile" in refused('event.summary.matches("a{1001}")').message
    wide = refused(r'event.summary.matches(r"\w{1,100}\w{1,100}\w{1,100}z")')
    assert wide.details["max_width"] == MAX_PATTERN_WIDTH
    assert wide.details["width"] > MAX_PATTERN_WIDTH
    # too large for RE2's memory bound, however narrow over single bytes
    assert "does not compile" in refused(r'event.summary.matches(r"a\pL{100}c")').message
    long = refused(f'event.summary.matches("{"a" * (MAX_PATTERN_CHARS + 1)}")')
    assert long.details["max_chars"] == MAX_PATTERN_CHARS
    assert "takes a string and a pattern" in refused('"x".matches("a", "b")').message
    # the name matches calls are bound to is the Field's, not the client's
    assert "unknown function" in refused("_field_matches(event.summary, event.actor)").message


def test_a_stored_filter_an_earlier_version_accepted_still_runs() -> None:
    text = "event.entity.type.matches(event.actor)"
    expression = compile_expression(text, ALLOWED, field="f", stored=True)
    assert expression.text == text
    deploy = {"entity": {"type": "we deploy"}}
    assert expression.evaluate({"event": {**deploy, "actor": "dep.oy"}}) is True
    assert expression.evaluate({"event": {**deploy, "actor": "^x"}}) is False
    # one over the cost limit is refused all the same: its subscription matches nothing
    with pytest.raises(InvalidFilter, match="may cost"):
        compile_expression("event.summary.matches(event.actor)", ALLOWED, field="f", stored=True)


@given(st.text(max_size=40), st.text(min_size=1, max_size=8))
def test_an_escaped_literal_pattern_matches_where_the_text_contains_it(
    text: str, needle: str
) -> None:
    literal = '"' + re2.escape(needle).replace("\\", "\\\\").replace('"', '\\"') + '"'
    literal = literal.replace("\n", "\\n").replace("\r", "\\r")
    try:
        expression = compile_expression(f"event.summary.matches({literal})", ALLOWED, field="f")
    except InvalidFilter as error:
        raise AssertionError(f"{literal}: {error.message}") from None
    assert expression.evaluate({"event": {"summary": text}}) is (needle in text)
