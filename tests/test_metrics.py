"""``GET /metrics``: a real server is scraped before and after real operations.

Every scrape is parsed with prometheus-client's own parser, so what is
checked is what a Prometheus server would read. The numbers must move by
exactly what the test did; labels must stay within their closed sets, however
many agents there are.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from field.client import AgentClient, FieldClient, FieldClientError
from field.engine.admission import Mode, Work
from field.engine.ratelimits import AgentRateLimits
from field.engine.router import PushCounts, PushLimits
from field.transports.access import AccessLog
from field.transports.metrics import OTHER, Metrics
from field.transports.metrics import _notification_latency as notification_latency
from field.transports.runtime import Runtime as FieldRuntime

from .conftest import ThreadedServer
from .test_push import open_ws, record, sse_stream, subscribe
from .test_rap import Runtime
from .test_webhooks import Receiver, webhook

StartServer = Callable[..., ThreadedServer]
#: (metric sample name, its labels) -> value
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
#: Failure guard for a number the server moves without telling anyone (never a pacing delay).
TIMEOUT = 15.0


async def exposition(url: str, accept: str | None = None) -> str:
    """The text of a scrape (the Prometheus text format unless ``accept`` asks another)."""
    headers = {} if accept is None else {"Accept": accept}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/metrics", headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        expected = "text/plain; version=0.0.4" if accept is None else accept
        assert r.headers["Content-Type"].startswith(expected)
        return await r.text()


def parsed(text: str) -> Samples:
    """The samples of a scrape in the text format; every family's name is written once
    (a family a parser splits in two would be read as two of one name, or of names that
    are not the family's)."""
    samples: Samples = {}
    families = list(text_string_to_metric_families(text))
    names = [family.name for family in families]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for family in families:
        for sample in family.samples:
            assert not sample.name.endswith("_created"), sample
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


async def scrape(url: str) -> Samples:
    return parsed(await exposition(url))


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def series(samples: Samples) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """The series of a scrape (what the number of agents must not grow)."""
    return set(samples)


async def until_metric(url: str, done: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape until ``done``: for numbers that move after the client has its answer
    (a webhook's attempt is counted once the receiver has answered)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        samples = await scrape(url)
        if done(samples):
            return samples
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def on_server_loop(server: ThreadedServer, change: Callable[[Any], None]) -> None:
    """Run ``change(app)`` on the server's event loop, between its own steps."""
    loop = server.app.state.service._writer.get_loop()
    done = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_call(change, server.app), loop))
    await asyncio.wait_for(done, TIMEOUT)


async def _call(change: Callable[[Any], None], app: Any) -> None:
    change(app)


#: A REGISTER of agent-b, sent once while writes are shed (503 OVERLOADED, not retried).
REGISTER_B = {
    "protocol": "akashik",
    "version": "0.1.0",
    "id": "m-1",
    "operation": "REGISTER",
    "agent_id": "agent-b",
    "session_id": None,
    "epoch": 0,
    "payload": {"id": "agent-b", "role": "analyst"},
}


def shed_writes(app: Any) -> None:
    """Admission control refuses writes (a target of 0 holds the mode where it is)."""
    controller = app.state.service.admission.controllers[Work.WRITE]
    controller.target, controller.mode = 0, Mode.SHEDDING


async def status(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/field/status") as r:
        body: dict[str, Any] = await r.json()
        return body


async def test_operations_push_and_state_move_the_numbers(field_server: ThreadedServer) -> None:
    url = field_server.url
    before = await scrape(url)
    started = time.monotonic()
    assert value(before, "field_build_info", version="0.1.0") == 1
    async with FieldClient(url) as field, aiohttp.ClientSession() as http:
        a = await field.register("agent-a", "analyst", interests=["market sizing"])
        b = await field.register("agent-b", "researcher", interests=["market sizing"])
        stream = await subscribe(b, ["memory.recorded"])
        sid = stream["subscription_id"]
        with pytest.raises(FieldClientError) as refused:
            await a.send("RECORD", {"type": "finding", "content": "no intent"})
        assert refused.value.code == "MISSING_INTENT"
        async with (
            open_ws(url, b.token, since=[stream["cursor"]]) as honoured,
            open_ws(url, b.token, since=["not-a-cursor"]) as unknown,
            sse_stream(http, stream["sse_url"], b.token) as sse,
        ):
            await honoured.ready()
            await unknown.ready()
            await sse.ready()
            during = await scrape(url)
            for n in range(3):
                await record(a, f"market sizing: finding {n}")
            await honoured.notifications(3)
            await unknown.notifications(3)
            await sse.notifications(3)
            scope = {"role": "researcher", "max_units": 10}
            answer = await honoured.request("ATTUNE", b.id, {"scope": scope})
            assert answer["status"] == 200
        after = await scrape(url)
        elapsed = time.monotonic() - started
        state = await status(url)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    ops = "field_operations_total"
    assert moved(ops, transport="http", operation="REGISTER", outcome="ok") == 2
    assert moved(ops, transport="http", operation="SUBSCRIBE", outcome="ok") == 1
    assert moved(ops, transport="http", operation="RECORD", outcome="ok") == 3
    assert moved(ops, transport="http", operation="RECORD", outcome="MISSING_INTENT") == 1
    assert moved(ops, transport="websocket", operation="ATTUNE", outcome="ok") == 1
    latency = "field_operation_duration_seconds"
    assert moved(f"{latency}_count", operation="RECORD") == 4
    assert moved(f"{latency}_bucket", operation="RECORD", le="+Inf") == 4
    assert 0 < moved(f"{latency}_sum", operation="RECORD") < 4 * 10
    # every operation went through the writer in some batch; every durable batch was routed
    batches = moved("field_writer_batch_operations_count")
    assert 1 <= batches <= moved("field_writer_batch_operations_sum")
    assert moved("field_writer_batch_operations_sum") >= 7
    assert moved("field_push_match_seconds_count") >= 3
    # the state as the status page says it
    assert value(after, "field_log_position") == state["log"]["last_position"]
    assert value(after, "field_node_lag") == 0
    assert value(after, "field_epoch") == state["epoch"]
    assert value(after, "field_log_writable") == 1
    assert value(after, "field_writer_running") == 1
    assert value(after, "field_agents", status="idle") == 2
    assert value(after, "field_subscriptions_active") == 1
    # two WebSockets and a stream were open, and each got the three notifications
    assert value(during, "field_connections", transport="websocket") == 2
    assert value(during, "field_connections", transport="sse") == 1
    assert value(during, "field_outbox_frames_count") == 3
    assert value(during, "field_connections_open") >= 3
    assert value(after, "field_connections", transport="websocket") == 0
    sent = "field_notifications_sent_total"
    assert moved(sent, transport="websocket", event="memory.recorded") == 6
    assert moved(sent, transport="sse", event="memory.recorded") == 3
    resumes = "field_stream_resumes_total"
    assert moved(resumes, transport="websocket", recovered="true") == 1
    assert moved(resumes, transport="websocket", recovered="false") == 1
    assert value(after, resumes, transport="sse", recovered="true") == 0  # no cursor given
    # each notification written once is timed once, in less than the test took
    latency = "field_notification_latency_seconds"
    assert moved(f"{latency}_count", transport="websocket") == 6
    assert moved(f"{latency}_count", transport="sse") == 3
    assert moved(f"{latency}_bucket", transport="sse", le="+Inf") == 3
    assert 0 < moved(f"{latency}_sum", transport="sse") <= 3 * elapsed
    assert value(after, f"{latency}_count", transport="webhook") == 0
    assert sid  # the stream's subscription is the one counted active


async def test_many_agents_make_no_new_series(field_server: ThreadedServer) -> None:
    """Agents, subscriptions and clients are never labels: 40 more agents doing the same
    things add no series, only larger numbers."""
    url = field_server.url

    async def agents_at_work(field: FieldClient, first: int, count: int) -> None:
        for n in range(first, first + count):
            agent = await field.register(f"agent-{n}", "analyst", interests=["pricing"])
            await subscribe(agent, ["memory.recorded"])
            await record(agent, f"pricing: finding of agent {n}")
            with pytest.raises(FieldClientError):
                await agent.send("RECORD", {"type": "finding"})

    async with FieldClient(url) as field:
        await agents_at_work(field, 0, 2)
        few = await scrape(url)
        await agents_at_work(field, 2, 40)
        many = await scrape(url)
    assert series(many) == series(few), series(many) ^ series(few)
    assert value(many, "field_agents", status="idle") == 42
    ok = {"transport": "http", "operation": "REGISTER", "outcome": "ok"}
    assert value(many, "field_operations_total", **ok) == 42


def test_label_values_outside_their_sets_are_other() -> None:
    metrics = Metrics(FieldRuntime(), counts=PushCounts(), rate_limits=AgentRateLimits(None))
    for n in range(50):  # a client's values never become labels, nor stay in memory
        metrics.operation("http", f"OP{n}", f"CODE{n}", 0.001)
    metrics.operation("carrier-pigeon", None, "ok", 0.001)
    metrics.operation("http", "RECORD", "ok", 0.001)
    families = {f.name: f for f in metrics.registry.collect()}
    labels = [s.labels for s in families["field_operations"].samples if s.name.endswith("_total")]
    assert {"transport": "http", "operation": OTHER, "outcome": OTHER} in labels
    assert {"transport": OTHER, "operation": OTHER, "outcome": "ok"} in labels
    assert len(labels) == 3
    assert len(metrics._children) == 1  # only the known key is kept


async def test_refusals_are_counted(server_factory: StartServer) -> None:
    server = server_factory(agent_rate=0.001, agent_burst=1)
    async with FieldClient(server.url) as field:
        agent = await field.register("agent-a", "analyst")
        await record(agent, "one")
        with pytest.raises(FieldClientError) as limited:
            await record(agent, "two: over the rate")
        assert limited.value.code == "RATE_LIMITED"
        await on_server_loop(server, shed_writes)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{server.url}/v1/register", json=REGISTER_B) as r,
        ):
            assert r.status == 503 and (await r.json())["code"] == "OVERLOADED"  # once, no retry
        samples = await scrape(server.url)
    assert value(samples, "field_rate_limited_total", limit="agent") == 1
    assert value(samples, "field_admission_refused_total", work="write") == 1
    assert value(samples, "field_admission_shedding", work="write") == 1
    ops = "field_operations_total"
    limited_op = {"transport": "http", "operation": "RECORD", "outcome": "RATE_LIMITED"}
    assert value(samples, ops, **limited_op) == 1
    shed_op = {"transport": "http", "operation": "REGISTER", "outcome": "OVERLOADED"}
    assert value(samples, ops, **shed_op) == 1


async def test_an_overflow_is_counted(server_factory: StartServer) -> None:
    """A consumer paced at one notification a second with room for four falls behind."""
    server = server_factory(push=PushLimits(outbox_frames=4), notify_rate=1.0, notify_burst=1)
    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        a = await field.register("agent-a", "analyst", interests=["pricing"])
        b = await field.register("agent-b", "analyst", interests=["pricing"])
        stream = await subscribe(b, ["memory.recorded"])
        async with sse_stream(http, stream["sse_url"], b.token) as sse:
            await sse.ready()
            for n in range(8):
                await record(a, f"pricing: finding {n}")
            events = await sse.until(lambda e: e.event == "overflow", timeout=TIMEOUT)
            assert events[-1].data["reason"].startswith("outbox overflow")
        samples = await scrape(server.url)
    overflowed = {"transport": "sse", "reason": "outbox overflow"}
    assert value(samples, "field_outbox_overflows_total", **overflowed) == 1


async def test_webhook_deliveries_retries_and_failures_are_counted(
    server_factory: StartServer,
) -> None:
    server = server_factory(
        webhook_allow_net=("127.0.0.0/8",), webhook_retry_base=0.02, webhook_retry_cap=0.1
    )
    answers = [503, 200, 200, 410]  # a retry, two deliveries, then a refusal: failing
    receiver = await Receiver(answer=lambda n: answers[min(n, len(answers) - 1)]).start()
    try:
        async with FieldClient(server.url) as field:
            writer = await field.register("writer", "analyst", interests=["market"])
            reader = await field.register("reader", "analyst", interests=["market"])
            await webhook(reader, receiver.url)
            for n in range(3):
                await record(writer, f"market {n}")
            await receiver.until(lambda: len(receiver.received) >= 4, "four attempts")

            def counted(samples: Samples) -> bool:
                return value(samples, "field_delivery_state_changes_total", **fail) == 1

            fail = {"transport": "webhook", "action": "fail"}
            samples = await until_metric(server.url, counted, "the delivery failing")
    finally:
        await receiver.stop()
    attempts = "field_delivery_attempts_total"
    assert value(samples, attempts, transport="webhook", result="retry") == 1
    assert value(samples, attempts, transport="webhook", result="delivered") == 2
    assert value(samples, attempts, transport="webhook", result="refused") >= 1
    assert value(samples, "field_deliveries", transport="webhook", state="failing") == 1
    sent = {"transport": "webhook", "event": "memory.recorded"}
    assert value(samples, "field_notifications_sent_total", **sent) == 2


async def test_two_servers_in_one_process_count_apart(server_factory: StartServer) -> None:
    one, two = server_factory(), server_factory()
    async with FieldClient(one.url) as field:
        await field.register("agent-a", "analyst")
    ok = {"transport": "http", "operation": "REGISTER", "outcome": "ok"}
    assert value(await scrape(one.url), "field_operations_total", **ok) == 1
    assert value(await scrape(two.url), "field_operations_total", **ok) == 0


async def test_a_metrics_token_is_asked_for(server_factory: StartServer) -> None:
    token = "metrics-" + "x" * 24
    server = server_factory(metrics_token=token)
    async with aiohttp.ClientSession() as session:
        for headers in ({}, {"Authorization": "Bearer wrong-token"}):
            async with session.get(f"{server.url}/metrics", headers=headers) as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"] == "Bearer"
                body = await r.json()
        assert body["code"] == "UNAUTHENTICATED" and body["recoverable"] is True
        assert body["suggested_action"] and body["message"]
        async with session.get(
            f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"}
        ) as r:
            assert r.status == 200
            assert "field_log_position" in await r.text()
        # OpenMetrics for a scraper that asks for it
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/openmetrics-text"}
        async with session.get(f"{server.url}/metrics", headers=headers) as r:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (await r.text()).endswith("# EOF\n")


async def test_no_metrics_serves_none_and_counts_nothing(server_factory: StartServer) -> None:
    server = server_factory(metrics=False)
    async with aiohttp.ClientSession() as session, session.get(f"{server.url}/metrics") as r:
        assert r.status == 404
        assert (await r.json())["code"] == "NOT_FOUND"
    assert server.app.state.responses is None and server.app.state.guard.responses is None
    assert server.app.state.push_hub.counts is None
    access_layer = server.server.config.app
    assert isinstance(access_layer, AccessLog) and access_layer.responses is None


async def test_metrics_of_an_agent_do_not_need_its_token(field_server: ThreadedServer) -> None:
    """The scrape holds no agent's data: no token is asked for by default, and none shows."""
    async with FieldClient(field_server.url) as field:
        agent: AgentClient = await field.register("agent-a", "analyst")
        await record(agent, "a finding")
        text = await _metrics_text(field_server.url)
    assert agent.token not in text and "agent-a" not in text


async def _metrics_text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as r:
        return await r.text()


async def test_rap_invocations_are_counted(server_factory: StartServer) -> None:
    server = server_factory(webhook_allow_net=("127.0.0.0/8",))
    runtime = await Runtime().start()
    try:
        async with FieldClient(server.url) as field:
            agent = await field.register("analyst-1", "analyst")
            scope = {"scope": {"include_own": True}}
            await runtime.call(server.url, agent.token, "akashik_attune", scope, "call-1")
            samples = await scrape(server.url)  # counted before the tool result was sent
    finally:
        await runtime.stop()
    ok = {"transport": "rap", "operation": "ATTUNE", "outcome": "ok"}
    assert value(samples, "field_operations_total", **ok) == 1


PROMTOOL = shutil.which("promtool")


def promtool_check(text: str) -> None:
    """``promtool check metrics`` (Prometheus's own parser and linter) passes on ``text``."""
    if PROMTOOL is None:
        warnings.warn("promtool is not installed: the scrape is not checked by it", stacklevel=2)
        return
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


async def test_a_scrape_has_one_family_a_metric_and_no_created_series(
    server_factory: StartServer,
) -> None:
    """An outbox in use (a subscriber paced at one notification a second, its frames
    queued): the outbox histogram is one family of buckets, count and sum in the text
    format and one gauge histogram in OpenMetrics; no counter or histogram has a
    ``_created`` twin; promtool finds nothing wrong with the whole scrape."""
    server = server_factory(notify_rate=1.0, notify_burst=1)
    url = server.url
    async with FieldClient(url) as field, aiohttp.ClientSession() as http:
        a = await field.register("agent-a", "analyst", interests=["pricing"])
        b = await field.register("agent-b", "analyst", interests=["pricing"])
        stream = await subscribe(b, ["memory.recorded"])
        async with (
            sse_stream(http, stream["sse_url"], b.token) as sse,
            open_ws(url, a.token) as idle,
        ):
            await sse.ready()
            assert idle  # a push connection of no subscription: its outbox stays empty
            for n in range(5):
                await record(a, f"pricing: finding {n}")

            def queued(samples: Samples) -> bool:
                return (
                    value(samples, "field_outbox_frames_sum") >= 2
                    and value(samples, "field_outbox_frames_count") == 2
                )

            await until_metric(url, queued, "frames queued in the subscriber's outbox")
            text = await exposition(url)
            openmetrics = await exposition(url, "application/openmetrics-text; version=1.0.0")
    samples = parsed(text)
    assert "_created" not in text and "_created" not in openmetrics
    families = {f.name: f for f in text_string_to_metric_families(text)}
    outbox = families["field_outbox_frames"]
    assert outbox.type == "histogram"
    assert {s.name for s in outbox.samples} == {
        f"field_outbox_frames_{suffix}" for suffix in ("bucket", "count", "sum")
    }
    assert not {"field_outbox_frames_gcount", "field_outbox_frames_gsum"} & set(families)
    # two connections: the idle WebSocket's outbox is empty, the stream's holds 2 to 4
    assert value(samples, "field_outbox_frames_count") == 2
    assert value(samples, "field_outbox_frames_bucket", le="0") == 1
    assert value(samples, "field_outbox_frames_bucket", le="1") == 1
    assert value(samples, "field_outbox_frames_bucket", le="10") == 2
    assert value(samples, "field_outbox_frames_bucket", le="+Inf") == 2
    assert 2 <= value(samples, "field_outbox_frames_sum") <= 4
    # the counters and histograms counted as they happen have no _created sample
    assert value(samples, "field_operations_total", transport="http", operation="RECORD",
                 outcome="ok") == 5  # fmt: skip
    assert value(samples, "field_operation_duration_seconds_count", operation="RECORD") == 5
    assert samples.keys() >= {("field_writer_batch_operations_count", frozenset())}
    promtool_check(text)
    # OpenMetrics has the gauge histogram type: the same buckets, with _gcount and _gsum
    assert openmetrics.endswith("# EOF\n")
    assert "# TYPE field_outbox_frames gaugehistogram\n" in openmetrics
    assert 'field_outbox_frames_bucket{le="10"} 2.0\n' in openmetrics
    assert "field_outbox_frames_gcount 2.0\n" in openmetrics
    assert "field_outbox_frames_count" not in openmetrics


async def raw_answer(url: str, request: bytes) -> bytes:
    """What the server answers ``request`` written on a TCP connection of its own."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), TIMEOUT)
    finally:
        writer.close()


@pytest.mark.parametrize("access_log", [False, True], ids=["quiet", "access-log"])
async def test_http_responses_are_counted_by_status_class(
    server_factory: StartServer, access_log: bool
) -> None:
    server = server_factory(access_log=access_log)
    url = server.url
    before = await scrape(url)  # its own 200 is counted once it is sent
    async with FieldClient(url) as field, aiohttp.ClientSession() as http:
        agent = await field.register("agent-a", "analyst")  # 200
        await record(agent, "a finding")  # 200
        async with http.get(f"{url}/", allow_redirects=False) as r:
            assert r.status == 307
        async with http.get(f"{url}/no-such-page") as r:
            assert r.status == 404
        with pytest.raises(FieldClientError) as refused:
            await agent.send("RECORD", {"type": "finding"})  # 400: no content
        assert refused.value.code == "INVALID_PAYLOAD"
        async with http.get(f"{url}/v1/ws") as r:  # a WebSocket path without a handshake
            assert 400 <= r.status < 500
        await on_server_loop(server, shed_writes)
        async with http.post(f"{url}/v1/register", json=REGISTER_B) as r:  # once, no retry
            assert r.status == 503 and (await r.json())["code"] == "OVERLOADED"
        async with open_ws(url, agent.token):  # 101: the handshake accepted
            pass
        async with open_ws(url, "not-a-token") as refused_ws:  # 101, then closed 4401
            _, code = await refused_ws.until_closed()
        assert code == 4401
        # malformed HTTP, answered by the connection itself before any request was read
        answer = await raw_answer(url, b"NOT HTTP AT ALL\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 ")
        after = await scrape(url)

    def moved(cls: str) -> float:
        return value(after, "field_http_responses_total", **{"class": cls}) - value(
            before, "field_http_responses_total", **{"class": cls}
        )

    assert moved("2xx") == 3  # the first scrape, REGISTER, RECORD
    assert moved("3xx") == 1
    assert moved("4xx") == 4  # 404, INVALID_PAYLOAD, /v1/ws without a handshake, bad HTTP
    assert moved("5xx") == 1
    assert moved("1xx") == 2
    assert value(after, "field_http_responses_total", **{"class": OTHER}) == 0


# -- notification latency ------------------------------------------------------------

NOTIFICATION_LATENCY = "field_notification_latency_seconds"
#: How long the test holds a notification back (the receiver's answer, the stream's start).
HOLD = 0.3


def latency_counts(samples: Samples, transport: str) -> tuple[float, float, float]:
    """The notifications ``transport`` timed: all, those within 0.25 s, and their sum."""
    return (
        value(samples, f"{NOTIFICATION_LATENCY}_count", transport=transport),
        value(samples, f"{NOTIFICATION_LATENCY}_bucket", transport=transport, le="0.25"),
        value(samples, f"{NOTIFICATION_LATENCY}_sum", transport=transport),
    )


async def test_notification_latency_runs_from_the_commit_to_the_receiver(
    server_factory: StartServer,
) -> None:
    """A webhook's notification is timed to its receiver's 2xx, and a replayed one from
    its commit, not from when it was queued: both held back past 0.25 s, neither is
    counted within 0.25 s; and neither took longer than the test."""
    server = server_factory(webhook_allow_net=("127.0.0.0/8",))
    receiver = await Receiver(gate=asyncio.Event()).start()
    started = time.monotonic()
    try:
        async with FieldClient(server.url) as field:
            writer = await field.register("writer", "analyst", interests=["market"])
            reader = await field.register("reader", "analyst", interests=["market"])
            hooked = await field.register("hooked", "analyst", interests=["market"])
            stream = await subscribe(reader, ["memory.recorded"])
            await webhook(hooked, receiver.url)
            await record(writer, "market: one finding")
            # the holdup being measured: the receiver has not answered, the reader not come
            await asyncio.sleep(HOLD)
            assert receiver.gate is not None
            receiver.gate.set()
            async with open_ws(server.url, reader.token, since=[stream["cursor"]]) as ws:
                frames = await ws.ready()  # the resume, the replayed notification, live
            assert [f["type"] for f in frames] == ["resume", "notification", "live"]
            await receiver.until(lambda: len(receiver.delivered) == 1, "the delivery")

            def timed(samples: Samples) -> bool:
                return latency_counts(samples, "webhook")[0] == 1

            samples = await until_metric(server.url, timed, "the delivery timed")
    finally:
        await receiver.stop()
    elapsed = time.monotonic() - started
    for transport in ("webhook", "websocket"):
        count, quick, seconds = latency_counts(samples, transport)
        assert (count, quick) == (1, 0), transport
        assert HOLD <= seconds <= elapsed, transport
    assert latency_counts(samples, "sse")[0] == 0


def test_notification_latency_buckets_and_transports() -> None:
    """Each observation falls in the first bucket it is at or under; every transport has
    its series from the start, and a kind outside them only once it has notifications."""
    counts = PushCounts()
    latency = counts.latency_of("sse")
    for seconds in (-0.5, 0.001, 0.0011, 0.25, 29.0, 31.0):
        latency.observe(seconds)
    counts.latency_of("console")  # a console's stream carries no notification
    counts.latency_of("carrier-pigeon").observe(0.002)
    counts.latency_of("mcp")  # shown once it has notifications
    family = notification_latency(counts.latency)
    samples = {(s.name, frozenset(s.labels.items())): s.value for s in family.samples}
    sse = {"transport": "sse"}
    bucket = f"{NOTIFICATION_LATENCY}_bucket"
    assert value(samples, bucket, le="0.001", **sse) == 2  # a negative figure counts as 0
    assert value(samples, bucket, le="0.0025", **sse) == 3
    assert value(samples, bucket, le="0.25", **sse) == 4
    assert value(samples, bucket, le="30.0", **sse) == 5
    assert value(samples, bucket, le="+Inf", **sse) == 6
    assert value(samples, f"{NOTIFICATION_LATENCY}_count", **sse) == 6
    assert value(samples, f"{NOTIFICATION_LATENCY}_sum", **sse) == pytest.approx(60.2521)
    transports = {
        dict(labels)["transport"]
        for name, labels in samples
        if name.startswith(NOTIFICATION_LATENCY)
    }
    assert transports == {"websocket", "sse", "webhook", "rap", OTHER}
    assert value(samples, f"{NOTIFICATION_LATENCY}_count", transport=OTHER) == 1
