"""What the operator may do to any agent, over HTTP on a real server: deregister it,
cancel or resume its subscriptions, declare it failed, and page back through the
Field's events read from the log. Each is refused to an agent (and the events page to
anyone without the operator token)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from field.contract.errors import FieldError

from .conftest import ThreadedServer
from .core_util import Harness
from .schema_util import assert_valid
from .test_service import envelope
from .test_webhooks import FAST_RETRIES, receivers

__all__ = ["receivers"]  # the fixture, shared with tests/test_webhooks.py

OPERATOR_TOKEN = "operator-token-for-operator-actions-0123"
NOTE = {
    "type": "finding",
    "content": "a finding",
    "intent": {"purpose": "test"},
    "confidence": {"score": 0.7, "reasoning": "measured"},
}


@pytest.fixture
def server(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    return server_factory(operator_token=OPERATOR_TOKEN)


class Api:
    """Requests to one server, each with a bearer token."""

    def __init__(self, server: ThreadedServer, http: aiohttp.ClientSession) -> None:
        self.url = server.url
        self.http = http
        self.tokens: dict[str, str] = {"operator": OPERATOR_TOKEN}

    async def call(
        self, method: str, path: str, who: str | None, body: Any = None, **kw: Any
    ) -> tuple[int, Any]:
        headers = {} if who is None else {"Authorization": f"Bearer {self.tokens[who]}"}
        if "data" in kw:
            headers["Content-Type"] = "application/json"
        else:
            kw["json"] = body
        async with self.http.request(method, self.url + path, headers=headers, **kw) as response:
            return response.status, await response.json()

    async def op(self, operation: str, who: str, payload: dict[str, Any]) -> tuple[int, Any]:
        body = envelope(operation, who, payload)
        return await self.call("POST", f"/v1/{operation.lower()}", who, body)

    async def register(self, agent_id: str) -> None:
        self.tokens[agent_id] = agent_id  # REGISTER needs no token: the key is unused
        status, body = await self.call(
            "POST",
            "/v1/register",
            None,
            envelope("REGISTER", agent_id, {"id": agent_id, "role": "analyst"}),
        )
        assert status == 200, body
        self.tokens[agent_id] = body["token"]

    async def subscribe(self, who: str, subscription: dict[str, Any]) -> dict[str, Any]:
        payload = {"action": "subscribe", "subscription": subscription}
        status, body = await self.op("SUBSCRIBE", who, payload)
        assert status == 200, body
        return dict(body)

    async def until_delivery(
        self, who: str, subscription_id: str, done: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        """Poll SUBSCRIBE list until the delivery's state satisfies ``done`` (a state the
        server reaches without telling anyone: polled, with a deadline)."""
        deadline = time.monotonic() + 20
        while True:
            status, body = await self.op("SUBSCRIBE", who, {"action": "list"})
            (found,) = [s for s in body["subscriptions"] if s["id"] == subscription_id]
            if done(found["delivery"]):
                return dict(found["delivery"])
            assert time.monotonic() < deadline, found["delivery"]
            await asyncio.sleep(0.02)

    async def agent(self, agent_id: str) -> dict[str, Any] | None:
        status, body = await self.call("GET", f"/v1/agents?id={agent_id}", "operator")
        assert status == 200, body
        return next(iter(body["agents"]), None)


@pytest.fixture
def api(server: ThreadedServer, http: aiohttp.ClientSession) -> Api:
    return Api(server, http)


# -- the core: who the log says acted -----------------------------------------------


def test_the_log_names_the_operator_as_who_deregistered_or_cancelled() -> None:
    h = Harness(operator_token=OPERATOR_TOKEN)
    for agent_id in ("alice", "bob", "carol"):
        h.register(agent_id)
    h.tokens["operator"] = OPERATOR_TOKEN
    subscription = {"events": ["memory.recorded"]}
    made = h.send("SUBSCRIBE", "bob", {"action": "subscribe", "subscription": subscription})
    with pytest.raises(FieldError) as refused:
        h.send(
            "SUBSCRIBE",
            "carol",
            {"action": "unsubscribe", "subscription": {"id": made["subscription_id"]}},
        )
    assert refused.value.code == "FORBIDDEN"
    h.send(
        "SUBSCRIBE",
        "operator",
        {"action": "unsubscribe", "subscription": {"id": made["subscription_id"]}},
    )
    cancelled = h.entries[-1]
    assert (cancelled.kind, cancelled.agent_id) == ("subscription.cancelled", "operator")
    assert cancelled.data["reason"] == "cancelled by the operator"
    with pytest.raises(FieldError) as refused:
        h.send("DEREGISTER", "carol", {"agent_id": "alice"})
    assert refused.value.code == "FORBIDDEN"
    h.send("DEREGISTER", "operator", {"agent_id": "alice"})
    left = h.entries[-1]
    assert (left.kind, left.agent_id, left.data) == (
        "agent.deregistered",
        "operator",
        {"agent_id": "alice"},
    )
    replayed = h.replayed()
    assert sorted(replayed.state.agents) == ["bob", "carol"]
    assert replayed.state.subscriptions[made["subscription_id"]]["status"] == "cancelled"


# -- over HTTP -----------------------------------------------------------------------


async def test_the_operator_deregisters_any_agent_and_an_agent_only_itself(api: Api) -> None:
    for agent_id in ("alice", "bob"):
        await api.register(agent_id)
    status, body = await api.op(
        "SUBSCRIBE",
        "alice",
        {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}},
    )
    assert status == 200, body
    subscription_id = body["subscription_id"]

    status, body = await api.op("DEREGISTER", "bob", {"agent_id": "alice"})
    assert (status, body["code"]) == (403, "FORBIDDEN")
    assert await api.agent("alice") is not None

    status, body = await api.op("DEREGISTER", "operator", {"agent_id": "nobody"})
    assert (status, body["code"]) == (404, "AGENT_NOT_FOUND")

    # alice's stream is open when the operator deregisters her: it ends
    url = f"{api.url}/v1/subscriptions/{subscription_id}/events"
    headers = {"Authorization": f"Bearer {api.tokens['alice']}"}
    async with api.http.get(url, headers=headers) as stream:
        assert stream.status == 200
        names: list[str] = []

        async def read_until(name: str) -> None:
            async for line in stream.content:
                if line.startswith(b"event:"):
                    names.append(line.split(b":", 1)[1].strip().decode())
                    if names[-1] == name:
                        return

        await asyncio.wait_for(read_until("live"), 10)
        status, body = await api.op("DEREGISTER", "operator", {"agent_id": "alice"})
        assert status == 200 and body["status"] == "ok", body
        assert_valid("deregister.response", body)
        await asyncio.wait_for(read_until("end"), 10)
        await asyncio.wait_for(stream.content.read(), 10)  # the end frame's data, then EOF
        assert stream.content.at_eof()
    assert await api.agent("alice") is None
    # its token no longer opens anything, and its subscription is cancelled
    status, body = await api.op("SUBSCRIBE", "alice", {"action": "list"})
    assert (status, body["code"]) == (401, "AGENT_NOT_REGISTERED")
    payload = {"action": "unsubscribe", "subscription": {"id": subscription_id}}
    status, body = await api.op("SUBSCRIBE", "operator", payload)
    assert (status, body["code"]) == (409, "INVALID_TRANSITION"), body


async def test_the_operator_cancels_and_resumes_any_subscription(
    server_factory: Callable[..., ThreadedServer],
    http: aiohttp.ClientSession,
    receivers: Callable[..., Any],
) -> None:
    server = server_factory(
        operator_token=OPERATOR_TOKEN, webhook_allow_net=("127.0.0.0/8",), **FAST_RETRIES
    )
    api = Api(server, http)
    answer = {"now": 410}
    receiver = await receivers(answer=lambda n: answer["now"])
    for agent_id in ("alice", "bob"):
        await api.register(agent_id)
    hook = {"type": "webhook", "url": receiver.url}
    subscribed = await api.subscribe("alice", {"events": ["memory.recorded"], "delivery": hook})
    webhook = subscribed["subscription_id"]
    streamed = (await api.subscribe("alice", {"events": ["memory.recorded"]}))["subscription_id"]
    status, body = await api.op("RECORD", "bob", NOTE)
    assert status == 200, body
    await api.until_delivery("alice", webhook, lambda d: d["state"] == "failing")

    for action, subscription_id in (("resume", webhook), ("unsubscribe", streamed)):
        status, body = await api.op(
            "SUBSCRIBE", "bob", {"action": action, "subscription": {"id": subscription_id}}
        )
        assert (status, body["code"]) == (403, "FORBIDDEN"), action

    answer["now"] = 200
    status, body = await api.op(
        "SUBSCRIBE", "operator", {"action": "resume", "subscription": {"id": webhook}}
    )
    assert status == 200 and body["resumed"] is True, body
    assert_valid("subscribe.response", body)
    await receiver.until(lambda: len(receiver.delivered) == 1, "the delivery")

    status, body = await api.op(
        "SUBSCRIBE", "operator", {"action": "unsubscribe", "subscription": {"id": streamed}}
    )
    assert status == 200 and body["subscription"]["status"] == "cancelled", body
    assert_valid("subscribe.response", body)
    status, body = await api.op("SUBSCRIBE", "alice", {"action": "list"})
    assert [s["id"] for s in body["subscriptions"]] == [webhook]
    # cancelled by the operator: its own stream says so and ends
    status, body = await api.op(
        "SUBSCRIBE", "operator", {"action": "unsubscribe", "subscription": {"id": streamed}}
    )
    assert (status, body["code"]) == (409, "INVALID_TRANSITION"), body


async def test_the_operator_declares_an_agent_failed(api: Api) -> None:
    for agent_id in ("alice", "bob"):
        await api.register(agent_id)
    path = "/v1/agents/alice/fail"
    status, body = await api.call("POST", path, None)
    assert (status, body["code"]) == (401, "UNAUTHENTICATED")
    status, body = await api.call("POST", path, "bob", {})
    assert (status, body["code"]) == (403, "INSUFFICIENT_AUTHORITY")
    status, body = await api.call("POST", "/v1/agents/nobody/fail", "operator")
    assert (status, body["code"]) == (404, "AGENT_NOT_FOUND")
    for bad in ({"reason": ""}, {"reason": "x" * 501}, {"why": "no"}, [1], {"reason": 7}):
        status, body = await api.call("POST", path, "operator", bad)
        assert (status, body["code"]) == (422, "INVALID_PAYLOAD"), bad
        assert_valid("error", body)
    status, body = await api.call(
        "POST",
        path,
        "operator",
        data=b"{",
    )
    assert status == 400 and body["code"] == "INVALID_JSON"
    assert (await api.agent("alice") or {})["status"] != "failed"

    create = {"action": "create", "title": "size it", "assignee": "alice"}
    status, body = await api.op("COORDINATE", "alice", create)
    assert status == 200, body
    task_id = body["task"]["id"]
    status, body = await api.op("COORDINATE", "alice", {"action": "start", "task_id": task_id})
    assert status == 200, body

    status, body = await api.call("POST", path, "operator", {"reason": "stuck in a loop"})
    assert status == 200 and body["status"] == "failed" and body["epoch"] > 0, body
    assert_valid("agent-fail.response", body)
    alice = await api.agent("alice")
    assert alice is not None and alice["status"] == "failed"
    assert alice["failure_reason"] == "declared failed by the operator: stuck in a loop"
    status, body = await api.call("POST", path, "operator")
    assert (status, body) == (200, {"status": "unchanged"})
    assert_valid("agent-fail.response", body)
    # heard from again, it recovers as from a liveness failure
    status, body = await api.op("RECORD", "alice", NOTE)
    assert status == 200, body
    assert (await api.agent("alice") or {})["status"] != "failed"
    status, page = await api.call("GET", "/v1/events", "operator")
    # its task went back to pending, as on a liveness failure
    (released,) = [e for e in page["events"] if e["event"] == "task.state_changed"][:1]
    assert released["detail"]["task"]["status"] == "pending", released
    assert released["detail"]["task"]["assignee"] is None
    failed = [e for e in page["events"] if e["event"] == "agent.failed"]
    assert [e["summary"] for e in failed] == [
        "agent alice (analyst) failed: declared failed by the operator: stuck in a loop; "
        "1 task(s) back to pending"
    ]
    assert failed[0]["detail"]["released_tasks"] == [{"task_id": task_id, "created_by": "alice"}]


async def test_the_operator_pages_back_through_every_event_once(api: Api) -> None:
    await api.register("alice")
    recorded = []
    for i in range(23):
        status, body = await api.op("RECORD", "alice", {**NOTE, "content": f"finding {i}"})
        assert status == 200, body
        recorded.append(body["memory_unit_id"])
    for who in (None, "alice"):
        status, body = await api.call("GET", "/v1/events", who)
        assert status == (401 if who is None else 403), body
        assert_valid("error", body)
    for query in (
        "limit=0",
        "limit=201",
        "limit=x",
        "before=nope",
        "before=zz-3",
        "before=" + "9" * 70,
    ):
        status, body = await api.call("GET", f"/v1/events?{query}", "operator")
        assert (status, body["code"]) == (422, "INVALID_PAYLOAD"), query

    seen: list[dict[str, Any]] = []
    query = "/v1/events?limit=10"
    pages = 0
    while True:
        status, page = await api.call("GET", query, "operator")
        assert status == 200, page
        assert_valid("events.response", page)
        assert len(page["events"]) <= 10
        seen += page["events"]
        pages += 1
        if page["next"] is None:
            break
        query = f"/v1/events?limit=10&before={page['next']}"
    assert pages == 3
    cursors = [e["cursor"] for e in seen]
    assert len(set(cursors)) == len(cursors)
    positions = [int(c.rsplit("-", 1)[1]) for c in cursors]
    assert positions == sorted(positions, reverse=True)  # newest first, across pages
    names = [e["event"] for e in reversed(seen)]
    assert names == ["agent.joined"] + ["memory.recorded"] * 23
    assert [e["memory_unit_id"] for e in reversed(seen[:-1])] == recorded
    # a cursor at or before the log's start: nothing before it, and no further page
    tag = cursors[0].rsplit("-", 1)[0]
    for before in (f"{tag}-0", f"{tag}-1"):
        status, page = await api.call("GET", f"/v1/events?before={before}", "operator")
        assert (status, page) == (200, {"events": [], "next": None}), before
