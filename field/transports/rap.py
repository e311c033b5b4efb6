"""The RAP binding: the Field as a tool server of the Reactive Agent Protocol.

A RAP runtime (the host of an agent's LLM loop) discovers the Field's tools,
invokes them over HTTP, and is answered later, by a POST to the invocation's
``callback_url``. Four endpoints:

* ``GET /.well-known/rap-toolset``: the toolset (:mod:`field.contract.tools`, binding
  ``rap``): every operation as a tool but REGISTER, plus ``akashik_subscribe``,
  and the invocation ``endpoint``.
* ``POST /rap/invoke``: an invocation. Its shape is checked (malformed: 4xx,
  nothing happens), then it is answered ``200`` at once and runs in a task:
  the operation goes to the writer like any request, and its response (or
  the spec error body, with ``is_error``) is POSTed to ``callback_url`` as a
  ``tool_result``, retried a few times on 5xx and no answer (with the same
  ``webhook-id``, as every message the Field POSTs to a runtime).
  ``akashik_subscribe`` runs SUBSCRIBE with a :class:`RapCall`: the delivery
  engine (``field/engine/delivery.py``) then sends its tool result, its
  notifications as ``subscription_event``\\ s and, when the Field ends it
  (unsubscribed, expired, its agent deregistered), one ``final`` event,
  durably.
* ``POST /cancel_tool_call`` and ``POST /close_thread``: cancel the RAP
  subscriptions of a thread (one call's, or all), and end their deliveries
  in the same write: nothing more is sent for them, not even a ``final``
  event (RAP: a tool MUST NOT send events after a cancellation). ``200``
  whatever was or was not cancelled, and idempotent.

**Identity.** Every request but discovery carries ``Authorization: Bearer``
with the token of the registered agent the runtime acts for: it is part of
the runtime's tool-server settings, never a tool argument, so it never
enters the model's context. Without a valid token a request is ``401`` and
nothing happens (cancel and close included). An invocation acts as that
agent; cancel and close touch only that agent's subscriptions.

**Bounds.** Bodies are bounded like every JSON document the Field reads; at
most ``rap_max_invocations`` invocations run at once (past it ``503
OVERLOADED``, before anything happens); a tool result is held in memory
only until it is delivered or given up.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import random
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..contract.errors import (
    AuthError,
    Code,
    FieldError,
    InvalidEnvelope,
    InvalidPayload,
    Overloaded,
    StateError,
    internal_error,
)
from ..contract.model import Limits
from ..contract.tools import (
    RAP_TOOLS,
    SESSION_TOOLS,
    SUBSCRIPTION_FIELDS,
    definitions,
    tool_envelope,
)
from ..core.context import Outcome
from ..core.field import Field
from ..core.validation import MAX_URL_CHARS
from ..engine.egress import check_destination
from ..subscriptions.delivery import RapCall, Verdict, verdict
from .access import access_of
from .web import bearer_token, error_response, read_json

if TYPE_CHECKING:
    from ..core.state import AgentRecord
    from .door import FrontDoor
    from .runtime import Runtime

logger = logging.getLogger("field.rap")

TOOLSET_PATH = "/.well-known/rap-toolset"
INVOKE_PATH = "/rap/invoke"
#: Longest ``id``, ``group_id``, ``user_id``, ``call_id`` and ``toolset_version`` accepted.
MAX_CALL_CHARS = 256
#: Attempts to POST one tool result (5xx, 408, 429 or no answer are tried again).
RESULT_ATTEMPTS = 5
#: Longest wait between two attempts, whatever the runtime's ``Retry-After`` says.
RESULT_MAX_DELAY = 30.0

TOOLSET_NAME = "akashik-field"
TOOLSET_DESCRIPTION = (
    "An Akashik Field: shared memory and coordination for agents. Record what you learn "
    "(akashik_record, with intent and confidence), read what others learned (akashik_attune), "
    "subscribe to be told as it happens (akashik_subscribe), resolve conflicts, share tasks. "
    "The tools act for one registered agent, whose token the runtime sends in its settings "
    "(Authorization: Bearer): register the agent beforehand (POST /v1/register, or the "
    "operator); there is no register tool, since its result is a secret."
)


@functools.cache
def toolset_version() -> str:
    """A digest of the tools (names, descriptions, schemas): it changes when they do."""
    tools = orjson.dumps(definitions("rap"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(tools).hexdigest()[:16]


def toolset(base_url: str) -> dict[str, Any]:
    """The toolset document for a runtime that reached the Field at ``base_url``."""
    return {
        "name": TOOLSET_NAME,
        "description": TOOLSET_DESCRIPTION,
        "endpoint": base_url + INVOKE_PATH,
        "version": toolset_version(),
        "tools": [{"name": name, **definition} for name, definition in definitions("rap").items()],
    }


# -- the messages ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Invocation:
    """A well-formed RAP invocation."""

    tool: str
    arguments: dict[str, Any]
    id: str
    group_id: str
    callback_url: str
    user_id: str | None
    call_id: str | None

    @property
    def operation(self) -> str:
        return RAP_TOOLS[self.tool].operation


def parse_invocation(body: Any) -> Invocation:
    """``body`` as an invocation, or the 4xx error that says what is wrong with it."""
    if not isinstance(body, dict):
        raise _malformed("an invocation must be a JSON object")
    tool = body.get("operation")
    if not isinstance(tool, str) or tool not in RAP_TOOLS:
        raise _malformed("operation must name one of the toolset's tools: " + ", ".join(RAP_TOOLS))
    arguments = body.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _malformed("arguments must be an object")
    callback_url = body.get("callback_url")
    if not isinstance(callback_url, str) or not 1 <= len(callback_url) <= MAX_URL_CHARS:
        raise _malformed(f"callback_url must be a URL of at most {MAX_URL_CHARS} characters")
    version = _optional(body, "toolset_version")
    if version is not None and version != toolset_version():
        raise StateError(
            "the invocation was made with another version of the toolset",
            code=Code.TOOLSET_CHANGED,
            recoverable=True,
            suggested_action=f"Read the toolset again ({TOOLSET_PATH}) and invoke its tools.",
            details={"toolset_version": toolset_version()},
        )
    return Invocation(
        tool=tool,
        arguments=arguments,
        id=_name(body, "id"),
        group_id=_name(body, "group_id"),
        callback_url=callback_url,
        user_id=_optional(body, "user_id"),
        call_id=_optional(body, "call_id"),
    )


def parse_thread(body: Any, *, with_call: bool) -> tuple[str, str | None]:
    """``thread_id`` (and ``tool_call_id``) of a cancel or close request."""
    if not isinstance(body, dict):
        raise _malformed("the request must be a JSON object")
    thread = _name(body, "thread_id")
    return thread, _name(body, "tool_call_id") if with_call else None


def _name(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_CALL_CHARS:
        raise _malformed(f"{key} must be a string of 1 to {MAX_CALL_CHARS} characters")
    return value


def _optional(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > MAX_CALL_CHARS):
        raise _malformed(f"{key} must be null or a string of at most {MAX_CALL_CHARS} characters")
    return value


def _malformed(message: str) -> InvalidEnvelope:
    return InvalidEnvelope(
        f"not a RAP invocation: {message}",
        suggested_action="Send the invocation of the RAP transport: operation, arguments, id, "
        "callback_url, group_id (see the toolset at " + TOOLSET_PATH + ").",
    )


def tool_result(call: Invocation, body: dict[str, Any], *, is_error: bool) -> bytes:
    """The ``tool_result`` message of ``call``: ``body`` as JSON text."""
    message: dict[str, Any] = {
        "type": "tool_result",
        "group_id": call.group_id,
        "id": call.id,
        "text": orjson.dumps(body).decode(),
    }
    if call.call_id is not None:
        message["call_id"] = call.call_id
    if is_error:
        message["is_error"] = True
    return orjson.dumps(message)


def request_of(call: Invocation, agent: AgentRecord) -> tuple[dict[str, Any], RapCall | None]:
    """The envelope ``call`` sends as ``agent``, and the RAP call of a subscription."""
    args = dict(call.arguments)
    operation = call.operation
    session_id = args.pop("session_id", None) if call.tool in SESSION_TOOLS else None
    rap = None
    if operation == "SUBSCRIBE":
        args, rap = _subscription(call, args)
    envelope = tool_envelope(
        operation,
        args,
        agent_id=agent.id,
        role=agent.role,
        session_id=session_id,
        message_id=call.id,
    )
    return envelope, rap


def _subscription(call: Invocation, args: dict[str, Any]) -> tuple[dict[str, Any], RapCall]:
    associative = args.pop("associative", False)
    if not isinstance(associative, bool):
        raise InvalidPayload("associative must be true or false", operation="SUBSCRIBE")
    unknown = sorted(args.keys() - set(SUBSCRIPTION_FIELDS))
    if unknown:
        raise InvalidPayload(
            f"akashik_subscribe takes no argument {unknown[0][:64]!r}",
            operation="SUBSCRIBE",
            suggested_action="Pass only " + ", ".join(SUBSCRIPTION_FIELDS) + ", associative.",
        )
    rap = RapCall(
        callback_url=call.callback_url,
        group_id=call.group_id,
        tool_call_id=call.id,
        user_id=call.user_id,
        associative=associative,
        call_id=call.call_id,
    )
    return {"action": "subscribe", "subscription": args}, rap


def run_invocation(field: Field, call: Invocation, token: str | None) -> Outcome:
    """Run ``call`` in the writer, as the agent ``token`` names."""
    agent = field.authenticate(token)
    envelope, rap = request_of(call, agent)
    return field.handle(envelope, token=token, operation=call.operation, rap=rap)


# -- the endpoints ---------------------------------------------------------------------------


class RapBinding:
    """The RAP endpoints of one Field."""

    def __init__(
        self, runtime: Runtime, door: FrontDoor, *, limits: Limits, max_running: int
    ) -> None:
        #: the Field's parts, while it runs
        self._runtime = runtime
        #: the way in of every operation, whatever its transport
        self.door = door
        self.limits = limits
        #: invocations run at once, past which one is refused
        self.max_running = max_running
        self._running: set[asyncio.Task[None]] = set()

    def routes(self) -> list[Route]:
        return [
            Route(TOOLSET_PATH, self.discover, methods=["GET"]),
            Route(INVOKE_PATH, self.invoke, methods=["POST"]),
            Route("/cancel_tool_call", self.cancel_tool_call, methods=["POST"]),
            Route("/close_thread", self.close_thread, methods=["POST"]),
        ]

    async def stop(self) -> None:
        """Cancel the invocations still running (their tool results are not sent)."""
        for task in list(self._running):
            task.cancel()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    async def discover(self, request: Request) -> Response:
        return _json(toolset(str(request.base_url).rstrip("/")))

    async def invoke(self, request: Request) -> Response:
        """Check the invocation, answer 200, run it in a task (see the module docstring)."""
        operation = None
        access = access_of(request.scope)
        try:
            token = bearer_token(request)
            service = self._runtime.running().service
            agent = service.field.authenticate(token)
            self.door.admit(token, None)  # an invocation is one of the agent's operations
            call = parse_invocation(await read_json(request, self.limits))
            operation = call.operation
            if access is not None:
                access.agent, access.operation = agent.id, operation
            reason = await check_destination(service.field.egress, call.callback_url)
            if reason is not None:
                raise InvalidPayload(
                    f"callback_url is refused: {reason}",
                    details={"reason": reason},
                    suggested_action="Give a public http(s) URL, or ask the operator to allow "
                    "its network (--webhook-allow-net).",
                )
            if len(self._running) >= self.max_running:
                raise Overloaded(f"{self.max_running} invocations are running already")
        except FieldError as error:
            return error_response(error, operation)
        except ClientDisconnect:
            return Response(status_code=400)
        request_id = None if access is None else access.request_id
        task = asyncio.get_running_loop().create_task(self._run(call, token, agent.id, request_id))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return _json({"status": "accepted"})

    async def cancel_tool_call(self, request: Request) -> Response:
        return await self._cancel(request, with_call=True)

    async def close_thread(self, request: Request) -> Response:
        return await self._cancel(request, with_call=False)

    async def _cancel(self, request: Request, *, with_call: bool) -> Response:
        """Cancel the agent's RAP subscriptions of a thread: 200 whatever is cancelled,
        401 without a valid token, 5xx when the Field cannot record it now (retry)."""
        token = bearer_token(request)
        reason = "cancelled by the RAP runtime" if with_call else "the RAP thread was closed"
        try:
            service = self._runtime.running().service
            service.field.authenticate(token)
            try:
                thread, call = parse_thread(
                    await read_json(request, self.limits), with_call=with_call
                )
            except FieldError as error:  # nothing to cancel: said, not refused
                return _json({"status": "ignored", "reason": error.message, "cancelled": []})

            def cancel(field: Field) -> Outcome:
                return field.cancel_rap(field.authenticate(token).id, thread, call, reason)

            outcome = await service.execute(cancel)
        except FieldError as error:
            if isinstance(error, AuthError) or error.http_status >= 500:
                return error_response(error)
            return _json({"status": "ignored", "reason": error.message, "cancelled": []})
        except ClientDisconnect:
            return Response(status_code=400)
        cancelled = [
            entry.data["subscription_id"]
            for entry in outcome.entries
            if entry.kind == "subscription.cancelled"
        ]
        return _json({"status": "ok", "cancelled": cancelled})

    # -- running an invocation ---------------------------------------------------------

    async def _run(
        self, call: Invocation, token: str | None, agent_id: str, request_id: str | None = None
    ) -> None:
        """Run the invocation and answer it (``request_id``: its request's, which the
        operation's line in the access log names)."""
        door = self.door
        error: FieldError | None = None
        with door.visit("rap", call.operation, request_id=request_id) as visit:
            try:
                visit.result = outcome = await door.run(
                    functools.partial(run_invocation, call=call, token=token), call.operation
                )
            except Exception as exc:
                if not isinstance(exc, FieldError):
                    logger.exception("the RAP invocation of %s failed", call.tool)
                error = exc if isinstance(exc, FieldError) else internal_error(call.operation)
                visit.result = error
        if error is not None:
            await self._answer(call, error.to_response(call.operation), agent_id, is_error=True)
            return
        if call.operation != "SUBSCRIBE":  # a subscription's result is the engine's to send
            await self._answer(call, outcome.response, agent_id, is_error=False)

    async def _answer(
        self, call: Invocation, body: dict[str, Any], agent_id: str, *, is_error: bool
    ) -> None:
        """POST the tool result (a request of ``agent_id``'s: its share of the delivery
        client, its circuits); try again on 5xx or no answer, a few times, with the same
        ``webhook-id``. The result lives in memory only, and so does its id: made for it
        once, at random (nothing in the log names it; an invocation sent again is another
        message, answered with another id)."""
        running = self._runtime.current
        if running is None:
            return  # stopping
        engine = running.deliveries
        message = tool_result(call, body, is_error=is_error)
        headers = {"webhook-id": f"result-{secrets.token_hex(16)}"}
        for attempt in range(1, RESULT_ATTEMPTS + 1):
            answer = await engine.poster.post(call.callback_url, message, headers, agent=agent_id)
            judged = verdict(answer.status)
            if judged is Verdict.DELIVERED:
                return
            if judged is Verdict.REFUSED or attempt == RESULT_ATTEMPTS:
                logger.warning(
                    "the tool result of a RAP call (%s) was not delivered: %s",
                    call.tool,
                    answer.error or f"answered HTTP {answer.status}",
                )
                return
            delay = engine.settings.retry.delay(attempt, random.random, answer.retry_after)
            await asyncio.sleep(min(delay, RESULT_MAX_DELAY))


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")
