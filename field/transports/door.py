"""The front door: the one way an operation comes in, whatever its transport.

HTTP (``POST /v1/<operation>``), an envelope on a WebSocket, an MCP tool call and a RAP
invocation all take the same steps, in the same order, through one :class:`FrontDoor`:

1. **admit**, before anything is read or run: the agent's rate of operations, the
   writer's admission control (``OVERLOADED`` while requests wait too long) and, for a
   REGISTER, its client address's rate;
2. the transport **decodes** its own framing within bounds (a request body, a frame, tool
   arguments, an invocation): that alone differs between them;
3. **run** on the single writer, after the egress check of any webhook the envelope
   names;
4. **observe** what came of it, answer or error, once (metrics and the access log).

A transport opens a :class:`Visit` for steps 1 to 4 (``with door.visit(...)``): whatever
ends the visit, a result or a :class:`~field.contract.errors.FieldError`, is observed as
it leaves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from ..contract.errors import FieldError
from ..contract.ratelimit import KeyedLimiter, Rate
from ..engine.admission import work_of
from ..engine.delivery import check_webhook
from ..engine.ratelimits import too_fast
from .connections import client_key

if TYPE_CHECKING:
    from ..core.context import Outcome
    from ..core.field import Field
    from ..engine.ratelimits import AgentRateLimits
    from .access import Access
    from .runtime import Runtime


class Observer(Protocol):
    """What is told of every operation answered (:class:`~.metrics.Observer`: the metrics
    and the access log)."""

    def operation(
        self,
        transport: str,
        operation: str | None,
        started: float,
        result: Outcome | FieldError,
        body: Any = None,
        *,
        access: Access | None = None,
        request_id: str | None = None,
    ) -> None: ...


class RegisterLimit:
    """REGISTER's token bucket per client address; the operator goes past it.

    Every transport that carries REGISTER takes from it at the door, *before* the
    request is queued for the single writer (HTTP ``POST /v1/register``; a REGISTER
    envelope on the WebSocket; MCP goes through HTTP), so a flood of registrations is
    turned away at the edge and never delays anyone else's writes. Clients are counted
    by address (:func:`~field.transports.connections.client_key`: an IPv4 address, an
    IPv6 /64).
    """

    def __init__(self, rate: Rate, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limiter = KeyedLimiter(rate, clock=clock)
        #: REGISTER requests refused since start-up
        self.refused = 0

    def check(self, field: Field, token: str | None, host: str | None) -> None:
        """Take one REGISTER from ``host``; raise RATE_LIMITED (with ``retry_after``) if
        it is over its rate. Nothing is taken from the operator."""
        if token and field.is_operator(token):
            return
        wait = self.limiter.take(client_key(host))
        if wait > 0:
            self.refused += 1
            raise rate_limited(wait)


def rate_limited(wait: float) -> FieldError:
    """The refusal of a REGISTER over its client's rate (:func:`.ratelimits.too_fast`)."""
    return too_fast(
        wait,
        "too many REGISTER requests from this address; slow down",
        operation="REGISTER",
        suggested_action="Retry after the Retry-After seconds (details.retry_after); register "
        "agents at a steady pace, or have the operator register them.",
    )


class FrontDoor:
    """Admission, running on the writer and observation, for every transport."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        rate_limits: AgentRateLimits,
        register_limit: RegisterLimit | None = None,
        observer: Observer | None = None,
    ) -> None:
        #: where the door finds the running service (OVERLOADED while there is none)
        self._runtime = runtime
        #: the per-agent limit on operations (one for the server, whatever the transport)
        self.rate_limits = rate_limits
        #: REGISTER's per-client rate, checked before the writer's queue
        self.register_limit = register_limit
        #: told of every operation answered (metrics, access log); None: neither
        self.observer = observer

    def visit(
        self,
        transport: str,
        operation: str | None = None,
        *,
        access: Access | None = None,
        request_id: str | None = None,
    ) -> Visit:
        """One operation through the door, observed when it ends (see :class:`Visit`)."""
        return Visit(self, transport, operation, access, request_id)

    def admit(self, token: str | None, operation: str | None, host: str | None = None) -> None:
        """Refuse an operation before anything of it is read or run: over its agent's rate
        (``RATE_LIMITED``), while the writer sheds (``OVERLOADED``), or a REGISTER over its
        client's rate. Raises; returns None when admitted."""
        service = self._runtime.running().service
        self.rate_limits.admit(service.field, token, operation)
        service.admission.check(work_of(operation), operation)
        if operation == "REGISTER" and self.register_limit is not None:
            self.register_limit.check(service.field, token, host)

    async def run(
        self, job: Callable[[Field], Outcome], operation: str | None, body: Any = None
    ) -> Outcome:
        """Run ``job`` on the single writer; ``body``, the envelope it runs, if any, is
        first checked for a webhook the egress policy refuses."""
        service = self._runtime.running().service
        if body is not None:
            await check_webhook(body, service.field.egress)
        return await service.execute(job, operation=operation)


class Visit:
    """One operation through the door: ``with door.visit(...) as visit``. Set
    :attr:`operation` and :attr:`body` as they are learnt, and :attr:`result` to what
    was answered; a :class:`FieldError` that leaves the block is the result. The result
    is observed once, as the block ends, and let go of (a refusal's exception, its
    traceback and the frame holding the visit would otherwise make a garbage cycle)."""

    def __init__(
        self,
        door: FrontDoor,
        transport: str,
        operation: str | None,
        access: Access | None,
        request_id: str | None,
    ) -> None:
        self.door = door
        self.transport = transport
        self.operation = operation
        self.access = access
        self.request_id = request_id
        self.started = time.perf_counter()
        #: the decoded document, once it is (the access log and metrics read its kind)
        self.body: Any = None
        #: what the operation came to: its outcome, or the error it was answered with
        self.result: Outcome | FieldError | None = None

    def __enter__(self) -> Visit:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, FieldError):
            self.result = error
        result, self.result = self.result, None  # no cycle: an error's frames hold the visit
        observer = self.door.observer
        if observer is None or result is None:
            return
        observer.operation(
            self.transport,
            self.operation,
            self.started,
            result,
            self.body,
            access=self.access,
            request_id=self.request_id,
        )
