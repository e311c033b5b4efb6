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

``field_embedding_queue_units`` in ``/metrics`` and ``embedding`` in
``/status`` show the depth. Nothing here is durable: after a restart the
replay embeds every unit again, as it always has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
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
#: BLAS threads while the model runs.
BLAS_THREADS = 1


def _embedded(
    embedder: Embedder, texts: Sequence[str], blas: ThreadpoolController
) -> tuple[Vectors, npt.NDArray[Any]]:
    # one BLAS thread while the model runs (OpenBLAS's count is the process's: matrix
    # products on the event loop meanwhile take one too): on a machine of few cores a
    # thread per core beside the loop made the model 4-10 times slower, not faster
    with blas.limit(limits=BLAS_THREADS, user_api="blas"):
        return quantize(embedder.embed(texts))


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
        self._blas = ThreadpoolController()
        self._work = asyncio.Event()
        #: set (and replaced) after every step: what waiters of progress wait for
        self._progress = asyncio.Event()
        #: called after every step that embedded units (the service publishes what waited)
        self.on_progress: Callable[[], None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="field-embeddings")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

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
                rows, squares = await asyncio.to_thread(
                    _embedded, self._embedder, texts, self._blas
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
