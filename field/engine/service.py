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

**Several nodes, one Field.** On a shared log (PostgreSQL) other
processes append too. Before each batch the writer brings the Field up to
the log: a batch that may write first takes the log's lock
(:meth:`EventLog.lock`), applies what the other nodes appended since, then
runs, and its append releases the lock; so every write is validated
against every earlier entry, whichever node wrote it, and epochs in the
log never go back. A batch of reads only reads the log's head and applies
what is new, without the lock: a read sees every write acknowledged, on
any node, before its batch began, unless the log could not be read: then
reads are served from what the node holds, and a recheck task (off the
writer, every :data:`PROBE_SECONDS`) says when batches of reads catch up
again, so that a table locked elsewhere costs reads one lock timeout, not
one per batch (and a REPLAY whose entries could not be read makes the next
ones refused ``LOG_UNAVAILABLE`` at once meanwhile: it reads the log on the
event loop). Should such a batch still write (a
clock reservation) and another node have appended meanwhile, the
reservation, which commutes with everything, is stored after their
entries. A follower task (:meth:`EventLog.follow`: ``LISTEN/NOTIFY``)
wakes the writer when another node commits, so an idle node applies and
pushes what others wrote within milliseconds. Every entry a node applies,
its own or another's, is published to the listeners in log order: push
streams, deliveries and the console see the one log on every node.

The queue is bounded (``max_queue``), and so is the wait: admission
control (:mod:`field.engine.admission`) samples how late the event loop runs and
how long the oldest queued job has waited, and while that delay stands
above its target, new writes (and, past a higher target, reads) are
refused at once with ``OVERLOADED`` and ``Retry-After`` instead of
queueing for seconds; so are writes past the work the writer can answer
within a budget (:class:`~field.engine.admission.WriteBudget`, fed by every batch's
measured cost). A full queue is refused the same way.

A batch is published (its push fan-out) a slice of :data:`PUBLISH_SLICE`
at a time, the loop reading requests between slices, and answered once
published: an answer on a socket follows the frames its entries made.

With a sentence model (``embedder``, :mod:`field.engine.embedder`) units are
embedded after their commit, off the loop: a batch whose units are not
embedded yet is answered at once and *held*, published (in log order,
with every later batch) once they are; ATTUNE and DETECT first wait up to
:data:`~field.engine.embedder.READ_WAIT` seconds for the units before them; and
while the embedding queue is full the writer takes no writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..contract.clock import RESERVATION_BLOCK
from ..contract.errors import (
    Code,
    FieldError,
    LogUnavailable,
    Overloaded,
    StorageFull,
    internal_error,
)
from ..contract.model import MAX_EPOCH, LogEntry, StoredEntry
from ..core.context import Outcome
from ..core.field import Field
from ..ranking.embedding import Embedder
from ..store.base import EventLog
from . import snapshotter as snapshots
from .admission import Admission, AdmissionPolicy, Work, work_of
from .embedder import READ_WAIT, EmbeddingWorker
from .listeners import Listeners

#: Seconds of a batch's publishing (its push fan-out) between two turns of the event loop.
PUBLISH_SLICE = 0.005
logger = logging.getLogger("field.service")

Job = Callable[[Field], Outcome]

#: Seconds between attempts to write to a log that refused an append.
PROBE_SECONDS = 1.0
#: Error codes of an append that make the log *refusing* (the others are bugs).
_UNWRITABLE = frozenset({Code.STORAGE_FULL, Code.LOG_UNAVAILABLE})
#: Entries read from a shared log per step when catching up with other nodes.
CATCH_UP_PAGE = 1000
#: Entries behind past which a node catches up before taking the log's lock, not under it.
CATCH_UP_UNLOCKED = 256
#: Entry kinds that commute with every other entry: a batch of reads that wrote only these
#: may store them after what another node appended meanwhile.
_COMMUTING = frozenset({"clock.reserved"})
#: Operations that read the units' embeddings: with embedding after the commit, they wait
#: (a while) for the units recorded before them.
_READ_EMBEDDINGS = frozenset({"ATTUNE", "DETECT"})
#: Seconds a starting service waits for a log that cannot be read now (a lock elsewhere).
START_WAIT = 300.0
#: Seconds a stopping service waits for held batches to be embedded and published.
DRAIN_SECONDS = 5.0


@dataclass(slots=True)
class _Pending:
    job: Job
    future: asyncio.Future[Outcome]
    operation: str | None
    #: the loop's time when it was queued
    queued_at: float
    #: its class for admission control
    work: Work = Work.INTERNAL

    @property
    def locks(self) -> bool:
        """Whether the job may write (on a shared log, its batch runs under the log's lock)."""
        return self.work is not Work.READ

    @property
    def writes(self) -> bool:
        """Whether it is a client's write (admission control's budget counts what they cost)."""
        return self.work is Work.WRITE


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
        node_id: str = "node-1",
        embed_after_commit: Embedder | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        """``embed_after_commit``: the Field's embedder, when units are to be embedded
        after their commit, off the loop (:mod:`field.engine.embedder`). ``on_batch``: told
        the number of jobs of every batch the writer takes (metrics)."""
        self.log = log
        #: embeds units after their commit (None: they are embedded when first read)
        self.embeddings: EmbeddingWorker | None = None
        if embed_after_commit is not None:
            self.embeddings = EmbeddingWorker(lambda: self.field.state.index, embed_after_commit)
            self.embeddings.on_progress = self._release_held
        #: published batches waiting for their units' embeddings, in log order, each with
        #: how many units must be embedded first (see :meth:`_hold`)
        self._held: deque[tuple[list[StoredEntry], int]] = deque()
        self._releasing: asyncio.Task[None] | None = None
        #: this process's name among the nodes of the Field (status, logs)
        self.node_id = node_id
        self._field_factory = field_factory
        #: entries of the batch being processed that are applied but not yet stored
        self._unstored: list[LogEntry] = []
        self.field = self._first_load()
        self._queue = _JobQueue(max_queue)
        #: refuses work while the delay stands above its target (field.engine.admission)
        self.admission = Admission(admission)
        self._sampler: asyncio.Task[None] | None = None
        self._max_batch = max_batch
        self._writer: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        #: while set, batches of reads do not catch up and REPLAY is refused at once
        #: (see :meth:`_recheck_log`)
        self._recheck: asyncio.Task[None] | None = None
        #: why REPLAY could not read the log's entries, while :meth:`_recheck_log` runs
        self._entries_unreadable: str | None = None
        self._stopping = False
        self._blocking_log = log.persistent
        #: called, stage by stage, with every batch of newly durable entries, in log
        #: order; a listener may return its work as steps (an iterator), which the writer
        #: runs a slice of :data:`PUBLISH_SLICE` seconds at a time, the loop running between
        self.listeners = Listeners()
        #: seconds the current batch has spent publishing so far
        self._publishing = 0.0
        #: what :meth:`when_answered` was given while the current batch was published
        self._after_answers: list[tuple[Callable[..., object], tuple[object, ...]]] = []
        #: called with the agent of every operation that succeeded (:meth:`tell_seen`)
        self._on_seen: Callable[[str], None] | None = None
        #: called with the number of jobs of every batch the writer takes (metrics)
        self._on_batch = on_batch
        #: True while a batch is applied but not yet durable and published
        self.busy = False
        #: why writes are refused (the append's error), or None while the log is writable
        self.refusing: FieldError | None = None
        #: how many times the state was rebuilt from the log since start-up
        self.rebuilds = 0
        #: the newest log position known to exist (other nodes' appends included)
        self.log_head = self.field.state.last_position
        #: the newest position handed to the listeners (or held for them): what the log
        #: holds after it is published after a rebuild (:meth:`_publish_missed`)
        self.published = self.field.state.last_position
        #: whether this writer holds the shared log's lock (between lock and append)
        self._locked = False
        self._follower: asyncio.Task[None] | None = None
        #: a wake-up job is queued (the follower queues at most one at a time)
        self._woken = False
        #: the last catch-up failed: reads are served from this node's state as it is
        self._stale = False
        #: why the last rebuild could not read the log (None: it did, or it failed on a bug);
        #: while set (and the state broken), every job gets ``LOG_UNAVAILABLE`` saying it
        self.unreadable: str | None = None

    def _first_load(self) -> Field:
        """:meth:`_load` at start-up, waiting out a log that cannot be read for now (a
        table locked elsewhere, a database restarting) for up to :data:`START_WAIT`
        seconds: nothing is served before the state is built."""
        deadline = time.monotonic() + START_WAIT
        waited = False
        while True:
            try:
                field = self._load()
            except LogUnavailable as error:
                if time.monotonic() >= deadline:
                    raise
                if not waited:
                    logger.warning(
                        "the event log cannot be read yet (%s); trying again every %g s",
                        error.message,
                        PROBE_SECONDS,
                    )
                    waited = True
                time.sleep(PROBE_SECONDS)
                continue
            if waited:
                logger.warning("the event log is read: starting")
            return field

    def _load(self) -> Field:
        """A Field rebuilt from the log: from its newest usable snapshot, if it has one, and
        the entries after it (:mod:`field.engine.snapshotter`)."""
        field = self._field_factory()
        #: the snapshot the state was last rebuilt from (None: the whole log)
        self.started_from = snapshots.load(field, self.log)
        field.read_entries = self._read_entries
        field.sliced_reads = True  # execute() builds large pages in steps
        if self.embeddings is not None:
            field.state.index.deferred = True  # the replay's last units included
        return field

    async def _rebuild(self) -> None:
        """Replace the Field with one rebuilt from the log, off the event loop.

        If the rebuild itself fails, the broken Field stays (``broken`` set):
        the writer answers every job with the error that stopped it (the
        log's, such as ``LOG_UNAVAILABLE``, recoverable; else an internal
        error) and tries again before each batch.
        """
        await self._release()
        self.rebuilds += 1
        try:
            if self._blocking_log:
                field = await asyncio.to_thread(self._load)
            else:
                field = self._load()
        except FieldError as error:  # the log cannot be read now: no bug, no traceback
            if self.unreadable is None:
                logger.error("rebuilding the state from the log failed: %s", error.message)
            self.unreadable = error.message
            self.field.broken = True
            return
        except Exception:
            logger.exception("rebuilding the state from the log failed; will try again")
            self.unreadable = None
            self.field.broken = True
            return
        if self.unreadable is not None:
            logger.info("the state is rebuilt from the log: serving again")
            self.unreadable = None
        # what others set on the Field they see carries over to the rebuilt one
        field.writes_refused = self.field.writes_refused
        self.field = field
        if self.embeddings is not None:
            self.embeddings.replaced()
        await self._publish_missed()

    async def _publish_missed(self) -> None:
        """Publish, in log order, what the state holds past :attr:`published`.

        Only a rebuild leaves such entries: those other nodes appended while this
        node's state was broken, and a batch whose commit failed with its outcome
        unknown but which was stored. The state holds them, so they are published as
        another node's entries are; without this, every stream, delivery and console of
        this node would go on past them. A read that fails is tried again before the
        next batch (:meth:`_run`)."""
        state = self.field.state
        while self.published < state.last_position:
            page = min(CATCH_UP_PAGE, state.last_position - self.published)
            try:
                if self._blocking_log:
                    entries = await asyncio.to_thread(self.log.read, self.published, page)
                else:
                    entries = self.log.read(self.published, page)
            except FieldError as error:
                logger.warning(
                    "publishing the entries after %d (rebuilt from the log) waits: %s",
                    self.published,
                    error.message,
                )
                return
            entries = [e for e in entries if e.position <= state.last_position]
            if not entries:
                return
            await self._publish_in_slices(entries)

    def _read_entries(
        self, positions: Sequence[int], *, max_bytes: int | None = None
    ) -> list[StoredEntry]:
        """Entries by position for REPLAY: from the log, or from the batch in progress.

        A job may read entries an earlier job of its batch produced: they
        are applied but not yet stored, and follow the log's last position.
        ``max_bytes`` bounds what is read from the log (see ``read_positions``).
        """
        stored_up_to = self.field.state.last_position
        wanted = [p for p in positions if p <= stored_up_to]
        if wanted and self._entries_unreadable is not None and self._rechecking:
            # the entries could not be read lately: this runs on the event loop, which
            # must not wait out a lock timeout per REPLAY
            raise LogUnavailable(self._entries_unreadable)
        try:
            found = self.log.read_positions(wanted, max_bytes=max_bytes)
        except LogUnavailable as error:
            self._entries_unreadable = error.message
            self._cannot_read()
            raise
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

    @property
    def lag(self) -> int:
        """Entries in the log this node has not applied yet (0 but on a shared log)."""
        return max(0, self.log_head - self.field.state.last_position)

    async def start(self) -> None:
        if self.log.shared:
            # two nodes starting on an empty log: the lock lets one create the Field
            await self._catch_up(lock=True)
        genesis = self.field.genesis()
        if genesis:
            await self._append(genesis)
        await self._release()
        if self.embeddings is not None:
            self.embeddings.start()
            self.embeddings.wake()
        self._start_writer()
        self._sampler = asyncio.create_task(self._sample_delay(), name="field-admission")
        if self.log.shared:
            self._follower = asyncio.create_task(self._follow(), name="field-follower")

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
        if self.embeddings is not None:
            await self._drain_held()
            await self.embeddings.stop()
        for task in (self._probe, self._follower, self._recheck):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._probe = self._follower = self._recheck = None
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
        work = work or work_of(operation)
        self.admission.admit(work, operation)
        try:
            if self.embeddings is not None and operation in _READ_EMBEDDINGS:
                # read-your-writes while the model keeps up; never longer than READ_WAIT
                await self.embeddings.caught_up(len(self.field.state.index), READ_WAIT)
            loop = asyncio.get_running_loop()
            future: asyncio.Future[Outcome] = loop.create_future()
            pending = _Pending(job, future, operation, loop.time(), work)
            try:
                self._queue.put_nowait(pending)
            except asyncio.QueueFull:
                raise Overloaded("the Field's request queue is full", operation=operation) from None
            outcome = await future
        finally:
            self.admission.answered(work)
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
            if self._on_batch is not None:
                self._on_batch(len(batch))
            loop = asyncio.get_running_loop()
            started = loop.time()
            self._publishing = 0.0
            self.busy = True
            try:
                if self.embeddings is not None and any(p.writes for p in batch):
                    await self.embeddings.room()  # full: writes wait, admission refuses more
                if self.field.broken:
                    await self._rebuild()
                elif self.published < self.field.state.last_position:
                    await self._publish_missed()  # after a rebuild whose read failed
                if not self.field.broken:
                    await self._prepare(batch)
                if self.field.broken:
                    self._answer_rest(batch, self.unreadable)  # LOG_UNAVAILABLE, or internal
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
                await self._release()
                took = loop.time() - started
                writes = sum(p.writes for p in batch)
                self.admission.writes.measured(writes, self._publishing, took - self._publishing)
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
                await self._release()
                await self._rebuild()
                if i + 1 < len(batch):
                    await self._prepare(batch[i + 1 :])
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
            failure = internal_error(pending.operation)
            if self.field.broken:
                return _Broken(failure)
            return failure  # nothing was committed: the Field is as it was

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
            except _Moved:
                # the reads' answers stand; what they wrote is not stored: start afresh
                logger.warning(
                    "another node appended while a batch of reads wrote %s; rebuilding",
                    sorted({e.kind for e in entries}),
                )
                await self._rebuild()
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
        # published before it is answered: a socket's answer follows the frames its own
        # entries made (an unsubscribe's "end" comes before its response)
        await self._publish_in_slices(stored)
        for pending, result in zip(batch, results, strict=False):
            if pending.future.done():  # the client went away
                continue
            if isinstance(result, FieldError):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)
        self._answered()
        on_seen = self._on_seen
        if on_seen is not None:
            for result in results:
                if isinstance(result, Outcome) and result.agent_id is not None:
                    on_seen(result.agent_id)

    def tell_seen(self, seen: Callable[[str], None]) -> None:
        """From now on, call ``seen`` with the agent of every operation that succeeds (one
        callable: the liveness monitor's :meth:`~field.engine.liveness.Liveness.seen`).

        A method rather than a constructor argument: the monitor is built on the service
        (it reads its state and runs its verdicts through it), so it exists only after."""
        self._on_seen = seen

    def when_answered(self, callback: Callable[..., object], *args: object) -> None:
        """Call ``callback(*args)`` soon after the batch being published is answered: a
        listener's step that must follow the answers (closing a deregistered agent's
        sockets after the response to its DEREGISTER)."""
        self._after_answers.append((callback, args))

    def _answered(self) -> None:
        after, self._after_answers = self._after_answers, []
        loop = asyncio.get_running_loop()
        for callback, args in after:
            loop.call_soon(callback, *args)

    def _publish(self, stored: list[StoredEntry]) -> None:
        """Publish ``stored`` to every listener at once (entries the writer did not write)."""
        if not self._due(stored):
            return
        for listener in self.listeners.ordered:
            try:
                for _ in listener(stored) or ():
                    pass
            except Exception:  # a push failure must never undo or block a commit
                logger.exception("publishing %d entries failed", len(stored))
        self._answered()

    async def _publish_in_slices(self, stored: list[StoredEntry]) -> None:
        """Publish ``stored``, letting the loop run every :data:`PUBLISH_SLICE` seconds:
        a batch's fan-out may take long, and requests are read (and refused) meanwhile."""
        if self._due(stored):
            await self._publish_now(stored)

    def _due(self, stored: list[StoredEntry]) -> bool:
        """Hand ``stored`` to the listeners' side (:attr:`published` passes it); whether it
        is published now, or waits for its units' embeddings (:meth:`_hold`)."""
        if not stored:
            return False
        self.published = max(self.published, stored[-1].position)
        return not self._hold(stored)

    async def _publish_now(self, stored: list[StoredEntry]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        due = started + PUBLISH_SLICE
        for listener in self.listeners.ordered:  # as it was: one may leave meanwhile
            try:
                for _ in listener(stored) or ():
                    if loop.time() >= due:
                        await asyncio.sleep(0)
                        due = loop.time() + PUBLISH_SLICE
            except Exception:  # a push failure must never undo or block a commit
                logger.exception("publishing %d entries failed", len(stored))
        self._publishing += loop.time() - started

    # -- publishing after the embeddings -----------------------------------------

    def _hold(self, stored: list[StoredEntry]) -> bool:
        """Whether ``stored`` waits for embeddings before it is published (and now
        waits): its units, or a held batch before it, are not embedded yet."""
        if self.embeddings is None:
            return False
        index = self.field.state.index
        if not self._held and index.scorable >= len(index):
            return False
        self._held.append((stored, len(index)))
        self.embeddings.wake()
        self._release_held()
        return True

    @property
    def held(self) -> int:
        """Entries committed whose publishing waits for embeddings."""
        return sum(len(stored) for stored, _ in self._held)

    def _release_held(self) -> None:
        """Publish the held batches whose units are embedded (one task at a time)."""
        if self._held and (self._releasing is None or self._releasing.done()):
            self._releasing = asyncio.get_running_loop().create_task(
                self._publish_held(), name="field-publish-held"
            )

    async def _publish_held(self) -> None:
        assert self.embeddings is not None
        while self._held:
            stored, needed = self._held[0]
            index = self.field.state.index  # a rebuilt one holds no more units than needed
            if index.scorable < min(needed, len(index)):
                await self.embeddings.progress()
                continue
            try:
                await self._publish_now(stored)
            finally:
                self._held.popleft()  # published, or failed as a publish does: never again
            self._answered()

    async def _drain_held(self) -> None:
        """Give held batches :data:`DRAIN_SECONDS` to be published (a stopping service);
        what is left is owed from the log at the next start, as after a crash."""
        if not self._held:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_SECONDS):
                while self._held:
                    self._release_held()
                    assert self._releasing is not None
                    await asyncio.shield(self._releasing)
        if self._held:
            logger.warning(
                "stopping with %d entries not published (their units are not embedded yet)",
                self.held,
            )

    def _answer_rest(self, batch: list[_Pending], unreadable: str | None = None) -> None:
        """Answer every job of ``batch`` still waiting with an internal error, or with
        ``LOG_UNAVAILABLE`` saying ``unreadable`` (why the log cannot be read)."""
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(
                    internal_error(pending.operation)
                    if unreadable is None
                    else LogUnavailable(unreadable)
                )

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
        state = self.field.state
        if self.log.shared and not self._locked:
            entries[:] = await self._relock(entries)
        try:
            if self._blocking_log:
                positions = await asyncio.to_thread(self.log.append, entries)
            else:
                positions = self.log.append(entries)
        finally:
            self._locked = False  # the append released the lock, or failed and dropped it
        state.last_position = state.applied_position = positions[-1]
        self.log_head = max(self.log_head, positions[-1])
        return positions

    # -- several nodes on a shared log ------------------------------------------

    async def _prepare(self, batch: list[_Pending]) -> None:
        """On a shared log, bring the Field up to the log before ``batch`` runs: under
        the log's lock when one of its jobs may write. While writes are refused, reads
        are served from what this node holds, and so are they while the log could not
        be read lately (a table locked elsewhere): a read waits out the log's lock
        timeout once, not once per batch, until :meth:`_recheck_log` finds it readable."""
        if not self.log.shared or self.refusing is not None:
            return
        lock = any(p.locks for p in batch)
        if lock or not self._rechecking:
            await self._catch_up(lock=lock)

    async def _catch_up(self, *, lock: bool) -> None:
        """Apply what other nodes appended; with ``lock``, end holding the log's lock.

        A node far behind reads most of the way without the lock, so that it
        holds the lock only for the last few entries.
        """
        state = self.field.state
        try:
            if not lock or self.lag > CATCH_UP_UNLOCKED:
                self.log_head = max(self.log_head, await asyncio.to_thread(self.log.head))
                while state.last_position < self.log_head:
                    entries = await asyncio.to_thread(
                        self.log.read, state.last_position, CATCH_UP_PAGE
                    )
                    if not entries:
                        break
                    self._follow_entries(entries)
            if lock:
                entries = await asyncio.to_thread(self.log.lock, state.last_position)
                self._locked = True
                self._follow_entries(entries)
        except FieldError as error:
            if lock:
                self._refuse_writes(error)  # this batch's writes are refused up front
            else:
                if not self._stale:
                    logger.warning("reads are served without catching up: %s", error.message)
                self._cannot_read()
            self._stale = True
        else:
            if self._stale:
                logger.warning("caught up with the log again")
            self._stale = False

    @property
    def _rechecking(self) -> bool:
        return self._recheck is not None and not self._recheck.done()

    def _cannot_read(self) -> None:
        """The log could not be read: start :meth:`_recheck_log`."""
        if self._rechecking or self._stopping:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the loop: the next read on it starts the recheck
            return
        self._recheck = loop.create_task(self._recheck_log(), name="field-recheck")

    async def _recheck_log(self) -> None:
        """Every :data:`PROBE_SECONDS`, read the log's head and the entry after this
        node's position, off the writer and off the connection the reads use
        (:meth:`EventLog.check_readable`); once both answer, wake the writer (its next
        batch of reads catches up again)."""
        while True:
            await asyncio.sleep(PROBE_SECONDS)
            try:
                await asyncio.to_thread(self.log.check_readable, self.field.state.last_position)
            except FieldError:
                continue
            except Exception:
                logger.exception("probing the log for reads failed")
                continue
            break
        self._recheck = None
        self._entries_unreadable = None
        self._wake()

    def _follow_entries(self, entries: list[StoredEntry]) -> None:
        """Apply entries other nodes appended (in log order) and publish them."""
        state = self.field.state
        fresh = [e for e in entries if e.position > state.last_position]
        for entry in fresh:
            if entry.position != state.last_position + 1:
                self.field.broken = True
                raise RuntimeError(
                    f"the log went from position {state.last_position} to {entry.position}"
                )
            try:
                state.apply(entry)
            except Exception:
                self.field.broken = True
                raise
        if fresh:
            self.log_head = max(self.log_head, fresh[-1].position)
            self._publish(fresh)

    async def _relock(self, entries: list[LogEntry]) -> list[LogEntry]:
        """Take the lock for a batch that ran without it (reads) but wrote ``entries``.

        When no other node appended since the batch began, they go next as
        they are. Otherwise, entries that commute (a clock reservation) go
        after the others' entries, which are applied first, with an epoch and
        a time no earlier than theirs; any other kind raises :class:`_Moved`.
        """
        state = self.field.state
        others = await asyncio.to_thread(self.log.lock, state.last_position)
        self._locked = True
        if not others:
            return entries
        if any(e.kind not in _COMMUTING for e in entries):
            raise _Moved
        self._follow_entries(others)
        epoch, ts = state.clock.value, state.last_ts
        return [
            LogEntry(max(e.epoch, epoch), e.kind, e.data, e.agent_id, max(e.ts, ts))
            for e in entries
        ]

    async def _release(self) -> None:
        """Release the shared log's lock if a batch took it and stored nothing."""
        if not self._locked:
            return
        self._locked = False
        try:
            await asyncio.to_thread(self.log.unlock)
        except FieldError as error:  # the connection is gone, and the lock with it
            logger.warning("releasing the log's lock: %s", error.message)

    async def _follow(self) -> None:
        """Wake the writer whenever the log's head passes what this node applied."""
        async for head in self.log.follow():
            self.log_head = max(self.log_head, head)
            if head > self.field.state.last_position:
                self._wake()

    def _wake(self) -> None:
        """Queue one job that does nothing (at most one at a time): its batch catches up."""
        if self._woken or not self.running or self._stopping:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        try:
            # a read's class: its batch catches up without the log's lock
            self._queue.put_nowait(_Pending(_nothing, future, None, loop.time(), Work.READ))
        except asyncio.QueueFull:
            return  # a full queue's next batch catches up anyway
        self._woken = True
        future.add_done_callback(self._woke)

    def _woke(self, future: asyncio.Future[Outcome]) -> None:
        self._woken = False
        if not future.cancelled():
            future.exception()  # retrieved: a wake-up's failure matters to no one

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
            self.refusing = None
            self.field.writes_refused = None
            logger.warning("the log can be written again; writes resume")
            if self.log.shared:
                self._wake()  # other nodes may have appended first: read it in order
                return
            # This runs on the loop between the writer's jobs, and the writer
            # appends nothing while writes are refused: the position is next.
            stored = StoredEntry(positions[0], entry.epoch, entry.kind, entry.data, None, ts)
            self.field.state.apply(stored)
            self._publish([stored])


def _nothing(field: Field) -> Outcome:
    """The follower's wake-up: a job that does nothing, so that a batch catches up."""
    return Outcome({})


class _Moved(Exception):
    """A batch that ran without the shared log's lock wrote entries that do not commute
    with what another node appended meanwhile (see :meth:`FieldService._relock`)."""


@dataclass(slots=True)
class _Broken:
    """A job failed while applying committed entries; the state must be rebuilt."""

    error: FieldError
