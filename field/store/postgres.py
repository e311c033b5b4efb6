"""The event log in PostgreSQL: the first step from one node toward several.

Layout (in the schema the connection's ``search_path`` names first):

* ``field_log``: one row per entry; ``position`` is the primary key and
  ``data`` the orjson encoding of the entry's data (``bytea``: the bytes
  the other backends store, decoded the same way).
* ``field_log_head``: one row holding the last position handed out.
* ``field_snapshots`` and ``field_snapshot_chunks``: snapshots of the
  state (version 2; see :meth:`PostgresEventLog.snapshot_write`).
* ``field_schema``: one row holding the schema version
  (:data:`SCHEMA_VERSION`). The server creates and migrates the schema
  itself (:data:`MIGRATIONS`), under a transaction-scoped advisory lock;
  a database whose version is newer than this server knows is refused.

**Positions are assigned by the database.** An append is one transaction
that takes ``field_log``'s write lock and the head row's lock (in that
order, always), inserts the rows after the head, moves the head and
commits. A second appender (another node) blocks on the head row until the
first commits, then takes the positions after it: two appenders never
commit the same position, never leave a gap, and commit in position order,
so a reader that sees position ``p`` has every position before it.
Contention is waited out, not reported as a conflict; only a wait longer
than :data:`LOCK_TIMEOUT_MS` fails the append (``LOG_UNAVAILABLE``).

**Several nodes, one Field** (``shared``). Any number of servers may open
one database. A node validates a batch against its projection, so before
it runs a batch that may write, :meth:`PostgresEventLog.lock` begins the
transaction, takes the write lock the append's ``INSERT`` needs on
``field_log`` (``ROW EXCLUSIVE``, which appenders share) and the head row
(``SELECT ... FOR UPDATE``), and returns what the other nodes appended
since the node's position; the node applies those, runs its batch, and
:meth:`~PostgresEventLog.append` stores the batch right after them and
commits (or :meth:`~PostgresEventLog.unlock` rolls back an empty one). So
every write is validated against a state that holds every earlier entry,
whichever node wrote it: the head row is a writer lease taken per batch. A
node that hangs or loses the database while holding it loses it after
:data:`LEASE_TIMEOUT_MS` (the database ends the session), so the others
wait no longer than that. Every commit also sends ``NOTIFY field_log,
'<head>'``; :meth:`PostgresEventLog.follow` listens on its own connection
and tells the node of new entries (and polls the head now and then, should
a notification be lost with its connection).

**Durable before acknowledged.** Every connection sets
``synchronous_commit = on``: ``append`` returns after the commit's WAL is
flushed, as durable as the server's own ``fsync`` setting makes it.

**Every wait is bounded.** Every connection (the writer, the reader, the
follower's and the snapshots') sets ``lock_timeout`` to
:data:`LOCK_TIMEOUT_MS` (2 s) and ``statement_timeout`` to
:data:`STATEMENT_TIMEOUT_MS` (30 s), and the writer
``idle_in_transaction_session_timeout`` to :data:`LEASE_TIMEOUT_MS`. A
lock held elsewhere on any table (``LOCK TABLE``, ``VACUUM FULL``,
``CLUSTER``, ``ALTER TABLE``) fails the statement that meets it within
2 s, never later: :meth:`PostgresEventLog.lock` meets a lock on
``field_log_head`` or ``field_log`` before the node ran its batch (its
writes are refused, nothing to undo), a read raises
:class:`~field.contract.errors.LogUnavailable` and the follower connects again.

**Failures.** A database that cannot be reached, a lost connection or a
lock wait that times out make ``append`` raise
:class:`~field.contract.errors.LogUnavailable`; a full disk (SQLSTATE 53100),
:class:`~field.contract.errors.StorageFull`. The connection is opened again on the
next call, so the Field's probe resumes writes by itself once the database
is back. When the connection is lost during ``COMMIT`` the database alone
knows whether it committed: the append asks it on a new connection (the
batch's positions were the node's alone while it held the head row, so they
hold exactly its data if it committed) and returns the positions if so,
else reports ``LOG_UNAVAILABLE``; when the database cannot be asked within
:data:`SETTLE_SECONDS`, it reports ``LOG_UNAVAILABLE`` saying the outcome is
unknown, and the Field rebuilds its state from what the log holds.

The interface is synchronous, as SQLite's is: the Field calls ``append``
and ``lock`` in a worker thread and reads from its threads and its event
loop. One write connection and one read connection, each under its own
lock; :meth:`~PostgresEventLog.follow` has a third, asynchronous one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from field.contract.errors import LogUnavailable, LogWriteError, OperationalError, StorageFull
from field.store import is_log_url
from field.store.base import EventLog, LogEntry, StoredEntry
from field.store.memory import encode_batch, within

if TYPE_CHECKING:
    from field.store.snapshot_store import PostgresSnapshots

logger = logging.getLogger("field.store")

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict
except ImportError:  # pragma: no cover - the postgres extra is not installed
    psycopg = None  # type: ignore[assignment]

#: The schema version this server reads and writes.
SCHEMA_VERSION = 2

#: Statements that take the schema from version ``v - 1`` to ``v``, by ``v``.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE field_log (
            position BIGINT PRIMARY KEY,
            epoch    BIGINT NOT NULL,
            kind     TEXT NOT NULL,
            agent_id TEXT,
            ts       DOUBLE PRECISION NOT NULL,
            data     BYTEA NOT NULL
        )""",
        """CREATE TABLE field_log_head (
            id       INTEGER PRIMARY KEY CHECK (id = 1),
            position BIGINT NOT NULL CHECK (position >= 0)
        )""",
        "INSERT INTO field_log_head (id, position) VALUES (1, 0)",
    ),
    2: (
        """CREATE TABLE field_snapshots (
            id         BIGSERIAL PRIMARY KEY,
            position   BIGINT NOT NULL,
            written_at DOUBLE PRECISION NOT NULL,
            size       BIGINT NOT NULL
        )""",
        """CREATE TABLE field_snapshot_chunks (
            snapshot_id BIGINT NOT NULL REFERENCES field_snapshots (id) ON DELETE CASCADE,
            seq         INTEGER NOT NULL,
            data        BYTEA NOT NULL,
            PRIMARY KEY (snapshot_id, seq)
        )""",
        # a snapshot's bytes are as dense as pickle makes them: compressing them again
        # costs time and saves little
        "ALTER TABLE field_snapshot_chunks ALTER COLUMN data SET STORAGE EXTERNAL",
    ),
}

#: Seconds to wait for the database to accept a connection (libpq's least is 2).
CONNECT_TIMEOUT = 2
#: How long any statement of the log's connections waits for a lock (ms): the head row
#: another appender holds, or a table another client locked (``VACUUM FULL``, ``CLUSTER``,
#: ``ALTER TABLE``, ``LOCK TABLE``); past it the statement fails (``LOG_UNAVAILABLE``).
LOCK_TIMEOUT_MS = 2000
#: How long any statement of the log's connections may run (ms), locks aside: a backstop
#: for a database that stalls; every statement the Field runs takes milliseconds.
STATEMENT_TIMEOUT_MS = 30000
#: How long a node may hold the head row between :meth:`PostgresEventLog.lock` and its
#: append (ms): the database ends a session idle that long in its transaction, so a node
#: that hangs or is cut off while holding the lease holds up the others no longer than this.
LEASE_TIMEOUT_MS = 5000
#: Seconds to find out whether a batch whose ``COMMIT`` failed was stored (see ``_settle``).
SETTLE_SECONDS = 5.0
#: Advisory lock key of creating or migrating the schema.
_SCHEMA_LOCK = 0x6669656C6401
#: Connections that read a snapshot's chunks at once (see ``snapshot_read``).
SNAPSHOT_READERS = 2
#: The channel every commit notifies with its head position.
CHANNEL = "field_log"
#: Seconds between two polls of the head by :meth:`PostgresEventLog.follow`.
FOLLOW_POLL_SECONDS = 1.0
_INSTALL = "pip install 'akashik-field[postgres]'"

_HEAD = "UPDATE field_log_head SET position = position + %s WHERE id = 1 RETURNING position"
_LOCK = "SELECT position FROM field_log_head WHERE id = 1 FOR UPDATE"
#: What the append's INSERT takes, taken first by every append and by
#: :meth:`PostgresEventLog.lock` (before the head row, so that a node waiting for a table
#: locked elsewhere holds up no other node, and every node takes the two in one order):
#: a table lock held elsewhere refuses the batch before it runs, not its append after it ran.
_LOCK_LOG = "LOCK TABLE field_log IN ROW EXCLUSIVE MODE"
#: :meth:`PostgresEventLog.lock`'s three statements in one round trip (no parameters).
_BEGIN_LOCKED = f"BEGIN; {_LOCK_LOG}; {_LOCK}"
#: Every connection's settings (SET takes no parameters: these are constants).
_SETTINGS = (
    "SET synchronous_commit = on;"
    f" SET lock_timeout = {LOCK_TIMEOUT_MS};"
    f" SET statement_timeout = {STATEMENT_TIMEOUT_MS}"
)
_MOVE = "UPDATE field_log_head SET position = %s WHERE id = 1"
_NOTIFY = f"SELECT pg_notify('{CHANNEL}', %s)"
#: The batch goes in with one statement, its columns as arrays. A binary COPY took half
#: the time for 128 entries (0.64 ms against 1.4: benchmarks/README.md, "The log in
#: PostgreSQL"), but its rows follow the statement: a node stopped between the two (a
#: SIGSTOP, a frozen VM) left its session waiting for them while holding the head, which no
#: timeout of the server ends (neither the statement's nor idle-in-transaction), and every
#: node's writes stopped with it. After a whole statement, the session is idle in its
#: transaction, and the database ends it after LEASE_TIMEOUT_MS.
_INSERT = (
    "INSERT INTO field_log (position, epoch, kind, agent_id, ts, data)"
    " SELECT * FROM unnest(%b::int8[], %b::int8[], %b::text[], %b::text[], %b::float8[],"
    " %b::bytea[])"
)
_SELECT = (
    "SELECT position, epoch, kind, agent_id, ts, data FROM field_log"
    " WHERE position > %s ORDER BY position LIMIT %s"
)
_SELECT_AT = (
    "SELECT position, epoch, kind, agent_id, ts, data FROM field_log"
    " WHERE position = ANY(%s::bigint[]) ORDER BY position"
)
_SIZES_AT = (
    "SELECT position, octet_length(data) FROM field_log"
    " WHERE position = ANY(%s::bigint[]) ORDER BY position"
)
_LAST = "SELECT position FROM field_log_head WHERE id = 1"
_SNAPSHOT_CHUNK = "INSERT INTO field_snapshot_chunks (snapshot_id, seq, data) VALUES (%s, %s, %b)"


def describe(url: str) -> dict[str, Any]:
    """Where ``url`` points, without its user or password: host, port and database.

    A ``postgresql://`` URL is read here, driver or not (a server without the driver
    still names the database it cannot open); libpq's ``key=value`` form by the driver.
    """
    if is_log_url(url):
        return _describe_url(url)
    if psycopg is None:
        return {"host": None, "port": None, "name": None}
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        return {"host": None, "port": None, "name": None}
    return _where(params.get("host") or params.get("hostaddr"), params.get("port"), params)


def _describe_url(url: str) -> dict[str, Any]:
    """:func:`describe` of a URL, as libpq reads one: ``user:password@`` dropped, several
    ``host:port`` separated by commas, and ``?host=``, ``?port=``, ``?dbname=`` first."""
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    userinfo, _, hostspec = parts.netloc.rpartition("@")
    hosts, ports = [], []
    for item in hostspec.split(","):
        host, port = _host_port(item)
        hosts.append(host)
        ports.append(port)
    params = {
        "dbname": query.get("dbname") or urllib.parse.unquote(parts.path.lstrip("/")),
        "user": query.get("user") or urllib.parse.unquote(userinfo.partition(":")[0]),
    }
    host = query.get("host") or ",".join(h for h in hosts if h)
    return _where(host, query.get("port") or next((p for p in ports if p), None), params)


def _host_port(item: str) -> tuple[str, str]:
    """``host:port`` (``[v6]:port``) as host and port, percent-decoded; either may be ""."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        return urllib.parse.unquote(host), rest.removeprefix(":")
    host, _, port = item.partition(":")
    return urllib.parse.unquote(host), port


def _where(host: Any, port: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "host": host or "localhost",
        "port": int(port) if port and str(port).isdigit() else 5432,
        "name": params.get("dbname") or params.get("user") or None,
    }


def redact(url: str) -> str:
    """``url`` as it may be shown (status, logs): ``postgresql://host:port/name``."""
    where = describe(url)
    if where["host"] is None:
        return "postgresql://<unreadable>"
    host = where["host"]
    host = f"[{host}]" if ":" in host else host
    name = "" if where["name"] is None else where["name"]
    return f"postgresql://{host}:{where['port']}/{name}"


def _require_driver(where: str) -> None:
    if psycopg is None:
        raise OperationalError(
            f"Cannot open the event log {where}: a PostgreSQL log needs the psycopg driver, "
            "which is not installed.",
            suggested_action=f"Install the postgres extra: {_INSTALL}",
        )


def _write_error(exc: Exception, where: str) -> OperationalError:
    """The Field error for a failed append: the disk is full, or the log is unavailable."""
    if isinstance(exc, pg_errors.DiskFull):
        return StorageFull(
            f"The event log's database {where} is out of disk space; writes are refused",
            suggested_action="Free disk space on the database server: the Field resumes "
            "writes by itself within seconds, so retry then. Reads keep working meanwhile.",
        )
    why = reason(exc)
    return LogUnavailable(
        f"The event log's database {where} cannot be written now ({why}); writes are refused",
        suggested_action="Retry in a few seconds: the Field resumes writes by itself once the "
        "database answers again. Reads keep working meanwhile.",
    )


class PostgresEventLog(EventLog):
    """A durable :class:`EventLog` in a PostgreSQL database (see the module docstring)."""

    persistent = True
    backend = "postgresql"
    shared = True

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redact(url)
        _require_driver(self.where)
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._closed = False
        #: the newest position this log appended, read or found at opening
        self._last = 0
        #: the head while :meth:`lock` holds the head row, else None
        self._locked: int | None = None
        self._writer: Any = None
        self._reader: Any = None
        try:
            with self._write_lock:
                self._writer = self._open_writer()
                self._init_schema(self._writer)
                self._last = self._writer.execute(_LAST).fetchone()[0]
        except psycopg.Error as exc:
            self.close()
            raise OperationalError(
                f"Cannot open the event log {self.where}: {reason(exc)}",
                suggested_action="Check that the database server runs, that the database "
                "exists and that the --log URL's user may create tables in it.",
            ) from None
        except BaseException:
            self.close()
            raise

    # -- connections -------------------------------------------------------------

    def _connect(self) -> Any:
        conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name="field",
        )
        try:
            conn.execute(_SETTINGS)
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_writer(self) -> Any:
        conn = self._connect()
        try:
            conn.execute(f"SET idle_in_transaction_session_timeout = {LEASE_TIMEOUT_MS}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _writer_conn(self) -> Any:
        """The write connection, opened again when lost; the caller holds the write lock."""
        if self._closed:
            raise LogWriteError("The event log is closed.", recoverable=False)
        if not self._usable(self._writer):
            # a lock :meth:`lock` took ended with its session: what it returned is no
            # longer the head (:meth:`append` refuses to go on from it)
            self._locked = None
            self._drop(self._writer)
            self._writer = None
            self._writer = self._open_writer()
        return self._writer

    def _write_failed(self, exc: Exception) -> OperationalError:
        """Forget a transaction and a connection a failed statement left unusable."""
        self._locked = None
        conn = self._writer
        if self._usable(conn):
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        if not self._usable(conn):
            self._drop(conn)
            self._writer = None
        return _write_error(exc, self.where)

    def _init_schema(self, conn: Any) -> None:
        """Create the tables in a new database, or migrate an older schema; refuse a newer."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS field_schema (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM field_schema").fetchone()
            version = 0 if row is None else row[0]
            if version > SCHEMA_VERSION:
                raise OperationalError(
                    f"The event log {self.where} has schema version {version}; this server "
                    f"knows versions up to {SCHEMA_VERSION}.",
                    suggested_action="Run a field version that knows this schema, or choose "
                    "another database.",
                )
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[step]:
                    conn.execute(statement)
            if row is None:
                conn.execute("INSERT INTO field_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
            elif version < SCHEMA_VERSION:
                conn.execute("UPDATE field_schema SET version = %s", (SCHEMA_VERSION,))

    @staticmethod
    def _usable(conn: Any) -> bool:
        return conn is not None and not conn.closed and not conn.broken

    def _drop(self, conn: Any) -> None:
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                conn.close()

    # -- appends -------------------------------------------------------------------

    def append(self, entries: Sequence[LogEntry]) -> list[int]:
        """Store ``entries`` in one transaction; return the positions the database gave them.

        Under :meth:`lock`, they go right after the head it returned, in its
        transaction, which this commits; else in a transaction of their own.
        """
        if not entries:
            return []
        blobs = encode_batch(entries)
        columns = (
            [e.epoch for e in entries],
            [e.kind for e in entries],
            [e.agent_id for e in entries],
            [float(e.ts) for e in entries],
            blobs,
        )
        count = len(entries)
        with self._write_lock:
            committing = False
            locked = self._locked
            try:
                conn = self._writer_conn()
                if locked is not None and self._locked is None:
                    # the connection holding the head was found lost: another node may
                    # have appended since, and moving the head to after ``locked``
                    # (outside any transaction, on the new connection) would move it back
                    raise LogUnavailable(
                        f"The event log's database {self.where} lost the session that held "
                        "the log's head before the append; nothing was written",
                        suggested_action="Retry: the next write takes the head again.",
                    )
                if self._locked is None:
                    conn.execute(f"BEGIN; {_LOCK_LOG}")
                    last = conn.execute(_HEAD, (count,)).fetchone()[0]
                else:
                    last = self._locked + count
                    conn.execute(_MOVE, (last,))
                first = last - count + 1
                conn.execute(_INSERT, (list(range(first, last + 1)), *columns))
                conn.execute(_NOTIFY, (str(last),))
                committing = True
                conn.execute("COMMIT")
            except psycopg.Error as exc:
                error = self._write_failed(exc)
                if not committing:
                    raise error from exc
                stored = self._settle(first, blobs)
                if stored is None and isinstance(error, LogUnavailable):
                    raise LogUnavailable(
                        f"{error.message} (whether the last write was stored is unknown)",
                        suggested_action=error.suggested_action,
                    ) from exc
                if not stored:
                    raise error from exc
                logger.warning(
                    "the event log %s: the commit of positions %d-%d failed (%s), yet they "
                    "are stored",
                    self.where,
                    first,
                    last,
                    reason(exc),
                )
            self._locked = None
            self._last = max(self._last, last)
        return list(range(first, last + 1))

    def _settle(self, first: int, blobs: list[bytes]) -> bool | None:
        """Whether a batch whose ``COMMIT`` failed was stored all the same (the connection
        was lost as it committed: the outcome is the database's to tell). Its positions
        were this node's alone while it held the head row, so they hold exactly its data
        if it committed, and something else or nothing if not. Asked on new connections
        for up to :data:`SETTLE_SECONDS`; None: the database could not be asked."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            conn = None
            try:
                conn = self._connect()
                rows = conn.execute(
                    "SELECT data FROM field_log WHERE position BETWEEN %s AND %s ORDER BY position",
                    (first, first + len(blobs) - 1),
                ).fetchall()
                return [bytes(data) for (data,) in rows] == blobs
            except psycopg.Error:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.2)
            finally:
                self._drop(conn)

    def lock(self, after: int) -> list[StoredEntry]:
        """Begin the next append: hold the head row, and return the entries after
        ``after`` (what other nodes appended); :meth:`append` or :meth:`unlock` ends it."""
        with self._write_lock:
            try:
                conn = self._writer_conn()
                if self._locked is not None:
                    conn.execute("ROLLBACK")
                    self._locked = None
                cursor = conn.execute(_BEGIN_LOCKED)
                while cursor.nextset():  # to the last statement's result: the head
                    pass
                head = cursor.fetchone()[0]
                rows = []
                if head > after:
                    rows = conn.execute(_SELECT, (after, head - after)).fetchall()
            except psycopg.Error as exc:
                raise self._write_failed(exc) from exc
            self._locked = head
            self._last = max(self._last, head)
        return _entries(rows)

    def unlock(self) -> None:
        """Release the head row :meth:`lock` holds, appending nothing."""
        with self._write_lock:
            if self._locked is None:
                return
            self._locked = None
            try:
                self._writer_conn().execute("ROLLBACK")
            except psycopg.Error as exc:
                raise self._write_failed(exc) from exc

    def head(self) -> int:
        """The newest position in the database now (one query on the read connection)."""
        with self._read_lock:
            head: int = self._query(_LAST, ())[0][0]
        self._last = max(self._last, head)
        return head

    async def follow(self) -> AsyncIterator[int]:
        """The log's head each time it may have moved: on every ``NOTIFY`` of a commit
        (from any node) and every :data:`FOLLOW_POLL_SECONDS`; after a lost connection,
        once more as soon as it is back. Never ends; the caller cancels it."""
        backoff = 0.1
        failing = False  # a failure was logged: the next ones are debug lines until it works
        while not self._closed:
            conn = None
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=CONNECT_TIMEOUT,
                    application_name="field-follow",
                )
                await conn.execute(_SETTINGS)
                await conn.execute(f"LISTEN {CHANNEL}")
                backoff = 0.1
                while True:
                    row = await (await conn.execute(_LAST)).fetchone()
                    assert row is not None  # the schema's first migration inserts the head's row
                    if failing:
                        logger.warning("following the event log %s again", self.where)
                        failing = False
                    yield row[0]
                    async for notify in conn.notifies(timeout=FOLLOW_POLL_SECONDS):
                        yield int(notify.payload)
            except psycopg.Error as exc:
                level = logging.DEBUG if failing else logging.WARNING
                logger.log(level, "following the event log %s: %s", self.where, reason(exc))
                failing = True
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    # -- reads ---------------------------------------------------------------------

    def _query(self, query: str, params: tuple[Any, ...]) -> list[Any]:
        """Run a read on the read connection (opened again when lost); the caller holds
        the read lock."""
        if self._closed:
            raise OperationalError("The event log is closed.")
        try:
            if not self._usable(self._reader):
                self._drop(self._reader)
                self._reader = None
                self._reader = self._connect()
            rows: list[Any] = self._reader.execute(query, params).fetchall()
            return rows
        except psycopg.Error as exc:
            if not self._usable(self._reader):
                self._drop(self._reader)
                self._reader = None
            raise LogUnavailable(
                f"Cannot read the event log {self.where}: {reason(exc)}",
                suggested_action="Retry in a few seconds, once the database answers again.",
            ) from exc

    def check_readable(self, after: int) -> None:
        """Read the head and the entry after ``after`` on a connection of its own, opened
        for it: a check that waits out a lock timeout holds up no other read."""
        if self._closed:
            raise OperationalError("The event log is closed.")
        conn = None
        try:
            conn = self._connect()
            conn.execute(_LAST).fetchall()
            conn.execute(_SELECT, (after, 1)).fetchall()
        except psycopg.Error as exc:
            raise LogUnavailable(
                f"Cannot read the event log {self.where}: {reason(exc)}",
                suggested_action="Retry in a few seconds, once the database answers again.",
            ) from exc
        finally:
            self._drop(conn)

    def read(self, after: int = 0, limit: int = 1000) -> list[StoredEntry]:
        """Entries with ``position > after``, ascending, at most ``limit``."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        with self._read_lock:
            rows = self._query(_SELECT, (after, limit))
        return _entries(rows)

    def read_positions(
        self, positions: Iterable[int], *, max_bytes: int | None = None
    ) -> list[StoredEntry]:
        """The entries at ``positions`` (ascending, each once; absent ones left out); with
        ``max_bytes``, the prefix whose stored data fits (sizes are read first)."""
        wanted = sorted({p for p in positions if 1 <= p < 2**63})
        if not wanted:
            return []
        with self._read_lock:
            if max_bytes is not None:
                sized = self._query(_SIZES_AT, (wanted,))
                wanted = [p for p, _ in sized[: within(max_bytes, [s for _, s in sized])]]
            rows = self._query(_SELECT_AT, (wanted,))
        return _entries(rows)

    def last_position(self) -> int:
        """The newest position this log appended, locked or read the head at (other
        nodes may have appended since: :meth:`head` asks the database)."""
        if self._closed:
            raise OperationalError("The event log is closed.")
        return self._last

    def location(self) -> dict[str, Any] | None:
        """The database's host, port and name (never its user or password)."""
        return describe(self.url)

    def close(self) -> None:
        """Close both connections (rolling back a lock still held); idempotent."""
        with self._write_lock, self._read_lock:
            self._closed = True
            for conn in (self._reader, self._writer):
                self._drop(conn)
            self._reader = self._writer = None

    def __repr__(self) -> str:
        return f"PostgresEventLog({self.where!r})"

    # -- snapshots (field.store.snapshot_store) -----------------------------------------------

    def snapshots(self) -> PostgresSnapshots:
        """Snapshots of the state, kept in this database (any node finds them)."""
        from field.store.snapshot_store import PostgresSnapshots

        return PostgresSnapshots(self)

    @contextlib.contextmanager
    def _snapshot_connection(self) -> Iterator[Any]:
        """A connection of its own: moving a snapshot never holds up appends or reads."""
        if self._closed:
            raise OperationalError("The event log is closed.")
        try:
            conn = self._connect()
        except psycopg.Error as exc:
            raise LogUnavailable(f"Cannot reach the event log {self.where}: {reason(exc)}") from exc
        try:
            yield conn
        except psycopg.Error as exc:
            raise LogUnavailable(
                f"Snapshots in the event log {self.where} failed: {reason(exc)}"
            ) from exc
        finally:
            self._drop(conn)

    def snapshot_list(self) -> list[tuple[int, int, float, int]]:
        """``(id, position, written_at, size)`` of every snapshot, newest position first."""
        with self._snapshot_connection() as conn:
            rows: list[tuple[int, int, float, int]] = conn.execute(
                "SELECT id, position, written_at, size FROM field_snapshots"
                " ORDER BY position DESC, written_at DESC, id DESC"
            ).fetchall()
            return rows

    def snapshot_read(self, snapshot_id: int) -> bytearray:
        """The bytes of one snapshot, its chunks in order in one buffer of the size they add
        up to, read by :data:`SNAPSHOT_READERS` connections at once (each chunk is detoasted
        by its server process: one connection reads at about half the speed of two)."""
        with self._snapshot_connection() as conn:
            sizes: list[tuple[int, int]] = conn.execute(
                "SELECT seq, octet_length(data) FROM field_snapshot_chunks"
                " WHERE snapshot_id = %s ORDER BY seq",
                (snapshot_id,),
            ).fetchall()
        gap = next((i for i, (seq, _) in enumerate(sizes) if seq != i), None)
        if gap is not None:  # chunks pruned: what comes before the gap (the checks see it cut)
            sizes = sizes[:gap]
        out = bytearray(sum(size for _, size in sizes))
        starts, at = [], 0
        for _, size in sizes:
            starts.append(at)
            at += size
        missing: list[int] = []  # chunks pruned meanwhile

        def read(part: list[int]) -> None:
            with self._snapshot_connection() as conn:
                for i in part:
                    seq, size = sizes[i]
                    row = conn.execute(
                        "SELECT data FROM field_snapshot_chunks WHERE snapshot_id = %s"
                        " AND seq = %s",
                        (snapshot_id, seq),
                        binary=True,
                    ).fetchone()
                    if row is None or len(row[0]) != size:
                        missing.append(i)
                        return
                    out[starts[i] : starts[i] + size] = row[0]

        parts = [list(range(k, len(sizes), SNAPSHOT_READERS)) for k in range(SNAPSHOT_READERS)]
        with concurrent.futures.ThreadPoolExecutor(SNAPSHOT_READERS) as pool:
            list(pool.map(read, [part for part in parts if part]))  # raises what a read raised
        if missing:  # what was read before the first gap: the reader's checks say truncated
            del out[starts[min(missing)] :]
        return out

    def snapshot_write(
        self,
        position: int,
        written_at: float,
        produce: Callable[[Callable[[bytes], object]], object],
    ) -> tuple[int, int]:
        """Store a snapshot in one transaction (readers see all of it or none): ``produce``
        hands its bytes to a sink that stores each piece as a row (a bytea holds at most
        1 GB); returns the snapshot's id and size."""
        with self._snapshot_connection() as conn, conn.transaction():
            snapshot_id = conn.execute(
                "INSERT INTO field_snapshots (position, written_at, size) VALUES (%s, %s, 0)"
                " RETURNING id",
                (position, written_at),
            ).fetchone()[0]
            pieces = [0, 0]  # rows written, bytes written

            def sink(chunk: bytes) -> None:
                conn.execute(_SNAPSHOT_CHUNK, (snapshot_id, pieces[0], chunk))
                pieces[0] += 1
                pieces[1] += len(chunk)

            produce(sink)
            size = pieces[1]
            conn.execute("UPDATE field_snapshots SET size = %s WHERE id = %s", (size, snapshot_id))
        return snapshot_id, size

    def snapshot_prune(self, keep: int) -> int:
        """Delete all but the newest ``keep`` snapshots (their chunks go with them)."""
        with self._snapshot_connection() as conn:
            deleted = conn.execute(
                "DELETE FROM field_snapshots WHERE id NOT IN (SELECT id FROM field_snapshots"
                " ORDER BY position DESC, written_at DESC, id DESC LIMIT %s)",
                (keep,),
            )
            return int(deleted.rowcount)


def reason(exc: BaseException) -> str:
    """The first line of a database error, for a log line or an error message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _entries(rows: list[Any]) -> list[StoredEntry]:
    return [
        StoredEntry(position, epoch, kind, orjson.loads(data), agent_id, ts)
        for position, epoch, kind, agent_id, ts, data in rows
    ]
