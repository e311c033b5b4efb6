"""Decoding a client's JSON document within bounds, before anything reads it.

Every JSON document the Field accepts from outside (an HTTP body, a
WebSocket message) goes through :func:`decode_document`. It enforces, in
this order:

1. **size**: at most ``max_body_bytes`` bytes, checked before parsing;
2. **syntax**: one JSON value (orjson, which itself refuses nesting past
   1,024 levels without recursing in Python);
3. **depth**: no array or object nested deeper than ``max_json_depth``;
4. **count**: at most ``max_json_items`` values inside arrays and objects
   in all.

The checks of 3 and 4 walk the parsed value with an explicit stack, and
stop as soon as a bound is passed, so their cost is bounded by
``max_json_items`` whatever the document. The same walk makes every number
with no fraction that JSON wrote with one (``2.0``, ``1e3``) the integer it
is: JSON has one kind of number, and the schemas' ``"type": "integer"`` admits
``2.0`` (JSON Schema 2020-12, section 6.1.1), so the Field must too. Nothing downstream (validation,
error messages, logging) ever sees a document that passed no bound: a
value nested a thousand levels deep cannot reach a ``repr`` or a log call.
The errors say which bound was passed, never what the document held.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..contract.errors import InvalidJSON, PayloadTooLarge
from ..contract.model import Limits

#: Integers a float holds exactly: a larger "integral" float is left as it is (a number
#: that far out is out of every integer field's range anyway).
EXACT_INTEGERS = 2**53


def decode_document(
    raw: bytes | str, limits: Limits, *, what: str = "the request body", as_sent: bool = False
) -> Any:
    """``raw`` parsed as JSON, or the error of the first bound it passes; numbers with no
    fraction are integers, unless ``as_sent`` (a sender's own document, kept as it is)."""
    size = len(raw.encode() if isinstance(raw, str) and not raw.isascii() else raw)
    if size > limits.max_body_bytes:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the {limits.max_body_bytes} byte limit"
        )
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"{what} is not valid JSON: {_reason(exc)}") from None
    check_bounds(document, limits, what=what, integers=not as_sent)
    return document


def check_bounds(
    document: Any, limits: Limits, *, what: str = "the document", integers: bool = False
) -> None:
    """Refuse ``document`` if it nests too deep or holds too many values; with
    ``integers``, make each integral float in it an int (in place)."""
    if not isinstance(document, dict | list):
        return  # a bare string or number: validation refuses it
    max_depth, max_items = limits.max_json_depth, limits.max_json_items
    items = 0
    # (container, its depth): the top-level container is at depth 1
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value
        if depth > max_depth:
            raise InvalidJSON(
                f"{what} nests arrays and objects deeper than {max_depth} levels",
                suggested_action=f"Send a document nested at most {max_depth} levels deep.",
            )
        items += len(children)
        if items > max_items:
            raise PayloadTooLarge(
                f"{what} holds more than {max_items} values in its arrays and objects",
                suggested_action=f"Send at most {max_items} values in one document.",
            )
        floats = False
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
            elif type(child) is float:
                floats = True
        if floats and integers:
            _integral_floats_as_ints(value)


def _integral_floats_as_ints(container: dict[str, Any] | list[Any]) -> None:
    """Replace the floats with no fraction among ``container``'s values by ints."""
    pairs = container.items() if isinstance(container, dict) else enumerate(container)
    found = [
        (key, int(child))
        for key, child in pairs
        if type(child) is float and child.is_integer() and abs(child) <= EXACT_INTEGERS
    ]
    for key, number in found:
        container[key] = number  # type: ignore[index]


def _reason(exc: orjson.JSONDecodeError) -> str:
    """orjson's message, which names a position, never the document; bounded anyway."""
    message = str(exc)
    return message if len(message) <= 200 else message[:199] + "…"
