"""A role held by one node of a Field at a time: a lease on a PostgreSQL advisory lock.

Several ``field serve`` processes on one PostgreSQL log are one Field,
and some work must be done by exactly one of them: durable deliveries
(webhooks, RAP callbacks) must have one sender, or a receiver would get
every notification once per node. A :class:`Lease` elects that node. It
holds a *session* advisory lock (``pg_try_advisory_lock``) on a
connection of its own (:class:`~field.store.link.Link`): PostgreSQL
releases it when that session ends, so when the holder dies (its process,
its machine, its network) another node takes the lock.

States, and the one table of moves between them (:data:`TRANSITIONS`)::

    standby --locked--> fencing --fenced--> holding
    fencing --lost----> standby
    holding --lost----> standby
    any     --stop----> stopped

* **standby**: every ``interval`` (default 1 s) the node tries to take
  the lock.
* **fencing**: it has the lock but does not act yet. A former holder that
  lost its session without noticing it (a network cut) may still be
  acting: it stops by itself once its last successful check is ``term``
  old (below), so the new holder waits ``term`` after taking the lock.
* **holding**: the node acts (``gained`` was called). Every quarter
  ``interval`` it checks, on the lease's connection, that its session
  still holds the lock; a check that succeeds vouches for ``term``
  (= ``interval``) from when it began. When a check fails, or none has
  succeeded within ``term``, the lease is **lost** at once: ``lost`` is
  called (the role stops before anything else runs), the connection is
  closed, and the node is on standby again; it waits two intervals before
  it tries again, so that another node, which tries every interval, takes
  the role first.

Every statement of the lease (``pg_try_advisory_lock``, which never
waits, and the check of ``pg_locks``) runs on the link's connection, whose
``lock_timeout`` and ``statement_timeout`` are ``max(2, 2 × interval)``
seconds: a check that cannot answer within ``term`` loses the lease.

So two nodes never act at once, whatever their clocks say (only
durations are compared, each on its own monotonic clock), and a dead
holder's role moves within about ``2 × interval``: the next try of a
standby node, then its fence. :meth:`Lease.valid` lets the role check
the lease before each action: a lease whose term ran out while the event
loop was busy is lost there, before the action.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from typing import Any

from field.store.link import Link
from field.store.postgres import reason

try:
    import psycopg
except ImportError:  # pragma: no cover - the postgres extra is not installed
    psycopg = None  # type: ignore[assignment]

logger = logging.getLogger("field.cluster")

#: Advisory lock key of the durable deliveries' lease (beside the log's keys).
DELIVERY_LEASE = 0x6669656C6411


class Role(enum.Enum):
    STANDBY = "standby"
    FENCING = "fencing"
    HOLDING = "holding"
    STOPPED = "stopped"


#: (state, event) -> the next state; any other move is a bug.
TRANSITIONS: dict[tuple[Role, str], Role] = {
    (Role.STANDBY, "locked"): Role.FENCING,
    (Role.FENCING, "fenced"): Role.HOLDING,
    (Role.FENCING, "lost"): Role.STANDBY,
    (Role.HOLDING, "lost"): Role.STANDBY,
    (Role.STANDBY, "stop"): Role.STOPPED,
    (Role.FENCING, "stop"): Role.STOPPED,
    (Role.HOLDING, "stop"): Role.STOPPED,
}

_TRY = "SELECT pg_try_advisory_lock(%s)"
#: Whether this session holds the lock (a bigint key is classid: high half, objid: low half).
_HELD = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND pid = pg_backend_pid() AND classid = %s::oid AND objid = %s::oid AND objsubid = 1)"
)


class Lease:
    """One role of one node at a time (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        key: int,
        name: str,
        gained: Callable[[], None],
        lost: Callable[[], None],
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        self.key = key
        self.name = name
        self.interval = interval
        #: how long one successful check vouches for the lock, and the fence of a new holder
        self.term = interval
        self._gained = gained
        self._lost = lost
        self._clock = clock
        self.state = Role.STANDBY
        self._valid_until = 0.0
        self._fenced_at = 0.0
        #: the lease was lost while its connection may live on: close it before going on
        self._release = False
        self._link = Link(url, name=f"field-lease-{name}", timeout=max(2.0, 2 * interval))
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        #: times this node tried to take the lock
        self.tries = 0

    @property
    def holding(self) -> bool:
        return self.state is Role.HOLDING

    def valid(self) -> bool:
        """Whether the role may act now: held, and checked within ``term``. A term that
        ran out loses the lease here and now (``lost`` runs before this returns)."""
        if self.state is Role.HOLDING and self._clock() >= self._valid_until:
            self._lose("no check succeeded within the lease's term")
        return self.state is Role.HOLDING

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"lease-{self.name}")

    async def stop(self) -> None:
        """Stop acting (``lost`` if held), then let go of the lock (close its connection)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.state is not Role.STOPPED:
            held = self.state is Role.HOLDING
            self._move("stop")
            if held:
                _tell(self._lost, "lost")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._link.timeout):
                await self._link.close()

    def _move(self, event: str) -> None:
        after = TRANSITIONS.get((self.state, event))
        if after is None:
            raise RuntimeError(f"lease {self.name}: no move {event!r} from {self.state.value}")
        self.state = after

    def _lose(self, why: str) -> None:
        held = self.state is Role.HOLDING
        self._move("lost")
        self._release = True
        if held:
            logger.warning("this node no longer holds the %s lease: %s", self.name, why)
            _tell(self._lost, "lost")

    # -- the loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if self._release:
                self._release = False
                with contextlib.suppress(psycopg.Error):
                    await self._link.reset()
                # a standby node tries every interval: it takes the role before this one
                await asyncio.sleep(2 * self.interval)
            if self.state is Role.STANDBY:
                if not await self._try():
                    await asyncio.sleep(self.interval)
                continue
            await asyncio.sleep(self.interval / 4)
            began = self._clock()
            held = await self._check()
            if self.state not in (Role.FENCING, Role.HOLDING):
                continue  # lost meanwhile (valid() found the term over)
            if not held:
                self._lose("its connection to the database failed")
                continue
            self._valid_until = began + self.term
            if self.state is Role.FENCING and self._clock() >= self._fenced_at:
                self._move("fenced")
                logger.info("this node holds the %s lease", self.name)
                _tell(self._gained, "gained")

    async def _try(self) -> bool:
        """Take the lock if free: then fence."""
        began = self._clock()
        self.tries += 1
        try:
            taken = await self._link.run(self._take)
        except psycopg.Error as exc:
            self._warn(exc)
            return False
        self._failing = False
        if not taken or self.state is not Role.STANDBY:
            return False
        self._move("locked")
        self._valid_until = began + self.term
        self._fenced_at = self._clock() + self.term
        return True

    async def _check(self) -> bool:
        """Whether the session still holds the lock, known before the term runs out."""
        left = self._valid_until - self._clock()
        if left <= 0:
            return False
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancellation that
            # comes as the call completes, and stop() would wait for this loop forever
            async with asyncio.timeout(left):
                return await self._link.run(self._holds)
        except TimeoutError:
            return False
        except psycopg.Error as exc:
            self._warn(exc)
            return False

    def _warn(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "the %s lease cannot reach %s (%s); trying again every %g s",
                self.name,
                self._link.where,
                reason(exc),
                self.interval,
            )

    # -- in the link's thread ----------------------------------------------------------

    def _take(self, conn: Any) -> bool:
        if self._holds(conn):  # already ours (a lease lost, then taken again on one session)
            return True
        return bool(conn.execute(_TRY, (self.key,)).fetchone()[0])

    def _holds(self, conn: Any) -> bool:
        high, low = (self.key >> 32) & 0xFFFFFFFF, self.key & 0xFFFFFFFF
        return bool(conn.execute(_HELD, (high, low)).fetchone()[0])


def _tell(callback: Callable[[], None], what: str) -> None:
    """Run a role's callback; a failing one is logged and never ends the lease's loop."""
    try:
        callback()
    except Exception:
        logger.exception("the lease's %s callback failed", what)
