"""A proxy in front of a real Field that breaks one behaviour at a time.

The conformance suite (``conformance/``) is proven by it: ``tests/test_conformance.py`` runs
the suite through this proxy once per mutation and counts the runs the suite fails. Each
:class:`Mutation` rewrites what passes through: a request before the Field reads it, an
answer before the client does, a push frame (WebSocket message or SSE event) on its way.
Nothing here knows the suite: a mutation is a plausible bug of a server.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

Json = Any
_HOP = {
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "accept-encoding",
    "content-encoding",
}


@dataclass
class Stream:
    """One push connection's state, as a mutation sees it."""

    resumed: bool
    notifications: int = 0
    held: list[Json] = field(default_factory=list)


@dataclass
class Exchange:
    """One HTTP request and its answer, as a mutation sees them."""

    operation: str
    request: Json
    headers: dict[str, str]
    status: int = 0
    answer: Json = None
    #: set by a mutation to answer without asking the Field
    forged: tuple[int, Json] | None = None


class Mutation:
    """A bug: the identity by default; a subclass overrides what it breaks."""

    name = "none"
    what = "the server unmodified"

    def request(self, exchange: Exchange, proxy: MutationProxy) -> None:
        """Rewrite ``exchange.request`` (or headers, or forge an answer) before the Field."""

    def answer(self, exchange: Exchange) -> None:
        """Rewrite ``exchange.status`` / ``exchange.answer`` before the client reads it."""

    def frames(self, frame: Json, stream: Stream) -> list[Json]:
        """The push frames to send in place of ``frame`` (WebSocket and SSE alike)."""
        return [frame]


def _payload(exchange: Exchange) -> dict[str, Any]:
    request = exchange.request
    if isinstance(request, dict) and isinstance(request.get("payload"), dict):
        payload: dict[str, Any] = request["payload"]
        return payload
    return {}


def _is(frame: Json, kind: str) -> bool:
    return isinstance(frame, dict) and frame.get("type") == kind


class _Simple(Mutation):
    """A mutation made of small functions: for the table below."""

    def __init__(
        self,
        name: str,
        what: str,
        *,
        request: Callable[[Exchange], None] | None = None,
        answer: Callable[[Exchange], None] | None = None,
        notification: Callable[[Json, Stream], list[Json]] | None = None,
    ) -> None:
        self.name, self.what = name, what
        self._request, self._answer, self._notification = request, answer, notification

    def request(self, exchange: Exchange, proxy: MutationProxy) -> None:
        if self._request is not None:
            self._request(exchange)

    def answer(self, exchange: Exchange) -> None:
        if self._answer is not None:
            self._answer(exchange)

    def frames(self, frame: Json, stream: Stream) -> list[Json]:
        if self._notification is None or not _is(frame, "notification"):
            return [frame]
        stream.notifications += 1
        return self._notification(frame, stream)


def _only(operation: str, change: Callable[[Exchange], None]) -> Callable[[Exchange], None]:
    def apply(exchange: Exchange) -> None:
        if exchange.operation == operation:
            change(exchange)

    return apply


# ------------------------------------------------------------------ request rewrites


def _fix_envelope(exchange: Exchange) -> None:
    if isinstance(exchange.request, dict) and "payload" in exchange.request:
        exchange.request["protocol"] = "akashik"
        exchange.request["version"] = "0.1.0"
        for key, value in (("id", "m-1"), ("epoch", 0), ("session_id", None)):
            exchange.request.setdefault(key, value)


def _add_intent(exchange: Exchange) -> None:
    payload = _payload(exchange)
    intent = payload.get("intent")
    if not isinstance(intent, dict) or not intent.get("purpose"):
        payload["intent"] = {"purpose": "filled in"}


def _drop_relations(kind: str) -> Callable[[Exchange], None]:
    def apply(exchange: Exchange) -> None:
        payload = _payload(exchange)
        if isinstance(payload.get("relations"), list):
            payload["relations"] = [r for r in payload["relations"] if r.get("type") != kind]

    return apply


def _no_session(exchange: Exchange) -> None:
    if isinstance(exchange.request, dict):
        exchange.request["session_id"] = None


def _scope(change: Callable[[dict[str, Any]], None]) -> Callable[[Exchange], None]:
    def apply(exchange: Exchange) -> None:
        scope = _payload(exchange).get("scope")
        if isinstance(scope, dict):
            change(scope)

    return apply


def _since_minus_one(exchange: Exchange) -> None:
    payload = _payload(exchange)
    since = payload.get("since_epoch")
    if isinstance(since, int) and since > 0:
        payload["since_epoch"] = since - 1


class _SubscriptionOption(Mutation):
    """SUBSCRIBE with ``option`` silently reset to its default; the answer shows it as asked."""

    def __init__(self, name: str, what: str, option: str) -> None:
        self.name, self.what, self.option = name, what, option
        self._asked: dict[str, Any] = {}

    def request(self, exchange: Exchange, proxy: MutationProxy) -> None:
        if exchange.operation != "SUBSCRIBE":
            return
        subscription = _payload(exchange).get("subscription")
        if isinstance(subscription, dict) and subscription.get(self.option):
            self._asked[exchange.request["id"]] = subscription[self.option]
            subscription[self.option] = 0

    def answer(self, exchange: Exchange) -> None:
        asked = self._asked.pop(
            exchange.request.get("id") if isinstance(exchange.request, dict) else None, None
        )
        if asked is not None and isinstance(exchange.answer, dict):
            subscription = exchange.answer.get("subscription")
            if isinstance(subscription, dict):
                subscription[self.option] = asked


class _AuthenticateForThem(Mutation):
    """Requests without a token are run with the token of the agent they name."""

    name = "unauthenticated-accepted"
    what = "an operation without a bearer token is served"

    def request(self, exchange: Exchange, proxy: MutationProxy) -> None:
        if "authorization" in {k.lower() for k in exchange.headers}:
            return
        agent = exchange.request.get("agent_id") if isinstance(exchange.request, dict) else None
        token = proxy.tokens.get(agent) if isinstance(agent, str) else None
        if token is not None:
            exchange.headers["Authorization"] = f"Bearer {token}"


class _VouchForAuthority(Mutation):
    """REGISTER above authority 4 is vouched for with the operator token."""

    name = "authority-unchecked"
    what = "an agent registers itself above authority 4"

    def request(self, exchange: Exchange, proxy: MutationProxy) -> None:
        authority = _payload(exchange).get("authority")
        if exchange.operation == "REGISTER" and isinstance(authority, int) and authority > 4:
            exchange.headers["Authorization"] = f"Bearer {proxy.operator_token}"


def _fake_deregister(exchange: Exchange) -> None:
    exchange.forged = (
        200,
        {"status": "ok", "cleanup": {"units_orphaned": 0, "tasks_reassigned": 0}, "epoch": 1},
    )


# ------------------------------------------------------------------ answer rewrites


def _error_field(key: str) -> Callable[[Exchange], None]:
    def apply(exchange: Exchange) -> None:
        if exchange.status >= 400 and isinstance(exchange.answer, dict):
            exchange.answer.pop(key, None)

    return apply


def _rename_code(old: str, new: str) -> Callable[[Exchange], None]:
    def apply(exchange: Exchange) -> None:
        if isinstance(exchange.answer, dict) and exchange.answer.get("code") == old:
            exchange.answer["code"] = new

    return apply


def _reverse_ranking(exchange: Exchange) -> None:
    if exchange.status == 200 and isinstance(exchange.answer.get("record"), list):
        exchange.answer["record"].reverse()


def _resolve_again(exchange: Exchange) -> None:
    if exchange.status == 409 and exchange.answer.get("code") == "INVALID_TRANSITION":
        conflict_id = _payload(exchange).get("conflict_id")
        exchange.status = 200
        exchange.answer = {
            "status": "resolved",
            "conflict": {"id": conflict_id, "status": "resolved"},
            "side_effects": {"superseded_units": [], "new_unit_id": None, "notified_agents": []},
            "epoch": 1,
        }


def _set(path: tuple[str, ...], value: Any) -> Callable[[Exchange], None]:
    def apply(exchange: Exchange) -> None:
        target = exchange.answer
        if exchange.status != 200:
            return
        for key in path[:-1]:
            target = target.get(key) if isinstance(target, dict) else None
        if isinstance(target, dict):
            if value is _DELETE:
                target.pop(path[-1], None)
            else:
                target[path[-1]] = value

    return apply


_DELETE = object()


# ------------------------------------------------------------------ push rewrites


def _drop_every_third(frame: Json, stream: Stream) -> list[Json]:
    return [] if stream.notifications % 3 == 0 else [frame]


def _repeat_first_after_resume(frame: Json, stream: Stream) -> list[Json]:
    return (
        [frame, copy.deepcopy(frame)] if stream.resumed and stream.notifications == 1 else [frame]
    )


def _skip_first_after_resume(frame: Json, stream: Stream) -> list[Json]:
    return [] if stream.resumed and stream.notifications == 1 else [frame]


def _drop_event(event: str) -> Callable[[Json, Stream], list[Json]]:
    def apply(frame: Json, stream: Stream) -> list[Json]:
        return [] if frame["data"].get("event") == event else [frame]

    return apply


class _Reorder(Mutation):
    """Consecutive notifications swapped in pairs (the held one flushed by any other frame)."""

    name = "reorder-notifications"
    what = "notifications delivered out of order"

    def frames(self, frame: Json, stream: Stream) -> list[Json]:
        if not _is(frame, "notification"):
            held, stream.held = stream.held, []
            return [*held, frame]
        if stream.held:
            held, stream.held = stream.held, []
            return [frame, *held]
        stream.held = [frame]
        return []


class _ResumeAtCursor(Mutation):
    """A resumed stream starts at its cursor instead of after it: the notification the client
    had already processed comes again, right after the `resume` frame."""

    name = "resume-at-cursor"
    what = "a resumed stream repeats the notification at its cursor"

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], Json] = {}

    def frames(self, frame: Json, stream: Stream) -> list[Json]:
        data = frame.get("data") if isinstance(frame, dict) else None
        if _is(frame, "notification"):
            self._seen[(data["subscription_id"], data.get("cursor"))] = frame
        elif _is(frame, "resume") and data.get("recovered"):
            again = self._seen.get((data["subscription_id"], data.get("from")))
            if again is not None:
                return [frame, copy.deepcopy(again)]
        return [frame]


MUTATIONS: list[Mutation] = [
    _Simple(
        "drop-notification", "every third notification is lost", notification=_drop_every_third
    ),
    _Reorder(),
    _Simple(
        "repeat-after-resume",
        "a resumed stream repeats its first notification",
        notification=_repeat_first_after_resume,
    ),
    _ResumeAtCursor(),
    _Simple(
        "skip-after-resume",
        "a resumed stream loses its first notification",
        notification=_skip_first_after_resume,
    ),
    _Simple(
        "accept-bad-envelope",
        "a wrong protocol or version, or a missing field, is served",
        request=_fix_envelope,
    ),
    _Simple(
        "error-without-recoverable",
        "error responses lack `recoverable`",
        answer=_error_field("recoverable"),
    ),
    _Simple(
        "attune-unsorted", "ATTUNE ranks worst first", answer=_only("ATTUNE", _reverse_ranking)
    ),
    _Simple(
        "leak-session-unit",
        "a unit recorded in a session is recorded Field-wide",
        request=_only("RECORD", _no_session),
    ),
    _SubscriptionOption(
        "ignore-min-relevance", "SUBSCRIBE ignores `min_relevance`", "min_relevance"
    ),
    _SubscriptionOption("ignore-debounce", "SUBSCRIBE ignores `debounce_ms`", "debounce_ms"),
    _Simple(
        "since-epoch-inclusive",
        "ATTUNE `since_epoch` returns the unit at that epoch again",
        request=_only("ATTUNE", _since_minus_one),
    ),
    _Simple(
        "accept-missing-intent",
        "RECORD without `intent.purpose` is accepted",
        request=_only("RECORD", _add_intent),
    ),
    _Simple(
        "wrong-error-code",
        "MISSING_CONFIDENCE is answered as INVALID_PAYLOAD",
        answer=_rename_code("MISSING_CONFIDENCE", "INVALID_PAYLOAD"),
    ),
    _Simple(
        "register-not-idle",
        "a new agent starts `working`",
        answer=_only("REGISTER", _set(("agent", "status"), "working")),
    ),
    _Simple(
        "no-capabilities",
        "REGISTER returns no `field_capabilities`",
        answer=_only("REGISTER", _set(("field_capabilities",), _DELETE)),
    ),
    _Simple(
        "attune-includes-own",
        "ATTUNE returns the caller's own units",
        request=_only("ATTUNE", _scope(lambda s: s.__setitem__("include_own", True))),
    ),
    _Simple(
        "attune-includes-archived",
        "ATTUNE returns archived units",
        request=_only("ATTUNE", _scope(lambda s: s.__setitem__("include_archived", True))),
    ),
    _Simple(
        "attune-ignores-max-units",
        "ATTUNE returns more than `max_units`",
        request=_only(
            "ATTUNE",
            _scope(lambda s: s.__setitem__("max_units", min(1000, int(s.get("max_units", 1)) + 5))),
        ),
    ),
    _Simple(
        "contradicts-ignored",
        "a `contradicts` relation creates no conflict",
        request=_only("RECORD", _drop_relations("contradicts")),
    ),
    _Simple(
        "supersedes-ignored",
        "a superseded unit stays in ATTUNE",
        request=_only("RECORD", _drop_relations("supersedes")),
    ),
    _Simple(
        "merge-resolved-again",
        "a resolved conflict can be merged again",
        answer=_only("MERGE", _resolve_again),
    ),
    _Simple(
        "deregister-noop",
        "DEREGISTER answers ok and does nothing",
        request=_only("DEREGISTER", _fake_deregister),
    ),
    _Simple(
        "handoff-not-notified",
        "the target of a HANDOFF is not notified",
        notification=_drop_event("handoff.incoming"),
    ),
    _AuthenticateForThem(),
    _VouchForAuthority(),
]


class MutationProxy:
    """An aiohttp server forwarding to ``upstream`` through the current :attr:`mutation`."""

    def __init__(self, upstream: str, *, operator_token: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.operator_token = operator_token
        self.mutation: Mutation = Mutation()
        #: agent id -> token, learnt from REGISTER answers (for mutations that misuse them)
        self.tokens: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> MutationProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the proxy is not started")
        return self._session

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/ws" and request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request)
        if request.path.endswith("/events") and request.method == "GET":
            return await self._sse(request)
        return await self._http(request)

    def _headers(self, request: web.Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() not in _HOP}

    async def _http(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        operation = request.path.rsplit("/", 1)[-1].upper()
        exchange = Exchange(operation, body, self._headers(request))
        if body is not None:
            self.mutation.request(exchange, self)
            raw = orjson.dumps(exchange.request)
        if exchange.forged is not None:
            exchange.status, exchange.answer = exchange.forged
            headers: dict[str, str] = {}
        else:
            async with self.session.request(
                request.method,
                self.upstream + request.path_qs,
                data=raw or None,
                headers=exchange.headers,
            ) as answer:
                content = await answer.read()
                headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
                exchange.status = answer.status
                try:
                    exchange.answer = orjson.loads(content) if content else None
                except orjson.JSONDecodeError:
                    return web.Response(status=answer.status, body=content, headers=headers)
        if operation == "REGISTER" and exchange.status == 200 and isinstance(body, dict):
            self.tokens[str(body.get("agent_id"))] = exchange.answer.get("token", "")
        self.mutation.answer(exchange)
        headers["Content-Type"] = "application/json"
        return web.Response(
            status=exchange.status, body=orjson.dumps(exchange.answer), headers=headers
        )

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        upstream = await self.session.ws_connect(
            self.upstream.replace("http", "ws", 1) + request.path_qs,
            headers={
                k: v
                for k, v in self._headers(request).items()
                if k.lower().startswith("authorization")
            },
        )
        client = web.WebSocketResponse()
        await client.prepare(request)
        stream = Stream(resumed="since" in request.query)

        async def down() -> None:
            async for message in upstream:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break
                for frame in self.mutation.frames(orjson.loads(message.data), stream):
                    await client.send_str(orjson.dumps(frame).decode())
            await client.close()

        async def up() -> None:
            async for message in client:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await upstream.send_str(message.data)
            await upstream.close()

        tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
        await client.close()
        return client

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        async with self.session.get(
            self.upstream + request.path_qs,
            headers=self._headers(request),
            timeout=aiohttp.ClientTimeout(total=None),
        ) as answer:
            if answer.status != 200:
                return web.Response(
                    status=answer.status, body=await answer.read(), content_type="application/json"
                )
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            resumed = "since" in request.query or "Last-Event-ID" in request.headers
            stream = Stream(resumed=resumed)
            block: list[str] = []
            try:
                async for raw in answer.content:
                    line = raw.decode().rstrip("\r\n")
                    if line:
                        block.append(line)
                        continue
                    for text in self._sse_block(block, stream):
                        await response.write(text.encode())
                    block = []
            except (ConnectionResetError, aiohttp.ClientConnectionError):
                pass
            return response

    def _sse_block(self, block: list[str], stream: Stream) -> list[str]:
        fields = dict(
            line.split(": ", 1) if ": " in line else (line, "")
            for line in block
            if not line.startswith(":")
        )
        if "data" not in fields:
            return ["\n".join(block) + "\n\n"] if block else []
        name = fields.get("event", "message")
        control = name in ("resume", "live", "end", "overflow", "shutdown")
        frame = {"type": name if control else "notification", "data": orjson.loads(fields["data"])}
        out = []
        for sent in self.mutation.frames(frame, stream):
            lines = []
            if sent["type"] == "notification" and sent["data"].get("cursor"):
                lines.append(f"id: {sent['data']['cursor']}")
            event = sent["data"].get("event") if sent["type"] == "notification" else sent["type"]
            lines += [f"event: {event}", f"data: {orjson.dumps(sent['data']).decode()}"]
            out.append("\n".join(lines) + "\n\n")
        return out
