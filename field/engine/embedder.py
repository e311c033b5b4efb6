"""Embedding after the commit: a sentence model off the writer's path.

A static embedder (hashing, wordllama) embeds a unit in microseconds, so
the Field embeds units when their rows are first read, on the event loop.
A sentence model (``--embedder minilm``) takes milliseconds per text; run
there, a batch of 1,024 units stalls every request for seconds. With such
an embedder (:func:`~field.ranking.embedding.embeds_after_commit`) the unit
index is *deferred* (:attr:`~field.ranking.relevance.UnitIndex.deferred`) and
an :class:`EmbeddingWorker` embeds what it queues, a few units at a time,
in a worker thread, after the units are committed:

* RECORD is acknowledged once durable, as always; its unit is embedded
  moments later. Write throughput does not pay for the model (until the
  queue is full, below).
* Pushing the events of a unit waits for its embedding (the service holds
  back publishing, in log order: :meth:`FieldService._hold`), so every
  notification is scored as it would have been at once; push latency
  absorbs the model's cost.
* ATTUNE and DETECT wait up to :data:`READ_WAIT` seconds for the units
  recorded before them to be embedded (read-your-writes under a normal
  load); what is still queued after that is left out of the ranking, and a
  poll's ``epoch`` stays below it, so polling still sees each unit once.
* The queue is bounded (:data:`MAX_QUEUED_UNITS`, :data:`MAX_QUEUED_CHARS`):
  while it is full the writer takes no batch of writes, so they queue and
  admission control refuses them with ``OVERLOADED`` and ``Retry-After``.

What the event loop does with the model's output is bounded by the step:
taking one step's rows into the index (and its calibration sums) is a
32-row product, well under a millisecond, and the loop runs between two
steps. Two things keep the model from taking the loop's CPU instead: the
model runs in a thread of its own at a lower priority
(:data:`MODEL_NICENESS`, where the OS allows a thread one), so the loop and
the log's appends get a core first and the model the rest; and BLAS runs
on one thread (:data:`BLAS_THREADS`) while a worker runs, for the model and
the loop alike: with a thread per core, the loop's small products waited
for cores the model held (a 32-row product took 20 ms instead of 0.5, a
few hundred at worst).

``field_embedding_queue_units`` in ``/metrics`` and ``embedding`` in
``/status`` show the depth. Nothing here is durable: after a restart the
replay embeds every unit again, as it always has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy.typing as npt
from threadpoolctl import ThreadpoolController

from ..ranking.embedding import Embedder, Vectors, quantize
from ..ranking.relevance import UnitIndex

logger = logging.getLogger("field.embeddings")

#: Units embedded per call of the model, and characters at most (a step's cost is
#: what a held notification may wait for beyond its own unit: about 0.2 s with minilm).
STEP_UNITS = 32
STEP_CHARS = 16_384
#: Units (and characters) queued for embedding past which the writer takes no writes.
MAX_QUEUED_UNITS = 65_536
MAX_QUEUED_CHARS = 64 << 20
#: Seconds ATTUNE and DETECT wait for the units recorded before them to be embedded.
READ_WAIT = 1.0
#: Seconds before trying again after the model failed on a step.
RETRY_SECONDS = 1.0
#: BLAS threads while a worker runs (the model's and the event loop's products alike).
BLAS_THREADS = 1
#: The model thread's niceness (0-19: higher yields the CPU sooner; see _lower_priority).
MODEL_NICENESS = 10


class _OneBlasThread:
    """BLAS (OpenBLAS's count is the process's) on one thread while any worker runs.

    The model runs in its worker thread and the event loop runs the Field's
    own products (calibration sums, ranking, matching) meanwhile; on a machine
    of few cores a BLAS thread per core beside them is far slower, not faster:
    the model took 4-10 times as long per text, and a 32-row product on the
    loop took 20 ms instead of 0.5 ms (a few hundred ms at worst), its threads
    waiting for cores the model and the connections held. Counted, so that
    the first worker to start sets one thread and the last to stop restores
    what was set before.
    """

    def __init__(self) -> None:
        self._users = 0
        self._limiter: Any = None

    def hold(self) -> None:
        if self._users == 0:
            self._limiter = ThreadpoolController().limit(limits=BLAS_THREADS, user_api="blas")
        self._users += 1

    def release(self) -> None:
        self._users -= 1
        if self._users == 0 and self._limiter is not None:
            self._limiter.restore_original_limits()
            self._limiter = None


_ONE_BLAS_THREAD = _OneBlasThread()


def _embedded(embedder: Embedder, texts: Sequence[str]) -> tuple[Vectors, npt.NDArray[Any]]:
    return quantize(embedder.embed(texts))


def _lower_priority() -> None:
    """Run the calling thread (the model's) at :data:`MODEL_NICENESS`: where the OS lets a
    thread have its own priority (Linux, where a thread's id names it to setpriority), the
    loop and the log's writes take a core first and the model the rest; elsewhere (a
    thread's id there may be another process's), or if refused, the thread runs as it is."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(AttributeError, OSError):
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(current, MODEL_NICENESS))


class EmbeddingWorker:
    """Embeds the units the current Field's index queues, in order, off the loop.

    ``index_of`` gives the index of the Field being served (a rebuild
    replaces it: a step embedded for the old one is dropped). Whoever
    queues units calls :meth:`wake`.
    """

    def __init__(
        self,
        index_of: Callable[[], UnitIndex],
        embedder: Embedder,
        *,
        step_units: int = STEP_UNITS,
        step_chars: int = STEP_CHARS,
        max_units: int = MAX_QUEUED_UNITS,
        max_chars: int = MAX_QUEUED_CHARS,
    ) -> None:
        self._index_of = index_of
        self._embedder = embedder
        self._step = (step_units, step_chars)
        self._max = (max_units, max_chars)
        self._task: asyncio.Task[None] | None = None
        #: the model's own thread: never one of the loop's default executor, which the
        #: log's appends use, and run at a lower priority than the loop's
        self._thread: ThreadPoolExecutor | None = None
        self._work = asyncio.Event()
        #: set (and replaced) after every step: what waiters of progress wait for
        self._progress = asyncio.Event()
        #: called after every step that embedded units (the service publishes what waited)
        self.on_progress: Callable[[], None] | None = None

    def start(self) -> None:
        _ONE_BLAS_THREAD.hold()
        self._thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="field-embed", initializer=_lower_priority
        )
        self._task = asyncio.create_task(self._run(), name="field-embeddings")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._thread is not None:
            self._thread.shutdown(wait=False)  # a step under way ends on its own
            self._thread = None
            _ONE_BLAS_THREAD.release()

    def wake(self) -> None:
        """Units were queued: embed them."""
        self._work.set()

    def replaced(self) -> None:
        """The Field was rebuilt: embed what its index queues, and let every waiter look
        again (a step under way for the old index is dropped)."""
        self._work.set()
        self._stepped()

    @property
    def queued(self) -> int:
        """Units waiting for their embedding."""
        return self._index_of().waiting

    @property
    def full(self) -> bool:
        index = self._index_of()
        return index.waiting >= self._max[0] or index.waiting_chars >= self._max[1]

    async def progress(self) -> None:
        """Wait for the next step to end."""
        await self._progress.wait()

    async def room(self) -> None:
        """Wait until the queue is below its bounds."""
        while self.full:
            self.wake()
            await self.progress()

    async def caught_up(self, count: int, timeout: float | None) -> bool:
        """Wait until the first ``count`` units are embedded, ``timeout`` seconds at most;
        whether they are."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):  # None: as long as it takes
                while self._index_of().scorable < count:
                    self.wake()
                    await self.progress()
        return self._index_of().scorable >= count

    async def _run(self) -> None:
        while True:
            index = self._index_of()
            if not index.waiting:
                self._work.clear()
                await self._work.wait()
                continue
            start, texts = index.queued(*self._step)
            try:
                rows, squares = await asyncio.get_running_loop().run_in_executor(
                    self._thread, _embedded, self._embedder, texts
                )
            except Exception:
                logger.exception(
                    "embedding %d units failed; trying again in %.0f s", len(texts), RETRY_SECONDS
                )
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if self._index_of() is index:  # else rebuilt meanwhile: the step is dropped
                index.supply(start, rows, squares)
            self._stepped()

    def _stepped(self) -> None:
        progress, self._progress = self._progress, asyncio.Event()
        progress.set()
        if self.on_progress is not None:
            self.on_progress()
