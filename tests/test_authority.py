"""Authority levels (spec 11.2): who may register above standard, the operator."""

from __future__ import annotations

import numpy as np
import pytest

from field.contract.errors import Code, FieldError
from field.core import authority
from field.ranking.embedding import HashingEmbedder

from .core_util import Harness

OPERATOR_TOKEN = "operator-secret-0123456789"


@pytest.fixture
def h() -> Harness:
    return Harness(operator_token=OPERATOR_TOKEN)


def fails(code: str, call: object, *args: object, **kwargs: object) -> FieldError:
    with pytest.raises(FieldError) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    assert info.value.code == code, info.value.message
    return info.value


def test_agents_register_at_standard_authority_by_default(h: Harness) -> None:
    response = h.register("alice")
    assert response["agent"]["authority"] == authority.STANDARD
    assert h.field.state.agents["alice"].authority == authority.STANDARD


def test_an_agent_may_register_itself_below_standard(h: Harness) -> None:
    assert h.register("watcher", authority=authority.OBSERVER)["agent"]["authority"] == 2
    assert h.register("auditor", authority=authority.AUDIT)["agent"]["authority"] == 0


def test_registering_above_standard_needs_the_operator_token(h: Harness) -> None:
    before = len(h.entries)
    error = fails(Code.INSUFFICIENT_AUTHORITY, h.register, "lead", authority=authority.SENIOR)
    assert error.http_status == 403 and error.recoverable is False
    assert len(h.entries) == before
    response = h.register("lead", authority=authority.SENIOR, via=OPERATOR_TOKEN)
    assert response["agent"]["authority"] == authority.SENIOR
    # the token REGISTER returns is the new agent's own, at its own level
    assert h.field.authenticate(response["token"]).authority == authority.SENIOR


def test_another_agents_token_does_not_grant_authority(h: Harness) -> None:
    alice = h.register("alice")
    fails(
        Code.INSUFFICIENT_AUTHORITY,
        h.send,
        "REGISTER",
        "lead",
        {"id": "lead", "role": "lead", "authority": 8},
        token=alice["token"],
    )


@pytest.mark.parametrize("value", [-1, 11, 4.0, "4", True, None])
def test_authority_must_be_an_integer_from_0_to_10(h: Harness, value: object) -> None:
    fails(Code.INVALID_PAYLOAD, h.register, "alice", authority=value)


def test_the_operator_acts_as_operator_at_level_10(h: Harness) -> None:
    operator = h.field.authenticate(OPERATOR_TOKEN)
    assert operator.id == authority.OPERATOR_ID and operator.authority == authority.OPERATOR
    h.register("alice")
    h.record("alice", "a finding of alice")
    response = h.send(
        "ATTUNE",
        "operator",
        {"scope": {"role": "human_operator", "max_units": 5}},
        token=OPERATOR_TOKEN,
    )
    assert [r["memory_unit"]["source"]["agent_id"] for r in response["record"]] == ["alice"]
    # the operator acts only as "operator"
    fails(
        Code.FORBIDDEN,
        h.send,
        "ATTUNE",
        "alice",
        {"scope": {"role": "x", "max_units": 5}},
        token=OPERATOR_TOKEN,
    )


def test_no_agent_may_register_the_operator_id_or_deregister_it(h: Harness) -> None:
    fails(Code.AGENT_ID_TAKEN, h.register, "operator")
    fails(
        Code.FORBIDDEN,
        h.send,
        "DEREGISTER",
        "operator",
        {"agent_id": "operator"},
        token=OPERATOR_TOKEN,
    )


def test_without_an_operator_token_there_is_no_operator() -> None:
    h = Harness()
    fails(Code.UNAUTHENTICATED, h.field.authenticate, OPERATOR_TOKEN)


def test_authority_survives_replay(h: Harness) -> None:
    h.register("watcher", authority=authority.OBSERVER)
    assert h.replayed().state.agents["watcher"].authority == authority.OBSERVER


def test_require_names_the_needed_level() -> None:
    authority.require(6, authority.SENIOR, "MERGE")
    with pytest.raises(FieldError) as info:
        authority.require(4, authority.SENIOR, "MERGE")
    assert info.value.code == Code.INSUFFICIENT_AUTHORITY
    assert "MERGE needs authority 6" in info.value.message


def test_hashing_embedder_is_deterministic_and_unit_length() -> None:
    texts = ["The API rate limit is 100 per minute", "the api rate limit is 500 per minute", ""]
    first, second = HashingEmbedder().embed(texts), HashingEmbedder().embed(texts)
    assert first.dtype == np.float32 and first.shape == (3, HashingEmbedder().dim)
    assert np.array_equal(first, second)
    assert np.allclose(np.linalg.norm(first[:2], axis=1), 1.0)
    assert not first[2].any()
    unrelated = HashingEmbedder().embed(["deploy the frontend on friday"])[0]
    assert first[0] @ first[1] > 0.8 > first[0] @ unrelated


def test_an_observer_reads_but_does_not_record(h: Harness) -> None:
    h.register("alice")
    h.record("alice", "a finding of alice")
    h.register("watcher", authority=authority.OBSERVER)
    assert len(h.attune("watcher")["record"]) == 1
    before = len(h.entries)
    error = fails(Code.INSUFFICIENT_AUTHORITY, h.record, "watcher", "an observation")
    assert error.operation == "RECORD"
    assert len(h.entries) == before


def test_an_audit_agent_cannot_attune_or_subscribe(h: Harness) -> None:
    h.register("auditor", authority=authority.AUDIT)
    fails(Code.INSUFFICIENT_AUTHORITY, h.attune, "auditor")
    fails(
        Code.INSUFFICIENT_AUTHORITY,
        h.send,
        "SUBSCRIBE",
        "auditor",
        {"action": "subscribe", "events": ["memory.recorded"]},
    )
    # but it may leave
    assert h.send("DEREGISTER", "auditor", {"agent_id": "auditor"})["status"] == "ok"


def test_every_operation_has_a_minimum_authority() -> None:
    from field.contract.model import OPERATIONS

    assert set(authority.MIN_AUTHORITY) == set(OPERATIONS) - {"REGISTER"}
