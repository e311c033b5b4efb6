"""Admission control: refuse work quickly, rather than let it wait for seconds.

Every request waits twice on its way through the server: for the event
loop (to be read, parsed, answered, and for its push fan-out to be
written) and for the single writer (in its queue). Either wait grows
without bound once more is offered than the server does. The **delay**
is the larger of the two, sampled every :attr:`AdmissionPolicy.sample`
seconds by :class:`~field.engine.service.FieldService`: how late the sampling
timer fired (the loop's lag) and how long the oldest queued job has waited.

Each class of work has a controller, a two-state machine in the manner of
CoDel (Nichols and Jacobson, 2012): a short burst is absorbed, a standing
queue is not::

    admitting --the delay stays above `target` for `interval`--> shedding
    shedding  --a sample of the delay falls below `target`-----> admitting

While *shedding*, new work of that class is refused at once with ``503
OVERLOADED`` and ``Retry-After`` (:class:`~field.contract.errors.Overloaded`), before
it takes any queue room or writer time; the work already admitted goes
on, so the delay falls and admission resumes. Writes (operations that add
to the log and to the push fan-out: the ones that make the load) shed at a
low target; reads (ATTUNE, REPLAY, the GET listings) at a higher one, so
that they keep being served while writes are refused; the server's own
jobs (liveness, delivery acknowledgements) and DEREGISTER are never shed.
The choice of targets is measured in ``benchmarks/overload.py``.

A delay is sampled after the fact: requests read in the moment it dips
under the target are all admitted, and a batch of fifty writes, each
fanned out to a thousand streams, keeps the writer (and their clients)
busy for far longer than the target. So writes have a second bound, on
the work they stand for (:class:`WriteBudget`): the writer measures what a
write costs it (its share of a batch's fan-out) and what a batch costs
beside its writes (the commit), and no more writes are let in at once
than the writer can answer within ``write_budget`` seconds; one more is
refused at once, whatever the delay.

Pure: no I/O; the time comes from the caller.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..contract.errors import Overloaded

logger = logging.getLogger("field.admission")

#: Operations refused first under overload: they write to the log and feed the push
#: fan-out. (DEREGISTER lightens the load; ATTUNE and REPLAY are reads.)
WRITES = frozenset(
    {
        "REGISTER",
        "RECORD",
        "DETECT",
        "MERGE",
        "SUBSCRIBE",
        "COMPACT",
        "COORDINATE",
        "HANDOFF",
        "SESSION",
        "FEEDBACK",
    }
)
#: Seconds between two log lines about shedding.
REPORT_SECONDS = 60.0
#: Operations never refused for load.
NEVER_SHED = frozenset({"DEREGISTER"})
#: The names the server's own jobs run under (failing silent agents, expiring
#: subscriptions; acknowledging and moving deliveries): they write, are never refused for
#: load, and on a log shared by several nodes take its lock as writes do. No client can
#: name them: an operation is one of the protocol's before it reaches admission.
SERVER_JOBS = frozenset({"LIVENESS", "DELIVERY"})


class Work(enum.Enum):
    """The classes of work admission tells apart."""

    WRITE = "write"
    READ = "read"
    #: the server's own jobs, and what lightens the load: always admitted
    INTERNAL = "internal"


def work_of(operation: str | None) -> Work:
    """The class of a job by its operation (None: one of the server's own jobs)."""
    if operation is None or operation in NEVER_SHED or operation in SERVER_JOBS:
        return Work.INTERNAL
    return Work.WRITE if operation in WRITES else Work.READ


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionPolicy:
    """The targets of admission control, in seconds (``0`` turns a class's shedding off)."""

    #: standing delay past which writes are refused
    write_target: float = 0.02
    #: standing delay past which reads are refused too
    read_target: float = 0.25
    #: how long the delay must stay above a target before shedding starts
    interval: float = 0.1
    #: seconds between two samples of the delay
    sample: float = 0.01
    #: seconds of the writer's work that the writes admitted and not yet answered may
    #: stand for, as measured (:class:`WriteBudget`); ``0``: no such bound
    write_budget: float = 0.1
    #: what a refused client is told to wait (``Retry-After``, whole seconds on HTTP)
    retry_after: float = 1.0

    def __post_init__(self) -> None:
        names = ("write_target", "read_target", "write_budget", "interval", "sample")
        for name in (*names, "retry_after"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a number of seconds, not {value!r}")
        if self.sample <= 0:
            raise ValueError("sample must be positive")


class Mode(enum.Enum):
    ADMITTING = "admitting"
    SHEDDING = "shedding"


class Controller:
    """One class of work's state: admitting or shedding (see the module's diagram)."""

    __slots__ = ("target", "interval", "mode", "_above_since", "shed", "episodes")

    def __init__(self, target: float, interval: float) -> None:
        self.target = target
        self.interval = interval
        self.mode = Mode.ADMITTING
        #: when the delay last went above the target (None: it is below)
        self._above_since: float | None = None
        #: requests refused, and times shedding started, since start-up
        self.shed = 0
        self.episodes = 0

    def observe(self, delay: float, now: float) -> bool:
        """Take one sample; whether the mode changed."""
        if self.target <= 0:
            return False
        if delay < self.target:
            self._above_since = None
            changed = self.mode is Mode.SHEDDING
            self.mode = Mode.ADMITTING
            return changed
        if self._above_since is None:
            self._above_since = now
        elif self.mode is Mode.ADMITTING and now - self._above_since >= self.interval:
            self.mode = Mode.SHEDDING
            self.episodes += 1
            return True
        return False


#: A write budget's limit past which writes are not bounded by it at all.
UNBOUNDED = 1 << 20


class WriteBudget:
    """How many writes may be admitted and unanswered at once: as many as the writer
    answers within ``budget`` seconds, by what writes and batches have cost it.

    A batch of ``n`` writes takes about ``fixed + n * per_write`` seconds; both
    are moving averages of what batches took (:meth:`measured`). The first
    ``floor`` writes are always let in: a write must be able to go, however
    costly, or the measure would never be renewed.
    """

    __slots__ = ("budget", "floor", "per_write", "fixed", "in_flight", "_limit")

    #: weight of a new measure in the moving averages
    ALPHA = 0.2

    def __init__(self, budget: float, floor: int = 2) -> None:
        self.budget = budget
        self.floor = floor
        #: seconds of the writer's time per write (its share of the fan-out), and per
        #: batch beside its writes; None until measured
        self.per_write: float | None = None
        self.fixed: float | None = None
        #: writes admitted and not answered yet
        self.in_flight = 0
        self._limit: float = math.inf

    @property
    def limit(self) -> float:
        """Writes that may be in flight at once (``inf``: no bound yet, or none set)."""
        return self._limit

    def measured(self, writes: int, per_writes: float, rest: float) -> None:
        """A batch of ``writes`` writes took ``per_writes`` seconds in proportion to them
        (publishing what they wrote) and ``rest`` beside them."""
        if writes <= 0 or self.budget <= 0:
            return
        alpha = self.ALPHA
        share = per_writes / writes
        self.per_write = (
            share if self.per_write is None else self.per_write + alpha * (share - self.per_write)
        )
        self.fixed = rest if self.fixed is None else self.fixed + alpha * (rest - self.fixed)
        limit = (self.budget - self.fixed) / self.per_write if self.per_write > 0 else math.inf
        # more writes than any queue holds: no bound (and no 400-digit number on the status)
        self._limit = math.inf if limit >= UNBOUNDED else max(self.floor, math.floor(limit))

    def full(self) -> bool:
        return self.in_flight >= self._limit


class Admission:
    """The controllers of one server, fed delay samples, asked before each job."""

    def __init__(self, policy: AdmissionPolicy | None = None) -> None:
        self.policy = policy or AdmissionPolicy()
        self.controllers = {
            Work.WRITE: Controller(self.policy.write_target, self.policy.interval),
            Work.READ: Controller(self.policy.read_target, self.policy.interval),
        }
        #: the bound on the work admitted writes stand for
        self.writes = WriteBudget(self.policy.write_budget)
        #: the last delay sampled, in seconds
        self.delay = 0.0
        #: called with a class of work and its new mode at every change
        self.on_change: Callable[[Work, Mode], None] | None = None
        self._next_report = -math.inf

    def observe(self, delay: float, now: float) -> None:
        """One sample of the delay (seconds) at ``now``."""
        self.delay = delay
        for work, controller in self.controllers.items():
            if controller.observe(delay, now):
                self._changed(work, controller, now)

    def _changed(self, work: Work, controller: Controller, now: float) -> None:
        if controller.mode is Mode.SHEDDING:
            if now >= self._next_report:  # one line a minute at most, however it flaps
                self._next_report = now + REPORT_SECONDS
                logger.warning(
                    "overloaded: refusing %ss while requests wait above %.0f ms (now %.0f ms); "
                    "%d refused so far",
                    work.value,
                    controller.target * 1000,
                    self.delay * 1000,
                    controller.shed,
                )
        else:
            logger.debug("caught up: admitting %ss again", work.value)
        if self.on_change is not None:
            self.on_change(work, controller.mode)

    def admit(self, work: Work, operation: str | None = None) -> None:
        """Raise ``OVERLOADED`` if ``work`` is refused now; otherwise it is admitted, and
        a write is in flight until :meth:`answered`."""
        self.check(work, operation)
        if work is Work.WRITE:
            self.writes.in_flight += 1

    def check(self, work: Work, operation: str | None = None) -> None:
        """Raise ``OVERLOADED`` if ``work`` would be refused now (nothing is admitted:
        a transport asks before it reads a request's body)."""
        controller = self.controllers.get(work)
        if controller is None:
            return
        if controller.mode is Mode.SHEDDING:
            why = f"requests wait {self.delay * 1000:.0f} ms"
        elif work is Work.WRITE and self.writes.full():
            why = f"{self.writes.in_flight} writes are waiting to be answered"
        else:
            return
        controller.shed += 1
        # raised straight from the builder: an exception held in a local of the frame that
        # raises it is a reference cycle (exception, traceback, frame), which keeps the
        # refused request's objects for the garbage collector; under overload, thousands a
        # second, collected in pauses of tens of milliseconds
        raise self._refusal(work, why, operation)

    def _refusal(self, work: Work, why: str, operation: str | None) -> Overloaded:
        error = Overloaded(
            f"the Field is overloaded: {work.value}s are refused until it catches up ({why})",
            operation=operation,
            suggested_action=f"Retry after {self.policy.retry_after:g} s, or slow down.",
        )
        error.retry_after = self.policy.retry_after
        return error

    def answered(self, work: Work) -> None:
        """A job :meth:`admit` let in is answered (or will not be)."""
        if work is Work.WRITE:
            self.writes.in_flight -= 1

    def status(self) -> dict[str, object]:
        """For the status page: each class's mode and what it refused."""
        writes = self.writes
        return {
            "delay_ms": round(self.delay * 1000, 1),
            "writes_in_flight": writes.in_flight,
            "writes_limit": None if math.isinf(writes.limit) else int(writes.limit),
            **{
                work.value: {
                    "mode": c.mode.value,
                    "refused": c.shed,
                    "episodes": c.episodes,
                }
                for work, c in self.controllers.items()
            },
        }
