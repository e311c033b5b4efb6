"""Every JSON document is bounded in size, depth and count before anything reads it."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.errors import Code, FieldError
from field.contract.model import Limits
from field.transports.documents import check_bounds, decode_document

LIMITS = Limits()


def nested(depth: int, leaf: str = "") -> str:
    return "[" * depth + leaf + "]" * depth


def code_of(raw: bytes | str, limits: Limits = LIMITS) -> str | None:
    try:
        decode_document(raw, limits)
    except FieldError as error:
        assert error.to_response()["message"]  # a spec body, always
        return error.code
    return None


@pytest.mark.parametrize("depth", [1, 2, 31, 32])
def test_documents_within_the_depth_limit_pass(depth: int) -> None:
    assert decode_document(nested(depth), LIMITS) == orjson.loads(nested(depth))


@pytest.mark.parametrize("depth", [33, 100, 990, 1000, 1023, 1024, 1025, 5000, 100_000])
def test_deeper_documents_are_refused_without_recursing(depth: int) -> None:
    assert code_of(nested(depth)) == Code.INVALID_JSON


def test_objects_count_towards_depth_like_arrays() -> None:
    doc = '{"a":' * 33 + "1" + "}" * 33
    assert code_of(doc) == Code.INVALID_JSON
    doc = '{"a":' * 32 + "1" + "}" * 32
    assert code_of(doc) is None


def test_a_deep_value_inside_an_envelope_is_refused() -> None:
    envelope = (
        '{"protocol":"akashik","version":"0.1.0","id":"x","operation":'
        + nested(1000)
        + ',"agent_id":"a","session_id":null,"epoch":0,"payload":{}}'
    )
    assert code_of(envelope) == Code.INVALID_JSON


def test_too_many_values_are_refused_before_anything_reads_them() -> None:
    limits = Limits(max_json_items=100)
    assert code_of("[" + ",".join(["0"] * 100) + "]", limits) is None
    assert code_of("[" + ",".join(["0"] * 101) + "]", limits) == Code.PAYLOAD_TOO_LARGE
    spread = '{"a":[' + ",".join(["[]"] * 60) + '],"b":[' + ",".join(["{}"] * 40) + "]}"
    assert code_of(spread, limits) == Code.PAYLOAD_TOO_LARGE  # 2 + 60 + 40 values


def test_size_is_checked_before_parsing() -> None:
    limits = Limits(max_body_bytes=1024)
    assert code_of(b'"' + b"x" * 1020 + b'"', limits) is None
    assert code_of(b'"' + b"x" * 1023 + b'"', limits) == Code.PAYLOAD_TOO_LARGE
    # counted in bytes, not characters
    assert code_of('"' + "é" * 600 + '"', limits) == Code.PAYLOAD_TOO_LARGE


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[1,]", b"\xff\xfe", b"NaN", b'{"a":1}{"b":2}', b"\x00"]
)
def test_what_is_not_json_is_invalid_json(raw: bytes) -> None:
    assert code_of(raw) == Code.INVALID_JSON


def test_errors_never_echo_the_document() -> None:
    secret = "s3cr3t-" + "y" * 200
    for raw in (nested(40, f'"{secret}"'), f'["{secret}", ', f'{{"{secret}": }}'):
        with pytest.raises(FieldError) as info:
            decode_document(raw, LIMITS)
        assert secret[:20] not in str(info.value.to_response())


json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=60,
)


def depth_and_count(value: Any) -> tuple[int, int]:
    """The plain recursive definition the bounded walk must agree with."""
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, list):
        children = value
    else:
        return 0, 0
    measured = [depth_and_count(child) for child in children]
    depth = 1 + max((d for d, _ in measured), default=0)
    return depth, len(children) + sum(c for _, c in measured)


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(1, 6), st.integers(0, 40))
def test_the_bounded_walk_agrees_with_the_definition(
    value: Any, max_depth: int, max_items: int
) -> None:
    limits = Limits(max_json_depth=max_depth, max_json_items=max_items)
    depth, count = depth_and_count(value)
    try:
        check_bounds(value, limits)
    except FieldError as error:
        assert depth > max_depth or count > max_items
        assert error.code in (Code.INVALID_JSON, Code.PAYLOAD_TOO_LARGE)
    else:
        assert depth <= max_depth and count <= max_items


def test_numbers_without_a_fraction_are_integers() -> None:
    """JSON has one kind of number: ``2.0`` is the integer 2, as JSON Schema's ``integer``
    says, so a field the schemas make an integer accepts it."""
    raw = b'{"a": 2.0, "b": [1e3, 2.5, -0.0, {"c": 1e300}], "d": 3, "e": true}'
    document = decode_document(raw, LIMITS)
    assert document == {"a": 2, "b": [1000, 2.5, 0, {"c": 1e300}], "d": 3, "e": True}
    assert [type(v) for v in (document["a"], *document["b"][:3])] == [int, int, float, int]
    assert type(document["b"][3]["c"]) is float  # past 2**53: not an integer a float holds
    assert type(document["e"]) is bool


def test_a_senders_document_keeps_its_numbers_as_sent() -> None:
    document = decode_document(b'{"price": 2.0, "n": [1.0]}', LIMITS, as_sent=True)
    assert type(document["price"]) is float and type(document["n"][0]) is float


async def test_an_integer_written_with_a_fraction_is_accepted(field_server: Any) -> None:
    envelope = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "m-1",
        "operation": "REGISTER",
        "agent_id": "fractional",
        "session_id": None,
        "epoch": 0.0,
        "payload": {"id": "fractional", "role": "tester", "authority": 2.0},
    }
    async with aiohttp.ClientSession() as http:
        answer = await http.post(f"{field_server.url}/v1/register", json=envelope)
        body = await answer.json()
    assert answer.status == 200, body
    assert body["agent"]["authority"] == 2 and type(body["agent"]["authority"]) is int
