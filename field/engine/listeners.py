"""Who hears of newly durable entries, and in which order.

The writer publishes every batch of entries it made durable (or read from another node)
to its listeners, in log order. The order among listeners matters, so it is declared,
not implied by who registered first: a listener names its :class:`Stage`, and listeners
are called stage by stage, in the order they were added within a stage.

A listener takes the entries and returns None, or its work as steps (an iterator), which
the writer runs a slice at a time so that the event loop runs between slices. A listener
may be added or removed while a batch is being published: the batch goes on to the
listeners there were when it began.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator

from ..contract.model import StoredEntry

#: What hears of a batch of newly durable entries (see the module's docstring).
Listener = Callable[[list[StoredEntry]], Iterator[None] | None]


class Stage(enum.IntEnum):
    """When a listener hears of a batch, relative to the others."""

    #: durable deliveries note what the batch owes them, before the hub routes it: a
    #: delivery created in a batch can then wait, dormant, for its own entries
    DELIVERIES = 0
    #: the push hub matches the batch against every subscription and fills the outboxes
    ROUTING = 1
    #: what only follows the Field (rate limits forgetting agents, the console, MCP
    #: sessions' resource updates): after the fan-out, which no follower delays
    FOLLOWERS = 2


class Listeners:
    """The writer's listeners, in :class:`Stage` order, then in the order added."""

    def __init__(self) -> None:
        self._entries: list[tuple[Stage, int, Listener]] = []
        self._added = 0
        #: the listeners in the order they are called, rebuilt on every change (a batch
        #: being published keeps the tuple it began with)
        self.ordered: tuple[Listener, ...] = ()

    def add(self, listener: Listener, stage: Stage = Stage.FOLLOWERS) -> None:
        """Call ``listener`` with every batch from the next one on, at ``stage``."""
        self._added += 1
        self._entries.append((stage, self._added, listener))
        self._order()

    def remove(self, listener: Listener) -> None:
        """Stop calling ``listener`` (nothing happens if it was not added)."""
        self._entries = [entry for entry in self._entries if entry[2] != listener]
        self._order()

    def wrap(self, listener: Listener, wrapper: Callable[[Listener], Listener]) -> None:
        """Call ``wrapper(listener)`` instead of ``listener``, in its place (metrics time
        the push hub's routing this way)."""
        self._entries = [
            (stage, added, wrapper(each) if each == listener else each)
            for stage, added, each in self._entries
        ]
        self._order()

    def __contains__(self, listener: object) -> bool:
        return listener in self.ordered

    def __len__(self) -> int:
        return len(self.ordered)

    def _order(self) -> None:
        self.ordered = tuple(each for _, _, each in sorted(self._entries, key=_position))


def _position(entry: tuple[Stage, int, Listener]) -> tuple[int, int]:
    return entry[0], entry[1]
