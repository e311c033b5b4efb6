"""Snapshots kept by the SQLite and PostgreSQL logs, and start-up from them.

One contract class, run on both backends: snapshots written and listed,
the newest two kept, start-up from the newest usable one (the state the
whole log gives), and every snapshot that must not be trusted (damaged,
truncated, of another Field, of another embedder, of a newer format, past
the log's end, of another history) passed over with a warning that says
why, for the one before it or for a replay of the whole log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import pytest

from field.contract.errors import LogWriteError, OperationalError
from field.contract.model import LogEntry
from field.core import snapshot
from field.core.field import Field
from field.core.snapshot import FORMAT
from field.engine import snapshotter as snapshots_module
from field.engine.snapshotter import SnapshotPolicy, Snapshotter, Written, load, write_snapshot
from field.ranking.embedding import HashingEmbedder
from field.server.config import Config
from field.store import EventLog, SQLiteEventLog
from field.store.snapshot_store import KEEP, FileSnapshots, SnapshotStore, StoredSnapshot

from . import snapshot_cases as cases
from .core_util import Harness
from .postgres_util import fresh_database

Logs = Callable[[str], EventLog]


#: The Field writing each log of a test (by the log's id), so that a log grows as one.
_WRITERS: dict[int, Harness] = {}


def filled(log: EventLog, seed: int = 0, length: int = 300, *, field_id: str | None = None) -> None:
    """Run ``length`` random steps on ``log``'s Field and append what they wrote (to a new
    log: as the Field ``field_id`` if given; every harness makes the same ids)."""
    h = _WRITERS.setdefault(id(log), cases.harness())
    start = log.last_position()
    for step in cases.random_history(seed, length):
        cases.play(h, step)
    entries = h.entries[start:]
    if field_id is not None and start == 0:
        entries = [dataclasses.replace(entries[0], data={"field_id": field_id}), *entries[1:]]
    log.append(entries)


@pytest.fixture(autouse=True)
def _forget_writers() -> Iterator[None]:
    yield
    _WRITERS.clear()


def full_replay(log: EventLog) -> Field:
    field = Field()
    field.replay(log.iterate())
    return field


def started(log: EventLog, **kwargs: Any) -> tuple[Field, StoredSnapshot | None]:
    field = Field(**kwargs)
    return field, load(field, log)


def snap(log: EventLog, **kwargs: Any) -> Written:
    return write_snapshot(log, Field(**kwargs))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


class SnapshotContract:
    """What snapshots do on every log that keeps them (``logs(name)``: a log of its own
    per name, the same one for the same name)."""

    @pytest.fixture
    def logs(self) -> Iterator[Logs]:
        raise NotImplementedError

    def store(self, log: EventLog) -> SnapshotStore:
        store = log.snapshots()
        assert store is not None
        return store

    def test_no_snapshot_means_the_whole_log(self, logs: Logs) -> None:
        log = logs("a")
        filled(log)
        field, snapshot_used = started(log)
        assert snapshot_used is None
        assert self.store(log).list() == []
        assert cases.canonical(field.state) == cases.canonical(full_replay(log).state)

    def test_start_from_the_newest_snapshot_and_the_entries_after_it(
        self, logs: Logs, caplog: pytest.LogCaptureFixture
    ) -> None:
        log = logs("a")
        filled(log, seed=1)
        first = snap(log)
        assert (first.started_from, first.skipped) == (None, None)
        assert first.position == log.last_position()
        filled(log, seed=2, length=100)
        second = snap(log)
        assert second.started_from == first.position
        assert second.replayed == log.last_position() - first.position
        again = snap(log)  # nothing new: nothing written
        assert again.skipped is not None and again.position == second.position
        filled(log, seed=3, length=100)
        caplog.set_level(logging.INFO, "field.snapshots")
        field, used = started(log)
        assert used is not None and used.position == second.position
        assert any("started from the snapshot at position" in m for m in caplog.messages)
        assert not warnings(caplog)
        assert cases.canonical(field.state) == cases.canonical(full_replay(log).state)

    def test_the_newest_two_are_kept(self, logs: Logs) -> None:
        log = logs("a")
        positions = []
        for seed in range(4):
            filled(log, seed=seed, length=40)
            positions.append(snap(log).position)
        listed = self.store(log).list()
        assert [s.position for s in listed] == positions[::-1][:KEEP]
        assert all(s.size > 0 for s in listed)

    def test_a_damaged_newest_snapshot_gives_way_to_the_one_before(
        self, logs: Logs, caplog: pytest.LogCaptureFixture
    ) -> None:
        log = logs("a")
        filled(log, seed=4)
        older = snap(log)
        filled(log, seed=5, length=60)
        newer = snap(log)
        data = bytearray(self.read(log, newer.position))
        data[len(data) // 2] ^= 0x01
        self.replace(log, newer.position, bytes(data))
        field, used = started(log)
        assert used is not None and used.position == older.position
        assert [m for m in warnings(caplog) if f"position {newer.position}" in m]
        assert "checksum" in warnings(caplog)[0]
        assert cases.canonical(field.state) == cases.canonical(full_replay(log).state)

    @pytest.mark.parametrize(
        ("damage", "said"),
        [
            (lambda data: data[: len(data) // 3], "checksum"),
            (lambda data: data[:10], "shorter"),
            (lambda data: b"", "shorter"),
            (lambda data: b"not a snapshot at all, but long enough" * 3, "does not begin"),
            (lambda data: cases.rewritten(data, format=FORMAT + 1), "newer"),
        ],
        ids=["truncated", "a-few-bytes", "empty", "foreign-bytes", "newer-format"],
    )
    def test_an_unusable_snapshot_falls_back_to_the_whole_log(
        self,
        logs: Logs,
        caplog: pytest.LogCaptureFixture,
        damage: Callable[[bytes], bytes],
        said: str,
    ) -> None:
        log = logs("a")
        filled(log, seed=6)
        written = snap(log)
        self.replace(log, written.position, damage(self.read(log, written.position)))
        field, used = started(log)
        assert used is None
        told = warnings(caplog)
        assert said in told[0] and f"position {written.position}" in told[0], told
        assert "replaying the whole log" in told[-1]
        assert cases.canonical(field.state) == cases.canonical(full_replay(log).state)

    def test_another_fields_snapshot_is_not_used(
        self, logs: Logs, caplog: pytest.LogCaptureFixture
    ) -> None:
        mine, other = logs("a"), logs("b")
        filled(mine, seed=7)
        filled(other, seed=7, field_id="field-another")
        theirs = snap(other)
        data = self.read(other, theirs.position)
        self.store(mine).write(theirs.position, theirs.written_at, lambda sink: sink(data))
        _, used = started(mine)
        assert used is None
        assert "not of this log's" in warnings(caplog)[0]

    def test_another_embedders_snapshot_is_not_used(
        self, logs: Logs, caplog: pytest.LogCaptureFixture
    ) -> None:
        log = logs("a")
        filled(log, seed=9)
        snap(log, embedder=HashingEmbedder(64))
        _, used = started(log)  # the default embedder: 128 dimensions
        assert used is None
        assert "another projection" in warnings(caplog)[0]
        _, used = started(log, embedder=HashingEmbedder(64))
        assert used is not None

    def test_a_snapshot_past_the_logs_end_is_not_used(
        self, logs: Logs, caplog: pytest.LogCaptureFixture
    ) -> None:
        log = logs("a")
        filled(log, seed=10)
        written = snap(log)
        ahead = written.position + 5  # as if the log were an older copy of itself
        forged = cases.rewritten(self.read(log, written.position), position=ahead)
        self.store(log).write(ahead, written.written_at, lambda sink: sink(forged))
        _, used = started(log)
        assert used is not None and used.position == written.position
        assert "past the log's end" in warnings(caplog)[0]

    def test_a_snapshot_of_another_history_is_not_used(
        self, logs: Logs, caplog: pytest.LogCaptureFixture
    ) -> None:
        one, other = logs("a"), logs("b")
        filled(one, seed=11)
        filled(other, seed=12, length=400)  # the same Field's id, another history
        assert other.last_position() >= one.last_position()
        ours = snap(one)
        data = self.read(one, ours.position)
        self.store(other).write(ours.position, ours.written_at, lambda sink: sink(data))
        _, used = started(other)
        assert used is None
        assert "another history" in warnings(caplog)[0]

    def test_a_tail_that_does_not_fold_on_the_snapshot_means_the_whole_log(
        self, logs: Logs, caplog: pytest.LogCaptureFixture
    ) -> None:
        one, other = logs("a"), logs("b")
        h = cases.harness()
        for i in range(6):
            h.record("lead", f"finding {i}")
        entries = list(h.entries)
        one.append(entries)
        ours = snap(one)
        # the other log: the same entries but an earlier unit's id, then an entry about it;
        # ours has the same Field, position and last entry, and not that unit
        at = next(i for i, e in enumerate(entries) if e.kind == "memory.recorded")
        unit = {**entries[at].data["unit"], "id": "mem-elsewhere"}
        entries[at] = dataclasses.replace(entries[at], data={"unit": unit})
        archived = {"memory_unit_id": "mem-elsewhere", "reason": "compacted"}
        other.append([*entries, LogEntry(10**4, "memory.archived", archived, "lead")])
        data = self.read(one, ours.position)
        self.store(other).write(ours.position, ours.written_at, lambda sink: sink(data))
        field, used = started(other)
        assert used is None
        assert "does not fold on it" in warnings(caplog)[0]
        assert cases.canonical(field.state) == cases.canonical(full_replay(other).state)

    def test_the_snapshot_is_of_the_log_as_it_was_when_it_began(self, logs: Logs) -> None:
        log = logs("a")
        filled(log, seed=13)
        at = log.last_position()
        field = Field()
        real = log.iterate

        def growing(after: int = 0, page: int = 1000) -> Iterator[Any]:
            for entry in real(after, page):  # the server appends while the snapshot is made
                yield entry
                if entry.position == at - 1:
                    log.append([LogEntry(10**6, "clock.reserved", {"until": 10**6 + 1024})])

        log.iterate = growing  # type: ignore[method-assign]
        written = write_snapshot(log, field)
        assert written.position == at
        assert log.last_position() == at + 1

    def test_a_failed_write_leaves_no_snapshot(self, logs: Logs) -> None:
        log = logs("a")
        filled(log)

        def broken(sink: Callable[[bytes], object]) -> None:
            sink(b"the first chunk")
            raise RuntimeError("the writer died")

        with pytest.raises(RuntimeError):
            self.store(log).write(5, 1.0, broken)
        assert self.store(log).list() == []

    # -- backend hooks --------------------------------------------------------------

    def read(self, log: EventLog, position: int) -> bytes:
        store = self.store(log)
        return bytes(store.read(next(s for s in store.list() if s.position == position)))

    def replace(self, log: EventLog, position: int, data: bytes) -> None:
        """Put ``data`` in place of the snapshot at ``position``, bypassing the store."""
        raise NotImplementedError


class TestSQLiteSnapshots(SnapshotContract):
    @pytest.fixture
    def logs(self, tmp_path: Path) -> Iterator[Logs]:
        opened: dict[str, EventLog] = {}

        def log(name: str) -> EventLog:
            if name not in opened:
                (tmp_path / name).mkdir()
                opened[name] = SQLiteEventLog(tmp_path / name / "field.db")
            return opened[name]

        yield log
        for each in opened.values():
            each.close()

    def replace(self, log: EventLog, position: int, data: bytes) -> None:
        store = self.store(log)
        assert isinstance(store, FileSnapshots)
        found = next(s for s in store.list() if s.position == position)
        (store.directory / found.key).write_bytes(data)

    def test_snapshots_are_files_beside_the_log_readable_by_their_owner(
        self, logs: Logs, tmp_path: Path
    ) -> None:
        log = logs("a")
        filled(log)
        written = snap(log)
        (only,) = (tmp_path / "a" / "snapshots").iterdir()
        assert only.stat().st_mode & 0o777 == 0o600
        assert only.stat().st_size == written.size
        header = snapshot.read_header(only.read_bytes()[:4096])
        assert (header.position, header.format) == (written.position, FORMAT)

    def test_a_dead_writers_temporary_file_is_deleted(self, logs: Logs, tmp_path: Path) -> None:
        log = logs("a")
        filled(log)
        directory = tmp_path / "a" / "snapshots"
        directory.mkdir()
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                              capture_output=True, text=True)  # fmt: skip
        gone = directory / f".snapshot-{dead.stdout.strip()}-0123abcd.tmp"
        alive = directory / f".snapshot-{os.getpid()}-4567cdef.tmp"
        gone.write_bytes(b"half a snapshot")
        alive.write_bytes(b"being written")
        snap(log)
        assert not gone.exists() and alive.exists()

    def test_a_read_only_log_reads_beside_its_owner(self, logs: Logs, tmp_path: Path) -> None:
        owner = logs("a")  # holds the lock
        filled(owner)
        reader = SQLiteEventLog(tmp_path / "a" / "field.db", readonly=True)
        try:
            assert reader.last_position() == owner.last_position()
            owner.append([LogEntry(10**6, "clock.reserved", {"until": 10**6 + 1024})])
            assert reader.last_position() == owner.last_position()  # it follows the owner
            with pytest.raises(LogWriteError) as refused:
                reader.append([LogEntry(1, "clock.reserved", {"until": 2})])
            assert "reading only" in refused.value.message
        finally:
            reader.close()
        with pytest.raises(OperationalError):
            SQLiteEventLog(tmp_path / "none" / "field.db", readonly=True)


class TestPostgresSnapshots(SnapshotContract):
    @pytest.fixture
    def logs(self) -> Iterator[Logs]:
        pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")
        from field.store.postgres import PostgresEventLog

        with ExitStack() as stack:
            opened: dict[str, EventLog] = {}

            def log(name: str) -> EventLog:
                if name not in opened:
                    url = stack.enter_context(fresh_database())
                    opened[name] = PostgresEventLog(url)
                    stack.callback(opened[name].close)
                return opened[name]

            yield log

    def replace(self, log: EventLog, position: int, data: bytes) -> None:
        import psycopg

        found = next(s for s in self.store(log).list() if s.position == position)
        with psycopg.connect(log.url, autocommit=True) as conn:  # type: ignore[attr-defined]
            conn.execute("DELETE FROM field_snapshot_chunks WHERE snapshot_id = %s", (found.key,))
            conn.execute(
                "INSERT INTO field_snapshot_chunks (snapshot_id, seq, data) VALUES (%s, 0, %s)",
                (found.key, data),
            )

    @staticmethod
    def chunked(logs: Logs, monkeypatch: pytest.MonkeyPatch) -> tuple[EventLog, Written]:
        """A filled log and its snapshot, written in chunks of 4 KB."""
        monkeypatch.setattr(snapshot, "CHUNK_BYTES", 4096)
        log = logs("a")
        filled(log)
        return log, snap(log)

    def test_a_snapshot_is_rows_of_chunks(
        self, logs: Logs, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import psycopg

        log, written = self.chunked(logs, monkeypatch)
        with psycopg.connect(log.url, autocommit=True) as conn:  # type: ignore[attr-defined]
            rows = conn.execute(
                "SELECT count(*), sum(octet_length(data)) FROM field_snapshot_chunks"
            ).fetchone()
        assert rows is not None and rows[0] > 2 and rows[1] == written.size
        field, used = started(log)
        assert used is not None
        assert cases.canonical(field.state) == cases.canonical(full_replay(log).state)

    def test_a_chunk_gone_while_read_reads_as_truncated_and_is_passed_over(
        self, logs: Logs, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import psycopg

        log, written = self.chunked(logs, monkeypatch)
        (stored,) = self.store(log).list()
        whole = log.snapshot_read(stored.key)  # type: ignore[attr-defined]
        assert len(whole) == written.size
        with psycopg.connect(log.url, autocommit=True) as conn:  # type: ignore[attr-defined]
            sizes = conn.execute(
                "SELECT octet_length(data) FROM field_snapshot_chunks ORDER BY seq"
            ).fetchall()
            conn.execute("DELETE FROM field_snapshot_chunks WHERE seq = 3")
        cut = log.snapshot_read(stored.key)  # type: ignore[attr-defined]
        before_gap = sum(size for (size,) in sizes[:3])
        assert len(sizes) > 4 and cut == whole[:before_gap]  # nothing after the gap
        field, used = started(log)
        assert used is None
        assert cases.canonical(field.state) == cases.canonical(full_replay(log).state)


def test_the_cli_writes_a_snapshot_and_says_so(tmp_path: Path) -> None:
    log = SQLiteEventLog(tmp_path / "field.db")
    try:
        filled(log)
        done = subprocess.run(
            [sys.executable, "-m", "field", "snapshot", "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        report = orjson.loads(done.stdout)
        assert report["position"] == log.last_position() and report["skipped"] is None
        assert [s.position for s in FileSnapshots(tmp_path / "snapshots").list()] == [
            report["position"]
        ]
    finally:
        log.close()
    empty = subprocess.run(
        [sys.executable, "-m", "field", "snapshot", "--data-dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert empty.returncode == 2 and "no event log" in empty.stderr


@pytest.mark.parametrize(
    ("entries", "seconds", "since", "elapsed", "due"),
    [
        (100, 600.0, 0, 10_000.0, False),  # nothing appended: never
        (100, 600.0, 99, 599.0, False),
        (100, 600.0, 100, 0.0, True),  # enough entries
        (100, 600.0, 1, 600.0, True),  # some entries, long enough
        (0, 600.0, 10**6, 599.0, False),  # the count is off
        (100, 0.0, 99, 10**6, False),  # the time is off
        (0, 0.0, 10**6, 10**6, False),  # both off
    ],
)
def test_when_a_snapshot_is_due(
    entries: int, seconds: float, since: int, elapsed: float, due: bool
) -> None:
    policy = SnapshotPolicy(entries=entries, seconds=seconds)
    assert policy.due(entries_since=since, seconds_since=elapsed) is due
    assert policy.enabled is bool(entries or seconds)


def test_the_snapshot_settings_are_read_and_bounded() -> None:
    default = Config.from_env({})
    assert (default.snapshot_entries, default.snapshot_seconds) == (100_000, 600.0)
    config = Config.from_env({"FIELD_SNAPSHOT_ENTRIES": "0", "FIELD_SNAPSHOT_SECONDS": "30"})
    assert config.snapshot_policy() == SnapshotPolicy(entries=0, seconds=30.0)
    assert Config.from_env({}, snapshot_entries=5).snapshot_entries == 5  # a flag wins
    for bad in ({"snapshot_entries": -1}, {"snapshot_seconds": -1.0}, {"snapshot_seconds": 1e9}):
        with pytest.raises(ValueError, match="snapshot_"):
            Config.from_env({}, **bad)
    with pytest.raises(ValueError, match="FIELD_SNAPSHOT_ENTRIES"):
        Config.from_env({"FIELD_SNAPSHOT_ENTRIES": "many"})


# -- the server's side: the snapshot process --------------------------------------------


class _Service:
    """What a Snapshotter reads of the service: the log's end, the snapshot started from."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.started_from: StoredSnapshot | None = None


def _snapshotter(tmp_path: Path, code: str) -> tuple[Snapshotter, SQLiteEventLog]:
    """A Snapshotter whose snapshot process is ``python -c code``."""
    log = SQLiteEventLog(tmp_path / "field.db")
    filled(log, length=20)
    command = ([sys.executable, "-c", code], dict(os.environ))
    return Snapshotter(_Service(log), log.snapshots(), SnapshotPolicy(), command), log  # type: ignore[arg-type]


async def test_a_snapshot_process_reports_what_it_wrote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    report = {"position": 7, "size": 10, "units": 1, "started_from": None, "replayed": 7}
    code = f"import sys; sys.stderr.write('a warning\\n'); print({orjson.dumps(report).decode()!r})"
    snapshotter, log = _snapshotter(tmp_path, code)
    try:
        caplog.set_level(logging.INFO, "field.snapshots")
        assert await snapshotter._write()
        assert (snapshotter.written, snapshotter.failed, snapshotter._base) == (1, 0, 7)
        assert "field snapshot: a warning" in caplog.messages
        assert any("snapshot written at position 7" in m for m in caplog.messages)
        assert snapshotter.status() is None  # the store holds none: nothing to show
    finally:
        log.close()


async def test_a_failed_snapshot_process_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    snapshotter, log = _snapshotter(tmp_path, "import sys; sys.exit(3)")
    try:
        assert not await snapshotter._write()
        assert (snapshotter.written, snapshotter.failed, snapshotter._base) == (0, 1, 0)
        assert any("exit status 3" in m for m in caplog.messages)
    finally:
        log.close()


async def test_stopping_ends_a_snapshot_process_under_way(tmp_path: Path) -> None:
    snapshotter, log = _snapshotter(tmp_path, "import time; time.sleep(60)")
    try:
        writing = asyncio.create_task(snapshotter._write())
        while snapshotter.process is None:  # started on the loop: a turn or two
            await asyncio.sleep(0)
        process = snapshotter.process
        await snapshotter.stop()
        assert process.returncode is not None and process.returncode < 0  # terminated
        assert not await writing
    finally:
        log.close()


async def test_a_node_that_may_not_write_snapshots_starts_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of several nodes, only the one holding the deliveries' lease writes snapshots: while
    ``may_write`` says no, a due snapshot is not started; once it says yes, it is."""
    monkeypatch.setattr(snapshots_module, "CHECK_SECONDS", 0.001)
    report = {"position": 20, "size": 10, "units": 1, "started_from": None, "replayed": 20}
    snapshotter, log = _snapshotter(tmp_path, f"print({orjson.dumps(report).decode()!r})")
    snapshotter.policy = SnapshotPolicy(entries=1, seconds=0)
    asked = 0
    allowed = False
    checked = asyncio.Event()

    def may_write() -> bool:
        nonlocal asked
        asked += 1
        if asked >= 20:
            checked.set()
        return allowed

    snapshotter.may_write = may_write
    try:
        await snapshotter.start()
        async with asyncio.timeout(10):
            await checked.wait()  # twenty checks of a due snapshot, each refused
        assert snapshotter.process is None and snapshotter.written == 0
        allowed = True
        async with asyncio.timeout(30):
            while snapshotter.written == 0:
                await asyncio.sleep(0.01)
    finally:
        await snapshotter.stop()
        log.close()
