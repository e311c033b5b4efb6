"""The SDK (``field.client``): one method per operation, against a real server.

Each method is driven over real loopback HTTP (``server_factory`` from
conftest); every response it returns is checked against its schema, so a
method that built a wrong payload fails here with the Field's error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from field.client import AgentClient, FieldClient, FieldClientError

from .conftest import ThreadedServer
from .schema_util import assert_valid

OPERATOR_TOKEN = "operator-token-0123456789"


@dataclass
class Agents:
    field: FieldClient
    lead: AgentClient  # authority 6, registered by the operator
    alice: AgentClient
    bob: AgentClient


@pytest.fixture
async def agents(server_factory: Callable[..., ThreadedServer]) -> AsyncIterator[Agents]:
    server = server_factory(operator_token=OPERATOR_TOKEN)
    async with FieldClient(server.url, timeout=30) as field:
        lead = await field.register("lead", "lead", authority=6, operator_token=OPERATOR_TOKEN)
        alice = await field.register("alice", "analyst", interests=["churn"])
        bob = await field.register("bob", "engineer")
        yield Agents(field, lead, alice, bob)


async def test_register_with_authority_needs_the_operator_token(agents: Agents) -> None:
    assert agents.lead.registration["agent"]["authority"] == 6
    with pytest.raises(FieldClientError) as info:
        await agents.field.register("upstart", "lead", authority=6)
    assert info.value.status == 403 and info.value.code == "INSUFFICIENT_AUTHORITY"
    assert_valid("error", info.value.body)
    assert "token" not in repr(agents.lead) and agents.lead.token not in repr(agents.lead)


async def test_an_authority_on_a_field_without_an_operator_token_says_how_to_start_one(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory()  # no operator token: no one can register above authority 4
    async with FieldClient(server.url, timeout=30) as field:
        for bearer in (None, OPERATOR_TOKEN):  # whatever the caller sends
            with pytest.raises(FieldClientError) as info:
                await field.register("lead", "lead", authority=6, operator_token=bearer)
            error = info.value
            assert error.status == 403 and error.code == "INSUFFICIENT_AUTHORITY"
            assert_valid("error", error.body)
            assert error.body["message"] == (
                "registering with authority 6 needs the operator token, and this Field has no "
                "operator token (it was started without one)"
            )
            action = error.body["suggested_action"]
            assert "--operator-token-file" in action and "FIELD_OPERATOR_TOKEN" in action
            assert error.body["details"] == {
                "authority": 6,
                "allowed": 4,
                "operator_token": "not_configured",
            }


async def test_an_authority_with_a_token_not_the_operators_says_so(agents: Agents) -> None:
    cases = [
        (
            agents.alice.token,
            "and the bearer token given is not the operator's",
            "not_the_operators",
        ),
        (None, "and no bearer token was given", "missing"),
    ]
    for bearer, why, detail in cases:
        with pytest.raises(FieldClientError) as info:
            await agents.field.register("upstart", "lead", authority=8, operator_token=bearer)
        error = info.value
        assert error.status == 403 and error.code == "INSUFFICIENT_AUTHORITY"
        assert_valid("error", error.body)
        assert (
            error.body["message"] == f"registering with authority 8 needs the operator token, {why}"
        )
        assert "--operator-token-file" not in error.body["suggested_action"]  # it has one
        assert error.body["details"]["operator_token"] == detail
    senior = await agents.field.register(
        "upstart", "lead", authority=8, operator_token=OPERATOR_TOKEN
    )
    assert senior.info is not None and senior.info["authority"] == 8


async def test_a_closed_field_says_the_token_given_is_not_the_operators(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory(operator_token=OPERATOR_TOKEN, registration="closed")
    async with FieldClient(server.url, timeout=30) as field:
        with pytest.raises(FieldClientError) as info:
            await field.register("alice", "analyst", operator_token="not-the-operator-token-0")
    error = info.value
    assert error.status == 403 and error.code == "REGISTRATION_CLOSED"
    assert_valid("error", error.body)
    assert error.body["message"] == (
        "registration is closed: only the operator registers agents on this Field, and the "
        "bearer token given is not the operator's"
    )
    assert error.body["details"] == {"operator_token": "not_the_operators"}


async def test_record_attune_poll_and_detect(agents: Agents) -> None:
    alice, bob = agents.alice, agents.bob
    first = await alice.record(
        "finding",
        "Churn is 2% a month.",
        purpose="track churn",
        confidence=0.8,
        reasoning="billing export",
    )
    assert_valid("record.response", first)
    poll = await bob.attune(since_epoch=0, max_units=10)
    assert_valid("attune.response", poll)
    assert [r["memory_unit"]["id"] for r in poll["record"]] == [first["memory_unit_id"]]
    relation = {"type": "contradicts", "target_id": first["memory_unit_id"]}
    second = await bob.record(
        "finding",
        "Churn is 5% a month.",
        purpose="track churn",
        confidence=0.8,
        reasoning="survey",
        relations=[relation],
    )
    again = await alice.attune(since_epoch=poll["epoch"], context_hint="churn")
    assert [r["memory_unit"]["id"] for r in again["record"]] == [second["memory_unit_id"]]

    listed = await alice.detect("list", status=["detected"])
    assert_valid("detect.response", listed)
    assert [c["id"] for c in listed["conflicts"]] == second["conflicts_detected"]
    checked = await bob.detect("check", target_id=second["memory_unit_id"])
    assert_valid("detect.response", checked)
    scanned = await bob.detect("scan")
    assert_valid("detect.response", scanned)


async def test_merge_replay_and_compact(agents: Agents) -> None:
    alice, bob, lead = agents.alice, agents.bob, agents.lead
    a = await alice.record(
        "finding", "Churn is 2% a month.", purpose="churn", confidence=0.9, reasoning="billing"
    )
    relation = {"type": "contradicts", "target_id": a["memory_unit_id"]}
    b = await bob.record(
        "finding",
        "Churn is 5% a month.",
        purpose="churn",
        confidence=0.6,
        reasoning="survey",
        relations=[relation],
    )
    (conflict_id,) = b["conflicts_detected"]
    with pytest.raises(FieldClientError) as info:
        await alice.merge(conflict_id, "confidence_weighted", rationale="mine")
    assert info.value.code == "INSUFFICIENT_AUTHORITY"
    merged = await lead.merge(conflict_id, "confidence_weighted", rationale="better sourced")
    assert_valid("merge.response", merged)
    assert merged["conflict"]["resolution"]["winner_id"] == a["memory_unit_id"]

    replayed = await alice.replay("conflict", conflict_id, depth="detailed")
    assert_valid("replay.response", replayed)
    unit = await alice.replay("memory_unit", a["memory_unit_id"])
    assert_valid("replay.response", unit)

    compacted = await lead.compact("archive", types=["finding"], status=["superseded"])
    assert_valid("compact.response", compacted)
    assert compacted["units_affected"] == 1


async def test_subscribe_list_and_unsubscribe(agents: Agents) -> None:
    alice = agents.alice
    created = await alice.subscribe(["memory.recorded"], min_relevance=0.2, include_own=True)
    assert_valid("subscribe.response", created.response)
    subscription_id = created.id
    listed = await alice.subscriptions()
    assert_valid("subscribe.response", listed)
    assert [s["id"] for s in listed["subscriptions"]] == [subscription_id]
    cancelled = await alice.unsubscribe(subscription_id)
    assert_valid("subscribe.response", cancelled)
    with pytest.raises(FieldClientError) as info:
        await alice.unsubscribe(subscription_id)
    assert info.value.status == 409 and info.value.code == "INVALID_TRANSITION"


async def test_sessions_tasks_and_handoff(agents: Agents) -> None:
    alice, bob = agents.alice, agents.bob
    created = await alice.session(
        "create", name="Churn study", purpose="find the real rate", invitees=["bob"]
    )
    assert_valid("session.response", created)
    session_id = created["session"]["id"]
    joined = await bob.session("join", session_id)
    assert joined["session"]["members"] == ["alice", "bob"]
    assert_valid("session.response", await bob.session("list"))

    # The task belongs to the session named for this envelope only.
    task = await alice.coordinate("create", title="Reconcile churn", session_id=session_id)
    assert_valid("coordinate.response", task)
    assert task["task"]["session_id"] == session_id and alice.session_id is None
    task_id = task["task"]["id"]
    assert (await alice.coordinate("assign", task_id, assignee="alice"))["task"]["status"] == (
        "assigned"
    )
    assert (await alice.coordinate("start", task_id))["task"]["status"] == "in_progress"
    alice.session_id = session_id
    unit = await alice.record(
        "finding",
        "Billing says 2%.",
        purpose="reconcile",
        confidence=0.9,
        reasoning="export",
        task_id=task_id,
    )
    handed = await alice.handoff(task_id, "bob", notes="over to you", max_units=5)
    assert_valid("handoff.response", handed)
    packaged = [u["memory_unit"]["id"] for u in handed["handoff"]["context"]["units"]]
    assert packaged == [unit["memory_unit_id"]]
    assert handed["task"]["assignee"] == "bob"
    assert_valid("coordinate.response", await bob.coordinate("list"))

    ended = await alice.session("end", session_id, reason="done")
    assert ended["session"]["status"] == "ended"


async def test_an_agent_registered_elsewhere_and_deregister(agents: Agents) -> None:
    again = agents.field.agent("bob", agents.bob.token)
    assert again.role is None
    polled = await again.attune(since_epoch=0)  # looks its role up first
    assert again.role == "engineer" and polled["status"] == "ok"
    done = await agents.bob.deregister()
    assert_valid("deregister.response", done)
    with pytest.raises(FieldClientError) as info:
        await again.attune(since_epoch=0)
    assert info.value.status == 401 and info.value.code == "AGENT_NOT_REGISTERED"
