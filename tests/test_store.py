"""Tests of the event log backends.

:class:`EventLogContract` holds the behaviour every backend promises (the
invariants of :mod:`field.store.base`); each backend's test class
subclasses it and adds its own backend-specific tests.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import field
from field.contract.errors import LogWriteError, OperationalError, StorageFull
from field.store import (
    EventLog,
    LogEntry,
    MemoryEventLog,
    SQLiteEventLog,
    StoredEntry,
    open_log,
)

REPO_ROOT = Path(field.__file__).resolve().parent.parent


def entry(n: int, **data: Any) -> LogEntry:
    """A small entry whose data identifies it by ``n``."""
    return LogEntry(epoch=n, kind="test", data={"n": n, **data}, agent_id=f"agent-{n}", ts=n / 2)


def batch(start: int, size: int) -> list[LogEntry]:
    return [entry(n) for n in range(start, start + size)]


def positions(entries: list[StoredEntry]) -> list[int]:
    return [e.position for e in entries]


@pytest.fixture
def fast_thread_switching() -> Iterator[None]:
    """Switch threads often, so a reader really runs between a writer's appends."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


class EventLogContract:
    """The contract of :class:`EventLog`; subclasses provide :meth:`make_log`."""

    def make_log(self, tmp_path: Path) -> EventLog:
        raise NotImplementedError

    @pytest.fixture
    def log(self, tmp_path: Path) -> Iterator[EventLog]:
        log = self.make_log(tmp_path)
        try:
            yield log
        finally:
            log.close()

    def test_empty_log(self, log: EventLog) -> None:
        assert log.last_position() == 0
        assert log.read() == []
        assert list(log.iterate()) == []

    def test_append_nothing(self, log: EventLog) -> None:
        assert log.append([]) == []
        assert log.last_position() == 0

    def test_positions_are_contiguous_from_one(self, log: EventLog) -> None:
        assert log.append(batch(1, 3)) == [1, 2, 3]
        assert log.append(batch(4, 1)) == [4]
        assert log.append([]) == []
        assert log.append(batch(5, 5)) == [5, 6, 7, 8, 9]
        assert log.last_position() == 9
        stored = log.read()
        assert positions(stored) == list(range(1, 10))
        assert [e.data["n"] for e in stored] == list(range(1, 10))

    def test_a_large_batch_is_stored_whole_and_exactly(self, log: EventLog) -> None:
        """A batch of a few hundred entries reads back exactly: positions, epochs,
        kinds, agents (or none), times to the bit, data."""
        rng = random.Random(7)
        entries = [
            LogEntry(
                epoch=n,
                kind=f"kind-{n % 3}",
                data={"n": n, "text": "x" * rng.randrange(50)},
                agent_id=None if n % 5 == 0 else f"agent-{n}",
                ts=1.7e9 + rng.random() * 1e6,
            )
            for n in range(1, 301)
        ]
        assert log.append(entries) == list(range(1, 301))
        stored = log.read(0, 1000)
        assert positions(stored) == list(range(1, 301))
        assert [(e.epoch, e.kind, e.agent_id, e.ts, e.data) for e in stored] == [
            (e.epoch, e.kind, e.agent_id, e.ts, e.data) for e in entries
        ]
        assert log.append(batch(1, 1)) == [301]

    def test_read_pages_in_order(self, log: EventLog) -> None:
        log.append(batch(1, 10))
        assert positions(log.read(0, 4)) == [1, 2, 3, 4]
        assert positions(log.read(4, 4)) == [5, 6, 7, 8]
        assert positions(log.read(8, 4)) == [9, 10]
        assert log.read(10, 4) == []
        assert log.read(50) == []
        assert log.read(3, 0) == []
        assert positions(log.read(-5, 2)) == [1, 2]

    def test_read_rejects_negative_limit(self, log: EventLog) -> None:
        with pytest.raises(ValueError):
            log.read(0, -1)

    def test_iterate_over_several_pages(self, log: EventLog) -> None:
        for start in range(1, 26, 5):
            log.append(batch(start, 5))
        assert positions(list(log.iterate(page=4))) == list(range(1, 26))
        assert positions(list(log.iterate(after=20, page=3))) == [21, 22, 23, 24, 25]

    def test_entries_round_trip_exactly(self, log: EventLog) -> None:
        data = {
            "text": 'ñ 日本語 🎉 \u0000 "quoted"',
            "nested": {"list": [1, -2, 2.5, None, True, False, {"deep": ["x"]}], "empty": {}},
            "big": 2**62,
            "float": 1e-300,
        }
        given = [
            LogEntry(epoch=3, kind="unit.created", data=data, agent_id=None, ts=1712345678.123456),
            LogEntry(epoch=2**40, kind="ключ", data={}, agent_id="agent-é", ts=0.0),
            LogEntry(epoch=0, kind="", data={"a": 1}),
        ]
        assert log.append(given) == [1, 2, 3]
        expected = [
            StoredEntry(i + 1, e.epoch, e.kind, e.data, e.agent_id, e.ts)
            for i, e in enumerate(given)
        ]
        assert log.read() == expected
        assert isinstance(log.read()[1].ts, float)

    @pytest.mark.parametrize(
        "bad",
        [
            LogEntry(epoch=1, kind="k", data={"x": object()}),
            LogEntry(epoch=1, kind="k", data={"x": {1, 2}}),
            LogEntry(epoch=1, kind="k", data={1: "non-string key"}),
            LogEntry(epoch=1, kind="k", data={"x": 2**70}),
            LogEntry(epoch=1, kind="k", data=["not", "a", "dict"]),  # type: ignore[arg-type]
            LogEntry(epoch="1", kind="k", data={}),  # type: ignore[arg-type]
            LogEntry(epoch=2**63, kind="k", data={}),
            LogEntry(epoch=1, kind=None, data={}),  # type: ignore[arg-type]
            LogEntry(epoch=1, kind="k", data={}, agent_id=7),  # type: ignore[arg-type]
            LogEntry(epoch=1, kind="k", data={}, ts=float("nan")),
        ],
        ids=[
            "object",
            "set",
            "int-key",
            "huge-int",
            "list-data",
            "str-epoch",
            "epoch-overflow",
            "kind-none",
            "int-agent",
            "nan-ts",
        ],
    )
    def test_append_is_atomic(self, log: EventLog, bad: LogEntry) -> None:
        log.append(batch(1, 2))
        with pytest.raises(LogWriteError) as info:
            log.append([entry(3), bad, entry(5)])
        assert info.value.details == {"index": 1}
        assert log.last_position() == 2
        assert positions(log.read()) == [1, 2]
        assert log.append(batch(3, 2)) == [3, 4]
        assert [e.data["n"] for e in log.read()] == [1, 2, 3, 4]

    def test_caller_mutation_does_not_change_the_log(self, log: EventLog) -> None:
        data: dict[str, Any] = {"items": [1, 2], "inner": {"k": "v"}}
        log.append([LogEntry(epoch=1, kind="k", data=data)])
        data["items"].append(3)
        data["inner"]["k"] = "changed"
        data["new"] = True
        assert log.read()[0].data == {"items": [1, 2], "inner": {"k": "v"}}

    def test_reader_mutation_does_not_change_the_log(self, log: EventLog) -> None:
        log.append([LogEntry(epoch=1, kind="k", data={"items": [1]})])
        log.read()[0].data["items"].append(2)
        assert log.read()[0].data == {"items": [1]}

    def test_concurrent_reads_see_only_whole_batches(
        self, log: EventLog, fast_thread_switching: None
    ) -> None:
        size, count = 7, 60
        done = threading.Event()
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def write() -> None:
            try:
                start.wait()
                for i in range(count):
                    log.append(batch(i * size + 1, size))
            except BaseException as exc:  # reported in the main thread
                errors.append(exc)
            finally:
                done.set()

        writer = threading.Thread(target=write)
        writer.start()
        start.wait()
        reads = 0
        while True:
            finished = done.is_set()
            seen = log.read(0, 10**6)
            reads += 1
            assert len(seen) % size == 0, f"saw {len(seen)} entries: a partial batch"
            assert positions(seen) == list(range(1, len(seen) + 1))
            # last_position() is the writer's view: it may lag a concurrent
            # reader by the batch being committed, never more.
            assert log.last_position() >= len(seen) - size
            if finished:
                break
        writer.join()
        assert errors == []
        assert reads >= 1
        assert log.last_position() == size * count
        assert len(log.read(0, 10**6)) == size * count


class TestMemoryEventLog(EventLogContract):
    def make_log(self, tmp_path: Path) -> EventLog:
        return MemoryEventLog()

    def test_attributes(self) -> None:
        assert MemoryEventLog.persistent is False
        assert MemoryEventLog.backend == "memory"


# A child process that appends batches of 3 and prints each batch's positions.
_APPENDER = """
import sys
from field.store import LogEntry, SQLiteEventLog

log = SQLiteEventLog(sys.argv[1])
for i in range(int(sys.argv[2])):
    batch = [LogEntry(epoch=i, kind="k", data={"i": i, "j": j}) for j in range(3)]
    print(" ".join(map(str, log.append(batch))), flush=True)
"""


class TestSQLiteEventLog(EventLogContract):
    def make_log(self, tmp_path: Path) -> EventLog:
        return SQLiteEventLog(tmp_path / "field.db")

    @pytest.fixture
    def opener(self, tmp_path: Path) -> Iterator[Callable[..., SQLiteEventLog]]:
        """Open logs on ``tmp_path/field.db``; every one is closed at teardown."""
        opened: list[SQLiteEventLog] = []

        def open_(**kwargs: Any) -> SQLiteEventLog:
            log = SQLiteEventLog(tmp_path / "field.db", **kwargs)
            opened.append(log)
            return log

        yield open_
        for log in opened:
            log.close()

    def test_attributes(self) -> None:
        assert SQLiteEventLog.persistent is True
        assert SQLiteEventLog.backend == "sqlite"

    def test_survives_close_and_reopen(self, opener: Callable[..., SQLiteEventLog]) -> None:
        first = opener()
        first.append(batch(1, 3))
        first.close()
        second = opener()
        assert second.last_position() == 3
        assert second.append(batch(4, 2)) == [4, 5]
        second.close()
        third = opener(synchronous="normal")
        assert [e.data["n"] for e in third.read()] == [1, 2, 3, 4, 5]
        assert third.read()[0] == StoredEntry(1, 1, "test", {"n": 1}, "agent-1", 0.5)

    @pytest.mark.parametrize("value", ["FULL", "off", "", "extra"])
    def test_synchronous_is_validated(self, tmp_path: Path, value: str) -> None:
        with pytest.raises(ValueError):
            SQLiteEventLog(tmp_path / "field.db", synchronous=value)
        assert not (tmp_path / "field.db").exists()

    @pytest.mark.parametrize("value", ["full", "normal"])
    def test_synchronous_is_applied(
        self, opener: Callable[..., SQLiteEventLog], value: str
    ) -> None:
        log = opener(synchronous=value)
        level = log._writer.execute("PRAGMA synchronous").fetchone()[0]  # type: ignore[union-attr]
        assert level == {"full": 2, "normal": 1}[value]

    def test_second_open_is_refused(self, opener: Callable[..., SQLiteEventLog]) -> None:
        first = opener()
        first.append(batch(1, 1))
        with pytest.raises(OperationalError, match="in use by another field process"):
            opener()
        assert first.append(batch(2, 1)) == [2]
        first.close()
        again = opener()
        assert again.last_position() == 2

    def test_close_is_idempotent(self, opener: Callable[..., SQLiteEventLog]) -> None:
        log = opener()
        log.close()
        log.close()
        with pytest.raises(LogWriteError):
            log.append(batch(1, 1))
        with pytest.raises(OperationalError):
            log.read()
        with pytest.raises(OperationalError):
            log.last_position()

    def test_foreign_schema_version_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "field.db"
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA user_version = 7")
        with pytest.raises(OperationalError, match="schema version 7"):
            SQLiteEventLog(path)
        # The refusal released the lock: a good file opens afterwards.
        path.unlink()
        SQLiteEventLog(path).close()

    def test_schema_version_is_written(self, opener: Callable[..., SQLiteEventLog]) -> None:
        log = opener()
        log.close()
        with contextlib.closing(sqlite3.connect(log.path)) as conn:
            assert conn.execute("PRAGMA user_version").fetchone()[0] == 1

    def test_not_a_database_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "field.db"
        path.write_bytes(b"this is not an SQLite database, just some bytes" * 100)
        with pytest.raises(OperationalError, match="Cannot open the event log"):
            SQLiteEventLog(path)

    def test_journal_mode_is_wal_on_disk(self, opener: Callable[..., SQLiteEventLog]) -> None:
        log = opener()
        log.append(batch(1, 1))
        with contextlib.closing(sqlite3.connect(log.path)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def test_full_database_raises_storage_full(self, opener: Callable[..., SQLiteEventLog]) -> None:
        log = opener()
        log.append(batch(1, 1))
        writer = log._writer
        assert writer is not None
        pages = writer.execute("PRAGMA page_count").fetchone()[0]
        writer.execute(f"PRAGMA max_page_count = {pages}")
        # The small first entry fits; the big second one does not: both roll back.
        big = [entry(2), LogEntry(epoch=1, kind="k", data={"blob": "x" * 100_000})]
        with pytest.raises(StorageFull) as info:
            log.append(big)
        assert isinstance(info.value.__cause__, sqlite3.Error)
        assert log.last_position() == 1
        assert positions(log.read()) == [1]
        writer.execute("PRAGMA max_page_count = 1073741823")
        assert log.append(big) == [2, 3]
        assert positions(log.read()) == [1, 2, 3]

    def test_killed_process_loses_no_entry(self, tmp_path: Path) -> None:
        path = tmp_path / "field.db"
        acknowledged = acknowledged_before_kill(_APPENDER, str(path))
        assert acknowledged == list(range(1, 91))
        log = SQLiteEventLog(path)
        try:
            stored = {e.position: e for e in log.iterate()}
            assert set(acknowledged) <= set(stored)
            assert sorted(stored) == list(range(1, log.last_position() + 1))
            assert len(stored) % 3 == 0
            for position in acknowledged:
                assert stored[position].data == {
                    "i": (position - 1) // 3,
                    "j": (position - 1) % 3,
                }
        finally:
            log.close()


class TestOpenLog:
    def test_none_is_memory(self) -> None:
        log = open_log(None)
        assert isinstance(log, MemoryEventLog)
        log.close()

    def test_directory_is_created(self, tmp_path: Path) -> None:
        data_dir = tmp_path / "a" / "b"
        log = open_log(data_dir, synchronous="normal")
        try:
            assert isinstance(log, SQLiteEventLog)
            assert (data_dir / "field.db").exists()
            assert log.synchronous == "normal"
        finally:
            log.close()

    def test_synchronous_is_validated(self) -> None:
        with pytest.raises(ValueError):
            open_log(None, synchronous="off")


def acknowledged_before_kill(script: str, target: str) -> list[int]:
    """Run an appender ``script`` on ``target`` in a child process, read the positions of its
    first 30 acknowledged batches, then SIGKILL it; returns those positions."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-c", script, target, "100000"]
    acknowledged: list[int] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for _ in range(30):
            line = proc.stdout.readline()
            if not line:
                proc.kill()
                pytest.fail(f"appender died: {proc.stderr.read()}")
            acknowledged.extend(int(p) for p in line.split())
        proc.kill()
        proc.wait()
    assert proc.returncode == -9
    return acknowledged
