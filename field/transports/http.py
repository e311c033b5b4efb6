"""HTTP binding (spec 10.3): a thin Starlette adapter over the service.

Each ``POST /v1/<operation>`` reads a bounded body, decodes one JSON
envelope, hands it through the front door to the single writer and encodes
what comes back: the response payload with 200, or the error response of spec
8.1 with the status :data:`field.contract.errors.HTTP_STATUS` gives its code.
No request ever gets a stack trace: the application (:mod:`.asgi`) turns
unexpected failures into ``INTERNAL_ERROR``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..contract.errors import FieldError, InvalidPayload
from ..contract.model import (
    CONFLICT_STATUSES,
    CONFLICT_TYPES,
    UNRESOLVED_CONFLICT_STATUSES,
    Limits,
    StoredEntry,
)
from ..core.authority import require_operator
from ..core.context import Outcome
from ..core.field import Field
from ..core.pages import DEFAULT_GET_LIMIT, PageRequest, page_request
from ..core.state import AgentRecord
from ..core.validation import AGENT_ID
from ..engine.admission import Work
from ..engine.ratelimits import agent_of
from ..subscriptions.events import event_of
from ..subscriptions.stream import event_fields, format_cursor, parse_cursor
from .access import access_of
from .web import (
    OPERATION_ROUTES,
    absolute_urls,
    bearer_token,
    error_response,
    json_response,
    read_json,
)

if TYPE_CHECKING:
    from .door import FrontDoor
    from .runtime import Running, Runtime


class HTTPBinding:
    """The operations, the status page and the GET lists of one Field."""

    def __init__(
        self,
        runtime: Runtime,
        door: FrontDoor,
        *,
        limits: Limits,
        sources: Callable[[Field], dict[str, Any]] | None = None,
    ) -> None:
        #: the Field's parts, while it runs
        self._runtime = runtime
        #: the way in of every operation, whatever its transport
        self.door = door
        #: the bounds of every request and document
        self.limits = limits
        #: what the status page shows of the inbound sources (their counts)
        self._sources = sources
        self.started = time.monotonic()

    def routes(self) -> list[Route]:
        """``GET /v1/field/status``, ``/v1/agents``, ``/v1/conflicts`` and ``POST
        /v1/<operation>`` (which the application also serves straight)."""
        return [
            Route("/v1/field/status", self.field_status, methods=["GET"]),
            Route("/v1/agents", self.agents, methods=["GET"]),
            Route("/v1/conflicts", self.conflicts, methods=["GET"]),
            Route("/v1/agents/{agent_id}/fail", self.declare_failed, methods=["POST"]),
            Route("/v1/events", self.events, methods=["GET"]),
            *(
                Route(f"/v1/{name}", self.operation_endpoint(operation), methods=["POST"])
                for name, operation in OPERATION_ROUTES.items()
            ),
        ]

    def operation_endpoint(self, operation: str) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            return await self.operation(request, operation)

        return endpoint

    async def operation(self, request: Request, operation: str) -> Response:
        access = access_of(request.scope)
        token: str | None = None
        with self.door.visit("http", operation, access=access) as visit:
            try:
                token = bearer_token(request)
                client = request.client
                # first: a refusal costs no body read
                self.door.admit(token, operation, None if client is None else client.host)
                visit.body = body = await read_json(request, self.limits)
                visit.result = outcome = await self.door.run(
                    lambda field: field.handle(body, token=token, operation=operation),
                    operation,
                    body,
                )
            except FieldError as error:
                running = self._runtime.current
                if access is not None and running is not None:  # whose request failed
                    access.agent = agent_of(running.service.field, token)
                visit.result = error
                return error_response(error, operation)
            except ClientDisconnect:
                # the client left before its body arrived: nothing ran, no one to answer
                return Response(status_code=400)
        response = outcome.response
        if "ws_url" in response:  # SUBSCRIBE's: built from the Host header, for it alone
            response = absolute_urls(response, str(request.base_url).rstrip("/"))
        return json_response(response)

    async def _read(
        self, request: Request, job: Callable[[Field, AgentRecord], dict[str, Any]]
    ) -> Response:
        token = bearer_token(request)
        access = access_of(request.scope)

        def authenticated(field: Field) -> Outcome:
            agent = field.authenticate(token)
            if access is not None:
                access.agent = agent.id
            return Outcome(job(field, agent))

        try:
            self.door.admit(token, None)
            outcome = await self._runtime.running().service.execute(authenticated, work=Work.READ)
        except FieldError as error:
            return error_response(error)
        return json_response(outcome.response)

    async def field_status(self, request: Request) -> Response:
        """The status page, read straight from the Field: it never waits for the writer,
        so it answers while the writer is busy or the log is stalled."""
        try:
            return json_response(self.status())
        except FieldError as error:
            return error_response(error)

    def status(self) -> dict[str, Any]:
        """The status page's body (the console shows it too); OVERLOADED while starting."""
        running = self._runtime.running()
        service = running.service
        field = service.field
        body = field.status()
        body["server_version"] = __version__
        refusing = service.refusing
        body["log"] = {
            "backend": service.log.backend,
            "last_position": field.state.last_position,
            "writable": refusing is None,
            "refusing": None
            if refusing is None
            else {"code": refusing.code, "message": refusing.message},
        }
        location = service.log.location()
        if location is not None:
            body["log"]["database"] = location
        body["writer"] = {
            "running": service.running,
            "queued": service.queued,
            "admission": service.admission.status(),
        }
        embeddings = service.embeddings
        body["embedding"] = {
            "after_commit": embeddings is not None,
            "queued": field.state.index.waiting if embeddings is not None else 0,
            "held_entries": service.held,
        }
        body["sources"] = {} if self._sources is None else self._sources(field)
        body["uptime_seconds"] = round(time.monotonic() - self.started, 3)
        body["node"] = {
            "id": service.node_id,
            "position": field.state.last_position,
            "log_head": max(service.log_head, field.state.last_position),
            "lag": service.lag,
        }
        # asked of the lease: a node resumed from a pause finds it lost here, not later
        body["node"]["delivery_owner"] = running.deliveries.may_send()
        body["node"]["delivery_term"] = field.state.delivery_term
        body["nodes"] = _nodes(body["node"], running, field.state.delivery_node)
        snapshotter = running.snapshotter
        body["snapshot"] = None if snapshotter is None else snapshotter.status()
        return body

    async def agents(self, request: Request) -> Response:
        params = request.query_params

        def listing(field: Field, _: AgentRecord) -> dict[str, Any]:
            ids = _query_values(params, "id", AGENT_ID, field.limits)
            return field.agents_page(_page_request(params, field.limits), ids=ids)

        return await self._read(request, listing)

    async def conflicts(self, request: Request) -> Response:
        params = request.query_params

        def listing(field: Field, viewer: AgentRecord) -> dict[str, Any]:
            limits = field.limits
            statuses = _query_values(params, "status", CONFLICT_STATUSES, limits)
            types = _query_values(params, "type", CONFLICT_TYPES, limits)
            agents = _query_values(params, "involving_agent", AGENT_ID, limits)
            return field.conflicts_page(
                viewer,
                _page_request(params, limits),
                statuses=statuses or sorted(UNRESOLVED_CONFLICT_STATUSES),
                types=types,
                involving_agents=agents,
            )

        return await self._read(request, listing)

    # -- the operator's (extensions) ---------------------------------------------------

    async def declare_failed(self, request: Request) -> Response:
        """``POST /v1/agents/{agent_id}/fail``: the operator declares an agent failed, a
        write like any other (its rate, admission, the single writer)."""
        token = bearer_token(request)
        agent_id = request.path_params["agent_id"]
        access = access_of(request.scope)
        try:
            if access is not None:  # who asked, for the access log
                access.agent = agent_of(self._runtime.running().service.field, token)
            self.door.admit(token, None)
            body = await _optional_json(request, self.limits)
            outcome = await self._runtime.running().service.execute(
                lambda field: field.declare_failed(token, agent_id, body), work=Work.WRITE
            )
        except FieldError as error:
            return error_response(error)
        except ClientDisconnect:
            return Response(status_code=400)
        return json_response(outcome.response)

    async def events(self, request: Request) -> Response:
        """``GET /v1/events?before=&limit=``: the operator pages back through the Field's
        events, newest first, reading at most :data:`EVENTS_SCAN` log entries a request
        (off the event loop)."""
        params = request.query_params
        token = bearer_token(request)
        access = access_of(request.scope)
        try:
            self.door.admit(token, None)
            running = self._runtime.running()
            field = running.service.field
            viewer = field.authenticate(token)
            if access is not None:
                access.agent = viewer.id
            require_operator(
                viewer,
                "the log's events are the operator's to page through: "
                "this needs the operator token",
                "Read events through a subscription's stream instead.",
            )
            limit = _events_limit(params.get("limit"))
            before = _events_before(
                params.get("before"), field.field_tag, field.state.last_position
            )
            low = max(0, before - 1 - EVENTS_SCAN)  # the stretch read: (low, before)
            entries = await asyncio.to_thread(running.service.log.read, low, before - 1 - low)
            # the Field as it is now (it is rebuilt after a failed append)
            page = _events_page(
                self._runtime.running().service.field, entries, low=low, before=before, limit=limit
            )
        except FieldError as error:
            return error_response(error)
        return json_response(page)


async def _optional_json(request: Request, limits: Limits) -> Any:
    """A request's optional JSON body: None when it has none, else as :func:`read_json`."""
    if request.headers.get("content-length") == "0" or (
        "content-length" not in request.headers and "transfer-encoding" not in request.headers
    ):
        return None
    return await read_json(request, limits)


def _nodes(own: dict[str, Any], running: Running, delivering: str | None) -> list[dict[str, Any]]:
    """The status's ``nodes``: every node this one knows of, this one as ``own`` says (its
    ``node``), the others as they last said (presence); the deliveries' sender among the
    others is the live one that last claimed them in the log (``delivering``)."""
    head = own["log_head"]
    found = [] if running.nodes is None else running.nodes()
    listed = []
    for node_id, position, age, live in found or [(own["id"], own["position"], None, True)]:
        if node_id == own["id"]:
            position, age, owner = own["position"], None, own["delivery_owner"]
        else:
            owner = live and node_id == delivering
        listed.append(
            {
                "id": node_id,
                "position": position,
                "lag": max(0, head - position),
                "seen_seconds_ago": 0 if age is None else round(age, 3),
                "live": live,
                "delivery_owner": owner,
            }
        )
    return listed


def _query_values(
    params: Any, name: str, allowed: Collection[str] | re.Pattern[str], limits: Limits
) -> list[str]:
    """The values of a repeatable, comma-separated parameter: each one of ``allowed``, or
    (a pattern) one that it matches whole, as the document's schema for the values says."""
    values = [v for item in params.getlist(name) for v in item.split(",") if v]
    if len(values) > limits.max_page_items:
        raise InvalidPayload(f"at most {limits.max_page_items} {name} values")
    if isinstance(allowed, re.Pattern):
        invalid = [v for v in values if allowed.fullmatch(v) is None]
        if invalid:
            raise InvalidPayload(f"{name} value(s) not of the form allowed: {_quoted(invalid)}")
    unknown = [v for v in values if not isinstance(allowed, re.Pattern) and v not in allowed]
    if unknown:
        raise InvalidPayload(f"unknown {name} value(s): {_quoted(unknown)}")
    return values


def _page_request(params: Any, limits: Limits) -> PageRequest:
    """``?after=`` and ``?limit=`` of a GET list (default limit: 100)."""
    raw = params.get("limit")
    if raw is not None and not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        raise InvalidPayload(f"limit must be an integer from 1 to {limits.max_page_items}")
    source = {"after": params.get("after"), "limit": None if raw is None else int(raw)}
    return page_request(source, limits, default=DEFAULT_GET_LIMIT)


def _quoted(values: list[str], most: int = 5) -> str:
    """A few client values for a message, each cut short: never a client's whole input."""
    shown = ", ".join(repr(v[:64]) for v in values[:most])
    return shown + (f" and {len(values) - most} more" if len(values) > most else "")


#: Events one ``GET /v1/events`` returns by default, and at most.
DEFAULT_EVENTS = 50
MAX_EVENTS = 200
#: Log entries one ``GET /v1/events`` reads at most, whatever the log holds (not every
#: entry is an event: a page may hold fewer than ``limit`` events and still have a next).
EVENTS_SCAN = 2000


def _events_limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_EVENTS
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not 1 <= int(raw) <= MAX_EVENTS:
        raise InvalidPayload(f"limit must be an integer from 1 to {MAX_EVENTS}")
    return int(raw)


def _events_before(raw: str | None, field_tag: str, top: int) -> int:
    """The position ``?before=`` names (exclusive), or just past the last entry."""
    if raw is None:
        return top + 1
    position, reason = parse_cursor(raw, field_tag)
    if position is None:
        raise InvalidPayload(f"before: {reason}")
    return max(1, min(position, top + 1))  # 1: nothing is before the log's start


def _events_page(
    field: Field, entries: list[StoredEntry], *, low: int, before: int, limit: int
) -> dict[str, Any]:
    """The newest ``limit`` events among ``entries`` (positions in ``(low, before)``),
    newest first, and the cursor of the next page back (None: the log starts here)."""
    units = field.state.known_units  # purged units' tombstones too
    tag = field.field_tag
    found: list[dict[str, Any]] = []
    next_before = low + 1
    for entry in reversed(entries):
        if not low < entry.position < before:
            continue
        event = event_of(entry, units)
        if event is None:
            continue
        if len(found) == limit:
            next_before = entry.position + 1  # this one starts the next page
            break
        cursor = format_cursor(tag, entry.position)
        found.append({**event_fields(event, cursor), "ts": event.ts})
    return {
        "events": found,
        "next": None if next_before <= 1 else format_cursor(tag, next_before),
    }
