"""The single writer: runs the Field's operations in order, durable first.

Every request, read or write, becomes a *job* on one bounded queue. One
task takes jobs off the queue in batches, runs each against the
:class:`~field.core.field.Field` (pure, in memory), appends all the log
entries the batch produced in one transaction (group commit), and only
then releases the batch's responses. Consequences:

* Nothing is acknowledged before it is durable, and nothing a client can
  see was not durable: a read that ran after a write in the same batch is
  released after that write's commit.
* **A failing job fails alone.** A job that raises before the Field
  committed anything (every validation, every handler: they only read)
  answers ``INTERNAL_ERROR`` and leaves the Field as it was: no rebuild, no
  clock move. Only a failure *while applying* committed entries
  (``Field.broken``) or a failed append makes the state run ahead of the
  log; then it is rebuilt from the log, in a worker thread.
* **The writer is supervised.** Whatever a batch raises, its jobs are
  answered and the loop goes on; should the task itself ever end, it is
  started again.

The log has two states, one transition each way::

    writable --append fails (disk full, locked, I/O)--> refusing
    refusing --a background probe append succeeds----> writable

While *refusing*, the Field refuses every write up front with the error
the append gave (``STORAGE_FULL`` or ``LOG_UNAVAILABLE``, recoverable),
before anything changes, and serves every read; a probe task appends a
``clock.reserved`` entry every :data:`PROBE_SECONDS` in a thread, beside
the writer (which appends nothing meanwhile), and its success makes the
log writable again.

The queue is bounded (``max_queue``), and so is the wait: admission
control (:mod:`field.admission`) samples how late the event loop runs and
how long the oldest queued job has waited, and while that delay stands
above its target, new writes (and, past a higher target, reads) are
refused at once with ``OVERLOADED`` and ``Retry-After`` instead of
queueing for seconds. A full queue is refused the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import snapshots
from .admission import Admission, AdmissionPolicy, Work, work_of
from .core.clock import RESERVATION_BLOCK
from .core.context import Outcome
from .core.field import Field
from .errors import Code, FieldError, LogUnavailable, Overloaded, StorageFull, internal_error
from .model import MAX_EPOCH, LogEntry, StoredEntry
from .store.base import EventLog

logger = logging.getLogger("field.service")

Job = Callable[[Field], Outcome]

#: Seconds between attempts to write to a log that refused an append.
PROBE_SECONDS = 1.0
#: Error codes of an append that make the log *refusing* (the others are bugs).
_UNWRITABLE = frozenset({Code.STORAGE_FULL, Code.LOG_UNAVAILABLE})


@dataclass(slots=True)
class _Pending:
    job: Job
    future: asyncio.Future[Outcome]
    operation: str | None
    #: the loop's time when it was queued
    queued_at: float


class _JobQueue(asyncio.Queue[_Pending]):
    """The writer's queue, which can tell when its oldest job was queued."""

    def oldest(self) -> float | None:
        """The loop time the job first in line was queued at; None when empty."""
        return self._queue[0].queued_at if self._queue else None  # type: ignore[attr-defined]


class FieldService:
    """Owns a Field and its log; serializes every operation on them."""

    def __init__(
        self,
        log: EventLog,
        field_factory: Callable[[], Field],
        *,
        max_queue: int = 10_000,
        max_batch: int = 512,
        admission: AdmissionPolicy | None = None,
    ) -> None:
        self.log = log
        self._field_factory = field_factory
        #: entries of the batch being processed that are applied but not yet stored
        self._unstored: list[LogEntry] = []
        self.field = self._load()
        self._queue = _JobQueue(max_queue)
        #: refuses work while the delay stands above its target (field.admission)
        self.admission = Admission(admission)
        self._sampler: asyncio.Task[None] | None = None
        self._max_batch = max_batch
        self._writer: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._stopping = False
        self._blocking_log = log.persistent
        #: called, in order, with every batch of newly durable entries, in log order
        self.listeners: list[Callable[[list[StoredEntry]], None]] = []
        #: called with the agent of every operation that succeeded (liveness)
        self.on_seen: Callable[[str], None] | None = None
        #: called with the number of jobs of every batch the writer takes (metrics)
        self.on_batch: Callable[[int], None] | None = None
        #: True while a batch is applied but not yet durable and published
        self.busy = False
        #: why writes are refused (the append's error), or None while the log is writable
        self.refusing: FieldError | None = None
        #: how many times the state was rebuilt from the log since start-up
        self.rebuilds = 0

    def _load(self) -> Field:
        """A Field rebuilt from the log: from its newest usable snapshot, if it has one, and
        the entries after it (:mod:`field.snapshots`)."""
        field = self._field_factory()
        #: the snapshot the state was last rebuilt from (None: the whole log)
        self.started_from = snapshots.load(field, self.log)
        field.read_entries = self._read_entries
        field.sliced_reads = True  # execute() builds large pages in steps
        return field

    async def _rebuild(self) -> None:
        """Replace the Field with one rebuilt from the log, off the event loop.

        If the rebuild itself fails, the broken Field stays (``broken`` set):
        the writer answers every job with an internal error and tries again
        before each batch.
        """
        self.rebuilds += 1
        try:
            if self._blocking_log:
                field = await asyncio.to_thread(self._load)
            else:
                field = self._load()
        except Exception:
            logger.exception("rebuilding the state from the log failed; will try again")
            self.field.broken = True
            return
        # what others set on the Field they see carries over to the rebuilt one
        field.writes_refused = self.field.writes_refused
        field.delivery_status = self.field.delivery_status
        self.field = field

    def _read_entries(
        self, positions: Sequence[int], *, max_bytes: int | None = None
    ) -> list[StoredEntry]:
        """Entries by position for REPLAY: from the log, or from the batch in progress.

        A job may read entries an earlier job of its batch produced: they
        are applied but not yet stored, and follow the log's last position.
        ``max_bytes`` bounds what is read from the log (see ``read_positions``).
        """
        stored_up_to = self.log.last_position()
        wanted = [p for p in positions if p <= stored_up_to]
        found = self.log.read_positions(wanted, max_bytes=max_bytes)
        if len(found) < len(set(wanted)):
            return found  # cut by max_bytes: a prefix, and the batch's entries come after
        for position in sorted({p for p in positions if p > stored_up_to}):
            i = position - stored_up_to - 1
            if i < len(self._unstored):
                e = self._unstored[i]
                found.append(StoredEntry(position, e.epoch, e.kind, e.data, e.agent_id, e.ts))
        return found

    @property
    def running(self) -> bool:
        """Whether the writer task is alive."""
        return self._writer is not None and not self._writer.done()

    @property
    def queued(self) -> int:
        """Jobs waiting for the writer."""
        return self._queue.qsize()

    async def start(self) -> None:
        genesis = self.field.genesis()
        if genesis:
            await self._append(genesis)
        self._start_writer()
        self._sampler = asyncio.create_task(self._sample_delay(), name="field-admission")

    def _start_writer(self) -> None:
        self._writer = asyncio.create_task(self._run(), name="field-writer")
        self._writer.add_done_callback(self._writer_ended)

    def _writer_ended(self, task: asyncio.Task[None]) -> None:
        """Supervision: a writer that ended while the service runs is started again."""
        if self._stopping or task.cancelled():
            return
        logger.error("the writer stopped unexpectedly (%r); starting it again", task.exception())
        self._start_writer()

    async def stop(self) -> None:
        """Finish the jobs already queued, then stop the writer and close the log."""
        if self._writer is not None:
            if self.running:
                await self._queue.join()
            self._stopping = True
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
            self._probe = None
        self.log.close()

    async def execute(
        self, job: Job, *, operation: str | None = None, work: Work | None = None
    ) -> Outcome:
        """Run ``job`` on the Field in order with every other job; raises FieldError.

        ``work`` is the job's class for admission control; by default, the
        class of ``operation`` (none: one of the server's own jobs, never refused).
        """
        if self._writer is None or self._stopping:
            raise Overloaded("the Field is not running", operation=operation)
        self.admission.admit(work or work_of(operation), operation)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        try:
            self._queue.put_nowait(_Pending(job, future, operation, loop.time()))
        except asyncio.QueueFull:
            raise Overloaded("the Field's request queue is full", operation=operation) from None
        outcome = await future
        if outcome.rest is not None:
            # a large read builds its page in steps, each followed by a turn of the
            # loop, so that the writer and every connection run between them
            for _ in outcome.rest:
                await asyncio.sleep(0)
        return outcome

    async def _sample_delay(self) -> None:
        """Feed admission control: every ``sample`` seconds, the larger of the loop's
        lag (how late this timer fired) and the age of the oldest queued job."""
        loop = asyncio.get_running_loop()
        period = self.admission.policy.sample
        due = loop.time() + period
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            now = loop.time()
            oldest = self._queue.oldest()
            waited = 0.0 if oldest is None else now - oldest
            self.admission.observe(max(now - due, waited), now)
            due = now + period

    # -- the writer ------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            if self.on_batch is not None:
                self.on_batch(len(batch))
            self.busy = True
            try:
                if self.field.broken:
                    await self._rebuild()
                if self.field.broken:
                    self._answer_rest(batch)
                else:
                    await self._process(batch)
            except Exception:
                # a bug outside any one job (publishing, settling): answer the batch, go on
                logger.exception("a batch of %d operations failed", len(batch))
                self._answer_rest(batch)
                if self.field.broken:
                    await self._rebuild()
            except BaseException:
                self._answer_rest(batch)  # no client waits forever, whatever ends the task
                raise
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
                # The projection is half-applied: make what ran before it
                # durable, rebuild from the log, and run the rest afresh.
                await self._settle(batch[: i + 1], results, entries, first_write)
                await self._rebuild()
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
        except Exception as exc:
            # ``operation`` is a known operation name or None: never a client's raw value
            logger.exception(
                "operation %s failed unexpectedly (%s)", pending.operation, type(exc).__name__
            )
            error = internal_error(pending.operation)
            if self.field.broken:
                return _Broken(error)
            return error  # nothing was committed: the Field is as it was

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
                await self._append_failed(error)
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
        self._publish(stored)

    def _publish(self, stored: list[StoredEntry]) -> None:
        if not stored:
            return
        for listener in self.listeners:
            try:
                listener(stored)
            except Exception:  # a push failure must never undo or block a commit
                logger.exception("publishing %d entries failed", len(stored))

    def _answer_rest(self, batch: list[_Pending]) -> None:
        """Answer every job of ``batch`` still waiting with an internal error."""
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(internal_error(pending.operation))

    async def _append_failed(self, error: FieldError) -> None:
        """The batch's entries are applied but not stored: rebuild; refuse writes if need be."""
        logger.error("log append failed: %s; rebuilding state from the log", error.message)
        if error.code in _UNWRITABLE and self.refusing is None:
            self._refuse_writes(error)
        await self._rebuild()

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

    # -- a log that refuses writes ---------------------------------------------

    def _refuse_writes(self, error: FieldError) -> None:
        """Enter (or stay in) *refusing*: writes get ``error``'s kind up front; a probe
        looks for recovery."""
        if self.refusing is None:
            logger.warning("writes are refused until the log can be written again; reads go on")
        self.refusing = error
        kind = type(error) if isinstance(error, StorageFull | LogUnavailable) else LogUnavailable
        message = error.message
        self.field.writes_refused = lambda: kind(message)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._probe_log(), name="field-log-probe")

    async def _probe_log(self) -> None:
        """Every :data:`PROBE_SECONDS`, try one small append; on success, writes resume."""
        while self.refusing is not None:
            await asyncio.sleep(PROBE_SECONDS)
            state = self.field.state
            until = min(max(state.clock.value, state.clock.reserved) + RESERVATION_BLOCK, MAX_EPOCH)
            ts = max(time.time(), state.last_ts)
            entry = LogEntry(state.clock.value, "clock.reserved", {"until": until}, ts=ts)
            try:
                positions = await asyncio.to_thread(self.log.append, [entry])
            except FieldError as error:
                self._refuse_writes(error)
                continue
            except Exception:
                logger.exception("probing the log failed")
                continue
            # This runs on the loop between the writer's jobs, and the writer
            # appends nothing while writes are refused: the position is next.
            stored = StoredEntry(positions[0], entry.epoch, entry.kind, entry.data, None, ts)
            self.field.state.apply(stored)
            self.refusing = None
            self.field.writes_refused = None
            logger.warning("the log can be written again; writes resume")
            self._publish([stored])


@dataclass(slots=True)
class _Broken:
    """A job failed while applying committed entries; the state must be rebuilt."""

    error: FieldError
