"""Named subscriptions: SUBSCRIBE with ``subscription.name`` is idempotent.

An app that subscribes at every start gets one subscription, however often it starts, so
each event reaches it once. Real servers, real clients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from field.client import AgentClient, FieldClient, FieldClientError

from .schema_util import assert_valid


async def _agent(client: FieldClient, agent_id: str = "watcher") -> AgentClient:
    return await client.register(agent_id, role="strategist", interests=["market size"])


def _subscribe(agent: AgentClient, **subscription: Any) -> Any:
    return agent.send("SUBSCRIBE", {"action": "subscribe", "subscription": subscription})


async def test_same_name_and_definition_returns_the_same_subscription(
    client: FieldClient,
) -> None:
    agent = await _agent(client)
    first = await _subscribe(agent, name="market", events=["memory.recorded"], min_relevance=0.3)
    again = await _subscribe(agent, name="market", events=["memory.recorded"], min_relevance=0.3)
    assert_valid("subscribe.response", first)
    assert_valid("subscribe.response", again)
    assert first["created"] is True and again["created"] is False
    assert again["subscription_id"] == first["subscription_id"]
    assert again["cursor"] == first["cursor"]  # the creation's: resuming from it loses nothing
    assert again["subscription"]["name"] == "market"
    assert again["sse_url"] == first["sse_url"]
    listed = await agent.send("SUBSCRIBE", {"action": "list"})
    assert [s["id"] for s in listed["subscriptions"]] == [first["subscription_id"]]


async def test_same_name_with_another_definition_is_refused(client: FieldClient) -> None:
    agent = await _agent(client)
    first = await _subscribe(agent, name="market", events=["memory.recorded"])
    with pytest.raises(FieldClientError) as refused:
        await _subscribe(agent, name="market", events=["memory.recorded"], min_relevance=0.5)
    assert refused.value.status == 409
    body = refused.value.body
    assert_valid("error", body)
    assert body["code"] == "SUBSCRIPTION_NAME_TAKEN"
    assert body["recoverable"] is False and body["suggested_action"]
    assert body["details"] == {
        "subscription_id": first["subscription_id"],
        "differs": ["min_relevance"],
    }


async def test_a_name_is_per_agent_and_free_again_once_cancelled(client: FieldClient) -> None:
    one, other = await _agent(client, "one"), await _agent(client, "other")
    mine = await _subscribe(one, name="watch", events=["memory.recorded"])
    theirs = await _subscribe(other, name="watch", events=["memory.recorded"])
    assert theirs["created"] is True and theirs["subscription_id"] != mine["subscription_id"]
    await one.send(
        "SUBSCRIBE", {"action": "unsubscribe", "subscription": {"id": mine["subscription_id"]}}
    )
    renewed = await _subscribe(one, name="watch", events=["conflict.detected"])
    assert renewed["created"] is True and renewed["subscription_id"] != mine["subscription_id"]


async def test_unnamed_subscriptions_are_never_merged(client: FieldClient) -> None:
    agent = await _agent(client)
    first = await _subscribe(agent, events=["memory.recorded"])
    second = await _subscribe(agent, events=["memory.recorded"])
    assert first["created"] is second["created"] is True
    assert first["subscription_id"] != second["subscription_id"]
    assert "name" not in first["subscription"]


@pytest.mark.parametrize(
    "name", ["", "x" * 101, "has space", "ünïcode", 7, ["a"]], ids=lambda n: repr(n)[:12]
)
async def test_a_bad_name_is_refused(client: FieldClient, name: Any) -> None:
    agent = await _agent(client)
    with pytest.raises(FieldClientError) as refused:
        await _subscribe(agent, name=name, events=["memory.recorded"])
    assert refused.value.status == 422
    assert refused.value.body["code"] == "INVALID_PAYLOAD"
    assert "subscription.name" in refused.value.body["message"]


async def test_a_named_webhook_given_its_secret_again_is_the_same(server_factory: Any) -> None:
    server = server_factory(webhook_allow_net=("127.0.0.0/8",))
    async with FieldClient(server.url) as client:
        await _named_webhook(client)


async def _named_webhook(client: FieldClient) -> None:
    agent = await _agent(client)
    hook = {"type": "webhook", "url": "http://127.0.0.1:9/hook"}  # never reached here
    first = await _subscribe(agent, name="hook", events=["memory.recorded"], delivery=hook)
    secret = first["subscription"]["delivery"]["secret"]
    for delivery in (hook, {**hook, "secret": secret}):
        again = await _subscribe(agent, name="hook", events=["memory.recorded"], delivery=delivery)
        assert again["subscription_id"] == first["subscription_id"]
        assert "secret" not in again["subscription"]["delivery"]  # shown once, at creation
    other = {**hook, "secret": "whsec_" + "QUJD" * 8}
    with pytest.raises(FieldClientError) as refused:
        await _subscribe(agent, name="hook", events=["memory.recorded"], delivery=other)
    assert refused.value.body["details"]["differs"] == ["secret"]


async def test_a_name_survives_a_restart(server_factory: Any, tmp_path: Path) -> None:
    settings = {"data_dir": tmp_path / "data", "sync": "normal"}
    server = server_factory(**settings)
    async with FieldClient(server.url) as client:
        agent = await _agent(client)
        first = await _subscribe(agent, name="market", events=["memory.recorded"])
    server.stop()
    restarted = server_factory(**settings)
    async with FieldClient(restarted.url) as client:
        agent = client.agent("watcher", agent.token)
        again = await _subscribe(agent, name="market", events=["memory.recorded"])
    assert again["created"] is False
    assert (again["subscription_id"], again["cursor"]) == (
        first["subscription_id"],
        first["cursor"],
    )
