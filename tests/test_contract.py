"""The contract read as a client author reads it: where ``protocol/README.md`` settles a
question (a "**Choice**"), the Field does what it says.

Each section is one question: ``requires_action``, liveness and why an agent
failed, where debounce windows lie, the order of a poll's page, and the smaller
choices (superseding twice, the reserved id ``operator``, COMPACT's
``units_remaining``, a session creator that leaves and comes back).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from field.client import FieldClient
from field.contract.clock import epoch_ms, iso_timestamp
from field.contract.errors import FieldError
from field.contract.model import Limits
from field.core import visibility
from field.core.field import Field
from field.engine.liveness import Liveness
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog
from field.subscriptions.events import SUBSCRIPTION_EVENTS, event_of
from field.subscriptions.matcher import Matcher
from field.subscriptions.stream import Notification, encode_event, encode_notification

from .conftest import UNLOADED_POLICY, ThreadedServer
from .core_util import Harness
from .schema_util import assert_valid
from .test_push import millis, open_ws, record, sse_stream, supersede, timestamps
from .test_push import subscribe as subscribe_over_http

README = Path(__file__).resolve().parent.parent / "protocol" / "README.md"
OPERATOR_TOKEN = "operator-token-0123456789"


def section(title: str) -> str:
    """The text of the README section headed ``title`` (up to the next heading)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#)", text, re.S | re.M)
    assert match is not None, title
    return match.group(1)


def subscribe(h: Harness, agent: str, events: list[str], **options: Any) -> str:
    body = {"action": "subscribe", "subscription": {"events": events, **options}}
    return str(h.send("SUBSCRIBE", agent, body)["subscription_id"])


def notifications(h: Harness, since: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """(subscriber, notification) for every notification of the log after ``since``: matched
    as the push hub matches them (visibility, filters) and encoded as it encodes them."""
    state = h.field.state
    events = [e for e in (event_of(x, state.known_units) for x in h.stored()[since:]) if e]
    out = []
    matcher = Matcher(
        state.registry,
        state.index,
        state.known_units,
        audience=functools.partial(visibility.event_audience, state),
        screen=h.field.filters.screen,
    )
    for match in matcher.match(events):
        shared = encode_event(match.event, f"{h.field.field_tag}-{match.event.position}")
        for i, row in enumerate(match.rows.tolist()):
            subscription_id = state.registry.ids[row]
            notification = Notification(
                subscription_id,
                match.event,
                float(match.relevance[i]),
                match.reason(i),
                bool(match.requires_action[i]),
                shared=shared,
            )
            body = orjson.loads(encode_notification(notification))
            assert_valid("notification", body)
            out.append((state.subscriptions[subscription_id]["agent_id"], body))
    return out


# -- requires_action: one definition, one table ---------------------------------------


def test_the_requires_action_table_lists_every_event() -> None:
    text = section("Relevance of events")
    table = text[text.index("| Event | Relevance 1 for | `requires_action` for |") :]
    listed = re.findall(r"`([a-z]+\.[a-z_]+)`", "\n".join(table.split("\n\n")[0].splitlines()))
    named = [n for n in listed if n in SUBSCRIPTION_EVENTS]
    assert sorted(set(named)) == sorted(SUBSCRIPTION_EVENTS)


def test_requires_action_is_set_exactly_as_the_table_says() -> None:
    """Every one of the 13 events is produced with every agent subscribed to all of them;
    the agents told to act are those of the table's last column, and only they."""
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.register("lead", "lead", via=OPERATOR_TOKEN, authority=6)
    for agent in ("worker", "other", "watcher"):
        h.register(agent, "analyst", interests=["churn"])
    for agent in ("lead", "worker", "other", "watcher"):
        subscribe(h, agent, list(SUBSCRIPTION_EVENTS))
    since = len(h.entries)
    # a conflict over the worker's unit, resolved against it
    mine = h.record("worker", "churn is rising")["memory_unit_id"]
    theirs = h.record(
        "other", "churn is flat", relations=[{"type": "contradicts", "target_id": mine}]
    )
    (conflict_id,) = theirs["conflicts_detected"]
    h.send(
        "MERGE",
        "lead",
        {
            "conflict_id": conflict_id,
            "strategy": "authority",
            "resolution": {"winner_id": theirs["memory_unit_id"], "rationale": "newer data"},
        },
    )

    # tasks: assigned, completed with a dependent now ready, handed off
    def coordinate(agent: str, **payload: Any) -> dict[str, Any]:
        return dict(h.send("COORDINATE", agent, payload)["task"])

    first = coordinate("lead", action="create", title="collect churn data", assignee="worker")
    coordinate("lead", action="create", title="model churn", assignee="other",
               depends_on=[first["id"]])  # fmt: skip
    coordinate("worker", action="start", task_id=first["id"])
    coordinate("worker", action="complete", task_id=first["id"])
    third = coordinate("lead", action="create", title="report churn", assignee="worker")
    h.send("HANDOFF", "worker", {"task_id": third["id"], "to_agent_id": "other"})
    # a session paused and ended
    created = h.send(
        "SESSION", "lead", {"action": "create", "name": "churn", "invitees": ["watcher"]}
    )
    session_id = created["session"]["id"]
    h.send("SESSION", "watcher", {"action": "join", "session_id": session_id})
    h.send("SESSION", "lead", {"action": "pause", "session_id": session_id})
    h.send("SESSION", "lead", {"action": "end", "session_id": session_id})
    # a newcomer, and the worker failing with a task the lead created
    h.register("late", "analyst")
    coordinate("lead", action="create", title="recheck churn", assignee="worker")
    h.entries.extend(h.field.fail_agent("worker", "silent").entries)

    got = notifications(h, since)
    assert {body["event"] for _, body in got} == set(SUBSCRIPTION_EVENTS)
    acting: dict[str, set[str]] = {name: set() for name in SUBSCRIPTION_EVENTS}
    for agent, body in got:
        if body["requires_action"]:
            acting[body["event"]].add(agent)
            assert body["relevance_score"] == 1.0, body
            assert "it needs your action" in body["relevance_reason"] or (
                "it involves your unit" in body["relevance_reason"]
            )
    assert acting == {
        "memory.recorded": set(),
        "memory.superseded": set(),  # the worker's unit: told, not asked to act
        "memory.contested": {"worker"},
        "conflict.detected": {"worker"},  # the other author caused it
        "conflict.resolved": set(),
        "agent.joined": set(),
        "agent.failed": {"lead"},  # it created the failed agent's open task
        "task.state_changed": set(),
        "task.assigned": {"worker", "other"},
        "task.completed": {"other"},  # its dependent task is ready
        "handoff.incoming": {"other"},
        "session.paused": set(),
        "session.ended": set(),
    }


# -- liveness: one rule, and why an agent failed ---------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def service() -> AsyncIterator[FieldService]:
    service = FieldService(MemoryEventLog(), Field, admission=UNLOADED_POLICY)
    await service.start()
    envelope = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "msg-1",
        "operation": "REGISTER",
        "agent_id": "alice",
        "session_id": None,
        "epoch": 0,
        "payload": {"id": "alice", "role": "analyst"},
    }
    await service.execute(lambda field: field.handle(envelope, token=None))
    yield service
    await service.stop()


async def test_an_agent_heard_from_within_the_heartbeat_timeout_is_not_failed(
    service: FieldService,
) -> None:
    """Requests sent while a connection was open keep the agent live after it closes."""
    clock = Clock()
    liveness = Liveness(service, failure_grace=30, heartbeat_timeout=300, clock=clock)
    liveness.connected("alice")
    clock.now += 600
    liveness.seen("alice")  # a request over the socket, or beside it
    clock.now += 5
    liveness.disconnected("alice")
    clock.now += 31  # the grace is over, but alice was heard from 36 s ago
    assert liveness.due() == []
    clock.now += 300 - 36 - 1
    assert liveness.due() == []
    clock.now += 1
    assert liveness.due() == [
        ("alice", "not heard from for 300 s (heartbeat_timeout 300 s) and no push connection open")
    ]


async def test_a_closed_connection_gives_at_least_the_grace_period(
    service: FieldService,
) -> None:
    """An agent that only listened (heard from when it connected, long ago) gets
    ``failure_grace`` once its connection closes, and the reason says so."""
    clock = Clock()
    liveness = Liveness(service, failure_grace=30, heartbeat_timeout=300, clock=clock)
    liveness.connected("alice")
    clock.now += 1000
    liveness.disconnected("alice")
    clock.now += 29
    assert liveness.due() == []
    clock.now += 1
    assert liveness.due() == [
        (
            "alice",
            "no request in the 30 s since its last push connection closed (failure_grace 30 s)",
        )
    ]
    # a request after the close: live for heartbeat_timeout from it, whatever the grace
    liveness.seen("alice")
    clock.now += 299
    assert liveness.due() == []
    clock.now += 1
    assert [agent for agent, _ in liveness.due()] == ["alice"]


async def test_without_a_heartbeat_timeout_only_a_closed_connection_fails_an_agent(
    service: FieldService,
) -> None:
    clock = Clock()
    liveness = Liveness(service, failure_grace=30, heartbeat_timeout=0, clock=clock)
    clock.now += 10**6
    assert liveness.due() == []  # silent, never connected
    liveness.connected("alice")
    liveness.seen("alice")
    liveness.disconnected("alice")
    clock.now += 30
    assert [agent for agent, _ in liveness.due()] == ["alice"]


async def test_a_request_just_before_the_close_outlasts_the_grace_end_to_end(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    """The grace (0.2 s) ends long before the heartbeat timeout (1.5 s) counted from the
    agent's last request: it fails only then, and says why."""
    server = server_factory(failure_grace=0.2, heartbeat_timeout=1.5)
    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        watcher = await field.register("watcher", "lead")
        flaky = await field.register("flaky", "analyst")
        response = await subscribe_over_http(watcher, ["agent.failed"])
        async with sse_stream(http, response["sse_url"], watcher.token) as sse:
            await sse.ready()
            async with open_ws(server, flaky.token) as ws:
                sent = time.monotonic()  # the Field hears the request after this
                await ws.request("SUBSCRIBE", "flaky", {"action": "list"})
            (event,) = await sse.notifications(1)
            failed_after = time.monotonic() - sent
        assert event.event == "agent.failed"
        assert failed_after >= 1.5, failed_after  # not at the end of the grace
        reason = event.data["detail"]["reason"]
        assert reason.startswith("not heard from for "), reason
        assert reason.endswith("(heartbeat_timeout 1.5 s) and no push connection open")


#: Seconds a request of the restart test may take: only ever reached when something hangs
#: (a run of the suite once waited in it for minutes; the traceback will name the request).
HANG_GUARD = 30.0


async def test_why_an_agent_failed_is_told_and_survives_a_restart(
    server_factory: Callable[..., ThreadedServer], tmp_path: Path
) -> None:
    settings = {"data_dir": tmp_path / "data", "sync": "normal", "failure_grace": 0.2}
    server = server_factory(**settings, heartbeat_timeout=0)
    async with (
        FieldClient(server.url, timeout=HANG_GUARD) as field,
        aiohttp.ClientSession() as http,
    ):
        watcher = await field.register("watcher", "lead")
        flaky = await field.register("flaky", "analyst")
        response = await subscribe_over_http(watcher, ["agent.failed"])
        async with sse_stream(http, response["sse_url"], watcher.token) as sse:
            await sse.ready()
            async with open_ws(server, flaky.token) as ws:
                created = await ws.request(
                    "COORDINATE", "flaky", {"action": "create", "title": "t", "assignee": "flaky"}
                )
            (event,) = await sse.notifications(1)
    data: dict[str, Any] = event.data
    assert_valid("notification", data)
    detail = data["detail"]
    reason = detail["reason"]
    assert re.fullmatch(
        r"no request in the [0-9.]+ s since its last push connection closed "
        r"\(failure_grace 0\.2 s\)",
        reason,
    ), reason
    assert detail["agent"]["id"] == "flaky"
    assert (detail["agent"]["status"], detail["agent"]["failure_reason"]) == ("failed", reason)
    task_id = created["body"]["task"]["id"]
    assert detail["released_tasks"] == [{"task_id": task_id, "created_by": "flaky"}]
    assert reason in data["summary"]

    def listed(page: dict[str, Any]) -> dict[str, Any]:
        assert_valid("agents.response", page)
        (agent,) = page["agents"]
        return dict(agent)

    async with FieldClient(server.url, timeout=HANG_GUARD) as field:
        agent = listed(await field.agent("watcher", watcher.token).get("/v1/agents", id="flaky"))
    assert (agent["status"], agent["failure_reason"]) == ("failed", reason)
    server.stop()
    server = server_factory(**settings, heartbeat_timeout=0)
    async with FieldClient(server.url, timeout=HANG_GUARD) as field:
        again = field.agent("watcher", watcher.token)
        assert listed(await again.get("/v1/agents", id="flaky")) == agent
        back = field.agent("flaky", flaky.token, role="analyst")
        await back.get("/v1/agents")  # a GET reads, writes nothing: not heard from
        assert listed(await again.get("/v1/agents", id="flaky")) == agent
        await back.send("SUBSCRIBE", {"action": "list"})  # an operation: recovered
        agent = listed(await again.get("/v1/agents", id="flaky"))
    assert agent["status"] == "idle" and "failure_reason" not in agent


# -- debounce: every debounced notification names its window --------------------------


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_a_windows_millisecond_is_the_one_the_timestamp_shows(ts: float) -> None:
    """Windows are cut on the milliseconds a unit's ``source.timestamp`` shows."""
    shown = iso_timestamp(ts)
    assert epoch_ms(ts) == millis(shown)


async def test_debounced_notifications_name_their_window_live_and_replayed(
    field_server: ThreadedServer,
) -> None:
    window_ms = 300
    async with FieldClient(field_server.url) as field:
        writer = await field.register("writer", "analyst", interests=["churn"])
        reader = await field.register("reader", "analyst", interests=["churn"])
        debounced = await subscribe_over_http(reader, ["memory.recorded"], debounce_ms=window_ms)
        direct = await subscribe_over_http(reader, ["memory.recorded"])
        slow, fast = debounced["subscription_id"], direct["subscription_id"]
        received: dict[str, list[dict[str, Any]]] = {slow: [], fast: []}
        async with open_ws(field_server, reader.token) as ws:
            await ws.ready(2)
            for n in range(3):
                await record(writer, f"churn finding {n}")
            while len(received[slow]) < 3 or len(received[fast]) < 3:
                (data,) = await ws.notifications(1)
                received[data["subscription_id"]].append(data)
                if data["subscription_id"] == slow:  # delivered once its window ended
                    assert time.time() * 1000 >= millis(data["window"]["end"]), data
        when = await timestamps(reader)
        for data in received[slow]:
            start, end = millis(data["window"]["start"]), millis(data["window"]["end"])
            assert start % window_ms == 0 and end - start == window_ms, data["window"]
            assert start <= when[data["memory_unit_id"]] < end
        assert all("window" not in data for data in received[fast])
        # a stream resumed from the subscription's start replays the same notifications
        async with open_ws(
            field_server, reader.token, since=[f"{slow}@{debounced['cursor']}"]
        ) as ws:
            frames = await ws.ready(2)
            replayed = [f["data"] for f in frames if f["type"] == "notification"]
            replayed += await ws.notifications(3 - len(replayed))  # a window still open
        assert replayed == received[slow]


# -- polling: a page is the oldest new units, listed by relevance -----------------------


async def test_polling_pages_hold_the_oldest_units_in_relevance_order(
    field_server: ThreadedServer,
) -> None:
    async with FieldClient(field_server.url) as field:
        writer = await field.register("writer", "analyst")
        reader = await field.register("reader", "strategist", interests=["churn"])
        epochs: list[int] = []
        for n in range(11):  # every third unit speaks of the reader's interest
            content = f"churn rose {n}%" if n % 3 == 2 else f"office plants need water {n}"
            epochs.append((await record(writer, content))["epoch"])
        since, pages = 0, []
        while True:
            page = await reader.attune(max_units=3, since_epoch=since)
            assert_valid("attune.response", page)
            pages.append(page)
            got = [item["memory_unit"]["epoch"] for item in page["record"]]
            remaining = [e for e in epochs if e > since]
            assert sorted(got) == remaining[:3]  # the oldest new units, none skipped
            scores = [item["relevance_score"] for item in page["record"]]
            assert scores == sorted(scores, reverse=True)  # listed by relevance
            budget = page["context_budget"]
            assert budget["units_available"] == len(remaining)
            if len(remaining) <= 3:
                assert budget["limited_by"] is None
                break
            assert budget["limited_by"] == "max_units"
            assert page["epoch"] == max(got)  # the next poll continues after the newest
            since = page["epoch"]
        seen = [item["memory_unit"]["epoch"] for page in pages for item in page["record"]]
        assert sorted(seen) == epochs and len(set(seen)) == len(seen)
        # the order promised is relevance, not epoch: some page lists a newer unit first
        assert any(
            [item["memory_unit"]["epoch"] for item in page["record"]]
            != sorted(item["memory_unit"]["epoch"] for item in page["record"])
            for page in pages
        )
        assert pages[-1]["epoch"] == epochs[-1]  # the last page: the newest unit


# -- the smaller choices -----------------------------------------------------------------


async def test_every_supersession_of_a_unit_is_announced(field_server: ThreadedServer) -> None:
    """Superseding an already superseded unit announces it again (its author learns of the
    second replacement), and the unit stays superseded."""
    async with FieldClient(field_server.url) as field:
        author = await field.register("author", "analyst", interests=["churn"])
        first = await field.register("first", "analyst")
        second = await field.register("second", "analyst")
        await subscribe_over_http(author, ["memory.recorded", "memory.superseded"])
        async with open_ws(field_server, author.token) as ws:
            await ws.ready()
            old = (await record(author, "churn is 3%"))["memory_unit_id"]
            newer = (await supersede(first, old, "churn is 4%"))["memory_unit_id"]
            newest = (await supersede(second, old, "churn is 5%"))["memory_unit_id"]
            got = await ws.notifications(4)
        assert [(n["event"], n["memory_unit_id"], n["agent_id"]) for n in got] == [
            ("memory.recorded", newer, "first"),
            ("memory.superseded", old, "first"),
            ("memory.recorded", newest, "second"),
            ("memory.superseded", old, "second"),  # again: a second replacement
        ]
        assert newer in got[1]["summary"] and newest in got[3]["summary"]
        history = await author.send(
            "REPLAY", {"target_type": "memory_unit", "target_id": old, "depth": "detailed"}
        )
        kinds = [event["event_type"] for event in history["timeline"]]
        assert kinds.count("memory.superseded") == 2
        status = await author.get("/v1/field/status")
        assert status["counts"]["memory_units"]["superseded"] == 1


@pytest.mark.parametrize("agent_id", ["operator", "source:github"])
async def test_registering_a_reserved_id_is_agent_id_taken(
    server_factory: Callable[..., ThreadedServer], agent_id: str
) -> None:
    server = server_factory(operator_token=OPERATOR_TOKEN)
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": f"Bearer {OPERATOR_TOKEN}"}):
            envelope = {
                "protocol": "akashik",
                "version": "0.1.0",
                "id": "msg-1",
                "operation": "REGISTER",
                "agent_id": agent_id,
                "session_id": None,
                "epoch": 0,
                "payload": {"id": agent_id, "role": "analyst"},
            }
            async with http.post(
                f"{server.url}/v1/register", json=envelope, headers=headers
            ) as response:
                body = await response.json()
            assert response.status == 409, body
            assert_valid("error", body)
            assert body["code"] == "AGENT_ID_TAKEN" and body["recoverable"] is True
            assert body["details"] == {"agent_id": agent_id, "reserved": True}
            assert "reserved" in body["message"]
        async with http.get(f"{server.url}/v1/field/status") as response:
            assert (await response.json())["counts"]["agents"] == 0


def test_units_remaining_counts_only_what_another_compact_would_change() -> None:
    """A loop that repeats COMPACT while ``units_remaining`` is above 0 ends; what it
    leaves alone is counted in ``units_skipped``."""
    h = Harness(operator_token=OPERATOR_TOKEN, limits=Limits(max_compact_units=2))
    h.register("senior", "lead", via=OPERATOR_TOKEN, authority=6)
    h.register("boss", "director", via=OPERATOR_TOKEN, authority=8)
    h.register("worker", "analyst")
    plain = [h.record("worker", f"churn note {n}")["memory_unit_id"] for n in range(5)]
    h.record("worker", "churn is flat", relations=[{"type": "contradicts", "target_id": plain[0]}])
    h.record("boss", "churn directive")  # recorded at 8: above the senior's 6
    request = {"strategy": "archive", "filter": {"types": ["finding"]}}
    answers = []
    while True:
        answer = h.send("COMPACT", "senior", request)
        assert_valid("compact.response", answer)
        answers.append(answer)
        if answer["units_remaining"] == 0:
            break
        assert len(answers) < 10, answers
    # 5 plain units, one of them and the contradicting unit in the conflict: 4 to archive
    assert [a["units_affected"] for a in answers] == [2, 2]
    assert [a["units_remaining"] for a in answers] == [2, 0]
    skipped = {"in_conflict": 2, "authority": 1}
    assert [a["units_skipped"] for a in answers] == [skipped, skipped]
    statuses = {u["id"]: u["status"] for u in h.field.state.units.values()}
    assert [statuses[u] for u in plain] == ["contested"] + ["archived"] * 4


def test_a_session_creator_regains_its_authority_when_it_rejoins() -> None:
    h = Harness()
    h.register("creator", "lead")
    h.register("member", "analyst")

    def session(agent: str, action: str, **payload: Any) -> dict[str, Any]:
        response = h.send("SESSION", agent, {"action": action, **payload})
        assert_valid("session.response", response)
        return dict(response["session"])

    def refused(agent: str, action: str, code: str, **payload: Any) -> None:
        with pytest.raises(FieldError) as caught:
            h.send("SESSION", agent, {"action": action, **payload})
        assert caught.value.code == code, caught.value.message

    sid = session("creator", "create", name="churn", invitees=["member"])["id"]
    session("member", "join", session_id=sid)
    session("creator", "leave", session_id=sid)
    # out of the session, its creator acts at its own level (4): no moderating
    refused("creator", "pause", "INSUFFICIENT_AUTHORITY", session_id=sid)
    refused("creator", "invite", "INSUFFICIENT_AUTHORITY", session_id=sid, invitees=["late"])
    # it may come back without an invitation, and acts at 8 there again
    assert session("creator", "join", session_id=sid)["members"] == ["creator", "member"]
    assert session("creator", "pause", session_id=sid)["status"] == "paused"
    assert session("creator", "end", session_id=sid)["status"] == "ended"
