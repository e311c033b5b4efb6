"""Registration over HTTP: the operator's registration tokens, and REGISTER's rate limit.

* ``POST /v1/registration-tokens`` (operator token): issue a token; its secret is in
  this one response.
* ``GET /v1/registration-tokens`` (operator token): the tokens held, without secrets.
* ``DELETE /v1/registration-tokens/{id}`` (operator token): revoke one.

What a token is and who may REGISTER is decided in :mod:`field.core.registration`.

:class:`RegisterLimit` is the per-client token bucket of REGISTER. Every
binding that carries REGISTER calls it *before* the request is queued for
the single writer (HTTP ``POST /v1/register``; a REGISTER envelope on the
WebSocket; MCP goes through HTTP), so a flood of registrations is turned
away at the edge and never delays anyone else's writes. Clients are counted
by address (:func:`~field.transports.connections.client_key`: an IPv4
address, an IPv6 /64); the operator is not limited.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..contract.errors import FieldError
from ..contract.ratelimit import KeyedLimiter, Rate
from ..core.context import Outcome
from ..core.field import Field
from ..engine.ratelimits import too_fast
from .connections import client_key
from .http import bearer_token, error_response, json_response, read_json

if TYPE_CHECKING:
    from .http import HTTPBinding


class RegisterLimit:
    """REGISTER's token bucket per client address; the operator goes past it."""

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

    def check_envelope(self, field: Field, body: Any, token: str | None, host: str | None) -> None:
        """:meth:`check` for a decoded envelope of any operation (a WebSocket's): only a
        REGISTER is counted."""
        if isinstance(body, dict) and body.get("operation") == "REGISTER":
            self.check(field, token, host)


def rate_limited(wait: float) -> FieldError:
    """The refusal of a REGISTER over its client's rate (:func:`.ratelimits.too_fast`)."""
    return too_fast(
        wait,
        "too many REGISTER requests from this address; slow down",
        operation="REGISTER",
        suggested_action="Retry after the Retry-After seconds (details.retry_after); register "
        "agents at a steady pace, or have the operator register them.",
    )


class RegistrationBinding:
    """The operator's endpoints of registration tokens."""

    def __init__(self, binding: HTTPBinding) -> None:
        self._binding = binding

    def routes(self) -> list[Route]:
        return [
            Route("/v1/registration-tokens", self.listing, methods=["GET"]),
            Route("/v1/registration-tokens", self.issue, methods=["POST"]),
            Route("/v1/registration-tokens/{token_id}", self.revoke, methods=["DELETE"]),
        ]

    async def issue(self, request: Request) -> Response:
        token = bearer_token(request)
        try:
            service = self._binding.running()
            body = await read_json(request, service.field.limits)
            outcome = await service.execute(
                lambda field: field.issue_registration_token(token, body)
            )
        except FieldError as error:
            return error_response(error)
        except ClientDisconnect:
            return Response(status_code=400)
        return json_response(outcome.response)

    async def listing(self, request: Request) -> Response:
        token = bearer_token(request)
        try:
            outcome = await self._binding.running().execute(
                lambda field: Outcome(field.registration_tokens(token))
            )
        except FieldError as error:
            return error_response(error)
        return json_response(outcome.response)

    async def revoke(self, request: Request) -> Response:
        token = bearer_token(request)
        token_id = request.path_params["token_id"]
        try:
            outcome = await self._binding.running().execute(
                lambda field: field.revoke_registration_token(token, token_id)
            )
        except FieldError as error:
            return error_response(error)
        return json_response(outcome.response)
