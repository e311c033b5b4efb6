"""The single writer: runs the Field's operations in order, durable first.

Every request, read or write, becomes a *job* on one bounded queue. One
task takes jobs off the queue in batches, runs each against the
:class:`~field.core.field.Field` (pure, in memory), appends all the log
entries the batch produced in one transaction (group commit), and only
then releases the batch's responses. Two consequences:

* Nothing is acknowledged before it is durable, and nothing a client can
  see was not durable: a read that ran after a write in the same batch is
  released after that write's commit.
* If the append fails, no job of the batch from its first write on is
  acknowledged, and the Field is rebuilt from the log, which the failed
  append left unchanged.

The queue is bounded (``max_queue``); when it is full, a request is
refused at once with ``OVERLOADED`` rather than waiting without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .core.context import Outcome
from .core.field import Field
from .errors import FieldError, Overloaded, internal_error
from .store.base import EventLog, LogEntry, StoredEntry

logger = logging.getLogger("field.service")

Job = Callable[[Field], Outcome]


@dataclass(slots=True)
class _Pending:
    job: Job
    future: asyncio.Future[Outcome]
    operation: str | None


class FieldService:
    """Owns a Field and its log; serializes every operation on them."""

    def __init__(
        self,
        log: EventLog,
        field_factory: Callable[[], Field],
        *,
        max_queue: int = 10_000,
        max_batch: int = 512,
    ) -> None:
        self.log = log
        self._field_factory = field_factory
        #: entries of the batch being processed that are applied but not yet stored
        self._unstored: list[LogEntry] = []
        self.field = self._load()
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(max_queue)
        self._max_batch = max_batch
        self._writer: asyncio.Task[None] | None = None
        self._blocking_log = log.persistent
        #: called with every batch of newly durable entries, in log order
        self.listener: Callable[[list[StoredEntry]], None] | None = None
        #: called with the agent of every operation that succeeded (liveness)
        self.on_seen: Callable[[str], None] | None = None
        #: True while a batch is applied but not yet durable and published
        self.busy = False

    def _load(self) -> Field:
        """A Field rebuilt from the whole log."""
        field = self._field_factory()
        field.replay(self.log.iterate())
        field.read_entries = self._read_entries
        return field

    def _read_entries(self, positions: Sequence[int]) -> list[StoredEntry]:
        """Entries by position for REPLAY: from the log, or from the batch in progress.

        A job may read entries an earlier job of its batch produced: they
        are applied but not yet stored, and follow the log's last position.
        """
        stored_up_to = self.log.last_position()
        found = self.log.read_positions(p for p in positions if p <= stored_up_to)
        for position in sorted({p for p in positions if p > stored_up_to}):
            i = position - stored_up_to - 1
            if i < len(self._unstored):
                e = self._unstored[i]
                found.append(StoredEntry(position, e.epoch, e.kind, e.data, e.agent_id, e.ts))
        return found

    async def start(self) -> None:
        genesis = self.field.genesis()
        if genesis:
            await self._append(genesis)
        self._writer = asyncio.create_task(self._run(), name="field-writer")

    async def stop(self) -> None:
        """Finish the jobs already queued, then stop the writer and close the log."""
        if self._writer is not None:
            await self._queue.join()
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        self.log.close()

    async def execute(self, job: Job, *, operation: str | None = None) -> Outcome:
        """Run ``job`` on the Field in order with every other job; raises FieldError."""
        if self._writer is None:
            raise Overloaded("the Field is not running", operation=operation)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Pending(job, future, operation))
        except asyncio.QueueFull:
            raise Overloaded("the Field's request queue is full", operation=operation) from None
        return await future

    # -- the writer ------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            self.busy = True
            try:
                await self._process(batch)
            finally:
                self.busy = False
                for _ in batch:
                    self._queue.task_done()
            # Let the connections run between batches: with a log that never
            # blocks, a busy queue would otherwise keep the loop to itself.
            await asyncio.sleep(0)

    async def _process(self, batch: list[_Pending]) -> None:
        results: list[Outcome | FieldError] = []
        entries: list[LogEntry] = []
        self._unstored = entries
        first_write: int | None = None
        for i, pending in enumerate(batch):
            result = self._run_job(pending)
            if isinstance(result, _Broken):
                results.append(result.error)
                # The projection may be half-applied: make what ran before it
                # durable, rebuild from the log, and run the rest afresh.
                await self._settle(batch[: i + 1], results, entries, first_write)
                self.field = self._load()
                if i + 1 < len(batch):
                    await self._process(batch[i + 1 :])
                return
            if isinstance(result, Outcome) and result.entries:
                if first_write is None:
                    first_write = i
                entries.extend(result.entries)
            results.append(result)
        await self._settle(batch, results, entries, first_write)

    def _run_job(self, pending: _Pending) -> Outcome | FieldError | _Broken:
        try:
            return pending.job(self.field)
        except FieldError as error:
            return error
        except Exception:
            logger.exception("operation %s failed unexpectedly", pending.operation)
            return _Broken(internal_error(pending.operation))

    async def _settle(
        self,
        batch: list[_Pending],
        results: list[Outcome | FieldError],
        entries: list[LogEntry],
        first_write: int | None,
    ) -> None:
        """Make ``entries`` durable, resolve each job of ``batch``, then publish."""
        stored: list[StoredEntry] = []
        if entries:
            try:
                positions = await self._append(entries)
            except FieldError as error:
                logger.error("log append failed: %s; rebuilding state from the log", error)
                self.field = self._load()
                assert first_write is not None  # entries imply a write
                for i in range(first_write, len(batch)):
                    results[i] = error
            else:
                stored = [
                    StoredEntry(p, e.epoch, e.kind, e.data, e.agent_id, e.ts)
                    for p, e in zip(positions, entries, strict=True)
                ]
                self._tell_positions(results, positions)
        for pending, result in zip(batch, results, strict=False):
            if pending.future.done():  # the client went away
                continue
            if isinstance(result, FieldError):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)
        if self.on_seen is not None:
            for result in results:
                if isinstance(result, Outcome) and result.agent_id is not None:
                    self.on_seen(result.agent_id)
        if stored and self.listener is not None:
            try:
                self.listener(stored)
            except Exception:  # a push failure must never undo or block a commit
                logger.exception("publishing %d entries failed", len(stored))

    @staticmethod
    def _tell_positions(results: list[Outcome | FieldError], positions: list[int]) -> None:
        """Hand each outcome the positions its entries were stored at."""
        offset = 0
        for result in results:
            if isinstance(result, Outcome) and result.entries:
                mine = positions[offset : offset + len(result.entries)]
                offset += len(result.entries)
                if result.on_durable is not None:
                    result.on_durable(mine)

    async def _append(self, entries: list[LogEntry]) -> list[int]:
        if self._blocking_log:
            positions = await asyncio.to_thread(self.log.append, entries)
        else:
            positions = self.log.append(entries)
        self.field.state.last_position = positions[-1]
        return positions


@dataclass(slots=True)
class _Broken:
    """A job failed outside the protocol's error handling; state may be inconsistent."""

    error: FieldError
