"""The single writer: group commit, durable-before-visible, failures, bounds."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from field.contract.errors import Code, FieldError, LogUnavailable, LogWriteError, StorageFull
from field.contract.model import LogEntry
from field.core.context import Outcome
from field.core.field import Field
from field.core.state import _APPLY
from field.engine import service as service_module
from field.engine.service import PUBLISH_SLICE, FieldService
from field.ranking import relevance
from field.store import MemoryEventLog

from .conftest import UNLOADED_POLICY


class ControlledLog(MemoryEventLog):
    """A memory log whose appends can be held, failed and counted."""

    persistent = True  # so the service appends from a worker thread

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_next = False

    def append(self, entries: Sequence[LogEntry]) -> list[int]:
        self.entered.set()
        self.gate.wait(timeout=30)
        if self.fail_next:
            self.fail_next = False
            raise LogWriteError("disk on fire")
        self.calls.append(len(entries))
        return super().append(entries)


def envelope(operation: str, agent_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "m",
        "operation": operation,
        "agent_id": agent_id,
        "session_id": None,
        "epoch": 0,
        "payload": payload,
    }


async def operate(
    service: FieldService,
    operation: str,
    agent_id: str,
    payload: dict[str, Any],
    token: str | None = None,
) -> dict[str, Any]:
    """One operation through the service's writer, as a transport runs it: its response."""
    message = envelope(operation, agent_id, payload)
    outcome = await service.execute(
        lambda field: field.handle(message, token=token, operation=operation),
        operation=operation,
    )
    return dict(outcome.response)


class Client:
    def __init__(self, service: FieldService) -> None:
        self.service = service
        self.token = ""

    async def op(self, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = envelope(operation, "alice", payload)
        token = self.token

        def job(field: Field) -> Outcome:
            return field.handle(body, token=token, operation=operation)

        outcome = await self.service.execute(job, operation=operation)
        return outcome.response

    async def record(self, content: str) -> dict[str, Any]:
        return await self.op(
            "RECORD",
            {
                "type": "finding",
                "content": content,
                "intent": {"purpose": "p"},
                "confidence": {"score": 0.5, "reasoning": "r"},
            },
        )

    async def unit_ids(self) -> set[str]:
        scope = {"role": "r", "max_units": 1000, "include_own": True}
        response = await self.op("ATTUNE", {"scope": scope})
        return {r["memory_unit"]["id"] for r in response["record"]}


@pytest.fixture
async def setup() -> AsyncIterator[tuple[FieldService, ControlledLog, Client]]:
    log = ControlledLog()
    service = FieldService(
        log, lambda: Field(), max_queue=8, max_batch=64, admission=UNLOADED_POLICY
    )
    await service.start()
    client = Client(service)
    client.token = (await client.op("REGISTER", {"id": "alice", "role": "r"}))["token"]
    yield service, log, client
    log.gate.set()
    await service.stop()


async def test_concurrent_writes_share_commits(setup: Any) -> None:
    service, log, client = setup
    log.gate.clear()
    first = asyncio.ensure_future(client.record("first"))
    await asyncio.to_thread(log.entered.wait, 30)  # the writer now holds one commit open
    others = [asyncio.ensure_future(client.record(f"unit {i}")) for i in range(7)]
    calls_before = len(log.calls)
    log.gate.set()
    responses = await asyncio.gather(first, *others)
    assert len({r["memory_unit_id"] for r in responses}) == 8
    # the seven queued during the first commit went out together in one more
    assert len(log.calls) - calls_before == 2
    positions = [e.position for e in log.iterate()]
    assert positions == list(range(1, len(positions) + 1))


async def test_nothing_is_acknowledged_before_it_is_durable(setup: Any) -> None:
    service, log, client = setup
    log.gate.clear()
    log.entered.clear()
    pending = asyncio.ensure_future(client.record("held"))
    await asyncio.to_thread(log.entered.wait, 30)
    assert not pending.done()
    log.gate.set()
    response = await pending
    stored = [e.data["unit"]["id"] for e in log.iterate() if e.kind == "memory.recorded"]
    assert response["memory_unit_id"] in stored


async def test_a_failed_append_acknowledges_nothing_and_changes_nothing(setup: Any) -> None:
    service, log, client = setup
    kept = (await client.record("kept"))["memory_unit_id"]
    epoch_before = service.field.epoch
    log.fail_next = True
    with pytest.raises(FieldError) as info:
        await client.record("lost")
    assert info.value.code == Code.INTERNAL_ERROR
    assert info.value.recoverable
    # rebuilt from the log: the clock resumes at its durable reservation,
    # never below an epoch already handed out
    assert service.field.epoch >= epoch_before
    assert await client.unit_ids() == {kept}
    # and the Field carries on
    again = (await client.record("again"))["memory_unit_id"]
    assert await client.unit_ids() == {kept, again}


async def test_a_full_queue_is_refused_at_once(setup: Any) -> None:
    service, log, client = setup
    log.gate.clear()
    log.entered.clear()
    held = asyncio.ensure_future(client.record("held"))
    await asyncio.to_thread(log.entered.wait, 30)
    queued = [asyncio.ensure_future(client.record(f"q{i}")) for i in range(8)]
    await asyncio.sleep(0)  # one loop turn: each task runs up to its enqueue
    assert all(not task.done() for task in queued)
    with pytest.raises(FieldError) as info:
        await client.record("one too many")
    assert info.value.code == Code.OVERLOADED
    assert info.value.recoverable
    log.gate.set()
    assert len(await asyncio.gather(held, *queued)) == 9


async def test_a_job_that_fails_before_committing_fails_alone(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a handler answers that request with INTERNAL_ERROR and nothing else:
    the Field is the same object, at the same epoch, with the same units."""
    service, log, client = setup
    kept = (await client.record("kept"))["memory_unit_id"]
    field, epoch, stored = service.field, service.field.epoch, log.last_position()

    def failing_score(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug with a secret in it")

    with monkeypatch.context() as patch:
        patch.setattr(relevance, "score", failing_score)
        with pytest.raises(FieldError) as info:
            await client.unit_ids()
    assert info.value.code == Code.INTERNAL_ERROR
    assert info.value.operation == "ATTUNE"
    assert "secret" not in info.value.message
    assert service.field is field and service.rebuilds == 0, "no rebuild"
    assert service.field.epoch == epoch, "no clock move"
    assert log.last_position() == stored
    assert await client.unit_ids() == {kept}


async def test_a_request_that_breaks_the_writer_is_answered_and_the_writer_goes_on(
    setup: Any,
) -> None:
    service, log, client = setup

    def deep(field: Field) -> Outcome:
        def down(n: int) -> int:
            return down(n + 1)

        down(0)  # RecursionError, as an unbounded document once caused
        raise AssertionError("unreachable")

    for _ in range(3):
        with pytest.raises(FieldError) as info:
            await service.execute(deep)
        assert info.value.code == Code.INTERNAL_ERROR
    assert service.running and service.rebuilds == 0
    assert (await client.record("after"))["status"] == "accepted"


async def test_a_failure_while_applying_entries_rebuilds_the_state(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one failure that leaves the projection ahead of the log: it is rebuilt."""
    service, log, client = setup
    kept = (await client.record("kept"))["memory_unit_id"]
    original = _APPLY["memory.recorded"]

    def half_applied(state: Any, data: dict[str, Any]) -> None:
        original(state, data)
        _APPLY["memory.recorded"] = original  # once: the rebuild replays correctly
        raise RuntimeError("a bug in the projection")

    monkeypatch.setitem(_APPLY, "memory.recorded", half_applied)
    with pytest.raises(FieldError) as info:
        await client.record("lost")
    assert info.value.code == Code.INTERNAL_ERROR
    # the next job runs after the rebuild
    assert await client.unit_ids() == {kept}, "the half-applied unit is gone"
    assert service.rebuilds == 1 and not service.field.broken
    again = (await client.record("again"))["memory_unit_id"]
    assert await client.unit_ids() == {kept, again}


async def test_a_rebuild_that_fails_is_tried_again_and_nothing_runs_on_a_broken_state(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, log, client = setup
    kept = (await client.record("kept"))["memory_unit_id"]
    original = _APPLY["memory.recorded"]
    failures = {"left": 3}  # the projection fails once live, then twice more in replays

    def failing(state: Any, data: dict[str, Any]) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise RuntimeError("a bug in the projection")
        original(state, data)

    monkeypatch.setitem(_APPLY, "memory.recorded", failing)
    with pytest.raises(FieldError):
        await client.record("lost")
    # while rebuilds fail, every job is answered with an error, never run on the broken state
    while failures["left"] > 0:
        with pytest.raises(FieldError) as info:
            await client.unit_ids()
        assert info.value.code == Code.INTERNAL_ERROR
    assert await client.unit_ids() == {kept}
    assert not service.field.broken and service.running


class DownLog(ControlledLog):
    """A log whose server goes away: appends and reads fail until it is back."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def append(self, entries: Sequence[LogEntry]) -> list[int]:
        if self.down:
            raise LogUnavailable("the log's server cannot be reached")
        return super().append(entries)

    def read(self, after: int = 0, limit: int = 1000) -> Any:
        if self.down:
            raise LogUnavailable("the log's server cannot be reached")
        return super().read(after, limit)


async def test_a_rebuild_that_cannot_read_the_log_answers_log_unavailable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A write whose append fails leaves the state ahead of the log; while the log cannot
    be read back either, every job is refused as LOG_UNAVAILABLE (recoverable, 503), not
    as an internal error, with one log line and no traceback; then it serves again."""
    monkeypatch.setattr(service_module, "PROBE_SECONDS", 0.01)
    log = DownLog()
    service = FieldService(
        log, lambda: Field(), max_queue=64, max_batch=64, admission=UNLOADED_POLICY
    )
    await service.start()
    try:
        client = Client(service)
        client.token = (await client.op("REGISTER", {"id": "alice", "role": "r"}))["token"]
        kept = (await client.record("kept"))["memory_unit_id"]
        log.down = True
        with pytest.raises(FieldError) as info:
            await client.record("lost")
        assert info.value.code == Code.LOG_UNAVAILABLE
        assert service.field.broken
        for _ in range(3):  # reads too: the state cannot be trusted until it is read back
            with pytest.raises(FieldError) as info:
                await client.unit_ids()
            assert info.value.code == Code.LOG_UNAVAILABLE and info.value.recoverable
        assert not [r for r in caplog.records if r.exc_info]
        failed = [r for r in caplog.records if "rebuilding the state" in r.getMessage()]
        assert len(failed) == 1
        log.down = False
        assert await client.unit_ids() == {kept}
        assert not service.field.broken and service.running
    finally:
        await service.stop()


async def test_a_failing_listener_never_undoes_a_commit(setup: Any) -> None:
    service, log, client = setup

    def listener(entries: Any) -> None:
        raise RuntimeError("push bug")

    service.listeners.add(listener)
    unit = (await client.record("durable"))["memory_unit_id"]
    assert unit in await client.unit_ids()
    assert service.running


async def test_a_long_publish_lets_the_loop_run_and_answers_the_batch_after_it(
    setup: Any,
) -> None:
    service, log, client = setup
    published: list[int] = []
    began = asyncio.Event()
    turns = 0

    def listener(entries: Any) -> Iterator[None]:
        began.set()
        for step in range(4):
            time.sleep(PUBLISH_SLICE)  # each step alone fills a slice
            published.append(step)
            yield

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    service.listeners.add(listener)
    counter = asyncio.create_task(count_turns())
    try:
        recording = asyncio.ensure_future(client.record("fanned out in steps"))
        await began.wait()  # (wait_for's own task would take the turns watched below)
        during: list[int] = []
        while len(published) < 4:
            during.append(turns)
            assert not recording.done()  # answered only once every step is taken
            await asyncio.sleep(0)
        await recording
    finally:
        counter.cancel()
    # the loop ran between the steps: other tasks took turns while it published
    assert len(during) >= 3 and during[-1] > during[0]


class _Fatal(BaseException):
    """What no ``except Exception`` catches: it ends the writer task itself."""


async def test_a_dead_writer_is_started_again(setup: Any) -> None:
    service, log, client = setup
    writer = service._writer

    def fatal(field: Field) -> Outcome:
        raise _Fatal()

    with pytest.raises(FieldError) as info:
        await service.execute(fatal)
    assert info.value.code == Code.INTERNAL_ERROR
    assert writer is not None and writer.done()
    # the writer is started again, and the queue's accounting survived the death
    assert (await client.record("after"))["status"] == "accepted"
    assert service.running and service._writer is not writer


class FullLog(ControlledLog):
    """A log whose disk fills up and frees on command."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False

    def append(self, entries: Sequence[LogEntry]) -> list[int]:
        if self.full:
            raise StorageFull("the disk is full")
        return super().append(entries)


@pytest.fixture
async def full_setup(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[FieldService, FullLog, Client]]:
    monkeypatch.setattr(service_module, "PROBE_SECONDS", 0.01)
    log = FullLog()
    service = FieldService(
        log, lambda: Field(), max_queue=64, max_batch=64, admission=UNLOADED_POLICY
    )
    await service.start()
    client = Client(service)
    client.token = (await client.op("REGISTER", {"id": "alice", "role": "r"}))["token"]
    yield service, log, client
    await service.stop()


async def test_a_full_disk_refuses_writes_serves_reads_and_recovers(full_setup: Any) -> None:
    service, log, client = full_setup
    kept = (await client.record("kept"))["memory_unit_id"]
    log.full = True
    with pytest.raises(FieldError) as info:
        await client.record("refused")
    assert info.value.code == Code.STORAGE_FULL and info.value.recoverable
    assert service.refusing is not None and service.rebuilds == 1
    stored = log.last_position()
    # every later write is refused up front (no rebuild), every read is served
    for i in range(2000):  # past a whole clock reservation: reads never need the log
        assert await client.unit_ids() == {kept}, i
    epoch = service.field.epoch
    assert epoch <= service.field.state.clock.reserved
    for _ in range(3):
        with pytest.raises(FieldError) as info:
            await client.record("refused")
        assert info.value.code == Code.STORAGE_FULL
        assert "COMPACT" not in (info.value.suggested_action or "")
    assert service.rebuilds == 1 and log.last_position() == stored
    # space returns: the probe notices and writes resume by themselves
    log.full = False
    while service.refusing is not None:
        await asyncio.sleep(0.01)
    again = await client.record("again")
    assert again["epoch"] > epoch
    assert await client.unit_ids() == {kept, again["memory_unit_id"]}


async def test_an_agent_polling_through_a_full_disk_misses_nothing(full_setup: Any) -> None:
    """Reads answered while writes are refused carry epochs that the next write passes."""
    service, log, client = full_setup
    first = await client.record("first")
    log.full = True
    with pytest.raises(FieldError):
        await client.record("refused")
    scope = {"role": "r", "max_units": 1000, "include_own": True, "since_epoch": first["epoch"]}
    poll = await client.op("ATTUNE", {"scope": scope})
    assert poll["record"] == []
    log.full = False
    while service.refusing is not None:
        await asyncio.sleep(0.01)
    later = await client.record("later")
    scope["since_epoch"] = poll["epoch"]
    poll = await client.op("ATTUNE", {"scope": scope})
    assert [r["memory_unit"]["id"] for r in poll["record"]] == [later["memory_unit_id"]]
