"""CEL expressions: what compiles, what is refused and where, and evaluation never raising."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from field.core.filters import (
    MAX_FILTER_CHARS,
    InvalidFilter,
    check_types,
    compile_expression,
)
from field.errors import HTTP_STATUS

ALLOWED = ("event", "subscriber", "parameters")


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
    assert "nests" in refused("[1].all(x, [2].exists(y, x == y))").message
    assert (
        "more than"
        in refused("[1].all(x, x > 0) && [2].all(y, y > 0) && [3].exists(z, z > 0)").message
    )
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
