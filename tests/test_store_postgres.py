"""The PostgreSQL event log: the shared contract, and what only a database server brings.

Each test gets a database of its own, created for it and dropped after it
(:mod:`tests.postgres_util`); without a reachable server they are skipped, naming the URL.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from field.contract.errors import Code, LogUnavailable, OperationalError
from field.store import EventLog, open_log, redact_log_url
from field.store import postgres as pg_module

from .postgres_util import fresh_database, require_postgres
from .test_store import (  # noqa: F401 - fast_thread_switching is a fixture
    EventLogContract,
    acknowledged_before_kill,
    batch,
    entry,
    fast_thread_switching,
    positions,
)

psycopg = pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")

from field.store.postgres import SCHEMA_VERSION, PostgresEventLog  # noqa: E402


@pytest.fixture
def database() -> Iterator[str]:
    """The URL of a fresh database, dropped after the test."""
    with fresh_database() as url:
        yield url


@pytest.fixture
def opener(database: str) -> Iterator[Callable[..., PostgresEventLog]]:
    """Open logs on the test's database; every one is closed at teardown."""
    opened: list[PostgresEventLog] = []

    def open_(**kwargs: Any) -> PostgresEventLog:
        log = PostgresEventLog(database, **kwargs)
        opened.append(log)
        return log

    yield open_
    for log in opened:
        log.close()


def sql(url: str, query: str, *params: Any) -> list[Any]:
    """Run ``query`` on its own connection (another client of the database)."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query, params or None)
        return cursor.fetchall() if cursor.description else []


class TestPostgresEventLog(EventLogContract):
    @pytest.fixture
    def log(self, database: str) -> Iterator[EventLog]:
        log = PostgresEventLog(database)
        try:
            yield log
        finally:
            log.close()

    def test_attributes(self, opener: Callable[..., PostgresEventLog]) -> None:
        log = opener()
        assert log.persistent is True and log.backend == "postgresql"

    def test_survives_close_and_reopen(self, opener: Callable[..., PostgresEventLog]) -> None:
        first = opener()
        assert first.append(batch(1, 5)) == [1, 2, 3, 4, 5]
        first.close()
        second = opener()
        assert second.last_position() == 5
        assert [e.data["n"] for e in second.read()] == [1, 2, 3, 4, 5]
        assert second.append([entry(6)]) == [6]

    def test_schema_is_created_and_versioned(
        self, opener: Callable[..., PostgresEventLog], database: str
    ) -> None:
        opener()
        assert sql(database, "SELECT version FROM field_schema") == [(SCHEMA_VERSION,)]
        opener().close()  # opening again migrates nothing and keeps one row
        assert sql(database, "SELECT version FROM field_schema") == [(SCHEMA_VERSION,)]

    def test_a_newer_schema_is_refused(
        self, opener: Callable[..., PostgresEventLog], database: str
    ) -> None:
        opener().close()
        sql(database, "UPDATE field_schema SET version = %s", SCHEMA_VERSION + 1)
        with pytest.raises(OperationalError) as info:
            opener()
        assert f"schema version {SCHEMA_VERSION + 1}" in info.value.message
        assert f"up to {SCHEMA_VERSION}" in info.value.message
        assert info.value.suggested_action

    def test_an_older_schema_is_migrated(
        self, opener: Callable[..., PostgresEventLog], database: str, monkeypatch: Any
    ) -> None:
        opener().close()
        # a next version that adds a column: the server takes today's database there
        later = SCHEMA_VERSION + 1
        monkeypatch.setattr(pg_module, "SCHEMA_VERSION", later)
        monkeypatch.setitem(
            pg_module.MIGRATIONS, later, ("ALTER TABLE field_log ADD COLUMN note TEXT",)
        )
        log = opener()
        assert log.append([entry(1)]) == [1]
        assert sql(database, "SELECT version FROM field_schema") == [(later,)]
        assert sql(database, "SELECT count(*) FROM field_log WHERE note IS NULL") == [(1,)]

    def test_a_version_1_database_gains_the_snapshot_tables(
        self, opener: Callable[..., PostgresEventLog], database: str, monkeypatch: Any
    ) -> None:
        with monkeypatch.context() as first:
            first.setattr(pg_module, "SCHEMA_VERSION", 1)
            old = opener()
            assert old.append([entry(1)]) == [1]
            old.close()
        assert sql(database, "SELECT to_regclass('field_snapshots')") == [(None,)]
        log = opener()
        assert sql(database, "SELECT version FROM field_schema") == [(2,)]
        assert log.snapshot_list() == []
        assert [e.data["n"] for e in log.read()] == [1]

    def test_durability_is_asked_of_every_commit(
        self, opener: Callable[..., PostgresEventLog], database: str
    ) -> None:
        sql(database, f'ALTER DATABASE "{database.rsplit("/", 1)[1]}" SET synchronous_commit = off')
        log = opener()
        log.append([entry(1)])
        writer = log._writer
        assert writer is not None
        assert writer.execute("SHOW synchronous_commit").fetchone() == ("on",)

    def test_the_lock_returns_what_others_appended_and_holds_them_off(
        self, opener: Callable[..., PostgresEventLog]
    ) -> None:
        """A node locks at its position: it gets the entries another node appended since,
        and the other's next append waits until this node's append has committed, then
        goes after it."""
        mine, other = opener(), opener()
        mine.append([entry(1)])
        other.append([entry(2), entry(3)])
        assert positions(mine.lock(1)) == [2, 3]
        assert mine.lock(3) == []  # locking again starts afresh
        done = threading.Event()
        got: list[list[int]] = []

        def append_elsewhere() -> None:
            got.append(other.append([entry(5)]))
            done.set()

        thread = threading.Thread(target=append_elsewhere)
        thread.start()
        assert not done.wait(0.3)  # held off by the lock (a bounded wait, not a sleep)
        assert mine.append([entry(4)]) == [4]  # right after what the lock returned
        thread.join()
        assert got == [[5]]
        assert [e.data["n"] for e in mine.read()] == [1, 2, 3, 4, 5]
        assert mine.head() == 5

    def test_unlock_appends_nothing_and_frees_the_head(
        self, opener: Callable[..., PostgresEventLog]
    ) -> None:
        mine, other = opener(), opener()
        assert mine.lock(0) == []
        mine.unlock()
        assert other.append([entry(1)]) == [1]
        assert positions(mine.lock(0)) == [1]
        mine.unlock()
        mine.unlock()  # idempotent

    async def test_follow_reports_each_commit(
        self, opener: Callable[..., PostgresEventLog]
    ) -> None:
        """The head each commit announces reaches a follower on another connection."""
        follower, writer = opener(), opener()
        heads = follower.follow()
        assert await anext(heads) == 0  # the head as it is when following starts
        writer.append([entry(1)])
        assert await asyncio.wait_for(anext(heads), 5) == 1
        writer.append([entry(2), entry(3)])
        assert await asyncio.wait_for(anext(heads), 5) == 3
        await heads.aclose()

    def test_two_appenders_never_share_a_position(
        self, opener: Callable[..., PostgresEventLog]
    ) -> None:
        """Two logs on one database append at once: the database serializes them, each
        append waits for the other's commit and takes the next positions (no conflict
        error), and the log stays dense."""
        logs = [opener(), opener()]
        got: list[list[int]] = [[], []]
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def append(i: int) -> None:
            try:
                start.wait()
                for n in range(100):
                    got[i].extend(logs[i].append([entry(n, by=i), entry(n, by=i, second=1)]))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=append, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert not set(got[0]) & set(got[1])
        assert sorted(got[0] + got[1]) == list(range(1, 401))
        stored = logs[0].read(0, 1000)
        assert positions(stored) == list(range(1, 401))
        for i in (0, 1):
            # each batch stayed whole and in the writer's order
            mine = [e for e in stored if e.data["by"] == i]
            assert [e.position for e in mine] == got[i]
            for a, b in zip(mine[::2], mine[1::2], strict=True):
                assert b.position == a.position + 1 and "second" in b.data

    def test_a_lock_held_elsewhere_refuses_the_append(
        self, opener: Callable[..., PostgresEventLog], database: str, monkeypatch: Any
    ) -> None:
        monkeypatch.setattr(pg_module, "LOCK_TIMEOUT_MS", 100)
        log = opener()
        log.append([entry(1)])
        with psycopg.connect(database) as other:
            other.execute("SELECT * FROM field_log_head FOR UPDATE")  # holds the head row
            with pytest.raises(LogUnavailable) as info:
                log.append([entry(2)])
            assert info.value.code == Code.LOG_UNAVAILABLE and info.value.recoverable
            assert positions(log.read()) == [1]  # reads go on
            other.rollback()
        assert log.append([entry(2)]) == [2]

    def test_a_lost_connection_is_opened_again(
        self, opener: Callable[..., PostgresEventLog], database: str
    ) -> None:
        log = opener()
        log.append([entry(1)])
        assert positions(log.read()) == [1]
        killed = sql(
            database,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        assert len(killed) == 2  # the writer and the reader
        with pytest.raises(LogUnavailable):
            log.append([entry(2)])  # the writer finds out
        with pytest.raises(LogUnavailable):
            log.read()  # and so does the reader
        assert log.append([entry(2)]) == [2]  # both connect again
        assert positions(log.read()) == [1, 2]

    def test_an_unreachable_server_is_refused_at_opening(self) -> None:
        require_postgres()
        url = "postgresql://nobody:secret@127.0.0.1:1/nothing"
        with pytest.raises(OperationalError) as info:
            PostgresEventLog(url)
        assert "postgresql://127.0.0.1:1/nothing" in info.value.message
        assert "secret" not in info.value.message and "nobody" not in info.value.message

    def test_read_positions_ignores_positions_beyond_bigint(
        self, opener: Callable[..., PostgresEventLog]
    ) -> None:
        log = opener()
        log.append(batch(1, 3))
        assert positions(log.read_positions([2, 2**70, -5, 0])) == [2]

    def test_killed_process_loses_no_entry(self, database: str) -> None:
        acknowledged = acknowledged_before_kill(_APPENDER, database)
        assert acknowledged == list(range(1, 91))
        log = PostgresEventLog(database)
        try:
            stored = {e.position: e for e in log.iterate()}
            assert set(acknowledged) <= set(stored)
            assert sorted(stored) == list(range(1, log.last_position() + 1))
            assert len(stored) % 3 == 0
            for position in acknowledged:
                assert stored[position].data == {"i": (position - 1) // 3, "j": (position - 1) % 3}
        finally:
            log.close()


_APPENDER = """
import sys
from field.store import LogEntry
from field.store.postgres import PostgresEventLog

log = PostgresEventLog(sys.argv[1])
for i in range(int(sys.argv[2])):
    batch = [LogEntry(epoch=i, kind="k", data={"i": i, "j": j}) for j in range(3)]
    print(" ".join(map(str, log.append(batch))), flush=True)
"""


class TestOpenLogPostgres:
    def test_a_url_opens_a_shared_postgres_log(self, database: str) -> None:
        log = open_log(None, url=database)
        try:
            assert isinstance(log, PostgresEventLog) and log.shared
            assert log.location() == {
                "host": "127.0.0.1",
                "port": 5432,
                "name": database.rsplit("/", 1)[1],
            }
        finally:
            log.close()

    def test_other_urls_are_refused(self) -> None:
        with pytest.raises(ValueError, match="postgresql://"):
            open_log(None, url="mysql://root@localhost/db")

    def test_redaction_drops_user_and_password(self) -> None:
        shown = redact_log_url("postgresql://alice:s3cret@db.example.com:6432/field")
        assert shown == "postgresql://db.example.com:6432/field"

    @pytest.mark.parametrize(
        ("url", "shown"),
        [
            ("postgres://alice@db/field", "postgresql://db:5432/field"),
            ("postgresql://alice:s3cret@db", "postgresql://db:5432/alice"),  # libpq: user's db
            ("postgresql://a%40b:p%2Fw@[::1]:6432/f%20x", "postgresql://[::1]:6432/f x"),
            ("postgresql:///field?host=db&port=6432&password=s3cret", "postgresql://db:6432/field"),
            ("postgresql://", "postgresql://localhost:5432/"),
        ],
    )
    def test_redaction_keeps_host_port_and_database(self, url: str, shown: str) -> None:
        assert redact_log_url(url) == shown

    def test_redaction_needs_no_driver(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(pg_module, "psycopg", None)
        shown = redact_log_url("postgresql://alice:s3cret@db.example.com:6432/field")
        assert shown == "postgresql://db.example.com:6432/field"

    def test_without_the_driver_opening_says_where_and_what_to_install(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(pg_module, "psycopg", None)
        with pytest.raises(OperationalError) as refused:
            open_log(None, url="postgresql://alice:s3cret@db.example.com:6432/field")
        error = refused.value
        assert error.message.startswith(
            "Cannot open the event log postgresql://db.example.com:6432/field: "
        )
        assert "psycopg driver, which is not installed" in error.message
        assert error.suggested_action == (
            "Install the postgres extra: pip install 'akashik-field[postgres]'"
        )
        assert "s3cret" not in error.message and "alice" not in error.message

    def test_a_refused_connection_names_the_host_without_credentials(self) -> None:
        with pytest.raises(OperationalError) as refused:
            open_log(None, url="postgresql://alice:s3cret@127.0.0.1:1/field")
        message = refused.value.message
        assert message.startswith("Cannot open the event log postgresql://127.0.0.1:1/field: ")
        assert "refused" in message.lower()
        assert "s3cret" not in message and "alice" not in message


def test_the_log_url_comes_from_the_environment_and_is_checked() -> None:
    from field.server.config import Config

    config = Config.from_env({"FIELD_LOG": "postgresql://u:pw@db/field"})
    assert config.log == "postgresql://u:pw@db/field"
    assert "pw" not in repr(config)
    assert Config.from_env({"FIELD_LOG": ""}).log is None
    with pytest.raises(ValueError, match="postgresql://"):
        Config.from_env({"FIELD_LOG": "sqlite:///tmp/x"})


def test_a_lease_left_hanging_is_taken_back(database: str, monkeypatch: Any) -> None:
    """A node that locks and then never appends (hung, or cut off) holds the others up for
    LEASE_TIMEOUT_MS at most: the database ends its session, and its next call reports
    the log unavailable (and connects again)."""
    monkeypatch.setattr(pg_module, "LEASE_TIMEOUT_MS", 300)
    hung, other = PostgresEventLog(database), PostgresEventLog(database)
    try:
        hung.lock(0)
        assert other.append([entry(1)]) == [1]  # waited for the lease to be taken back
        with pytest.raises(LogUnavailable):
            hung.append([entry(2)])
        assert positions(hung.lock(0)) == [1]
        assert hung.append([entry(2)]) == [2]
    finally:
        hung.close()
        other.close()


def test_a_lock_lost_with_its_connection_is_not_appended_after(database: str) -> None:
    """A node whose connection (and with it the head row's lock) is found lost when it
    appends refuses the append rather than writing after the head it locked on a new
    connection, outside any transaction: another node may have appended meanwhile, and
    the head would move back. Its next lock reads what that node appended."""
    mine, other = PostgresEventLog(database), PostgresEventLog(database)
    try:
        assert mine.lock(0) == []
        mine._writer.close()  # the session ends: the lock goes with it
        assert other.append(batch(1, 3)) == [1, 2, 3]
        with pytest.raises(LogUnavailable):
            mine.append([entry(4)])
        assert other.head() == 3 and positions(other.read(0, 10)) == [1, 2, 3]
        assert positions(mine.lock(0)) == [1, 2, 3]
        assert mine.append([entry(4)]) == [4]
        assert other.append([entry(5)]) == [5]
    finally:
        mine.close()
        other.close()


def test_a_node_stopped_amid_its_append_holds_the_others_for_the_lease_at_most(
    database: str, monkeypatch: Any
) -> None:
    """The batch goes in with one statement: a node stopped amid its append (between its
    statements: the INSERT done, the COMMIT not sent) leaves a session idle in its
    transaction, which the database ends after LEASE_TIMEOUT_MS; the other nodes' appends
    go on, the stopped node's batch is not stored and its next append is refused."""
    monkeypatch.setattr(pg_module, "LEASE_TIMEOUT_MS", 300)
    stopped, other = PostgresEventLog(database), PostgresEventLog(database)
    resume, inserted = threading.Event(), threading.Event()
    writer = stopped._writer_conn()

    class _StopsAfterInsert:
        def __getattr__(self, name: str) -> Any:
            return getattr(writer, name)

        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            result = writer.execute(query, *args, **kwargs)
            if query == pg_module._INSERT:
                inserted.set()
                resume.wait(30)  # stopped: nothing more is sent
            return result

    proxy = _StopsAfterInsert()
    stopped._writer_conn = lambda: proxy  # type: ignore[method-assign]
    outcome: list[Any] = []

    def append() -> None:
        try:
            outcome.append(stopped.append(batch(1, 2)))
        except LogUnavailable as error:
            outcome.append(error)

    thread = threading.Thread(target=append)
    thread.start()
    try:
        assert inserted.wait(30)
        assert other.append([entry(7)]) == [1]  # waited for the lease to be taken back
        resume.set()
        thread.join(30)
        assert isinstance(outcome[0], LogUnavailable)
        assert positions(other.read(0, 10)) == [1]
    finally:
        resume.set()
        thread.join(30)
        stopped.close()
        other.close()


class _LostAtCommit:
    """The writer's connection, whose COMMIT is cut off as it is sent: ``landed`` says
    whether the database committed before the connection went."""

    def __init__(self, conn: Any, url: str, landed: bool) -> None:
        self._conn, self._url, self._landed = conn, url, landed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if query != "COMMIT":
            return self._conn.execute(query, *args, **kwargs)
        if self._landed:
            self._conn.execute(query)
        else:  # the session ends before the COMMIT reaches it: the transaction is lost
            sql(self._url, "SELECT pg_terminate_backend(%s)", self._conn.info.backend_pid)
        raise psycopg.OperationalError("server closed the connection unexpectedly")


@pytest.mark.parametrize("landed", [True, False], ids=["committed", "lost"])
def test_an_append_whose_commit_was_cut_off_says_what_the_database_holds(
    opener: Callable[..., PostgresEventLog], database: str, landed: bool
) -> None:
    """A batch whose COMMIT failed with the connection was stored, or not: the log asks
    the database which before it answers, so a write that was stored is acknowledged
    (a client told LOG_UNAVAILABLE would send it again and store it twice) and one that
    was not is refused."""
    log = opener()
    log.append([entry(1)])
    writer = log._writer_conn()
    log._writer_conn = lambda: _LostAtCommit(writer, database, landed)  # type: ignore[method-assign]
    if landed:
        assert log.append(batch(2, 3)) == [2, 3, 4]
    else:
        with pytest.raises(LogUnavailable):
            log.append(batch(2, 3))
    del log._writer_conn  # the real one again, reconnecting
    stored = [e.position for e in log.read(0, 10)]
    assert stored == ([1, 2, 3, 4] if landed else [1])
    assert log.append([entry(9)]) == [stored[-1] + 1]
