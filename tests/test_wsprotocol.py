"""``field serve``'s WebSocket protocol: its receive queue and flag, and a client in a hurry."""

from __future__ import annotations

import asyncio
import gc
import os
import weakref

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from field.transports.wsprotocol import Flag, Inbox, restart_frame_parser

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


def _opened_server() -> tuple[ServerProtocol, weakref.ref[Request]]:
    """A websockets server protocol that has read and accepted a handshake."""
    client = ClientProtocol(parse_uri("ws://127.0.0.1/v1/ws"))
    client.send_request(client.connect())
    server = ServerProtocol()
    server.receive_data(b"".join(client.data_to_send()))
    (request,) = server.events_received()
    server.send_response(server.accept(request))
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
