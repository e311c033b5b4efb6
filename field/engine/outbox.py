"""A connection's bounded outbox of encoded frames.

Producers (the push hub) never wait: :meth:`Outbox.put` either queues a
frame or, when the bound on frames or bytes would be passed, refuses it
and marks the outbox *overflowed*. From then on nothing more is queued
except one final control frame (:meth:`Outbox.close_with`), so memory
stays bounded whatever the consumer does. The consumer (the connection's
sender task) awaits :meth:`Outbox.get`.

A batch's fan-out puts frames in thousands of outboxes at once. Woken all
together, their consumers would run in one turn of the event loop, and no
request would be read until the last had written. While the push hub
routes a batch it *corks* the outboxes' :class:`Waker`: their consumers are
woken afterwards, :attr:`Waker.per_turn` a turn, so that the loop reads its
sockets between them. Each consumer still finds every frame the batch gave
it, and writes them in one go.

A consumer that can write without waiting (a WebSocket whose socket takes
bytes, its agent's notification tokens there) gives its outbox
:attr:`Outbox.take_now`: where the consumer would be woken, that writes what
is queued instead (as the waker wakes the outbox, or in a callback of the
loop's next turn for a frame put uncorked, so that what a turn queues goes
out together), and the consumer's task stays asleep. Whatever it cannot do
now (a full socket, a notification rate to wait for, a closed outbox) wakes
the task as before.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from .router import Frame


class Waker:
    """Wakes outboxes' consumers a few per turn of the event loop (module docstring).

    Uncorked, an outbox's consumer is woken at once, as if there were no
    waker. Corked (:meth:`cork`, which nests), each outbox that receives a
    frame is noted once, in order, and :meth:`uncork` wakes the first
    :attr:`per_turn` of them, then the next ones a turn of the loop later,
    until none is left. The outboxes noted before a cork are woken on
    through it (the last batch's consumers do not wait for the next batch to
    be routed); those noted during it wait for its uncork.
    """

    __slots__ = ("per_turn", "_corked", "_due", "_before", "_scheduled")

    def __init__(self, per_turn: int = 64) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        #: consumers woken in one turn of the loop
        self.per_turn = per_turn
        self._corked = 0
        #: outboxes whose consumer is still to be woken, in the order they got a frame
        self._due: deque[Outbox] = deque()
        #: while corked: how many of the first outboxes due were noted before the cork
        self._before = 0
        self._scheduled = False

    @property
    def corked(self) -> bool:
        return self._corked > 0

    @property
    def due(self) -> int:
        """Outboxes whose consumer is still to be woken."""
        return len(self._due)

    def cork(self) -> None:
        if not self._corked:
            self._before = len(self._due)
        self._corked += 1

    def uncork(self) -> None:
        if self._corked == 0:
            raise RuntimeError("uncork without cork")
        self._corked -= 1
        if not self._corked and not self._scheduled:
            self._wake_some()

    def defer(self, outbox: Outbox) -> bool:
        """Whether ``outbox``'s consumer is to be woken later (noted) instead of now."""
        if not self._corked:
            return False
        if not outbox.due:
            outbox.due = True
            self._due.append(outbox)
        return True

    def _wake_some(self) -> None:
        self._scheduled = False
        due = self._due
        wake = min(self.per_turn, len(due))
        if self._corked:  # only what was due before the cork
            wake = min(wake, self._before)
            self._before -= wake
        for _ in range(wake):
            outbox = due.popleft()
            outbox.due = False
            outbox._wake_reader()
        if self._before if self._corked else due:
            asyncio.get_running_loop().call_soon(self._wake_some)
            self._scheduled = True


class Outbox:
    """Bounded FIFO of frames with an overflow state (module docstring).

    An idle outbox holds no queue and no waiters' events: there are
    thousands of them, so the deque exists only while frames wait and a
    waiter's future only while someone waits.
    """

    __slots__ = (
        "max_frames",
        "max_bytes",
        "_frames",
        "_bytes",
        "_reader",
        "_pacers",
        "overflowed",
        "closed",
        "notify",
        "waker",
        "due",
        "take_now",
        "_taking",
    )

    def __init__(self, *, max_frames: int, max_bytes: int, waker: Waker | None = None) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._frames: deque[Frame] | None = None
        self._bytes = 0
        #: the consumer waiting in get(), if any
        self._reader: asyncio.Future[None] | None = None
        #: producers waiting in wait_for_room(), if any (a list only while one waits)
        self._pacers: list[asyncio.Future[None]] | None = None
        self.overflowed = False
        self.closed = False
        #: called when a frame arrives or the outbox closes: a consumer that holds no
        #: task while idle (a durable sink) is woken by it instead of awaiting get()
        self.notify: Callable[[], None] | None = None
        #: wakes the consumer a few outboxes at a time during a fan-out, if set
        self.waker = waker
        #: the consumer is to be woken by the waker (it holds this outbox)
        self.due = False
        #: what the consumer waiting in get() does instead of waking, if it can: write
        #: what is queued at once; True if it took every frame (module docstring)
        self.take_now: Callable[[], bool] | None = None
        self._taking = False  # take_now is to run in the loop's next turn

    def __len__(self) -> int:
        return len(self._frames) if self._frames is not None else 0

    def put(self, frame: Frame) -> bool:
        """Queue ``frame``; False (and overflowed) if that would pass a bound."""
        if self.overflowed or self.closed:
            return False
        if len(self) >= self.max_frames or self._bytes + len(frame.body) > self.max_bytes:
            self.overflowed = True
            return False
        self._push(frame)
        return True

    def close_with(self, frame: Frame | None) -> None:
        """Queue a last control frame (past the bounds) and accept nothing more."""
        if self.closed:
            return
        if frame is not None:
            self._push(frame)
        self.closed = True
        self._wake_reader()
        self._wake_pacers()

    def _push(self, frame: Frame) -> None:
        if self._frames is None:
            self._frames = deque()
        self._frames.append(frame)
        self._bytes += len(frame.body)
        if self.waker is None or not self.waker.defer(self):
            self._wake_reader(soon=True)

    def _wake_reader(self, soon: bool = False) -> None:
        """Wake the consumer waiting in get(), or have :attr:`take_now` write for it: now,
        or with ``soon`` in a callback of the loop's next turn, so that the frames
        queued until then go out together (as the woken consumer would take them)."""
        reader = self._reader
        if reader is not None and not reader.done():
            take_now = self.take_now
            if take_now is None or self.closed:
                reader.set_result(None)
            elif soon:
                if not self._taking:
                    self._taking = True
                    asyncio.get_running_loop().call_soon(self._take)
            elif not take_now():
                reader.set_result(None)
        if self.notify is not None:
            self.notify()

    def _take(self) -> None:
        self._taking = False
        self._wake_reader()  # unless the consumer is awake already: it takes them itself

    def _wake_pacers(self) -> None:
        pacers, self._pacers = self._pacers, None
        for pacer in pacers or ():
            if not pacer.done():
                pacer.set_result(None)

    def _has_room(self) -> bool:
        """Under half of both bounds: a paced producer may add more."""
        return len(self) * 2 < self.max_frames and self._bytes * 2 < self.max_bytes

    def room(self) -> int:
        """How many more frames fit under the frame bound."""
        return max(0, self.max_frames - len(self))

    async def wait_for_room(self) -> None:
        """Wait until the outbox is under half full (replay paces itself with this)."""
        while not self._has_room() and not self.closed:
            pacer = asyncio.get_running_loop().create_future()
            if self._pacers is None:
                self._pacers = []
            self._pacers.append(pacer)
            try:
                await pacer
            finally:
                if self._pacers is not None and pacer in self._pacers:
                    self._pacers.remove(pacer)

    def _popped(self, frame: Frame) -> None:
        self._bytes -= len(frame.body)
        if self._pacers and self._has_room():
            self._wake_pacers()

    async def get(self) -> Frame | None:
        """The next frame; None once the outbox is closed and drained."""
        while not self._frames:
            self._frames = None  # idle: hold no queue
            if self.closed:
                return None
            self._reader = asyncio.get_running_loop().create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        frame = self._frames.popleft()
        self._popped(frame)
        return frame

    def drain_now(self, limit: int) -> list[Frame]:
        """Up to ``limit`` queued frames without waiting (to batch socket writes)."""
        out: list[Frame] = []
        frames = self._frames
        while frames and len(out) < limit:
            frame = frames.popleft()
            self._popped(frame)
            out.append(frame)
        if frames is not None and not frames:
            self._frames = None  # idle: hold no queue
        return out

    def unget(self, frames: list[Frame]) -> None:
        """Put back, in front and in order, frames :meth:`drain_now` took and no one sent."""
        if not frames:
            return
        if self._frames is None:
            self._frames = deque()
        self._frames.extendleft(reversed(frames))
        self._bytes += sum(len(frame.body) for frame in frames)

    def tally(self, most: int) -> dict[str, int] | None:
        """The queued notifications (frames with a cursor) by subscription, or None when
        more than ``most`` frames are queued: counting is bounded, like everything else."""
        if len(self) > most:
            return None
        counts: dict[str, int] = {}
        for frame in self._frames or ():
            if frame.cursor is not None and frame.subscription_id is not None:
                counts[frame.subscription_id] = counts.get(frame.subscription_id, 0) + 1
        return counts
