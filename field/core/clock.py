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
"""

from __future__ import annotations

import math
import time

from ..errors import Code, FieldError, ValidationError
from ..model import MAX_EPOCH

#: Epochs reserved by one ``clock.reserved`` entry.
RESERVATION_BLOCK = 1024


class LamportClock:
    """Current epoch plus the durable reservation above it."""

    __slots__ = ("value", "reserved", "max_skew")

    def __init__(self, *, value: int = 0, reserved: int = 0, max_skew: int = 2**32) -> None:
        self.value = value
        self.reserved = max(reserved, value)
        self.max_skew = max_skew

    def next(self, received: int) -> int:
        """The epoch the next operation gets, without advancing the clock.

        Raises ``INVALID_EPOCH`` for a received epoch implausibly far ahead
        (one agent must not be able to exhaust the clock for everyone) and
        ``EPOCH_OVERFLOW`` when the clock has run out of exact integers.
        """
        if received > self.value + self.max_skew:
            raise ValidationError(
                f"envelope epoch {received} is more than {self.max_skew} ahead of the "
                f"Field's epoch {self.value}",
                code=Code.INVALID_EPOCH,
                suggested_action="Resynchronise with the epoch of the Field's last response.",
            )
        epoch = max(self.value, received) + 1
        if epoch > MAX_EPOCH:
            raise FieldError(
                "the Field's logical clock has reached its maximum",
                code=Code.EPOCH_OVERFLOW,
                recoverable=False,
                suggested_action="Restart the Field from a checkpoint into a new log.",
            )
        return epoch

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
