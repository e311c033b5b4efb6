"""REPLAY and COMPACT end to end: real servers on loopback sockets, real clients.

Responses are validated against their schemas. One REPLAY goes over the
WebSocket request path; a push stream is resumed across a purge; and a
real ``field serve`` process is restarted to show that REPLAY reads the
log and that COMPACT's effects survive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from field.client import AgentClient, FieldClient
from field.contract.model import Limits

from .conftest import ServerProcess, ThreadedServer
from .schema_util import assert_valid
from .test_push import open_ws, record, refused, subscribe

OPERATOR_TOKEN = "operator-token-for-history-http"


async def privileged(field: FieldClient, agent_id: str, authority: int) -> AgentClient:
    """An agent the operator registers at ``authority``."""
    payload = {"id": agent_id, "role": "lead", "authority": authority}
    body = field.envelope("REGISTER", agent_id, payload)
    response = await field.request("POST", "/v1/register", body=body, token=OPERATOR_TOKEN)
    assert_valid("register.response", response)
    return AgentClient(field, agent_id, response["token"], role="lead")


async def replay(agent: AgentClient, target_type: str, target_id: str, depth: str) -> Any:
    payload = {"target_type": target_type, "target_id": target_id, "depth": depth}
    assert_valid("replay.request", payload)
    response = await agent.send("REPLAY", payload)
    assert_valid("replay.response", response)
    return response


async def compact(agent: AgentClient, strategy: str, **flt: Any) -> Any:
    payload = {"strategy": strategy, "filter": flt}
    assert_valid("compact.request", payload)
    response = await agent.send("COMPACT", payload)
    assert_valid("compact.response", response)
    return response


@pytest.fixture
def server(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    return server_factory(
        operator_token=OPERATOR_TOKEN, limits=Limits(max_replay_events=6, max_compact_units=50)
    )


@pytest.fixture
async def field(server: ThreadedServer) -> AsyncIterator[FieldClient]:
    async with FieldClient(server.url) as client:
        yield client


async def test_replay_and_compact_over_http(field: FieldClient) -> None:
    a = await field.register("agent-a", "analyst", interests=["pricing"])
    b = await field.register("agent-b", "researcher", interests=["pricing"])
    lead = await privileged(field, "lead", 8)
    decision = await record(a, "pricing: we charge per seat", memory_type="decision")
    challenge = await record(
        b,
        "pricing: per seat loses big customers",
        relations=[{"type": "contradicts", "target_id": decision["memory_unit_id"]}],
    )
    for depth in ("summary", "detailed", "full_trace"):
        response = await replay(a, "decision", decision["memory_unit_id"], depth)
        assert response["total_events"] == 5 and response["agents_involved"] == [
            "agent-a",
            "agent-b",
        ]
    conflict = await replay(b, "conflict", challenge["conflicts_detected"][0], "detailed")
    assert conflict["timeline"][0]["memory_unit_id"] == decision["memory_unit_id"]
    # errors keep the spec's shape and status
    await refused(
        a.send(
            "REPLAY",
            {"target_type": "decision", "target_id": "mem-none", "depth": "summary"},
        ),
        404,
        "UNIT_NOT_FOUND",
    )
    await refused(a.send("COMPACT", {"strategy": "archive", "filter": {"types": ["finding"]}}),
                  403, "INSUFFICIENT_AUTHORITY")  # fmt: skip
    for i in range(3):
        await record(a, f"pricing: old note {i}", memory_type="observation")
    archived = await compact(lead, "archive", types=["observation"])
    assert (archived["units_affected"], archived["units_remaining"]) == (3, 0)
    seen = await b.attune(max_units=50)
    assert {item["memory_unit"]["type"] for item in seen["record"]} == {"decision"}
    with_archived = await b.attune(max_units=50, include_archived=True)
    assert_valid("attune.response", with_archived)
    assert len(with_archived["record"]) == 4
    status = await field.status()
    assert_valid("field-status.response", status)
    assert status["counts"]["memory_units"]["archived"] == 3
    # the chain has grown past max_replay_events (6): full_trace is refused, summary answers
    for i in range(3):
        await record(
            b,
            f"pricing: more on it {i}",
            relations=[{"type": "supports", "target_id": challenge["memory_unit_id"]}],
        )
    too_large = {
        "target_type": "decision",
        "target_id": decision["memory_unit_id"],
        "depth": "full_trace",
    }
    error = await refused(a.send("REPLAY", too_large), 422, "REPLAY_TOO_LARGE")
    assert error.body["recoverable"] is True
    summary = await replay(a, "decision", decision["memory_unit_id"], "summary")
    assert summary["total_events"] == 8


async def test_replay_over_the_websocket_request_path(
    server: ThreadedServer, field: FieldClient
) -> None:
    a = await field.register("agent-a", "analyst")
    unit = await record(a, "a finding to replay", task_id="task-ws")
    payload = {"target_type": "task", "target_id": "task-ws", "depth": "full_trace"}
    async with open_ws(server, a.token) as ws:
        frame = await ws.request("REPLAY", "agent-a", payload)
    assert frame["status"] == 200
    body = frame["body"]
    assert_valid("replay.response", body)
    assert [e["memory_unit_id"] for e in body["timeline"]] == [unit["memory_unit_id"]]
    assert body["timeline"][0]["task_id"] == "task-ws"


async def test_a_stream_resumed_across_a_purge_delivers_what_it_owed(
    server: ThreadedServer, field: FieldClient
) -> None:
    a = await field.register("agent-a", "analyst", interests=["pricing"])
    b = await field.register("agent-b", "researcher", interests=["pricing"])
    lead = await privileged(field, "lead", 8)
    subscribed = await subscribe(b, ["memory.recorded", "memory.superseded"])
    old = await record(a, "pricing: the first estimate")
    new = await record(
        a,
        "pricing: the revised estimate",
        relations=[{"type": "supersedes", "target_id": old["memory_unit_id"]}],
    )
    purged = await compact(lead, "purge", status=["superseded"])
    assert purged["units_affected"] == 1 and purged["storage_reclaimed_bytes"] > 0
    async with open_ws(server, b.token, since=[subscribed["cursor"]]) as ws:
        frames = await ws.ready()
    assert frames[0]["type"] == "resume" and frames[-1]["type"] == "live"
    replayed = [f["data"] for f in frames if f["type"] == "notification"]
    assert [(n["event"], n["memory_unit_id"]) for n in replayed] == [
        ("memory.recorded", old["memory_unit_id"]),
        ("memory.recorded", new["memory_unit_id"]),
        ("memory.superseded", old["memory_unit_id"]),
    ]
    assert replayed[0]["summary"].endswith("pricing: the first estimate")  # from the log
    assert replayed[2]["summary"].endswith("(since purged)")
    trace = await replay(b, "memory_unit", old["memory_unit_id"], "full_trace")
    assert [e["event_type"] for e in trace["timeline"]] == [
        "memory.recorded",
        "memory.recorded",
        "memory.superseded",
        "memory.purged",
    ]


@pytest.mark.slow
async def test_after_a_restart_replay_reads_the_log_and_compaction_holds(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    token_file = tmp_path / "operator-token"
    token_file.write_text(OPERATOR_TOKEN)
    proc = server_process(data_dir, "--operator-token-file", str(token_file))
    async with FieldClient(proc.url) as field:
        a = await field.register("agent-a", "analyst", interests=["pricing"])
        lead = await privileged(field, "lead", 8)
        kept = await record(a, "pricing: kept", memory_type="decision")
        await record(
            a,
            "pricing: detail",
            relations=[{"type": "elaborates", "target_id": kept["memory_unit_id"]}],
        )
        gone = await record(a, "pricing: to purge", memory_type="observation")
        dusty = await record(a, "pricing: to archive", memory_type="question")
        await compact(lead, "purge", types=["observation"])
        await compact(lead, "summarize", types=["question"])
        before = await replay(a, "decision", kept["memory_unit_id"], "full_trace")
        purged_before = await replay(a, "memory_unit", gone["memory_unit_id"], "full_trace")
    assert proc.stop() == 0

    proc = server_process(data_dir, "--operator-token-file", str(token_file))
    async with FieldClient(proc.url) as field:
        a = AgentClient(field, "agent-a", a.token, role="analyst")
        after = await replay(a, "decision", kept["memory_unit_id"], "full_trace")
        assert {k: v for k, v in after.items() if k != "epoch"} == {
            k: v for k, v in before.items() if k != "epoch"
        }
        purged_after = await replay(a, "memory_unit", gone["memory_unit_id"], "full_trace")
        assert purged_after["timeline"] == purged_before["timeline"]
        assert purged_after["timeline"][-1]["event_type"] == "memory.purged"
        seen = await a.attune(max_units=50, include_own=True, include_archived=True)
        shown = {item["memory_unit"]["id"]: item["memory_unit"] for item in seen["record"]}
        assert gone["memory_unit_id"] not in shown
        assert shown[dusty["memory_unit_id"]]["status"] == "archived"
        assert {u["type"] for u in shown.values()} == {
            "decision",
            "finding",
            "question",
            "synthesis",
        }
        visible = await a.attune(max_units=50, include_own=True)
        assert dusty["memory_unit_id"] not in {i["memory_unit"]["id"] for i in visible["record"]}
        status = await field.status()
        assert status["counts"]["memory_units"] == {"active": 3, "archived": 1}
    assert proc.stop() == 0
