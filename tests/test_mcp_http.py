"""MCP over Streamable HTTP at ``/mcp`` of ``field serve``, end to end.

``field serve`` runs as a real process; the tests speak to it with the
official SDK's client (``streamable_http_client`` + ``ClientSession``), with
an agent's bearer token in the ``Authorization`` header, and with raw HTTP
where the SDK would hide what the Field answers (refusals, stateless POSTs).
Agents are registered over the HTTP binding. One server serves the module
(each test its own agents); the tests of bounds start their own.

Notifications are awaited (``Updates``), never slept for: a test that checks
that one did *not* come waits instead for a later one that must follow it on
the same stream. What the server does without telling any client (a session
that expires) is awaited in its log, with a deadline. Sessions of other
client addresses come from other loopback addresses (127.0.0.2, ...).
"""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx2
import pytest
import pytest_asyncio
from mcp import Client, ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from field.cli.main import main
from field.client import AgentClient, FieldClient
from field.server.config import Config

from .conftest import ServerProcess, spawn_server
from .schema_util import assert_valid

HANG_GUARD = 60  # seconds; only ever reached when something hangs
ACCEPT = "application/json, text/event-stream"

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


@pytest.fixture(scope="module")
def field(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = spawn_server(tmp_path_factory.mktemp("mcp-http"))
    yield server
    server.stop()


class Updates:
    """The URIs of the ``notifications/resources/updated`` a session is sent, in order."""

    def __init__(self) -> None:
        self.uris: asyncio.Queue[str] = asyncio.Queue()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            await self.uris.put(str(message.params.uri))

    async def next(self) -> str:
        return await asyncio.wait_for(self.uris.get(), HANG_GUARD)


@asynccontextmanager
async def mcp_session(
    url: str, token: str, updates: Updates | None = None, ids: list[str] | None = None
) -> AsyncIterator[ClientSession]:
    """An initialized MCP session over Streamable HTTP, as the agent of ``token``; the
    ``Mcp-Session-Id`` the Field answered is appended to ``ids``."""
    headers = {"Authorization": f"Bearer {token}"}

    async def answered(response: httpx2.Response) -> None:
        session_id = response.headers.get("mcp-session-id")
        if ids is not None and session_id is not None and session_id not in ids:
            ids.append(session_id)

    async with (
        httpx2.AsyncClient(
            headers=headers, timeout=HANG_GUARD, event_hooks={"response": [answered]}
        ) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write, message_handler=updates) as session,
    ):
        await asyncio.wait_for(session.initialize(), HANG_GUARD)
        yield session


async def call(session: ClientSession, tool: str, /, **arguments: Any) -> tuple[bool, Any]:
    result = await asyncio.wait_for(session.call_tool(tool, arguments), HANG_GUARD)
    (content,) = result.content
    assert isinstance(content, types.TextContent)
    return bool(result.is_error), json.loads(content.text)


async def ok(session: ClientSession, tool: str, /, **arguments: Any) -> Any:
    failed, body = await call(session, tool, **arguments)
    assert not failed, body
    return body


async def read(session: ClientSession, uri: str) -> Any:
    result = await asyncio.wait_for(session.read_resource(uri), HANG_GUARD)
    (content,) = result.contents
    assert isinstance(content, types.TextResourceContents) and content.uri == uri
    assert content.mime_type == "application/json"
    return json.loads(content.text)


async def unreadable(session: ClientSession, uri: str, code: str) -> dict[str, Any]:
    """Read ``uri`` expecting the MCP error that carries the Field's ``code``."""
    with pytest.raises(MCPError) as failed:
        await asyncio.wait_for(session.read_resource(uri), HANG_GUARD)
    body: dict[str, Any] = failed.value.data
    assert_valid("error", body)
    assert body["code"] == code and failed.value.message.startswith(code)
    return body


async def subscribe(session: ClientSession, uri: str) -> None:
    """resources/subscribe (the SDK calls it deprecated for the 2026 protocol, which
    replaces it with subscriptions/listen; sessions that initialize still have it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        await asyncio.wait_for(session.subscribe_resource(uri), HANG_GUARD)


async def unsubscribe(session: ClientSession, uri: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        await asyncio.wait_for(session.unsubscribe_resource(uri), HANG_GUARD)


@pytest_asyncio.fixture(loop_scope="module")
async def http(field: ServerProcess) -> AsyncIterator[FieldClient]:
    """A client of the Field over its HTTP binding, as other agents use it."""
    async with FieldClient(field.url) as client:
        yield client


async def register(client: FieldClient, *ids: str, role: str = "analyst") -> list[AgentClient]:
    return [await client.register(agent_id, role) for agent_id in ids]


def finding(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "finding",
        "content": content,
        "intent": {"purpose": "test MCP over HTTP"},
        "confidence": {"score": 0.8, "reasoning": "made up for the test"},
        **extra,
    }


async def record(agent: AgentClient, content: str, **extra: Any) -> dict[str, Any]:
    """RECORD over the HTTP binding, as another client of the Field would."""
    return await agent.send("RECORD", finding(content, **extra))


# -- tools -----------------------------------------------------------------------------------


async def test_tools_act_as_the_agent_of_the_token(field: ServerProcess, http: FieldClient) -> None:
    (ada,) = await register(http, "t-ada")
    async with mcp_session(field.url, ada.token) as session:
        init = session.initialize_result
        assert init is not None and init.server_info.name == "akashik-field"
        assert "field://subscriptions/{id}" in (init.instructions or "")
        assert init.capabilities.resources is not None and init.capabilities.resources.subscribe
        listed = await asyncio.wait_for(session.list_tools(), HANG_GUARD)
        tools = {tool.name: tool for tool in listed.tools}
        assert "akashik_register" not in tools and "akashik_subscribe" in tools
        assert "akashik_record" in tools and "akashik_session" in tools
        for tool in tools.values():
            assert "agent_id" not in tool.input_schema["properties"]
        recorded = await ok(session, "akashik_record", **finding("Churn fell to 2%."))
        assert_valid("record.response", recorded)
        seen = await ok(session, "akashik_attune", scope={"include_own": True})
        assert_valid("attune.response", seen)
        (unit,) = [
            r["memory_unit"]
            for r in seen["record"]
            if r["memory_unit"]["id"] == recorded["memory_unit_id"]
        ]
        assert unit["source"]["agent_id"] == "t-ada"


async def test_a_failed_call_is_the_fields_error_body(
    field: ServerProcess, http: FieldClient
) -> None:
    (bo,) = await register(http, "t-bo")
    async with mcp_session(field.url, bo.token) as session:
        failed, body = await call(
            session, "akashik_record", type="finding", content="no reason", confidence={}
        )
        assert failed and body["code"] == "MISSING_INTENT" and body["operation"] == "RECORD"
        assert_valid("error", body)
        failed, body = await call(session, "akashik_attune", agent_id="someone-else")
        assert failed and body["code"] == "FORBIDDEN" and "t-bo" in body["message"]
        failed, same = await call(session, "akashik_attune", agent_id="t-bo")  # its own: fine
        assert not failed and same["status"] == "ok"


async def test_an_unknown_tool_is_a_protocol_error(field: ServerProcess, http: FieldClient) -> None:
    """MCP 2025-11-25: a tool that does not exist is a JSON-RPC error, -32602 (Invalid
    params), naming it; a tool that exists refuses bad arguments in its result (isError)."""
    (uma,) = await register(http, "t-uma")
    async with mcp_session(field.url, uma.token) as session:
        for name in ("akashik_register", "akashik_nope"):  # field mcp has the first one
            with pytest.raises(MCPError) as unknown:
                await asyncio.wait_for(session.call_tool(name, {"id": "x"}), HANG_GUARD)
            assert unknown.value.code == types.INVALID_PARAMS == -32602
            assert unknown.value.message == f"Unknown tool: {name}"
            body = unknown.value.data
            assert_valid("error", body)
            assert body["code"] == "NOT_FOUND" and "akashik_subscribe" in body["suggested_action"]
        failed, body = await call(session, "akashik_attune", scope="all of it")
        assert failed and body["code"] == "INVALID_PAYLOAD" and body["operation"] == "ATTUNE"
        failed, body = await call(session, "akashik_record", **finding("Still here."))
        assert not failed and body["status"] == "accepted"  # the session goes on
    headers = {
        "Authorization": f"Bearer {uma.token}",
        "Content-Type": "application/json",
        "Accept": ACCEPT,
    }
    status, answer, _ = await post(field.url, tools_call("akashik_nope"), headers)  # stateless
    assert status == 200 and "result" not in answer
    assert answer["id"] == 7 and answer["error"]["code"] == -32602
    assert answer["error"]["message"] == "Unknown tool: akashik_nope"
    assert answer["error"]["data"]["code"] == "NOT_FOUND"


async def test_polls_and_the_default_session_are_kept_per_mcp_session(
    field: ServerProcess, http: FieldClient
) -> None:
    cy, di = await register(http, "t-cy", "t-di")
    async with mcp_session(field.url, di.token) as session:
        first = await ok(session, "akashik_attune", poll=True, scope={"max_units": 1000})
        assert first["context_budget"]["units_available"] == len(first["record"])
        new = await record(cy, "Pricing converts at 4%.")
        polled = await ok(session, "akashik_attune", poll=True)
        assert [r["memory_unit"]["id"] for r in polled["record"]] == [new["memory_unit_id"]]
        assert (await ok(session, "akashik_attune", poll=True))["record"] == []
        created = await ok(session, "akashik_session", action="create", name="Pricing")
        unit = await ok(session, "akashik_record", **finding("Inside the session."))
        replayed = await ok(
            session,
            "akashik_replay",
            target_type="session",
            target_id=created["session"]["id"],
            depth="detailed",
        )
        assert unit["memory_unit_id"] in json.dumps(replayed)
    async with mcp_session(field.url, di.token) as other:  # a new session starts afresh
        again = await ok(other, "akashik_attune", poll=True, scope={"max_units": 1000})
        assert new["memory_unit_id"] in [r["memory_unit"]["id"] for r in again["record"]]
        outside = await ok(other, "akashik_record", **finding("Outside any session."))
        replayed = await ok(
            other,
            "akashik_replay",
            target_type="session",
            target_id=created["session"]["id"],
            depth="detailed",
        )
        assert outside["memory_unit_id"] not in json.dumps(replayed)


# -- refusals ----------------------------------------------------------------------------------


async def post(
    url: str, body: Any, headers: dict[str, str], local: str = "127.0.0.1"
) -> tuple[int, Any, Any]:
    """A raw POST to /mcp from the loopback address ``local``: (status, JSON body, headers);
    ``body`` bytes are sent as given."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(local, 0))) as http,
        http.post(f"{url}/mcp", data=data, headers=headers) as response,
    ):
        text = await response.text()
        return response.status, (json.loads(text) if text else None), response.headers


def initialize_message() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }


async def test_a_missing_or_bad_token_is_refused(field: ServerProcess, http: FieldClient) -> None:
    plain = {"Content-Type": "application/json", "Accept": ACCEPT}
    for headers in (plain, {**plain, "Authorization": "Bearer not-a-token"}):
        status, body, answered = await post(field.url, initialize_message(), headers)
        assert status == 401 and answered["WWW-Authenticate"] == "Bearer"
        assert_valid("error", body)
        assert body["code"] == "UNAUTHENTICATED"
    async with httpx2.AsyncClient(timeout=HANG_GUARD) as client:  # the SDK's client is told so
        with pytest.raises(BaseExceptionGroup) as refused:
            async with (
                streamable_http_client(f"{field.url}/mcp", http_client=client) as (read, write),
                ClientSession(read, write) as session,
            ):
                await asyncio.wait_for(session.initialize(), HANG_GUARD)
        assert refused.group_contains(MCPError, depth=None)


async def test_a_browser_page_of_another_origin_is_refused(
    field: ServerProcess, http: FieldClient
) -> None:
    (eve,) = await register(http, "eve")
    headers = {
        "Content-Type": "application/json",
        "Accept": ACCEPT,
        "Authorization": f"Bearer {eve.token}",
    }
    status, body, _ = await post(
        field.url, initialize_message(), {**headers, "Origin": "http://evil.example"}
    )
    assert status == 403
    assert_valid("error", body)
    assert body["code"] == "FORBIDDEN" and "MCP endpoint" in body["message"]
    # the Field's own origin, and clients that send none, are served
    own = field.url.rstrip("/")
    for allowed in ({**headers, "Origin": own}, headers):
        status, body, _ = await post(field.url, initialize_message(), allowed)
        assert status == 200, body


async def test_bodies_methods_and_sessions_are_answered_with_the_error_body(
    field: ServerProcess, http: FieldClient
) -> None:
    (ed,) = await register(http, "t-ed")
    auth = {"Authorization": f"Bearer {ed.token}", "Content-Type": "application/json"}
    unknown = {**auth, "Accept": ACCEPT, "Mcp-Session-Id": "0" * 32}
    status, body, _ = await post(field.url, initialize_message(), unknown)
    assert status == 404 and body["code"] == "NOT_FOUND"
    async with (
        aiohttp.ClientSession() as raw,
        raw.get(f"{field.url}/mcp", headers=auth) as got,
        raw.put(f"{field.url}/mcp", headers=auth) as put,
    ):
        assert got.status == 405 and (await got.json())["code"] == "METHOD_NOT_ALLOWED"
        assert put.status == 405 and put.headers["Allow"] == "GET, POST, DELETE"
    (other,) = await register(http, "t-ed-other")
    ids: list[str] = []
    async with mcp_session(field.url, ed.token, ids=ids):  # not another agent's session
        (session_id,) = ids
        mine = {**auth, "Accept": ACCEPT, "Mcp-Session-Id": session_id}
        stolen = {**mine, "Authorization": f"Bearer {other.token}"}
        status, body, _ = await post(field.url, tools_call("akashik_attune"), stolen)
        assert status == 404 and body["code"] == "NOT_FOUND"


def tools_call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


async def open_raw(url: str, headers: dict[str, str], local: str = "127.0.0.1") -> dict[str, str]:
    """Initialize a session over raw HTTP from the loopback address ``local`` (no GET stream,
    no DELETE: a client that leaves it behind); the headers of its requests."""
    status, body, answered = await post(url, initialize_message(), headers, local)
    assert status == 200, body
    session = {**headers, "Mcp-Session-Id": answered["Mcp-Session-Id"]}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await post(url, initialized, session, local))[0] == 202
    return session


async def test_a_session_refuses_a_protocol_version_it_cannot_have(
    field: ServerProcess, http: FieldClient
) -> None:
    (hu,) = await register(http, "t-hu")
    headers = {
        "Authorization": f"Bearer {hu.token}",
        "Content-Type": "application/json",
        "Accept": ACCEPT,
    }
    session = await open_raw(field.url, headers)
    attune = tools_call("akashik_attune")
    for version in ("1999-01-01", "2026-07-28", "v" * 200):
        refused = {**session, "MCP-Protocol-Version": version}
        status, body, _ = await post(field.url, attune, refused)
        assert status == 400, body
        assert body["jsonrpc"] == "2.0" and body["id"] is None
        error = body["error"]
        assert error["message"] == "Unsupported protocol version" and error["code"] < 0
        assert error["data"]["requested"] == version[:64]
        assert "2025-11-25" in error["data"]["supported"]
    async with aiohttp.ClientSession() as raw:
        refused = {**session, "MCP-Protocol-Version": "1999-01-01", "Accept": "text/event-stream"}
        for method in ("GET", "DELETE"):  # the stream is not opened, the session not ended
            async with raw.request(method, f"{field.url}/mcp", headers=refused) as answer:
                assert answer.status == 400
                assert (await answer.json())["error"]["data"]["requested"] == "1999-01-01"
    for supported in ("2025-11-25", "2025-06-18", None):
        served = session if supported is None else {**session, "MCP-Protocol-Version": supported}
        status, body, _ = await post(field.url, attune, served)
        assert status == 200 and body["result"]["isError"] is False, body
    # outside a session the SDK answers an unsupported version alike: 400, a JSON-RPC error
    stateless = {**headers, "MCP-Protocol-Version": "1999-01-01"}
    status, body, _ = await post(field.url, attune, stateless)
    assert status == 400 and body["jsonrpc"] == "2.0" and body["error"]["code"] < 0


async def test_a_stateless_request_needs_no_initialize(
    field: ServerProcess, http: FieldClient
) -> None:
    (fay,) = await register(http, "t-fay")
    headers = {
        "Authorization": f"Bearer {fay.token}",
        "Content-Type": "application/json",
        "Accept": ACCEPT,
    }
    status, body, answered = await post(
        field.url, tools_call("akashik_record", **finding("Stateless.")), headers
    )
    assert status == 200 and "Mcp-Session-Id" not in answered
    result = body["result"]
    assert result["isError"] is False
    recorded = json.loads(result["content"][0]["text"])
    assert_valid("record.response", recorded)
    status, body, _ = await post(field.url, tools_call("akashik_attune", poll=True), headers)
    refused = json.loads(body["result"]["content"][0]["text"])
    assert body["result"]["isError"] and refused["code"] == "UNSUPPORTED_OPERATION"
    read_agent = {"jsonrpc": "2.0", "id": 8, "method": "resources/read"}
    read_agent["params"] = {"uri": "field://agent"}
    status, body, _ = await post(field.url, read_agent, headers)
    (contents,) = body["result"]["contents"]
    assert json.loads(contents["text"])["agent"]["id"] == "t-fay"


async def test_the_per_request_protocol_is_served_statelessly(
    field: ServerProcess, http: FieldClient
) -> None:
    """The SDK's client on MCP's 2026 protocol (no initialize, no session): tools and reads
    work."""
    (gil,) = await register(http, "t-gil")
    headers = {"Authorization": f"Bearer {gil.token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=HANG_GUARD) as client,
        Client(
            streamable_http_client(f"{field.url}/mcp", http_client=client), mode="2026-07-28"
        ) as modern,
    ):
        assert modern.session.protocol_version == "2026-07-28"
        result = await asyncio.wait_for(
            modern.call_tool("akashik_record", finding("Per request.")), HANG_GUARD
        )
        (content,) = result.content
        assert isinstance(content, types.TextContent) and not result.is_error
        assert_valid("record.response", json.loads(content.text))
        agent = await asyncio.wait_for(modern.read_resource("field://agent"), HANG_GUARD)
        (contents,) = agent.contents
        assert isinstance(contents, types.TextResourceContents)
        assert json.loads(contents.text)["agent"]["id"] == "t-gil"


# -- resources -------------------------------------------------------------------------------


async def test_entities_are_resources(field: ServerProcess, http: FieldClient) -> None:
    gus, hal = await register(http, "t-gus", "t-hal")
    updates = Updates()
    async with mcp_session(field.url, gus.token, updates) as session:
        listed = await asyncio.wait_for(session.list_resources(), HANG_GUARD)
        assert [r.uri for r in listed.resources] == ["field://agent"]
        templates = await asyncio.wait_for(session.list_resource_templates(), HANG_GUARD)
        assert {t.uri_template for t in templates.resource_templates} == {
            "field://units/{id}",
            "field://conflicts/{id}",
            "field://tasks/{id}",
            "field://subscriptions/{id}",
        }
        assert (await read(session, "field://agent"))["agent"]["id"] == "t-gus"
        mine = await ok(
            session,
            "akashik_record",
            **finding("Churn is 2% a month.", confidence={"score": 0.9, "reasoning": "billing"}),
        )
        unit_uri = f"field://units/{mine['memory_unit_id']}"
        unit = (await read(session, unit_uri))["memory_unit"]
        assert unit["content"] == "Churn is 2% a month." and unit["status"] == "active"
        await subscribe(session, unit_uri)
        relation = {"type": "contradicts", "target_id": mine["memory_unit_id"]}
        theirs = await record(hal, "Churn is 5% a month.", relations=[relation])
        (conflict_id,) = theirs["conflicts_detected"]
        assert await updates.next() == unit_uri  # the unit is contested now
        assert (await read(session, unit_uri))["memory_unit"]["status"] == "contested"
        conflict = (await read(session, f"field://conflicts/{conflict_id}"))["conflict"]
        assert {conflict["unit_a"], conflict["unit_b"]} == {
            mine["memory_unit_id"],
            theirs["memory_unit_id"],
        }
        task = await ok(session, "akashik_coordinate", action="create", title="Reconcile")
        task_uri = f"field://tasks/{task['task']['id']}"
        assert (await read(session, task_uri))["task"]["status"] == "pending"
        async with mcp_session(field.url, hal.token) as theirs_only:  # in a closed session
            await ok(theirs_only, "akashik_session", action="create", name="Private")
            hidden = await ok(theirs_only, "akashik_record", **finding("Members only."))
            hidden_uri = f"field://units/{hidden['memory_unit_id']}"
            assert (await read(theirs_only, hidden_uri))["memory_unit"]["id"] in hidden_uri
        await unreadable(session, hidden_uri, "UNIT_NOT_FOUND")
        for uri, code in [
            ("field://units/mem-none", "UNIT_NOT_FOUND"),
            ("field://conflicts/conflict-none", "CONFLICT_NOT_FOUND"),
            ("field://tasks/task-none", "TASK_NOT_FOUND"),
            ("field://subscriptions/sub-none", "SUBSCRIPTION_NOT_FOUND"),
            ("field://nothing/here", "NOT_FOUND"),
            ("https://example.com/", "NOT_FOUND"),
            ("field://units/", "INVALID_PAYLOAD"),
        ]:
            await unreadable(session, uri, code)


async def mcp_latency_count(field: ServerProcess) -> int:
    """How many notifications a subscription resource's reads handed out, by /metrics."""
    async with aiohttp.ClientSession() as client, client.get(f"{field.url}/metrics") as response:
        text = await response.text()
    name = 'field_notification_latency_seconds_count{transport="mcp"}'
    counts = [line.split()[1] for line in text.splitlines() if line.startswith(name)]
    return int(float(counts[0])) if counts else 0


async def test_a_subscription_resource_pushes_and_reads_exactly_once(
    field: ServerProcess, http: FieldClient
) -> None:
    ivy, jon = await register(http, "t-ivy", "t-jon")
    updates = Updates()
    async with mcp_session(field.url, ivy.token, updates) as session:
        made = await ok(session, "akashik_subscribe", events=["memory.recorded"])
        assert_valid("subscribe.response", {k: v for k, v in made.items() if k != "resource"})
        uri = made["resource"]
        assert uri == f"field://subscriptions/{made['subscription_id']}"
        listed = await asyncio.wait_for(session.list_resources(), HANG_GUARD)
        assert uri in [r.uri for r in listed.resources]
        # made in this session: what it owes counts from its creation, before any read
        early = await record(jon, "Recorded before the first read.")
        await subscribe(session, uri)
        assert await updates.next() == uri
        timed = await mcp_latency_count(field)
        page = await read(session, uri)
        assert [n["memory_unit_id"] for n in page["notifications"]] == [early["memory_unit_id"]]
        assert page["more"] is False and page["ended"] is None
        # its latency ends with the read that hands it out
        assert await mcp_latency_count(field) == timed + 1
        new = await record(jon, "Churn fell to 2%.")
        assert await updates.next() == uri
        page = await read(session, uri)
        (notification,) = page["notifications"]
        assert notification["memory_unit_id"] == new["memory_unit_id"]
        assert notification["event"] == "memory.recorded" and notification["agent_id"] == "t-jon"
        assert page["cursor"] == notification["cursor"] and page["more"] is False
        assert (await read(session, uri))["notifications"] == []  # each notification once

        # two updates in a row are one until the session reads
        first = await record(jon, "One.")
        second = await record(jon, "Two.")
        assert await updates.next() == uri
        page = await read(session, uri)
        got = [n["memory_unit_id"] for n in page["notifications"]]
        if len(got) == 1:  # the second came after the read: it is told anew
            assert await updates.next() == uri
            got += [n["memory_unit_id"] for n in (await read(session, uri))["notifications"]]
        assert got == [first["memory_unit_id"], second["memory_unit_id"]]
        assert updates.uris.empty()

        # resources/unsubscribe stops the updates: a second subscription, still subscribed,
        # is told of the same RECORD; the first's update would have come before it
        other = await ok(session, "akashik_subscribe", events=["memory.recorded"])
        await subscribe(session, other["resource"])
        await unsubscribe(session, uri)
        quiet = await record(jon, "Nobody is told of this one on the first.")
        assert await updates.next() == other["resource"]
        assert updates.uris.empty()
        # ... yet the notification is owed, and read
        page = await read(session, uri)
        assert [n["memory_unit_id"] for n in page["notifications"]] == [quiet["memory_unit_id"]]

        # a subscription that ends says so, once what it owed is read
        ended = made["subscription_id"]
        await ok(session, "akashik_subscribe", action="unsubscribe", subscription_id=ended)
        page = await read(session, uri)
        assert page["ended"]["reason"] == "subscription cancelled" and page["more"] is False


async def test_a_large_backlog_is_read_in_pages(field: ServerProcess, http: FieldClient) -> None:
    kim, lou = await register(http, "t-kim", "t-lou")
    async with mcp_session(field.url, kim.token) as session:
        made = await ok(session, "akashik_subscribe", events=["memory.recorded"])
        recorded = await asyncio.gather(*(record(lou, f"Unit {i}.") for i in range(130)))
        # two reads at once: one after the other, each notification in one of them
        both = await asyncio.gather(*(read(session, made["resource"]) for _ in range(2)))
        pages = sorted(([p["notifications"] for p in both]), key=len, reverse=True)
        assert len(pages[0]) == 100  # a page at most
        more = any(p["more"] for p in both)
        while more:
            page = await read(session, made["resource"])
            pages.append(page["notifications"])
            more = page["more"]
        read_ids = [n["memory_unit_id"] for p in pages for n in p]
        assert sorted(read_ids) == sorted(r["memory_unit_id"] for r in recorded)
        positions = [int(n["cursor"].rpartition("-")[2]) for p in pages for n in p]
        assert positions == sorted(set(positions))  # in log order (by page), each once


# -- bounds ----------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def small(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServerProcess]:
    """A server of small bounds: bodies of 4 KB, 2 sessions, one push connection (and so one
    session) per agent, outboxes of 8 frames."""
    server = spawn_server(
        tmp_path_factory.mktemp("mcp-bounds"),
        "--max-body-bytes=4096",
        "--mcp-max-sessions=2",
        "--max-push-per-agent=1",
        "--outbox-frames=8",
    )
    yield server
    server.stop()


async def test_bodies_and_sessions_are_bounded(small: ServerProcess) -> None:
    async with FieldClient(small.url) as client:
        ann, cal, dee = await register(client, "ann", "cal", "dee")
    headers = {
        "Authorization": f"Bearer {ann.token}",
        "Content-Type": "application/json",
        "Accept": ACCEPT,
    }
    big = json.dumps(tools_call("akashik_record", **finding("x" * 5000))).encode()

    async def chunked() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 1000):
            yield big[start : start + 1000]

    async with aiohttp.ClientSession() as raw:  # kept alive, as clients keep connections
        for data in (big, chunked()):
            async with raw.post(f"{small.url}/mcp", data=data, headers=headers) as refused:
                body = await refused.json()
                assert refused.status == 413 and body["code"] == "PAYLOAD_TOO_LARGE"
                assert_valid("error", body)

    ids: list[str] = []
    async with mcp_session(small.url, ann.token, ids=ids):
        # one session per agent here: a second one is refused, with the Field's error body
        status, body, _ = await post(small.url, initialize_message(), headers)
        assert status == 429 and body["code"] == "TOO_MANY_CONNECTIONS"
        assert_valid("error", body)
        # two sessions in all: the third is refused
        async with mcp_session(small.url, cal.token):
            dee_headers = {**headers, "Authorization": f"Bearer {dee.token}"}
            status, body, answered = await post(small.url, initialize_message(), dee_headers)
            assert status == 503 and body["code"] == "OVERLOADED" and answered["Retry-After"]
    # the session ended (its DELETE answered): the agent may open another
    async with mcp_session(small.url, ann.token, ids=ids) as session:
        assert len(ids) == 2 and ids[0] != ids[1]
        await ok(session, "akashik_attune")


async def test_a_feed_is_a_bounded_push_connection(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """One push connection per agent, outboxes of 8 frames."""
    server = spawn_server(
        tmp_path_factory.mktemp("mcp-feeds"), "--max-push-per-agent=1", "--outbox-frames=8"
    )
    try:
        async with FieldClient(server.url) as client:
            eve, fox = await register(client, "eve", "fox")
            await feeds_bounded(server.url, eve, fox)
    finally:
        server.stop()
    # the outbox did overflow (and the reads got every notification all the same)
    assert any("closing a slow mcp consumer of agent eve" in line for line in server.lines)


async def feeds_bounded(url: str, eve: AgentClient, fox: AgentClient) -> None:
    async with mcp_session(url, eve.token) as session:
        first = await ok(session, "akashik_subscribe", events=["memory.recorded"])
        second = await ok(session, "akashik_subscribe", events=["memory.recorded"])
        assert (await read(session, first["resource"]))["notifications"] == []
        # the feed is a push connection of the agent: the second does not fit
        body = await unreadable(session, second["resource"], "TOO_MANY_CONNECTIONS")
        assert body["recoverable"] is True

        # 20 notifications overflow an outbox of 8: read again from the log, each once
        recorded = [await record(fox, f"Unit {i}.") for i in range(20)]
        pages = []
        more = True
        while more:
            page = await read(session, first["resource"])
            pages.extend(page["notifications"])
            more = page["more"]
        assert [n["memory_unit_id"] for n in pages] == [r["memory_unit_id"] for r in recorded]
    # the session ended (its DELETE answered): its push connection is released, so the
    # agent's next session reads where the Field has it, from the moment it first reads
    async with mcp_session(url, eve.token) as session:
        assert (await read(session, second["resource"]))["notifications"] == []
        late = await record(fox, "After the first session.")
        page = await read(session, second["resource"])
        assert [n["memory_unit_id"] for n in page["notifications"]] == [late["memory_unit_id"]]


async def logged(server: ServerProcess, text: str) -> float:
    """Wait for a line of the server's log that holds ``text`` (it tells no client); the
    time it was seen, on the monotonic clock."""
    async with asyncio.timeout(HANG_GUARD):
        while not any(text in line for line in server.lines):
            await asyncio.sleep(0.02)
    return time.monotonic()


def raw_headers(agent: AgentClient | str) -> dict[str, str]:
    token = agent if isinstance(agent, str) else agent.token
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": ACCEPT,
    }


async def test_an_idle_session_expires(tmp_path_factory: pytest.TempPathFactory) -> None:
    idle = 0.5
    server = spawn_server(tmp_path_factory.mktemp("mcp-idle"), f"--mcp-idle-timeout={idle}")
    try:
        async with FieldClient(server.url) as client:
            (eli,) = await register(client, "eli")
        session = await open_raw(server.url, raw_headers(eli))
        status, body, _ = await post(server.url, tools_call("akashik_attune"), session)
        assert status == 200 and body["result"]["isError"] is False
        answered = time.monotonic()
        # no request in flight, no stream: it ends once the idle timeout has passed
        ended = await logged(server, "MCP session of agent eli expired")
        assert ended - answered > idle / 2
        status, body, _ = await post(server.url, tools_call("akashik_attune"), session)
        assert status == 404 and body["code"] == "NOT_FOUND"
    finally:
        server.stop()


async def test_sessions_are_bounded_by_default() -> None:
    """An idle session ends after a minute; one address holds a tenth of the sessions."""
    config = Config()
    assert config.mcp_idle_timeout == 60
    assert config.mcp_max_sessions_per_client * 10 == config.mcp_max_sessions


async def test_one_client_address_cannot_take_every_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    server = spawn_server(
        tmp_path_factory.mktemp("mcp-per-client"),
        "--mcp-max-sessions=3",
        "--mcp-max-sessions-per-client=2",
    )
    try:
        async with FieldClient(server.url) as client:
            agents = await register(client, *(f"hoarder-{n}" for n in range(4)))
        for agent in agents[:2]:  # left behind, never used again
            await open_raw(server.url, raw_headers(agent))
        third = raw_headers(agents[2])
        status, body, _ = await post(server.url, initialize_message(), third)
        assert status == 429 and body["code"] == "TOO_MANY_CONNECTIONS", body
        assert_valid("error", body)
        assert "client address" in body["message"] and body["recoverable"] is True
        # another address has room, until the Field's own bound
        await open_raw(server.url, third, local="127.0.0.2")
        status, body, answered = await post(
            server.url, initialize_message(), raw_headers(agents[3]), "127.0.0.3"
        )
        assert status == 503 and body["code"] == "OVERLOADED" and answered["Retry-After"]
    finally:
        server.stop()


async def test_the_operator_is_never_locked_out(tmp_path_factory: pytest.TempPathFactory) -> None:
    directory = tmp_path_factory.mktemp("mcp-operator")
    operator = "operator-token-of-the-test"
    (directory / "operator").write_text(operator)
    server = spawn_server(
        directory / "data",
        f"--operator-token-file={directory / 'operator'}",
        "--mcp-max-sessions=1",
    )
    try:
        async with FieldClient(server.url) as client:
            ada, bea = await register(client, "locker-ada", "locker-bea")
        await open_raw(server.url, raw_headers(ada))  # every session the Field allows
        for local in ("127.0.0.1", "127.0.0.2"):
            status, body, _ = await post(server.url, initialize_message(), raw_headers(bea), local)
            assert status == 503 and body["code"] == "OVERLOADED", body
        async with (
            mcp_session(server.url, operator) as first,
            mcp_session(server.url, operator) as second,
        ):
            for session in (first, second):
                listed = await asyncio.wait_for(session.list_tools(), HANG_GUARD)
                assert "akashik_attune" in {tool.name for tool in listed.tools}
    finally:
        server.stop()


async def test_a_session_left_behind_makes_room_for_its_agent(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """One session per agent; a session idle for half the idle timeout (2 s here) is ended
    to make room for the agent's new one, a session with a stream open never."""
    idle = 4.0
    server = spawn_server(
        tmp_path_factory.mktemp("mcp-room"), "--max-push-per-agent=1", f"--mcp-idle-timeout={idle}"
    )
    try:
        async with FieldClient(server.url) as client:
            (cy,) = await register(client, "room-cy")
        headers = raw_headers(cy)
        left = await open_raw(server.url, headers)
        opened = time.monotonic()
        # just used: it may be a client between two requests, so it is kept
        status, body, _ = await post(server.url, initialize_message(), headers)
        assert status == 429 and body["code"] == "TOO_MANY_CONNECTIONS", body
        assert "DELETE" in body["suggested_action"]
        async with asyncio.timeout(idle):  # then it makes room, before it would expire
            while status != 200:
                await asyncio.sleep(0.1)
                status, body, answered = await post(server.url, initialize_message(), headers)
        assert time.monotonic() - opened >= idle / 2
        await logged(server, "an idle MCP session of agent room-cy ended to make room")
        status, body, _ = await post(server.url, tools_call("akashik_attune"), left)
        assert status == 404 and body["code"] == "NOT_FOUND"
        listening = {**headers, "Mcp-Session-Id": answered["Mcp-Session-Id"]}
        listening["Accept"] = "text/event-stream"
        async with (
            aiohttp.ClientSession() as raw,
            raw.get(f"{server.url}/mcp", headers=listening) as stream,
        ):
            assert stream.status == 200
            # a session with an open stream is in use however long: no new one ends it
            await asyncio.sleep(idle / 2 + 0.5)
            status, body, _ = await post(server.url, initialize_message(), headers)
            assert status == 429 and body["code"] == "TOO_MANY_CONNECTIONS", body
    finally:
        server.stop()


@pytest.mark.asyncio(loop_scope="function")
async def test_the_bounds_are_checked_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in (
        "--mcp-max-sessions=0",
        "--mcp-max-sessions-per-client=0",
        "--mcp-idle-timeout=0",
        "--mcp-idle-timeout=nan",
    ):
        assert main(["serve", "--in-memory", flag]) == 2
        assert "mcp_" in capsys.readouterr().err
