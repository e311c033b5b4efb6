"""The single writer: group commit, durable-before-visible, failures, bounds."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from field.core.context import Outcome
from field.core.field import Field
from field.errors import Code, FieldError, LogWriteError
from field.service import FieldService
from field.store import MemoryEventLog
from field.store.base import LogEntry


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
    service = FieldService(log, lambda: Field(), max_queue=8, max_batch=64)
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


async def test_an_unexpected_error_is_internal_and_the_field_recovers(setup: Any) -> None:
    service, log, client = setup
    kept = (await client.record("kept"))["memory_unit_id"]

    def broken(field: Field) -> Outcome:
        field.state.units.clear()  # a bug that corrupts the projection
        raise RuntimeError("bug")

    with pytest.raises(FieldError) as info:
        await service.execute(broken)
    assert info.value.code == Code.INTERNAL_ERROR
    assert "bug" not in info.value.message
    assert await client.unit_ids() == {kept}, "the state was rebuilt from the log"
