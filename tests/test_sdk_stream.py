"""``AgentClient.notifications()``: the SDK's push stream, against real servers.

Every wait is on a notification with a bounded timeout that only guards
against a hang. Where a test says nothing was repeated, it proves it with a
sentinel: a stream is in cursor order, so once a later notification has
arrived, an earlier duplicate never will.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import signal
import stat
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from field.client import (
    AgentClient,
    Disconnected,
    Ended,
    FieldClient,
    FieldClientError,
    Gap,
    Notification,
    NotificationGap,
    Overflow,
    Reconnect,
    StreamUnavailable,
    Subscription,
)
from field.client.sse import SSEError, SSEEvent, SSEParser
from field.engine.router import PushLimits

from .conftest import ServerProcess, ThreadedServer

#: Failure guard for one awaited notification (never a pacing delay).
TIMEOUT = 10.0
#: Reconnect quickly in tests (the defaults are for a Field that takes its time).
QUICK = Reconnect(initial=0.05, maximum=0.5)

T = TypeVar("T")


async def take(stream: AsyncIterator[T], count: int, timeout: float = TIMEOUT) -> list[T]:
    """The next ``count`` items of ``stream``."""
    return [await asyncio.wait_for(anext(stream), timeout) for _ in range(count)]


async def write(agent: AgentClient, content: str) -> str:
    unit = await agent.record(
        "finding", content, purpose="share", confidence=0.7, reasoning="seen in the test"
    )
    return str(unit["memory_unit_id"])


def units(notifications: list[Any]) -> list[str]:
    return [n.memory_unit_id for n in notifications if isinstance(n, Notification)]


async def two_agents(field: FieldClient) -> tuple[AgentClient, AgentClient]:
    writer = await field.register("writer", "analyst", interests=["market"])
    reader = await field.register("reader", "researcher", interests=["market"])
    return writer, reader


# -- the iterator ---------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_stream_delivers_from_the_subscription_on_exactly_once(
    field_server: ThreadedServer, transport: Any
) -> None:
    async with FieldClient(field_server.url) as field:
        writer, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        # written after SUBSCRIBE and before the stream connects: not missed
        early = [await write(writer, f"market note {i}") for i in range(3)]
        async with reader.notifications(news, transport=transport) as stream:
            got = await take(stream, 3)
            assert units(got) == early
            later = [await write(writer, f"market later {i}") for i in range(2)]
            more = await take(stream, 2)
            assert units(more) == later
            assert all(isinstance(n, Notification) and n.event == "memory.recorded" for n in more)
            assert stream.cursors == {news.id: more[-1].cursor}
            assert reader.epoch >= more[-1].epoch  # the agent's clock saw it
            sentinel = await write(writer, "market sentinel")
            assert units(await take(stream, 1)) == [sentinel]  # nothing came twice


async def test_a_websocket_stream_follows_every_subscription_of_the_agent(
    field_server: ThreadedServer,
) -> None:
    async with FieldClient(field_server.url) as field:
        writer, reader = await two_agents(field)
        memory = await reader.subscribe(["memory.recorded"])
        agents = await reader.subscribe(["agent.joined"])
        async with reader.notifications() as stream:
            unit = await write(writer, "market size")
            await field.register("newcomer", "researcher", interests=["market"])
            # both are replayed from the subscriptions' creation (the stream connects on the
            # first read), each in its own order: sort them
            got = sorted(await take(stream, 2), key=lambda n: n.event, reverse=True)
        assert [(n.subscription_id, n.event) for n in got] == [
            (memory.id, "memory.recorded"),
            (agents.id, "agent.joined"),
        ]
        assert got[0].memory_unit_id == unit and got[1].entity.id == "newcomer"


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_cursor_the_field_cannot_honour_raises_a_gap_and_the_stream_goes_on(
    server_factory: Callable[..., ThreadedServer], transport: Any
) -> None:
    here, elsewhere = server_factory(), server_factory()
    async with FieldClient(here.url) as field, FieldClient(elsewhere.url) as other:
        foreign = (await (await other.register("x", "y")).subscribe(["agent.joined"])).cursor
        writer, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        stream = reader.notifications(news, since={news.id: foreign}, transport=transport)
        async with stream:
            with pytest.raises(NotificationGap) as raised:
                await asyncio.wait_for(anext(stream), TIMEOUT)
            gap = raised.value.gap
            assert (gap.subscription_id, gap.last_cursor, gap.last_epoch) == (news.id, foreign, 0)
            assert "belongs to another Field" in gap.reason
            assert stream.cursors[news.id] == gap.resumed_from
            unit = await write(writer, "market after the gap")
            assert units(await take(stream, 1)) == [unit]  # live from there

        # with control=True the gap is an event, not an exception
        async with reader.notifications(
            news, since=foreign, transport=transport, control=True
        ) as s:
            first = await take(s, 1)
            assert isinstance(first[0], Gap) and first[0].kind == "gap"
            unit = await write(writer, "market again")
            assert units(await take(s, 1)) == [unit]


async def test_an_overflow_is_seen_and_nothing_is_lost(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    # the Field writes this agent 20 notifications a second and queues 8: a burst of writes
    # overflows its outbox, and the Field cuts the connection (overflow, 4008)
    server = server_factory(notify_rate=20, notify_burst=1, push=PushLimits(outbox_frames=8))
    async with FieldClient(server.url) as field:
        writer, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        async with reader.notifications(news, control=True, reconnect=QUICK) as stream:
            warm = await write(writer, "market warm-up")
            assert units(await take(stream, 1)) == [warm]  # connected and live
            burst = [await write(writer, f"market burst {i}") for i in range(60)]
            events: list[Any] = []
            while len(units(events)) < len(burst):
                events.extend(await take(stream, 1, timeout=30))
        overflows = [e for e in events if isinstance(e, Overflow)]
        assert overflows and overflows[0].kind == "overflow" and overflows[0].reason
        assert overflows[0].cursors[news.id]
        assert units(events) == burst  # each once, in order, across the reconnection
        assert stream.overflows == overflows


async def test_the_default_stream_handles_an_overflow_quietly(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory(notify_rate=20, notify_burst=1, push=PushLimits(outbox_frames=8))
    async with FieldClient(server.url) as field:
        writer, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        async with reader.notifications(news, transport="sse", reconnect=QUICK) as stream:
            warm = await write(writer, "market warm-up")
            assert units(await take(stream, 1)) == [warm]
            burst = [await write(writer, f"market burst {i}") for i in range(60)]
            got = await take(stream, len(burst), timeout=30)
        assert units(got) == burst
        assert stream.overflows  # seen, though not yielded


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_refused_token_raises_at_once(field_server: ThreadedServer, transport: Any) -> None:
    async with FieldClient(field_server.url) as field:
        _, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        impostor = field.agent("reader", "not-a-token-of-this-field", role="researcher")
        subscriptions = [news] if transport == "sse" else []  # a WebSocket follows them all
        stream = impostor.notifications(*subscriptions, transport=transport, reconnect=QUICK)
        with pytest.raises(FieldClientError) as refused:
            await asyncio.wait_for(anext(stream), TIMEOUT)
        await stream.aclose()
    assert refused.value.status == 401 and refused.value.code == "UNAUTHENTICATED"


async def test_a_refused_sse_stream_leaves_no_garbage_cycle(field_server: ThreadedServer) -> None:
    """The refusal is freed when the caller drops it, not by the collector."""

    async def refusal(stream: AsyncIterator[Any]) -> weakref.ref[FieldClientError]:
        try:
            async with asyncio.timeout(TIMEOUT):
                await anext(stream)
        except FieldClientError as error:
            assert error.status == 401
            return weakref.ref(error)
        raise AssertionError("the stream was not refused")

    async with FieldClient(field_server.url) as field:
        _, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        impostor = field.agent("reader", "not-a-token-of-this-field", role="researcher")
        stream = impostor.notifications(news, transport="sse", reconnect=QUICK)
        gc.disable()
        try:
            freed = await refusal(stream)
            await stream.aclose()
            assert freed() is None
        finally:
            gc.enable()


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_stream_ends_after_what_its_cancelled_subscription_owed(
    field_server: ThreadedServer, transport: Any
) -> None:
    async with FieldClient(field_server.url) as field:
        writer, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        stream = reader.notifications(news, transport=transport)
        written = [await write(writer, "market 0")]
        assert units(await take(stream, 1)) == written  # connected
        written += [await write(writer, f"market {i}") for i in (1, 2)]
        await reader.unsubscribe(news)
        rest = [n async for n in stream]  # what it owed, then the stream ends by itself
        assert units(rest) == written[1:]
        assert stream.ended[news.id].subscription_id == news.id

        # one cancelled before the stream connects still owes what came after the cursor
        # the stream resumes from (here its creation's), then ends
        async with reader.notifications(
            news, since={news.id: news.cursor}, transport=transport, control=True
        ) as again:
            *owed, ended = [e async for e in again]
        assert units(owed) == written
        assert isinstance(ended, Ended) and ended.subscription_id == news.id
        assert "cancelled" in ended.reason

        # from the cursor of its last notification, or from no cursor, it owes nothing
        for since in ({news.id: rest[-1].cursor}, None):
            async with reader.notifications(
                news, since=since, transport=transport, control=True
            ) as after:
                (ended,) = [e async for e in after]
            assert isinstance(ended, Ended) and ended.subscription_id == news.id


async def test_a_stream_ends_when_its_agent_deregisters(field_server: ThreadedServer) -> None:
    async with FieldClient(field_server.url) as field:
        writer, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        stream = reader.notifications()
        unit = await write(writer, "market news")
        assert units(await take(stream, 1)) == [unit]
        await reader.deregister()
        rest = [n async for n in stream]
        assert rest == [] and news.id in stream.ended


async def test_a_stream_gives_up_only_when_told(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory()
    async with FieldClient(server.url) as field:
        writer, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        patience = Reconnect(initial=0.05, maximum=0.1, give_up_after=0.5)
        stream = reader.notifications(news, control=True, reconnect=patience)
        unit = await write(writer, "market news")
        assert units(await take(stream, 1)) == [unit]
        server.stop()  # and it never comes back
        seen: list[Any] = []
        with pytest.raises(StreamUnavailable) as gone:
            while True:
                seen.extend(await take(stream, 1))
        await stream.aclose()
    pauses = [e for e in seen if isinstance(e, Disconnected)]
    assert pauses and all(0 < p.retry_in <= 0.1 for p in pauses)
    assert [p.attempt for p in pauses] == list(range(1, len(pauses) + 1))
    assert gone.value.cursors == {news.id: stream.cursors[news.id]}
    assert isinstance(gone.value.__cause__, Exception)


async def test_a_connected_stream_keeps_its_agent_live(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory(heartbeat_timeout=1, failure_grace=1)
    async with FieldClient(server.url) as field:
        watcher = await field.register("watcher", "ops")
        watch = await watcher.subscribe(["agent.failed", "memory.recorded"])
        listener = await field.register("listener", "researcher")
        await listener.subscribe(["agent.joined"])
        async with (
            watcher.notifications(watch) as watching,
            listener.notifications() as listening,
        ):
            listened = asyncio.ensure_future(anext(listening))  # connects, then waits
            silent = await field.register("silent", "researcher")  # heard from after listener
            assert (await asyncio.wait_for(listened, TIMEOUT)).entity.id == "silent"
            failed: list[str] = []
            while "silent" not in failed:
                (event,) = await take(watching, 1)
                failed.append(event.entity.id)
            # every failure logged before this unit is notified before it
            sentinel = await write(silent, "I am back")
            while (event := (await take(watching, 1))[0]).memory_unit_id != sentinel:
                failed.append(event.entity.id)
            assert "listener" not in failed
            (record,) = (await watcher.agents(ids=["listener"]))["agents"]
            assert record["status"] != "failed"


# -- a program that starts again ----------------------------------------------------------------


async def test_a_named_subscription_and_a_cursor_file_give_each_event_once_per_event(
    sqlite_server: ThreadedServer, tmp_path: Path
) -> None:
    """Each "start" of the program is a new client: connect (its token kept), subscribe by
    name, stream with a cursor file. What happens while it is down arrives at the next start,
    once; a notification it failed on comes again."""
    token_file, cursor_file = tmp_path / "reader.token", tmp_path / "reader.cursors"
    url = sqlite_server.url

    async def start(field: FieldClient) -> tuple[AgentClient, Subscription]:
        me = await field.connect("reader", role="researcher", token_file=token_file)
        news = await me.subscribe(["memory.recorded"], name="news", min_relevance=0)
        return me, news

    async with FieldClient(url) as other:  # someone who keeps writing
        writer = await other.register("writer", "analyst")

        async with FieldClient(url) as field:
            me, first = await start(field)
            assert first.created is True and first.name == "news"
            async with me.notifications(first, cursor_file=cursor_file) as stream:
                seen = [await write(writer, "one"), await write(writer, "two")]
                assert units(await take(stream, 2)) == seen
        assert stat.S_IMODE(cursor_file.stat().st_mode) == 0o600

        missed = [await write(writer, "while down 1"), await write(writer, "while down 2")]
        async with FieldClient(url) as field:
            me, again = await start(field)
            assert (again.id, again.created, again.cursor) == (first.id, False, first.cursor)
            assert me.fresh_subscriptions == {}  # not new: it does not start from its creation
            with pytest.raises(RuntimeError):  # the program fails on the second one
                async with me.notifications(again, cursor_file=cursor_file) as stream:
                    assert units(await take(stream, 1)) == missed[:1]
                    assert units(await take(stream, 1)) == missed[1:]
                    raise RuntimeError("crashed while processing it")

        async with FieldClient(url) as field:
            me, third = await start(field)
            assert third.id == first.id
            async with me.notifications(third, cursor_file=cursor_file) as stream:
                # the one it failed on comes again; nothing before it does
                assert units(await take(stream, 1)) == missed[1:]
                sentinel = await write(writer, "live")
                assert units(await take(stream, 1)) == [sentinel]
            listed = await me.subscriptions()
            assert [s["id"] for s in listed["subscriptions"]] == [first.id]  # one, not three

            with pytest.raises(FieldClientError) as taken:  # same name, another definition
                await me.subscribe(["memory.recorded"], name="news", min_relevance=0.5)
            assert taken.value.status == 409 and taken.value.code == "SUBSCRIPTION_NAME_TAKEN"
            assert taken.value.body["details"]["subscription_id"] == first.id


async def test_with_a_cursor_file_a_subscription_never_read_starts_from_its_creation(
    field_server: ThreadedServer, tmp_path: Path
) -> None:
    async with FieldClient(field_server.url) as field:
        writer, reader = await two_agents(field)
        await reader.subscribe(["memory.recorded"], name="news")
        owed = [await write(writer, "market a"), await write(writer, "market b")]
        # the program stopped before it read anything; it starts again (a new client)
        again = field.agent(reader.id, reader.token, role=reader.role)
        news = await again.subscribe(["memory.recorded"], name="news")
        assert news.created is False and again.fresh_subscriptions == {}
        async with again.notifications(news, cursor_file=tmp_path / "c") as stream:
            assert units(await take(stream, 2)) == owed


def test_a_cursor_file_of_another_agent_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "c"
    path.write_bytes(b'{"agent_id": "a", "cursors": {"sub-1": "t-1"}}')
    field = FieldClient("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="agent 'a'"):
        field.agent("b", "token").notifications(cursor_file=path)
    path.write_bytes(b"[]")
    with pytest.raises(ValueError, match="not a cursor file"):
        field.agent("a", "token").notifications(cursor_file=path)
    stream = field.agent("a", "token").notifications(cursor_file=tmp_path / "new")
    assert stream.cursors == {}


# -- across a restart of the Field --------------------------------------------------------------

SpawnServer = Callable[..., ServerProcess]


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_stream_survives_the_field_being_killed_and_restarted(
    server_process: SpawnServer, tmp_path: Path, transport: Any
) -> None:
    data_dir = tmp_path / "data"
    first = server_process(data_dir)
    port = int(first.url.rsplit(":", 1)[1])
    async with FieldClient(first.url) as field:
        writer, reader = await two_agents(field)
        news = await reader.subscribe(["memory.recorded"])
        stream = reader.notifications(news, transport=transport, reconnect=QUICK)
        before = [await write(writer, f"market before {i}") for i in range(6)]
        got = await take(stream, 2)  # the rest is recorded, not yet yielded
        first.stop(signal.SIGKILL)

        second = server_process(data_dir, port=port)
        assert second.url == first.url
        async with FieldClient(second.url) as again:
            writer = again.agent(writer.id, writer.token, role=writer.role)
            after = [await write(writer, f"market after {i}") for i in range(3)]
            got += await take(stream, 7, timeout=30)
            assert units(got) == before + after  # nothing lost, nothing twice, in order
            sentinel = await write(writer, "market sentinel")
            assert units(await take(stream, 1)) == [sentinel]
        await stream.aclose()
    assert second.stop(signal.SIGTERM) == 0


# -- the SSE parser ---------------------------------------------------------------------------


def test_the_sse_parser_reads_any_line_ending_across_chunks() -> None:
    parser = SSEParser(1024)
    stream = (
        b'\xef\xbb\xbf: ping\r\nid: c-1\r\nevent: memory.recorded\r\ndata: {"a":\r\ndata: 1}\r\n\r'
    )
    events: list[SSEEvent] = []
    for i in range(len(stream)):  # byte by byte: a CR LF may be split
        events += parser.feed(stream[i : i + 1])
    events += parser.feed(b"\nevent: live\rdata: {}\r\revent: empty\n\ndata: x\n\n")
    assert events == [
        SSEEvent("memory.recorded", '{"a":\n1}', "c-1"),
        SSEEvent("live", "{}", None),
        SSEEvent("message", "x", None),
    ]


def test_the_sse_parser_bounds_an_event() -> None:
    parser = SSEParser(1024)
    parser.feed(b"data: " + b"x" * 1000 + b"\n")
    with pytest.raises(SSEError):
        parser.feed(b"data: " + b"x" * 100 + b"\n")
    with pytest.raises(SSEError):
        SSEParser(1024).feed(b"x" * 2000)  # a line that never ends


def test_a_subscription_is_typed_from_its_response() -> None:
    response = {
        "status": "ok",
        "subscription_id": "sub-1",
        "subscription": {"id": "sub-1", "events": ["memory.recorded"], "name": "news"},
        "epoch": 3,
        "cursor": "abc-4",
        "ws_url": "ws://h/v1/ws",
        "sse_url": "http://h/v1/subscriptions/sub-1/events",
        "created": False,
    }
    made = Subscription.from_response(response)
    assert (made.id, made.name, made.created, made.cursor) == ("sub-1", "news", False, "abc-4")
    assert made["cursor"] == "abc-4" and made["created"] is False  # reads like the response
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.id = "x"  # type: ignore[misc]
