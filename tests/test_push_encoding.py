"""Push encodes notifications straight to bytes: the same bytes as the object path.

The hub queues a frame per notification without building a
:class:`Notification` when a stream has no debounce (live and replayed),
and the SSE transport writes events by concatenation. These tests hold
each shortcut to the encoding it replaces, byte for byte.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sse_starlette import ServerSentEvent

from field.contract.model import StoredEntry
from field.core.field import Field
from field.engine.push import PushHub
from field.engine.router import Frame
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog
from field.subscriptions.events import SUBSCRIPTION_EVENTS, FieldEvent, event_of
from field.subscriptions.stream import (
    Notification,
    encode_event,
    encode_notification,
    format_cursor,
)
from field.transports.eventstream import sse_event
from field.transports.wsprotocol import FieldWebSocketProtocol

from .conftest import UNLOADED_POLICY, ThreadedServer
from .core_util import Harness
from .test_push import Agents, agents, field, ids, open_ws, record_many, subscribe  # noqa: F401

OPERATOR_TOKEN = "operator-token-0123456789"


def dict_encoding(notification: Notification) -> bytes:
    """The encoding as a dict of the subscriber's fields, spliced onto the shared part."""
    own = orjson.dumps(
        {
            "subscription_id": notification.subscription_id,
            "relevance_score": round(notification.relevance, 6),
            "relevance_reason": notification.reason,
            "requires_action": notification.requires_action,
            "folded": notification.folded,
        }
    )
    return own[:-1] + b"," + notification.shared[1:]


EVENT = FieldEvent(1, 1, 0.0, "memory.recorded", "a", "memory_unit", "m", "s")


@given(
    subscription_id=st.text(),
    relevance=st.one_of(
        st.floats(min_value=0, max_value=1), st.sampled_from([0.0, 1.0, 1e-7, 0.1234565])
    ),
    reason=st.text(),
    requires_action=st.booleans(),
    folded=st.integers(min_value=0, max_value=2**40),
    shared=st.dictionaries(st.text(max_size=5), st.text(max_size=5), min_size=1),
)
def test_notification_bytes_equal_the_dict_encoding(
    subscription_id: str,
    relevance: float,
    reason: str,
    requires_action: bool,
    folded: int,
    shared: dict[str, str],
) -> None:
    notification = Notification(
        subscription_id,
        EVENT,
        relevance,
        reason,
        requires_action,
        folded,
        shared=orjson.dumps(shared),
    )
    assert encode_notification(notification) == dict_encoding(notification)


@given(
    body=st.one_of(
        st.dictionaries(st.text(), st.text()).map(orjson.dumps),
        st.sampled_from([b'{"a":"x\ny"}', b"two\nlines\r\nthree\rfour", b""]),
    ),
    kind=st.sampled_from(["memory.recorded", "resume", "live", "end", "overflow"]),
    cursor=st.one_of(st.none(), st.integers(min_value=0).map(lambda p: f"tag-{p}")),
)
def test_sse_events_equal_sse_starlettes_encoding(
    body: bytes, kind: str, cursor: str | None
) -> None:
    expected = ServerSentEvent(data=body.decode(), event=kind, id=cursor).encode()
    assert sse_event(Frame(body, kind, cursor)) == expected


# -- the hub: direct frames equal the frames of Notification objects ----------------------


def busy_field() -> tuple[Harness, dict[str, str]]:
    """Agents, subscriptions (every event, with and without debounce) and varied events,
    some inside a session (so the audience check applies)."""
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.register("lead", "lead", interests=["launch date"])
    h.register("member", "analyst", interests=["pricing", "launch"])
    h.register("outsider", "analyst", interests=["pricing"])
    h.register("boss", "reviewer", authority=6, via=OPERATOR_TOKEN)
    subscriptions = {}
    for agent, minimum, debounce in (
        ("lead", 0, 0),
        ("member", 0.3, 0),
        ("outsider", 0, 0),
        ("boss", 0, 1000),
    ):
        subscription = {
            "events": list(SUBSCRIPTION_EVENTS),
            "min_relevance": minimum,
            "debounce_ms": debounce,
            "include_own": agent == "lead",
        }
        answer = h.send("SUBSCRIBE", agent, {"action": "subscribe", "subscription": subscription})
        subscriptions[agent] = answer["subscription_id"]
    created = {"action": "create", "name": "launch", "invitees": ["member"]}
    session = h.send("SESSION", "lead", created)["session"]["id"]
    h.send("SESSION", "member", {"action": "join", "session_id": session})
    first = h.record("lead", 'the launch is in March \u2014 "confirmed"')["memory_unit_id"]
    h.record("member", "pricing: 12 EUR per seat", score=0.4)
    contra = [{"type": "contradicts", "target_id": first}]
    h.record("member", "the launch is in May", relations=contra)
    payload = {
        "type": "decision",
        "content": "launch in the session",
        "intent": {"purpose": "test"},
        "confidence": {"score": 0.9, "reasoning": "r"},
    }
    h.send("RECORD", "lead", payload, session_id=session)
    h.register("late", "analyst", interests=["pricing"])
    for n in range(30):
        h.record("outsider", f"pricing note {n}")
    return h, subscriptions


def reference_frames(hub: PushHub, entries: list[StoredEntry], subscription_id: str) -> list[Frame]:
    """What the Notification path queues for one undebounced subscription."""
    state = hub.field.state
    events = [e for e in (event_of(entry, state.known_units) for entry in entries) if e]
    row = np.array([state.registry.rows[subscription_id]])
    frames = []
    for match in hub.router.matcher().match(events, only=row):
        cursor = format_cursor(hub.tag, match.event.position)
        shared = encode_event(match.event, cursor)
        notification = Notification(
            subscription_id,
            match.event,
            float(match.relevance[0]),
            match.reason(0),
            bool(match.requires_action[0]),
            shared=shared,
        )
        body = encode_notification(notification)
        frames.append(Frame(body, match.event.name, cursor, subscription_id, match.event.position))
    return frames


def queued(hub: PushHub, connection: Any) -> list[Frame]:
    frames: list[Frame] = connection.outbox.drain_now(100_000)
    return [f for f in frames if f.cursor is not None]


def test_replayed_and_live_frames_equal_the_notification_path() -> None:
    h, subscriptions = busy_field()
    log = MemoryEventLog()
    log.append(h.entries)
    entries = log.read(0, 100_000)
    hub = PushHub(
        FieldService(log, lambda: Field(operator_token=OPERATOR_TOKEN), admission=UNLOADED_POLICY)
    )
    state = hub.field.state
    for agent in ("lead", "member", "outsider"):
        sid = subscriptions[agent]
        expected = reference_frames(hub, entries, sid)
        assert expected, agent
        # replayed: a page at a time
        connection = hub.connect(agent, "sse")
        binding = hub.router.bind(connection, state.subscriptions[sid], 0, replaying=True)
        row = np.array([state.registry.rows[sid]])
        names = frozenset(state.subscriptions[sid]["events"])
        offered = sum(
            hub.router.offer_entries(binding, entries[i : i + 7], row, names)
            for i in range(0, len(entries), 7)
        )
        assert offered == len(expected)
        assert queued(hub, connection) == expected, agent
        hub.disconnect(connection)
        # live: every entry published as it was committed ("sse": a socket would also
        # be bound to the subscriptions the entries create)
        connection = hub.connect(agent, "sse")
        hub.router.bind(connection, state.subscriptions[sid], 0, replaying=False)
        for entry in entries:
            for _ in hub.publish([entry]):
                pass
        assert queued(hub, connection) == expected, agent
        hub.disconnect(connection)


# -- WebSocket batches: one socket write, the same text frames -----------------------------


@pytest.mark.parametrize(
    "field_server",
    [None, "websockets-sansio"],
    ids=["field-protocol", "uvicorn-protocol"],
    indirect=True,
)
async def test_a_websocket_resume_arrives_as_text_frames_whether_batched_or_not(
    field_server: ThreadedServer,
    agents: Agents,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes: list[int] = []
    send_texts = FieldWebSocketProtocol._send_texts

    async def counted(self: FieldWebSocketProtocol, texts: list[bytes], timeout: Any) -> None:
        writes.append(len(texts))
        await send_texts(self, texts, timeout)

    write_now = FieldWebSocketProtocol.write_texts_now

    def counted_now(self: FieldWebSocketProtocol, texts: list[bytes]) -> bool:
        written = write_now(self, texts)
        if written:
            writes.append(len(texts))
        return written

    monkeypatch.setattr(FieldWebSocketProtocol, "_send_texts", counted)
    monkeypatch.setattr(FieldWebSocketProtocol, "write_texts_now", counted_now)
    cursor = (await subscribe(agents.b, ["memory.recorded"]))["cursor"]
    missed = await record_many(agents.a, 120, "missed")
    async with open_ws(field_server, agents.b.token, since=[cursor]) as ws:
        raw = []
        while not raw or orjson.loads(raw[-1])["type"] != "live":
            raw.append(await ws.connection.recv())
    assert all(isinstance(text, str) for text in raw)  # text frames, not binary
    frames = [orjson.loads(text) for text in raw]
    assert ids([f["data"] for f in frames[1:-1]]) == missed
    if field_server.server.config.ws is FieldWebSocketProtocol:
        # the replay went out in batches of several frames, a socket write each
        assert sum(writes) == len(frames) and max(writes) > 1
    else:  # uvicorn's own protocol: frame by frame through ASGI
        assert writes == []


async def test_an_open_websocket_lets_go_of_its_handshake_and_still_works(
    field_server: ThreadedServer,
    agents: Agents,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    requests: list[weakref.ref[Any]] = []
    protocols: list[FieldWebSocketProtocol] = []
    handle_connect = FieldWebSocketProtocol.handle_connect

    def spy(self: FieldWebSocketProtocol, event: Any) -> None:
        requests.append(weakref.ref(event))
        protocols.append(self)
        handle_connect(self, event)

    monkeypatch.setattr(FieldWebSocketProtocol, "handle_connect", spy)
    await subscribe(agents.b, ["memory.recorded"])
    async with open_ws(field_server, agents.b.token) as ws:
        await ws.ready()
        listed = await ws.request("SUBSCRIBE", "agent-b", {"action": "list"})
        assert listed["status"] == 200
        gc.collect()
        (request,) = requests
        assert request() is None  # nothing holds the handshake's request any more
        (protocol,) = protocols
        assert protocol.request is None and protocol.response is None
        (unit,) = await record_many(agents.a, 1, "after the handshake")
        (notification,) = await ws.notifications(1)
        listed = await ws.request("SUBSCRIBE", "agent-b", {"action": "list"})
        assert listed["status"] == 200
    assert notification["memory_unit_id"] == unit
