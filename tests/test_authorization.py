"""Authorization in the pure core: who may take a unit out of ATTUNE, join a
session, or register an agent id that was used before.

Each attack is tried and must be refused with the spec's error and change
nothing (no log entry, no epoch, the same state); the legitimate path next
to it must still work. Tests end by proving that a replay of the log
rebuilds the same state, so the rules hold after a restart too.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from field.contract.errors import Code, FieldError
from field.core import authority
from field.core.field import Field
from field.subscriptions.events import event_of

from .core_util import Harness
from .schema_util import assert_valid

OPERATOR_TOKEN = "operator-token-0123456789"


@pytest.fixture
def h() -> Harness:
    """alice and bob (standard, 4), senior (6), boss (8) and the operator."""
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.register("alice", "analyst")
    h.register("bob", "analyst")
    h.register("senior", "reviewer", via=OPERATOR_TOKEN, authority=authority.SENIOR)
    h.register("boss", "manager", via=OPERATOR_TOKEN, authority=authority.SESSION_CREATOR)
    h.tokens["operator"] = OPERATOR_TOKEN
    return h


def snapshot(h: Harness) -> Any:
    """Everything a refused request must leave as it was."""
    state = h.field.state
    return (
        len(h.entries),
        h.field.epoch,
        copy.deepcopy(state.units),
        copy.deepcopy(state.sessions),
        copy.deepcopy(state.invitations),
        sorted(state.agents),
        dict(state.retired),
    )


def refused(h: Harness, code: str, operation: str, agent: str, payload: Any, **kw: Any) -> Any:
    """``operation`` fails with ``code`` (a valid error body) and changes nothing."""
    before = snapshot(h)
    with pytest.raises(FieldError) as caught:
        h.send(operation, agent, payload, **kw)
    error = caught.value
    assert error.code == code, (error.code, error.message)
    assert_valid("error", error.to_response(operation))
    assert snapshot(h) == before
    return error


def unit(content: str, memory_type: str = "finding", **extra: Any) -> dict[str, Any]:
    return {
        "type": memory_type,
        "content": content,
        "intent": {"purpose": "test"},
        "confidence": {"score": 0.8, "reasoning": "measured"},
        **extra,
    }


def record(h: Harness, agent: str, content: str, **extra: Any) -> str:
    session_id = extra.pop("session_id", None)
    response = h.send("RECORD", agent, unit(content, **extra), session_id=session_id)
    return str(response["memory_unit_id"])


def supersedes(target: str) -> dict[str, Any]:
    return {"relations": [{"type": "supersedes", "target_id": target}]}


def attuned(h: Harness, agent: str) -> set[str]:
    scope = {"scope": {"role": "analyst", "max_units": 100}}
    return {r["memory_unit"]["id"] for r in h.send("ATTUNE", agent, scope)["record"]}


def status(h: Harness, unit_id: str) -> str:
    return str(h.field.state.units[unit_id]["status"])


def assert_replays(h: Harness) -> None:
    live, replayed = h.field.state, h.replayed().state
    assert replayed.units == live.units
    assert replayed.unit_authority.view.tolist() == live.unit_authority.view.tolist()
    assert replayed.sessions == live.sessions
    assert replayed.invitations == live.invitations
    assert replayed.retired == live.retired


# -- an agent id is never reused by a different registrant -----------------------------


def test_a_deregistered_id_is_not_given_to_someone_else(h: Harness) -> None:
    mine = record(h, "alice", "churn is 3%")
    old_token = h.tokens["alice"]
    h.send("DEREGISTER", "alice", {"agent_id": "alice"})
    assert set(h.field.state.retired) == {"alice"}
    claim = {"id": "alice", "role": "impostor"}
    error = refused(h, Code.AGENT_ID_TAKEN, "REGISTER", "alice", claim, token="")
    assert error.http_status == 409 and "last token" in error.suggested_action
    # another agent's token, a made-up one: no proof either
    refused(h, Code.AGENT_ID_TAKEN, "REGISTER", "alice", claim, token=h.tokens["bob"])
    refused(h, Code.AGENT_ID_TAKEN, "REGISTER", "alice", claim, token="token-999")
    # so no one inherits alice's units as its own
    assert h.field.state.units[mine]["source"]["agent_id"] == "alice"
    assert "alice" not in h.field.state.agents
    assert_replays(h)
    # alice comes back with the token DEREGISTER revoked, and her units are hers again
    back = h.send("REGISTER", "alice", {"id": "alice", "role": "analyst"}, token=old_token)
    h.tokens["alice"] = back["token"]
    assert back["token"] != old_token and "alice" not in h.field.state.retired
    record(h, "alice", "churn is 2%", **supersedes(mine))
    assert status(h, mine) == "superseded"
    assert_replays(h)


def test_only_the_last_token_takes_an_id_back(h: Harness) -> None:
    first = h.tokens["alice"]
    h.send("DEREGISTER", "alice", {"agent_id": "alice"})
    second = h.send("REGISTER", "alice", {"id": "alice", "role": "analyst"}, token=first)["token"]
    h.tokens["alice"] = second
    h.send("DEREGISTER", "alice", {"agent_id": "alice"})
    claim = {"id": "alice", "role": "analyst"}
    refused(h, Code.AGENT_ID_TAKEN, "REGISTER", "alice", claim, token=first)
    assert h.send("REGISTER", "alice", claim, token=second)["agent"]["id"] == "alice"


def test_the_operator_may_give_a_retired_id_to_a_new_agent(h: Harness) -> None:
    h.send("DEREGISTER", "bob", {"agent_id": "bob"})
    claim = {"id": "bob", "role": "auditor", "authority": authority.SENIOR}
    registered = h.send("REGISTER", "bob", claim, token=OPERATOR_TOKEN)
    assert registered["agent"]["authority"] == authority.SENIOR
    assert "bob" not in h.field.state.retired
    assert_replays(h)


def test_a_live_id_stays_taken_whatever_the_token(h: Harness) -> None:
    claim = {"id": "bob", "role": "analyst"}
    refused(h, Code.AGENT_ID_TAKEN, "REGISTER", "bob", claim, token=h.tokens["bob"])
    refused(h, Code.AGENT_ID_TAKEN, "REGISTER", "bob", claim, token=OPERATOR_TOKEN)


# -- joining a session needs an invitation ---------------------------------------------


def test_knowing_a_session_id_is_not_enough_to_join_it(h: Harness) -> None:
    sid = h.send("SESSION", "alice", {"action": "create", "name": "launch"})["session"]["id"]
    secret = record(h, "alice", "the launch moves to March", session_id=sid)
    join = {"action": "join", "session_id": sid}
    error = refused(h, Code.FORBIDDEN, "SESSION", "bob", join)
    assert error.http_status == 403 and error.recoverable is True
    assert "invite" in error.suggested_action
    refused(h, Code.FORBIDDEN, "SESSION", "senior", join)  # a senior agent neither
    assert secret not in attuned(h, "bob")
    refused(h, Code.FORBIDDEN, "RECORD", "bob", unit("x"), session_id=sid)
    # invited, bob joins and reads the session's units
    invite = {"action": "invite", "session_id": sid, "invitees": ["bob"]}
    assert h.send("SESSION", "alice", invite)["session"]["invited"] == ["bob"]
    joined = h.send("SESSION", "bob", join)["session"]
    assert (joined["members"], joined["invited"]) == (["alice", "bob"], [])
    assert secret in attuned(h, "bob")
    # the invitation is used up: who leaves needs a new one to come back
    h.send("SESSION", "bob", {"action": "leave", "session_id": sid})
    refused(h, Code.FORBIDDEN, "SESSION", "bob", join)
    assert secret not in attuned(h, "bob")
    assert_replays(h)


def test_no_unit_reaches_a_session_through_merge_or_compact_from_outside(h: Harness) -> None:
    """MERGE synthesis and COMPACT summarize put their new unit in the envelope's session:
    only a member may, as with RECORD."""
    sid = h.send("SESSION", "alice", {"action": "create", "name": "launch"})["session"]["id"]
    one = record(h, "senior", "the launch is in March")
    other = record(
        h,
        "senior",
        "the launch is in May",
        **{"relations": [{"type": "contradicts", "target_id": one}]},
    )
    conflict = next(iter(h.field.state.conflicts))
    assert {h.field.state.conflicts[conflict][k] for k in ("unit_a", "unit_b")} == {one, other}
    merge = {
        "conflict_id": conflict,
        "strategy": "synthesis",
        "resolution": {"synthesis": "Planted.", "rationale": "from outside"},
    }
    refused(h, Code.FORBIDDEN, "MERGE", "senior", merge, session_id=sid)
    summarize = {"strategy": "summarize", "filter": {"status": ["active"]}}
    refused(h, Code.FORBIDDEN, "COMPACT", "senior", summarize, session_id=sid)
    # outside any session both work
    assert h.send("MERGE", "senior", merge)["status"] == "resolved"
    assert_replays(h)


def test_who_may_invite_and_who_may_join_uninvited(h: Harness) -> None:
    created = {"action": "create", "name": "launch", "invitees": ["bob"]}
    sid = h.send("SESSION", "alice", created)["session"]["id"]
    h.send("SESSION", "bob", {"action": "join", "session_id": sid})
    invite = {"action": "invite", "session_id": sid, "invitees": ["senior"]}
    # a member below session-creator authority, or a senior outside it, may not invite
    refused(h, Code.INSUFFICIENT_AUTHORITY, "SESSION", "bob", invite)
    refused(h, Code.INSUFFICIENT_AUTHORITY, "SESSION", "senior", invite)
    # the creator, an agent of level 8 and the operator may; the last two may also join as
    # they are (they could invite themselves)
    join = {"action": "join", "session_id": sid}
    assert h.send("SESSION", "boss", invite)["session"]["invited"] == ["senior"]
    h.send("SESSION", "boss", join)
    h.send("SESSION", "operator", join)
    # the creator comes back after leaving without an invitation (and is listed first)
    h.send("SESSION", "alice", {"action": "leave", "session_id": sid})
    assert h.send("SESSION", "alice", join)["session"]["members"] == [
        "alice",
        "bob",
        "boss",
        "operator",
    ]
    assert_replays(h)


def test_invitations_name_registered_agents_that_are_not_in_yet(h: Harness) -> None:
    created = {"action": "create", "name": "s", "invitees": ["bob", "bob"]}
    session = h.send("SESSION", "alice", created)["session"]
    sid = session["id"]
    assert session["invited"] == ["bob"]  # repeats are ignored

    def invite(action: str, *invitees: str) -> dict[str, Any]:
        return {"action": action, "session_id": sid, "invitees": list(invitees)}

    error = refused(h, Code.AGENT_NOT_FOUND, "SESSION", "alice", invite("invite", "ghost", "bob"))
    assert error.details == {"agent_ids": ["ghost"]}
    refused(h, Code.AGENT_NOT_FOUND, "SESSION", "alice", invite("invite", "operator"))
    no_one = {"action": "create", "name": "s", "invitees": ["ghost"]}
    refused(h, Code.AGENT_NOT_FOUND, "SESSION", "alice", no_one)
    again = refused(h, Code.INVALID_TRANSITION, "SESSION", "alice", invite("invite", "bob"))
    assert again.details == {"session_id": sid, "action": "invite", "agent_ids": ["bob"]}
    refused(h, Code.INVALID_TRANSITION, "SESSION", "alice", invite("invite", "alice"))
    refused(h, Code.INVALID_TRANSITION, "SESSION", "alice", invite("uninvite", "senior"))
    refused(h, Code.INVALID_PAYLOAD, "SESSION", "alice", {"action": "invite", "session_id": sid})
    # uninvite withdraws a pending invitation
    assert h.send("SESSION", "alice", invite("uninvite", "bob"))["session"]["invited"] == []
    refused(h, Code.FORBIDDEN, "SESSION", "bob", {"action": "join", "session_id": sid})
    assert_replays(h)


def test_invitations_are_listed_and_withdrawn_when_the_session_ends_or_the_agent_leaves(
    h: Harness,
) -> None:
    created = {"action": "create", "name": "s", "invitees": ["bob", "senior"]}
    sid = h.send("SESSION", "alice", created)["session"]["id"]
    listing = {"action": "list"}
    # an invited agent sees the session in its list, so it learns the id to join
    assert [s["id"] for s in h.send("SESSION", "bob", listing)["sessions"]] == [sid]
    assert h.send("SESSION", "boss", listing)["sessions"] == []
    mark = len(h.entries)
    h.send("DEREGISTER", "senior", {"agent_id": "senior"})
    assert h.field.state.sessions[sid]["invited"] == ["bob"]
    assert "session.uninvited" in [e.kind for e in h.entries[mark:]]
    ended = h.send("SESSION", "alice", {"action": "end", "session_id": sid})["session"]
    assert ended["invited"] == []
    assert h.send("SESSION", "bob", listing)["sessions"] == []
    assert_replays(h)


def test_sessions_of_a_log_from_before_invitations_read_as_having_none(h: Harness) -> None:
    sid = h.send("SESSION", "alice", {"action": "create", "name": "s"})["session"]["id"]
    h.send("SESSION", "alice", {"action": "pause", "session_id": sid})
    old = []
    for entry in h.stored():
        if entry.kind.startswith("session."):
            session = {k: v for k, v in entry.data["session"].items() if k != "invited"}
            entry = dataclasses.replace(entry, data={**entry.data, "session": session})
        old.append(entry)
    field = Field()
    field.replay(old)
    assert field.state.sessions[sid]["invited"] == []
    (paused,) = [e for e in old if e.kind == "session.paused"]
    event = event_of(paused, field.state.known_units)
    assert event is not None and event.detail is not None
    assert_valid("session", event.detail["session"])


# -- superseding needs the author's authority ------------------------------------------


def test_a_standard_agent_cannot_supersede_an_operator_directive(h: Harness) -> None:
    directive = record(
        h, "operator", "Ship nothing before the audit.", memory_type="human_directive"
    )
    assert directive in attuned(h, "alice")
    attack = unit("Ship on Friday.", memory_type="decision", **supersedes(directive))
    error = refused(h, Code.INSUFFICIENT_AUTHORITY, "RECORD", "alice", attack)
    assert error.http_status == 403 and error.recoverable is False
    assert "needs authority 10" in error.message and "the agent has 4" in error.message
    refused(h, Code.INSUFFICIENT_AUTHORITY, "RECORD", "senior", attack)
    refused(h, Code.INSUFFICIENT_AUTHORITY, "RECORD", "boss", attack)
    assert status(h, directive) == "active" and directive in attuned(h, "alice")
    # disagreeing is still open to anyone: a conflict, which leaves both in ATTUNE
    contradicts = {"relations": [{"type": "contradicts", "target_id": directive}]}
    objection = record(h, "alice", "Friday is safe.", **contradicts)
    assert directive in attuned(h, "bob") and objection in attuned(h, "bob")
    # the operator may
    record(h, "operator", "Ship after the audit.", **supersedes(directive))
    assert status(h, directive) == "superseded" and directive not in attuned(h, "alice")
    assert_replays(h)


def test_superseding_needs_at_least_the_authors_level(h: Harness) -> None:
    alices = record(h, "alice", "churn is 3%")
    seniors = record(h, "senior", "churn is 4%")
    # a unit of one's own, or of an agent at or below one's level
    record(h, "alice", "churn is 2%", **supersedes(alices))
    assert status(h, alices) == "superseded"
    bobs = record(h, "bob", "churn is 5%")
    record(h, "alice", "churn is 6%", **supersedes(bobs))
    assert status(h, bobs) == "superseded"
    # a unit of a higher level: refused, whatever else the RECORD relates to
    relations = [{"type": "supports", "target_id": alices}, *supersedes(seniors)["relations"]]
    attack = unit("churn is 7%", relations=relations)
    refused(h, Code.INSUFFICIENT_AUTHORITY, "RECORD", "alice", attack)
    record(h, "boss", "churn is 8%", **supersedes(seniors))
    assert status(h, seniors) == "superseded"
    assert_replays(h)


def test_a_units_level_stays_with_it_when_its_author_leaves(h: Harness) -> None:
    seniors = record(h, "senior", "the budget is 2M")
    assert h.field.state.authority_of(seniors) == authority.SENIOR
    h.send("DEREGISTER", "senior", {"agent_id": "senior"})
    attack = unit("the budget is 5M", **supersedes(seniors))
    refused(h, Code.INSUFFICIENT_AUTHORITY, "RECORD", "alice", attack)
    assert_replays(h)  # ... and through a restart


def test_in_its_session_the_creator_moderates_but_its_own_units_weigh_its_own_level(
    h: Harness,
) -> None:
    created = {"action": "create", "name": "launch", "invitees": ["bob", "senior"]}
    sid = h.send("SESSION", "alice", created)["session"]["id"]
    for agent in ("bob", "senior"):
        h.send("SESSION", agent, {"action": "join", "session_id": sid})
    seniors = record(h, "senior", "launch in May", session_id=sid)
    alices = record(h, "alice", "launch in June", session_id=sid)
    # the creator acts at 8 in its session: it may supersede the senior's unit there
    record(h, "alice", "launch in July", session_id=sid, **supersedes(seniors))
    assert status(h, seniors) == "superseded"
    # its own units weigh 4 (creating a session lifts no unit): bob, at 4, may supersede them
    assert h.field.state.authority_of(alices) == authority.STANDARD
    record(h, "bob", "launch in August", session_id=sid, **supersedes(alices))
    assert status(h, alices) == "superseded"
    assert_replays(h)


def test_merge_cannot_resolve_against_a_unit_above_the_merger(h: Harness) -> None:
    directive = record(h, "operator", "Prices stay flat.", memory_type="human_directive")
    contradicts = {"relations": [{"type": "contradicts", "target_id": directive}]}
    objection = record(h, "alice", "Prices rise 5%.", **contradicts)
    (conflict_id,) = list(h.field.state.conflicts)

    def merge(strategy: str, **resolution: Any) -> dict[str, Any]:
        resolution = {"rationale": "the team agreed", **resolution}
        return {"conflict_id": conflict_id, "strategy": strategy, "resolution": resolution}

    for attack in (
        merge("authority", winner_id=objection),
        merge("synthesis", synthesis="Prices rise 2%."),
        merge("last_write_wins"),  # picks the newer: the objection
        merge("vote", winner_id=objection),  # either unit may lose a vote
    ):
        error = refused(h, Code.INSUFFICIENT_AUTHORITY, "MERGE", "senior", attack)
        assert directive in error.message
    # the directive may win; the objection (alice's, 4) may lose to a senior
    resolved = h.send("MERGE", "senior", merge("authority", winner_id=directive))
    assert resolved["side_effects"]["superseded_units"] == [objection]
    assert status(h, directive) == "active"
    assert_replays(h)


def test_escalation_leaves_a_protected_unit_to_the_operator(h: Harness) -> None:
    directive = record(h, "operator", "Prices stay flat.", memory_type="human_directive")
    contradicts = {"relations": [{"type": "contradicts", "target_id": directive}]}
    objection = record(h, "alice", "Prices rise 5%.", **contradicts)
    (conflict_id,) = list(h.field.state.conflicts)
    escalate = {
        "conflict_id": conflict_id,
        "strategy": "human_escalation",
        "resolution": {"rationale": "the operator's call"},
    }
    assert h.send("MERGE", "senior", escalate)["status"] == "escalated"
    decide = {
        "conflict_id": conflict_id,
        "strategy": "authority",
        "resolution": {"rationale": "market data", "winner_id": objection},
    }
    assert h.send("MERGE", "operator", decide)["status"] == "resolved"
    assert status(h, directive) == "superseded"
    assert_replays(h)


def test_a_vote_opened_by_who_may_supersede_both_is_decided_by_its_ballots(h: Harness) -> None:
    first = record(h, "senior", "the launch is in May")
    contradicts = {"relations": [{"type": "contradicts", "target_id": first}]}
    second = record(h, "alice", "the launch is in June", **contradicts)
    (conflict_id,) = list(h.field.state.conflicts)

    def ballot(agent: str, winner: str, **extra: Any) -> dict[str, Any]:
        resolution = {"rationale": "r", "winner_id": winner, **extra}
        payload = {"conflict_id": conflict_id, "strategy": "vote", "resolution": resolution}
        return h.send("MERGE", agent, payload)

    assert ballot("boss", second, quorum=2)["status"] == "pending_vote"
    # alone, alice may not supersede the senior's unit; her ballot decides the vote the
    # boss opened, and the boss answered for both units
    attack = unit("the launch is in July", **supersedes(first))
    refused(h, Code.INSUFFICIENT_AUTHORITY, "RECORD", "alice", attack)
    assert ballot("alice", second)["status"] == "resolved"
    assert status(h, first) == "superseded"
    assert_replays(h)


def test_compact_leaves_alone_the_units_it_may_not_supersede(h: Harness) -> None:
    directive = record(h, "operator", "Keep the EU data in the EU.", memory_type="human_directive")
    bosses = record(h, "boss", "the EU region is Frankfurt")
    alices = record(h, "alice", "the EU region has 3 zones")
    seniors = record(h, "senior", "the EU bill is 12k")
    payload = {"strategy": "archive", "filter": {"status": ["active"]}}
    archived = h.send("COMPACT", "senior", payload)
    assert (archived["units_affected"], archived["units_remaining"]) == (2, 0)
    assert [status(h, u) for u in (directive, bosses, alices, seniors)] == [
        "active",
        "active",
        "archived",
        "archived",
    ]
    purged = h.send("COMPACT", "boss", {"strategy": "purge", "filter": {"status": ["active"]}})
    assert purged["units_affected"] == 1 and bosses not in h.field.state.units
    assert status(h, directive) == "active"
    summarized = h.send(
        "COMPACT", "operator", {"strategy": "summarize", "filter": {"status": ["active"]}}
    )
    assert summarized["units_affected"] == 1 and status(h, directive) == "archived"
    assert_replays(h)


# -- a session creator moderates the conflicts within its session -----------------------


def test_a_session_creator_merges_conflicts_within_its_session_only(h: Harness) -> None:
    created = {"action": "create", "name": "launch", "invitees": ["bob"]}
    sid = h.send("SESSION", "alice", created)["session"]["id"]
    h.send("SESSION", "bob", {"action": "join", "session_id": sid})
    mine = record(h, "alice", "the launch is in March", session_id=sid)
    contradicts = {"relations": [{"type": "contradicts", "target_id": mine}]}
    record(h, "bob", "the launch is in May", session_id=sid, **contradicts)
    inside = next(iter(h.field.state.conflicts))
    # outside the session alice is a standard agent: a conflict there is not hers to merge
    outside_a = record(h, "alice", "prices stay flat")
    contradicts = {"relations": [{"type": "contradicts", "target_id": outside_a}]}
    record(h, "bob", "prices rise", **contradicts)
    outside = next(c for c in h.field.state.conflicts if c != inside)

    def keep(conflict_id: str, winner: str) -> dict[str, Any]:
        resolution = {"rationale": "the creator decides", "winner_id": winner}
        return {"conflict_id": conflict_id, "strategy": "authority", "resolution": resolution}

    error = refused(h, Code.INSUFFICIENT_AUTHORITY, "MERGE", "alice", keep(outside, outside_a))
    assert "MERGE needs authority 6" in error.message
    # inside, a member that did not create the session is still a standard agent
    refused(h, Code.INSUFFICIENT_AUTHORITY, "MERGE", "bob", keep(inside, mine), session_id=sid)
    # having left, alice no longer sees the session's conflict; rejoined, she moderates it
    h.send("SESSION", "alice", {"action": "leave", "session_id": sid})
    refused(h, Code.CONFLICT_NOT_FOUND, "MERGE", "alice", keep(inside, mine))
    h.send("SESSION", "alice", {"action": "join", "session_id": sid})
    resolved = h.send("MERGE", "alice", keep(inside, mine), session_id=sid)
    assert resolved["status"] == "resolved"
    assert status(h, mine) == "active"
    assert_replays(h)
