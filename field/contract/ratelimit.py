"""Token buckets: how often something may happen, per key, in bounded memory.

A :class:`Rate` is a refill speed and a burst. A bucket holds at most
``burst`` tokens, gains ``per_second`` tokens a second, and each event
takes one (or ``cost``). :meth:`KeyedLimiter.take` answers ``0.0`` when the
event may go ahead (the token is taken) and otherwise the seconds until it
could, without taking anything: that is the ``Retry-After`` of a refusal,
or the wait of a caller that waits instead.

A full bucket says nothing a fresh one would not, so the limiter forgets
the buckets that have refilled; it holds at most ``max_keys`` buckets,
and when that many are in use at once it forgets the least recently
used one first (bounded memory wins over an exact count for one key).
The least recently used buckets are also the likeliest to have refilled, so
making room looks at those first.

Pure: no I/O, and the time comes from the clock the limiter is given.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Most buckets one limiter keeps, unless told otherwise.
MAX_KEYS = 100_000
#: Buckets looked at, least recently used first, when a limiter must make room.
SCAN = 64


@dataclass(frozen=True, slots=True)
class Rate:
    """``per_second`` events a second on average, ``burst`` at once."""

    per_second: float
    burst: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.per_second) and self.per_second > 0):
            raise ValueError(f"a rate must be a positive number, not {self.per_second!r}")
        if not (math.isfinite(self.burst) and self.burst >= 1):
            raise ValueError(f"a burst must be at least 1, not {self.burst!r}")

    def refill_seconds(self) -> float:
        """Seconds an empty bucket takes to be full again."""
        return self.burst / self.per_second


class TokenBucket:
    """One key's tokens at one moment (``stamp``, the clock's reading)."""

    __slots__ = ("tokens", "stamp")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp

    def level(self, rate: Rate, now: float) -> float:
        """The tokens at ``now`` (the bucket is brought up to date)."""
        if now > self.stamp:
            self.tokens = min(rate.burst, self.tokens + (now - self.stamp) * rate.per_second)
            self.stamp = now
        return self.tokens

    def take(self, rate: Rate, now: float, cost: float = 1.0) -> float:
        """Take ``cost`` tokens and answer 0.0, or answer the seconds until they are there."""
        tokens = self.level(rate, now)
        if tokens >= cost:
            self.tokens = tokens - cost
            return 0.0
        return (cost - tokens) / rate.per_second


class KeyedLimiter:
    """A token bucket per key (an agent, a client address), all at one :class:`Rate`."""

    def __init__(
        self,
        rate: Rate,
        *,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.rate = rate
        self.max_keys = max_keys
        self.clock = clock
        #: least recently used first
        self._buckets: dict[str, TokenBucket] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, cost: float = 1.0) -> float:
        """0.0 if ``key`` may go ahead now (its tokens are taken), else the seconds to wait.

        A ``cost`` above the burst could never be paid at once: it is capped
        at the burst, so that such an event waits for a full bucket at most.
        """
        now = self.clock()
        cost = min(cost, self.rate.burst)
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self.rate.burst, now)
            if len(self._buckets) >= self.max_keys:
                self._make_room(now)
        self._buckets[key] = bucket  # now the most recently used
        return bucket.take(self.rate, now, cost)

    def wait(self, key: str, cost: float = 1.0) -> float:
        """Seconds until ``key`` could take ``cost`` tokens, taking nothing."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return 0.0
        tokens = bucket.level(self.rate, self.clock())
        cost = min(cost, self.rate.burst)
        return 0.0 if tokens >= cost else (cost - tokens) / self.rate.per_second

    def charge(self, key: str, cost: float) -> None:
        """Take ``cost`` tokens whatever the bucket holds: for a cost known only once it
        was paid (time measured), which may leave the bucket in debt until it refills."""
        now = self.clock()
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self.rate.burst, now)
            if len(self._buckets) >= self.max_keys:
                self._make_room(now)
        self._buckets[key] = bucket
        bucket.tokens = bucket.level(self.rate, now) - cost

    def forget(self, key: str) -> None:
        """Drop ``key``'s bucket (an agent that is gone)."""
        self._buckets.pop(key, None)

    def _make_room(self, now: float) -> None:
        """Forget the refilled buckets among the :data:`SCAN` least recently used; if
        none of them has refilled, the least recently used one. (A bounded scan: a
        flood of new keys costs each of them the same small work.)"""
        rate = self.rate
        oldest = itertools.islice(self._buckets.items(), SCAN)
        full = [key for key, bucket in oldest if bucket.level(rate, now) >= rate.burst]
        for key in full:
            del self._buckets[key]
        if not full:
            del self._buckets[next(iter(self._buckets))]
