"""A role held by one node of a Field at a time: a lease with a term, timed by the database.

Several ``field serve`` processes on one PostgreSQL log are one Field,
and some work must be done by exactly one of them: durable deliveries
(webhooks, RAP callbacks) must have one sender, or a receiver would get
every notification once per node. A :class:`Lease` elects that node. The
lease is a row of ``field_leases`` (created if absent, beside the log's
tables): its ``name``, its ``term``, its ``holder`` and when it
``expires_at``, on the database's clock. Every grant of the lease has a
new ``term``, higher than every earlier one: the role's fencing token.

States, and the one table of moves between them (:data:`TRANSITIONS`)::

    standby --taken--> holding --lost--> standby
    any     --stop---> stopped

* **standby**: every quarter ``interval`` (default 1 s) the node tries to
  take the lease: one ``UPDATE`` that succeeds only when the row has
  expired, giving it the next term and ``duration`` (two intervals) from
  the database's now. The node then holds it at once (``gained`` is told
  the term): whoever held it before has stopped acting already (below).
* **holding**: every quarter ``interval`` the holder renews the lease for
  ``duration`` from the database's now, by an ``UPDATE`` that succeeds only
  while the row is still its term and not expired. The lease is **lost**
  at once when a renewal fails (the row expired, or was taken, or the
  database did not answer in time), when no renewal succeeded within
  ``duration``, or when the role learns of a newer term than its own
  (``newest``: the deliveries' newest term in the log); ``lost`` is called
  (the role stops before anything else runs), the row is let go if it is
  still this term's, and the node is on standby again, waiting one
  interval before it tries again so that another node takes the role first.
* **stopped**: :meth:`Lease.stop` ends the role (``lost``) and lets go of
  the row (its ``expires_at`` set to now): another node takes the lease at
  its next try, within a quarter interval.

**Why two holders never act at once.** Only durations are compared, each
on one clock. The holder's own validity is ``duration`` from just
*before* it sent the statement that took or renewed the lease
(its monotonic clock), so it ends before the ``expires_at`` that statement
set (the database's clock, read later); another node can take the lease
only after ``expires_at``. :meth:`Lease.valid`, which the role asks before
each action, finds a validity run out and loses the lease there and then:
a process resumed from a pause (SIGSTOP, a frozen VM, a long collection)
acts on nothing before it has found its lease lost. A change of the
database's clock (a step of its time) shortens or lengthens the lease
already granted; for the deliveries the term closes that gap too: every
entry the sender writes carries its term, and the log refuses one whose
term is below the newest it holds (:mod:`field.core.state`), so a sender
that outlived its term can send a notification again but never move a
delivery's cursor or state.

**How fast the role moves.** When the holder dies or hangs, its row
expires ``duration`` after its last renewal, which came at most a quarter
interval before, and a standby node takes it at its next try, at most a
quarter interval later: the role moves within 2½ intervals (2.5 s at the
default; the deliveries resumed 1.9 to 2.3 s after a SIGKILL or a SIGSTOP
of their sender, ``benchmarks/cluster.py``). When the holder stops
cleanly, within a quarter interval.

**Bounded waits.** Every statement runs on a
:class:`~field.store.link.Link` of its own, whose ``lock_timeout`` and
``statement_timeout`` are ``max(2, 2 × interval)`` seconds, and a renewal
is waited for only while the holder's validity lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
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

#: The name of the durable deliveries' lease (its row of ``field_leases``).
DELIVERY_LEASE = "deliveries"
#: Advisory lock key under which the table is created (one creator at a time).
_SCHEMA_LOCK = 0x6669656C6412


class Role(enum.Enum):
    STANDBY = "standby"
    HOLDING = "holding"
    STOPPED = "stopped"


#: (state, event) -> the next state; any other move is a bug.
TRANSITIONS: dict[tuple[Role, str], Role] = {
    (Role.STANDBY, "taken"): Role.HOLDING,
    (Role.HOLDING, "lost"): Role.STANDBY,
    (Role.STANDBY, "stop"): Role.STOPPED,
    (Role.HOLDING, "stop"): Role.STOPPED,
}

_TABLE = """CREATE TABLE IF NOT EXISTS field_leases (
    name       TEXT PRIMARY KEY,
    term       BIGINT NOT NULL,
    holder     TEXT,
    expires_at TIMESTAMPTZ
)"""
_ROW = "INSERT INTO field_leases (name, term) VALUES (%s, 0) ON CONFLICT (name) DO NOTHING"
_UNTIL = "clock_timestamp() + make_interval(secs => %(duration)s)"
#: Take the lease if it expired: the next term (above every term the role knows of).
_TAKE = f"""
UPDATE field_leases SET term = GREATEST(term + 1, %(floor)s), holder = %(holder)s,
    expires_at = {_UNTIL}
WHERE name = %(name)s AND (expires_at IS NULL OR expires_at <= clock_timestamp())
RETURNING term
"""
#: Hold it ``duration`` longer, while it is still this term's and not expired.
_RENEW = f"""
UPDATE field_leases SET expires_at = {_UNTIL}
WHERE name = %(name)s AND term = %(term)s AND holder = %(holder)s
    AND expires_at > clock_timestamp()
RETURNING term
"""
#: Let go of this term's lease now: the next node to try takes it.
_RELEASE = """
UPDATE field_leases SET expires_at = clock_timestamp()
WHERE name = %(name)s AND term = %(term)s AND holder = %(holder)s
    AND expires_at > clock_timestamp()
"""


class Lease:
    """One role of one node at a time (see the module docstring).

    ``holder`` names this node in the row. ``gained`` is told the term when the
    node takes the lease; ``lost`` is called when it stops holding it. ``newest``
    gives the newest term the role knows was held (the log's, for the deliveries):
    a take numbers its term above it, and a holder whose term is below it has lost.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str,
        holder: str,
        gained: Callable[[int], None],
        lost: Callable[[], None],
        interval: float = 1.0,
        newest: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        self.name = name
        self.holder = holder
        self.interval = interval
        #: seconds one take or renewal holds the lease, from the database's now
        self.duration = 2 * interval
        #: seconds between two tries (standby) or two renewals (holding)
        self.period = interval / 4
        self._gained = gained
        self._lost = lost
        self._newest = newest
        self._clock = clock
        self.state = Role.STANDBY
        #: the term of the last take (0: none yet)
        self.term = 0
        self._valid_until = 0.0
        #: the lease was lost while the row may still be this term's: let go of it first
        self._release = False
        self._link = Link(url, name=f"field-lease-{name}", timeout=max(2.0, 2 * interval))
        #: the table and the row exist (known in the link's thread only)
        self._ready = False
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        #: times this node tried to take the lease
        self.tries = 0

    @property
    def holding(self) -> bool:
        return self.state is Role.HOLDING

    def valid(self) -> bool:
        """Whether the role may act now: held, renewed within ``duration``, and no newer
        term known. Otherwise a held lease is lost here and now (``lost`` runs before this
        returns)."""
        if self.state is Role.HOLDING:
            if self._clock() >= self._valid_until:
                self._lose("no renewal succeeded within the lease's duration")
            elif self._newest() > self.term:
                self._lose(f"a term newer than {self.term} was taken")
        return self.state is Role.HOLDING

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"lease-{self.name}")

    async def stop(self) -> None:
        """Stop acting (``lost`` if held), let go of the row, close the connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.state is not Role.STOPPED:
            held = self.state is Role.HOLDING
            self._move("stop")
            if held:
                self._release = True
                _tell(self._lost, "lost")
        if self._release:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._link.timeout):
                    await self._let_go()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._link.timeout):
                await self._link.close()

    def _move(self, event: str) -> None:
        after = TRANSITIONS.get((self.state, event))
        if after is None:
            raise RuntimeError(f"lease {self.name}: no move {event!r} from {self.state.value}")
        self.state = after

    def _lose(self, why: str) -> None:
        self._move("lost")
        self._release = True
        logger.warning(
            "this node no longer holds the %s lease (term %d): %s", self.name, self.term, why
        )
        _tell(self._lost, "lost")

    # -- the loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if self._release:
                await self._let_go()
                # another node tries every quarter interval: it takes the role before this one
                await asyncio.sleep(self.interval)
                continue
            if self.state is Role.STANDBY:
                if not await self._try():
                    await asyncio.sleep(self.period)
                continue
            await asyncio.sleep(self.period)
            if self.state is Role.HOLDING:  # else lost meanwhile (valid() found it over)
                await self._renewal()

    async def _try(self) -> bool:
        """Take the lease if it expired; then hold it."""
        began = self._clock()
        self.tries += 1
        take = functools.partial(self._take, self._newest() + 1)
        try:
            term = await self._link.run(take)
        except psycopg.Error as exc:
            self._warn(exc)
            return False
        self._failing = False
        if term is None or self.state is not Role.STANDBY:
            return False
        self.term = term
        self._valid_until = began + self.duration
        if self._clock() >= self._valid_until:  # the answer came too late to act on
            self._release = True
            return True
        self._move("taken")
        logger.info("this node holds the %s lease, term %d", self.name, term)
        _tell(functools.partial(self._gained, term), "gained")
        return True

    async def _renewal(self) -> None:
        """Renew the lease: valid ``duration`` from before the statement was sent, or lost."""
        began = self._clock()
        renewed = await self._renew()
        if self.state is not Role.HOLDING:
            return  # lost meanwhile
        if not renewed:
            self._lose("it could not be renewed in time")
            return
        self._valid_until = began + self.duration
        self.valid()  # a newer term known loses it now, whoever asks next

    async def _renew(self) -> bool:
        """Whether the lease was renewed, known before this node's validity runs out."""
        left = self._valid_until - self._clock()
        if left <= 0:
            return False
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancellation that
            # comes as the call completes, and stop() would wait for this loop forever
            async with asyncio.timeout(left):
                return await self._link.run(functools.partial(self._extend, self.term))
        except TimeoutError:
            return False
        except psycopg.Error as exc:
            self._warn(exc)
            return False

    async def _let_go(self) -> None:
        """Expire this term's row now, if it is still this term's (best effort: a row not
        let go expires by itself)."""
        self._release = False
        try:
            await self._link.run(functools.partial(self._expire, self.term))
        except psycopg.Error as exc:
            self._warn(exc)

    def _warn(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "the %s lease cannot reach %s (%s); trying again every %g s",
                self.name,
                self._link.where,
                reason(exc),
                self.period,
            )

    # -- in the link's thread ----------------------------------------------------------

    def _params(self, **more: Any) -> dict[str, Any]:
        return {"name": self.name, "holder": self.holder, "duration": self.duration, **more}

    def _take(self, floor: int, conn: Any) -> int | None:
        if not self._ready:  # the table and the row, once (they outlive the connection)
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                conn.execute(_TABLE)
                conn.execute(_ROW, (self.name,))
            self._ready = True
        row = conn.execute(_TAKE, self._params(floor=floor)).fetchone()
        return None if row is None else int(row[0])

    def _extend(self, term: int, conn: Any) -> bool:
        return conn.execute(_RENEW, self._params(term=term)).fetchone() is not None

    def _expire(self, term: int, conn: Any) -> None:
        conn.execute(_RELEASE, self._params(term=term))


def _tell(callback: Callable[[], None], what: str) -> None:
    """Run a role's callback; a failing one is logged and never ends the lease's loop."""
    try:
        callback()
    except Exception:
        logger.exception("the lease's %s callback failed", what)
