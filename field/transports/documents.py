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
``max_json_items`` whatever the document. Nothing downstream (validation,
error messages, logging) ever sees a document that passed no bound: a
value nested a thousand levels deep cannot reach a ``repr`` or a log call.
The errors say which bound was passed, never what the document held.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import InvalidJSON, PayloadTooLarge
from ..model import Limits


def decode_document(raw: bytes | str, limits: Limits, *, what: str = "the request body") -> Any:
    """``raw`` parsed as JSON, or the error of the first bound it passes."""
    size = len(raw.encode() if isinstance(raw, str) and not raw.isascii() else raw)
    if size > limits.max_body_bytes:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the {limits.max_body_bytes} byte limit"
        )
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"{what} is not valid JSON: {_reason(exc)}") from None
    check_bounds(document, limits, what=what)
    return document


def check_bounds(document: Any, limits: Limits, *, what: str = "the document") -> None:
    """Refuse ``document`` if it nests too deep or holds too many values."""
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
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))


def _reason(exc: orjson.JSONDecodeError) -> str:
    """orjson's message, which names a position, never the document; bounded anyway."""
    message = str(exc)
    return message if len(message) <= 200 else message[:199] + "…"
