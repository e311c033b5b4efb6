"""The Field's Lamport clock (spec 9, Level 1 requirement 3).

Every successful operation advances the clock: ``epoch := max(local,
received) + 1``. Writes carry their epoch into the log, so replay restores
the clock from them. Reads (ATTUNE, DETECT) advance it too but write
nothing; to keep the promise that the clock never goes backwards across a
crash, the clock works under a *reservation*: it may hand out epochs up to
``reserved`` freely, and before it passes that mark the Field appends a
``clock.reserved`` entry for the next block. Replay sets the clock to the
highest epoch or reservation in the log, which is at least every epoch
ever handed out.

**The clock cannot be run out.** Epochs stop at 2^53 - 1 (exact in every
JSON implementation), and a client's epoch may pull the clock forward
(a *jump*) only within two bounds:

* at most ``max_skew`` past the Field's current epoch in one request, and
* never past ``max_skew + rate * age``, where ``age`` is the seconds since
  the Field was created (:meth:`LamportClock.ceiling`).

So at any time the epoch is at most that ceiling plus one per operation
served; at the default ``rate`` of 2^16 per second and even 100,000
operations a second, reaching 2^53 takes over 1,700 years
(``protocol/README.md``, "Epochs", has the arithmetic).

**A clock that cannot move durably still serves reads.** When the log
cannot be written (disk full) the Field passes ``limit=reserved`` to
:meth:`LamportClock.next`: an operation whose epoch would pass it gets the
current epoch instead (:meth:`LamportClock.frozen`), which a read may
answer with, and which the Field refuses for a write. The same happens at
2^53 - 1.
"""

from __future__ import annotations

import math
import time

from .errors import Code, FieldError, ValidationError
from .model import MAX_EPOCH

#: Epochs reserved by one ``clock.reserved`` entry.
RESERVATION_BLOCK = 1024


class LamportClock:
    """Current epoch plus the durable reservation above it."""

    __slots__ = ("value", "reserved", "max_skew", "rate", "origin")

    def __init__(
        self,
        *,
        value: int = 0,
        reserved: int = 0,
        max_skew: int = 2**20,
        rate: int = 2**16,
        origin: float | None = None,
    ) -> None:
        self.value = value
        self.reserved = max(reserved, value)
        self.max_skew = max_skew
        self.rate = rate
        #: wall time the Field was created (its first entry); None until known
        self.origin = origin

    def next(self, received: int, now: float, *, limit: int = MAX_EPOCH) -> int:
        """The epoch the next operation gets, without advancing the clock.

        Raises ``INVALID_EPOCH`` for a received epoch past either bound on
        jumps. Returns the current epoch unchanged (:meth:`frozen`) when the
        next one would pass ``limit``.
        """
        if received > self.value:
            self._check_jump(received, now)
        epoch = max(self.value, received) + 1
        return self.value if epoch > limit else epoch

    def frozen(self, epoch: int) -> bool:
        """Whether ``epoch`` (from :meth:`next`) left the clock where it was: reads only."""
        return epoch <= self.value

    def ceiling(self, now: float) -> int:
        """The furthest a received epoch may pull the clock at wall time ``now``."""
        age = 0.0 if self.origin is None else max(0.0, now - self.origin)
        return min(MAX_EPOCH, self.max_skew + int(self.rate * age))

    def overflow_error(self) -> FieldError:
        """The error of a write when the clock has no epoch left."""
        return FieldError(
            f"the Field's logical clock has reached its maximum, {MAX_EPOCH}",
            code=Code.EPOCH_OVERFLOW,
            recoverable=False,
            suggested_action="Reads keep working; writes need a new Field. With the bounds on "
            "jumps this takes centuries: report how the clock got here.",
        )

    def _check_jump(self, received: int, now: float) -> None:
        if received > self.value + self.max_skew:
            raise ValidationError(
                f"envelope epoch {received} is more than {self.max_skew} ahead of the "
                f"Field's epoch {self.value}",
                code=Code.INVALID_EPOCH,
                suggested_action="Resynchronise with the epoch of the Field's last response.",
            )
        ceiling = self.ceiling(now)
        if received > ceiling:
            raise ValidationError(
                f"envelope epoch {received} is ahead of the furthest the Field's clock may be "
                f"pulled now ({ceiling}: {self.rate} epochs per second of the Field's age)",
                code=Code.INVALID_EPOCH,
                suggested_action="Resynchronise with the epoch of the Field's last response.",
            )

    def advance(self, epoch: int) -> int | None:
        """Move to ``epoch``; return a new reservation mark if one is needed."""
        self.value = max(self.value, epoch)
        if self.value <= self.reserved:
            return None
        self.reserved = min(self.value + RESERVATION_BLOCK, MAX_EPOCH)
        return self.reserved

    def restore(self, *, epoch: int = 0, reserved: int = 0) -> None:
        """Fold one log entry into the clock during replay."""
        self.value = max(self.value, epoch, reserved)
        self.reserved = self.value


# -- wall-clock timestamps on the wire ------------------------------------------------

#: The last whole second formatted, and its text (timestamps mostly share their second).
_second: tuple[float, str] = (math.nan, "")


def iso_timestamp(ts: float) -> str:
    """``ts`` (seconds since the epoch) as UTC ISO 8601 to the millisecond, ``Z``-suffixed.

    The text of ``datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")``
    with ``Z`` for ``+00:00``: rounded half-even to the microsecond, then cut to the
    millisecond, as ``datetime`` does, without making a ``datetime``.
    """
    global _second
    fraction, whole = math.modf(ts)
    micros = round(fraction * 1e6)
    if micros >= 1_000_000:
        whole, micros = whole + 1.0, micros - 1_000_000
    elif micros < 0:
        whole, micros = whole - 1.0, micros + 1_000_000
    seconds, text = _second
    if whole != seconds:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, text)
    return f"{text}.{micros // 1000:03d}Z"


def epoch_ms(ts: float) -> int:
    """``ts`` (seconds since the epoch) in whole milliseconds: the millisecond
    :func:`iso_timestamp` shows (rounded half-even to the microsecond, then cut)."""
    fraction, whole = math.modf(ts)
    micros = round(fraction * 1e6)
    return int(whole) * 1000 + micros // 1000
