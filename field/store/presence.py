"""Presence shared by the nodes of one Field, through its PostgreSQL database.

Several ``field serve`` processes on one PostgreSQL log are one Field. An
agent may hold its push connections on one node and send its requests to
another, so :class:`~field.engine.liveness.Liveness` must judge it by what every
node knows of it. Each node shares what it knows here, and reads what the
others know.

Tables (created if absent, beside the log's):

* ``field_nodes``: one row per node: ``node_id``, ``alive_at`` (when it
  last flushed), ``version`` (of the last presence rows it wrote) and
  ``position`` (the log position it had applied then: what the status shows of
  every node, beside the log's head).
* ``field_presence``: one row per node and agent that node knows of:
  ``connections`` open to it, ``heard_at`` (the agent's last request or
  connection there), ``dropped_at`` (when its last connection there
  closed) and the ``version`` of the flush that wrote the row. A row with
  ``connections`` -1 is a tombstone: the agent is no longer registered.

**One round trip per interval.** Every ``interval`` seconds (default 1)
a node runs one statement: it upserts its ``field_nodes`` row and the
presence rows of agents whose presence changed since its last flush
(arrays, ``unnest``), and reads what the other nodes wrote since it last
read. A node writes only its own rows, one flush at a time, each flush
with a higher version, so what another node wrote since a reader last
looked is exactly its rows with a version above the one the reader saw in
that node's ``field_nodes`` row (read in the same snapshot): reads are
incremental. A reader that has not read for :data:`RESYNC_SECONDS` reads
everything again (tombstones are swept after :data:`TOMBSTONE_SECONDS`).

**Live nodes.** A node is live while its ``alive_at`` is less than
``node_timeout`` (default five intervals) old. Connections count only on
live nodes: a dead node's connections count as closed when it was last
alive, so their agents get ``failure_grace`` from then to come back on
another node. What a node heard still counts after it died: it is a fact
about the agent, and it ages like any other. A node that stops cleanly
marks its connections closed and itself dead at once. Rows of nodes dead
for ``forget_after`` seconds are deleted, by whichever node sweeps first.

**One node decides.** Every node could fail a silent agent, and failing an
already failed agent writes nothing, but two nodes deciding at once would
race for nothing: :meth:`Presence.decides` is true on the live node with
the smallest ``node_id`` only, and only while this node's own view is
fresh (read less than ``node_timeout`` ago). A node that cannot read the
others' presence decides nothing: it might fail an agent connected
elsewhere.

**Bounded waits.** The flush runs on a :class:`~field.store.link.Link`,
whose ``lock_timeout`` and ``statement_timeout`` are the link's timeout
(twice ``interval``, at least 2 s): ``field_nodes`` or ``field_presence``
locked elsewhere fails the flush within that, the node's view goes stale
(it decides nothing) and the next flush tries again; no request waits for
presence.

**Times.** What is shared is wall-clock time (``time.time()``): the nodes'
clocks must agree to well within ``node_timeout``. :class:`Liveness`
counts in its own clock, so the two exchange ages (seconds before now),
never instants.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from field.contract.errors import OperationalError
from field.store.link import Link
from field.store.postgres import reason

try:
    import psycopg
except ImportError:  # pragma: no cover - the postgres extra is not installed
    psycopg = None  # type: ignore[assignment]

logger = logging.getLogger("field.cluster")

#: An agent's presence on one node: (connections, heard from at, last connection closed at);
#: times are wall-clock seconds, or None for never.
Row = tuple[int, float | None, float | None]
#: What a node reports of an agent: (connections, seconds since heard from, seconds since
#: its last connection closed), or None for an agent no longer registered.
Report = tuple[int, float | None, float | None] | None
#: Where a node's reports come from: the changes since the previous call, by agent
#: (:meth:`field.engine.liveness.Liveness.drain_changes`).
Source = Callable[[], dict[str, Report]]

#: Seconds a tombstone stays before it is swept.
TOMBSTONE_SECONDS = 60.0
#: A reader that has not read for this long reads every row again: it may have missed
#: tombstones swept meanwhile.
RESYNC_SECONDS = TOMBSTONE_SECONDS / 2
#: Seconds between sweeps of tombstones and of long-dead nodes.
SWEEP_SECONDS = 60.0
#: ``connections`` of a tombstone.
FORGOTTEN = -1
#: Advisory lock key under which the tables are created (one creator at a time).
_SCHEMA_LOCK = 0x6669656C6410

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS field_nodes (
        node_id  TEXT PRIMARY KEY,
        alive_at DOUBLE PRECISION NOT NULL,
        version  BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS field_presence (
        node_id     TEXT NOT NULL,
        agent_id    TEXT NOT NULL,
        connections INTEGER NOT NULL,
        heard_at    DOUBLE PRECISION,
        dropped_at  DOUBLE PRECISION,
        version     BIGINT NOT NULL,
        PRIMARY KEY (node_id, agent_id)
    )""",
    # what a node wrote since a reader's mark is found without reading the rest
    "CREATE INDEX IF NOT EXISTS field_presence_news ON field_presence (node_id, version)",
    # added since the table was first made: a table of an older version gains it
    "ALTER TABLE field_nodes ADD COLUMN IF NOT EXISTS position BIGINT NOT NULL DEFAULT 0",
)

_NODE = (
    "INSERT INTO field_nodes (node_id, alive_at, version, position)"
    " VALUES (%(me)s, %(now)s, %(version)s, %(position)s)"
    " ON CONFLICT (node_id) DO UPDATE SET alive_at = EXCLUDED.alive_at,"
    " version = EXCLUDED.version, position = EXCLUDED.position"
)
#: One flush: this node's row, its changed presence rows, and what the others wrote since.
_FLUSH = f"""
WITH node AS ({_NODE}),
changed AS (
    INSERT INTO field_presence (node_id, agent_id, connections, heard_at, dropped_at, version)
    SELECT %(me)s, agent_id, connections, heard_at, dropped_at, %(version)s
    FROM unnest(%(agents)s::text[], %(connections)s::int[], %(heard)s::float8[],
                %(dropped)s::float8[]) AS c(agent_id, connections, heard_at, dropped_at)
    ON CONFLICT (node_id, agent_id) DO UPDATE SET
        connections = EXCLUDED.connections, heard_at = EXCLUDED.heard_at,
        dropped_at = EXCLUDED.dropped_at, version = EXCLUDED.version
)
SELECT n.node_id, n.alive_at, n.version, n.position,
       p.agent_id, p.connections, p.heard_at, p.dropped_at
FROM field_nodes n
LEFT JOIN unnest(%(seen)s::text[], %(marks)s::bigint[]) AS s(node_id, mark)
    ON s.node_id = n.node_id
LEFT JOIN LATERAL (
    -- per node, through the (node_id, version) index: the rows read are the news only
    SELECT agent_id, connections, heard_at, dropped_at FROM field_presence
    WHERE node_id = n.node_id AND version > COALESCE(s.mark, 0)
    OFFSET 0  -- kept apart: planned for each node, not joined wholesale
) p ON true
WHERE n.node_id <> %(me)s
"""
#: Connections of this node's that are over (it restarted, or it stops) are closed at ``at``.
_CLOSE_ALL = (
    "UPDATE field_presence SET connections = 0, dropped_at = %(at)s, version = %(version)s"
    " WHERE node_id = %(me)s AND connections > 0"
)
_SWEEP = """
WITH dead AS (
    DELETE FROM field_nodes WHERE alive_at < %(bury)s AND node_id <> %(me)s RETURNING node_id
), orphans AS (
    DELETE FROM field_presence WHERE node_id IN (SELECT node_id FROM dead)
)
DELETE FROM field_presence
WHERE node_id = %(me)s AND connections < 0 AND dropped_at < %(old)s
"""


class Presence:
    """This node's share of the Field's presence, and its view of the others'.

    The remote presence source of :class:`~field.engine.liveness.Liveness`
    (:meth:`presence`, :meth:`decides`); :meth:`start` takes where this
    node's own changes come from.
    """

    def __init__(
        self,
        url: str,
        node_id: str,
        *,
        interval: float = 1.0,
        node_timeout: float | None = None,
        forget_after: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        self.node_id = node_id
        self.interval = interval
        #: seconds after its last flush a node counts as dead
        self.node_timeout = 5 * interval if node_timeout is None else node_timeout
        #: seconds after which a dead node's rows are deleted
        self.forget_after = max(forget_after, self.node_timeout)
        self._clock = clock
        self._link = Link(url, name="field-presence", timeout=max(2.0, 2 * interval))
        self._source: Source | None = None
        #: this node's changes not yet flushed, wall-clock times
        self._pending: dict[str, Row | None] = {}
        self._version = 0
        #: the other nodes: alive_at, the version of theirs last read and the log position
        #: each had applied at its last flush
        self._nodes: dict[str, tuple[float, int, int]] = {}
        #: where this node's own position comes from (:meth:`start`)
        self._position: Callable[[], int] = lambda: 0
        #: the other nodes' rows, by node, then agent (no tombstones)
        self._rows: dict[str, dict[str, Row]] = {}
        #: when the last read began (wall clock); None before the first
        self._read_at: float | None = None
        self._swept_at = 0.0
        self._failing = False
        self._task: asyncio.Task[None] | None = None

    @property
    def where(self) -> str:
        return self._link.where

    # -- what Liveness asks --------------------------------------------------------

    def presence(self, agent_id: str) -> tuple[int, float | None, float | None]:
        """What the other nodes know of ``agent_id``: connections open on live nodes, and
        seconds since the latest it was heard from and since its last connection closed,
        across them (None: never)."""
        now = self._clock()
        count, heard, dropped = 0, None, None
        for node_id, rows in self._rows.items():
            row = rows.get(agent_id)
            if row is None:
                continue
            connections, heard_at, dropped_at = row
            if connections > 0:
                alive_at = self._nodes[node_id][0]
                if now - alive_at < self.node_timeout:
                    count += connections
                else:  # the node died: its connections closed when it was last alive
                    dropped_at = alive_at if dropped_at is None else max(dropped_at, alive_at)
            heard = _latest(heard, heard_at)
            dropped = _latest(dropped, dropped_at)
        return count, _age(now, heard), _age(now, dropped)

    def decides(self) -> bool:
        """Whether this node makes the Field's liveness decisions now: its view is fresh
        and no live node has a smaller id."""
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self.node_timeout:
            return False
        return all(
            node_id > self.node_id
            for node_id, (alive_at, _, _) in self._nodes.items()
            if now - alive_at < self.node_timeout
        )

    def nodes(self) -> list[tuple[str, int, float | None, bool]]:
        """Every node this node knows of, itself included, by id: its id, the log position
        it had applied at its last flush (this node's own: now), the seconds since that
        flush (None: this node) and whether it is live."""
        now = self._clock()
        known: list[tuple[str, int, float | None, bool]] = [
            (self.node_id, self._position(), None, True)
        ]
        for node_id, (alive_at, _, position) in self._nodes.items():
            age = max(0.0, now - alive_at)
            known.append((node_id, position, age, age < self.node_timeout))
        return sorted(known)

    def live_nodes(self) -> list[str]:
        """The nodes live as this node last read them, itself included, sorted."""
        now = self._clock()
        others = [n for n, (alive, _, _) in self._nodes.items() if now - alive < self.node_timeout]
        return sorted([self.node_id, *others])

    # -- life cycle ----------------------------------------------------------------

    async def start(
        self, source: Source | None = None, position: Callable[[], int] | None = None
    ) -> None:
        """Create the tables if absent, close what a former life of this node id left
        open, flush once, then every ``interval``; ``position`` tells the log position this
        node has applied, shared with each flush. Raises
        :class:`~field.contract.errors.OperationalError` when the database refuses."""
        self._source = source
        if position is not None:
            self._position = position
        try:
            self._version = await self._link.run(functools.partial(self._setup, self._clock()))
        except psycopg.Error as exc:
            await self._link.close()
            raise OperationalError(
                f"Cannot share presence in {self.where}: {reason(exc)}",
                suggested_action="Check that the database server runs and that the --log "
                "URL's user may create tables in it.",
            ) from None
        await self.flush()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="field-presence")

    async def stop(self) -> None:
        """Flush the last changes, mark this node's connections closed and the node dead
        (the others count them closed at once), and close the connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(psycopg.Error, TimeoutError):
            async with asyncio.timeout(2 * self._link.timeout):
                await self.flush()
                self._version += 1
                leave = functools.partial(self._leave, self._version, self._clock())
                await self._link.run(leave)
        await self._link.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.flush()
            if self._clock() - self._swept_at >= SWEEP_SECONDS:
                await self.sweep()

    # -- one round trip ----------------------------------------------------------------

    async def flush(self) -> bool:
        """Write this node's changes and liveness, read the others' news: one statement.
        False when the database failed (the changes are sent again with the next)."""
        if self._source is not None:
            self._take(self._source())
        batch, self._pending = self._pending, {}
        now = self._clock()
        resync = self._read_at is None or now - self._read_at >= RESYNC_SECONDS
        marks = {} if resync else {n: version for n, (_, version, _) in self._nodes.items()}
        if batch:
            # a version for every attempt: one whose commit was lost stays behind us
            self._version += 1
        exchange = functools.partial(self._exchange, batch, self._version, marks, now)
        try:
            rows = await self._link.run(exchange)
        except psycopg.Error as exc:
            self._pending = {**batch, **self._pending}  # what changed since is newer
            self._warn(exc)
            return False
        self._absorb(rows, resync)
        self._read_at = now
        if self._failing:
            self._failing = False
            logger.warning("presence is shared again in %s", self.where)
        return True

    async def sweep(self) -> bool:
        """Delete this node's old tombstones and the rows of nodes dead ``forget_after``."""
        now = self._clock()
        self._swept_at = now
        params = {
            "me": self.node_id,
            "bury": now - self.forget_after,
            "old": now - TOMBSTONE_SECONDS,
        }
        try:
            await self._link.run(lambda conn: conn.execute(_SWEEP, params))
        except psycopg.Error as exc:
            self._warn(exc)
            return False
        return True

    def _take(self, changes: dict[str, Report]) -> None:
        """This node's changes, from ages to wall-clock times, into the next flush."""
        now = self._clock()
        for agent_id, report in changes.items():
            if report is None:
                self._pending[agent_id] = None
            else:
                connections, heard, dropped = report
                self._pending[agent_id] = (
                    connections,
                    None if heard is None else now - heard,
                    None if dropped is None else now - dropped,
                )

    def _absorb(self, rows: list[Any], resync: bool) -> None:
        """The others' news into the view: every node's row, the presence rows that changed."""
        if resync:
            self._rows = {}
        nodes: dict[str, tuple[float, int, int]] = {}
        for row in rows:
            node_id, alive_at, version, position, agent_id, connections, heard_at, dropped_at = row
            nodes[node_id] = (alive_at, version, position)
            if agent_id is None:
                continue
            mine = self._rows.setdefault(node_id, {})
            if connections < 0:
                mine.pop(agent_id, None)
            else:
                mine[agent_id] = (connections, heard_at, dropped_at)
        for gone in self._rows.keys() - nodes.keys():
            del self._rows[gone]
        self._nodes = nodes

    def _warn(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "cannot share presence in %s (%s): liveness decisions wait until it can",
                self.where,
                reason(exc),
            )

    # -- in the link's thread ----------------------------------------------------------

    def _setup(self, now: float, conn: Any) -> int:
        """Tables, then this node's row; the version its flushes go on from."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for statement in SCHEMA:
                conn.execute(statement)
            row = conn.execute(
                "SELECT alive_at, version FROM field_nodes WHERE node_id = %s FOR UPDATE",
                (self.node_id,),
            ).fetchone()
            version = 1 if row is None else row[1] + 1
            if row is not None:  # a former life of this node id: its connections are gone
                conn.execute(_CLOSE_ALL, {"me": self.node_id, "at": row[0], "version": version})
            node = {"me": self.node_id, "now": now, "version": version, "position": 0}
            conn.execute(_NODE, node)
        return version

    def _exchange(
        self,
        batch: dict[str, Row | None],
        version: int,
        marks: dict[str, int],
        now: float,
        conn: Any,
    ) -> list[Any]:
        agents = list(batch)
        rows = [batch[a] or (FORGOTTEN, None, now) for a in agents]
        params = {
            "me": self.node_id,
            "now": now,
            "version": version,
            "position": self._position(),
            "agents": agents,
            "connections": [r[0] for r in rows],
            "heard": [r[1] for r in rows],
            "dropped": [r[2] for r in rows],
            "seen": list(marks),
            "marks": list(marks.values()),
        }
        answer: list[Any] = conn.execute(_FLUSH, params).fetchall()
        return answer

    def _leave(self, version: int, now: float, conn: Any) -> None:
        """This node stops: its connections closed ``now``, the node dead at once."""
        with conn.transaction():
            conn.execute(_CLOSE_ALL, {"me": self.node_id, "at": now, "version": version})
            dead = now - self.node_timeout
            node = {"me": self.node_id, "now": dead, "version": version}
            conn.execute(_NODE, {**node, "position": self._position()})


def _latest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


def _age(now: float, at: float | None) -> float | None:
    """Seconds from ``at`` to ``now`` (never negative: clocks differ a little), or None."""
    return None if at is None else max(0.0, now - at)
