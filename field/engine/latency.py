"""How long notifications take: from their log entry's commit to the receiver.

A :class:`Latency` is a histogram kept as plain numbers (a count per bucket and a
sum), one per connection kind, in :class:`~field.engine.router.PushCounts`: the
senders observe each notification as it leaves (a WebSocket or SSE batch written to
its socket, a webhook or RAP POST answered 2xx) and ``GET /metrics`` turns the
numbers into ``field_notification_latency_seconds`` at scrape time. An observation
is a bisection over :data:`LATENCY_BUCKETS` and two additions.

The start is the entry's ``ts``, the wall-clock time its operation ran, just before
the group commit that made it durable. So a notification's latency holds the commit,
the matching, its stream's debounce window, its outbox's queue, its agent's rate
and, for a durable delivery, every retry until the receiver answered. A notification
replayed from the log (a stream resumed from a cursor, a delivery catching up)
counts the time since its commit too. On a cluster the entry may come from another
node, whose clock is then part of the figure; a negative difference counts as 0.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable
from typing import Protocol

#: Upper bounds (seconds) of the buckets: a millisecond to half a minute, and beyond.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class Timed(Protocol):
    """What a frame tells of its commit: the log time of its notification's entry (None:
    a control frame)."""

    @property
    def ts(self) -> float | None: ...


class Latency:
    """A histogram over :data:`LATENCY_BUCKETS`: observations by bucket, their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        #: observations by bucket (not cumulative); the last is past every bound
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        #: seconds observed in all
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        """One notification took ``seconds`` (a negative figure counts as 0)."""
        if seconds < 0.0:
            seconds = 0.0
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds

    def sent(self, frames: Iterable[Timed]) -> None:
        """``frames`` left now: each notification among them is observed."""
        now = time.time()
        counts = self.counts
        seconds = 0.0
        for frame in frames:
            ts = frame.ts
            if ts is not None:  # observe(), inlined: it runs once per notification
                took = now - ts if ts < now else 0.0
                counts[bisect_left(LATENCY_BUCKETS, took)] += 1
                seconds += took
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        """Observations at or under each bound, the last being all of them."""
        total, cumulative = 0, []
        for count in self.counts:
            total += count
            cumulative.append(total)
        return cumulative
