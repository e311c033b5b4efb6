"""The PostgreSQL event log: the shared contract, and what only a database server brings.

Each test gets a database of its own, created for it and dropped after it
(:mod:`tests.postgres_util`); without a reachable server they are skipped, naming the URL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from field.errors import Code, LogUnavailable, OperationalError
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

    def test_a_second_owner_is_refused(self, opener: Callable[..., PostgresEventLog]) -> None:
        owner = opener(exclusive=True)
        with pytest.raises(OperationalError) as info:
            opener(exclusive=True)
        assert "in use by another field process" in info.value.message
        owner.close()  # closing the connection releases the lock
        opener(exclusive=True).close()

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
        log = opener(exclusive=True)
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
        assert log.append([entry(2)]) == [2]  # both connect again, the lock is retaken
        assert positions(log.read()) == [1, 2]
        with pytest.raises(OperationalError):
            opener(exclusive=True)

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
        log = PostgresEventLog(database, exclusive=True)  # the dead process's lock is gone
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

log = PostgresEventLog(sys.argv[1], exclusive=True)
for i in range(int(sys.argv[2])):
    batch = [LogEntry(epoch=i, kind="k", data={"i": i, "j": j}) for j in range(3)]
    print(" ".join(map(str, log.append(batch))), flush=True)
"""


class TestOpenLogPostgres:
    def test_a_url_opens_an_owned_postgres_log(self, database: str) -> None:
        log = open_log(None, url=database)
        try:
            assert isinstance(log, PostgresEventLog) and log.exclusive
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


def test_the_log_url_comes_from_the_environment_and_is_checked() -> None:
    from field.config import Config

    config = Config.from_env({"FIELD_LOG": "postgresql://u:pw@db/field"})
    assert config.log == "postgresql://u:pw@db/field"
    assert "pw" not in repr(config)
    assert Config.from_env({"FIELD_LOG": ""}).log is None
    with pytest.raises(ValueError, match="postgresql://"):
        Config.from_env({"FIELD_LOG": "sqlite:///tmp/x"})
