"""Inbound event sources end to end: a real server, real HTTP clients, signed events.

An event is signed as its sender signs it (GitHub's ``X-Hub-Signature-256``, or
Standard Webhooks), posted to ``/v1/sources/<name>/events``, and followed to a
subscriber's SSE stream; every refusal is checked to have stored nothing (the log's
last position, the unit counts and ATTUNE do not move).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, settings

from field.client import AgentClient, FieldClient, FieldClientError
from field.contract.errors import HTTP_STATUS
from field.server.config import Config

from .conftest import ThreadedServer
from .schema_util import assert_valid
from .test_push import sse_stream, subscribe
from .test_sources_core import definitions

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


async def test_refused_events_store_nothing_and_are_counted(
    operator: Operator, agent: AgentClient
) -> None:
    await operator.define({**GITHUB_SOURCE, "max_payload_bytes": 4096})
    body = orjson.dumps(PULL_REQUEST)
    accepted = github_headers(body)
    status, first = await operator.post_event("github", body, accepted)
    assert status == 200, first
    before = await snapshot(operator, agent)
    assert before[2] == [first["memory_unit_id"]]

    wrong = github_headers(body, secret="not the secret")
    tampered = github_headers(body)
    unsigned = {k: v for k, v in github_headers(body).items() if k != "X-Hub-Signature-256"}
    oversized = orjson.dumps({**PULL_REQUEST, "padding": "x" * 5000})
    cases = [
        (body, wrong, 401, "INVALID_SIGNATURE"),
        (body.replace(b"opened", b"closed"), tampered, 401, "INVALID_SIGNATURE"),
        (body, unsigned, 401, "INVALID_SIGNATURE"),
        (oversized, github_headers(oversized), 413, "PAYLOAD_TOO_LARGE"),
        (b"[1, 2]", github_headers(b"[1, 2]"), 422, "INVALID_PAYLOAD"),
        (b"{nope", github_headers(b"{nope"), 400, "INVALID_JSON"),
        (body, {**github_headers(body), "Content-Type": "text/plain"}, 415, None),
    ]
    for raw, headers, expected, code in cases:
        status, answer = await operator.post_event("github", raw, headers)
        assert status == expected, answer
        assert answer["code"] == (code or "UNSUPPORTED_MEDIA_TYPE")
        assert answer["recoverable"] in (True, False) and answer["suggested_action"]
    # a replay of the same delivery is acknowledged (a sender retries until a 2xx), not stored
    status, answer = await operator.post_event("github", body, accepted)
    assert (status, answer) == (
        200,
        {"status": "duplicate", "delivery_id": accepted["X-GitHub-Delivery"]},
    )
    assert await snapshot(operator, agent) == (before[0], before[1], before[2])
    counts = (await operator.status())["sources"]["github"]
    assert counts == {"scheme": "github", "accepted": 1, "filtered": 0, "refused": len(cases) + 1}


async def test_events_the_filter_does_not_pass_are_counted_and_not_stored(
    operator: Operator, agent: AgentClient
) -> None:
    await operator.define(GITHUB_SOURCE)
    before = await snapshot(operator, agent)
    for payload, event in [
        ({**PULL_REQUEST, "action": "closed"}, "pull_request"),
        (PULL_REQUEST, "issues"),
        ({"zen": "Keep it simple."}, "ping"),
    ]:
        body = orjson.dumps(payload)
        status, answer = await operator.post_event(
            "github", body, {**github_headers(body), "X-GitHub-Event": event}
        )
        assert (status, answer) == (200, {"status": "filtered"})
    assert await snapshot(operator, agent) == before
    counts = (await operator.status())["sources"]["github"]
    assert counts == {"scheme": "github", "accepted": 0, "filtered": 3, "refused": 0}


async def test_standard_webhooks_refuse_replays_stale_and_future_timestamps(
    operator: Operator, agent: AgentClient
) -> None:
    await operator.define(
        {
            "name": "billing",
            "scheme": "standard",
            "secret": STANDARD_SECRET,
            "unit": {
                "type": "finding",
                "content": "Invoice {payload.invoice.id} is {payload.type}",
            },
        }
    )
    body = orjson.dumps({"type": "invoice.paid", "invoice": {"id": "in_1", "total": 1200}})
    headers = standard_headers(body)
    status, answer = await operator.post_event("billing", body, headers)
    assert status == 200, answer
    before = await snapshot(operator, agent)
    now, signed = int(time.time()), int(headers["webhook-timestamp"])
    wrong_key = standard_headers(body, key=b"w" * 32)
    rotated = {**headers, "webhook-signature": f"v1,AAAA {headers['webhook-signature']}"}
    cases = [
        (standard_headers(body, timestamp=now - 301), 401, "STALE_TIMESTAMP"),
        (standard_headers(body, timestamp=now + 301), 401, "STALE_TIMESTAMP"),
        (wrong_key, 401, "INVALID_SIGNATURE"),
        # a timestamp other than the signed one (now - 1 was it when a second began
        # between signing and now: the message itself, a duplicate)
        ({**headers, "webhook-timestamp": str(signed - 1)}, 401, "INVALID_SIGNATURE"),
        ({k: v for k, v in headers.items() if k != "webhook-id"}, 401, "INVALID_SIGNATURE"),
    ]
    for sent, expected, code in cases:
        status, answer = await operator.post_event("billing", body, sent)
        assert (status, answer["code"]) == (expected, code), answer
    # the same message again, also with one of several signatures: acknowledged, not stored
    for sent in (headers, rotated):
        status, answer = await operator.post_event("billing", body, sent)
        assert (status, answer["status"]) == (200, "duplicate"), answer
    assert await snapshot(operator, agent) == before
    [unit] = [r["memory_unit"] for r in (await agent.attune())["record"]]
    assert unit["content"] == "Invoice in_1 is invoice.paid"
    assert unit["intent"]["purpose"] == "Event from source billing"
    assert unit["confidence"]["score"] == 0.5


async def test_a_github_event_sent_again_with_a_new_or_no_delivery_id_stores_nothing(
    operator: Operator, agent: AgentClient
) -> None:
    await operator.define(GITHUB_SOURCE)
    body = orjson.dumps(PULL_REQUEST)
    status, first = await operator.post_event("github", body, github_headers(body))
    assert (status, first["status"]) == (200, "accepted"), first
    before = await snapshot(operator, agent)
    # GitHub signs the body alone: whoever captured it can send it under any delivery id
    for delivery in (str(uuid.uuid4()), "replay-2", None, None):
        headers = github_headers(body, delivery=delivery)
        if delivery is None:
            del headers["X-GitHub-Delivery"]
        status, answer = await operator.post_event("github", body, headers)
        assert (status, answer) == (200, {"status": "duplicate", "delivery_id": delivery})
    assert await snapshot(operator, agent) == before
    assert before[2] == [first["memory_unit_id"]]
    # another event, even without a delivery id, is stored once
    other = orjson.dumps({**PULL_REQUEST, "number": 43})
    unnamed = {k: v for k, v in github_headers(other).items() if k != "X-GitHub-Delivery"}
    answers = [(await operator.post_event("github", other, unnamed))[1] for _ in range(3)]
    assert [a["status"] for a in answers] == ["accepted", "duplicate", "duplicate"]
    counts = (await operator.status())["sources"]["github"]
    assert counts == {"scheme": "github", "accepted": 2, "filtered": 0, "refused": 6}


async def test_accepted_delivery_ids_and_github_bodies_are_refused_after_a_restart(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    settings = {"operator_token": OPERATOR_TOKEN, "data_dir": tmp_path / "data", "sync": "normal"}
    first = server_factory(**settings)
    operator = Operator(http, first.url)
    await operator.define(GITHUB_SOURCE)
    body = orjson.dumps(PULL_REQUEST)
    headers = github_headers(body)
    assert (await operator.post_event("github", body, headers))[0] == 200
    first.stop()
    again = Operator(http, server_factory(**settings).url)
    status, answer = await again.post_event("github", body, headers)
    assert (status, answer["status"]) == (200, "duplicate")
    status, answer = await again.post_event("github", body, github_headers(body))
    assert (status, answer["status"]) == (200, "duplicate")  # the body is remembered too
    other = orjson.dumps({**PULL_REQUEST, "number": 43})
    fresh = github_headers(other)  # the sealed secret opens after the restart
    assert (await again.post_event("github", other, fresh))[0] == 200
    counts = (await again.status())["sources"]["github"]
    assert counts == {"scheme": "github", "accepted": 2, "filtered": 0, "refused": 2}


async def test_only_the_operator_defines_lists_and_removes_sources(
    operator: Operator, agent: AgentClient
) -> None:
    status, answer = await operator.call("POST", "/v1/sources", GITHUB_SOURCE, token=None)
    assert (status, answer["code"]) == (401, "UNAUTHENTICATED")
    status, answer = await operator.call("POST", "/v1/sources", GITHUB_SOURCE, token=agent.token)
    assert (status, answer["code"]) == (403, "INSUFFICIENT_AUTHORITY")
    status, answer = await operator.call("GET", "/v1/sources", token=agent.token)
    assert (status, answer["code"]) == (403, "INSUFFICIENT_AUTHORITY")
    made = await operator.define({**GITHUB_SOURCE, "secret": None, "name": "gh2"})
    secret = made["source"]["secret"]  # made by the Field, shown once
    status, listed = await operator.call("GET", "/v1/sources")
    assert status == 200
    assert_valid("sources.response", listed)
    [shown] = listed["sources"]
    assert "secret" not in shown and shown["counts"] == {"accepted": 0, "filtered": 0, "refused": 0}
    body = orjson.dumps(PULL_REQUEST)
    assert (await operator.post_event("gh2", body, github_headers(body, secret=secret)))[0] == 200
    status, removed = await operator.call("DELETE", "/v1/sources/gh2")
    assert status == 200, removed
    assert_valid("source-remove.response", removed)
    status, answer = await operator.post_event("gh2", body, github_headers(body, secret=secret))
    assert (status, answer["code"]) == (404, "SOURCE_NOT_FOUND")
    status, answer = await operator.call("DELETE", "/v1/sources/gh2")
    assert (status, answer["code"]) == (404, "SOURCE_NOT_FOUND")
    assert (await operator.status())["sources"] == {}


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"name": "Not A Name"}, "INVALID_PAYLOAD"),
        ({"scheme": "svix"}, "INVALID_PAYLOAD"),
        ({"scheme": "standard", "secret": "whsec_short"}, "INVALID_PAYLOAD"),
        ({"filter": "payload.action =="}, "INVALID_FILTER"),
        ({"filter": "event.unit.payload.x == 1"}, "INVALID_FILTER"),
        ({"filter": "payload.ref.matches(payload.pattern)"}, "INVALID_FILTER"),
        ({"unit": {"type": "finding", "content": "{payload.a"}}, "INVALID_PAYLOAD"),
        ({"unit": {"type": "finding", "content": "{agent.token}"}}, "INVALID_PAYLOAD"),
        ({"unit": {"type": "rumour", "content": "x"}}, "INVALID_PAYLOAD"),
        ({"unit": {"type": ["finding"], "content": "x"}}, "INVALID_PAYLOAD"),
        ({"unit": {"type": {"finding": 1}, "content": "x"}}, "INVALID_PAYLOAD"),
        ({"unit": {"type": "finding", "content": "x", "confidence": 2}}, "INVALID_PAYLOAD"),
        (
            {"unit": {"type": "finding", "content": "x", "session_id": "session-0"}},
            "SESSION_NOT_FOUND",
        ),
        ({"max_payload_bytes": 10**9}, "INVALID_PAYLOAD"),
        ({"extra": True}, "INVALID_PAYLOAD"),
    ],
)
async def test_bad_definitions_are_refused_with_the_error_body(
    operator: Operator, change: dict[str, Any], code: str
) -> None:
    status, answer = await operator.call("POST", "/v1/sources", {**GITHUB_SOURCE, **change})
    assert answer["code"] == code, answer
    assert status in (404, 422)
    assert_valid("error", answer)
    assert GITHUB_SECRET not in answer["message"]
    assert (await operator.status())["sources"] == {}


@pytest.fixture(scope="module")
def definitions_server() -> Iterator[ThreadedServer]:
    config = Config(data_dir=None, log_level="critical", operator_token=OPERATOR_TOKEN)
    running = ThreadedServer(config).start()
    yield running
    running.stop()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(body=definitions())
def test_no_definition_is_answered_with_a_5xx(
    definitions_server: ThreadedServer, body: Any
) -> None:
    connection = HTTPConnection("127.0.0.1", definitions_server.port, timeout=30)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {OPERATOR_TOKEN}"}
    try:
        connection.request("POST", "/v1/sources", json.dumps(body).encode(), headers)
        reply = connection.getresponse()
        answer = orjson.loads(reply.read())
    finally:
        connection.close()
    if reply.status == 200:
        assert_valid("source.response", answer)
    else:
        assert 400 <= reply.status < 500, answer
        assert_valid("error", answer)
        assert HTTP_STATUS[answer["code"]] == reply.status, answer


async def test_no_agent_may_register_a_source_id(server: ThreadedServer) -> None:
    async with FieldClient(server.url) as field:
        with pytest.raises(FieldClientError) as refused:
            await field.register("source:github", "impostor")
    assert (refused.value.status, refused.value.code) == (409, "AGENT_ID_TAKEN")


async def test_an_unknown_source_is_404(operator: Operator) -> None:
    body = orjson.dumps(PULL_REQUEST)
    status, answer = await operator.post_event("nobody", body, github_headers(body))
    assert (status, answer["code"]) == (404, "SOURCE_NOT_FOUND")


def field_command(*args: str, token: str | None = OPERATOR_TOKEN) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FIELD_OPERATOR_TOKEN"}
    if token is not None:
        env["FIELD_OPERATOR_TOKEN"] = token
    done = subprocess.run(
        [sys.executable, "-m", "field", *args], capture_output=True, text=True, env=env, timeout=60
    )
    return done.returncode, done.stdout, done.stderr


async def test_the_source_command_adds_lists_and_removes(
    server: ThreadedServer, operator: Operator, tmp_path: Path
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(GITHUB_SECRET + "\n")
    status, out, err = await asyncio.to_thread(
        field_command, "source", "add", "github", "--url", server.url, "--scheme", "github",
        "--secret-file", str(secret_file), "--filter", "payload.action == 'opened'",
        "--content", "PR {payload.pull_request.title}", "--confidence", "0.7",
    )  # fmt: skip
    assert status == 0, err
    assert_valid("source.response", json.loads(out))
    body = orjson.dumps(PULL_REQUEST)
    assert (await operator.post_event("github", body, github_headers(body)))[0] == 200
    status, out, err = await asyncio.to_thread(field_command, "source", "list", "--url", server.url)
    assert status == 0, err
    [listed] = json.loads(out)["sources"]
    assert (listed["name"], listed["counts"]["accepted"]) == ("github", 1)
    status, out, err = await asyncio.to_thread(
        field_command, "source", "remove", "github", "--url", server.url, token="wrong-token-0"
    )
    assert status == 1 and "401 UNAUTHENTICATED" in err
    status, out, err = await asyncio.to_thread(
        field_command, "source", "remove", "github", "--url", server.url
    )
    assert status == 0, err
    assert (await operator.status())["sources"] == {}


async def test_a_senders_credentials_never_reach_filters_or_units(
    operator: Operator, agent: AgentClient
) -> None:
    leaky = {
        **GITHUB_SOURCE,
        "filter": "!('authorization' in headers) && !('cookie' in headers)",
        "unit": {**GITHUB_SOURCE["unit"], "content": "{headers.x-github-event}:{headers.cookie}"},
    }
    await operator.define(leaky)
    body = orjson.dumps(PULL_REQUEST)
    headers = {**github_headers(body), "Authorization": "Bearer s3cr3t", "Cookie": "id=s3cr3t"}
    status, answer = await operator.post_event("github", body, headers)
    assert (status, answer["status"]) == (200, "accepted"), answer
    [unit] = [r["memory_unit"] for r in (await agent.attune())["record"]]
    assert unit["content"].startswith("pull_request:") and "s3cr3t" not in unit["content"]


async def test_a_signed_event_reaches_the_subscriber_whose_filter_and_binding_select_it(
    operator: Operator, server: ThreadedServer, http: aiohttp.ClientSession
) -> None:
    source = {**GITHUB_SOURCE, "unit": {**GITHUB_SOURCE["unit"], "task_id": "task-review"}}
    await operator.define(source)
    wanted = (
        "event.unit.intent.task_id in parameters.task_id"
        " && event.unit.payload.pull_request.user.login == 'octocat'"
        " && event.unit.source.agent_id == 'source:github'"
    )
    async with FieldClient(server.url) as field:
        chosen = await field.register("chosen", "code_reviewer", interests=["pull requests"])
        other_task = await field.register("other", "code_reviewer", interests=["pull requests"])
        other_login = await field.register("third", "code_reviewer", interests=["pull requests"])
        streams = {}
        for agent, task, login in (
            (chosen, "task-review", "octocat"),
            (other_task, "task-elsewhere", "octocat"),
            (other_login, "task-review", "someone-else"),
        ):
            expression = wanted.replace("'octocat'", repr(login))
            streams[agent.id] = await subscribe(
                agent, ["memory.recorded"], filter=expression, bindings={"task_id": [task]}
            )
        async with contextlib.AsyncExitStack() as stack:
            opened = {
                agent.id: await stack.enter_async_context(
                    sse_stream(http, streams[agent.id]["sse_url"], agent.token)
                )
                for agent in (chosen, other_task, other_login)
            }
            for stream in opened.values():
                await stream.ready()
            for number in (42, 43):  # 43 is by another login: a marker of the stream order
                payload = {**PULL_REQUEST, "number": number}
                if number == 43:
                    payload["pull_request"] = {
                        **PULL_REQUEST["pull_request"],
                        "user": {"login": "someone-else"},
                    }
                body = orjson.dumps(payload)
                status, answer = await operator.post_event("github", body, github_headers(body))
                assert (status, answer["status"]) == (200, "accepted"), answer
            [first] = await opened["chosen"].notifications(1)
            assert first.data["memory_unit_id"] != answer["memory_unit_id"]
            # the third agent's filter wants the other login: it gets the marker only, which
            # proves the first event was screened out for it (streams are in cursor order)
            [marker] = await opened["third"].notifications(1)
            assert marker.data["memory_unit_id"] == answer["memory_unit_id"]
        listed = await other_task.send("SUBSCRIBE", {"action": "list"})
        [mine] = listed["subscriptions"]
        assert mine["bindings"] == {"task_id": ["task-elsewhere"]}
        # the agent bound to another task got neither: its allow list never held the task
        async with sse_stream(
            http, streams["other"]["sse_url"], other_task.token, since=streams["other"]["cursor"]
        ) as resumed:
            events = await resumed.until(lambda e: e.event == "live")
            assert [e for e in events if e.id is not None] == []
