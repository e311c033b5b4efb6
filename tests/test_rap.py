"""The RAP binding against a RAP runtime written here from the published contract.

The runtime (:class:`Runtime`) is an aiohttp server on loopback: it takes
tool results and subscription events at its callback URL, tracks each
thread's active subscriptions (a tool result with ``subscription: true``
adds one, a ``final`` event removes it), discards events of subscriptions
it does not know, answers 200 (or what a test tells it to), and records
everything in order of arrival. It invokes the Field's tools and cancels
and closes threads by the HTTP requests of the contract, with the agent's
token in ``Authorization``.

"Nothing more is sent" is checked against a witness: a plain webhook
subscription of the same events, delivered to the same runtime's
``/witness`` path. Once the witness has a unit, the Field has routed it
to every subscription; the RAP one must not have it.

Every message is recorded with its ``webhook-id`` header (``ids``), which
must be the same on every attempt of one message, and differ between two.
"""

from __future__ import annotations

import asyncio
import io
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from field.client import AgentClient, FieldClient
from field.contract.errors import Code, FieldError, InvalidEnvelope
from field.contract.model import Limits
from field.contract.tools import definitions
from field.transports.rap import parse_invocation

from . import rap_cases
from .conftest import ServerProcess, ThreadedServer
from .schema_util import assert_valid, is_valid

HANG_GUARD = 30  # seconds; only ever reached when something hangs
LOOPBACK = ("127.0.0.0/8",)
RAP_TOOLS = {
    "akashik_record",
    "akashik_attune",
    "akashik_subscribe",
    "akashik_detect",
    "akashik_merge",
    "akashik_replay",
    "akashik_compact",
    "akashik_deregister",
    "akashik_session",
    "akashik_coordinate",
    "akashik_handoff",
    "akashik_feedback",
}

StartServer = Callable[..., ThreadedServer]


class Runtime:
    """A RAP runtime's callback side, and the requests a runtime sends."""

    def __init__(self) -> None:
        #: every message received at the callback URL, in order of arrival
        self.received: list[dict[str, Any]] = []
        #: (thread, tool call id) of the subscriptions this runtime tracks
        self.active: set[tuple[str, str]] = set()
        #: events of tracked subscriptions, by (thread, tool call id), in order
        self.events: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.discarded: list[dict[str, Any]] = []
        self.witnessed: list[dict[str, Any]] = []
        #: arrival time (monotonic) of each message in ``received``
        self.times: list[float] = []
        #: the ``webhook-id`` header of each message in ``received`` (None: it had none)
        self.ids: list[str | None] = []
        #: the status answered to each message (a test may change it)
        self.status: Callable[[dict[str, Any]], int] = lambda message: 200
        #: the Retry-After header of the answers other than 200 (None: none)
        self.retry_after: str | None = None
        #: set: callbacks are answered; clear: they wait
        self.open = asyncio.Event()
        self.open.set()
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.http: aiohttp.ClientSession | None = None

    async def start(self) -> Runtime:
        app = web.Application()
        app.router.add_post("/callback", self._callback)
        app.router.add_post("/witness", self._witness)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self.http = aiohttp.ClientSession()
        return self

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def callback_url(self) -> str:
        return self.url + "/callback"

    async def _callback(self, request: web.Request) -> web.Response:
        await self.open.wait()
        message = orjson.loads(await request.read())
        status = self.status(message)
        async with self._changed:
            self.received.append(message)
            self.times.append(time.monotonic())
            self.ids.append(request.headers.get("webhook-id"))
            if status == 200:
                self._track(message)
            self._changed.notify_all()
        if status != 200 and self.retry_after is not None:
            return web.Response(status=status, headers={"Retry-After": self.retry_after})
        return web.Response(status=status)

    def _track(self, message: dict[str, Any]) -> None:
        if message["type"] == "tool_result" and message.get("subscription") is True:
            self.active.add((message["group_id"], message["id"]))
        elif message["type"] == "subscription_event":
            key = (message["group_id"], message["tool_call_id"])
            if key not in self.active:
                self.discarded.append(message)  # unknown or cancelled: MUST be discarded
                return
            self.events.setdefault(key, []).append(message)
            if message.get("final"):
                self.active.discard(key)

    async def _witness(self, request: web.Request) -> web.Response:
        async with self._changed:
            self.witnessed.append(orjson.loads(await request.read()))
            self._changed.notify_all()
        return web.Response(status=200)

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds (checked on every message)."""
        async with asyncio.timeout(HANG_GUARD), self._changed:
            await self._changed.wait_for(predicate)

    # -- what arrived ----------------------------------------------------------------

    def results(self) -> dict[str, dict[str, Any]]:
        return {m["id"]: m for m in self.received if m["type"] == "tool_result"}

    async def result(self, call_id: str) -> dict[str, Any]:
        await self.until(lambda: call_id in self.results())
        return self.results()[call_id]

    def event_units(self, thread: str, call: str) -> list[str]:
        """The unit ids of a subscription's notifications (the final excluded)."""
        events = self.events.get((thread, call), [])
        return [orjson.loads(e["text"])["memory_unit_id"] for e in events if not e.get("final")]

    def finals(self, thread: str, call: str) -> list[dict[str, Any]]:
        return [
            m
            for m in self.received
            if m["type"] == "subscription_event"
            and (m["group_id"], m["tool_call_id"]) == (thread, call)
            and m.get("final")
        ]

    def witnessed_units(self) -> list[str]:
        return [n["memory_unit_id"] for n in self.witnessed]

    def attempts(self) -> dict[tuple[str, str], list[str | None]]:
        """The ``webhook-id`` of every attempt of each message received, by :func:`key_of`."""
        ids: dict[tuple[str, str], list[str | None]] = {}
        for message, message_id in zip(self.received, self.ids, strict=True):
            ids.setdefault(key_of(message), []).append(message_id)
        return ids

    # -- what a runtime sends --------------------------------------------------------

    async def post(
        self, url: str, body: Any, token: str | None, **headers: str
    ) -> tuple[int, dict[str, Any]]:
        assert self.http is not None
        sent = {"Content-Type": "application/json", **headers}
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = io.BytesIO(body if isinstance(body, bytes) else orjson.dumps(body))
        async with self.http.post(url, data=data, headers=sent) as response:
            return response.status, orjson.loads(await response.read())

    def invocation(
        self, tool: str, arguments: dict[str, Any], call: str, thread: str = "thread-1", **more: Any
    ) -> dict[str, Any]:
        return {
            "operation": tool,
            "arguments": arguments,
            "id": call,
            "call_id": None,
            "callback_url": self.callback_url,
            "group_id": thread,
            "user_id": "user-42",
            **more,
        }

    async def invoke(
        self,
        field_url: str,
        token: str | None,
        tool: str,
        arguments: dict[str, Any],
        call: str,
        thread: str = "thread-1",
        **more: Any,
    ) -> tuple[int, dict[str, Any]]:
        body = self.invocation(tool, arguments, call, thread, **more)
        return await self.post(field_url + "/rap/invoke", body, token)

    async def call(
        self,
        field_url: str,
        token: str,
        tool: str,
        arguments: dict[str, Any],
        call: str,
        **more: Any,
    ) -> dict[str, Any]:
        """Invoke and wait for the tool result."""
        status, body = await self.invoke(field_url, token, tool, arguments, call, **more)
        assert (status, body) == (200, {"status": "accepted"})
        return await self.result(call)

    async def subscribe(
        self,
        field_url: str,
        token: str,
        call: str,
        thread: str = "thread-1",
        events: tuple[str, ...] = ("memory.recorded",),
        **arguments: Any,
    ) -> str:
        """``akashik_subscribe``; returns the subscription id its tool result names."""
        status, _ = await self.invoke(
            field_url,
            token,
            "akashik_subscribe",
            {"events": list(events), "include_own": True, **arguments},
            call,
            thread,
        )
        assert status == 200
        result = await self.result(call)
        assert result["subscription"] is True, result
        return str(orjson.loads(result["text"])["subscription_id"])

    async def cancel(
        self, field_url: str, token: str | None, thread: str, call: str
    ) -> tuple[int, dict[str, Any]]:
        body = {"thread_id": thread, "tool_call_id": call}
        return await self.post(field_url + "/cancel_tool_call", body, token)

    async def close(self, field_url: str, token: str | None, thread: str) -> tuple[int, Any]:
        return await self.post(field_url + "/close_thread", {"thread_id": thread}, token)


def key_of(message: dict[str, Any]) -> tuple[str, str]:
    """What one message is, however often it is sent: a call's tool result, a subscription
    event (by its notification's cursor), a subscription's final event."""
    if message["type"] == "tool_result":
        return "result", message["id"]
    if message.get("final"):
        return "final", message["tool_call_id"]
    return "event", orjson.loads(message["text"])["cursor"]


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    started = await Runtime().start()
    yield started
    await started.stop()


@pytest.fixture
def rap_server(server_factory: StartServer) -> ThreadedServer:
    return server_factory(webhook_allow_net=LOOPBACK)


@pytest.fixture
async def agent(rap_server: ThreadedServer) -> AsyncIterator[AgentClient]:
    async with FieldClient(rap_server.url) as field:
        yield await field.register("analyst-1", "analyst", interests=["market size"])


async def record(agent: AgentClient, content: str) -> str:
    response = await agent.record("finding", content, purpose="test", confidence=0.8, reasoning="r")
    return str(response["memory_unit_id"])


async def record_many(agent: AgentClient, count: int, label: str) -> list[str]:
    return [await record(agent, f"{label} {i}: the market size grows") for i in range(count)]


async def witness(agent: AgentClient, runtime: Runtime) -> str:
    """A plain webhook subscription of the same agent, delivered to ``/witness``."""
    subscription = {
        "events": ["memory.recorded"],
        "include_own": True,
        "delivery": {"type": "webhook", "url": runtime.url + "/witness"},
    }
    response = await agent.send("SUBSCRIBE", {"action": "subscribe", "subscription": subscription})
    return str(response["subscription_id"])


async def silence_after(agent: AgentClient, runtime: Runtime, label: str) -> None:
    """Record units until the witness has them; nothing more may reach the RAP side."""
    before = len(runtime.received)
    units = await record_many(agent, 3, label)
    await runtime.until(lambda: set(units) <= set(runtime.witnessed_units()))
    assert runtime.received[before:] == []


async def active_subscriptions(agent: AgentClient) -> list[str]:
    listed = await agent.subscriptions()
    return [s["id"] for s in listed["subscriptions"]]


# -- discovery -----------------------------------------------------------------------------


async def test_the_toolset_lists_the_operations_with_their_schemas(
    rap_server: ThreadedServer, runtime: Runtime
) -> None:
    assert runtime.http is not None
    async with runtime.http.get(rap_server.url + "/.well-known/rap-toolset") as response:
        assert response.status == 200
        toolset = await response.json()
    assert_valid("rap-toolset", toolset)
    assert toolset["endpoint"] == rap_server.url + "/rap/invoke"
    tools = {tool["name"]: tool for tool in toolset["tools"]}
    assert set(tools) == RAP_TOOLS  # no akashik_register: its result is a secret
    assert "register" in toolset["description"] and "Authorization" in toolset["description"]
    for name, tool in tools.items():
        assert tool["inputSchema"] == definitions("rap")[name]["inputSchema"]
        assert tool["description"] and len(tool["description"]) < 600
        assert "agent_id" not in tool["inputSchema"].get("properties", {}), name
    subscribe = tools["akashik_subscribe"]["inputSchema"]
    assert set(subscribe["properties"]) == {
        "events",
        "min_relevance",
        "debounce_ms",
        "include_own",
        "timeout",
        "associative",
    }
    assert subscribe["properties"]["associative"]["default"] is False
    record_schema = tools["akashik_record"]["inputSchema"]
    assert {"type", "content", "intent", "session_id"} <= set(record_schema["properties"])


# -- invocations and their results -----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "instance"),
    [p for p in rap_cases.VALID + rap_cases.INVALID if p.values[0] == "rap-invocation"],
)
def test_the_parser_accepts_exactly_the_valid_invocations(name: str, instance: Any) -> None:
    try:
        parse_invocation(instance)
    except InvalidEnvelope:
        accepted = False
    except FieldError as error:  # well formed, of another toolset version
        assert error.code == Code.TOOLSET_CHANGED
        accepted = True
    else:
        accepted = True
    assert accepted == is_valid(name, instance)


async def test_record_and_attune_answer_with_tool_results(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    arguments = {
        "type": "finding",
        "content": "The market size grows 23% a year.",
        "intent": {"purpose": "size the market"},
        "confidence": {"score": 0.8, "reasoning": "three reports agree"},
    }
    result = await runtime.call(
        rap_server.url, agent.token, "akashik_record", arguments, "call-1", call_id="c-9"
    )
    assert_valid("rap-tool-result", result)
    assert (result["group_id"], result["id"], result["call_id"]) == ("thread-1", "call-1", "c-9")
    assert "is_error" not in result and "subscription" not in result
    recorded = orjson.loads(result["text"])
    assert_valid("record.response", recorded)
    assert recorded["status"] == "accepted"
    unit_id = recorded["memory_unit_id"]

    scope = {"include_own": True}  # role and max_units: the defaults
    result = await runtime.call(
        rap_server.url, agent.token, "akashik_attune", {"scope": scope}, "call-2"
    )
    attuned = orjson.loads(result["text"])
    assert_valid("attune.response", attuned)
    assert [r["memory_unit"]["id"] for r in attuned["record"]] == [unit_id]
    # the unit is the token's agent's, whatever the runtime's user is
    assert attuned["record"][0]["memory_unit"]["source"]["agent_id"] == agent.id


async def test_a_failed_operation_is_an_error_tool_result(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    arguments = {"type": "finding", "content": "no reason given", "intent": {"purpose": ""}}
    result = await runtime.call(rap_server.url, agent.token, "akashik_record", arguments, "bad-1")
    assert result["is_error"] is True
    assert_valid("rap-tool-result", result)
    error = orjson.loads(result["text"])
    assert_valid("error", error)
    assert (error["code"], error["operation"]) == ("MISSING_INTENT", "RECORD")

    result = await runtime.call(
        rap_server.url, agent.token, "akashik_subscribe", {"events": ["no.such"]}, "bad-2"
    )
    assert result["is_error"] is True and "subscription" not in result
    assert orjson.loads(result["text"])["code"] == "INVALID_PAYLOAD"
    result = await runtime.call(
        rap_server.url,
        agent.token,
        "akashik_subscribe",
        {"events": ["memory.recorded"], "delivery": {"type": "stream"}},
        "bad-3",
    )
    assert orjson.loads(result["text"])["code"] == "INVALID_PAYLOAD"
    assert await active_subscriptions(agent) == []
    assert (await agent.field.status())["counts"]["memory_units"] == {}


async def test_malformed_invocations_are_refused_and_nothing_happens(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    good = runtime.invocation(
        "akashik_record",
        {"type": "finding", "content": "x", "intent": {"purpose": "p"}, "mode": "draft"},
        "call-1",
    )
    bad: list[tuple[Any, int, str]] = [
        (b"not json", 400, "INVALID_JSON"),
        ([good], 400, "INVALID_ENVELOPE"),
        ({**good, "operation": "akashik_register"}, 400, "INVALID_ENVELOPE"),
        ({**good, "operation": "RECORD"}, 400, "INVALID_ENVELOPE"),
        ({**good, "arguments": ["x"]}, 400, "INVALID_ENVELOPE"),
        ({**good, "id": ""}, 400, "INVALID_ENVELOPE"),
        ({**good, "id": "x" * 257}, 400, "INVALID_ENVELOPE"),
        ({**good, "group_id": 7}, 400, "INVALID_ENVELOPE"),
        ({k: v for k, v in good.items() if k != "group_id"}, 400, "INVALID_ENVELOPE"),
        ({k: v for k, v in good.items() if k != "callback_url"}, 400, "INVALID_ENVELOPE"),
        ({**good, "user_id": ["u"]}, 400, "INVALID_ENVELOPE"),
        ({**good, "call_id": "c" * 300}, 400, "INVALID_ENVELOPE"),
        ({**good, "callback_url": "ftp://127.0.0.1/cb"}, 422, "INVALID_PAYLOAD"),
        ({**good, "callback_url": "http://10.1.2.3/cb"}, 422, "INVALID_PAYLOAD"),
        ({**good, "toolset_version": "0000000000000000"}, 409, "TOOLSET_CHANGED"),
        ({**good, "arguments": {"content": "x" * 2_000_000}}, 413, "PAYLOAD_TOO_LARGE"),
    ]
    url = rap_server.url + "/rap/invoke"
    for body, status, code in bad:
        answer = await runtime.post(url, body, agent.token)
        assert answer[0] == status, (body if not isinstance(body, dict) else body.keys(), answer)
        assert_valid("error", answer[1])
        assert answer[1]["code"] == code
    answer = await runtime.post(url, good, agent.token, **{"Content-Type": "text/plain"})
    assert answer[0] == 415

    # a good one afterwards: its result is the only message the runtime ever gets
    assert (await runtime.post(url, good, agent.token))[0] == 200
    await runtime.result("call-1")
    assert [m["id"] for m in runtime.received] == ["call-1"]
    assert (await agent.field.status())["counts"]["memory_units"] == {"draft": 1}


async def test_the_current_toolset_version_is_accepted(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    assert runtime.http is not None
    async with runtime.http.get(rap_server.url + "/.well-known/rap-toolset") as response:
        version = (await response.json())["version"]
    result = await runtime.call(
        rap_server.url, agent.token, "akashik_attune", {}, "call-1", toolset_version=version
    )
    assert "is_error" not in result


async def test_without_a_valid_token_nothing_happens(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    await runtime.subscribe(rap_server.url, agent.token, "sub-call")
    arguments = {"type": "finding", "content": "x", "intent": {"purpose": "p"}, "mode": "draft"}
    for token in (None, "not-a-token-the-field-issued"):
        status, body = await runtime.invoke(rap_server.url, token, "akashik_record", arguments, "c")
        assert status == 401 and body["code"] == "UNAUTHENTICATED"
        status, body = await runtime.cancel(rap_server.url, token, "thread-1", "sub-call")
        assert status == 401 and body["code"] == "UNAUTHENTICATED"
        status, body = await runtime.close(rap_server.url, token, "thread-1")
        assert status == 401 and body["code"] == "UNAUTHENTICATED"
    # the subscription is still there and still delivers; nothing was recorded by "c"
    unit = await record(agent, "the market size after the refusals")
    await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == [unit])
    assert "c" not in runtime.results()
    assert (await agent.field.status())["counts"]["memory_units"] == {"active": 1}


async def test_another_agents_token_cancels_nothing(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    await runtime.subscribe(rap_server.url, agent.token, "sub-call")
    other = await agent.field.register("other-1", "analyst")
    assert await runtime.cancel(rap_server.url, other.token, "thread-1", "sub-call") == (
        200,
        {"status": "ok", "cancelled": []},
    )
    assert await runtime.close(rap_server.url, other.token, "thread-1") == (
        200,
        {"status": "ok", "cancelled": []},
    )
    unit = await record(agent, "the market size, still subscribed")
    await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == [unit])
    assert runtime.finals("thread-1", "sub-call") == []


# -- subscriptions ----------------------------------------------------------------------------


async def test_subscribe_events_cancel_then_silence(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    await witness(agent, runtime)
    status, _ = await runtime.invoke(
        rap_server.url,
        agent.token,
        "akashik_subscribe",
        {"events": ["memory.recorded"], "include_own": True},
        "sub-call",
        call_id="model-7",
    )
    assert status == 200
    result = await runtime.result("sub-call")
    assert_valid("rap-tool-result", result)
    assert result["subscription"] is True and result["call_id"] == "model-7"
    answer = orjson.loads(result["text"])
    subscription_id = answer["subscription_id"]
    assert answer["subscription"]["id"] == subscription_id
    assert answer["subscription"]["delivery"]["tool_call_id"] == "sub-call"
    assert answer["subscription"]["delivery"]["user_id"] == "user-42"
    assert await active_subscriptions(agent) != []

    units = await record_many(agent, 5, "live")
    await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == units)
    events = runtime.events[("thread-1", "sub-call")]
    assert runtime.received.index(result) == 0  # the tool result came before any event
    for event in events:
        assert_valid("rap-subscription-event", event)
        assert event["associative"] is False and "final" not in event
        notification = orjson.loads(event["text"])
        assert_valid("notification", notification)
        assert notification["subscription_id"] == subscription_id

    # RAP: a tool MUST NOT send subscription events after a cancellation: no final either
    assert await runtime.cancel(rap_server.url, agent.token, "thread-1", "sub-call") == (
        200,
        {"status": "ok", "cancelled": [subscription_id]},
    )
    assert subscription_id not in await active_subscriptions(agent)
    await silence_after(agent, runtime, "after")
    assert runtime.finals("thread-1", "sub-call") == [] and runtime.discarded == []


async def test_associative_events_and_debounce(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    await runtime.subscribe(rap_server.url, agent.token, "sub-call", associative=True)
    unit = await record(agent, "the market size, inline")
    await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == [unit])
    assert runtime.events[("thread-1", "sub-call")][0]["associative"] is True


async def test_close_thread_ends_that_threads_subscriptions_only(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    await witness(agent, runtime)
    a1 = await runtime.subscribe(rap_server.url, agent.token, "a-1", "thread-a")
    a2 = await runtime.subscribe(rap_server.url, agent.token, "a-2", "thread-a")
    await runtime.subscribe(rap_server.url, agent.token, "b-1", "thread-b")
    closed = len(runtime.received)
    status, body = await runtime.close(rap_server.url, agent.token, "thread-a")
    assert status == 200 and sorted(body["cancelled"]) == sorted([a1, a2])
    units = await record_many(agent, 3, "after close")
    await runtime.until(lambda: runtime.event_units("thread-b", "b-1") == units)
    await runtime.until(lambda: set(units) <= set(runtime.witnessed_units()))
    later = runtime.received[closed:]  # nothing of thread-a after its close, not even a final
    assert {(m["group_id"], m["tool_call_id"]) for m in later} == {("thread-b", "b-1")}
    assert runtime.finals("thread-b", "b-1") == []


async def test_cancel_and_close_are_idempotent(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    await witness(agent, runtime)
    subscription_id = await runtime.subscribe(rap_server.url, agent.token, "sub-call")
    first = await runtime.cancel(rap_server.url, agent.token, "thread-1", "sub-call")
    again = await runtime.cancel(rap_server.url, agent.token, "thread-1", "sub-call")
    closed = await runtime.close(rap_server.url, agent.token, "thread-1")
    unknown = await runtime.cancel(rap_server.url, agent.token, "thread-9", "no-such-call")
    assert first == (200, {"status": "ok", "cancelled": [subscription_id]})
    assert again == closed == unknown == (200, {"status": "ok", "cancelled": []})
    malformed = await runtime.post(
        rap_server.url + "/cancel_tool_call", {"thread_id": "thread-1"}, agent.token
    )
    assert malformed[0] == 200 and malformed[1]["status"] == "ignored"
    assert_valid("rap-cancel.response", malformed[1])
    for answer in (first, again, closed, unknown):
        assert_valid("rap-cancel.response", answer[1])
    await silence_after(agent, runtime, "after")
    assert runtime.finals("thread-1", "sub-call") == []


async def test_deregister_ends_the_subscription_with_a_final(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    await runtime.subscribe(rap_server.url, agent.token, "sub-call")
    unit = await record(agent, "the market size before leaving")
    await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == [unit])
    result = await runtime.call(rap_server.url, agent.token, "akashik_deregister", {}, "leave")
    assert orjson.loads(result["text"])["status"] == "ok"
    await runtime.until(lambda: len(runtime.finals("thread-1", "sub-call")) == 1)
    (final,) = runtime.finals("thread-1", "sub-call")
    assert orjson.loads(final["text"])["reason"] == "agent deregistered"
    subscription_id = orjson.loads(final["text"])["subscription_id"]
    assert runtime.ids[runtime.received.index(final)] == f"{subscription_id}.final"
    # the token is revoked: the runtime can no longer act, nor cancel
    assert (await runtime.close(rap_server.url, agent.token, "thread-1"))[0] == 401


async def test_unsubscribing_over_http_ends_it_with_a_final(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    await witness(agent, runtime)
    subscription_id = await runtime.subscribe(rap_server.url, agent.token, "sub-call")
    await agent.unsubscribe(subscription_id)
    await runtime.until(lambda: len(runtime.finals("thread-1", "sub-call")) == 1)
    (final,) = runtime.finals("thread-1", "sub-call")
    assert orjson.loads(final["text"])["reason"] == "unsubscribed"
    await silence_after(agent, runtime, "after")


async def test_an_invocation_sent_again_subscribes_once(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    """A runtime that lost the 200 sends the call again: still one subscription, one result."""
    arguments = {"events": ["memory.recorded"], "include_own": True}
    for _ in range(2):
        status, _ = await runtime.invoke(
            rap_server.url, agent.token, "akashik_subscribe", arguments, "sub-call"
        )
        assert status == 200
    await runtime.result("sub-call")
    unit = await record(agent, "the market size, once")
    await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == [unit])
    assert len(await active_subscriptions(agent)) == 1
    assert [m["type"] for m in runtime.received] == ["tool_result", "subscription_event"]


async def test_a_runtime_that_answers_4xx_has_its_subscription_cancelled(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    await witness(agent, runtime)
    subscription_id = await runtime.subscribe(rap_server.url, agent.token, "sub-call")
    runtime.status = lambda m: 404 if m["type"] == "subscription_event" else 200
    unit = await record(agent, "the market size nobody wants")
    await runtime.until(lambda: len(runtime.received) == 2)  # the result, the refused event
    assert orjson.loads(runtime.received[1]["text"])["memory_unit_id"] == unit
    deadline = time.monotonic() + HANG_GUARD  # the cancellation is the Field's own write
    while subscription_id in await active_subscriptions(agent):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await silence_after(agent, runtime, "after")
    assert runtime.finals("thread-1", "sub-call") == []  # the runtime said it knows none


async def test_the_per_thread_cap(server_factory: StartServer, runtime: Runtime) -> None:
    limits = Limits(max_subscriptions_per_thread=2)
    server = server_factory(webhook_allow_net=LOOPBACK, limits=limits)
    async with FieldClient(server.url) as field:
        agent = await field.register("analyst-1", "analyst")
        await runtime.subscribe(server.url, agent.token, "s-1", "thread-a")
        await runtime.subscribe(server.url, agent.token, "s-2", "thread-a")
        refused = await runtime.call(
            server.url,
            agent.token,
            "akashik_subscribe",
            {"events": ["agent.joined"]},
            "s-3",
            thread="thread-a",
        )
        assert refused["is_error"] is True and "subscription" not in refused
        assert orjson.loads(refused["text"])["code"] == "SUBSCRIPTION_LIMIT"
        await runtime.subscribe(server.url, agent.token, "s-4", "thread-b")  # another thread
        await runtime.cancel(server.url, agent.token, "thread-a", "s-1")
        await runtime.subscribe(server.url, agent.token, "s-5", "thread-a")  # room again
        assert len(await active_subscriptions(agent)) == 3


async def test_the_rate_limit_delays_and_drops_nothing(
    server_factory: StartServer, runtime: Runtime
) -> None:
    rate, burst, count = 20.0, 5, 60
    server = server_factory(webhook_allow_net=LOOPBACK, delivery_rate=rate, delivery_burst=burst)
    async with FieldClient(server.url) as field:
        agent = await field.register("analyst-1", "analyst")
        await runtime.subscribe(server.url, agent.token, "sub-call")
        units = await record_many(agent, count, "flood")
        await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == units)
    # from the first event on, event i took the (i+1)th token of a bucket of `burst`
    times = [
        at
        for at, message in zip(runtime.times, runtime.received, strict=True)
        if message["type"] == "subscription_event"
    ]
    assert len(times) == count
    for i, at in enumerate(times):
        assert at - times[0] >= (i + 1 - burst) / rate - 0.01, (i, at - times[0])


async def test_a_slow_invocation_cap_answers_overloaded(
    server_factory: StartServer, runtime: Runtime
) -> None:
    server = server_factory(webhook_allow_net=LOOPBACK, rap_max_invocations=1)
    async with FieldClient(server.url) as field:
        agent = await field.register("analyst-1", "analyst")
        runtime.open.clear()  # the runtime holds its callbacks: the first call stays running
        assert (await runtime.invoke(server.url, agent.token, "akashik_attune", {}, "c-1"))[
            0
        ] == 200
        status, body = await runtime.invoke(server.url, agent.token, "akashik_attune", {}, "c-2")
        assert status == 503 and body["code"] == "OVERLOADED"
        runtime.open.set()
        await runtime.result("c-1")
        # once the first result is delivered, there is room again
        deadline = time.monotonic() + HANG_GUARD
        while (await runtime.invoke(server.url, agent.token, "akashik_attune", {}, "c-3"))[
            0
        ] != 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await runtime.result("c-3")
        assert "c-2" not in runtime.results()


async def test_a_tool_result_is_retried_after_a_5xx(
    rap_server: ThreadedServer, agent: AgentClient, runtime: Runtime
) -> None:
    answers = iter([503, 200])
    runtime.status = lambda m: next(answers)
    status, _ = await runtime.invoke(rap_server.url, agent.token, "akashik_attune", {}, "c-1")
    assert status == 200
    await runtime.until(lambda: len(runtime.received) == 2)  # refused with 503, then taken
    first, second = runtime.received
    assert first == second and first["id"] == "c-1"
    assert runtime.ids[0] is not None and runtime.ids[0] == runtime.ids[1]


async def test_a_cancel_the_log_cannot_take_is_refused_with_a_5xx(
    server_factory: StartServer, tmp_path: Path, runtime: Runtime
) -> None:
    """Not 200: a runtime does not send a 200-answered cancel again, and nothing happened."""
    server = server_factory(webhook_allow_net=LOOPBACK, data_dir=tmp_path / "data")
    async with FieldClient(server.url) as field:
        agent = await field.register("analyst-1", "analyst")
        subscription_id = await runtime.subscribe(server.url, agent.token, "sub-call")
        other = sqlite3.connect(tmp_path / "data" / "field.db", isolation_level=None, timeout=5)
        try:
            other.execute("BEGIN EXCLUSIVE")  # another process takes the write lock
            status, body = await runtime.cancel(server.url, agent.token, "thread-1", "sub-call")
            assert (status, body["code"]) == (503, "LOG_UNAVAILABLE")
            status, body = await runtime.close(server.url, agent.token, "thread-1")
            assert (status, body["code"]) == (503, "LOG_UNAVAILABLE")
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert subscription_id in await active_subscriptions(agent)
        deadline = time.monotonic() + HANG_GUARD
        while not (await field.status())["log"]["writable"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        status, body = await runtime.cancel(server.url, agent.token, "thread-1", "sub-call")
        assert (status, body["cancelled"]) == (200, [subscription_id])
        assert subscription_id not in await active_subscriptions(agent)


async def test_every_message_keeps_its_webhook_id_when_sent_again(
    server_factory: StartServer, runtime: Runtime
) -> None:
    """A runtime that refuses the first attempt of every message (a 503) gets each again, with
    the same webhook-id: its dedupe key. Two messages never share one."""
    server = server_factory(webhook_allow_net=LOOPBACK, webhook_retry_base=0.05)
    refused: set[tuple[str, str]] = set()

    def first_refused(message: dict[str, Any]) -> int:
        key = key_of(message)
        if key in refused:
            return 200
        refused.add(key)
        return 503

    runtime.status = first_refused
    async with FieldClient(server.url) as field:
        agent = await field.register("analyst-1", "analyst")
        subscription_id = await runtime.subscribe(server.url, agent.token, "sub-call")
        units = await record_many(agent, 2, "sent twice")
        await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == units)
        await agent.unsubscribe(subscription_id)  # the Field ends it: a final event
        await runtime.until(lambda: ("thread-1", "sub-call") not in runtime.active)
        await runtime.invoke(server.url, agent.token, "akashik_attune", {}, "plain")
        await runtime.until(lambda: len(runtime.attempts().get(("result", "plain"), [])) == 2)
    attempts = runtime.attempts()
    events = [key for key in attempts if key[0] == "event"]
    assert len(events) == 2
    assert set(attempts) == {("result", "sub-call"), *events, ("final", "sub-call")} | {
        ("result", "plain")
    }
    for key, ids in attempts.items():
        assert len(ids) == 2 and ids[0] == ids[1] and ids[0], (key, ids)
    assert attempts[("result", "sub-call")][0] == f"{subscription_id}.result"
    assert attempts[("final", "sub-call")][0] == f"{subscription_id}.final"
    for _, cursor in events:
        assert attempts[("event", cursor)][0] == cursor
    assert len({ids[0] for ids in attempts.values()}) == len(attempts)  # one id per message


# -- across a crash ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_rap_subscription_survives_sigkill_and_ends_with_one_final(
    server_process: Callable[..., ServerProcess], tmp_path: Path, runtime: Runtime
) -> None:
    data_dir = tmp_path / "data"
    flags = ("--webhook-allow-net", "127.0.0.0/8")
    first = server_process(data_dir, *flags)
    async with FieldClient(first.url) as field:
        agent = await field.register("analyst-1", "analyst")
        await witness(agent, runtime)
        subscription_id = await runtime.subscribe(first.url, agent.token, "sub-call")
        before = await record_many(agent, 3, "before")
        await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == before)
        runtime.status = lambda m: 503  # the runtime is down: what follows is owed
        owed = await record_many(agent, 3, "owed")
        await runtime.until(lambda: set(owed) <= set(runtime.witnessed_units()))
        await runtime.until(lambda: len(runtime.received) > 4)  # the first owed one, refused
        refused = key_of(runtime.received[4])
    first.stop(signal.SIGKILL)

    runtime.status = lambda m: 200
    second = server_process(data_dir, *flags)
    async with FieldClient(second.url) as field:
        agent = field.agent(agent.id, agent.token)
        assert subscription_id in await active_subscriptions(agent)
        after = await record_many(agent, 2, "after")
        expected = before + owed + after
        await runtime.until(lambda: runtime.event_units("thread-1", "sub-call") == expected)
        await agent.unsubscribe(subscription_id)  # the Field ends it: one final event
        await runtime.until(lambda: ("thread-1", "sub-call") not in runtime.active)
        await silence_after(agent, runtime, "silence")
    (final,) = runtime.finals("thread-1", "sub-call")
    assert orjson.loads(final["text"])["reason"] == "unsubscribed"
    results = [m for m in runtime.received if m["type"] == "tool_result"]
    assert len(results) == 1  # the subscription's result was acknowledged before the crash
    # a message sent again after the crash carries the webhook-id it had before
    attempts = runtime.attempts()
    assert len(attempts[refused]) >= 2 and attempts[refused][0] == refused[1]  # its cursor
    for (kind, name), ids in attempts.items():
        expected_id = {"result": f"{subscription_id}.result", "final": f"{subscription_id}.final"}
        assert set(ids) == {expected_id.get(kind, name)}, (kind, name, ids)


@pytest.mark.slow
async def test_after_the_runtimes_cancel_nothing_is_sent_even_after_a_restart(
    server_process: Callable[..., ServerProcess], tmp_path: Path, runtime: Runtime
) -> None:
    """What the subscription still owed when the runtime cancelled it, and its final event,
    are never sent: the log says its delivery ended with the cancellation."""
    data_dir = tmp_path / "data"
    flags = ("--webhook-allow-net", "127.0.0.0/8")
    first = server_process(data_dir, *flags)
    async with FieldClient(first.url) as field:
        agent = await field.register("analyst-1", "analyst")
        await witness(agent, runtime)
        subscription_id = await runtime.subscribe(first.url, agent.token, "sub-call")
        runtime.status, runtime.retry_after = (lambda m: 503), "300"  # owed, not tried again
        await record_many(agent, 2, "owed")
        await runtime.until(lambda: len(runtime.received) == 2)  # the result, a refused event
        status, body = await runtime.cancel(first.url, agent.token, "thread-1", "sub-call")
        assert (status, body["cancelled"]) == (200, [subscription_id])
        cancelled = len(runtime.received)
    first.stop(signal.SIGKILL)

    runtime.status = lambda m: 200
    second = server_process(data_dir, *flags)
    async with FieldClient(second.url) as field:
        agent = field.agent(agent.id, agent.token)
        assert subscription_id not in await active_subscriptions(agent)
        await silence_after(agent, runtime, "after the restart")
    assert runtime.received[cancelled:] == []  # neither what it owed nor a final event
