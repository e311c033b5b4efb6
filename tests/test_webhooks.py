"""Webhook delivery end to end: a real Field, real receivers on loopback.

Every receiver here is an aiohttp server that records what it gets and
answers as its test tells it. What a receiver ends with is checked against
what the subscription owes: every notification, in cursor order, signed,
and a duplicate only ever with the same ``webhook-id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from field.client import AgentClient, FieldClient, FieldClientError

from .conftest import ServerProcess, ThreadedServer
from .schema_util import assert_valid
from .test_push import sse_stream

#: Failure guard for one awaited arrival (never a pacing delay).
TIMEOUT = 15.0
FAST_RETRIES = {"webhook_retry_base": 0.02, "webhook_retry_cap": 0.1}


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def cursor(self) -> str:
        return str(orjson.loads(self.body)["cursor"])


@dataclass
class Receiver:
    """A webhook receiver: ``answer(n)`` gives the status of the n-th request (from 0)."""

    answer: Callable[[int], int] = lambda n: 200
    #: if given, requests wait until it is set (a receiver that hangs until released)
    gate: asyncio.Event | None = None
    received: list[Received] = field(default_factory=list)
    url: str = ""
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    async def start(self, port: int = 0) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{bound}/hook"
        return self

    async def stop(self) -> None:
        if self.gate is not None:
            self.gate.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.gate is not None:
            await self.gate.wait()  # hanging on purpose, until released
        status = self.answer(len(self.received))
        self.received.append(Received(dict(request.headers), body, status))
        self._arrived.set()
        headers = {"Retry-After": "1"} if status == 429 else {}
        return web.Response(status=status, headers=headers)

    @property
    def delivered(self) -> list[Received]:
        return [r for r in self.received if 200 <= r.status < 300]

    async def until(self, done: Callable[[], bool], what: str) -> None:
        """Wait until ``done()``: each arrival wakes the check (bounded by TIMEOUT)."""
        deadline = time.monotonic() + TIMEOUT
        while not done():
            self._arrived.clear()
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {what}; got {len(self.received)}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)


@pytest.fixture
async def receivers() -> AsyncIterator[Callable[..., Any]]:
    started: list[Receiver] = []

    async def start(**options: Any) -> Receiver:
        receiver = await Receiver(**options).start()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        await receiver.stop()


@pytest.fixture
def server(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    return server_factory(webhook_allow_net=("127.0.0.0/8",), **FAST_RETRIES)


async def agents(url: str) -> tuple[FieldClient, AgentClient, AgentClient]:
    field_client = FieldClient(url)
    writer = await field_client.register("writer", "analyst", interests=["market"])
    reader = await field_client.register("reader", "analyst", interests=["market"])
    return field_client, writer, reader


async def webhook(agent: AgentClient, url: str, **delivery: Any) -> dict[str, Any]:
    payload = {
        "action": "subscribe",
        "subscription": {
            "events": ["memory.recorded"],
            "delivery": {"type": "webhook", "url": url, **delivery},
        },
    }
    assert_valid("subscribe.request", payload)
    response = await agent.send("SUBSCRIBE", payload)
    assert_valid("subscribe.response", response)
    return response


async def note(agent: AgentClient, content: str) -> dict[str, Any]:
    return await agent.record("finding", content, purpose="p", confidence=0.5, reasoning="r")


async def delivery_of(agent: AgentClient, subscription_id: str) -> dict[str, Any]:
    response = await agent.send("SUBSCRIBE", {"action": "list"})
    assert_valid("subscribe.response", response)
    (found,) = [s for s in response["subscriptions"] if s["id"] == subscription_id]
    return dict(found["delivery"])


async def until_delivery(
    agent: AgentClient, subscription_id: str, done: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """Poll SUBSCRIBE list until the delivery's state satisfies ``done`` (a state the
    server reaches without telling anyone: polled, with a deadline)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        delivery = await delivery_of(agent, subscription_id)
        if done(delivery):
            return delivery
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {delivery}"
        await asyncio.sleep(0.02)


def in_order_without_loss(receiver: Receiver, cursors: list[str]) -> None:
    """Delivered exactly ``cursors``, in order; a repeat only with the same webhook-id."""
    seen: dict[str, bytes] = {}
    for r in receiver.received:
        assert r.headers["webhook-id"] == r.cursor
        if r.cursor in seen:
            assert seen[r.cursor] == r.body, "a retry carries the same body"
        seen[r.cursor] = r.body
    delivered = list(dict.fromkeys(r.cursor for r in receiver.delivered))
    assert delivered == cursors


# -- what a webhook receives -------------------------------------------------------------


async def test_a_webhook_gets_what_the_stream_carries_signed_both_ways(
    server: ThreadedServer, receivers: Callable[..., Any]
) -> None:
    receiver = await receivers()
    field_client, writer, reader = await agents(server.url)
    async with field_client, aiohttp.ClientSession() as session:
        subscribed = await webhook(reader, receiver.url)
        secret = subscribed["subscription"]["delivery"]["secret"]
        assert secret.startswith("whsec_")
        url = subscribed["sse_url"]
        async with sse_stream(session, url, reader.token, since=subscribed["cursor"]) as sse:
            for i in range(5):
                await note(writer, f"market finding {i}")
            streamed = []
            while len(streamed) < 5:
                event = await sse.next()
                assert event is not None
                if event.id is not None:
                    streamed.append(event)
        await receiver.until(lambda: len(receiver.delivered) == 5, "5 deliveries")
        assert [orjson.loads(r.body) for r in receiver.delivered] == [e.data for e in streamed]
        assert [r.cursor for r in receiver.delivered] == [e.id for e in streamed]
        verifier = Webhook(secret)
        for r in receiver.delivered:
            headers = {k.lower(): v for k, v in r.headers.items()}
            verifier.verify(r.body, headers)  # raises unless the Standard Webhooks check holds
            expected = hmac.new(secret.encode(), r.body, hashlib.sha256).hexdigest()
            assert hmac.compare_digest(headers["x-hub-signature-256"], f"sha256={expected}")
            assert headers["content-type"] == "application/json"
            assert headers["user-agent"].startswith("akashik-field/")
            assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
        # the secret is shown once: SUBSCRIBE list never shows it
        delivery = await delivery_of(reader, subscribed["subscription_id"])
        last = receiver.delivered[-1].cursor
        delivery = await until_delivery(
            reader, subscribed["subscription_id"], lambda d: d["acked_cursor"] == last, "acked"
        )
        assert "secret" not in delivery and delivery["state"] == "active"
        assert delivery["last_status"] == 200 and delivery["attempts"] == 0


async def test_a_given_secret_signs_and_a_malformed_one_is_refused(
    server: ThreadedServer, receivers: Callable[..., Any]
) -> None:
    receiver = await receivers()
    field_client, writer, reader = await agents(server.url)
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # 24 bytes
    async with field_client:
        await webhook(reader, receiver.url, secret=secret)
        await note(writer, "market signed with the given secret")
        await receiver.until(lambda: len(receiver.delivered) == 1, "one delivery")
        r = receiver.delivered[0]
        Webhook(secret).verify(r.body, {k.lower(): v for k, v in r.headers.items()})
        for bad in ("whsec_not*base64", "whsec_" + "QUJD", "whsec_"):
            with pytest.raises(FieldClientError) as info:
                await webhook(reader, receiver.url, secret=bad)
            assert info.value.status == 422 and "secret" in info.value.body["message"]


# -- retries, failing, suspended, resumed ------------------------------------------------


async def test_a_receiver_that_fails_then_recovers_gets_everything_in_order(
    server: ThreadedServer, receivers: Callable[..., Any]
) -> None:
    fails = [503, 500, 408, 429]  # retried; 429 with Retry-After: 1
    receiver = await receivers(answer=lambda n: fails[n] if n < len(fails) else 200)
    field_client, writer, reader = await agents(server.url)
    async with field_client:
        await webhook(reader, receiver.url)
        for i in range(6):
            await note(writer, f"market {i}")
        await receiver.until(lambda: len(receiver.delivered) == 6, "six deliveries")
        in_order_without_loss(receiver, list(dict.fromkeys(r.cursor for r in receiver.received)))
        assert len(receiver.received) == 6 + len(fails)
        # the attempt after the 429 waited for its Retry-After
        after_429 = receiver.received[len(fails)]
        before = int(receiver.received[len(fails) - 1].headers["webhook-timestamp"])
        assert int(after_429.headers["webhook-timestamp"]) >= before + 1


async def test_a_refusal_makes_the_delivery_failing_and_resume_delivers_everything(
    server: ThreadedServer, receivers: Callable[..., Any]
) -> None:
    status = {"now": 410}
    receiver = await receivers(answer=lambda n: status["now"])
    field_client, writer, reader = await agents(server.url)
    async with field_client:
        subscribed = await webhook(reader, receiver.url)
        sid = subscribed["subscription_id"]
        for i in range(3):
            await note(writer, f"market {i}")
        failing = await until_delivery(reader, sid, lambda d: d["state"] == "failing", "failing")
        assert failing["last_status"] == 410 and failing["attempts"] >= 1
        assert "410" in failing["last_error"] and failing["next_attempt_at"] is not None
        assert failing["acked_cursor"] == subscribed["cursor"], "nothing was acknowledged"
        status["now"] = 200
        resumed = await reader.send("SUBSCRIBE", {"action": "resume", "subscription": {"id": sid}})
        assert_valid("subscribe.response", resumed)
        assert (
            resumed["resumed"] is True and resumed["subscription"]["delivery"]["state"] == "active"
        )
        await receiver.until(lambda: len(receiver.delivered) == 3, "three deliveries")
        cursors = list(dict.fromkeys(r.cursor for r in receiver.received))
        in_order_without_loss(receiver, cursors)
        assert len(cursors) == 3
        done = await until_delivery(
            reader, sid, lambda d: d["acked_cursor"] == cursors[-1], "the acknowledgement"
        )
        assert done["state"] == "active" and done["last_error"] is None


async def test_failing_too_long_suspends_and_nothing_is_lost(
    server_factory: Callable[..., ThreadedServer], receivers: Callable[..., Any]
) -> None:
    server = server_factory(
        webhook_allow_net=("127.0.0.0/8",),
        webhook_max_attempts=2,
        webhook_failing_interval=0.05,
        webhook_suspend_after=0.3,
        **FAST_RETRIES,
    )
    status = {"now": 500}
    receiver = await receivers(answer=lambda n: status["now"])
    field_client, writer, reader = await agents(server.url)
    async with field_client:
        sid = (await webhook(reader, receiver.url))["subscription_id"]
        for i in range(4):
            await note(writer, f"market {i}")
        suspended = await until_delivery(
            reader, sid, lambda d: d["state"] == "suspended", "suspended"
        )
        assert suspended["last_status"] == 500
        attempts = len(receiver.received)
        # suspended: no more attempts however long one waits for a witness to be served
        witness = await receivers()
        await webhook(reader, witness.url)
        await note(writer, "market witness")
        await witness.until(lambda: len(witness.delivered) == 1, "the witness")
        assert len(receiver.received) == attempts
        status["now"] = 200
        await reader.send("SUBSCRIBE", {"action": "resume", "subscription": {"id": sid}})
        await receiver.until(lambda: len(receiver.delivered) == 5, "every notification")
        in_order_without_loss(receiver, list(dict.fromkeys(r.cursor for r in receiver.received)))


async def test_resume_is_refused_where_there_is_nothing_to_resume(
    server: ThreadedServer, receivers: Callable[..., Any]
) -> None:
    receiver = await receivers()
    field_client, writer, reader = await agents(server.url)
    async with field_client:
        stream = await reader.send(
            "SUBSCRIBE", {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}}
        )
        active = await webhook(reader, receiver.url)
        for sid in (stream["subscription_id"], active["subscription_id"]):
            with pytest.raises(FieldClientError) as info:
                await reader.send("SUBSCRIBE", {"action": "resume", "subscription": {"id": sid}})
            assert (info.value.status, info.value.code) == (409, "INVALID_TRANSITION")
        with pytest.raises(FieldClientError) as info:
            await writer.send(
                "SUBSCRIBE",
                {"action": "resume", "subscription": {"id": active["subscription_id"]}},
            )
        assert info.value.code == "FORBIDDEN"


# -- isolation ---------------------------------------------------------------------------


async def test_a_hanging_receiver_holds_up_no_one_else(
    server_factory: Callable[..., ThreadedServer], receivers: Callable[..., Any]
) -> None:
    server = server_factory(webhook_allow_net=("127.0.0.0/8",), webhook_timeout=30, **FAST_RETRIES)
    gate = asyncio.Event()
    hanging = await receivers(gate=gate)
    healthy = await receivers()
    field_client, writer, reader = await agents(server.url)
    async with field_client, aiohttp.ClientSession() as session:
        await webhook(reader, hanging.url)
        await webhook(reader, healthy.url)
        for i in range(10):
            await note(writer, f"market {i}")
        await healthy.until(lambda: len(healthy.delivered) == 10, "ten deliveries")
        # the writer, the status page and other streams are served meanwhile
        async with session.get(server.url + "/v1/field/status") as reply:
            assert reply.status == 200
        assert hanging.received == []  # its first request still hangs
        gate.set()
        await hanging.until(lambda: len(hanging.delivered) == 10, "the rest, once released")
        in_order_without_loss(hanging, [r.cursor for r in healthy.delivered])


# -- where a webhook may go ----------------------------------------------------------------

REFUSED = [
    ("http://127.0.0.1:9/x", "loopback"),
    ("http://localhost:9/x", "loopback"),
    ("http://10.1.2.3/x", "private"),
    ("http://172.16.0.1/x", "private"),
    ("http://192.168.1.1/x", "private"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("http://224.0.0.1/x", "multicast"),
    ("http://0.0.0.0/x", "unspecified"),
    ("http://100.64.0.1/x", ""),
    ("http://[::1]/x", "loopback"),
    ("http://[fe80::1]/x", "link-local"),
    ("http://[fc00::1]/x", ""),
    ("http://[ff02::1]/x", "multicast"),
    ("http://[::]/x", "unspecified"),
    ("http://[::ffff:127.0.0.1]/x", "loopback"),
    ("http://[::ffff:10.0.0.1]/x", "private"),
    ("http://2130706433/x", ""),
    ("http://user:pw@example.com/x", ""),
    ("ftp://example.com/x", ""),
    ("file:///etc/passwd", ""),
]


@pytest.mark.parametrize(("url", "word"), REFUSED, ids=[u for u, _ in REFUSED])
async def test_a_webhook_url_the_field_may_not_reach_is_refused_at_subscribe(
    field_server: ThreadedServer, url: str, word: str
) -> None:
    async with FieldClient(field_server.url) as field_client:
        reader = await field_client.register("reader", "analyst")
        with pytest.raises(FieldClientError) as info:
            await webhook(reader, url)
        body = info.value.body
        assert info.value.status == 422 and body["code"] == "INVALID_PAYLOAD"
        assert word in body["details"]["reason"]
        assert (await reader.send("SUBSCRIBE", {"action": "list"}))["subscriptions"] == []


async def test_a_name_that_resolves_elsewhere_at_connect_time_is_not_reached(
    field_server: ThreadedServer,
    receivers: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DNS rebinding: accepted while its name resolved to a public address, the URL is
    refused at connect time once the name points at loopback; the receiver sees nothing."""
    from field.engine import egress

    receiver = await receivers()
    port = int(receiver.url.split(":")[2].split("/")[0])

    async def public(host: str, port: int) -> list[str]:
        return ["93.184.216.34"]

    real = socket.getaddrinfo

    def rebound(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == "rebind.test" else host, *args, **kwargs)

    monkeypatch.setattr(egress, "_getaddrinfo", public)
    monkeypatch.setattr(socket, "getaddrinfo", rebound)
    async with FieldClient(field_server.url) as field_client:
        writer = await field_client.register("writer", "analyst")
        reader = await field_client.register("reader", "analyst")
        sid = (await webhook(reader, f"http://rebind.test:{port}/hook"))["subscription_id"]
        await note(writer, "market")
        failed = await until_delivery(
            reader, sid, lambda d: d["attempts"] >= 1, "an attempt refused at connect"
        )
        assert "egress policy" in failed["last_error"] and failed["last_status"] is None
        assert receiver.received == []


# -- the end of a subscription, and a crash ------------------------------------------------


async def test_unsubscribing_delivers_what_was_owed_and_nothing_after(
    server: ThreadedServer, receivers: Callable[..., Any]
) -> None:
    gate = asyncio.Event()
    slow = await receivers(gate=gate)
    witness = await receivers()
    field_client, writer, reader = await agents(server.url)
    async with field_client:
        subscribed = await webhook(reader, slow.url)
        sid = subscribed["subscription_id"]
        secret = subscribed["subscription"]["delivery"]["secret"]
        await webhook(reader, witness.url)
        owed = [(await note(writer, f"market {i}"))["memory_unit_id"] for i in range(4)]
        await reader.send("SUBSCRIBE", {"action": "unsubscribe", "subscription": {"id": sid}})
        await note(writer, "market after the end")
        await witness.until(lambda: len(witness.delivered) == 5, "the witness")
        gate.set()
        await slow.until(lambda: len(slow.delivered) == 5, "what was owed, then the final")
        *notifications, final = slow.delivered
        units = [orjson.loads(r.body)["memory_unit_id"] for r in notifications]
        assert units == owed
        # the last POST says the subscription ended, and why; signed like the rest
        ended = orjson.loads(final.body)
        assert ended["final"] is True and ended["reason"] == "unsubscribed"
        assert ended["subscription_id"] == sid and ended["cursor"] == notifications[-1].cursor
        assert final.headers["webhook-id"] == f"{sid}.final"
        Webhook(secret).verify(final.body, {k.lower(): v for k, v in final.headers.items()})
        # the delivery has ended: a later unit reaches the witness, and not it
        await note(writer, "market later still")
        await witness.until(lambda: len(witness.delivered) == 6, "the witness again")
        assert len(slow.delivered) == 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_after_a_sigkill_every_owed_notification_arrives_in_order(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """The receiver is down while the Field records and is killed; both come back: the
    receiver ends with everything, in order, duplicates only with the same webhook-id."""
    port = free_port()
    flags = (
        "--webhook-allow-net",
        "127.0.0.0/8",
        "--webhook-retry-base",
        "0.05",
        "--webhook-retry-cap",
        "0.2",
    )
    field_process = server_process(tmp_path / "data", *flags)
    async with FieldClient(field_process.url) as field_client:
        writer = await field_client.register("writer", "analyst")
        reader = await field_client.register("reader", "analyst")
        subscribed = await webhook(reader, f"http://127.0.0.1:{port}/hook")
        units = [(await note(writer, f"market {i}"))["memory_unit_id"] for i in range(5)]
        tokens = (writer.token, reader.token)
    field_process.stop(signal.SIGKILL)
    receiver = await Receiver().start(port)
    try:
        restarted = server_process(tmp_path / "data", *flags)
        async with FieldClient(restarted.url) as field_client:
            writer = field_client.agent("writer", tokens[0])
            units.append((await note(writer, "market after the restart"))["memory_unit_id"])
            await receiver.until(lambda: len(receiver.delivered) >= 6, "six deliveries")
            got = list(dict.fromkeys(r.cursor for r in receiver.received))
            in_order_without_loss(receiver, got)
            delivered = {
                r.cursor: orjson.loads(r.body)["memory_unit_id"] for r in receiver.delivered
            }
            assert [delivered[c] for c in got] == units
            reader = field_client.agent("reader", tokens[1])
            delivery = await delivery_of(reader, subscribed["subscription_id"])
            assert delivery["state"] == "active"
        assert restarted.stop() == 0
    finally:
        await receiver.stop()


# -- settings ---------------------------------------------------------------------------


def test_delivery_settings_come_from_flags_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from field.cli.main import _config, _parser

    monkeypatch.setenv("FIELD_WEBHOOK_ALLOW_NET", "10.0.0.0/8, fd00::/8")
    monkeypatch.setenv("FIELD_WEBHOOK_TIMEOUT", "9")
    monkeypatch.setenv("FIELD_MAX_SUBSCRIPTIONS_PER_THREAD", "4")
    monkeypatch.setenv("FIELD_DELIVERY_RATE", "20")
    monkeypatch.setenv("FIELD_WEBHOOK_CONCURRENCY_PER_AGENT", "16")
    args = _parser().parse_args(
        ["serve", "--webhook-timeout", "3", "--webhook-max-attempts", "2",
         "--delivery-burst", "7", "--webhook-retry-base", "0.5"]
    )  # fmt: skip
    config = _config(args)
    settings = config.delivery_settings()
    assert settings.timeout == 3  # the flag wins
    assert (settings.rate, settings.burst) == (20, 7)
    assert (settings.retry.max_attempts, settings.retry.base) == (2, 0.5)
    assert settings.concurrency_per_agent == 16
    assert config.limits.max_subscriptions_per_thread == 4
    policy = config.egress_policy()
    assert policy.check_url("http://10.1.2.3/x") == ("http", "10.1.2.3", 80)
    assert isinstance(policy.check_url("http://192.168.0.1/x"), str)
    args = _parser().parse_args(
        ["serve", "--webhook-allow-net", "127.0.0.0/8", "--webhook-allow-net", "::1/128"]
    )
    assert _config(args).webhook_allow_net == ("127.0.0.0/8", "::1/128")


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--webhook-allow-net", "10.0.0.1/8", "10.0.0.1/8"),
        ("--webhook-allow-net", "nowhere", "nowhere"),
        ("--webhook-timeout", "0", "webhook_timeout must be a positive number"),
        ("--webhook-concurrency", "0", "webhook_concurrency must be at least 1"),
        ("--webhook-concurrency-per-agent", "0", "webhook_concurrency_per_agent must be at"),
        ("--delivery-rate", "-1", "delivery_rate must be a positive number"),
        ("--max-subscriptions-per-thread", "0", "max_subscriptions_per_thread"),
    ],
)
def test_bad_delivery_settings_end_field_serve_with_one_line(
    tmp_path: Path, flag: str, value: str, message: str
) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "field", "serve", "--data-dir", str(tmp_path / "d"), flag, value],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "d").exists()


def test_an_unreadable_webhook_key_ends_field_serve_with_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    key = tmp_path / "webhook.key"
    key.write_text("not a key, and not to be shown\n")
    result = subprocess.run(
        [sys.executable, "-m", "field", "serve", "--port", "0", "--data-dir",
         str(tmp_path / "d"), "--webhook-key-file", str(key)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "webhook key" in errors[0] and str(key) in errors[0]
    assert "not to be shown" not in result.stderr


async def test_the_data_directory_gets_a_private_key_that_survives_restarts(
    server_process: Callable[..., ServerProcess],
    tmp_path: Path,
    receivers: Callable[..., Any],
) -> None:
    """A webhook made before a restart is signed with the same secret after it: the
    secret is sealed in the log under <data-dir>/webhook.key, which is 0600."""
    receiver = await receivers()
    flags = ("--webhook-allow-net", "127.0.0.0/8")
    first = server_process(tmp_path / "data", *flags)
    async with FieldClient(first.url) as field_client:
        writer = await field_client.register("writer", "analyst")
        reader = await field_client.register("reader", "analyst")
        secret = (await webhook(reader, receiver.url))["subscription"]["delivery"]["secret"]
        token = writer.token
    assert first.stop() == 0
    key = tmp_path / "data" / "webhook.key"
    assert key.stat().st_mode & 0o777 == 0o600
    stored = b"".join(p.read_bytes() for p in (tmp_path / "data").iterdir() if p != key)
    assert b"whsec_" not in stored and secret.encode() not in stored
    second = server_process(tmp_path / "data", *flags)
    async with FieldClient(second.url) as field_client:
        await note(field_client.agent("writer", token), "market after a restart")
        await receiver.until(lambda: len(receiver.delivered) == 1, "a delivery")
        r = receiver.delivered[0]
        Webhook(secret).verify(r.body, {k.lower(): v for k, v in r.headers.items()})
    assert second.stop() == 0


# -- dormant deliveries ---------------------------------------------------------------------


async def until_dormant(server: ThreadedServer, subscription_id: str, dormant: bool) -> None:
    """Wait until the hub holds the delivery dormant (or attached), as its sweeps decide."""
    hub = server.app.state.push_hub
    deadline = time.monotonic() + TIMEOUT
    while hub.is_dormant(subscription_id) != dormant:
        assert time.monotonic() < deadline, f"the delivery never became dormant={dormant}"
        await asyncio.sleep(0.02)  # the server's sweeps run on their own timer: poll


async def test_a_caught_up_delivery_rests_and_a_match_or_its_end_wakes_it(
    server_factory: Callable[..., ThreadedServer], receivers: Callable[..., Any]
) -> None:
    server = server_factory(
        webhook_allow_net=("127.0.0.0/8",), delivery_rest_after=0.1, **FAST_RETRIES
    )
    receiver = await receivers()
    field_client, writer, reader = await agents(server.url)
    async with field_client:
        sid = (await webhook(reader, receiver.url))["subscription_id"]
        await until_dormant(server, sid, True)  # owing nothing, it starts dormant
        units = []
        for round_ in range(3):
            units.append((await note(writer, f"market {round_}"))["memory_unit_id"])
            await receiver.until(lambda: len(receiver.delivered) == len(units), "a delivery")
            await until_dormant(server, sid, True)  # idle again: it lets go of the hub
        assert [orjson.loads(r.body)["memory_unit_id"] for r in receiver.delivered] == units
        in_order_without_loss(receiver, [r.cursor for r in receiver.delivered])
        # a unit the subscription does not match leaves it dormant
        await reader.record("finding", "market own", purpose="p", confidence=0.5, reasoning="r")
        await reader.send("SUBSCRIBE", {"action": "list"})  # the record's batch is routed
        assert server.app.state.push_hub.is_dormant(sid)
        # its end wakes it: the final POST
        await reader.send("SUBSCRIBE", {"action": "unsubscribe", "subscription": {"id": sid}})
        await receiver.until(lambda: len(receiver.delivered) == 4, "the final POST")
        assert orjson.loads(receiver.delivered[-1].body)["final"] is True
        await until_dormant(server, sid, False)


async def test_a_delivery_whose_stream_the_hub_ends_reads_on_from_the_log(
    server: ThreadedServer, receivers: Callable[..., Any]
) -> None:
    """When a replay or catch-up cannot read the log, the hub ends the stream (1011) with
    nothing more to say; the delivery reads on from what it delivered, and nothing owed is
    lost (it stayed attached to the ended stream, delivering nothing more)."""
    receiver = await receivers()
    field_client, writer, reader = await agents(server.url)
    async with field_client:
        await webhook(reader, receiver.url)
        units = [(await note(writer, "market 0"))["memory_unit_id"]]
        await receiver.until(lambda: len(receiver.delivered) == 1, "the first delivery")
        hub = server.app.state.push_hub
        loop = server.app.state.service._writer.get_loop()
        ended = asyncio.get_running_loop().create_future()

        def end_the_sinks_stream() -> None:  # what PushHub._replay does when a read fails
            sinks = [c for c in hub.router.connections if c.kind == "webhook"]
            for connection in sinks:
                hub.end(connection, 1011, "replay failed", None)
            ended.get_loop().call_soon_threadsafe(ended.set_result, len(sinks))

        loop.call_soon_threadsafe(end_the_sinks_stream)
        assert await asyncio.wait_for(ended, TIMEOUT) == 1
        for i in (1, 2):
            units.append((await note(writer, f"market {i}"))["memory_unit_id"])
        await receiver.until(lambda: len(receiver.delivered) == 3, "the deliveries after it")
        assert [orjson.loads(r.body)["memory_unit_id"] for r in receiver.delivered] == units
        in_order_without_loss(receiver, [r.cursor for r in receiver.delivered])
