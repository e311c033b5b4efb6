"""SESSION, COORDINATE and HANDOFF end to end, over real sockets.

A real server runs on a loopback port (``server_factory`` from conftest,
with an operator token so that a senior agent can be registered). The
operations go over HTTP with the SDK's generic ``AgentClient.send`` and
over the WebSocket ``/v1/ws`` request path; their events come back as
notifications on WebSocket and SSE streams. Every response, error and
notification is validated against its schema on the way (the WebSocket
and SSE consumers of ``tests/test_push.py`` check every frame).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from field.client import AgentClient, FieldClient, FieldClientError

from .conftest import ThreadedServer
from .schema_util import assert_valid
from .test_push import open_ws, sse_stream

OPERATOR_TOKEN = "operator-token-0123456789"
COORDINATION_EVENTS = [
    "task.state_changed",
    "task.assigned",
    "task.completed",
    "handoff.incoming",
    "session.paused",
    "session.ended",
]


@dataclass
class Team:
    server: ThreadedServer
    field: FieldClient
    lead: AgentClient  # senior (6)
    worker: AgentClient
    other: AgentClient


async def register(
    field: FieldClient, agent_id: str, role: str, *, authority: int | None = None, **extra: Any
) -> AgentClient:
    """REGISTER over HTTP; above authority 4 with the operator token."""
    payload: dict[str, Any] = {"id": agent_id, "role": role, **extra}
    token = None
    if authority is not None:
        payload["authority"] = authority
        token = OPERATOR_TOKEN
    body = field.envelope("REGISTER", agent_id, payload)
    response = await field.request("POST", "/v1/register", body=body, token=token)
    agent = AgentClient(field, agent_id, response["token"], role=role)
    agent.epoch = response["epoch"]
    return agent


@pytest.fixture
async def team(server_factory: Callable[..., ThreadedServer]) -> AsyncIterator[Team]:
    server = server_factory(operator_token=OPERATOR_TOKEN)
    async with FieldClient(server.url) as field:
        lead = await register(field, "lead", "lead", authority=6)
        worker = await register(field, "worker", "analyst", interests=["market sizing"])
        other = await register(field, "other", "analyst", interests=["pricing"])
        yield Team(server, field, lead, worker, other)


async def send(agent: AgentClient, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
    assert_valid(f"{operation.lower()}.request", payload)
    response = await agent.send(operation, payload)
    assert_valid(f"{operation.lower()}.response", response)
    assert response["status"] == "ok"
    return response


async def refused(
    agent: AgentClient, operation: str, payload: dict[str, Any], status: int, code: str
) -> dict[str, Any]:
    with pytest.raises(FieldClientError) as caught:
        await agent.send(operation, payload)
    error = caught.value
    assert (error.status, error.code) == (status, code), error.body
    assert_valid("error", error.body)
    return error.body


async def subscribe(agent: AgentClient, **options: Any) -> str:
    subscription = {"events": COORDINATION_EVENTS, **options}
    response = await send(agent, "SUBSCRIBE", {"action": "subscribe", "subscription": subscription})
    return str(response["subscription_id"])


# -- HTTP ------------------------------------------------------------------------------


async def test_coordination_over_http(team: Team) -> None:
    capabilities = await team.field.status()
    assert capabilities["status"] == "ok"
    created = await send(
        team.lead, "SESSION", {"action": "create", "name": "EU market", "invitees": ["worker"]}
    )
    sid = created["session"]["id"]
    await send(team.worker, "SESSION", {"action": "join", "session_id": sid})
    team.lead.session_id = sid
    task = (
        await send(
            team.lead,
            "COORDINATE",
            {"action": "create", "title": "Size the EU market", "assignee": "worker"},
        )
    )["task"]
    assert (task["status"], task["assignee"], task["session_id"]) == ("assigned", "worker", sid)
    tid = task["id"]
    # the assignee's move only; 403 for anyone else, 409 for a move the table forbids
    # outside the task's session, the task does not exist for you (spec 11.3)
    start = {"action": "start", "task_id": tid}
    await refused(team.other, "COORDINATE", start, 404, "TASK_NOT_FOUND")
    body = await refused(
        team.worker, "COORDINATE", {"action": "unblock", "task_id": tid}, 409, "INVALID_TRANSITION"
    )
    assert body["details"]["allowed_actions"] == ["assign", "start", "release", "cancel"]
    await refused(
        team.worker,
        "COORDINATE",
        {"action": "start", "task_id": "task-none"},
        404,
        "TASK_NOT_FOUND",
    )
    started = await send(team.worker, "COORDINATE", {"action": "start", "task_id": tid})
    assert started["task"]["status"] == "in_progress"
    agents = await team.field.request("GET", "/v1/agents", token=team.worker.token)
    assert {a["id"]: a["status"] for a in agents["agents"]}["worker"] == "working"
    # RECORD in the session; then a handoff with the unit in its package
    team.worker.session_id = sid
    unit = await team.worker.record(
        "finding",
        "DACH market sizing: 1bn",
        purpose="size the market",
        confidence=0.8,
        reasoning="reports",
        task_id=tid,
    )
    await refused(
        team.worker,
        "HANDOFF",
        {"task_id": tid, "to_agent_id": "other"},
        403,
        "FORBIDDEN",  # other is not a member of the task's session
    )
    await send(team.lead, "SESSION", {"action": "invite", "session_id": sid, "invitees": ["other"]})
    await send(team.other, "SESSION", {"action": "join", "session_id": sid})
    handed = await send(
        team.worker, "HANDOFF", {"task_id": tid, "to_agent_id": "other", "notes": "DACH done"}
    )
    package = handed["handoff"]["context"]["units"]
    assert [u["memory_unit"]["id"] for u in package] == [unit["memory_unit_id"]]
    assert handed["task"]["assignee"] == "other"
    # pausing stops work in the session
    await send(team.lead, "SESSION", {"action": "pause", "session_id": sid})
    await refused(
        team.other, "COORDINATE", {"action": "start", "task_id": tid}, 409, "INVALID_TRANSITION"
    )
    await refused(
        team.worker,
        "RECORD",
        {
            "type": "finding",
            "content": "x",
            "intent": {"purpose": "p"},
            "confidence": {"score": 0.5, "reasoning": "r"},
        },
        409,
        "INVALID_TRANSITION",
    )
    await refused(
        team.worker, "SESSION", {"action": "end", "session_id": sid}, 403, "INSUFFICIENT_AUTHORITY"
    )
    listed = await send(team.other, "COORDINATE", {"action": "list"})
    assert [t["id"] for t in listed["tasks"]] == [tid]
    # DEREGISTER hands the task back to the pool
    left = await send(team.other, "DEREGISTER", {"agent_id": "other"})
    assert left["cleanup"]["tasks_reassigned"] == 1
    mine = await send(team.lead, "COORDINATE", {"action": "list"})
    assert mine["tasks"][0]["status"] == "pending"


# -- push: the six events over a WebSocket and SSE ---------------------------------------


async def test_coordination_events_over_websocket(team: Team) -> None:
    subscription = await subscribe(team.worker)
    async with open_ws(team.server, team.worker.token) as ws:
        await ws.ready()
        opening = {"action": "create", "name": "market sizing", "invitees": ["worker", "other"]}
        sid = (await send(team.lead, "SESSION", opening))["session"]["id"]
        # operations on the WebSocket request path, answered by response frames
        joined = await ws.request("SESSION", "worker", {"action": "join", "session_id": sid})
        assert joined["status"] == 200 and joined["body"]["session"]["members"] == [
            "lead",
            "worker",
        ]
        team.lead.session_id = sid
        first = (
            await send(
                team.lead,
                "COORDINATE",
                {"action": "create", "title": "collect market data", "assignee": "worker"},
            )
        )["task"]
        created, assigned = await ws.notifications(2)
        assert (created["event"], created["requires_action"]) == ("task.state_changed", False)
        assert created["detail"]["from"] is None and created["detail"]["action"] == "create"
        assert (assigned["event"], assigned["requires_action"]) == ("task.assigned", True)
        assert assigned["relevance_score"] == 1.0
        assert assigned["entity"] == {"type": "task", "id": first["id"]}
        assert assigned["detail"]["task"]["assignee"] == "worker"
        assert assigned["subscription_id"] == subscription
        # a dependent task for the worker, started and completed over the WebSocket
        second = (
            await send(
                team.lead,
                "COORDINATE",
                {
                    "action": "create",
                    "title": "model the market",
                    "assignee": "worker",
                    "depends_on": [first["id"]],
                },
            )
        )["task"]
        await ws.notifications(2)  # its creation and assignment
        for action in ("start", "complete"):
            frame = await ws.request(
                "COORDINATE", "worker", {"action": action, "task_id": first["id"]}
            )
            assert frame["status"] == 200, frame
            assert_valid("coordinate.response", frame["body"])
        blocked = await ws.request(
            "COORDINATE", "worker", {"action": "start", "task_id": "task-none"}
        )
        assert blocked["status"] == 404 and blocked["body"]["code"] == "TASK_NOT_FOUND"
        # own events are not notified; the lead completing on the worker's behalf would be
        lead_done = await send(
            team.lead, "COORDINATE", {"action": "cancel", "task_id": second["id"]}
        )
        assert lead_done["task"]["status"] == "cancelled"
        (cancelled,) = await ws.notifications(1)
        assert cancelled["event"] == "task.state_changed"
        assert cancelled["detail"]["action"] == "cancel" and cancelled["agent_id"] == "lead"
        # a handoff to the worker, with its package, must be acted on
        await send(team.other, "SESSION", {"action": "join", "session_id": sid})
        team.other.session_id = sid
        third = (
            await send(
                team.other,
                "COORDINATE",
                {"action": "create", "title": "price list", "assignee": "other"},
            )
        )["task"]
        await ws.notifications(2)
        handed = await send(
            team.other,
            "HANDOFF",
            {"task_id": third["id"], "to_agent_id": "worker", "notes": "prices are due"},
        )
        reassigned, incoming = await ws.notifications(2)
        assert (reassigned["event"], reassigned["requires_action"]) == ("task.assigned", True)
        assert (incoming["event"], incoming["requires_action"]) == ("handoff.incoming", True)
        assert incoming["entity"] == {"type": "handoff", "id": handed["handoff"]["id"]}
        assert incoming["detail"]["handoff"] == handed["handoff"]
        assert incoming["detail"]["handoff"]["notes"] == "prices are due"
        # session.paused and session.ended reach the members
        await send(team.lead, "SESSION", {"action": "pause", "session_id": sid, "reason": "review"})
        (paused,) = await ws.notifications(1)
        assert (paused["event"], paused["relevance_score"]) == ("session.paused", 1.0)
        assert paused["detail"]["reason"] == "review"
        assert paused["entity"] == {"type": "session", "id": sid}
        await send(team.lead, "SESSION", {"action": "end", "session_id": sid})
        (ended,) = await ws.notifications(1)
        assert ended["event"] == "session.ended" and ended["detail"]["session"]["status"] == "ended"


async def test_task_completed_notifies_the_dependent_assignee(team: Team) -> None:
    """task.completed reaches the assignee of a dependent task, who may now start it."""
    await subscribe(team.other)
    first = (
        await send(
            team.worker, "COORDINATE", {"action": "create", "title": "t1", "assignee": "worker"}
        )
    )["task"]
    await send(
        team.lead,
        "COORDINATE",
        {"action": "create", "title": "t2", "assignee": "other", "depends_on": [first["id"]]},
    )
    async with open_ws(team.server, team.other.token) as ws:
        await ws.ready()
        await send(team.worker, "COORDINATE", {"action": "start", "task_id": first["id"]})
        await send(
            team.worker,
            "COORDINATE",
            {"action": "complete", "task_id": first["id"], "result": "ok"},
        )
        frames = await ws.notifications(3)
        assert [f["event"] for f in frames] == [
            "task.state_changed",
            "task.state_changed",
            "task.completed",
        ]
        done = frames[-1]
        assert (done["relevance_score"], done["requires_action"]) == (1.0, True)
        assert done["detail"]["dependents"][0]["ready"] is True
        assert done["detail"]["task"]["result"] == "ok"


async def test_handoff_and_session_events_over_sse(team: Team) -> None:
    created = {"action": "create", "name": "s", "invitees": ["other"]}
    sid = (await send(team.lead, "SESSION", created))["session"]["id"]
    await send(team.other, "SESSION", {"action": "join", "session_id": sid})
    subscription = await send(
        team.other,
        "SUBSCRIBE",
        {"action": "subscribe", "subscription": {"events": COORDINATION_EVENTS}},
    )
    url = team.server.url + f"/v1/subscriptions/{subscription['subscription_id']}/events"
    task = (
        await send(
            team.worker, "COORDINATE", {"action": "create", "title": "t", "assignee": "worker"}
        )
    )["task"]
    await send(team.worker, "HANDOFF", {"task_id": task["id"], "to_agent_id": "other"})
    await send(team.lead, "SESSION", {"action": "pause", "session_id": sid})
    await send(team.lead, "SESSION", {"action": "end", "session_id": sid})
    async with (
        aiohttp.ClientSession() as http,
        sse_stream(http, url, team.other.token, since=subscription["cursor"]) as sse,
    ):
        # resumed from the subscription's creation: the replay first, then the seam
        replayed = await sse.until(lambda e: e.event == "live")
    events = [e for e in replayed if e.id is not None]
    assert [(e.event, e.data["requires_action"]) for e in events] == [
        ("task.state_changed", False),  # created: the other agent only reads about it
        ("task.assigned", False),  # to the worker
        ("task.assigned", True),  # handed to the other agent, which must act ...
        ("handoff.incoming", True),  # ... with the package
        ("session.paused", False),  # a member
        ("session.ended", False),
    ]
    assert [e.data["relevance_score"] for e in events[2:]] == [1.0] * 4
    assert events[3].data["detail"]["handoff"]["to_agent_id"] == "other"
    assert all(e.id == e.data["cursor"] for e in events)
