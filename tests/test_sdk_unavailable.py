"""A Field that is not there: FieldUnavailable, naming the URL and the cause.

Nothing here is mocked: a port with nothing listening (a socket bound, then
closed), a host name under ``.invalid`` (which never resolves, RFC 6761), a
listener whose accept queue is full (connecting to it times out), and a real
server that was stopped.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from field.client import (
    ClientError,
    Disconnected,
    FieldClient,
    FieldClientError,
    FieldUnavailable,
    Reconnect,
    StreamUnavailable,
)

from .conftest import ThreadedServer

#: Failure guard (never a pacing delay).
TIMEOUT = 30.0


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def nobody() -> str:
    return f"http://127.0.0.1:{closed_port()}"


@pytest.fixture
def full_listener() -> Iterator[str]:
    """A listener that accepts nothing more: its accept queue is full, so a connection
    to it times out."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        waiting = []
        for _ in range(4):  # more than the queue holds
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))  # in progress, or queued
            waiting.append(filler)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            for filler in waiting:
                filler.close()


async def test_a_field_that_is_not_running_is_named_with_the_cause(nobody: str) -> None:
    async with FieldClient(nobody) as field:
        with pytest.raises(FieldUnavailable) as gone:
            await field.register("researcher-01", "analyst")
    error = gone.value
    assert str(error) == f"no Field at {nobody}: connection refused (is field serve running?)"
    assert error.url == nobody and error.urls == (nobody,)
    assert error.reason == "connection refused"
    assert isinstance(error.__cause__, aiohttp.ClientConnectorError)
    # one tree for the SDK, and still an OSError as aiohttp's error was
    assert isinstance(error, ClientError) and isinstance(error, ConnectionError)
    assert not isinstance(error, FieldClientError)


async def test_every_way_in_raises_it(nobody: str, tmp_path: Path) -> None:
    async with FieldClient(nobody) as field:
        agent = field.agent("researcher-01", "t" * 43, role="analyst")
        calls: list[Callable[[], Any]] = [
            field.status,
            lambda: field.connect("researcher-01", role="analyst", token_file=tmp_path / "t"),
            lambda: agent.attune(),
            lambda: agent.agents(),
        ]
        for call in calls:
            with pytest.raises(FieldUnavailable, match="connection refused"):
                await call()
    assert not (tmp_path / "t").exists()  # nothing was kept


async def test_a_host_name_that_does_not_resolve() -> None:
    async with FieldClient("http://nothing.invalid:8765") as field:
        with pytest.raises(FieldUnavailable) as gone:
            await field.status()
    message = str(gone.value)
    assert message.startswith(
        "no Field at http://nothing.invalid:8765: the host name 'nothing.invalid' does not resolve"
    )
    assert message.endswith("(is the URL right?)")


async def test_a_connection_that_times_out(full_listener: str) -> None:
    async with FieldClient(full_listener, connect_timeout=0.5) as field:
        with pytest.raises(FieldUnavailable) as gone:
            async with asyncio.timeout(TIMEOUT):
                await field.status()
    assert str(gone.value) == (
        f"no Field at {full_listener}: timed out connecting "
        "(is field serve running, and reachable?)"
    )
    assert isinstance(gone.value.__cause__, aiohttp.ConnectionTimeoutError)


async def test_every_node_is_tried_and_named() -> None:
    first, second = f"http://127.0.0.1:{closed_port()}", f"http://localhost:{closed_port()}"
    async with FieldClient(first, nodes=[second]) as field:
        with pytest.raises(FieldUnavailable) as gone:
            await field.status()
    assert gone.value.urls == (first, second)
    assert str(gone.value).startswith(f"no Field at {first}, {second}: connection refused")


# -- streams ----------------------------------------------------------------------------------


STREAMS = [
    pytest.param("ws", (), id="ws, every subscription"),
    pytest.param("ws", ("sub-1",), id="ws, one subscription"),
    pytest.param("sse", ("sub-1",), id="sse, one subscription"),
    pytest.param("sse", (), id="sse, every subscription"),
]


@pytest.mark.parametrize(("transport", "subscriptions"), STREAMS)
async def test_a_stream_that_cannot_open_raises_it(
    nobody: str, transport: Any, subscriptions: tuple[str, ...]
) -> None:
    async with FieldClient(nobody) as field:
        agent = field.agent("watcher", "t" * 43, role="lead")
        stream = agent.notifications(*subscriptions, transport=transport)
        with pytest.raises(FieldUnavailable) as gone:
            async with asyncio.timeout(TIMEOUT):  # raised at once, not after reconnecting
                await anext(stream)
        await stream.aclose()
    assert str(gone.value) == f"no Field at {nobody}: connection refused (is field serve running?)"


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_stream_whose_connection_times_out_raises_it(
    full_listener: str, transport: Any
) -> None:
    async with FieldClient(full_listener, connect_timeout=0.5) as field:
        stream = field.agent("watcher", "t" * 43).notifications("sub-1", transport=transport)
        with pytest.raises(FieldUnavailable, match="timed out connecting"):
            async with asyncio.timeout(TIMEOUT):
                await anext(stream)
        await stream.aclose()


async def test_a_field_stopped_before_the_stream_opens(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory()
    async with FieldClient(server.url) as field:
        watcher = await field.register("watcher", "lead")
        news = await watcher.subscribe(["memory.recorded"])
        server.stop()
        stream = watcher.notifications(news)
        with pytest.raises(FieldUnavailable, match="connection refused"):
            async with asyncio.timeout(TIMEOUT):
                await anext(stream)
        await stream.aclose()


async def test_a_stream_that_was_connected_reconnects_instead(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    """The Field answered once: it may come back (a restart), so a lost connection is
    retried, not FieldUnavailable (test_sdk_stream.py: until give_up_after, if set)."""
    server = server_factory()
    async with FieldClient(server.url) as field:
        watcher = await field.register("watcher", "lead")
        news = await watcher.subscribe(["memory.recorded"], include_own=True)
        patience = Reconnect(initial=0.05, maximum=0.05, give_up_after=0.3)
        stream = watcher.notifications(news, control=True, reconnect=patience)
        await watcher.record("finding", "x", purpose="p", confidence=0.5, reasoning="r")
        async with asyncio.timeout(TIMEOUT):
            assert (await anext(stream)).kind == "notification"
        server.stop()
        events: list[Any] = []
        with pytest.raises(StreamUnavailable) as given_up:
            async with asyncio.timeout(TIMEOUT):
                async for event in stream:
                    events.append(event)
        await stream.aclose()
    assert events and all(isinstance(event, Disconnected) for event in events)
    assert "connection refused" in str(given_up.value)
