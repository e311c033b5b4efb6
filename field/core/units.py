"""The Field's memory units, each held as its JSON encoding: about a third of a dict's size.

A unit dict of dicts costs about 1.7 KB in memory (a few hundred bytes of text in
nested dicts, each with its own table and its own string objects); its compact
JSON is a few hundred bytes. A Field of a million units keeps every unit whole
(reads answer with it), and reads only a few at a time: a page of ATTUNE, the
units of an event, the target of a conflict. So :class:`Units` holds each unit as
its orjson encoding and decodes it where it is read.

It is a mapping from unit id to unit dict, as a dict of dicts was, with one
difference: every read decodes a **new** dict. Changing it changes nothing held;
the projection changes a unit through :meth:`Units.set_status` (a unit's status
is the only field that changes once it is recorded). What is scored and matched
in bulk (epochs, statuses, keywords, embeddings) lives in the unit index
(:class:`~field.ranking.relevance.UnitIndex`), not here.

:meth:`Units.encoded` gives a unit's bytes without decoding them: for a scan that
can pass most units over by a byte search (see ``conflicts._supporters``), and for
holding what a unit was at a moment (bytes never change).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import orjson


def _encode(unit: dict[str, Any]) -> bytes:
    # orjson's bytes keep the buffer they were written in (about 4 KB, whatever their
    # length): a copy holds only the encoding (measured: 4.1 KB against 0.48 KB a unit)
    return memoryview(orjson.dumps(unit)).tobytes()


class Units(MutableMapping[str, dict[str, Any]]):
    """Memory units by id, each held encoded; every read decodes a new dict."""

    __slots__ = ("_encoded",)

    def __init__(self) -> None:
        self._encoded: dict[str, bytes] = {}

    def __getitem__(self, unit_id: str) -> dict[str, Any]:
        unit: dict[str, Any] = orjson.loads(self._encoded[unit_id])
        return unit

    def __setitem__(self, unit_id: str, unit: dict[str, Any]) -> None:
        self._encoded[unit_id] = _encode(unit)

    def __delitem__(self, unit_id: str) -> None:
        del self._encoded[unit_id]

    def __contains__(self, unit_id: object) -> bool:
        return unit_id in self._encoded

    def __iter__(self) -> Iterator[str]:
        return iter(self._encoded)

    def __reversed__(self) -> Iterator[str]:
        return reversed(self._encoded)

    def __len__(self) -> int:
        return len(self._encoded)

    def __repr__(self) -> str:
        return f"<Units: {len(self)}>"

    def __getstate__(self) -> dict[str, bytes]:
        return self._encoded

    def __setstate__(self, state: dict[str, bytes]) -> None:
        self._encoded = state

    def add(self, unit: dict[str, Any]) -> None:
        """Hold ``unit`` under its id."""
        self._encoded[unit["id"]] = _encode(unit)

    def encoded(self, unit_id: str) -> bytes:
        """The unit's JSON encoding (KeyError if it is not held)."""
        return self._encoded[unit_id]

    def encodings(self) -> Iterator[bytes]:
        """Every unit's JSON encoding, in the order they were added."""
        return iter(self._encoded.values())

    def set_status(self, unit_id: str, status: str) -> str:
        """Set the unit's status; returns the one it had."""
        unit = self[unit_id]
        before: str = unit["status"]
        unit["status"] = status
        self._encoded[unit_id] = _encode(unit)
        return before
