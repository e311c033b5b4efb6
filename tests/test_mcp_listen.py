"""MCP 2026-07-28 at ``/mcp`` of ``field serve``: ``subscriptions/listen``, end to end.

``field serve`` runs as a real process; the tests speak to it with the MCP SDK's own
client on the per-request protocol (``Client(..., mode="2026-07-28")``: no initialize,
no session), whose ``listen()`` opens the stream, waits for its acknowledgement and
yields the ``notifications/resources/updated`` it carries. Notifications are awaited,
never slept for. What MCP leaves out (a dropped stream's missed notifications are not
replayed) the Field makes up for: the subscription resource keeps its cursor, and a
read names the cursor to start after across a restart of the Field.

``field mcp`` runs as a real subprocess too, spoken to over stdio with the SDK's
``stdio_client`` on both revisions: the resources and push it relays from ``/mcp``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import Client, ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ResourceUpdated, Subscription, SubscriptionLost
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from field.client import AgentClient, FieldClient

from .conftest import ServerProcess, spawn_server
from .schema_util import assert_valid
from .test_mcp_http import Updates

HANG_GUARD = 60  # seconds; only ever reached when something hangs
MODERN = "2026-07-28"

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.slow]


@asynccontextmanager
async def modern_client(url: str, token: str, mode: str = MODERN) -> AsyncIterator[Client]:
    """The SDK's client of ``/mcp`` on the 2026-07-28 protocol, as the agent of ``token``
    (``mode`` "auto": found by ``server/discover``, as a client that knows nothing does)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=HANG_GUARD) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as client,
    ):
        assert client.protocol_version == MODERN
        yield client


async def ok(client: Client, tool: str, /, **arguments: Any) -> Any:
    result = await asyncio.wait_for(client.call_tool(tool, arguments), HANG_GUARD)
    (content,) = result.content
    assert isinstance(content, types.TextContent) and not result.is_error, content
    return json.loads(content.text)


async def read(client: Client, uri: str) -> Any:
    result = await asyncio.wait_for(client.read_resource(uri), HANG_GUARD)
    (content,) = result.contents
    assert isinstance(content, types.TextResourceContents)
    return json.loads(content.text)


async def read_all(client: Client, uri: str) -> tuple[list[str], str | None]:
    """Read ``uri`` while ``more``: the memory unit ids notified, and the last cursor."""
    ids: list[str] = []
    more = True
    cursor = None
    while more:
        page = await read(client, uri)
        ids.extend(n["memory_unit_id"] for n in page["notifications"])
        more, cursor = page["more"], page["cursor"]
        uri = uri.partition("?")[0]
    return ids, cursor


async def updated(stream: Subscription) -> str:
    event = await asyncio.wait_for(anext(stream), HANG_GUARD)
    assert isinstance(event, ResourceUpdated)
    return event.uri


async def record(agent: AgentClient, content: str, **extra: Any) -> str:
    """RECORD over the HTTP binding, as another client of the Field would: its unit id."""
    recorded = await agent.send(
        "RECORD",
        {
            "type": "finding",
            "content": content,
            "intent": {"purpose": "test MCP listen"},
            "confidence": {"score": 0.8, "reasoning": "made up for the test"},
            **extra,
        },
    )
    unit_id: str = recorded["memory_unit_id"]
    return unit_id


async def test_listen_across_a_restart_misses_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data = tmp_path_factory.mktemp("mcp-listen")
    server = spawn_server(data)
    try:
        async with FieldClient(server.url) as http:
            ada = await http.register("listen-ada", "analyst")
            bo = await http.register("listen-bo", "analyst")
            async with modern_client(server.url, ada.token) as client:
                made = await ok(client, "akashik_subscribe", events=["memory.recorded"])
                uri = made["resource"]
                async with client.listen(resource_subscriptions=[uri]) as stream:
                    assert stream.honored.resource_subscriptions == [uri]
                    first = await record(bo, "Churn fell to 2%.")
                    assert await updated(stream) == uri
                    ids, cursor = await read_all(client, uri)
                    assert ids == [first] and cursor
                    # recorded, told of, never read: then the Field is killed
                    missed = [await record(bo, f"Unread {n}.") for n in range(3)]
                    assert await updated(stream) == uri
                    server.stop(signal.SIGKILL)
                    with pytest.raises(SubscriptionLost):
                        await asyncio.wait_for(anext(stream), HANG_GUARD)
        server = spawn_server(data)
        async with FieldClient(server.url) as http:
            bo = http.agent("listen-bo", bo.token)
            async with (
                modern_client(server.url, ada.token) as client,
                client.listen(resource_subscriptions=[uri]) as stream,
            ):
                # listening again, read once from the last cursor read: what was missed
                ids, cursor = await read_all(client, f"{uri}?since={cursor}")
                assert ids == missed
                later = await record(bo, "After the restart.")
                assert await updated(stream) == uri
                assert (await read_all(client, uri))[0] == [later]
    finally:
        server.stop(signal.SIGKILL)


async def test_a_dropped_stream_loses_nothing_and_a_stop_ends_it_gracefully(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Outside a session a subscription resource is the agent's: its cursor outlives the
    stream that told of it. Stopping the Field ends every stream with its result."""
    server = spawn_server(tmp_path_factory.mktemp("mcp-listen-drop"))
    try:
        async with FieldClient(server.url) as http:
            cy = await http.register("drop-cy", "analyst")
            di = await http.register("drop-di", "analyst")
            async with modern_client(server.url, cy.token) as client:
                made = await ok(client, "akashik_subscribe", events=["memory.recorded"])
                uri = made["resource"]
                async with client.listen(resource_subscriptions=[uri]) as stream:
                    first = await record(di, "Told of, then dropped.")
                    assert await updated(stream) == uri
                # the stream is gone before its update was read: listening again tells
                # of it again, and the read returns it
                second = await record(di, "While nobody listened.")
                unit = f"field://units/{first}"
                async with client.listen(resource_subscriptions=[uri, unit]) as again:
                    assert await updated(again) == uri
                    assert (await read_all(client, uri))[0] == [first, second]
                    # an entity resource: told when a log entry is about it (contested)
                    relation = {"type": "contradicts", "target_id": first}
                    third = await record(di, "Contradicts the first.", relations=[relation])
                    assert {await updated(again), await updated(again)} == {uri, unit}
                    assert (await read_all(client, uri))[0] == [third]
                    assert (await read(client, unit))["memory_unit"]["status"] == "contested"
                    # a stop ends the stream gracefully: its iteration ends, nothing lost
                    await asyncio.to_thread(server.stop)
                    rest = [event async for event in again]
                    assert all(isinstance(event, ResourceUpdated) for event in rest)
    finally:
        server.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A Field of one push connection per agent and a half-second idle timeout."""
    server = spawn_server(
        tmp_path_factory.mktemp("mcp-listen-small"),
        "--max-push-per-agent=1",
        "--mcp-idle-timeout=0.5",
    )
    yield server
    server.stop(signal.SIGKILL)


async def test_an_idle_agents_resources_let_go_of_their_connections_and_keep_cursors(
    small: ServerProcess,
) -> None:
    """One push connection per agent; a subscription resource read outside a session that
    no stream names lets go of its own once nobody read it for the idle timeout, and reads
    on from its cursor when read again. The Field tells no client when it lets go: that is
    polled for, with a deadline."""
    async with FieldClient(small.url) as http:
        ivy = await http.register("idle-ivy", "analyst")
        jo = await http.register("idle-jo", "analyst")
        async with modern_client(small.url, ivy.token) as client:
            first = (await ok(client, "akashik_subscribe", events=["memory.recorded"]))["resource"]
            second = (await ok(client, "akashik_subscribe", events=["memory.recorded"]))["resource"]
            assert (await read_all(client, first))[0] == []
            unread = await record(jo, "Recorded while ivy is away.")
            with pytest.raises(MCPError) as refused:  # the one connection is first's
                await read(client, second)
            assert refused.value.data["code"] == "TOO_MANY_CONNECTIONS"
            async with asyncio.timeout(HANG_GUARD):  # until first lets go of it
                while True:
                    try:
                        await read(client, second)
                        break
                    except MCPError as error:
                        assert error.data["code"] == "TOO_MANY_CONNECTIONS"
                        await asyncio.sleep(0.1)
            async with asyncio.timeout(HANG_GUARD):  # until second lets go of it
                while True:
                    try:
                        ids, _ = await read_all(client, first)
                        break
                    except MCPError as error:
                        assert error.data["code"] == "TOO_MANY_CONNECTIONS"
                        await asyncio.sleep(0.1)
            assert ids == [unread]  # from its cursor: nothing lost, nothing twice


async def test_listings_carry_freshness_hints_and_listen_refuses_what_it_cannot_see(
    small: ServerProcess,
) -> None:
    async with FieldClient(small.url) as http:
        eve = await http.register("hint-eve", "analyst")
        fox = await http.register("hint-fox", "analyst")
        async with modern_client(small.url, fox.token) as other:
            theirs = (await ok(other, "akashik_subscribe", events=["memory.recorded"]))["resource"]
        async with modern_client(small.url, eve.token, "auto") as client:
            assert client.server_capabilities.resources is not None
            assert client.server_capabilities.resources.subscribe
            tools = await asyncio.wait_for(client.list_tools(), HANG_GUARD)
            assert tools.ttl_ms == 300_000 and tools.cache_scope == "public"
            assert tools.result_type == "complete"
            listed = await asyncio.wait_for(client.list_resources(), HANG_GUARD)
            assert listed.ttl_ms == 0 and listed.cache_scope == "private"
            assert "field://agent" in [str(r.uri) for r in listed.resources]
            for uri, code in ((theirs, "FORBIDDEN"), ("field://units/nope", "UNIT_NOT_FOUND")):
                with pytest.raises(MCPError) as refused:
                    async with client.listen(resource_subscriptions=[uri]):
                        pass
                assert_valid("error", refused.value.data)
                assert refused.value.data["code"] == code


# -- field mcp, over stdio ---------------------------------------------------------------


def bridge_params(url: str, agent: AgentClient) -> StdioServerParameters:
    """``field mcp`` acting for ``agent`` (its token in the environment)."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "field", "mcp", "--url", url, "--agent-id", agent.id],
        env={**os.environ, "FIELD_TOKEN": agent.token, "PYTHONUNBUFFERED": "1"},
    )


async def subscription(agent: AgentClient) -> str:
    """A subscription of ``agent`` made over HTTP: its resource's URI."""
    made = await agent.send(
        "SUBSCRIBE", {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}}
    )
    return f"field://subscriptions/{made['subscription_id']}"


async def test_field_mcp_relays_resources_and_push_on_both_revisions(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data = tmp_path_factory.mktemp("mcp-stdio")
    server = spawn_server(data)
    try:
        async with FieldClient(server.url) as http:
            gus = await http.register("stdio-gus", "analyst")
            hal = await http.register("stdio-hal", "analyst")
            uri = await subscription(gus)
            params = bridge_params(server.url, gus)
            # MCP 2025-11-25: initialize, resources/subscribe, notifications/resources/updated
            updates = Updates()
            with open(os.devnull, "w") as quiet:
                async with (
                    stdio_client(params, errlog=quiet) as (reader, writer),
                    ClientSession(reader, writer, message_handler=updates) as session,
                ):
                    init = await asyncio.wait_for(session.initialize(), HANG_GUARD)
                    assert init.capabilities.resources is not None
                    assert init.capabilities.resources.subscribe
                    listed = await asyncio.wait_for(session.list_resources(), HANG_GUARD)
                    assert {"field://agent", uri} <= {str(r.uri) for r in listed.resources}
                    templates = await asyncio.wait_for(
                        session.list_resource_templates(), HANG_GUARD
                    )
                    assert "field://units/{id}" in [
                        t.uri_template for t in templates.resource_templates
                    ]
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", MCPDeprecationWarning)
                        await asyncio.wait_for(session.subscribe_resource(uri), HANG_GUARD)
                    first = await record(hal, "Told over stdio.")
                    assert await updates.next() == uri
                    result = await asyncio.wait_for(session.read_resource(uri), HANG_GUARD)
                    (content,) = result.contents
                    assert isinstance(content, types.TextResourceContents)
                    page = json.loads(content.text)
                    assert [n["memory_unit_id"] for n in page["notifications"]] == [first]
                    # told of, not read, and the Field is killed: field mcp listens again
                    # once it is back, says so, and the read starts after the last cursor
                    missed = [await record(hal, f"Unread {n}.") for n in range(2)]
                    assert await updates.next() == uri
                    server.stop(signal.SIGKILL)
                    server = spawn_server(data, port=int(server.url.rsplit(":", 1)[1]))
                    assert await updates.next() == uri
                    result = await asyncio.wait_for(session.read_resource(uri), HANG_GUARD)
                    (content,) = result.contents
                    assert isinstance(content, types.TextResourceContents)
                    page = json.loads(content.text)
                    assert [n["memory_unit_id"] for n in page["notifications"]] == missed
                    with pytest.raises(MCPError) as refused:
                        await asyncio.wait_for(
                            session.read_resource("field://units/nope"), HANG_GUARD
                        )
                    assert refused.value.data["code"] == "UNIT_NOT_FOUND"
            # MCP 2026-07-28: no initialize; subscriptions/listen
            with open(os.devnull, "w") as quiet:
                async with (
                    Client(stdio_client(params, errlog=quiet), mode=MODERN) as client,
                    client.listen(resource_subscriptions=[uri]) as stream,
                ):
                    assert stream.honored.resource_subscriptions == [uri]
                    tools = await asyncio.wait_for(client.list_tools(), HANG_GUARD)
                    assert "akashik_record" in [tool.name for tool in tools.tools]
                    listed = await asyncio.wait_for(client.list_resources(), HANG_GUARD)
                    assert listed.ttl_ms == 0 and listed.cache_scope == "private"
                    second = await record(hal, "Told over stdio, listening.")
                    assert await updated(stream) == uri
                    assert (await read_all(client, uri))[0] == [second]
    finally:
        server.stop(signal.SIGKILL)


async def test_listen_streams_are_bounded_per_agent_and_by_what_they_name(
    small: ServerProcess,
) -> None:
    async with FieldClient(small.url) as http:
        ann = await http.register("bound-ann", "analyst")
        async with modern_client(small.url, ann.token) as client:
            with pytest.raises(MCPError) as refused:
                names = [
                    f"field://units/mem-{n}" for n in range(257)
                ]  # counted before they are read
                async with client.listen(resource_subscriptions=names):
                    pass
            assert_valid("error", refused.value.data)
            assert refused.value.data["code"] == "SUBSCRIPTION_LIMIT"
            async with client.listen(resource_subscriptions=["field://agent"]):
                with pytest.raises(MCPError) as refused:  # its one push connection is taken
                    async with client.listen(resource_subscriptions=["field://agent"]):
                        pass
                assert_valid("error", refused.value.data)
                assert refused.value.data["code"] == "TOO_MANY_CONNECTIONS"
                assert "1 listen streams" in refused.value.data["message"]


async def test_a_cancelled_subscription_resource_lets_go_of_its_connection(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Outside a session, an agent's subscription resource holds a push connection while it
    is read. Once its subscription is cancelled, the next read says it ended and lets the
    connection go, at once (not after the idle timeout, here the default: a minute)."""
    server = spawn_server(tmp_path_factory.mktemp("mcp-cancel"), "--max-push-per-agent=1")
    try:
        async with FieldClient(server.url) as http:
            kay = await http.register("cancel-kay", "analyst")
            async with modern_client(server.url, kay.token) as client:
                made = await ok(client, "akashik_subscribe", events=["memory.recorded"])
                second = (await ok(client, "akashik_subscribe", events=["memory.recorded"]))[
                    "resource"
                ]
                assert (await read_all(client, made["resource"]))[0] == []
                with pytest.raises(MCPError) as refused:  # the one connection is the first's
                    await read(client, second)
                assert refused.value.data["code"] == "TOO_MANY_CONNECTIONS"
                await kay.send(
                    "SUBSCRIBE",
                    {"action": "unsubscribe", "subscription": {"id": made["subscription_id"]}},
                )
                page = await read(client, made["resource"])
                assert page["ended"]["reason"] == "subscription cancelled"
                assert (await read_all(client, second))[0] == []
    finally:
        server.stop(signal.SIGKILL)


async def test_a_read_names_only_a_cursor_of_this_field_to_start_after(
    small: ServerProcess,
) -> None:
    async with FieldClient(small.url) as http:
        lee = await http.register("since-lee", "analyst")
        max_ = await http.register("since-max", "analyst")
        async with modern_client(small.url, lee.token) as client:
            uri = (await ok(client, "akashik_subscribe", events=["memory.recorded"]))["resource"]
            for query in ("?other=1", "?since=", "?since=a&since=b", "?since=a&other=1"):
                with pytest.raises(MCPError) as refused:
                    await read(client, uri + query)
                assert_valid("error", refused.value.data)
                assert refused.value.data["code"] == "INVALID_PAYLOAD", query
            start = await read(client, uri)  # its cursor: the subscription's start
            other_field = "field-0000000000000000000-" + start["cursor"].rpartition("-")[2]
            for cursor in ("not-a-cursor", other_field, "x" * 65):
                with pytest.raises(MCPError) as refused:
                    await read(client, f"{uri}?since={cursor}")
                assert_valid("error", refused.value.data)
                assert refused.value.data["code"] == "INVALID_PAYLOAD", cursor
            # nothing changed: the feed reads on from where it was
            unit = await record(max_, "Recorded after the refused reads.")
            ids, cursor = await read_all(client, uri)
            assert ids == [unit] and cursor != start["cursor"]
