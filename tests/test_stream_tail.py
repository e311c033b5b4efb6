"""A subscription cancelled while its client was away still owes what came before: raw
WebSocket and SSE against a real server (the SDK's view is in tests/test_sdk_stream.py)."""

from __future__ import annotations

import aiohttp
import orjson

from field.client import AgentClient, FieldClient

from .conftest import ThreadedServer


async def _cancelled_with_two_owed(field: FieldClient) -> tuple[AgentClient, str, str, list[str]]:
    writer = await field.register("writer", "analyst")
    reader = await field.register("reader", "analyst")
    made = await reader.send(
        "SUBSCRIBE", {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}}
    )
    owed = []
    for text in ("first", "second"):
        unit = await writer.record(
            "finding", text, purpose="share", confidence=0.7, reasoning="test"
        )
        owed.append(unit["memory_unit_id"])
    await reader.send(
        "SUBSCRIBE", {"action": "unsubscribe", "subscription": {"id": made["subscription_id"]}}
    )
    return reader, made["subscription_id"], made["cursor"], owed


async def _frames(ws: aiohttp.ClientWebSocketResponse) -> list[dict]:
    frames = []
    async for message in ws:
        frame = orjson.loads(message.data)
        frames.append(frame)
        if frame["type"] == "end":
            break
    return frames


async def test_a_websocket_naming_a_cancelled_subscription_gets_its_tail_then_end(
    field_server: ThreadedServer,
) -> None:
    async with FieldClient(field_server.url) as field, aiohttp.ClientSession() as http:
        reader, sub, cursor, owed = await _cancelled_with_two_owed(field)
        url = f"{field_server.url.replace('http', 'ws', 1)}/v1/ws?since={sub}@{cursor}"
        auth = {"Authorization": f"Bearer {reader.token}"}
        async with http.ws_connect(url, headers=auth) as ws:
            frames = await _frames(ws)
        # a stream that ends within its replay never goes live
        assert [f["type"] for f in frames] == ["resume", "notification", "notification", "end"]
        notified = [f["data"]["memory_unit_id"] for f in frames if f["type"] == "notification"]
        assert notified == owed
        assert frames[-1]["data"]["subscription_id"] == sub


async def test_a_websocket_ignores_another_agents_cancelled_subscription(
    field_server: ThreadedServer,
) -> None:
    async with FieldClient(field_server.url) as field, aiohttp.ClientSession() as http:
        _, sub, cursor, _ = await _cancelled_with_two_owed(field)
        stranger = await field.register("stranger", "analyst")
        url = f"{field_server.url.replace('http', 'ws', 1)}/v1/ws?since={sub}@{cursor}"
        auth = {"Authorization": f"Bearer {stranger.token}"}
        async with http.ws_connect(url, headers=auth) as ws:
            envelope = stranger.field.envelope("SUBSCRIBE", "stranger", {"action": "list"})
            await ws.send_bytes(orjson.dumps(envelope))
            first = orjson.loads((await ws.receive()).data)
        assert first["type"] == "response"  # no resume frame: nothing of the reader's streamed
        assert first["body"]["subscriptions"] == []


async def test_sse_of_a_cancelled_subscription_needs_a_cursor(
    field_server: ThreadedServer,
) -> None:
    async with FieldClient(field_server.url) as field, aiohttp.ClientSession() as http:
        reader, sub, cursor, owed = await _cancelled_with_two_owed(field)
        url = f"{field_server.url}/v1/subscriptions/{sub}/events"
        auth = {"Authorization": f"Bearer {reader.token}"}
        async with http.get(url, headers=auth) as refused:
            assert refused.status == 409
            assert (await refused.json())["code"] == "INVALID_TRANSITION"
        async with http.get(url, headers={**auth, "Last-Event-ID": cursor}) as stream:
            assert stream.status == 200
            text = (await stream.read()).decode()  # the stream ends by itself after `end`
        assert [u for u in owed if u in text] == owed
        assert "event: end" in text
