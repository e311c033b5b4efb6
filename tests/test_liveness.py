"""Liveness: agents that go silent become ``failed`` (``agent.failed``) and recover.

The core tests drive :meth:`Field.fail_agent` directly; the monitor tests
run :class:`Liveness` with a hand-moved clock over a real service; the
end-to-end tests run a real server with a short grace period and wait
for the ``agent.failed`` notification itself (never for time to pass).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from field.client import FieldClient
from field.contract.errors import FieldError
from field.core.context import Outcome
from field.core.field import Field
from field.engine.liveness import Liveness
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog
from field.subscriptions.events import event_of

from .conftest import ThreadedServer
from .core_util import Harness
from .schema_util import assert_valid
from .test_push import open_ws, sse_stream, subscribe


def kinds(h: Harness) -> list[str]:
    return [e.kind for e in h.entries]


# -- the core ----------------------------------------------------------------------


def test_fail_agent_marks_it_failed_durably() -> None:
    h = Harness()
    h.register("alice", "analyst")
    outcome = h.field.fail_agent("alice", "not heard from for 300 s")
    h.entries.extend(outcome.entries)
    assert [e.kind for e in outcome.entries] == ["agent.failed"]
    data = outcome.entries[0].data
    assert data["reason"] == "not heard from for 300 s"
    assert data["agent"]["id"] == "alice" and data["agent"]["role"] == "analyst"
    assert outcome.entries[0].epoch == h.field.epoch
    (agent,) = h.field.list_agents()
    assert (agent["status"], agent["failure_reason"]) == ("failed", "not heard from for 300 s")
    assert h.replayed().state.agents["alice"].to_wire() == agent


def test_fail_agent_is_a_no_op_for_failed_or_unknown_agents() -> None:
    h = Harness()
    h.register("alice")
    assert h.field.fail_agent("alice", "silent").entries
    epoch = h.field.epoch
    assert h.field.fail_agent("alice", "silent again").entries == []
    assert h.field.fail_agent("nobody", "silent").entries == []
    assert h.field.epoch == epoch


def test_a_failed_agent_that_sends_anything_recovers() -> None:
    h = Harness()
    h.register("alice")
    h.register("bob")
    h.entries.extend(h.field.fail_agent("alice", "silent").entries)
    h.attune("alice")
    assert kinds(h)[-1] == "agent.recovered"
    assert h.field.state.agents["alice"].status == "idle"
    assert h.replayed().state.agents["alice"].status == "idle"
    # a live agent's reads write nothing
    count = len(h.entries)
    h.attune("bob")
    assert len(h.entries) == count


def test_recover_agent_only_recovers_failed_agents() -> None:
    h = Harness()
    h.register("alice")
    assert h.field.recover_agent("alice").entries == []
    h.entries.extend(h.field.fail_agent("alice", "silent").entries)
    assert [e.kind for e in h.field.recover_agent("alice").entries] == ["agent.recovered"]


# -- the monitor, with a clock moved by hand -----------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def service() -> AsyncIterator[FieldService]:
    service = FieldService(MemoryEventLog(), Field)
    await service.start()
    for agent_id in ("alice", "bob"):
        envelope = {
            "protocol": "akashik",
            "version": "0.1.0",
            "id": f"msg-{agent_id}",
            "operation": "REGISTER",
            "agent_id": agent_id,
            "session_id": None,
            "epoch": 0,
            "payload": {"id": agent_id, "role": "analyst"},
        }
        await service.execute(lambda field, e=envelope: field.handle(e, token=None))
    yield service
    await service.stop()


async def test_silence_past_the_heartbeat_timeout_is_due(service: FieldService) -> None:
    clock = Clock()
    liveness = Liveness(service, failure_grace=30, heartbeat_timeout=300, clock=clock)
    assert liveness.due() == []
    clock.now += 200
    liveness.seen("bob")
    clock.now += 100
    assert liveness.due() == [
        ("alice", "not heard from for 300 s (heartbeat_timeout 300 s) and no push connection open")
    ]
    clock.now += 200
    assert [a for a, _ in liveness.due()] == ["alice", "bob"]


async def test_a_dropped_connection_has_the_grace_period_to_come_back(
    service: FieldService,
) -> None:
    clock = Clock()
    liveness = Liveness(service, failure_grace=30, heartbeat_timeout=0, clock=clock)
    liveness.connected("alice")
    liveness.connected("alice")
    liveness.disconnected("alice")
    clock.now += 100
    assert liveness.due() == []  # one connection is still open
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
    liveness.connected("alice")  # back in time: nothing is due
    assert liveness.due() == []
    liveness.disconnected("alice")
    clock.now += 10
    liveness.seen("alice")  # a request counts as coming back too
    clock.now += 10**6  # and with heartbeat_timeout 0, silence alone fails no one
    assert liveness.due() == []


async def test_heartbeat_timeout_zero_never_fails_silent_agents(service: FieldService) -> None:
    clock = Clock()
    liveness = Liveness(service, failure_grace=30, heartbeat_timeout=0, clock=clock)
    clock.now += 10**6
    assert liveness.due() == []


# -- end to end ----------------------------------------------------------------------


@pytest.fixture
async def quick(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    return server_factory(failure_grace=0.2, heartbeat_timeout=0)


async def test_an_agent_whose_socket_drops_fails_and_subscribers_hear_it(
    quick: ThreadedServer,
) -> None:
    async with FieldClient(quick.url) as field, aiohttp.ClientSession() as http:
        watcher = await field.register("watcher", "lead", interests=["pricing"])
        flaky = await field.register("flaky", "analyst", interests=["pricing"])
        response = await subscribe(watcher, ["agent.failed"])
        async with sse_stream(http, response["sse_url"], watcher.token) as sse:
            await sse.ready()
            async with open_ws(quick, flaky.token) as ws:
                await ws.request("SUBSCRIBE", "flaky", {"action": "list"})
            (event,) = await sse.notifications(1)
        data: dict[str, Any] = event.data
        assert_valid("notification", data)
        assert event.event == "agent.failed"
        assert data["entity"] == {"type": "agent", "id": "flaky"}
        assert data["agent_id"] == "flaky"
        assert "since its last push connection closed" in data["summary"]
        assert data["relevance_score"] > 0  # shared interest
        listed = {a["id"]: a["status"] for a in (await watcher.get("/v1/agents"))["agents"]}
        assert listed == {"watcher": "idle", "flaky": "failed"}
        # heard from again: recovered
        await flaky.attune()
        listed = {a["id"]: a["status"] for a in (await watcher.get("/v1/agents"))["agents"]}
        assert listed["flaky"] == "idle"
        # the watcher never failed: it held its SSE stream open all along
        assert listed["watcher"] == "idle"


async def test_an_agent_that_reconnects_within_the_grace_period_does_not_fail(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory(failure_grace=60, heartbeat_timeout=0)
    async with FieldClient(server.url) as field:
        flaky = await field.register("flaky", "analyst")
        for _ in range(2):
            async with open_ws(server, flaky.token) as ws:
                await ws.request("SUBSCRIBE", "flaky", {"action": "list"})
        agents = (await flaky.get("/v1/agents"))["agents"]
        assert [a["status"] for a in agents] == ["idle"]


def test_a_failed_agents_tasks_go_back_to_pending_and_their_creators_must_act() -> None:
    h = Harness(operator_token="operator-token-0123456789")
    h.register("lead", "lead", authority=6, via="operator-token-0123456789")
    h.register("worker", "analyst")
    created = h.send(
        "COORDINATE", "lead", {"action": "create", "title": "size it", "assignee": "worker"}
    )
    task_id = created["task"]["id"]
    h.send("COORDINATE", "worker", {"action": "start", "task_id": task_id})
    outcome = h.field.fail_agent("worker", "silent")
    h.entries.extend(outcome.entries)
    assert [e.kind for e in outcome.entries] == ["agent.failed", "task.state_changed"]
    released = h.field.state.tasks[task_id]
    assert released["status"] == "pending" and released["assignee"] is None
    assert outcome.entries[0].data["released_tasks"] == [{"task_id": task_id, "created_by": "lead"}]
    assert h.replayed().state.tasks[task_id]["status"] == "pending"
    event = event_of(h.stored()[-2], h.field.state.known_units)
    assert event is not None and event.name == "agent.failed"
    assert event.agents == ("lead",) and event.acting == ("lead",)
    assert "1 task(s) back to pending" in event.summary


async def test_what_is_known_of_departed_agents_is_forgotten(service: FieldService) -> None:
    clock = Clock()
    liveness = Liveness(service, failure_grace=30, heartbeat_timeout=300, clock=clock)
    for agent_id in ("alice", "bob", "gone-1", "operator"):
        liveness.seen(agent_id)
    liveness.connected("bob")
    liveness.disconnected("bob")
    liveness.forget_departed()
    assert set(liveness._heard) == {"alice", "bob"}
    assert set(liveness._dropped) == {"bob"}


async def test_the_monitors_jobs_are_admitted_while_requests_are_shed(
    service: FieldService,
) -> None:
    """The Field's own work is never refused for load (protocol/README.md, Overload)."""
    clock = Clock()
    liveness = Liveness(service, failure_grace=30, heartbeat_timeout=300, clock=clock)
    for i in range(100):  # a standing delay of 1 s: writes and reads are shed
        service.admission.observe(1.0, now=i * 0.01)
    with pytest.raises(FieldError, match="overloaded"):
        await service.execute(lambda field: Outcome({}), operation="ATTUNE")
    clock.now += 400
    await liveness._fail_silent()
    failed = {a: r.status for a, r in service.field.state.agents.items()}
    assert failed == {"alice": "failed", "bob": "failed"}


class Elsewhere:
    """Another node's presence as this one has read it so far: nothing yet."""

    def presence(self, agent_id: str) -> tuple[int, float | None, float | None]:
        return 0, None, None

    def decides(self) -> bool:
        return True


async def test_an_agent_registered_elsewhere_gets_a_whole_heartbeat_timeout(
    service: FieldService,
) -> None:
    """A node up for longer than heartbeat_timeout learns from the log of an agent that
    registered on another node before it has read that node's presence: the agent counts
    as heard from when this node first knew of it, not when this node started."""
    clock = Clock()
    liveness = Liveness(
        service, failure_grace=1, heartbeat_timeout=3, clock=clock, remote=Elsewhere()
    )
    liveness.seen("alice")
    liveness.seen("bob")
    clock.now += 10  # this node has been up for a while, checking
    liveness.seen("alice")
    assert [a for a, _ in liveness.due()] == ["bob"]
    envelope = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "msg-carol",
        "operation": "REGISTER",
        "agent_id": "carol",
        "session_id": None,
        "epoch": 0,
        "payload": {"id": "carol", "role": "analyst"},
    }
    await service.execute(lambda field: field.handle(envelope, token=None))  # "elsewhere"
    assert [a for a, _ in liveness.due()] == ["bob"]  # not carol, new to this node
    clock.now += 2.9
    assert [a for a, _ in liveness.due()] == ["bob"]
    liveness.seen("alice")
    clock.now += 0.1
    assert [a for a, _ in liveness.due()] == ["bob", "carol"]
