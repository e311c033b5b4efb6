"""Admission control: refuse work quickly, rather than let it wait for seconds.

Every request waits twice on its way through the server: for the event
loop (to be read, parsed, answered, and for its push fan-out to be
written) and for the single writer (in its queue). Either wait grows
without bound once more is offered than the server does. The **delay**
is the larger of the two, sampled every :attr:`AdmissionPolicy.sample`
seconds by :class:`~field.service.FieldService`: how late the sampling
timer fired (the loop's lag) and how long the oldest queued job has waited.

Each class of work has a controller, a two-state machine in the manner of
CoDel (Nichols and Jacobson, 2012): a short burst is absorbed, a standing
queue is not::

    admitting --the delay stays above `target` for `interval`--> shedding
    shedding  --a sample of the delay falls below `target`-----> admitting

While *shedding*, new work of that class is refused at once with ``503
OVERLOADED`` and ``Retry-After`` (:class:`~field.errors.Overloaded`), before
it takes any queue room or writer time; the work already admitted goes
on, so the delay falls and admission resumes. Writes (operations that add
to the log and to the push fan-out: the ones that make the load) shed at a
low target; reads (ATTUNE, REPLAY, the GET listings) at a higher one, so
that they keep being served while writes are refused; the server's own
jobs (liveness, delivery acknowledgements) and DEREGISTER are never shed.
The choice of targets is measured in ``benchmarks/overload.py``.

Pure: no I/O; the time comes from the caller.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from .errors import Overloaded

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
    #: what a refused client is told to wait (``Retry-After``, whole seconds on HTTP)
    retry_after: float = 1.0

    def __post_init__(self) -> None:
        for name in ("write_target", "read_target", "interval", "sample", "retry_after"):
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


class Admission:
    """The controllers of one server, fed delay samples, asked before each job."""

    def __init__(self, policy: AdmissionPolicy | None = None) -> None:
        self.policy = policy or AdmissionPolicy()
        self.controllers = {
            Work.WRITE: Controller(self.policy.write_target, self.policy.interval),
            Work.READ: Controller(self.policy.read_target, self.policy.interval),
        }
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
        """Raise ``OVERLOADED`` if ``work`` is being shed; otherwise nothing."""
        controller = self.controllers.get(work)
        if controller is None or controller.mode is Mode.ADMITTING:
            return
        controller.shed += 1
        error = Overloaded(
            f"the Field is overloaded: {work.value}s are refused until it catches up "
            f"(requests wait {self.delay * 1000:.0f} ms)",
            operation=operation,
            suggested_action=f"Retry after {self.policy.retry_after:g} s, or slow down.",
        )
        error.retry_after = self.policy.retry_after
        raise error

    def status(self) -> dict[str, object]:
        """For the status page: each class's mode and what it refused."""
        return {
            "delay_ms": round(self.delay * 1000, 1),
            **{
                work.value: {
                    "mode": c.mode.value,
                    "refused": c.shed,
                    "episodes": c.episodes,
                }
                for work, c in self.controllers.items()
            },
        }
