"""Edges answered inside the contract: malformed HTTP, oversize WebSocket messages, and
consumers that stall, whichever bound they reach first.

Every test runs the real app on uvicorn with ``field serve``'s protocols
(``server_factory``) and talks to it over loopback sockets with real clients,
or raw bytes where the bytes matter. A state the server reaches without telling
the client (it gave up on a stalled consumer) is awaited through its log record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .conftest import ThreadedServer
from .test_connections import Raw, assert_error, connect

#: Failure guard for one awaited answer (never a pacing delay).
TIMEOUT = 5.0


@pytest.fixture
async def raws() -> AsyncIterator[list[Raw]]:
    """Raw connections a test opens (append them); closed after it."""
    opened: list[Raw] = []
    yield opened
    for raw in opened:
        raw.close()


# == malformed HTTP framing =============================================================

#: Requests llhttp cannot frame, each answered 400 INVALID_HTTP.
MALFORMED = {
    "negative-length": b"POST /v1/record HTTP/1.1\r\nHost: field\r\nContent-Length: -1\r\n\r\n",
    "letters-length": b"POST /v1/record HTTP/1.1\r\nHost: field\r\nContent-Length: abc\r\n\r\n",
    "control-byte-value": b"GET /v1/field/status HTTP/1.1\r\nHost: field\r\nX-Note: a\x01b\r\n\r\n",
    "control-byte-name": b"GET /v1/field/status HTTP/1.1\r\nHost: field\r\nX-N\x01te: ab\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_framing_is_answered_with_the_error_body(
    field_server: ThreadedServer, raws: list[Raw], request_bytes: bytes
) -> None:
    raw = await connect(field_server, raws)
    await raw.send(request_bytes)
    answer = await raw.response()
    assert_error(answer, 400, "INVALID_HTTP")
    assert answer[2]["recoverable"] is True and answer[2]["message"]
    assert await raw.closed() == b""  # nothing more, then the server closes


async def test_malformed_framing_after_a_good_request_answers_both(
    field_server: ThreadedServer, raws: list[Raw]
) -> None:
    raw = await connect(field_server, raws)
    good = b"GET /v1/field/status HTTP/1.1\r\nHost: field\r\n\r\n"
    await raw.send(good + MALFORMED["negative-length"])
    status, _, _ = await raw.response()
    assert status == 200
    assert_error(await raw.response(), 400, "INVALID_HTTP")
    assert await raw.closed() == b""
