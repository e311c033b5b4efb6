"""No secret in any log line: ``field serve --log-level debug`` through every way in.

The server runs as its own process at the most verbose level (websockets then
logs every handshake header and every frame); the test authenticates every way
the Field accepts and hands it every kind of secret, then reads the whole log
for each secret. The log must show that those lines were written, redacted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from yarl import URL

from field.cli.redaction import redact
from field.client import FieldClient

from .conftest import ServerProcess
from .test_push import open_ws, record, sse_stream, subscribe


def webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def envelope(operation: str, agent_id: str, payload: dict[str, Any], n: int) -> str:
    body = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": f"ws-{n}",
        "operation": operation,
        "agent_id": agent_id,
        "session_id": None,
        "epoch": 0,
        "payload": payload,
    }
    return orjson.dumps(body).decode()


async def test_no_secret_reaches_the_log_at_debug(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    operator_token = secrets.token_urlsafe(32)
    token_file = tmp_path / "operator.token"
    token_file.write_text(operator_token + "\n")
    server = server_process(
        tmp_path / "data",
        "--log-level",
        "debug",
        "--operator-token-file",
        str(token_file),
        "--webhook-allow-net",
        "127.0.0.0/8",
    )
    found: dict[str, str] = {"operator token": operator_token}
    http_hook, ws_hook, source_secret = webhook_secret(), webhook_secret(), secrets.token_hex(24)
    found |= {"webhook secret (HTTP)": http_hook, "webhook secret (WebSocket)": ws_hook}
    found["source secret"] = source_secret
    receiver = "http://127.0.0.1:9/hook"  # nothing listens: deliveries fail, and are logged

    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        # REGISTER (no token), then an HTTP bearer token
        a = await field.register("agent-a", "analyst", interests=["market sizing"])
        b = await field.register("agent-b", "researcher", interests=["market sizing"])
        found |= {"agent token (a)": a.token, "agent token (b)": b.token}
        stream = await subscribe(b, ["memory.recorded"])
        # a webhook subscription with its secret, over HTTP
        delivery = {"type": "webhook", "url": receiver, "secret": http_hook}
        await subscribe(a, ["memory.recorded"], delivery=delivery)

        # the operator token: define a source with its secret, list the sources
        operator = {"Authorization": f"Bearer {operator_token}"}
        source = {
            "name": "github",
            "scheme": "github",
            "secret": source_secret,
            "unit": {"type": "observation", "content": "PR #{payload.number}"},
        }
        async with http.post(f"{server.url}/v1/sources", json=source, headers=operator) as r:
            assert r.status == 200, await r.text()
        async with http.get(f"{server.url}/v1/sources", headers=operator) as r:
            assert r.status == 200, await r.text()
        # a registration token the operator issues, then used to REGISTER
        issue = {"uses": 2, "note": "log test"}
        async with http.post(
            f"{server.url}/v1/registration-tokens", json=issue, headers=operator
        ) as r:
            assert r.status == 200, await r.text()
            found["registration token"] = (await r.json())["registration_token"]["token"]
        await field.register("agent-d", "analyst", registration_token=found["registration token"])
        # an inbound event, signed with the source's secret
        event = orjson.dumps({"action": "opened", "number": 7})
        signature = hmac.new(source_secret.encode(), event, hashlib.sha256).hexdigest()
        signed = {
            "Content-Type": "application/json",
            "X-GitHub-Event": "pull_request",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": f"sha256={signature}",
        }
        async with http.post(f"{server.url}/v1/sources/github/events", data=event, headers=signed):
            pass

        # WebSocket with the header: a webhook secret and a REGISTER answered on the socket
        async with open_ws(server.url, b.token) as ws:
            await ws.ready()
            hook = {"type": "webhook", "url": receiver, "secret": ws_hook}
            subscription = {"events": ["memory.recorded"], "delivery": hook}
            payload = {"action": "subscribe", "subscription": subscription}
            await ws.connection.send(envelope("SUBSCRIBE", b.id, payload, 1))
            # the Field makes this one's secret, and says it once, on the socket
            made = {"events": ["memory.recorded"], "delivery": {"type": "webhook", "url": receiver}}
            answer = await ws.request("SUBSCRIBE", b.id, {"subscription": made})
            found["webhook secret made by the Field"] = answer["body"]["subscription"]["delivery"][
                "secret"
            ]
            registered = await ws.request(
                "REGISTER", "agent-c", {"id": "agent-c", "role": "analyst", "interests": []}
            )
            found["agent token (c, on the socket)"] = registered["body"]["token"]
            await record(a, "market sizing: one finding")
            await ws.until(lambda frame: frame["type"] == "notification")
        # WebSocket with ?token=, and one whose token the Field never issued
        async with open_ws(server.url, None, query_token=a.token) as ws:
            await ws.recv()
        unknown = secrets.token_urlsafe(32)
        found["unknown token"] = unknown
        async with open_ws(server.url, unknown) as ws:
            frames, code = await ws.until_closed()
            assert code == 4401, frames

        # SSE with the header, and with ?token=
        async with sse_stream(http, stream["sse_url"], b.token) as sse:
            await sse.ready()
        async with sse_stream(http, stream["sse_url"], None, query_token=b.token) as sse:
            await sse.ready()

    assert server.stop() == 0
    log = "\n".join(server.lines)
    for what, secret in found.items():
        assert secret not in log, f"the {what} is in the log"
    # the lines that would have carried them were written, redacted
    assert "authorization: bearer <redacted>" in log.lower()
    assert "token=<redacted>" in log
    assert "TEXT [" in log  # a frame, as its size


def test_redaction_keeps_the_line_and_drops_the_value() -> None:
    token = secrets.token_urlsafe(32)
    hook = webhook_secret()
    lines = {
        f"< Authorization: Bearer {token}": "< Authorization: Bearer <redacted>",
        f"[(b'authorization', b'Bearer {token}')]": "[(b'authorization', b'Bearer <redacted>')]",
        f'"WebSocket /v1/ws?since=x-1&token={token}" [accepted]': (
            '"WebSocket /v1/ws?since=x-1&token=<redacted>" [accepted]'
        ),
        f'{{"token":"{token}","agent_id":"a"}}': '{"token":"<redacted>","agent_id":"a"}',
        f"{{'secret': '{hook}'}}": "{'secret': '<redacted>'}",
        f"signed with {hook}": "signed with whsec_<redacted>",
        f"POST https://user:{token}@example.com/hook": "POST https://user:<redacted>@example.com/hook",
        "no secret here: token_type is plain": "no secret here: token_type is plain",
    }
    for line, redacted in lines.items():
        assert redact(line) == redacted


async def test_json_lines_with_access_log_parse_and_hold_no_secret(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """``--log-format json --access-log``: every line of the log is one JSON object; the
    access lines say who did what, how it ended and how long it took; and no token is in
    any line, whichever way it was sent (a header, ``?token=``, or a query parameter name
    a server decodes to ``token``)."""
    server = server_process(
        tmp_path / "data", "--log-format", "json", "--access-log", "--log-level", "debug"
    )
    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        a = await field.register("agent-a", "analyst", interests=["market sizing"])
        b = await field.register("agent-b", "researcher", interests=["market sizing"])
        tokens = {"a": a.token, "b": b.token}
        stream = await subscribe(b, ["memory.recorded"])
        await record(a, "market sizing: one finding")
        async with open_ws(server.url, None, query_token=b.token) as ws:
            await ws.ready()
            await ws.request("ATTUNE", b.id, {"scope": {"role": "researcher", "max_units": 5}})
        async with sse_stream(http, stream["sse_url"], None, query_token=b.token) as sse:
            await sse.ready()
        # ``tok%65n`` is ``token`` once decoded: it authenticates, and must be redacted too
        encoded = URL(f"{stream['sse_url']}?tok%65n={b.token}", encoded=True)  # sent as is
        async with http.get(encoded, headers={"Accept": "text/event-stream"}) as r:
            assert r.status == 200
            await r.content.readline()
    assert server.stop() == 0

    records = []
    for line in server.lines:
        record_ = orjson.loads(line)  # every line, uvicorn's included, is one JSON object
        assert isinstance(record_, dict), line
        assert {"time", "level", "logger", "event"} <= set(record_), line
        records.append(record_)
    log = "\n".join(server.lines)
    for who, token in tokens.items():
        assert token not in log, f"agent {who}'s token is in the log"
    access = [r for r in records if r["logger"] == "field.access"]
    recorded = next(r for r in access if r.get("operation") == "RECORD")
    assert recorded["transport"] == "http" and recorded["status"] == 200
    assert recorded["outcome"] == "ok" and recorded["agent"] == "agent-a"
    assert recorded["duration_ms"] > 0 and isinstance(recorded["request_id"], str)
    assert recorded["method"] == "POST" and recorded["path"] == "/v1/record"
    operations = [r for r in records if r["logger"] == "field.operation"]
    on_socket = next(r for r in operations if r.get("transport") == "websocket")
    assert on_socket["operation"] == "ATTUNE" and on_socket["agent"] == "agent-b"
    assert on_socket["message_id"] == "ws-1" and isinstance(on_socket["request_id"], str)
    assert any(r["path"].endswith("?token=<redacted>") for r in access), access
    assert any(r["path"].endswith("?tok%65n=<redacted>") for r in access), access
    assert all(isinstance(r["status"], int) for r in access if "status" in r)
    started = next(r for r in records if "listening on" in r["event"])
    assert started["level"] == "info" and started["logger"] == "field.http"


def test_query_strings_are_redacted_by_their_decoded_names() -> None:
    token = secrets.token_urlsafe(32)
    lines = {
        f'"GET /v1/ws?since=x-1&tok%65n={token} HTTP/1.1" 200': (
            '"GET /v1/ws?since=x-1&tok%65n=<redacted> HTTP/1.1" 200'
        ),
        f"/v1/subscriptions/s/events?%74oken={token}&since=x-2": (
            "/v1/subscriptions/s/events?%74oken=<redacted>&since=x-2"
        ),
        f"POST https://hooks.example.com/in?api_key={token}&team=7": (
            "POST https://hooks.example.com/in?api_key=<redacted>&team=7"
        ),
        f"/hook?sig={token}": "/hook?sig=<redacted>",
        "/v1/agents?after=agent-7&limit=100": "/v1/agents?after=agent-7&limit=100",
    }
    for line, redacted in lines.items():
        assert redact(line) == redacted
