"""Rate limits per agent: on the operations an agent sends, and (in the push hub) on
the notifications it is sent.

The Field has one writer, and every operation goes through it: without a
limit, one agent sending as fast as it can keeps the writer busy for everyone.
Each registered agent therefore has a token bucket (:class:`KeyedLimiter`, one
for the server, keyed by agent id) that every operation it sends takes a token
from, whichever way it comes: ``POST /v1/<operation>``, an envelope on its
WebSocket, an authenticated ``GET`` list, a RAP invocation. An operation over
the rate is refused with ``429 RATE_LIMITED`` and ``Retry-After``.

The check runs on the event loop *before* the job is queued for the writer
(the point is to spare the writer): the bearer token is resolved to its agent
by its hash in the Field's token map, read only, as :meth:`Field.authenticate`
would. A request whose token names no registered agent (none, a garbled one,
a revoked one) is not counted: it fails authentication in the writer anyway,
at the cost of one lookup. The operator's token is in no agent's map, so the
operator is never limited. When an agent deregisters, its bucket is forgotten:
the id may be registered again, and that agent starts with a full bucket.

``--agent-rate 0`` turns the limit off. The notifications' side is
:meth:`field.engine.push.PushHub.pace`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..contract.errors import Code, FieldError
from ..contract.model import StoredEntry
from ..contract.ratelimit import MAX_KEYS, KeyedLimiter, Rate
from ..core.field import Field, hash_token

#: Defaults of ``--agent-rate`` and ``--agent-burst``: operations one agent may send a
#: second on average, and at once. 200 a second is a few per cent of what the writer
#: commits (2,000-6,000 durable RECORDs a second); a burst of 2,000 lets a bulk import
#: of that many units, or the largest burst our own tests send from one agent (1,600
#: concurrent RECORDs), through without a refusal.
DEFAULT_AGENT_RATE = 200.0
DEFAULT_AGENT_BURST = 2000
#: Defaults of ``--notify-rate`` and ``--notify-burst``: notifications one agent's push
#: connections are written a second, all together, and at once.
DEFAULT_NOTIFY_RATE = 1000.0
DEFAULT_NOTIFY_BURST = 2000


def rate_of(per_second: float, burst: int) -> Rate | None:
    """The :class:`Rate` of a ``--*-rate`` and ``--*-burst`` pair; None (no limit) at 0."""
    return None if per_second == 0 else Rate(per_second, burst)


def agent_of(field: Field, token: str | None) -> str | None:
    """The registered agent ``token`` belongs to, without the writer; None for no token,
    the operator's, or one the Field did not issue or has revoked."""
    if not token:
        return None
    return field.state.tokens.get(hash_token(token))


def too_fast(
    wait: float, message: str, *, suggested_action: str, operation: str | None
) -> FieldError:
    """``429 RATE_LIMITED`` for a request ``wait`` seconds too early, as ``Retry-After``
    (whole seconds, rounded up) and ``details.retry_after`` (seconds, to the millisecond,
    rounded up: a WebSocket frame has no header)."""
    error = FieldError(
        message,
        code=Code.RATE_LIMITED,
        recoverable=True,
        operation=operation,
        suggested_action=suggested_action,
        details={"retry_after": math.ceil(wait * 1000) / 1000},
    )
    error.retry_after = wait
    return error


def rate_limited(wait: float, rate: Rate, operation: str | None = None) -> FieldError:
    """The refusal of an operation over its agent's rate (:func:`too_fast`)."""
    return too_fast(
        wait,
        f"the agent is sending more than {rate.per_second:g} operations a second "
        f"(at most {rate.burst:g} at once); this one was not run",
        operation=operation,
        suggested_action="Retry after details.retry_after seconds (the Retry-After header over "
        f"HTTP), and send at most {rate.per_second:g} operations a second on average.",
    )


class AgentRateLimits:
    """The per-agent limit on operations of one server (module docstring)."""

    def __init__(
        self,
        rate: Rate | None,
        *,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: None: operations are not limited
        self.limiter = None if rate is None else KeyedLimiter(rate, max_keys=max_keys, clock=clock)
        #: operations refused since start-up
        self.refused = 0

    def admit(self, field: Field, token: str | None, operation: str | None = None) -> None:
        """Take a token for the agent of ``token``, or raise ``RATE_LIMITED``."""
        limiter = self.limiter
        if limiter is None:
            return
        agent_id = agent_of(field, token)
        if agent_id is None:
            return
        wait = limiter.take(agent_id)
        if wait:
            self.refused += 1
            raise rate_limited(wait, limiter.rate, operation)

    def published(self, entries: list[StoredEntry]) -> None:
        """Forget the buckets of agents that deregistered (a listener of the writer)."""
        if self.limiter is None:
            return
        for entry in entries:
            if entry.kind == "agent.deregistered":
                self.limiter.forget(entry.data["agent_id"])
