"""The MCP binding (spec 10.2), end to end.

A real Field runs on a loopback port; ``field mcp`` runs as a real
subprocess, spoken to over stdio with the ``mcp`` client library
(``stdio_client`` + ``ClientSession``). One Field and one ``field mcp``
serve the whole module, so the tests use distinct agent ids and always
pass ``agent_id`` (the bridge acts for several agents). The subprocess
acts for "lead" (authority 6, registered by the operator) through
``--agent-id`` and ``FIELD_TOKEN``, and for every agent registered with
``akashik_register``. Every error body is checked against ``error.json``.

The bridge's own rules (the default agent, an unreachable Field) are
tested in-process at the end, without MCP.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from field.cli.main import main
from field.cli.mcp_bridge import TOOLS, Bridge, relay, tool_definitions
from field.client import FieldClient
from field.server.config import Config

from .conftest import ThreadedServer
from .schema_util import assert_valid

OPERATOR_TOKEN = "operator-token-0123456789"
HANG_GUARD = 60  # seconds; only ever reached when something hangs
SPEC_TOOLS = {
    "akashik_register",
    "akashik_record",
    "akashik_attune",
    "akashik_detect",
    "akashik_merge",
    "akashik_replay",
    "akashik_compact",
}
EXTENSION_TOOLS = {
    "akashik_deregister",
    "akashik_session",
    "akashik_coordinate",
    "akashik_handoff",
    "akashik_feedback",
}

pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class McpClient:
    """An MCP session with ``field mcp``; results decoded from their JSON text."""

    session: ClientSession
    init: types.InitializeResult
    log: Path
    lead_token: str

    async def call(self, tool: str, /, **arguments: Any) -> tuple[bool, dict[str, Any]]:
        result = await asyncio.wait_for(self.session.call_tool(tool, arguments), HANG_GUARD)
        (content,) = result.content
        assert isinstance(content, types.TextContent)
        assert "lead_token" not in content.text and self.lead_token not in content.text
        body: dict[str, Any] = json.loads(content.text)
        return bool(result.is_error), body

    async def ok(self, tool: str, /, **arguments: Any) -> dict[str, Any]:
        is_error, body = await self.call(tool, **arguments)
        assert not is_error, body
        return body

    async def error(self, tool: str, code: str, /, **arguments: Any) -> dict[str, Any]:
        is_error, body = await self.call(tool, **arguments)
        assert is_error, body
        assert_valid("error", body)
        assert body["code"] == code, body
        return body

    async def register(self, agent_id: str, role: str, **extra: Any) -> dict[str, Any]:
        return await self.ok("akashik_register", id=agent_id, role=role, **extra)

    async def record(self, agent_id: str, content: str, **extra: Any) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "type": "finding",
            "content": content,
            "intent": {"purpose": "test the MCP binding"},
            "confidence": {"score": 0.8, "reasoning": "made up for the test"},
            **extra,
        }
        return await self.ok("akashik_record", agent_id=agent_id, **payload)


@pytest.fixture(scope="module")
def field() -> Iterator[ThreadedServer]:
    config = Config(data_dir=None, log_level="warning", operator_token=OPERATOR_TOKEN)
    server = ThreadedServer(config).start()
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mcp(
    field: ThreadedServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[McpClient]:
    async with FieldClient(field.url) as client:
        lead = await client.register("lead", "lead", authority=6, operator_token=OPERATOR_TOKEN)
    log = tmp_path_factory.mktemp("mcp") / "stderr.log"
    # The token goes in the environment, not on the command line; debug logging
    # is on so that test_no_token_reaches_the_log reads everything it logs.
    command = ["-m", "field", "mcp", "--url", field.url, "--agent-id", "lead"]
    params = StdioServerParameters(
        command=sys.executable,
        args=[*command, "--log-level", "debug"],
        env={**os.environ, "FIELD_TOKEN": lead.token, "PYTHONUNBUFFERED": "1"},
    )
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[McpClient] = loop.create_future()
    stop = asyncio.Event()

    # stdio_client's task group must be entered and left by one task: this one.
    async def own_the_session() -> None:
        with log.open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                init = await session.initialize()
                ready.set_result(McpClient(session, init, log, lead.token))
                await stop.wait()

    def failed(task: asyncio.Task[None]) -> None:
        if not ready.done():
            ready.set_exception(task.exception() or RuntimeError("field mcp ended early"))

    owner = asyncio.create_task(own_the_session())
    owner.add_done_callback(failed)
    client = await asyncio.wait_for(asyncio.shield(ready), HANG_GUARD)
    yield client
    stop.set()
    await asyncio.wait_for(owner, HANG_GUARD)


async def test_it_lists_every_tool_with_the_wire_payload_as_input_schema(mcp: McpClient) -> None:
    assert mcp.init.server_info.name == "akashik-field"
    assert "akashik_attune" in (mcp.init.instructions or "")
    listed = await asyncio.wait_for(mcp.session.list_tools(), HANG_GUARD)
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == SPEC_TOOLS | EXTENSION_TOOLS == set(TOOLS)
    assert {name for name, tool in TOOLS.items() if tool.extension} == EXTENSION_TOOLS
    for name, tool in tools.items():
        schema = tool.input_schema
        assert schema == tool_definitions()[name]["inputSchema"]
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        text = json.dumps(schema)
        assert "$ref" not in text and '"allOf"' not in text and '"if"' not in text
        assert tool.description and len(tool.description) < 600
        assert ("agent_id" in schema["properties"]) == (name != "akashik_register")
        assert "agent_id" not in schema.get("required", [])
    record = tools["akashik_record"].input_schema
    assert record["required"] == ["type", "content", "intent"]
    assert "finding" in record["properties"]["type"]["enum"]
    assert set(record["properties"]["intent"]["properties"]) >= {"purpose", "task_id"}
    attune = tools["akashik_attune"].input_schema["properties"]
    assert attune["poll"]["type"] == "boolean" and "since_epoch" in attune
    assert tools["akashik_register"].input_schema["required"] == ["id", "role"]


async def test_register_record_and_attune(mcp: McpClient) -> None:
    registered = await mcp.register("ada", "market_researcher", interests=["churn"])
    assert registered["status"] == "registered" and "token" not in registered
    assert registered["agent"]["id"] == "ada"
    await mcp.register("ben", "strategist", interests=["churn"])
    recorded = await mcp.record("ada", "Churn fell to 2% in March.")
    assert_valid("record.response", recorded)
    seen = await mcp.ok("akashik_attune", agent_id="ben", context_hint="churn")
    assert_valid("attune.response", seen)
    assert recorded["memory_unit_id"] in [r["memory_unit"]["id"] for r in seen["record"]]
    taken = await mcp.error("akashik_register", "AGENT_ID_TAKEN", id="ada", role="x")
    assert taken["recoverable"] is True


async def test_a_poll_sees_exactly_the_new_unit(mcp: McpClient) -> None:
    await mcp.register("cy", "analyst")
    await mcp.register("di", "analyst")
    caught_up = await mcp.ok("akashik_attune", agent_id="di", poll=True, scope={"max_units": 1000})
    assert caught_up["context_budget"]["units_available"] == len(caught_up["record"])
    nothing = await mcp.ok("akashik_attune", agent_id="di", poll=True)
    assert nothing["record"] == []
    new = await mcp.record("cy", "Pricing page converts at 4%.")
    polled = await mcp.ok("akashik_attune", agent_id="di", poll=True)
    assert [r["memory_unit"]["id"] for r in polled["record"]] == [new["memory_unit_id"]]
    assert (await mcp.ok("akashik_attune", agent_id="di", poll=True))["record"] == []
    # Polling by hand: since_epoch is the previous response's epoch.
    again = await mcp.ok("akashik_attune", agent_id="di", since_epoch=nothing["epoch"])
    assert [r["memory_unit"]["id"] for r in again["record"]] == [new["memory_unit_id"]]


async def test_errors_carry_the_spec_error_body(mcp: McpClient) -> None:
    await mcp.register("eve", "analyst")
    body = await mcp.error(
        "akashik_record",
        "MISSING_INTENT",
        agent_id="eve",
        type="finding",
        content="No reason given",
        confidence={"score": 0.5, "reasoning": "none"},
    )
    assert body["operation"] == "RECORD" and body["recoverable"] is True
    assert "intent.purpose" in body["suggested_action"]
    await mcp.error("akashik_attune", "UNAUTHENTICATED", agent_id="nobody")
    several = await mcp.error("akashik_attune", "INVALID_PAYLOAD")  # which agent?
    assert "agent_id" in several["message"]
    missing = await mcp.error(
        "akashik_merge",
        "CONFLICT_NOT_FOUND",
        agent_id="eve",
        conflict_id="conflict-x",
        strategy="last_write_wins",
        resolution={"rationale": "mine"},
    )
    assert missing["recoverable"] is False


async def test_an_unknown_tool_is_a_protocol_error(mcp: McpClient) -> None:
    """MCP 2025-11-25: a tool that does not exist is a JSON-RPC error, -32602 (Invalid
    params), naming it; a tool that exists refuses bad arguments in its result (isError)."""
    await mcp.register("iris", "analyst")
    for name in ("akashik_nope", "akashik_subscribe"):  # /mcp has the second one
        with pytest.raises(MCPError) as unknown:
            await asyncio.wait_for(mcp.session.call_tool(name, {"agent_id": "iris"}), HANG_GUARD)
        assert unknown.value.code == types.INVALID_PARAMS == -32602
        assert unknown.value.message == f"Unknown tool: {name}"
        body = unknown.value.data
        assert_valid("error", body)
        assert body["code"] == "NOT_FOUND" and "akashik_register" in body["suggested_action"]
    bad = await mcp.error("akashik_attune", "INVALID_PAYLOAD", agent_id="iris", scope="all of it")
    assert bad["operation"] == "ATTUNE"
    await mcp.record("iris", "Still here.")  # the session goes on


async def test_merge_and_replay_through_the_tools(mcp: McpClient) -> None:
    await mcp.register("fay", "analyst")
    await mcp.register("gus", "engineer")
    a = await mcp.record(
        "fay", "Churn is 2% a month.", confidence={"score": 0.9, "reasoning": "billing"}
    )
    relation = {"type": "contradicts", "target_id": a["memory_unit_id"]}
    b = await mcp.record("gus", "Churn is 5% a month.", relations=[relation])
    (conflict_id,) = b["conflicts_detected"]
    listed = await mcp.ok(
        "akashik_detect", agent_id="fay", mode="list", filter={"involving_agents": ["gus"]}
    )
    assert [c["id"] for c in listed["conflicts"]] == [conflict_id]

    merged = await mcp.ok(
        "akashik_merge",
        agent_id="lead",
        conflict_id=conflict_id,
        strategy="confidence_weighted",
        resolution={"rationale": "the billing export is better evidence"},
    )
    assert_valid("merge.response", merged)
    assert merged["conflict"]["resolution"]["winner_id"] == a["memory_unit_id"]
    again = await mcp.error(
        "akashik_merge",
        "INVALID_TRANSITION",
        agent_id="lead",
        conflict_id=conflict_id,
        strategy="last_write_wins",
        resolution={"rationale": "again"},
    )
    assert again["details"]["from"] == "resolved"

    replayed = await mcp.ok(
        "akashik_replay",
        agent_id="fay",
        target_type="conflict",
        target_id=conflict_id,
        depth="detailed",
    )
    assert_valid("replay.response", replayed)
    compacted = await mcp.ok(
        "akashik_compact", agent_id="lead", strategy="archive", filter={"status": ["superseded"]}
    )
    assert_valid("compact.response", compacted)
    assert compacted["units_affected"] == 1


async def test_sessions_tasks_handoff_and_deregister(mcp: McpClient) -> None:
    await mcp.register("hal", "lead_analyst")
    await mcp.register("ivy", "analyst")
    created = await mcp.ok(
        "akashik_session", agent_id="hal", action="create", name="Churn", invitees=["ivy"]
    )
    session_id = created["session"]["id"]
    await mcp.ok("akashik_session", agent_id="ivy", action="join", session_id=session_id)
    # hal created the session through this server: its work goes there by default.
    task = await mcp.ok(
        "akashik_coordinate",
        agent_id="hal",
        action="create",
        title="Reconcile churn",
        assignee="hal",
    )
    assert_valid("coordinate.response", task)
    assert task["task"]["session_id"] == session_id
    task_id = task["task"]["id"]
    await mcp.ok("akashik_coordinate", agent_id="hal", action="start", task_id=task_id)
    unit = await mcp.record(
        "hal", "Billing says 2%.", intent={"purpose": "reconcile", "task_id": task_id}
    )
    outside = await mcp.record("hal", "Unrelated note.", session_id=None)
    replayed = await mcp.ok(
        "akashik_replay",
        agent_id="hal",
        target_type="session",
        target_id=session_id,
        depth="detailed",
    )
    assert unit["memory_unit_id"] in json.dumps(replayed)
    assert outside["memory_unit_id"] not in json.dumps(replayed)

    handed = await mcp.ok(
        "akashik_handoff", agent_id="hal", task_id=task_id, to_agent_id="ivy", notes="over to you"
    )
    assert_valid("handoff.response", handed)
    assert handed["task"]["assignee"] == "ivy"
    first = handed["handoff"]["context"]["units"][0]  # recorded for the task, then the rest
    assert first["memory_unit"]["id"] == unit["memory_unit_id"]
    ended = await mcp.ok("akashik_session", agent_id="hal", action="end", session_id=session_id)
    assert ended["session"]["status"] == "ended"
    # Ending it also ends its default: a record goes outside any session again.
    await mcp.record("hal", "After the session.")

    done = await mcp.ok("akashik_deregister", agent_id="ivy")
    assert_valid("deregister.response", done)
    await mcp.error("akashik_attune", "UNAUTHENTICATED", agent_id="ivy")


async def test_no_token_reaches_the_log(mcp: McpClient) -> None:
    await mcp.register("jo", "analyst")
    await mcp.ok("akashik_attune", agent_id="lead", poll=True)
    log = mcp.log.read_text()
    assert "akashik_attune: ok" in log  # debug logging is on: the log is not empty
    assert mcp.lead_token not in log and '"token"' not in log


# -- the bridge in-process: its own rules -------------------------------------------------------


async def test_the_only_agent_is_the_default(field_server: ThreadedServer) -> None:
    async with FieldClient(field_server.url) as client:
        bridge = Bridge(client)
        nobody = await bridge.call("akashik_attune", {})
        assert nobody.is_error and nobody.body["code"] == "UNAUTHENTICATED"
        assert "akashik_register" in nobody.body["suggested_action"]
        registered = await bridge.call("akashik_register", {"id": "solo", "role": "analyst"})
        assert not registered.is_error and "token" not in registered.body
        polled = await bridge.call("akashik_attune", {"poll": True})
        assert not polled.is_error and bridge.cursors == {"solo": polled.body["epoch"]}
        gone = await bridge.call("akashik_deregister", {})
        assert not gone.is_error and bridge.agents == {} and bridge.cursors == {}


async def test_an_agent_deregistered_here_registers_again_here(
    field_server: ThreadedServer,
) -> None:
    """The id is retired; the bridge keeps its last token, the proof that takes it back."""
    async with FieldClient(field_server.url) as client:
        bridge = Bridge(client)
        await bridge.call("akashik_register", {"id": "solo", "role": "analyst"})
        await bridge.call("akashik_deregister", {"agent_id": "solo"})
        elsewhere = Bridge(client)  # another server holds no proof
        taken = await elsewhere.call("akashik_register", {"id": "solo", "role": "analyst"})
        assert taken.is_error and taken.body["code"] == "AGENT_ID_TAKEN"
        assert_valid("error", taken.body)
        back = await bridge.call("akashik_register", {"id": "solo", "role": "analyst"})
        assert not back.is_error and "token" not in back.body
        assert list(bridge.agents) == ["solo"] and bridge.retired == {}
        assert not (await bridge.call("akashik_attune", {})).is_error


async def test_an_unreachable_field_is_a_tool_error(
    unused_tcp_port_factory: Callable[[], int],
) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port_factory()}"
    async with FieldClient(url, timeout=HANG_GUARD) as client:
        bridge = Bridge(client)
        bridge.adopt("lead", "not-a-real-token")
        for name, arguments in [
            ("akashik_register", {"id": "a", "role": "b"}),
            ("akashik_attune", {}),  # needs the role first: GET /v1/agents
            ("akashik_replay", {"target_type": "task", "target_id": "t", "depth": "summary"}),
        ]:
            outcome = await bridge.call(name, arguments)
            assert outcome.is_error
            assert_valid("error", outcome.body)
            assert outcome.body["code"] == "FIELD_UNAVAILABLE"
            assert outcome.body["recoverable"] is True and url in outcome.body["message"]
            assert "not-a-real-token" not in outcome.text


async def test_resources_of_an_unreachable_field_are_an_mcp_error(
    unused_tcp_port_factory: Callable[[], int],
) -> None:
    """The resources are relayed from the Field's /mcp: one it cannot reach is the JSON-RPC
    error -32603 with the FIELD_UNAVAILABLE body; with no agent to act for, -32602."""
    url = f"http://127.0.0.1:{unused_tcp_port_factory()}"
    async with FieldClient(url, timeout=HANG_GUARD) as client:
        bridge = Bridge(client)
        upstream = relay(bridge).upstream
        with pytest.raises(MCPError) as nobody:
            await upstream.read("field://agent")
        assert nobody.value.code == types.INVALID_PARAMS
        assert nobody.value.data["code"] == "UNAUTHENTICATED"
        bridge.adopt("lead", "not-a-real-token")
        with pytest.raises(MCPError) as unreachable:
            await upstream.read("field://agent")
        assert unreachable.value.code == types.INTERNAL_ERROR
        body = unreachable.value.data
        assert_valid("error", body)
        assert body["code"] == "FIELD_UNAVAILABLE" and url in body["message"]
        assert "not-a-real-token" not in json.dumps(body)


async def test_the_command_line_wants_an_agent_id_with_a_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FIELD_TOKEN", raising=False)
    assert main(["mcp", "--agent-id", "lead"]) == 2
    assert main(["mcp", "--token", "t"]) == 2
    assert main(["mcp", "--timeout", "0"]) == 2
    assert "go together" in capsys.readouterr().err
