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
