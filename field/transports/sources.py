"""Inbound event sources over HTTP: the operator's endpoints and the events endpoint.

* ``POST /v1/sources`` (operator token): define or redefine a source.
* ``GET /v1/sources`` (operator token): the sources, with their counts.
* ``DELETE /v1/sources/{name}`` (operator token): remove one.
* ``POST /v1/sources/{name}/events``: an event, signed by its sender. In this
  order, each step before the next: the media type, the body's size (the
  source's ``max_payload_bytes``, before and while it is read), the signature
  over the raw bytes (constant time), the timestamp (Standard Webhooks), then
  the parse, the filter, and one write through the single writer, which refuses
  a delivery id already accepted (and, for GitHub, whose signature covers the
  body alone, a body already accepted). Nothing is stored unless every step passed.

What the core decides is in :mod:`field.core.sources`; this module only reads
bytes and headers and counts answers. The ``filtered`` and ``refused`` counts
are kept in memory since the server started; ``accepted`` is a count of the log.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..contract.errors import Code, FieldError, InvalidPayload, ValidationError
from ..core import sources
from ..core.context import Outcome
from ..core.field import Field
from ..engine.admission import Work
from ..engine.service import FieldService
from .documents import decode_document
from .web import bearer_token, error_response, json_response, read_body, read_json

if TYPE_CHECKING:
    from .runtime import Runtime

logger = logging.getLogger("field.sources")

EVENTS_PATH = "/v1/sources/{name}/events"


#: Request headers a source's filter and templates never see (credentials).
_PRIVATE_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


class SourcesBinding:
    """The endpoints of inbound event sources, and their in-memory counts."""

    def __init__(self, runtime: Runtime, *, tolerance: float) -> None:
        #: the Field's parts, while it runs
        self._runtime = runtime
        #: seconds a Standard Webhooks timestamp may be from the Field's time
        self.tolerance = tolerance
        #: per source name: events filtered out and refused, since start-up
        self.filtered: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        #: per source name: the definition whose secret was opened, and its HMAC key
        self._keys: dict[str, tuple[sources.Source, bytes]] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/v1/sources", self.list_sources, methods=["GET"]),
            Route("/v1/sources", self.define, methods=["POST"]),
            Route("/v1/sources/{name}", self.remove, methods=["DELETE"]),
            Route(EVENTS_PATH, self.event, methods=["POST"]),
        ]

    # -- the operator's endpoints ------------------------------------------------

    async def define(self, request: Request) -> Response:
        token = bearer_token(request)
        try:
            service = self._runtime.running().service
            body = await read_json(request, service.field.limits)
            outcome = await service.execute(lambda field: field.define_source(token, body))
        except FieldError as error:
            return error_response(error)
        except ClientDisconnect:
            return Response(status_code=400)
        response = outcome.response
        name = response["source"]["name"]
        response["source"]["events_url"] = self._events_url(request, name)
        return json_response(response)

    async def remove(self, request: Request) -> Response:
        token = bearer_token(request)
        name = request.path_params["name"]
        try:
            outcome = await self._runtime.running().service.execute(
                lambda field: field.remove_source(token, name)
            )
        except FieldError as error:
            return error_response(error)
        self.filtered.pop(name, None)
        self.refused.pop(name, None)
        self._keys.pop(name, None)
        return json_response(outcome.response)

    async def list_sources(self, request: Request) -> Response:
        token = bearer_token(request)

        def listing(field: Field) -> Outcome:
            shown = [
                {
                    **source.public(),
                    "events_url": self._events_url(request, source.name),
                    "counts": self.counts(source),
                }
                for source in field.list_sources(token)
            ]
            return Outcome({"status": "ok", "sources": shown, "epoch": field.epoch})

        try:
            outcome = await self._runtime.running().service.execute(listing)
        except FieldError as error:
            return error_response(error)
        return json_response(outcome.response)

    def counts(self, source: sources.Source) -> dict[str, int]:
        return {
            "accepted": source.accepted,
            "filtered": self.filtered[source.name],
            "refused": self.refused[source.name],
        }

    def status(self, field: Field) -> dict[str, Any]:
        """What ``GET /v1/field/status`` shows of the sources: scheme and counts."""
        return {
            name: {"scheme": source.scheme, **self.counts(source)}
            for name, source in sorted(field.state.sources.items())
        }

    @staticmethod
    def _events_url(request: Request, name: str) -> str:
        return str(request.base_url).rstrip("/") + EVENTS_PATH.format(name=name)

    # -- events ------------------------------------------------------------------

    async def event(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            service = self._runtime.running().service
            source = sources.source_of(service.field.state, name)
        except FieldError as error:
            return error_response(error)
        try:
            outcome = await self._ingest(request, service, source)
        except FieldError as error:
            self.refused[name] += 1
            return error_response(error)
        except ClientDisconnect:
            self.refused[name] += 1
            return Response(status_code=400)
        if outcome is None:
            self.filtered[name] += 1
            return json_response({"status": "filtered"})
        if outcome.response["status"] == "duplicate":
            self.refused[name] += 1  # nothing stored: counted with the refusals
        return json_response(outcome.response)

    async def _ingest(
        self, request: Request, service: FieldService, source: sources.Source
    ) -> Outcome | None:
        """The event's unit, recorded; None if the filter let it pass by."""
        body = await self._body(request, source, service.field.limits.max_body_bytes)
        headers = request.headers
        key = self._key(service.field, source)
        delivery_id: str | None
        timestamp: int | None = None
        if source.scheme == "github":
            if not sources.verify_github(key, body, headers.get("x-hub-signature-256")):
                raise sources.bad_signature("X-Hub-Signature-256 is missing or wrong")
            delivery_id = headers.get("x-github-delivery")
            if delivery_id is not None and not sources.DELIVERY_ID.fullmatch(delivery_id):
                raise InvalidPayload("X-GitHub-Delivery must be 1 to 256 visible characters")
        else:
            delivery_id = headers.get("webhook-id")
            raw_time = headers.get("webhook-timestamp")
            signature = headers.get("webhook-signature")
            if delivery_id is None or raw_time is None or signature is None:
                raise sources.bad_signature(
                    "webhook-id, webhook-timestamp and webhook-signature are all required"
                )
            if not sources.DELIVERY_ID.fullmatch(delivery_id) or not sources.verify_standard(
                key, delivery_id, raw_time, signature, body
            ):
                raise sources.bad_signature("webhook-signature does not match")
            timestamp = sources.check_timestamp(raw_time, time.time(), self.tolerance)
        payload = decode_document(body, service.field.limits, what="the event", as_sent=True)
        if not isinstance(payload, dict):
            raise InvalidPayload("an event's body is a JSON object")
        # what a filter or a template may read: never a credential the sender attached
        shown_headers = {k: v for k, v in headers.items() if k not in _PRIVATE_HEADERS}
        if source.filter is not None:
            passed = source.filter.evaluate({"payload": payload, "headers": shown_headers})
            if passed is not True:
                return None
        digest = sources.body_digest(body)
        event = sources.Event(source, delivery_id, timestamp, payload, shown_headers, digest)
        # an inbound event is a write: refused first under overload (its sender retries)
        return await service.execute(lambda field: field.ingest_event(event), work=Work.WRITE)

    @staticmethod
    async def _body(request: Request, source: sources.Source, most: int) -> bytes:
        """The raw body, at most the source's ``max_payload_bytes`` (unread past it)."""
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise ValidationError(
                "events must be sent as application/json",
                code=Code.UNSUPPORTED_MEDIA_TYPE,
                suggested_action="Send the header 'Content-Type: application/json' (for "
                "GitHub: content type application/json in the webhook's settings).",
            )
        limit = min(source.definition["max_payload_bytes"], most)
        return await read_body(request, limit, "the event")

    def _key(self, field: Field, source: sources.Source) -> bytes:
        """The HMAC key of ``source``: its sealed secret opened once per definition."""
        cached = self._keys.get(source.name)
        if cached is not None and cached[0] is source:
            return cached[1]
        try:
            secret = field.secret_box.open(source.definition["secret"], context=source.name)
        except ValueError:
            logger.error("the secret of source %s does not open with this key", source.name)
            raise FieldError(
                "the source's secret cannot be opened by this server",
                code=Code.INTERNAL_ERROR,
                suggested_action="The operator must define the source again.",
            ) from None
        key = sources.decode_key(source, secret)
        self._keys[source.name] = (source, key)
        return key
