"""Health probes: ``GET /healthz`` (the process answers) and ``GET /readyz`` (it can serve).

Neither needs a token, and neither waits for the writer: both read the
server's state as it is, so they answer at once however busy it is.

``/healthz`` is the liveness probe: any answer at all means the process and
its event loop run, and the answer is always ``200 {"status": "ok"}``.

``/readyz`` is the readiness probe: ``200`` with what it checked when the
Field can take writes now, else ``503`` with the error response naming the
first reason in :data:`CHECKS` order (``details.reason``):

* ``starting``: the Field is not running yet, or is stopping;
* ``writer_stopped``: the single writer is not running (it is restarted at once);
* ``state_broken``: the state must be rebuilt from the log first;
* ``log_refusing``: the log refuses writes (disk full, locked): the code is
  the one writes get, ``STORAGE_FULL`` or ``LOG_UNAVAILABLE``;
* ``overloaded``: admission control refuses writes until the Field catches up.

A Field that is not ready still serves what it can (reads go on while the
log refuses writes); the probe tells a load balancer to send new work
elsewhere meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..contract.errors import Code, FieldError
from ..engine.admission import Mode, Work

if TYPE_CHECKING:
    from .runtime import Running, Runtime

#: The reasons ``/readyz`` may give, in the order they are checked.
CHECKS = ("starting", "writer_stopped", "state_broken", "log_refusing", "overloaded")


def health_routes(runtime: Runtime) -> list[Route]:
    """``/healthz`` and ``/readyz`` of the Field ``runtime`` runs."""

    async def healthz(request: Request) -> Response:
        return _json({"status": "ok"}, 200)

    async def readyz(request: Request) -> Response:
        reason, error = readiness(runtime)
        if error is not None:
            body = error.to_response()
            body["details"] = {"reason": reason}
            return _json(body, 503)
        return _json({"status": "ok", "checks": _checks(runtime.running())}, 200)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]


def readiness(runtime: Runtime) -> tuple[str | None, FieldError | None]:
    """(None, None) when the Field is ready; else the reason (one of :data:`CHECKS`) and
    the error that says it."""
    running = runtime.current
    if running is None:
        return "starting", _not_ready(Code.OVERLOADED, "the Field is starting or stopping")
    service = running.service
    if not service.running:
        return "writer_stopped", _not_ready(Code.OVERLOADED, "the Field's writer is not running")
    if service.field.broken:
        if service.unreadable is not None:
            return "state_broken", _not_ready(
                Code.LOG_UNAVAILABLE,
                f"the Field's state must be read back from its log: {service.unreadable}",
            )
        return "state_broken", _not_ready(
            Code.INTERNAL_ERROR, "the Field's state is being rebuilt from its log"
        )
    refusing = service.refusing
    if refusing is not None:
        return "log_refusing", _not_ready(
            refusing.code, f"the log refuses writes: {refusing.message}"
        )
    if service.admission.controllers[Work.WRITE].mode is Mode.SHEDDING:
        return "overloaded", _not_ready(
            Code.OVERLOADED, "the Field refuses writes until it catches up (overload)"
        )
    return None, None


def _not_ready(code: str, message: str) -> FieldError:
    return FieldError(
        message,
        code=code,
        recoverable=True,
        suggested_action="Send work elsewhere, or retry later: the Field recovers by itself.",
    )


def _checks(running: Running) -> dict[str, Any]:
    service = running.service
    return {
        "writer": "running",
        "log": "writable",
        "admission": "admitting",
        "last_position": service.field.state.last_position,
    }


def _json(body: dict[str, Any], status: int) -> Response:
    headers = {"Cache-Control": "no-store"}
    return Response(orjson.dumps(body), status, headers, media_type="application/json")
