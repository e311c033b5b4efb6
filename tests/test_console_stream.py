"""The console's snapshot stream (``GET /v1/console/stream``) and its page's files.

Real servers on loopback, read with aiohttp: who may open a stream, what a
snapshot holds for the operator and for an agent, the caps, the end of a
stream whose agent deregistered or whose server stops.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from field.client import AgentClient, FieldClient, Relation
from field.client.sse import SSEParser
from field.contract.model import Limits
from field.core.egress import EgressPolicy
from field.core.field import Field
from field.core.secrets import SecretBox
from field.engine.delivery import DeliveryEngine, DeliverySettings
from field.engine.outbox import Outbox
from field.engine.push import PushHub
from field.engine.ratelimits import AgentRateLimits
from field.engine.router import Frame
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog
from field.transports import console
from field.transports.console import ConsoleFeed, viewer_of
from field.transports.door import FrontDoor
from field.transports.http import HTTPBinding
from field.transports.runtime import Running, Runtime

from .conftest import UNLOADED_POLICY, ServerProcess, ThreadedServer
from .schema_util import assert_valid

OPERATOR_TOKEN = "console-operator-token-0123456789"
#: Seconds any awaited stream state may take (a snapshot comes at least once a second).
WAIT = 15


class ConsoleStream:
    """One open console stream: its events, in order, with bounded waits."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.parser = SSEParser(max_bytes=console.MAX_SNAPSHOT_BYTES)
        self.pending: list[tuple[str, Any]] = []

    async def next(self) -> tuple[str, Any] | None:
        """The next event (name, decoded data), or None once the stream has ended."""
        async with asyncio.timeout(WAIT):
            while not self.pending:
                chunk = await self.response.content.readany()
                if not chunk:
                    return None
                self.pending.extend(
                    (e.event, orjson.loads(e.data)) for e in self.parser.feed(chunk)
                )
        return self.pending.pop(0)

    async def snapshot(self, until: Callable[[dict[str, Any]], bool] = lambda _: True) -> Any:
        """The first snapshot for which ``until`` holds."""
        async with asyncio.timeout(WAIT):
            while True:
                event = await self.next()
                assert event is not None, "the stream ended"
                name, data = event
                assert name == "snapshot", event
                assert_valid("console-snapshot", data)
                if until(data):
                    return data


@asynccontextmanager
async def console_stream(url: str, token: str | None) -> AsyncIterator[ConsoleStream]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(url + "/v1/console/stream", headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield ConsoleStream(response)


async def refusal(url: str, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(url + "/v1/console/stream", headers=headers) as response,
    ):
        body = await response.json()
        assert_valid("error", body)
        return response.status, body


@pytest.fixture
def server(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    return server_factory(operator_token=OPERATOR_TOKEN)


async def a_conflict(alice: AgentClient, bob: AgentClient) -> str:
    first = await alice.record(
        "finding", "Churn fell to 2% in March.", purpose="Track churn", confidence=0.9,
        reasoning="From the billing export.",
    )  # fmt: skip
    second = await bob.record(
        "finding", "Churn rose to 5% in March.", purpose="Track churn", confidence=0.6,
        reasoning="From the CRM.", relations=[Relation("contradicts", first["memory_unit_id"])],
    )  # fmt: skip
    (conflict_id,) = second["conflicts_detected"]
    return str(conflict_id)


# -- who may open a stream ------------------------------------------------------------


async def test_a_stream_needs_a_valid_token(server: ThreadedServer) -> None:
    assert (await refusal(server.url, None))[1]["code"] == "UNAUTHENTICATED"
    status, body = await refusal(server.url, "not-a-token-of-this-field")
    assert (status, body["code"]) == (401, "UNAUTHENTICATED")
    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "researcher")
        await alice.deregister()
    status, body = await refusal(server.url, alice.token)
    assert (status, body["code"]) == (401, "AGENT_NOT_REGISTERED")


async def test_the_operator_sees_the_whole_field(server: ThreadedServer) -> None:
    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        alice = await field.register("alice", "researcher", interests=["churn"])
        bob = await field.register("bob", "strategist")
        conflict_id = await a_conflict(alice, bob)
        subscription = await bob.subscribe(["memory.recorded"], name="watch")
        sse = await http.get(subscription.sse_url, headers={"Authorization": f"Bearer {bob.token}"})
        async with sse, console_stream(server.url, OPERATOR_TOKEN) as stream:
            snapshot = await stream.snapshot(
                lambda s: (
                    s["history"]
                    and s["agents"]["listed"][0]["connections"] == {"sse": 1}
                    and any(sub["readers"] for sub in s["subscriptions"]["listed"])
                )
            )
    assert snapshot["viewer"] == {
        "id": "operator", "role": "human_operator", "authority": 10, "operator": True,
        "may_merge": True,
    }  # fmt: skip
    assert snapshot["field"]["counts"]["conflicts"] == {"total": 1, "unresolved": 1}
    agents = snapshot["agents"]
    assert (agents["total"], agents["by_status"]) == (2, {"idle": 2})
    # connected agents come first; each agent is a wire Agent plus its connections
    assert [a["agent"]["id"] for a in agents["listed"]] == ["bob", "alice"]
    assert agents["listed"][1]["connections"] == {}
    assert snapshot["connections"] == {"sse": 1, "console": 1}
    (conflict,) = snapshot["conflicts"]["listed"]
    assert (snapshot["conflicts"]["open"], conflict["conflict"]["id"]) == (1, conflict_id)
    assert conflict["units"]["unit_a"]["content"] == "Churn fell to 2% in March."
    assert conflict["units"]["unit_b"]["agent_id"] == "bob"
    (listed,) = snapshot["subscriptions"]["listed"]
    shown = listed["subscription"]
    assert (shown["id"], shown["name"], shown["agent_id"]) == (subscription.id, "watch", "bob")
    assert listed["readers"] == {"sse": 1}
    assert (listed["lag"], listed["outbox"], listed["replaying"]) == (0, 0, False)
    sample = snapshot["history"][-1]
    assert snapshot["rates"] == sample


async def test_an_agent_sees_what_it_may(server: ThreadedServer) -> None:
    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "researcher")
        bob = await field.register("bob", "strategist")
        await a_conflict(alice, bob)
        # a conflict inside a session alice is no member of: hers to not see
        created = await bob.session("create", name="private")
        bob.session_id = created["session"]["id"]
        await a_conflict(bob, bob)
        await bob.subscribe(["memory.recorded"], name="bobs")
        mine = await alice.subscribe(["conflict.detected"], name="alices")
        async with console_stream(server.url, alice.token) as stream:
            snapshot = await stream.snapshot()
        async with console_stream(server.url, OPERATOR_TOKEN) as stream:
            everything = await stream.snapshot()
    assert snapshot["viewer"] == {
        "id": "alice", "role": "researcher", "authority": 4, "operator": False,
        "may_merge": False,
    }  # fmt: skip
    assert snapshot["conflicts"]["open"] == 1
    assert everything["conflicts"]["open"] == 2
    assert [s["subscription"]["id"] for s in snapshot["subscriptions"]["listed"]] == [mine.id]
    assert snapshot["subscriptions"]["total"] == 1
    assert everything["subscriptions"]["total"] == 2
    assert snapshot["subscriptions"]["listed"][0]["lag"] is None  # nothing reads it now


async def test_a_senior_agent_may_merge(server: ThreadedServer) -> None:
    async with FieldClient(server.url) as field:
        senior = await field.register("sam", "lead", authority=6, operator_token=OPERATOR_TOKEN)
        async with console_stream(server.url, senior.token) as stream:
            snapshot = await stream.snapshot()
    assert snapshot["viewer"]["may_merge"] is True


async def test_lists_are_cut_and_their_totals_given(
    server: ThreadedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console, "LISTED_AGENTS", 3)
    async with FieldClient(server.url) as field:
        for n in range(5):
            await field.register(f"agent-{n}", "worker")
        async with console_stream(server.url, OPERATOR_TOKEN) as stream:
            snapshot = await stream.snapshot(lambda s: s["agents"]["total"] == 5)
    listed = [a["agent"]["id"] for a in snapshot["agents"]["listed"]]
    assert listed == ["agent-0", "agent-1", "agent-2"]


async def test_a_change_is_shown(server: ThreadedServer) -> None:
    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "researcher")
        async with console_stream(server.url, OPERATOR_TOKEN) as stream:
            first = await stream.snapshot()
            recorded = await alice.record(
                "finding", "Churn fell.", purpose="Track churn", confidence=0.9, reasoning="Data."
            )
            later = await stream.snapshot(lambda s: s["field"]["epoch"] >= recorded["epoch"])
            # the RECORD is sampled: one operation answered, one batch delivered
            sampled = await stream.snapshot(
                lambda s: (
                    any(p["operation_latency_ms"] for p in s["history"])
                    and any(p["delivery_latency_ms"] for p in s["history"])
                )
            )
    assert later["field"]["counts"]["memory_units"] == {"active": 1}
    assert first["field"]["counts"]["memory_units"] == {}
    (answered,) = [p for p in sampled["history"] if p["operation_latency_ms"]]
    assert answered["operations_per_s"] > 0
    (delivered,) = [p for p in sampled["history"] if p["delivery_latency_ms"]]
    assert delivered["entries_per_s"] > 0


# -- bounds and ends --------------------------------------------------------------------


async def test_streams_are_capped_for_each_viewer(server: ThreadedServer) -> None:
    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "researcher")
    url = server.url + "/v1/console/stream"
    headers = {"Authorization": f"Bearer {alice.token}"}
    async with aiohttp.ClientSession() as http:
        opened = [
            await http.get(url, headers=headers) for _ in range(console.MAX_STREAMS_PER_VIEWER)
        ]
        try:
            assert [r.status for r in opened] == [200] * console.MAX_STREAMS_PER_VIEWER
            status, body = await refusal(server.url, alice.token)
            assert (status, body["code"]) == (429, "TOO_MANY_CONNECTIONS")
            assert body["recoverable"] is True
            # the operator is not counted with the agents
            async with console_stream(server.url, OPERATOR_TOKEN) as stream:
                await stream.snapshot()
                opened.pop().close()
                # once the server has let go of the closed one, there is room again
                await stream.snapshot(lambda s: s["connections"].get("console") == 4)
            async with console_stream(server.url, alice.token) as again:
                await again.snapshot()
        finally:
            for response in opened:
                response.close()


async def test_a_stream_ends_when_its_agent_deregisters(server: ThreadedServer) -> None:
    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "researcher")
        async with console_stream(server.url, alice.token) as stream:
            await stream.snapshot()
            await alice.deregister()
            events = []
            while (event := await stream.next()) is not None:
                events.append(event)
    assert events[-1] == (
        "end",
        {"reason": "the viewer's token is no longer valid (agent deregistered)"},
    )
    assert all(name == "snapshot" for name, _ in events[:-1])


@pytest.mark.slow
async def test_sigterm_ends_console_streams(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    token_file = tmp_path / "operator-token"
    token_file.write_text(OPERATOR_TOKEN)
    proc = server_process(tmp_path / "data", "--operator-token-file", str(token_file))
    async with console_stream(proc.url, OPERATOR_TOKEN) as stream:
        await stream.snapshot()
        proc.process.send_signal(signal.SIGTERM)
        events = []
        while (event := await stream.next()) is not None:
            events.append(event)
    assert proc.stop(signal.SIGTERM, timeout=5) == 0
    assert events[-1] == ("shutdown", {"reason": "server shutting down"})
    assert all(name == "snapshot" for name, _ in events[:-1])
    assert [line for line in proc.lines if "ERROR" in line] == []


async def test_lag_is_what_waits_for_a_reader() -> None:
    """In process (the writer, its push hub, no sockets): a reader that has not read yet."""
    service = FieldService(
        MemoryEventLog(), lambda: Field(operator_token=OPERATOR_TOKEN), admission=UNLOADED_POLICY
    )
    hub = PushHub(service)
    box = SecretBox(bytes(32))
    deliveries = DeliveryEngine(
        service, hub, DeliverySettings(), policy=EgressPolicy(), secret_box=box
    )
    runtime = Runtime()
    runtime.start(Running(service, hub, deliveries))
    door = FrontDoor(runtime, rate_limits=AgentRateLimits(None))
    feed = ConsoleFeed(runtime, status=HTTPBinding(runtime, door, limits=Limits()).status)
    tokens: dict[str, str] = {}

    async def send(operation: str, agent: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = {
            "protocol": "akashik", "version": "0.1.0", "id": "m", "operation": operation,
            "agent_id": agent, "session_id": None, "epoch": 0, "payload": payload,
        }  # fmt: skip
        token = tokens.get(agent)
        outcome = await service.execute(lambda f: f.handle(body, token=token))
        return outcome.response

    await service.start()
    try:
        for agent in ("alice", "bob"):
            payload = {"id": agent, "role": "analyst"}
            tokens[agent] = (await send("REGISTER", agent, payload))["token"]
        subscription = {"events": ["memory.recorded"]}
        answer = await send(
            "SUBSCRIBE", "alice", {"action": "subscribe", "subscription": subscription}
        )
        connection = hub.connect("alice", "sse")
        hub.attach(connection, answer["subscription_id"], None)  # queues resume and live
        for n in range(3):
            unit = {
                "type": "finding", "content": f"Reading {n}.", "intent": {"purpose": "lag"},
                "confidence": {"score": 0.5, "reasoning": "a test"},
            }  # fmt: skip
            await send("RECORD", "bob", unit)
        stream = feed.open(hub, viewer_of(service.field, OPERATOR_TOKEN))
        (frame,) = stream.connection.outbox.drain_now(10)
        snapshot = orjson.loads(frame.body)
        assert_valid("console-snapshot", snapshot)
        (listed,) = snapshot["subscriptions"]["listed"]
        assert listed["subscription"]["id"] == answer["subscription_id"]
        assert (listed["readers"], listed["outbox"], listed["lag"]) == ({"sse": 1}, 5, 3)
        assert snapshot["agents"]["listed"][0]["connections"] == {"sse": 1}
        assert snapshot["connections"] == {"sse": 1, "console": 1}
    finally:
        await feed.stop()
        hub.shutdown()
        await service.stop()
    assert not feed.streams and hub.connections == {connection}


def test_lag_counts_a_subscriptions_queued_notifications() -> None:
    outbox = Outbox(max_frames=10, max_bytes=1 << 20)
    for subscription_id, cursor in [("a", "t-1"), ("b", "t-2"), ("a", "t-3"), ("a", None)]:
        outbox.put(Frame(b"{}", "memory.recorded", cursor, subscription_id))
    assert outbox.tally(10) == {"a": 2, "b": 1}  # a control frame is no notification
    assert outbox.tally(3) is None  # more frames than it may look at


# -- the page ---------------------------------------------------------------------------


async def test_the_page_and_its_files(server: ThreadedServer) -> None:
    async with aiohttp.ClientSession() as http:
        for path, media in [
            ("/console", "text/html"),
            ("/console/console.js", "text/javascript"),
            ("/console/console.css", "text/css"),
        ]:
            async with http.get(server.url + path) as response:
                assert response.status == 200
                assert response.headers["content-type"].startswith(media)
                csp = response.headers["content-security-policy"]
                assert "default-src 'none'" in csp and "connect-src 'self'" in csp
                assert response.headers["x-content-type-options"] == "nosniff"
                # nothing is loaded from anywhere else (the SVG namespace is a name, not a load)
                hosts = set(
                    re.findall(r"(?:https?:)?//([\w-]+(?:\.[\w-]+)+)", await response.text())
                )
                assert hosts <= {"www.w3.org"}, (path, hosts)
                # the CSP allows no inline script: no handler in the markup, and the
                # script never parses what the Field sends as HTML
                text = await response.text()
                assert not re.search(r"\son[a-z]+\s*=", text), path
                assert not re.search(
                    r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", text
                )
        async with http.get(server.url + "/console/secrets.txt") as response:
            body = await response.json()
            assert (response.status, body["code"]) == (404, "NOT_FOUND")
            assert_valid("error", body)
        async with http.post(server.url + "/console") as response:
            body = await response.json()
            assert (response.status, body["code"]) == (405, "METHOD_NOT_ALLOWED")


# -- the last hour ----------------------------------------------------------------------


async def test_the_last_hour_is_sampled_without_a_console_and_read_with_a_token(
    server: ThreadedServer,
) -> None:
    """GET /v1/console/history answers the viewer's token like the stream, and the server
    samples whether or not a console is open: no stream was ever opened here."""
    url = f"{server.url}/v1/console/history"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as response:
            assert response.status == 401
            assert_valid("error", await response.json())
        headers = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        async with http.get(url, headers=headers) as response:
            assert response.status == 200 and response.headers["Cache-Control"] == "no-store"
            body = await response.json()
    assert_valid("console-history.response", body)
    assert body["step_seconds"] == console.LONG_STEP


async def test_the_rates_are_sampled_with_no_console_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process: a started feed samples once a second (here every 10 ms) with no stream
    open, and stops when asked."""
    monkeypatch.setattr(console, "SNAPSHOT_SECONDS", 0.01)
    service = FieldService(MemoryEventLog(), Field, admission=UNLOADED_POLICY)
    hub = PushHub(service)
    deliveries = DeliveryEngine(
        service, hub, DeliverySettings(), policy=EgressPolicy(), secret_box=SecretBox(bytes(32))
    )
    runtime = Runtime()
    runtime.start(Running(service, hub, deliveries))
    door = FrontDoor(runtime, rate_limits=AgentRateLimits(None))
    feed = ConsoleFeed(runtime, status=HTTPBinding(runtime, door, limits=Limits()).status)
    await service.start()
    try:
        await feed.start()
        assert not feed.streams
        async with asyncio.timeout(30):
            while len(feed.meter.history) < 3:
                await asyncio.sleep(0.01)
        await feed.stop_sampling()
        taken = len(feed.meter.history)
        await asyncio.sleep(0.05)
        assert len(feed.meter.history) == taken  # stopped
    finally:
        await feed.stop_sampling()
        await service.stop()


def test_an_hour_is_kept_in_steps_of_ten_seconds() -> None:
    """One-second samples fold into samples of LONG_STEP seconds: the rates' means, the
    operation latency weighted by operations, the delivery latency's mean and max; the step
    under way is left out until it ends."""
    clock = [1_000_000.5]
    meter = console.Meter(now=lambda: clock[0], monotonic=lambda: clock[0])
    meter.start(0, (0, 0.0))
    answered = [0, 0.0]
    for second in range(25):  # 1,000,000.5 .. 1,000,024.5: steps ending at ...10 and ...20
        clock[0] += 1
        ops = 2 if second % 2 else 0  # two operations every other second, 4 ms each
        answered = [answered[0] + ops, answered[1] + ops * 0.004]
        if second == 3:
            meter.observe([_entry(clock[0] - 0.005)])
        meter.sample(answered[0], (answered[0], answered[1]))
    first, second_step = meter.hour()
    assert [first["t"], second_step["t"]] == [1_000_010.0, 1_000_020.0]
    # the first step: the seconds ending 1.5 .. 9.5 (nine); ops in four of them
    assert first["operations_per_s"] == round(4 * 2 / 9, 2)
    assert first["operation_latency_ms"] == {"mean": 4.0}
    assert first["delivery_latency_ms"] == {"mean": 5.0, "max": 5.0}
    assert second_step["delivery_latency_ms"] is None
    assert_valid("console-history.response", {"step_seconds": 10, "samples": meter.hour()})


def _entry(ts: float) -> Any:
    from field.contract.model import StoredEntry

    return StoredEntry(1, 1, "memory.recorded", {}, "a", ts)


def test_the_hour_keeps_its_last_360_steps() -> None:
    """Past an hour the oldest step goes first: at most LONG_HISTORY steps, the newest kept."""
    clock = [2_000_000.5]
    meter = console.Meter(now=lambda: clock[0], monotonic=lambda: clock[0])
    meter.start(0, None)
    for _ in range(console.LONG_STEP * (console.LONG_HISTORY + 30)):
        clock[0] += 1
        meter.sample(0, None)
    hour = meter.hour()
    assert len(hour) == console.LONG_HISTORY
    assert hour[-1]["t"] == (clock[0] // console.LONG_STEP) * console.LONG_STEP
    assert hour[0]["t"] == hour[-1]["t"] - console.LONG_STEP * (console.LONG_HISTORY - 1)
