"""A bounded fuzz run of what clients send, over HTTP and the WebSocket, to a real server.

Hypothesis generates bodies from raw bytes to nearly valid envelopes
(right keys, random values, nesting from flat to thousands of levels)
and sends each to a real Field on uvicorn. Every answer must be a 2xx with
a JSON body or a spec error body with a 4xx or 503 status, never a 500:
a 500 here is a bug the fuzzer found. Afterwards the Field still answers.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from field.contract.errors import HTTP_STATUS
from field.contract.model import MEMORY_TYPES, OPERATIONS
from field.server.config import Config

from .conftest import ThreadedServer

ERROR_KEYS = {"code", "message", "operation", "recoverable", "suggested_action"}
FUZZ = settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,  # the same cases on every run: a failure is reproducible
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["", "akashik", "0.1.0", "alice", *OPERATIONS, *sorted(MEMORY_TYPES)])
)
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=30,
)


@dataclass(frozen=True)
class Deep:
    """A value nested ``depth`` levels, each an array or an object as ``pattern``'s bits say;
    kept as a recipe and written out as text (no JSON encoder nests thousands of levels)."""

    depth: int
    pattern: int
    leaf: Any

    def text(self) -> str:
        arrays = [self.pattern >> (level % 16) & 1 for level in range(self.depth)]
        opens = "".join("[" if array else '{"k":' for array in arrays)
        closes = "".join("]" if array else "}" for array in reversed(arrays))
        return opens + json.dumps(self.leaf) + closes


deep = st.builds(
    Deep,
    depth=st.sampled_from([10, 31, 32, 33, 64, 500, 1000, 1023, 1024, 3000]),
    pattern=st.integers(0, 2**16 - 1),
    leaf=scalars,
)


def payload_for(operation: str) -> st.SearchStrategy[dict[str, Any]]:
    keys = {
        "RECORD": ["mode", "type", "content", "intent", "confidence", "relations"],
        "ATTUNE": ["scope", "context_hint", "format", "max_tokens"],
        "SUBSCRIBE": ["action", "subscription", "id"],
        "SESSION": ["action", "session_id", "name", "visibility", "purpose"],
        "COORDINATE": ["action", "task_id", "title", "assignee", "depends_on"],
    }.get(operation, ["action", "mode", "target_id", "filter", "strategy"])
    return st.dictionaries(st.sampled_from(keys), json_values | deep, max_size=len(keys))


@st.composite
def envelopes(draw: st.DrawFn) -> Any:
    operation = draw(st.sampled_from(OPERATIONS))
    envelope: dict[str, Any] = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "fuzz",
        "operation": operation,
        "agent_id": "alice",
        "session_id": None,
        "epoch": 0,
        "payload": draw(payload_for(operation)),
    }
    # spoil a few fields, drop or add some
    for key in draw(st.lists(st.sampled_from(sorted(envelope)), max_size=3)):
        envelope[key] = draw(json_values | deep)
    if draw(st.booleans()):
        envelope.pop(draw(st.sampled_from(sorted(envelope))), None)
    return envelope


def encoded(value: Any) -> bytes:
    return _text(value).encode()


def _text(value: Any) -> str:
    if isinstance(value, Deep):
        return value.text()
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return json.dumps(value)  # Infinity included: not JSON, and the server must say so


documents = (
    st.binary(max_size=64) | envelopes().map(encoded) | json_values.map(encoded) | deep.map(encoded)
)


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    # no rate limit: the fuzzer's one agent sends thousands of bodies, and each must be read.
    # No keepalive pings either, on either side: websockets makes their payloads with the
    # random module, and Hypothesis fails a draw during which the random module was used
    # (the server runs in this process; on a slow machine the fuzzing outlasts a ping).
    config = Config(data_dir=None, log_level="critical", agent_rate=0, ws_ping_interval=3600.0)
    running = ThreadedServer(config).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def token(server: ThreadedServer) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "r",
        "operation": "REGISTER",
        "agent_id": "alice",
        "session_id": None,
        "epoch": 0,
        "payload": {"id": "alice", "role": "analyst", "interests": ["fuzz"]},
    }
    try:
        connection.request("POST", "/v1/register", orjson.dumps(body), JSON_HEADERS)
        reply = connection.getresponse()
        assert reply.status == 200
        return str(orjson.loads(reply.read())["token"])
    finally:
        connection.close()


JSON_HEADERS = {"Content-Type": "application/json"}


def check_answer(status: int, body: Any) -> None:
    assert status != 500, body
    if status >= 400:
        assert isinstance(body, dict) and body.keys() >= ERROR_KEYS, body
        assert HTTP_STATUS[body["code"]] == status, body
        assert isinstance(body["message"], str) and len(body["message"]) < 2000
    else:
        assert status == 200 and isinstance(body, dict), body


@pytest.fixture(scope="module")
def http_connection(server: ThreadedServer) -> Iterator[http.client.HTTPConnection]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    yield connection
    connection.close()


@FUZZ
@given(
    body=documents,
    path=st.sampled_from([f"/v1/{op.lower()}" for op in OPERATIONS]),
    authenticated=st.booleans(),
)
def test_http_inputs(
    http_connection: http.client.HTTPConnection,
    token: str,
    body: bytes,
    path: str,
    authenticated: bool,
) -> None:
    headers = dict(JSON_HEADERS)
    if authenticated:
        headers["Authorization"] = f"Bearer {token}"
    http_connection.request("POST", path, body, headers)
    reply = http_connection.getresponse()
    check_answer(reply.status, orjson.loads(reply.read()))


@pytest.fixture(scope="module")
def websocket(server: ThreadedServer, token: str) -> Iterator[ClientConnection]:
    url = f"ws://127.0.0.1:{server.port}/v1/ws"
    headers = {"Authorization": f"Bearer {token}"}
    with connect(url, additional_headers=headers, ping_interval=None) as ws:
        yield ws


@FUZZ
@given(body=documents, binary=st.booleans())
def test_websocket_inputs(websocket: ClientConnection, body: bytes, binary: bool) -> None:
    if binary:
        websocket.send(body)
    else:
        websocket.send(body.decode("utf-8", errors="replace"))
    while True:  # notifications of the fuzzer's own writes may come first
        frame = orjson.loads(websocket.recv(timeout=30))
        if frame["type"] == "response":
            break
    check_answer(frame["status"], frame["body"])


def test_the_field_still_answers_after_the_fuzzing(
    server: ThreadedServer, websocket: ClientConnection
) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("GET", "/v1/field/status")
        reply = connection.getresponse()
        status = orjson.loads(reply.read())
    finally:
        connection.close()
    assert reply.status == 200 and status["writer"]["running"] and status["log"]["writable"]
    websocket.ping().wait(timeout=10)  # the fuzzed socket is still served
