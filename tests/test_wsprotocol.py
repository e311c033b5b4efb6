"""``field serve``'s WebSocket protocol: its receive queue and flag, and a client in a hurry."""

from __future__ import annotations

import asyncio
import gc
import os
import weakref
from collections.abc import Callable

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.frames import Frame
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from field.cli.main import _config, _parser, uvicorn_config
from field.client import FieldClient
from field.server.config import Config
from field.transports.wsprotocol import Flag, Inbox, restart_frame_parser, text_frames

from .conftest import ThreadedServer
from .test_push import ids, open_ws, record_many, subscribe

TIMEOUT = 10

# -- Inbox: uvicorn's receive queue ------------------------------------------------------


async def test_an_inbox_hands_out_messages_in_order_and_keeps_nothing_once_empty() -> None:
    inbox = Inbox()
    assert inbox.empty()
    for n in range(3):
        inbox.put_nowait(n)
    assert not inbox.empty()
    assert [await inbox.get() for _ in range(3)] == [0, 1, 2]
    assert inbox.empty() and inbox._items is None


async def test_a_get_waits_for_the_next_put() -> None:
    inbox = Inbox()
    getter = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    assert not getter.done()
    inbox.put_nowait("connect")
    assert await asyncio.wait_for(getter, TIMEOUT) == "connect"


async def test_a_second_concurrent_reader_is_refused() -> None:
    inbox = Inbox()
    first = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="already waiting"):
        await inbox.get()
    inbox.put_nowait(1)
    assert await asyncio.wait_for(first, TIMEOUT) == 1


async def test_a_cancelled_get_loses_no_message_and_frees_its_place() -> None:
    inbox = Inbox()
    getter = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    inbox.put_nowait("kept")
    getter.cancel()  # cancelled after the put woke it, before it ran
    with pytest.raises(asyncio.CancelledError):
        await getter
    assert await asyncio.wait_for(inbox.get(), TIMEOUT) == "kept"


# -- Flag: uvicorn's "writable" -------------------------------------------------------------


async def test_a_flag_wakes_every_waiter_when_set() -> None:
    flag = Flag()
    assert not flag.is_set()
    waiters = [asyncio.create_task(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    flag.set()
    assert await asyncio.wait_for(asyncio.gather(*waiters), TIMEOUT) == [True] * 3
    assert flag.is_set() and await flag.wait() is True  # set: no waiting
    flag.clear()
    assert not flag.is_set()


async def test_a_cancelled_waiter_leaves_the_flag_clean() -> None:
    flag = Flag(False)
    waiter = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert flag._waiters is None
    flag.set()
    assert await flag.wait() is True


# -- the parser that read the handshake ------------------------------------------------------


def _masked_text(payload: bytes) -> bytes:
    """One client text frame (RFC 6455 5.2), masked as a client must."""
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    if len(payload) < 126:
        head = bytes([0x81, 0x80 | len(payload)])
    else:
        head = bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big")
    return head + mask + masked


def _handshake() -> tuple[ClientProtocol, ServerProtocol, Request]:
    """A websockets client and server protocol; the server has read and accepted the
    client's handshake (its response is not sent yet)."""
    client = ClientProtocol(parse_uri("ws://127.0.0.1/v1/ws"))
    client.send_request(client.connect())
    server = ServerProtocol()
    server.receive_data(b"".join(client.data_to_send()))
    (request,) = server.events_received()
    server.send_response(server.accept(request))
    return client, server, request


def _opened_server() -> tuple[ServerProtocol, weakref.ref[Request]]:
    """A websockets server protocol that has read and accepted a handshake."""
    _, server, request = _handshake()
    return server, weakref.ref(request)


def _texts(server: ServerProtocol) -> list[bytes]:
    return [bytes(e.data) for e in server.events_received() if isinstance(e, Frame)]


def test_between_frames_the_parser_restarts_and_lets_go_of_the_request() -> None:
    server, request = _opened_server()
    assert restart_frame_parser(server)
    gc.collect()
    assert request() is None
    second = _masked_text(b"x" * 300)
    server.receive_data(_masked_text(b"first") + second[:3])
    assert _texts(server) == [b"first"]
    assert not restart_frame_parser(server)  # a frame parser already: nothing to restart
    server.receive_data(second[3:])
    assert _texts(server) == [b"x" * 300]


def test_mid_frame_the_parser_is_left_alone() -> None:
    server, request = _opened_server()
    frame = _masked_text(b"y" * 300)  # an extended length: the header takes several reads
    server.receive_data(frame[:3])
    assert not restart_frame_parser(server)
    server.receive_data(frame[3:])
    assert _texts(server) == [b"y" * 300]
    assert restart_frame_parser(server)  # between frames again, still the handshake's parser
    server.receive_data(_masked_text(b"z"))
    assert _texts(server) == [b"z"]


# -- batched text frames, framed by the protocol ---------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=130),
            st.sampled_from([125, 126, 127, 65535, 65536, 70000]).map(lambda n: b"a" * n),
        ),
        max_size=6,
    )
)
def test_batched_text_frames_are_the_bytes_websockets_writes(texts: list[bytes]) -> None:
    server, _ = _opened_server()
    server.data_to_send()
    for text in texts:
        server.send_text(text)
    expected = b"".join(server.data_to_send())
    assert b"".join(text_frames([], texts)) == expected


def test_a_client_reads_batched_text_frames_in_order() -> None:
    texts = [b"", b"short", b"m" * 126, b"l" * 70_000]
    client, server, _ = _handshake()
    client.receive_data(b"".join(server.data_to_send()))
    assert client.state is State.OPEN
    client.receive_data(b"".join(text_frames([b"\x81\x02hi"], texts)))
    received = [bytes(e.data) for e in client.events_received() if isinstance(e, Frame)]
    assert received == [b"hi", *texts]


# -- permessage-deflate: off unless asked for ----------------------------------------------


@pytest.mark.parametrize("deflate", [False, True], ids=["default", "ws-deflate"])
async def test_permessage_deflate_is_accepted_only_when_configured(
    server_factory: Callable[..., ThreadedServer], deflate: bool
) -> None:
    server = server_factory(ws_deflate=True) if deflate else server_factory()
    async with FieldClient(server.url) as field:
        writer = await field.register("writer", "analyst", interests=["pricing"])
        reader = await field.register("reader", "analyst", interests=["pricing"])
        cursor = (await subscribe(reader, ["memory.recorded"]))["cursor"]
        missed = await record_many(writer, 60, "pricing missed")
        # the client offers permessage-deflate, as browsers and websockets do
        async with open_ws(server, reader.token, since=[cursor], compression="deflate") as ws:
            response = ws.connection.response
            assert response is not None
            extensions = response.headers.get("Sec-WebSocket-Extensions")
            assert (extensions is not None and "permessage-deflate" in extensions) == deflate
            raw = []
            while not raw or orjson.loads(raw[-1])["type"] != "live":
                raw.append(await ws.connection.recv())
    frames = [orjson.loads(text) for text in raw]
    assert ids([f["data"] for f in frames[1:-1]]) == missed  # the batched path, compressed or not


def test_ws_deflate_reads_the_environment_and_the_flag() -> None:
    assert Config.from_env({}).ws_deflate is False
    for raw, value in [("1", True), ("on", True), ("TRUE", True), ("0", False), ("no", False)]:
        assert Config.from_env({"FIELD_WS_DEFLATE": raw}).ws_deflate is value
    with pytest.raises(ValueError, match="FIELD_WS_DEFLATE must be one of"):
        Config.from_env({"FIELD_WS_DEFLATE": "maybe"})
    flag = _parser().parse_args(["serve", "--ws-deflate"])
    assert _config(flag).ws_deflate is True
    assert uvicorn_config(None, _config(flag)).ws_per_message_deflate is True
    unset = _parser().parse_args(["serve"])
    assert uvicorn_config(None, _config(unset)).ws_per_message_deflate is False
