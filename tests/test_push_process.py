"""Push across restarts of ``field serve`` as a real process.

A consumer reads notifications, the server is stopped (SIGTERM) or killed
(SIGKILL) and started again on the same data directory; the consumer
reconnects with its old token and the cursor of the last notification it
processed, and must get exactly what it missed, in order, then live ones.
The subscription itself is durable: it is listed after the restart.

The WebSocket and SSE clients are the ones of ``test_push``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from field.client import AgentClient, FieldClient

from .conftest import ServerProcess
from .test_push import (
    cursors_increase,
    ids,
    listed,
    open_ws,
    record_many,
    sse_stream,
    subscribe,
)

pytestmark = pytest.mark.slow

SpawnServer = Callable[..., ServerProcess]


def _again(field: FieldClient, agent: AgentClient) -> AgentClient:
    """The same agent, by its old token, on a restarted server (its clock starts at 0)."""
    return AgentClient(field, agent.id, agent.token, role=agent.role)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
async def test_streams_resume_exactly_across_a_restart(
    server_process: SpawnServer, tmp_path: Path, sig: int
) -> None:
    data_dir = tmp_path / "data"
    first = server_process(data_dir)
    async with FieldClient(first.url) as field:
        a = await field.register("agent-a", "analyst", interests=["market sizing"])
        b = await field.register("agent-b", "researcher", interests=["market sizing"])
        response = await subscribe(b, ["memory.recorded"])
        subscription_id = response["subscription_id"]
        async with open_ws(first.url, b.token) as ws:
            await ws.ready()
            before = await record_many(a, 3, "before")
            seen = await ws.notifications(3)
            consumed = seen[:2]  # the consumer processed two; the third is "lost" with it
            if sig == signal.SIGKILL:  # killed under the consumer's feet
                first.stop(sig)
        if sig == signal.SIGTERM:
            assert first.stop(sig) == 0
    assert ids(seen) == before
    last = consumed[-1]["cursor"]

    second = server_process(data_dir)
    async with FieldClient(second.url) as field, aiohttp.ClientSession() as http:
        a, b = _again(field, a), _again(field, b)
        (subscription,) = await listed(b)  # the subscription survived
        assert subscription == response["subscription"]
        missed = await record_many(a, 3, "missed")

        async with open_ws(second.url, b.token, since=[last]) as ws:
            frames = await ws.ready()
            assert frames[0]["data"] == {
                "subscription_id": subscription_id,
                "recovered": True,
                "from": last,
            }
            replayed = [f["data"] for f in frames[1:-1]]
            assert frames[-1]["data"]["replayed"] == len(replayed) == 4
            after = await record_many(a, 2, "after")
            fresh = await ws.notifications(2)
        everything = consumed + replayed + fresh
        assert ids(everything) == before + missed + after  # no gap, no duplicate
        assert cursors_increase(everything)
        # the notification redelivered after the restart is the one sent before it
        assert replayed[0] == seen[2]

        # SSE: the subscription's whole stream from its cursor, across both lives
        sse_url = f"{second.url}/v1/subscriptions/{subscription_id}/events"
        async with sse_stream(http, sse_url, b.token, since=response["cursor"]) as sse:
            events = await sse.ready()
        whole = [e.data for e in events if e.id is not None]
        assert whole == seen + replayed[1:] + fresh
        # and an EventSource reconnecting with its Last-Event-ID continues from there
        async with sse_stream(http, sse_url, b.token, last_event_id=last) as sse:
            events = await sse.ready()
        assert [e.data for e in events if e.id is not None] == replayed + fresh
    assert second.stop(signal.SIGTERM) == 0


async def test_a_subscription_cancelled_before_a_restart_stays_cancelled(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = server_process(data_dir)
    async with FieldClient(first.url) as field:
        b = await field.register("agent-b", "researcher")
        kept = await subscribe(b, ["memory.recorded"])
        gone = await subscribe(b, ["memory.recorded"])
        await b.send(
            "SUBSCRIBE",
            {"action": "unsubscribe", "subscription": {"id": gone["subscription_id"]}},
        )
    assert first.stop(signal.SIGTERM) == 0
    second = server_process(data_dir)
    async with FieldClient(second.url) as field, aiohttp.ClientSession() as http:
        b = _again(field, b)
        assert [s["id"] for s in await listed(b)] == [kept["subscription_id"]]
        url = f"{second.url}/v1/subscriptions/{gone['subscription_id']}/events"
        async with http.get(url, headers={"Authorization": f"Bearer {b.token}"}) as response:
            assert response.status == 409
            body: dict[str, Any] = await response.json()
            assert body["code"] == "INVALID_TRANSITION"
    assert second.stop(signal.SIGTERM) == 0


async def test_sigterm_closes_websockets_with_1001(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    proc = server_process(tmp_path / "data")
    async with FieldClient(proc.url) as field:
        b = await field.register("agent-b", "researcher")
        await subscribe(b, ["memory.recorded"])
        async with open_ws(proc.url, b.token) as ws:
            await ws.ready()
            proc.process.send_signal(signal.SIGTERM)
            frames, code = await ws.until_closed()
    assert proc.stop(signal.SIGTERM) == 0
    assert frames == []
    assert code == 1001, f"closed with {code}"


async def test_sigterm_ends_sse_streams_cleanly(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    proc = server_process(tmp_path / "data")
    async with FieldClient(proc.url) as field, aiohttp.ClientSession() as http:
        b = await field.register("agent-b", "researcher")
        response = await subscribe(b, ["memory.recorded"])
        async with sse_stream(http, response["sse_url"], b.token) as sse:
            await sse.ready()
            proc.process.send_signal(signal.SIGTERM)
            ending: object
            try:
                last = await sse.next()  # the server says it is stopping, and where to resume
                ending = await sse.next()
            except aiohttp.ClientPayloadError as error:
                ending = error
    assert proc.stop(signal.SIGTERM) == 0
    errors = [line for line in proc.lines if "ERROR" in line]
    assert ending is None, f"the stream did not end cleanly: {ending!r}"
    assert last is not None and last.event == "shutdown", last
    assert last.data["reason"] == "server shutting down"
    assert last.data["cursor"] == response["cursor"]  # nothing was sent since it began
    assert errors == []
