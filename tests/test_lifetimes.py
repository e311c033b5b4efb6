"""Subscription lifetimes: ``subscription.timeout``, ``--max-subscription-timeout``, expiry.

The core tests drive the Field directly; the monitor tests run :class:`Liveness` with a
hand-moved clock over a real service; the end-to-end tests run a real server whose
monitor ticks quickly and wait for what expiry sends (never for time to pass).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from field.client import FieldClient
from field.contract.errors import InvalidPayload
from field.contract.model import Limits
from field.core.field import Field
from field.core.subscribe import effective_timeout
from field.core.validation import duration_seconds
from field.engine.liveness import Liveness
from field.engine.service import FieldService
from field.server.config import Config
from field.store.memory import MemoryEventLog

from .conftest import UNLOADED_POLICY, ThreadedServer
from .core_util import Harness
from .schema_util import assert_valid
from .test_liveness import Clock
from .test_push import sse_stream, subscribe
from .test_webhooks import Receiver


def subscribe_core(h: Harness, agent_id: str, **options: Any) -> dict[str, Any]:
    payload = {"action": "subscribe", "subscription": {"events": ["memory.recorded"], **options}}
    return h.send("SUBSCRIBE", agent_id, payload)


# -- durations and validation -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("72h", 259_200), ("1h30m", 5_400), ("90s", 90), ("2d", 172_800), ("1500ms", 1.5)],
)
def test_durations_in_the_seed_form(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "72", "h", "3 days", "30m1h", "0s", "500ms", "3651d", "1h 30m", 72, None, "-1h"]
)
def test_what_is_no_duration(text: Any) -> None:
    assert duration_seconds(text) is None


def test_a_subscription_keeps_its_timeout_and_a_bad_one_is_refused() -> None:
    h = Harness()
    h.register("alice")
    response = subscribe_core(h, "alice", timeout="72h")
    assert_valid("subscription", response["subscription"])
    assert response["subscription"]["timeout"] == "72h"
    # without one, none is shown
    assert "timeout" not in subscribe_core(h, "alice")["subscription"]
    for bad in ("3 days", 72, "0s", "", "99999d"):
        with pytest.raises(InvalidPayload, match="subscription.timeout"):
            subscribe_core(h, "alice", timeout=bad)


def test_the_effective_timeout_is_the_smaller_of_the_two() -> None:
    capped = Limits(max_subscription_timeout_s=3600)
    assert effective_timeout({"timeout": "72h"}, Limits()) == 259_200
    assert effective_timeout({"timeout": "72h"}, capped) == 3600
    assert effective_timeout({"timeout": "30m"}, capped) == 1800
    assert effective_timeout({}, capped) == 3600
    assert effective_timeout({}, Limits()) is None


def test_the_field_wide_bound_comes_from_a_duration() -> None:
    assert Config(max_subscription_timeout="48h").limits.max_subscription_timeout_s == 172_800
    assert Config().limits.max_subscription_timeout_s == 0
    env = Config.from_env({"FIELD_MAX_SUBSCRIPTION_TIMEOUT": "2h"})
    assert env.limits.max_subscription_timeout_s == 7200
    with pytest.raises(ValueError, match="duration"):
        Config(max_subscription_timeout="two days")


# -- the core -----------------------------------------------------------------------------


def test_expiry_cancels_only_what_the_inactivity_reached_and_fails_no_one() -> None:
    h = Harness(limits=Limits(max_subscription_timeout_s=7200))
    h.register("alice")
    short = subscribe_core(h, "alice", timeout="30m")["subscription_id"]
    capped = subscribe_core(h, "alice", timeout="72h")["subscription_id"]  # 2 h, by the bound
    epoch = h.field.epoch
    assert h.field.expire_subscriptions("alice", 1799).entries == []
    assert h.field.epoch == epoch
    outcome = h.field.expire_subscriptions("alice", 1800)
    h.entries.extend(outcome.entries)
    ((kind, data),) = [(e.kind, e.data) for e in outcome.entries]
    assert kind == "subscription.cancelled" and data["subscription_id"] == short
    assert data["reason"].startswith("expired") and "1800 s" in data["reason"]
    assert h.field.state.subscriptions[short]["status"] == "cancelled"
    h.entries.extend(h.field.expire_subscriptions("alice", 7200).entries)
    assert h.field.state.subscriptions[capped]["status"] == "cancelled"
    assert h.field.state.active_subscriptions.get("alice", set()) == set()
    assert h.field.state.agents["alice"].status != "failed"
    # the same from the log
    replayed = h.replayed().state.subscriptions
    assert replayed[short]["cancel_reason"] == data["reason"]
    assert replayed[capped]["status"] == "cancelled"


# -- the monitor, with a clock moved by hand -----------------------------------------------


@pytest.fixture
async def service() -> AsyncIterator[FieldService]:
    limits = Limits(max_subscription_timeout_s=600)
    service = FieldService(
        MemoryEventLog(), functools.partial(Field, limits=limits), admission=UNLOADED_POLICY
    )
    await service.start()
    yield service
    await service.stop()


async def send(
    service: FieldService, tokens: dict[str, str], agent_id: str, operation: str, payload: Any
) -> Any:
    envelope = {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": f"msg-{operation}-{agent_id}-{service.field.epoch}",
        "operation": operation,
        "agent_id": agent_id,
        "session_id": None,
        "epoch": 0,
        "payload": payload,
    }
    token = tokens.get(agent_id)
    outcome = await service.execute(lambda field: field.handle(envelope, token=token))
    return outcome.response


async def test_the_monitor_expires_after_inactivity_and_activity_resets_it(
    service: FieldService,
) -> None:
    tokens: dict[str, str] = {}
    for agent_id in ("alice", "bob"):
        registered = await send(
            service, tokens, agent_id, "REGISTER", {"id": agent_id, "role": "analyst"}
        )
        tokens[agent_id] = registered["token"]
    own = {"events": ["memory.recorded"], "timeout": "100s"}
    await send(service, tokens, "alice", "SUBSCRIBE", {"action": "subscribe", "subscription": own})
    # bob sets no timeout: the Field's bound (600 s) applies
    bound = {"events": ["memory.recorded"]}
    await send(service, tokens, "bob", "SUBSCRIBE", {"action": "subscribe", "subscription": bound})
    clock = Clock()
    liveness = Liveness(service, failure_grace=30, heartbeat_timeout=0, clock=clock)
    clock.now += 99
    assert liveness.expiring() == []
    liveness.seen("alice")  # a request: the clock of her timeout starts again
    clock.now += 99
    assert liveness.expiring() == []
    clock.now += 1
    assert liveness.expiring() == [("alice", 100)]
    # opening a connection is activity; holding it open is not
    liveness.connected("alice")
    assert liveness.expiring() == []
    clock.now += 100
    assert [a for a, _ in liveness.expiring()] == ["alice"]
    clock.now += 600
    assert sorted(a for a, _ in liveness.expiring()) == ["alice", "bob"]


# -- end to end ----------------------------------------------------------------------------


@pytest.fixture
def quick(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    # the monitor ticks every failure_grace / 4 seconds
    return server_factory(
        failure_grace=0.2,
        heartbeat_timeout=0,
        webhook_allow_net=("127.0.0.0/8",),
        webhook_retry_base=0.05,
        webhook_retry_cap=0.2,
    )


async def test_an_idle_agents_subscription_expires_its_stream_ends_and_it_is_not_failed(
    quick: ThreadedServer,
) -> None:
    async with FieldClient(quick.url) as field, aiohttp.ClientSession() as http:
        listener = await field.register("listener", "analyst", interests=["market"])
        writer = await field.register("writer", "analyst", interests=["market"])
        timed = await subscribe(listener, ["memory.recorded"], timeout="1s")
        lasting = await subscribe(listener, ["memory.recorded"])
        async with sse_stream(http, timed["sse_url"], listener.token) as sse:
            await sse.ready()
            # another agent's activity keeps no one else's subscription alive
            await writer.record(
                "finding", "market news", purpose="p", confidence=0.5, reasoning="r"
            )
            events = await sse.until(lambda e: e.event == "end", timeout=30)
            assert events[-1].data["reason"] == "subscription expired"
            assert await sse.next() is None  # and the stream ends
        remaining = await listener.send("SUBSCRIBE", {"action": "list"})
        assert [s["id"] for s in remaining["subscriptions"]] == [lasting["subscription_id"]]
        agents = {a["id"]: a["status"] for a in (await writer.get("/v1/agents"))["agents"]}
        assert agents["listener"] != "failed"


async def test_an_expired_webhook_gets_its_final_post_and_nothing_after(
    quick: ThreadedServer,
) -> None:
    receiver, witness = await Receiver().start(), await Receiver().start()
    try:
        async with FieldClient(quick.url) as field:
            sleeper = await field.register("sleeper", "analyst", interests=["market"])
            awake = await field.register("awake", "analyst", interests=["market"])
            subscribed = await subscribe(
                sleeper,
                ["memory.recorded"],
                timeout="1s",
                delivery={"type": "webhook", "url": receiver.url},
            )
            await receiver.until(lambda: len(receiver.delivered) == 1, "the final POST")
            (final,) = receiver.delivered
            body = orjson.loads(final.body)
            assert body["final"] is True and body["reason"].startswith("expired")
            assert body["subscription_id"] == subscribed["subscription_id"]
            assert final.headers["webhook-id"] == f"{subscribed['subscription_id']}.final"
            # nothing after it: a later unit reaches a witness and not the expired webhook
            await subscribe(
                awake, ["memory.recorded"], delivery={"type": "webhook", "url": witness.url}
            )
            writer = await field.register("writer", "analyst", interests=["market"])
            await writer.record(
                "finding", "market later", purpose="p", confidence=0.5, reasoning="r"
            )
            await witness.until(lambda: len(witness.delivered) == 1, "the witness")
            assert len(receiver.received) == 1
            listed = await sleeper.send("SUBSCRIBE", {"action": "list"})
            assert listed["subscriptions"] == []
    finally:
        await receiver.stop()
        await witness.stop()
