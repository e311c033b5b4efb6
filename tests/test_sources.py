"""Inbound event sources end to end: a real server, real HTTP clients, signed events.

An event is signed as its sender signs it (GitHub's ``X-Hub-Signature-256``, or
Standard Webhooks), posted to ``/v1/sources/<name>/events``, and followed to a
subscriber's SSE stream; every refusal is checked to have stored nothing (the log's
last position, the unit counts and ATTUNE do not move).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from field.client import AgentClient, FieldClient

from .conftest import ThreadedServer
from .schema_util import assert_valid
from .test_push import sse_stream, subscribe

OPERATOR_TOKEN = "operator-token-for-sources-0123456789"
GITHUB_SECRET = "It's a Secret to Everybody"
STANDARD_SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()

PULL_REQUEST = {
    "action": "opened",
    "number": 42,
    "pull_request": {
        "title": "Add inbound event sources",
        "user": {"login": "octocat"},
        "labels": [{"name": "feature"}],
    },
    "repository": {"full_name": "buoyant-systems/agent-mesh"},
}

GITHUB_SOURCE = {
    "name": "github",
    "scheme": "github",
    "secret": GITHUB_SECRET,
    "filter": "payload.action == 'opened' && headers['x-github-event'] == 'pull_request'",
    "unit": {
        "type": "observation",
        "content": "PR #{payload.number} {payload.pull_request.title} by "
        "{payload.pull_request.user.login} in {payload.repository.full_name}",
        "purpose": "Follow pull requests of {payload.repository.full_name}",
        "confidence": 0.9,
    },
}


def github_headers(body: bytes, *, secret: str = GITHUB_SECRET, delivery: str | None = None):
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": f"sha256={digest}",
    }


def standard_headers(
    body: bytes, *, message_id: str | None = None, timestamp: int | None = None, key: bytes = b""
) -> dict[str, str]:
    message_id = message_id or f"msg_{uuid.uuid4().hex}"
    timestamp = int(time.time()) if timestamp is None else timestamp
    key = key or base64.b64decode(STANDARD_SECRET.removeprefix("whsec_"))
    signed = f"{message_id}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.digest(key, signed, hashlib.sha256)).decode()
    return {
        "Content-Type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": f"v1,{signature}",
    }


class Operator:
    """The operator's side: sources defined over HTTP with the operator token."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url

    async def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = OPERATOR_TOKEN
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else orjson.dumps(body)
        async with self.http.request(method, self.url + path, data=data, headers=headers) as r:
            return r.status, await r.json()

    async def define(self, definition: dict[str, Any]) -> dict[str, Any]:
        status, body = await self.call("POST", "/v1/sources", definition)
        assert status == 200, body
        assert_valid("source.response", body)
        return body

    async def post_event(self, name: str, body: bytes, headers: dict[str, str]):
        url = f"{self.url}/v1/sources/{name}/events"
        async with self.http.post(url, data=body, headers=headers) as response:
            answer = await response.json()
            if response.status == 200:
                assert_valid("source-event.response", answer)
            else:
                assert_valid("error", answer)
            return response.status, answer

    async def status(self) -> dict[str, Any]:
        async with self.http.get(self.url + "/v1/field/status") as response:
            body = await response.json()
            assert_valid("field-status.response", body)
            return body


@pytest.fixture
def server(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    return server_factory(operator_token=OPERATOR_TOKEN)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def operator(http: aiohttp.ClientSession, server: ThreadedServer) -> Operator:
    return Operator(http, server.url)


@pytest.fixture
async def agent(server: ThreadedServer) -> AsyncIterator[AgentClient]:
    async with FieldClient(server.url) as field:
        yield await field.register("reviewer-01", "code_reviewer", interests=["pull requests"])


async def snapshot(operator: Operator, agent: AgentClient) -> tuple[int, dict[str, int], list[str]]:
    """What would show a stored event: the log's end, the unit counts, ATTUNE's units."""
    status = await operator.status()
    attuned = await agent.attune(max_units=100)
    units = [r["memory_unit"]["id"] for r in attuned["record"]]
    return status["log"]["last_position"], status["counts"]["memory_units"], units


async def test_a_signed_github_event_reaches_a_subscriber_as_a_unit_of_its_source(
    operator: Operator, agent: AgentClient, http: aiohttp.ClientSession
) -> None:
    defined = await operator.define(GITHUB_SOURCE)
    source = defined["source"]
    assert "secret" not in source  # the operator's own secret is never shown back
    assert source["events_url"] == f"{operator.url}/v1/sources/github/events"
    subscribed = await subscribe(agent, ["memory.recorded"])
    async with sse_stream(http, subscribed["sse_url"], agent.token) as stream:
        await stream.ready()
        body = orjson.dumps(PULL_REQUEST)
        status, answer = await operator.post_event("github", body, github_headers(body))
        assert status == 200, answer
        assert answer["status"] == "accepted"
        [event] = await stream.notifications(1)
    notification = event.data
    assert notification["event"] == "memory.recorded"
    assert notification["memory_unit_id"] == answer["memory_unit_id"]
    assert notification["agent_id"] == "source:github"
    attuned = await agent.attune(max_units=10)
    [unit] = [r["memory_unit"] for r in attuned["record"]]
    assert_valid("memory-unit", unit)
    assert unit["id"] == answer["memory_unit_id"]
    assert unit["content"] == (
        "PR #42 Add inbound event sources by octocat in buoyant-systems/agent-mesh"
    )
    assert unit["intent"]["purpose"] == "Follow pull requests of buoyant-systems/agent-mesh"
    assert unit["confidence"]["score"] == 0.9
    assert unit["source"]["agent_id"] == "source:github"
    assert unit["payload"] == PULL_REQUEST
    counts = (await operator.status())["sources"]["github"]
    assert counts == {"scheme": "github", "accepted": 1, "filtered": 0, "refused": 0}
