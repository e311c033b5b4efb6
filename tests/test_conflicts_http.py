"""Conflicts end to end: MERGE and DETECT over HTTP and the WebSocket, and what they push.

A real server on a loopback port (``server_factory`` from conftest, with an
operator token) and real clients: the SDK's generic ``AgentClient.send``
for operations, the ``websockets`` client for ``/v1/ws`` and a raw SSE
stream (helpers from ``tests/test_push.py``). Every body is validated
against its schema; no test sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from field.client import AgentClient, FieldClient, FieldClientError

from .conftest import ThreadedServer
from .schema_util import assert_valid
from .test_push import open_ws, record, sse_stream, subscribe

OPERATOR_TOKEN = "operator-secret-0123456789"
RATE_LIMITS = (
    "The payments API rate limit is 100 requests per minute.",
    "The payments API rate limit is 500 requests per minute.",
)


@pytest.fixture
def server(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    return server_factory(operator_token=OPERATOR_TOKEN)


@pytest.fixture
async def field(server: ThreadedServer) -> AsyncIterator[FieldClient]:
    async with FieldClient(server.url) as client:
        yield client


async def senior(field: FieldClient, agent_id: str) -> AgentClient:
    """An agent of authority 6, registered by the operator."""
    payload = {"id": agent_id, "role": "lead", "authority": 6}
    body = field.envelope("REGISTER", agent_id, payload)
    response = await field.request("POST", "/v1/register", body=body, token=OPERATOR_TOKEN)
    agent = AgentClient(field, agent_id, response["token"], role="lead")
    agent.epoch = response["epoch"]
    return agent


async def merge(agent: AgentClient, conflict_id: str, strategy: str, **resolution: Any) -> Any:
    resolution.setdefault("rationale", "decided in the test")
    payload = {"conflict_id": conflict_id, "strategy": strategy, "resolution": resolution}
    assert_valid("merge.request", payload)
    response = await agent.send("MERGE", payload)
    assert_valid("merge.response", response)
    return response


async def refused(call: Any, status: int, code: str) -> dict[str, Any]:
    with pytest.raises(FieldClientError) as info:
        await call
    error = info.value
    assert (error.status, error.code) == (status, code), error.body
    assert_valid("error", error.body)
    assert error.body["operation"] in ("MERGE", "DETECT")
    body: dict[str, Any] = error.body
    return body


async def contradiction(alice: AgentClient, bob: AgentClient) -> tuple[str, str, str]:
    a = (await record(alice, "Churn is 2% a month."))["memory_unit_id"]
    relation = {"type": "contradicts", "target_id": a}
    response = await record(bob, "Churn is 5% a month.", relations=[relation])
    return a, response["memory_unit_id"], response["conflicts_detected"][0]


async def test_merge_over_http_with_its_refusals(field: FieldClient) -> None:
    alice = await field.register("alice", "analyst")
    bob = await field.register("bob", "engineer")
    lead = await senior(field, "lead")
    a, b, cid = await contradiction(alice, bob)
    caps = alice.registration["field_capabilities"]
    assert "MERGE" in caps["supported_operations"] and len(caps["conflict_strategies"]) == 7
    assert caps["detect_modes"] == ["check", "scan", "list"]

    await refused(merge(alice, cid, "last_write_wins"), 403, "INSUFFICIENT_AUTHORITY")
    await refused(merge(lead, "conflict-nope", "last_write_wins"), 404, "CONFLICT_NOT_FOUND")
    await refused(merge(lead, cid, "authority", winner_id="mem-nope"), 422, "INVALID_PAYLOAD")
    tie = await refused(merge(lead, cid, "confidence_weighted"), 409, "MERGE_FAILED")
    assert tie["recoverable"] is True and tie["details"]["scores"] == {a: 0.8, b: 0.8}

    escalated = await merge(lead, cid, "human_escalation")
    assert escalated["status"] == "escalated"
    await refused(merge(lead, cid, "authority", winner_id=a), 403, "INSUFFICIENT_AUTHORITY")
    operator = AgentClient(field, "operator", OPERATOR_TOKEN, role="human_operator")
    resolved = await merge(operator, cid, "synthesis", synthesis="2% annual, 5% monthly plans.")
    assert resolved["status"] == "resolved"
    assert resolved["side_effects"]["superseded_units"] == [a, b]
    assert resolved["side_effects"]["notified_agents"] == ["alice", "bob"]
    new_id = resolved["side_effects"]["new_unit_id"]
    again = await refused(merge(lead, cid, "last_write_wins"), 409, "INVALID_TRANSITION")
    assert again["details"] == {
        "from": "resolved",
        "to": "resolved",
        "strategy": "last_write_wins",
        "allowed": [],
    }

    listed = await alice.send("DETECT", {"mode": "list", "filter": {"status": ["resolved"]}})
    assert_valid("detect.response", listed)
    (conflict,) = listed["conflicts"]
    assert conflict == resolved["conflict"]
    assert conflict["resolution"]["synthesis_unit_id"] == new_id
    seen = await alice.attune(max_units=10, include_own=True)
    assert [r["memory_unit"]["id"] for r in seen["record"]] == [new_id]


async def test_merge_over_the_websocket_request_path(
    server: ThreadedServer, field: FieldClient
) -> None:
    alice = await field.register("alice", "analyst")
    bob = await field.register("bob", "engineer")
    lead = await senior(field, "lead")
    a, b, cid = await contradiction(alice, bob)
    async with open_ws(server, lead.token) as ws:
        payload = {
            "conflict_id": cid,
            "strategy": "vote",
            "resolution": {"winner_id": a, "rationale": "let them vote", "quorum": 2},
        }
        frame = await ws.request("MERGE", "lead", payload)
        assert frame["status"] == 200, frame
        assert_valid("merge.response", frame["body"])
        assert frame["body"]["status"] == "pending_vote"
        again = await ws.request("MERGE", "lead", payload)
        assert again["status"] == 409 and again["body"]["code"] == "MERGE_FAILED", again
    async with open_ws(server, bob.token) as ws:
        ballot = {**payload, "resolution": {"winner_id": a, "rationale": "billing agrees"}}
        frame = await ws.request("MERGE", "bob", ballot)
        assert frame["status"] == 200, frame
        body = frame["body"]
        assert_valid("merge.response", body)
        assert body["status"] == "resolved"
        assert body["conflict"]["resolution"]["winner_id"] == a
        assert body["side_effects"]["superseded_units"] == [b]


async def test_subscribers_hear_of_resolutions_over_websocket(
    server: ThreadedServer, field: FieldClient
) -> None:
    alice = await field.register("alice", "analyst")
    bob = await field.register("bob", "engineer")
    lead = await senior(field, "lead")
    a, b, cid = await contradiction(alice, bob)
    subscription = await subscribe(bob, ["conflict.resolved", "memory.superseded"])
    async with open_ws(server, bob.token) as ws:
        await ws.ready()
        resolved = await merge(lead, cid, "authority", winner_id=a)
        superseded, done = await ws.notifications(2)
    assert superseded["event"] == "memory.superseded"
    assert superseded["memory_unit_id"] == b and superseded["conflict_id"] == cid
    assert done["event"] == "conflict.resolved" and done["conflict_id"] == cid
    assert done["entity"] == {"type": "conflict", "id": cid}
    assert done["agent_id"] == "lead" and done["epoch"] == resolved["epoch"]
    assert done["relevance_score"] == 1.0 and done["requires_action"] is False
    assert done["relevance_reason"].startswith("conflict.resolved: it involves your unit")
    assert f"in favour of {a}" in done["summary"]
    assert done["subscription_id"] == subscription["subscription_id"]


async def test_a_scan_pushes_the_conflicts_it_finds_over_sse(
    field: FieldClient, http: aiohttp.ClientSession
) -> None:
    alice = await field.register("alice", "analyst")
    bob = await field.register("bob", "engineer")
    carol = await field.register("carol", "auditor")
    response = await subscribe(alice, ["conflict.detected", "memory.contested"])
    a = (await record(alice, RATE_LIMITS[0]))["memory_unit_id"]
    b = (await record(bob, RATE_LIMITS[1]))["memory_unit_id"]
    await record(bob, "Deploys happen on Tuesdays.")
    async with sse_stream(http, response["sse_url"], alice.token) as sse:
        await sse.ready()
        scanned = await carol.send("DETECT", {"mode": "scan"})
        assert_valid("detect.response", scanned)
        events = await sse.notifications(3)
    (conflict,) = scanned["conflicts"]
    assert scanned["scan_coverage"] == {
        "units_scanned": 3,
        "new_conflicts_found": 1,
        "units_in_scope": 3,
    }
    assert conflict["detected_by"] == "semantic"
    assert (conflict["unit_a"], conflict["unit_b"]) == (a, b)
    detected, *contested = (e.data for e in events)
    assert detected["event"] == "conflict.detected" and detected["conflict_id"] == conflict["id"]
    assert detected["agent_id"] == "carol" and detected["requires_action"] is True
    assert sorted(n["memory_unit_id"] for n in contested) == sorted([a, b])
    assert all(n["event"] == "memory.contested" for n in contested)

    again = await carol.send("DETECT", {"mode": "scan"})  # nothing new: no duplicate
    assert again["conflicts"] == [] and again["scan_coverage"]["new_conflicts_found"] == 0
    checked = await carol.send("DETECT", {"mode": "check", "target_id": b})
    assert_valid("detect.response", checked)
    assert [c["id"] for c in checked["conflicts"]] == [conflict["id"]]
    await refused(carol.send("DETECT", {"mode": "check"}), 422, "INVALID_PAYLOAD")
    await refused(
        carol.send("DETECT", {"mode": "check", "target_id": "mem-nope"}), 404, "UNIT_NOT_FOUND"
    )
