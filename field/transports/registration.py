"""Registration over HTTP: the operator's registration tokens.

* ``POST /v1/registration-tokens`` (operator token): issue a token; its secret is in
  this one response.
* ``GET /v1/registration-tokens`` (operator token): the tokens held, without secrets.
* ``DELETE /v1/registration-tokens/{id}`` (operator token): revoke one.

What a token is and who may REGISTER is decided in :mod:`field.core.registration`;
REGISTER's rate per client is the front door's (:class:`~.door.RegisterLimit`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..contract.errors import FieldError
from ..core.context import Outcome
from .web import bearer_token, error_response, json_response, read_json

if TYPE_CHECKING:
    from .runtime import Runtime


class RegistrationBinding:
    """The operator's endpoints of registration tokens."""

    def __init__(self, runtime: Runtime) -> None:
        #: the Field's parts, while it runs
        self._runtime = runtime

    def routes(self) -> list[Route]:
        return [
            Route("/v1/registration-tokens", self.listing, methods=["GET"]),
            Route("/v1/registration-tokens", self.issue, methods=["POST"]),
            Route("/v1/registration-tokens/{token_id}", self.revoke, methods=["DELETE"]),
        ]

    async def issue(self, request: Request) -> Response:
        token = bearer_token(request)
        try:
            service = self._runtime.running().service
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
            outcome = await self._runtime.running().service.execute(
                lambda field: Outcome(field.registration_tokens(token))
            )
        except FieldError as error:
            return error_response(error)
        return json_response(outcome.response)

    async def revoke(self, request: Request) -> Response:
        token = bearer_token(request)
        token_id = request.path_params["token_id"]
        try:
            outcome = await self._runtime.running().service.execute(
                lambda field: field.revoke_registration_token(token, token_id)
            )
        except FieldError as error:
            return error_response(error)
        return json_response(outcome.response)
