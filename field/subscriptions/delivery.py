"""Durable delivery of a subscription: its state machine and its retry policy.

A subscription is delivered in one of three ways (``subscription.delivery``):

* ``stream``: the default; the agent reads it over a WebSocket or SSE, or
  polls. The Field keeps no delivery state for it.
* ``webhook``: the Field POSTs each notification, signed, to a URL.
* ``rap``: the Field POSTs the RAP ``tool_result`` of the subscribing call,
  then each notification as a ``subscription_event``, then one ``final``
  event, to a RAP runtime's ``callback_url``.

The last two are *durable*: their acknowledged position and their state are in
the log, so a restart resumes them where they stood. Their state is one
table, :data:`TRANSITIONS` (state x action -> state)::

    active   --fail-->    failing     (a refusal, or retries past their limit)
    failing  --recover--> active      (a delivery succeeded again)
    failing  --suspend--> suspended   (failing for longer than suspend_after)
    failing|suspended --resume--> active   (SUBSCRIBE "resume")
    active|failing|suspended --end--> ended (terminal: the subscription ended and
                                             everything it owed was delivered; or its
                                             RAP runtime let go of it, and it owes
                                             nothing, in the write that cancelled it)

Nothing is dropped in any state: a delivery keeps its position, and the log
holds what it owes. ``failing`` keeps trying, at ``failing_interval``;
``suspended`` waits for a ``resume``.

Beside each delivery's state, the Field keeps a :class:`Circuit` per agent and
endpoint (a receiver's scheme, host and port) whose requests keep timing out;
it is not in the log (a restart forgets it), and its table is
:data:`CIRCUIT`::

    closed  --trip-->       open      (open_after timeouts in a row, no answer between)
    open    --probe-->      probing   (its delay passed: one request goes)
    probing --probe_fail--> open      (that request got no answer: a longer delay)
    probing --abandon-->    open      (the Field gave the probe up: the next one probes)
    any     --answer-->     closed    (the endpoint answered something)

While it is not closed, the agent's deliveries to the endpoint are deferred
(no request: the delivery counts a failed attempt, waits and tries again) but
for the one probe, so an endpoint that keeps timing out holds one request of the
agent's at a time, where it held one per delivery.

This module is pure: it decides, the transport acts (``field/engine/delivery.py``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..contract.errors import Code, StateError

DELIVERY_TYPES: tuple[str, ...] = ("stream", "webhook", "rap")
#: The types the Field delivers itself (with state in the log).
DURABLE_TYPES: frozenset[str] = frozenset({"webhook", "rap"})
DELIVERY_STATES: tuple[str, ...] = ("active", "failing", "suspended", "ended")

#: The delivery state machine: state -> {action: state after}.
TRANSITIONS: dict[str, dict[str, str]] = {
    "active": {"fail": "failing", "end": "ended"},
    "failing": {"recover": "active", "suspend": "suspended", "resume": "active", "end": "ended"},
    "suspended": {"resume": "active", "end": "ended"},
    "ended": {},
}


def step(state: str, action: str, subscription_id: str) -> str:
    """The state after ``action``, or INVALID_TRANSITION naming the allowed actions."""
    after = TRANSITIONS[state].get(action)
    if after is None:
        allowed = sorted(TRANSITIONS[state])
        raise StateError(
            f"the delivery of {subscription_id} is {state}; {action!r} is not allowed",
            code=Code.INVALID_TRANSITION,
            recoverable=False,
            suggested_action=(
                f"Allowed now: {', '.join(allowed)}." if allowed else "It has ended."
            ),
            details={"from": state, "action": action, "allowed": allowed},
        )
    return after


class Verdict(enum.Enum):
    """What one attempt's answer means for the delivery."""

    DELIVERED = "delivered"  #: a 2xx: the next notification may go
    RETRY = "retry"  #: no answer, a timeout, 408, 429 or a 5xx: the same again, later
    REFUSED = "refused"  #: any other answer: the receiver will not take it as it is


def verdict(status: int | None) -> Verdict:
    """The verdict of an attempt answered with HTTP ``status`` (None: no answer at all)."""
    if status is None or status in (408, 429) or status >= 500:
        return Verdict.RETRY
    if 200 <= status < 300:
        return Verdict.DELIVERED
    return Verdict.REFUSED


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """When to try a notification again, and when to give up on the receiver for now.

    Delays are exponential with *full jitter*: attempt n (from 1) waits a
    uniform draw in ``[0, min(cap, base * 2**(n-1))]``, and never less than
    the receiver's ``Retry-After``. A notification that failed
    ``max_attempts`` times, or for ``max_age`` seconds since its first
    failure, makes the delivery ``failing``; from then on one attempt is
    made every ``failing_interval`` seconds, and after ``suspend_after``
    seconds of failing the delivery is ``suspended``.
    """

    base: float = 1.0
    cap: float = 60.0
    max_attempts: int = 10
    max_age: float = 3600.0
    failing_interval: float = 300.0
    suspend_after: float = 86400.0
    #: requests of one agent to one endpoint that time out this many times in a row
    #: open its :class:`Circuit`
    open_after: int = 3

    def __post_init__(self) -> None:
        for name in ("base", "cap", "max_age", "failing_interval", "suspend_after"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if self.open_after < 1:
            raise ValueError(f"open_after must be at least 1, not {self.open_after}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait after the ``attempt``-th failure in a row: ``base * 2**(n-1)``,
        at most ``cap``."""
        return min(self.cap, self.base * 2.0 ** min(attempt - 1, 62))

    def delay(
        self, attempt: int, draw: Callable[[], float], retry_after: float | None = None
    ) -> float:
        """Seconds before attempt ``attempt + 1``, after ``attempt`` failed (``draw``: [0, 1))."""
        wait = draw() * self.ceiling(attempt)
        if retry_after is not None and math.isfinite(retry_after):
            wait = max(wait, min(retry_after, self.failing_interval))
        return wait

    def exhausted(self, attempts: int, first_failure: float, now: float) -> bool:
        """Whether a notification failing since ``first_failure`` makes the delivery failing."""
        return attempts >= self.max_attempts or now - first_failure >= self.max_age


#: An endpoint's circuit: state -> {action: state after} (see the module docstring).
#: ``timeout`` and ``fail`` (no answer, not a timeout) of requests other than the probe
#: leave an open or probing circuit as it is; only an answer closes it.
CIRCUIT: dict[str, dict[str, str]] = {
    "closed": {"answer": "closed", "timeout": "closed", "fail": "closed", "trip": "open"},
    "open": {"answer": "closed", "timeout": "open", "fail": "open", "probe": "probing"},
    "probing": {
        "answer": "closed",
        "timeout": "probing",
        "fail": "probing",
        "probe_fail": "open",
        "abandon": "open",
    },
}


class Outcome(enum.Enum):
    """What became of one request, as a circuit sees it."""

    ANSWERED = "answer"  #: any HTTP status: the endpoint is there and answers
    TIMED_OUT = "timeout"  #: no answer in time (or cut short: see ``DeliverySettings``)
    FAILED = "fail"  #: no answer, at once (refused, reset, the egress policy)
    ABANDONED = "abandon"  #: the request was given up by the Field (its delivery stopped)


class Circuit:
    """The timeouts of one agent's requests to one endpoint, and what they allow now.

    ``timeouts`` counts timeouts in a row (an answer resets it, a failure at once does
    not); ``trips`` counts the times it opened in a row, each delay longer than the one
    before (:meth:`RetryPolicy.ceiling`, with equal jitter: between half of it and all
    of it). Pure: the caller passes the time and the random draw.
    """

    __slots__ = ("state", "timeouts", "trips", "retry_at", "delay")

    def __init__(self) -> None:
        self.state = "closed"
        self.timeouts = 0
        self.trips = 0
        #: while open: when the next request may go, as the probe
        self.retry_at = 0.0
        #: the delay of the last opening, in seconds
        self.delay = 0.0

    @property
    def fresh(self) -> bool:
        """Closed with nothing counted: the same as no circuit at all."""
        return self.state == "closed" and self.timeouts == 0

    def admit(self, now: float) -> tuple[bool, float]:
        """Whether a request may go now, as (probe, wait): ``wait`` > 0 defers it that
        many seconds; ``probe`` says the request that goes is the one probe."""
        if self.state == "closed":
            return False, 0.0
        if self.state == "open" and now >= self.retry_at:
            self._step("probe")
            return True, 0.0
        if self.state == "open":
            return False, self.retry_at - now
        return False, self.delay  # probing: the probe's answer decides

    def record(
        self,
        outcome: Outcome,
        now: float,
        *,
        probe: bool,
        policy: RetryPolicy,
        draw: Callable[[], float],
    ) -> None:
        """Note how one request ended (``probe``: it was the one :meth:`admit` let probe)."""
        if outcome is Outcome.ANSWERED:
            self._step("answer")
            self.timeouts = self.trips = 0
            return
        if outcome is Outcome.TIMED_OUT:
            self.timeouts += 1
        probing = probe and self.state == "probing"
        if outcome is Outcome.ABANDONED:
            if probing:  # not the endpoint's doing: the next request probes at once
                self._step("abandon")
                self.retry_at = now
            return
        if probing:
            self._step("probe_fail")
        elif self.state == "closed" and self.timeouts >= policy.open_after:
            self._step("trip")
        else:
            self._step(outcome.value)
            return
        self.trips += 1
        self.delay = policy.ceiling(self.trips) * (0.5 + draw() / 2)
        self.retry_at = now + self.delay

    def _step(self, action: str) -> None:
        after = CIRCUIT[self.state].get(action)
        if after is None:  # the transport's mistake, never an outside party's
            raise ValueError(f"a {self.state} circuit cannot {action}")
        self.state = after


@dataclass(frozen=True, slots=True)
class RapCall:
    """The RAP invocation a subscription answers: where its events go, and for whom."""

    callback_url: str
    group_id: str
    tool_call_id: str
    user_id: str | None
    associative: bool = False
    #: the invocation's secondary call id, echoed in its tool result
    call_id: str | None = None


#: A durable delivery's progress when no engine reports it (a Field with no server).
class Progress(Protocol):
    """How far each durable delivery is, as the engine that sends them knows it (what
    SUBSCRIBE ``list`` shows beside the state the log holds)."""

    def progress(self, subscription_id: str) -> dict[str, Any] | None:
        """The delivery's ``owed``, ``attempts``, ``last_status``, ``last_error`` and
        ``next_attempt_at``; None when no sink sends it here (:data:`IDLE_PROGRESS`)."""


IDLE_PROGRESS: dict[str, Any] = {
    "owed": None,
    "attempts": 0,
    "last_status": None,
    "last_error": None,
    "next_attempt_at": None,
}


def public_delivery(delivery: dict[str, Any]) -> dict[str, Any]:
    """A durable delivery as the wire shows it: never its secret, never its tool result."""
    return {k: v for k, v in delivery.items() if k not in _PRIVATE}


#: Fields of a delivery's record that stay inside the Field.
_PRIVATE = frozenset({"secret", "acked", "created_position", "agent_id", "reason", "state"})
