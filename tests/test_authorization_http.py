"""Authorization end to end: each gap tried against a real server, over HTTP.

A real Field runs on a loopback port (``server_factory``, with an operator
token); the agents are SDK clients. Each attack must get the spec's error
body with its HTTP status and leave the Field as it was (the epoch and the
counts of ``GET /v1/field/status``, and what the agents read); the
legitimate path next to it must work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from field.client import FieldClient, FieldClientError

from .conftest import ThreadedServer
from .schema_util import assert_valid

OPERATOR_TOKEN = "operator-token-0123456789"


@pytest.fixture
async def field(server_factory: Callable[..., ThreadedServer]) -> AsyncIterator[FieldClient]:
    server = server_factory(operator_token=OPERATOR_TOKEN)
    async with FieldClient(server.url) as client:
        yield client


async def refused(call: Any, field: FieldClient, status: int, code: str) -> dict[str, Any]:
    """``call`` fails with ``status`` and ``code`` and changes nothing in the Field."""
    before = await field.status()
    with pytest.raises(FieldClientError) as caught:
        await call
    error = caught.value
    assert (error.status, error.code) == (status, code), error.body
    assert_valid("error", error.body)
    after = await field.status()
    assert (after["epoch"], after["counts"]) == (before["epoch"], before["counts"])
    body: dict[str, Any] = error.body
    return body


def ids(attuned: dict[str, Any]) -> set[str]:
    return {item["memory_unit"]["id"] for item in attuned["record"]}


async def test_a_deregistered_id_is_never_given_to_another_registrant(
    field: FieldClient,
) -> None:
    alice = await field.register("alice", "analyst")
    unit = await alice.record(
        "finding", "Churn is 3%.", purpose="Track churn", confidence=0.8, reasoning="billing"
    )
    await alice.deregister()
    await refused(field.register("alice", "impostor"), field, 409, "AGENT_ID_TAKEN")
    agents = await field.agent("operator", OPERATOR_TOKEN).get("/v1/agents")
    assert agents["agents"] == []
    # alice returns with the token DEREGISTER revoked; her unit is hers again
    back = await field.register("alice", "analyst", previous_token=alice.token)
    mine = await back.attune(max_units=10, include_own=True)
    assert ids(mine) == {unit["memory_unit_id"]}
    # the operator may hand a retired id on, deliberately
    await back.deregister()
    handed = await field.register("alice", "auditor", operator_token=OPERATOR_TOKEN)
    assert handed.registration["agent"]["role"] == "auditor"


async def test_an_agent_cannot_take_back_an_id_with_another_agents_token(
    field: FieldClient,
) -> None:
    alice = await field.register("alice", "analyst")
    bob = await field.register("bob", "analyst")
    await alice.deregister()
    attack = field.register("alice", "analyst", previous_token=bob.token)
    await refused(attack, field, 409, "AGENT_ID_TAKEN")


async def test_joining_a_session_needs_an_invitation(field: FieldClient) -> None:
    alice = await field.register("alice", "analyst")
    bob = await field.register("bob", "analyst")
    created = await alice.session("create", name="Pricing", purpose="private numbers")
    session_id = created["session"]["id"]
    alice.session_id = session_id
    secret = await alice.record(
        "finding",
        "Our floor price is 9 EUR.",
        purpose="Set the floor",
        confidence=0.9,
        reasoning="cost model",
    )
    body = await refused(bob.session("join", session_id), field, 403, "FORBIDDEN")
    assert body["operation"] == "SESSION" and body["recoverable"] is True
    assert secret["memory_unit_id"] not in ids(await bob.attune(max_units=10))
    invited = await alice.session("invite", session_id, invitees=["bob"])
    assert_valid("session.response", invited)
    assert invited["session"]["invited"] == ["bob"]
    listed = await bob.session("list")
    assert [s["id"] for s in listed["sessions"]] == [session_id]
    joined = await bob.session("join", session_id)
    assert joined["session"]["members"] == ["alice", "bob"]
    assert secret["memory_unit_id"] in ids(await bob.attune(max_units=10))


async def test_a_standard_agent_cannot_supersede_the_operators_directive(
    field: FieldClient,
) -> None:
    operator = field.agent("operator", OPERATOR_TOKEN, role="human_operator")
    alice = await field.register("alice", "analyst")
    directive = await operator.record(
        "human_directive",
        "No price change before the board meets.",
        purpose="Hold prices",
        confidence=1.0,
        reasoning="board decision",
    )
    target = directive["memory_unit_id"]
    attack = alice.record(
        "decision",
        "Raise prices 10% now.",
        purpose="Beat the board to it",
        confidence=0.9,
        reasoning="margins",
        relations=[{"type": "supersedes", "target_id": target}],
    )
    body = await refused(attack, field, 403, "INSUFFICIENT_AUTHORITY")
    assert body["operation"] == "RECORD" and body["recoverable"] is False
    assert target in ids(await alice.attune(max_units=10))
    # the operator may replace its own directive
    await operator.record(
        "human_directive",
        "Prices may change after the board meets.",
        purpose="Update the hold",
        confidence=1.0,
        reasoning="board met",
        relations=[{"type": "supersedes", "target_id": target}],
    )
    assert target not in ids(await alice.attune(max_units=10))
