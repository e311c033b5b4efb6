"""Pages: what keeps every read that can grow bounded in items, bytes and work.

A *list read* (``GET /v1/agents``, ``GET /v1/conflicts``, DETECT ``list``,
SESSION and COORDINATE ``list``) returns one page of a list in a fixed
order: the items after the cursor ``after`` while the page holds at most
``limit`` items (at most ``max_page_items``) and its JSON body at most
``max_response_bytes``. ``next`` is the key of the last item the page
covered, to send as ``after`` for the following page, or ``None`` when
the list is complete. A page looks at no more than :data:`SCAN_PAGES`
times ``max_page_items`` candidates (filters may match few of many), so a
page may hold fewer items than ``limit``, or none, and still have a
``next``: a reader follows ``next`` until it is ``None``. An item that
alone is larger than the byte bound is returned on a page of its own, so
a list can always be read to its end.

Sizes are those of the JSON the client receives: each item is encoded
once (:func:`encoded_size`), and the body around the items is measured
with :data:`ROOM_SLACK` bytes held back for the fields filled in after
the items are chosen (counts, ``next``, flags).

:class:`Order` gives a list that only grows (conflicts, tasks) the
place of each key, so a page starts after ``after`` without a scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..contract.errors import InvalidPayload
from ..contract.model import Limits

#: A page looks at up to this many times ``max_page_items`` candidates.
SCAN_PAGES = 10
#: Bytes held back for the fields set after the items are chosen: counts, flags and
#: ``next`` (a key of at most 256 characters).
ROOM_SLACK = 512
#: Items a GET endpoint returns when the request names no ``limit``.
DEFAULT_GET_LIMIT = 100


def encoded_size(value: Any) -> int:
    """Bytes of ``value`` as the JSON a client receives (orjson, compact)."""
    return len(orjson.dumps(value))


def room(body: Mapping[str, Any], limits: Limits) -> int:
    """Bytes the items of ``body`` (a response whose lists are still empty) may take."""
    return limits.max_response_bytes - encoded_size(body) - ROOM_SLACK


@dataclass(frozen=True, slots=True)
class PageRequest:
    """Where a page starts and how many items it may hold."""

    after: str | None
    limit: int


def page_request(
    source: Mapping[str, Any], limits: Limits, *, default: int | None = None
) -> PageRequest:
    """``after`` and ``limit`` of a request (a payload, or a GET's parameters as ints).

    ``after`` is a key string (at most ``max_id_chars``) or None; ``limit``
    an integer from 1 to ``max_page_items``, ``default`` (else
    ``max_page_items``) when absent or None. Anything else is
    INVALID_PAYLOAD.
    """
    after = source.get("after")
    if after is not None and (
        not isinstance(after, str) or not 1 <= len(after) <= limits.max_id_chars
    ):
        raise InvalidPayload(
            f"after must be a string of 1 to {limits.max_id_chars} characters: the next of "
            "the previous page"
        )
    limit = source.get("limit")
    if limit is None:
        limit = default if default is not None else limits.max_page_items
    elif (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= limits.max_page_items
    ):
        raise InvalidPayload(f"limit must be an integer from 1 to {limits.max_page_items}")
    return PageRequest(after, limit)


def unknown_after(what: str) -> InvalidPayload:
    """The error for an ``after`` that names no item of the list."""
    return InvalidPayload(
        f"after does not name a {what} you may see: send the next of the previous page",
        suggested_action="Start again without after, then send each page's next as after.",
    )


@dataclass(slots=True)
class Page:
    """One page: its items and the key to continue after (None: the list is complete)."""

    items: list[dict[str, Any]]
    next: str | None


def collect(
    candidates: Iterable[tuple[str, dict[str, Any] | None]],
    *,
    limit: int,
    room: int,
    scan: int,
) -> Page:
    """The page of ``candidates``: ``(key, item)`` in list order, ``item`` None for a
    candidate the request's filters leave out.

    Takes items while there are at most ``limit`` of them and their JSON
    (with the commas between them) fits in ``room`` bytes, always at least
    one; looks at no more than ``scan`` candidates. ``next`` is the key of
    the last candidate looked at when another may follow.
    """
    items: list[dict[str, Any]] = []
    used = 0
    last: str | None = None
    iterator = iter(candidates)
    for looked, (key, item) in enumerate(iterator, start=1):
        if item is not None:
            size = encoded_size(item) + (1 if items else 0)
            if len(items) == limit or (items and used + size > room):
                return Page(items, last)  # this one starts the next page
            items.append(item)
            used += size
        last = key
        if looked >= scan:
            more = next(iterator, None) is not None
            return Page(items, key if more else None)
    return Page(items, None)


def scan_bound(limits: Limits) -> int:
    """Candidates one page may look at."""
    return SCAN_PAGES * limits.max_page_items


@dataclass(slots=True)
class Order:
    """The keys of a mapping that only grows, in the order they were added, each with its place.

    The projection calls :meth:`add` as items are created; entries never
    remove them (a resolved conflict or finished task stays), so a place
    never changes and a page can resume after any key.
    """

    keys: list[str] = field(default_factory=list)
    places: dict[str, int] = field(default_factory=dict)

    def add(self, key: str) -> None:
        if key not in self.places:
            self.places[key] = len(self.keys)
            self.keys.append(key)

    def start(self, after: str | None) -> int | None:
        """The place a page after ``after`` starts at; None if ``after`` is unknown."""
        if after is None:
            return 0
        place = self.places.get(after)
        return None if place is None else place + 1

    def from_place(self, start: int) -> Iterator[str]:
        """The keys from place ``start`` on."""
        keys = self.keys
        return (keys[i] for i in range(start, len(keys)))
