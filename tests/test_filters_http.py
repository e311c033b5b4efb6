"""Subscription filters over HTTP, on a real server: every INVALID_FILTER case, and a
filtered stream live and resumed from a cursor (SSE) delivering the same notifications."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from field.client import FieldClient

from .conftest import ThreadedServer
from .schema_util import assert_valid
from .test_push import Agents, listed, record, refused, sse_stream, subscribe


@pytest.fixture
async def agents(field_server: ThreadedServer) -> Any:
    """A writes, B subscribes, C is a bystander."""
    async with FieldClient(field_server.url) as client:
        a = await client.register("agent-a", "analyst", interests=["market sizing"])
        b = await client.register("agent-b", "researcher", interests=["market sizing"])
        c = await client.register("agent-c", "auditor")
        yield Agents(a, b, c)


NESTED = "[1].all(x, [2].exists(y, [3].exists(z, z > y)))"
FIVE = " && ".join(f"[1].all({v}, {v} > 0)" for v in "abcde")
COSTLY = "parameters.task_id.all(k, size(" + " + ".join(["k"] * 40) + ") > 0)"
#: comprehensions hidden from a text scan by comments: three deep, over allow lists
HIDDEN = (
    "parameters.task_id.//x\nall(k, parameters.unit_id.//y\n"
    'all(j, parameters.session_id.//"""\nexists(i, k + j + i == "")))'
)


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        pytest.param('event.name ==\n  "a" &&', {"line": 2, "column": 9}, id="syntax"),
        pytest.param("agent.id == 'a'", {"unknown_variables": ["agent"]}, id="unknown-variable"),
        pytest.param("'x' in parameters.repo", {"unknown_parameters": ["repo"]}, id="unknown-list"),
        pytest.param("x" * 2049, {"max_chars": 2048}, id="too-long"),
        pytest.param("", {}, id="empty"),
        pytest.param("   ", {}, id="blank"),
        pytest.param(42, {}, id="not-a-string"),
        pytest.param(NESTED, {}, id="nested-comprehension"),
        pytest.param(FIVE, {}, id="five-comprehensions"),
        pytest.param(COSTLY, {"max_cost": 50_000}, id="costly"),
        pytest.param(HIDDEN, {}, id="hidden-by-comments"),
        pytest.param("[1].all(event, event > 0)", {"variable": "event"}, id="shadowing"),
        pytest.param('event.epoch + "x" == 1', {}, id="type-error"),
        pytest.param("event.summary.matches(event.actor)", {"offset": 22}, id="pattern-variable"),
        pytest.param('event.summary.matches("(a")', {"offset": 22}, id="pattern-invalid"),
        pytest.param('event.summary.matches("a[ab]{200}c")', {"max_width": 128}, id="wide"),
    ],
)
async def test_every_invalid_filter_is_refused_with_422_and_stores_nothing(
    agents: Agents, text: Any, detail: dict[str, Any]
) -> None:
    payload = {
        "action": "subscribe",
        "subscription": {"events": ["memory.recorded"], "filter": text},
    }
    error = await refused(agents.b.send("SUBSCRIBE", payload), 422, "INVALID_FILTER")
    assert error.body["recoverable"] is True
    assert error.body["suggested_action"]
    assert error.body["operation"] == "SUBSCRIBE"
    details = error.body.get("details") or {}
    for name, value in detail.items():
        assert details[name] == value, details
    if "line" in detail:
        assert "line 2, column 9" in error.body["message"]
    assert await listed(agents.b) == []


async def test_bindings_are_validated(agents: Agents) -> None:
    bad = [
        {"repo": ["a"]},
        {"task_id": "t"},
        {"task_id": [""]},
        {"task_id": ["t"] * 101},
        {"task_id": [3]},
        ["task_id"],
    ]
    for bindings in bad:
        payload = {
            "action": "subscribe",
            "subscription": {"events": ["memory.recorded"], "bindings": bindings},
        }
        await refused(agents.b.send("SUBSCRIBE", payload), 422, "INVALID_PAYLOAD")
    assert await listed(agents.b) == []


async def test_a_filtered_stream_live_and_resumed_delivers_the_same(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents
) -> None:
    text = 'event.unit.type == "decision" || event.unit.intent.task_id in parameters.task_id'
    response = await subscribe(
        agents.b, ["memory.recorded", "task.assigned"], filter=text, bindings={"task_id": ["t-9"]}
    )
    assert response["subscription"]["filter"] == {
        "expression": text,
        "errors": 0,
        "last_error": None,
    }
    assert response["subscription"]["bindings"] == {"task_id": ["t-9"]}
    sse_url, start = response["sse_url"], response["cursor"]
    async with sse_stream(http, sse_url, agents.b.token) as sse:
        await sse.ready()
        await record(agents.a, "market sizing finding, not for b")  # filtered out
        wanted = [await record(agents.a, "a pricing decision", memory_type="decision")]
        await record(agents.b, "b's own note on t-1", task_id="t-1")  # sealed: no t-1
        await record(agents.a, "on t-1", task_id="t-1")  # filtered out
        wanted.append(await record(agents.a, "on t-9", task_id="t-9"))
        live = await sse.notifications(2)
    assert [n.data["memory_unit_id"] for n in live] == [w["memory_unit_id"] for w in wanted]
    for notification in live:
        assert_valid("notification", notification.data)
    async with sse_stream(http, sse_url, agents.b.token, since=start) as sse:
        replayed = [e for e in await sse.ready() if e.id is not None]
        marker = await record(agents.a, "a closing decision", memory_type="decision")
        (after,) = await sse.notifications(1)
    assert [(n.id, n.data) for n in replayed] == [(n.id, n.data) for n in live]
    assert after.data["memory_unit_id"] == marker["memory_unit_id"]


async def test_a_matches_filter_delivers_the_units_its_pattern_finds(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents
) -> None:
    # a unit's content is up to 65536 characters: its worst search with a pattern this wide
    # costs more than a filter may (field.expressions.costs); a summary's 4096 do not
    text = r'event.summary.matches(r"(?i)\bsev[12]\b|\boutage\b")'
    response = await subscribe(agents.b, ["memory.recorded"], filter=text)
    async with sse_stream(http, response["sse_url"], agents.b.token) as sse:
        await sse.ready()
        await record(agents.a, "sev3: a typo on the pricing page")  # filtered out
        wanted = [await record(agents.a, "SEV1 declared for checkout")]
        await record(agents.a, "the outages dashboard moved")  # no whole word: filtered out
        wanted.append(await record(agents.a, "an outage of the EU region"))
        live = await sse.notifications(2)
    assert [n.data["memory_unit_id"] for n in live] == [w["memory_unit_id"] for w in wanted]
    (shown,) = await listed(agents.b)
    assert shown["filter"] == {"expression": text, "errors": 0, "last_error": None}


async def test_evaluation_errors_show_in_list_and_never_break_the_stream(
    field_server: ThreadedServer, http: aiohttp.ClientSession, agents: Agents
) -> None:
    text = 'event.unit.confidence.score > 0.5 && event.unit.intent.task_id.startsWith("t")'
    response = await subscribe(agents.b, ["memory.recorded"], filter=text)
    async with sse_stream(http, response["sse_url"], agents.b.token) as sse:
        await sse.ready()
        await record(agents.a, "no task: null.startsWith fails")  # an evaluation error
        wanted = await record(agents.a, "on a task", task_id="t-1")
        (notification,) = await sse.notifications(1)
    assert notification.data["memory_unit_id"] == wanted["memory_unit_id"]
    (shown,) = await listed(agents.b)
    assert shown["filter"]["errors"] == 1
    assert shown["filter"]["last_error"]


async def test_filters_survive_a_restart_compiled_again_from_the_log(
    server_factory: Any, http: aiohttp.ClientSession, tmp_path: Any
) -> None:
    settings = {"data_dir": tmp_path / "data", "sync": "normal"}
    text = 'event.unit.type == "decision"'
    first = server_factory(**settings)
    async with FieldClient(first.url) as client:
        a = await client.register("agent-a", "analyst")
        b = await client.register("agent-b", "analyst")
        response = await subscribe(b, ["memory.recorded"], filter=text)
        await record(a, "a finding")
        decided = await record(a, "a decision", memory_type="decision")
    first.stop()
    second = server_factory(**settings)
    async with FieldClient(second.url) as client:
        a = client.agent("agent-a", a.token)
        url = f"{second.url}/v1/subscriptions/{response['subscription_id']}/events"
        async with sse_stream(http, url, b.token, since=response["cursor"]) as sse:
            got = [e for e in await sse.ready() if e.id is not None]
            later = await record(a, "a later decision", memory_type="decision")
            got += await sse.notifications(1)
    assert [n.data["memory_unit_id"] for n in got] == [
        decided["memory_unit_id"],
        later["memory_unit_id"],
    ]
