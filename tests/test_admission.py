"""Admission control: a standing delay refuses writes at once, a burst does not."""

from __future__ import annotations

import asyncio
import gc
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from field.cli.main import _config, _parser
from field.client import FieldClient, FieldClientError
from field.contract.errors import Code, FieldError, Overloaded
from field.core.context import Outcome
from field.core.field import Field
from field.engine.admission import (
    Admission,
    AdmissionPolicy,
    Controller,
    Mode,
    Work,
    WriteBudget,
    work_of,
)
from field.engine.service import FieldService
from field.server.config import Config

from .conftest import ThreadedServer
from .test_service import Client, ControlledLog

# -- the state machine ------------------------------------------------------------


def test_a_burst_shorter_than_the_interval_is_absorbed() -> None:
    controller = Controller(target=0.02, interval=0.1)
    for i in range(9):  # 90 ms above the target, sampled every 10 ms
        assert not controller.observe(0.5, now=i * 0.01)
    assert controller.mode is Mode.ADMITTING
    controller.observe(0.0, now=0.095)  # back under: the clock starts again
    for i in range(9):
        controller.observe(0.5, now=0.1 + i * 0.01)
    assert controller.mode is Mode.ADMITTING
    assert controller.episodes == 0


def test_a_standing_delay_sheds_until_one_sample_falls_below() -> None:
    controller = Controller(target=0.02, interval=0.1)
    changes = [controller.observe(0.05, now=i * 0.01) for i in range(12)]
    assert controller.mode is Mode.SHEDDING
    assert changes.count(True) == 1 and changes.index(True) == 10  # after exactly 100 ms
    controller.observe(0.03, now=0.2)  # still above: still shedding
    assert controller.mode is Mode.SHEDDING
    assert controller.observe(0.01, now=0.21)
    assert controller.mode is Mode.ADMITTING
    assert controller.episodes == 1


def test_a_zero_target_never_sheds() -> None:
    controller = Controller(target=0.0, interval=0.1)
    for i in range(100):
        controller.observe(10.0, now=i)
    assert controller.mode is Mode.ADMITTING


def test_classes_of_work() -> None:
    assert work_of("RECORD") is Work.WRITE
    assert work_of("REGISTER") is Work.WRITE
    assert work_of("ATTUNE") is Work.READ
    assert work_of("REPLAY") is Work.READ
    assert work_of("DEREGISTER") is Work.INTERNAL  # leaving lightens the load
    assert work_of("LIVENESS") is Work.INTERNAL  # the server's own jobs, which write
    assert work_of("DELIVERY") is Work.INTERNAL
    assert work_of(None) is Work.INTERNAL  # the server's own jobs


def test_writes_shed_before_reads_and_the_refusal_says_when_to_retry() -> None:
    admission = Admission(AdmissionPolicy(write_target=0.02, read_target=0.2, interval=0.1))
    for i in range(20):
        admission.observe(0.05, now=i * 0.01)
    with pytest.raises(FieldError) as refused:
        admission.admit(Work.WRITE, "RECORD")
    error = refused.value
    assert error.code == Code.OVERLOADED and error.http_status == 503
    assert error.recoverable and error.retry_after == 1.0
    assert error.to_response()["operation"] == "RECORD"
    admission.admit(Work.READ, "ATTUNE")  # 50 ms is under the reads' target
    admission.admit(Work.INTERNAL)
    for i in range(20):
        admission.observe(0.5, now=1 + i * 0.01)
    with pytest.raises(FieldError):
        admission.admit(Work.READ, "ATTUNE")
    admission.admit(Work.INTERNAL)  # never refused
    status = admission.status()
    assert status["write"] == {"mode": "shedding", "refused": 1, "episodes": 1}
    assert status["read"] == {"mode": "shedding", "refused": 1, "episodes": 1}


@pytest.mark.parametrize("bad", [{"write_target": -1}, {"interval": float("nan")}, {"sample": 0}])
def test_bad_policies_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AdmissionPolicy(**bad)


# -- the write budget: no more writes in flight than the writer answers in time -----------


def test_the_write_budget_lets_in_what_the_writer_answers_within_it() -> None:
    budget = WriteBudget(0.1, floor=2)
    assert budget.limit == math.inf and not budget.full()  # nothing measured yet
    budget.measured(10, per_writes=0.1, rest=0.02)  # 10 ms a write, 20 ms a batch
    assert budget.per_write == pytest.approx(0.01) and budget.fixed == pytest.approx(0.02)
    assert budget.limit == 8  # 20 ms + 8 x 10 ms fit in 100 ms
    budget.in_flight = 7
    assert not budget.full()
    budget.in_flight = 8
    assert budget.full()
    budget.measured(1, per_writes=0.06, rest=0.02)  # a costlier write moves the average
    assert budget.per_write == pytest.approx(0.01 + 0.2 * (0.06 - 0.01))
    assert budget.limit == (0.1 - 0.02) // budget.per_write
    budget.measured(1, per_writes=10.0, rest=5.0)  # however costly, the floor goes in
    assert budget.limit == 2
    budget.measured(0, per_writes=1.0, rest=1.0)  # a batch of reads says nothing of writes
    assert budget.limit == 2


def test_a_zero_write_budget_never_limits() -> None:
    budget = WriteBudget(0.0)
    budget.measured(5, per_writes=50.0, rest=1.0)
    budget.in_flight = 1000
    assert budget.limit == math.inf and not budget.full()


def test_writes_that_cost_next_to_nothing_are_not_bounded() -> None:
    budget = WriteBudget(0.1)
    budget.measured(1, per_writes=1e-300, rest=0.0)  # a clock's rounding, say
    assert budget.limit == math.inf
    budget.measured(1, per_writes=0.0, rest=0.0)
    assert budget.limit == math.inf
    admission = Admission(AdmissionPolicy())
    admission.writes.measured(1, per_writes=1e-300, rest=0.0)
    assert admission.status()["writes_limit"] is None


def test_writes_past_the_budget_are_refused_at_once_and_answered_ones_free_room() -> None:
    admission = Admission(AdmissionPolicy(write_budget=0.1))
    admission.writes.measured(1, per_writes=0.05, rest=0.0)  # 50 ms a write: 2 at once
    admission.admit(Work.WRITE, "RECORD")
    admission.check(Work.WRITE, "RECORD")  # a check admits nothing
    admission.admit(Work.WRITE, "RECORD")
    assert admission.writes.in_flight == 2
    with pytest.raises(FieldError) as refused:
        admission.admit(Work.WRITE, "RECORD")
    assert refused.value.code == Code.OVERLOADED and refused.value.retry_after == 1.0
    assert "2 writes are waiting" in refused.value.message
    assert admission.writes.in_flight == 2  # the refused one is not in flight
    admission.admit(Work.READ, "ATTUNE")  # reads are not bounded by it
    admission.answered(Work.READ)
    admission.answered(Work.WRITE)
    admission.admit(Work.WRITE, "RECORD")
    status = admission.status()
    assert status["writes_in_flight"] == 2 and status["writes_limit"] == 2
    assert status["write"]["refused"] == 1 and status["write"]["mode"] == "admitting"


def test_the_write_budget_is_set_by_flag_or_environment_and_checked() -> None:
    assert Config.from_env({}).admission_policy().write_budget == 0.1
    from_env = Config.from_env({"FIELD_OVERLOAD_WRITE_BUDGET": "0.25"})
    assert from_env.admission_policy().write_budget == 0.25
    flag = _config(_parser().parse_args(["serve", "--overload-write-budget", "0"]))
    assert flag.admission_policy().write_budget == 0.0
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="overload_write_budget"):
            Config(overload_write_budget=bad)


# -- in the service: a writer held in its append builds a standing queue ----------------

#: no write budget: what a batch took on a loaded machine must not bound the writes these
#: tests queue (a test of the budget sets its own)
POLICY = AdmissionPolicy(
    write_target=0.02, read_target=5.0, write_budget=0.0, interval=0.05, sample=0.005
)


@pytest.fixture
async def held() -> AsyncIterator[tuple[FieldService, ControlledLog, Client, dict[Mode, Any]]]:
    log = ControlledLog()
    service = FieldService(log, lambda: Field(), max_queue=64, max_batch=64, admission=POLICY)
    await service.start()
    client = Client(service)
    client.token = (await client.op("REGISTER", {"id": "alice", "role": "r"}))["token"]
    changed = {mode: asyncio.Event() for mode in Mode}

    def on_change(work: Work, mode: Mode) -> None:
        if work is Work.WRITE:
            changed[mode].set()

    service.admission.on_change = on_change
    yield service, log, client, changed
    log.gate.set()
    await service.stop()


async def test_a_standing_queue_refuses_new_writes_at_once_and_serves_reads(held: Any) -> None:
    service, log, client, changed = held
    log.gate.clear()
    log.entered.clear()
    first = asyncio.ensure_future(client.record("held in its append"))
    await asyncio.to_thread(log.entered.wait, 30)
    waiting = [asyncio.ensure_future(client.record(f"queued {i}")) for i in range(3)]
    await asyncio.wait_for(changed[Mode.SHEDDING].wait(), 10)  # their wait stands

    queued = service.queued
    with pytest.raises(FieldError) as refused:
        await client.record("refused")
    assert refused.value.code == Code.OVERLOADED and refused.value.retry_after == 1.0
    assert service.queued == queued  # refused before it took room in the queue

    read = asyncio.ensure_future(client.unit_ids())  # a read is still admitted
    own = asyncio.ensure_future(service.execute(lambda field: Outcome({})))  # and the server's
    await asyncio.sleep(0)
    assert service.queued == queued + 2

    log.gate.set()
    acknowledged = await asyncio.gather(first, *waiting)
    await asyncio.wait_for(changed[Mode.ADMITTING].wait(), 10)
    assert {r["memory_unit_id"] for r in acknowledged} <= await read
    await own
    recorded = await client.record("admitted again")
    assert recorded["memory_unit_id"] in await client.unit_ids()
    assert service.admission.status()["write"]["refused"] == 1


async def test_writes_past_the_budget_are_refused_before_the_queue_until_answered(
    held: Any,
) -> None:
    service, log, client, _ = held
    service.admission.writes.budget = 0.1
    service.admission.writes.measured(1, per_writes=1.0, rest=0.0)  # 1 s a write: 2 at once
    log.gate.clear()
    log.entered.clear()
    first = asyncio.ensure_future(client.record("held in its append"))
    await asyncio.to_thread(log.entered.wait, 30)
    second = asyncio.ensure_future(client.record("queued behind it"))
    await asyncio.sleep(0)
    queued = service.queued
    with pytest.raises(FieldError) as refused:
        await client.record("one too many")
    assert refused.value.code == Code.OVERLOADED
    assert service.queued == queued  # refused before it took room in the queue
    log.gate.set()
    await asyncio.gather(first, second)
    assert service.admission.writes.in_flight == 0
    await client.record("admitted again")


# -- over HTTP ---------------------------------------------------------------------------


def _shed_writes(server: ThreadedServer) -> None:
    """Put the running server's write admission into shedding (as a standing delay would)."""
    service: FieldService = server.app.state.service
    controller = service.admission.controllers[Work.WRITE]

    def shed() -> None:
        controller.target = 0.0  # off: samples no longer change its mode
        controller.mode = Mode.SHEDDING

    server_loop(server).call_soon_threadsafe(shed)


def server_loop(server: ThreadedServer) -> asyncio.AbstractEventLoop:
    service: FieldService = server.app.state.service
    assert service._writer is not None
    return service._writer.get_loop()


async def test_http_refusal_is_the_spec_error_with_retry_after(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory()
    async with FieldClient(server.url, retries=0) as field:
        agent = await field.register("writer-1", "analyst")
        _shed_writes(server)
        await field.status()  # a round trip: the loop has run the change
        async with aiohttp.ClientSession() as http:
            body = field.envelope("RECORD", "writer-1", {"type": "finding", "content": "x"})
            async with http.post(
                server.url + "/v1/record",
                json=body,
                headers={"Authorization": f"Bearer {agent.token}"},
            ) as response:
                assert response.status == 503
                assert response.headers["Retry-After"] == "1"
                error = await response.json()
        assert error["code"] == "OVERLOADED" and error["recoverable"] is True
        assert error["operation"] == "RECORD" and error["suggested_action"]
        with pytest.raises(FieldClientError) as refused:
            await agent.record("finding", "y", purpose="p", confidence=0.5, reasoning="r")
        assert refused.value.retry_after == 1.0 and refused.value.status == 503
        assert (await agent.attune(max_units=5))["record"] == []  # reads go on
        status = await field.status()
        assert status["writer"]["admission"]["write"]["mode"] == "shedding"
        assert status["writer"]["admission"]["write"]["refused"] == 2


async def test_a_refusal_leaves_no_garbage_cycle(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    """A refused request's objects are freed as it is answered, not by the collector: under
    overload, thousands of refusals a second made cycles (the exception, its traceback and the
    frame that held it) whose collection paused the loop for tens of milliseconds."""
    server = server_factory()
    async with FieldClient(server.url, retries=0) as field:
        agent = await field.register("writer-1", "analyst")
        _shed_writes(server)
        await field.status()  # a round trip: the loop has run the change
        body = field.envelope("RECORD", "writer-1", {"type": "finding", "content": "x"})
        headers = {"Authorization": f"Bearer {agent.token}"}
        flags = gc.get_debug()
        gc.collect()
        gc.set_debug(flags | gc.DEBUG_SAVEALL)  # what the collector frees, it keeps here
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(50):
                    async with http.post(
                        server.url + "/v1/record", json=body, headers=headers
                    ) as response:
                        assert response.status == 503
                        await response.read()
            gc.collect()
            cycles = [o for o in gc.garbage if isinstance(o, Overloaded)]
        finally:
            gc.set_debug(flags)
            gc.garbage.clear()
        assert cycles == []


async def test_the_client_waits_as_told_and_sends_again(
    server_factory: Callable[..., ThreadedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory()
    service: FieldService = server.app.state.service
    controller = service.admission.controllers[Work.WRITE]
    async with FieldClient(server.url) as field:
        agent = await field.register("writer-2", "analyst")
        _shed_writes(server)
        await field.status()
        waits: list[float] = []

        async def sleep(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 2:  # the Field catches up during the client's second wait

                def admit() -> None:
                    controller.mode = Mode.ADMITTING

                server_loop(server).call_soon_threadsafe(admit)
                await field.status()

        monkeypatch.setattr("field.client._sleep", sleep)
        unit = await agent.record("finding", "z", purpose="p", confidence=0.5, reasoning="r")
        assert unit["memory_unit_id"].startswith("mem")
        assert len(waits) == 2 and all(1.0 <= w <= 1.1 for w in waits)  # Retry-After, jittered

        # told to wait longer than it may, or refused more often than it may retry: raised
        _shed_writes(server)
        await field.status()
        waits.clear()
        field.retries = 1
        with pytest.raises(FieldClientError) as refused:
            await agent.record("finding", "w", purpose="p", confidence=0.5, reasoning="r")
        assert refused.value.code == "OVERLOADED" and len(waits) == 1
        field.max_retry_wait = 0.5
        waits.clear()
        with pytest.raises(FieldClientError):
            await agent.record("finding", "v", purpose="p", confidence=0.5, reasoning="r")
        assert waits == []
