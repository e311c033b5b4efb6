"""The wire, and nothing else: envelopes over HTTP, push over WebSocket and SSE.

Everything the checks know of a Field goes through :class:`Wire`: a base URL, an aiohttp
session and the tokens REGISTER hands out. No code of any implementation is imported.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

PROTOCOL = "akashik"
VERSION = "0.1.0"
#: How long a check waits for one push frame before it concludes none is coming.
FRAME_TIMEOUT = 5.0

#: How often a POST answered 429 or 503 with Retry-After is sent again (the wait honoured,
#: at most 5 s each): a Field that bounds REGISTERs per client, or sheds load, applied nothing.
RETRIES = 20

_ids = itertools.count(1)


def _retry_after(answer: Answer) -> float:
    try:
        return min(5.0, max(0.05, float(answer.headers.get("Retry-After", "1"))))
    except ValueError:
        return 1.0


class WireError(Exception):
    """The Field answered something a check cannot read (not JSON, a closed stream)."""


@dataclass
class Answer:
    """One HTTP answer: the status and the JSON body (``None`` if it was not JSON)."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def code(self) -> str | None:
        """The error code of an error answer."""
        if isinstance(self.body, dict) and self.status >= 400:
            code = self.body.get("code")
            return code if isinstance(code, str) else None
        return None

    def __getitem__(self, key: str) -> Any:
        if not isinstance(self.body, dict):
            raise WireError(f"HTTP {self.status}: the body is not a JSON object")
        return self.body[key]

    def describe(self) -> str:
        text = orjson.dumps(self.body).decode() if self.body is not None else "(no JSON)"
        return f"HTTP {self.status} {text[:300]}"


def envelope(
    operation: str,
    agent_id: str,
    payload: dict[str, Any],
    *,
    epoch: int = 0,
    session_id: str | None = None,
) -> dict[str, Any]:
    """The spec's message envelope (section 5.1)."""
    return {
        "protocol": PROTOCOL,
        "version": VERSION,
        "id": f"msg-{next(_ids)}-{uuid.uuid4().hex[:8]}",
        "operation": operation,
        "agent_id": agent_id,
        "session_id": session_id,
        "epoch": epoch,
        "payload": payload,
    }


def unique(prefix: str) -> str:
    """An agent id no other run of the suite uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Agent:
    """An agent this run registered: its id, role, token and the epoch it has seen."""

    wire: Wire
    id: str
    role: str
    token: str
    registration: dict[str, Any]
    epoch: int = 0
    #: the epoch the agent registered at: every unit recorded later has a higher one
    born: int = 0

    async def send(
        self, operation: str, payload: dict[str, Any], *, session_id: str | None = None
    ) -> Answer:
        """Send one operation with this agent's token; track the epoch it answers with."""
        body = envelope(operation, self.id, payload, epoch=self.epoch, session_id=session_id)
        answer = await self.wire.post(f"/v1/{operation.lower()}", body, token=self.token)
        if answer.ok and isinstance(answer.body, dict):
            epoch = answer.body.get("epoch")
            if isinstance(epoch, int) and epoch > self.epoch:
                self.epoch = epoch
        return answer

    async def record(
        self,
        content: str,
        *,
        type: str = "finding",
        score: float = 0.8,
        relations: list[dict[str, Any]] | None = None,
        session_id: str | None = None,
        task_id: str | None = None,
    ) -> Answer:
        payload: dict[str, Any] = {
            "mode": "committed",
            "type": type,
            "content": content,
            "intent": {"purpose": "conformance check", "task_id": task_id},
            "confidence": {"score": score, "reasoning": "stated by the conformance suite"},
        }
        if relations:
            payload["relations"] = relations
        return await self.send("RECORD", payload, session_id=session_id)

    async def attune(self, max_units: int = 50, **extra: Any) -> Answer:
        scope = {"role": self.role, "max_units": max_units}
        scope.update(extra.pop("scope", {}))
        return await self.send("ATTUNE", {"scope": scope, **extra})

    async def find(
        self, ids: set[str], *, since: int | None = None, **scope: Any
    ) -> dict[str, dict[str, Any]]:
        """The ATTUNE items of the units ``ids`` this agent is shown, polled with
        ``since_epoch`` from ``since`` (default: its registration), so that a Field holding
        any number of other units still shows them. Raises :class:`WireError` on an error."""
        cursor = self.born if since is None else since
        found: dict[str, dict[str, Any]] = {}
        for _ in range(100):
            answer = await self.attune(1000, since_epoch=cursor, scope=scope)
            if not answer.ok:
                raise WireError(f"ATTUNE since_epoch {cursor}: {answer.describe()}")
            for item in answer["record"]:
                unit = item.get("memory_unit") or {}
                if unit.get("id") in ids:
                    found[unit["id"]] = item
            epoch = answer["epoch"]
            if not answer["record"] or not isinstance(epoch, int) or epoch <= cursor:
                break
            cursor = epoch
        return found

    async def subscribe(self, events: list[str], **options: Any) -> Answer:
        return await self.send(
            "SUBSCRIBE", {"action": "subscribe", "subscription": {"events": events, **options}}
        )


class Wire:
    """A Field at ``base_url``, spoken to over HTTP, WebSocket and SSE."""

    def __init__(
        self,
        base_url: str,
        *,
        operator_token: str | None = None,
        frame_timeout: float = FRAME_TIMEOUT,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.operator_token = operator_token
        self.frame_timeout = frame_timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Wire:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30),
            json_serialize=lambda o: orjson.dumps(o).decode(),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise WireError("the wire is not open")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None = None,
        token: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        async with self.session.request(
            method, self.base_url + path, data=data, headers=sent
        ) as response:
            raw = await response.read()
            try:
                body = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                body = None
            return Answer(response.status, body, dict(response.headers))

    async def post(
        self, path: str, body: Any, *, token: str | None = None, raw: bytes | None = None
    ) -> Answer:
        data = raw if raw is not None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"}
        answer = await self.request("POST", path, data=data, token=token, headers=headers)
        for _ in range(RETRIES):  # the Field asked to come back later: nothing was applied
            if answer.status not in (429, 503) or "Retry-After" not in answer.headers:
                break
            await asyncio.sleep(_retry_after(answer))
            answer = await self.request("POST", path, data=data, token=token, headers=headers)
        return answer

    async def get(self, path: str, *, token: str | None = None) -> Answer:
        return await self.request("GET", path, token=token)

    async def register(
        self,
        prefix: str,
        *,
        role: str = "analyst",
        interests: list[str] | None = None,
        authority: int | None = None,
    ) -> Agent:
        """REGISTER a new agent; with ``authority`` above 4 the operator token vouches."""
        agent_id = unique(prefix)
        payload: dict[str, Any] = {"id": agent_id, "role": role, "interests": interests or []}
        token = None
        if authority is not None:
            payload["authority"] = authority
            token = self.operator_token if authority > 4 else None
        body = envelope("REGISTER", agent_id, payload)
        answer = await self.post("/v1/register", body, token=token)
        if not answer.ok:
            raise WireError(f"REGISTER {agent_id} failed: {answer.describe()}")
        epoch = answer.body.get("epoch", 0) if isinstance(answer.body, dict) else 0
        epoch = epoch if isinstance(epoch, int) else 0
        return Agent(self, agent_id, role, answer["token"], answer.body, epoch, epoch)

    def ws_url(self, path: str) -> str:
        scheme, rest = self.base_url.split("://", 1)
        return ("wss" if scheme == "https" else "ws") + "://" + rest + path

    async def websocket(self, token: str, since: list[str] | None = None) -> PushStream:
        """Open the agent's WebSocket (``/v1/ws``), resuming from ``since`` cursors."""
        params = [("since", cursor) for cursor in since or []]
        socket = await self.session.ws_connect(
            self.ws_url("/v1/ws"),
            params=params,
            headers={"Authorization": f"Bearer {token}"},
            autoping=True,
        )
        return PushStream(_ws_frames(socket), socket.close, self.frame_timeout)

    async def sse(self, subscription_id: str, token: str, since: str | None = None) -> PushStream:
        """Open one subscription's SSE stream, resuming from ``since``."""
        params = {"since": since} if since else {}
        response = await self.session.get(
            f"{self.base_url}/v1/subscriptions/{subscription_id}/events",
            params=params,
            headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"},
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        )
        if response.status != 200:
            body = await response.read()
            response.release()
            raise WireError(f"SSE stream refused: HTTP {response.status} {body[:200]!r}")

        async def close() -> None:
            response.close()

        return PushStream(_sse_frames(response), close, self.frame_timeout)


async def _ws_frames(socket: aiohttp.ClientWebSocketResponse) -> AsyncIterator[dict[str, Any]]:
    async for message in socket:
        if message.type == aiohttp.WSMsgType.TEXT:
            frame = orjson.loads(message.data)
            if isinstance(frame, dict):
                yield frame
        elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.ERROR):
            return


async def _sse_frames(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """SSE events as frames shaped like the WebSocket's: ``{type, data, id?}``."""
    name: str = "message"
    event_id: str | None = None
    data: list[str] = []
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                payload = orjson.loads("\n".join(data))
                control = name in ("resume", "live", "end", "overflow", "shutdown")
                frame = {"type": name if control else "notification", "data": payload}
                if event_id is not None:
                    frame["id"] = event_id
                yield frame
            name, event_id, data = "message", None, []
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
            elif key == "id":
                event_id = value


class PushStream:
    """Frames of one push connection, read one at a time with a timeout."""

    def __init__(self, frames: AsyncIterator[dict[str, Any]], closer: Any, timeout: float) -> None:
        self._frames = frames
        self._closer = closer
        #: how long to wait for a frame that should come
        self.timeout = timeout

    async def next(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next frame, or ``None`` when none comes within ``timeout`` or the stream ends."""
        timeout = self.timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(anext(self._frames), timeout)
        except (TimeoutError, StopAsyncIteration):
            return None

    async def notifications(
        self, wanted: Any, count: int, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Read until ``count`` notifications satisfying ``wanted(data)`` arrived, or timeout.

        Notifications about anything else (other checks run at the same time) are skipped.
        """
        found: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout if timeout is None else timeout)
        while len(found) < count:
            left = deadline - loop.time()
            if left <= 0:
                break
            frame = await self.next(left)
            if frame is None:
                break
            if frame.get("type") == "notification" and wanted(frame["data"]):
                found.append(frame["data"])
        return found

    async def until(self, frame_type: str, timeout: float | None = None) -> dict[str, Any] | None:
        """Skip to the next frame of ``frame_type``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout if timeout is None else timeout)
        while (left := deadline - loop.time()) > 0:
            frame = await self.next(left)
            if frame is None:
                return None
            if frame.get("type") == frame_type:
                return frame
        return None

    async def close(self) -> None:
        await self._closer()
