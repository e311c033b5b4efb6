"""Session visibility (spec 11.3): an agent outside a session learns nothing of it.

The core tests drive every reader through the Harness: ATTUNE (full and
polling), DETECT, MERGE, REPLAY, COMPACT, COORDINATE, HANDOFF and RECORD
relations, each with a member and an outsider, plus the per-session role
and authority rules. The end-to-end tests run a real server and show that
push (live and resumed from a cursor) and polling agree: the outsider is
told of nothing from inside, a member of everything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from field.client import FieldClient
from field.contract.errors import Code, FieldError
from field.core import visibility
from field.subscriptions.events import event_of

from .conftest import ThreadedServer
from .core_util import Harness
from .schema_util import is_valid
from .test_push import open_ws, sse_stream, subscribe

OPERATOR_TOKEN = "operator-token-0123456789"


def refused(code: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> FieldError:
    with pytest.raises(FieldError) as info:
        call(*args, **kwargs)
    assert info.value.code == code, info.value.message
    return info.value


def attuned(h: Harness, agent: str, **scope: Any) -> list[str]:
    return [r["memory_unit"]["id"] for r in h.attune(agent, **scope)["record"]]


@pytest.fixture
def h() -> Harness:
    """lead creates a session and invites member, who joins; outsider does not. senior is 6."""
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.register("lead", "lead")
    h.register("member", "analyst")
    h.register("outsider", "analyst")
    h.register("senior", "reviewer", authority=6, via=OPERATOR_TOKEN)
    created = {"action": "create", "name": "launch", "invitees": ["member"]}
    h.session = h.send("SESSION", "lead", created)["session"]["id"]  # type: ignore[attr-defined]
    h.send("SESSION", "member", {"action": "join", "session_id": h.session})  # type: ignore[attr-defined]
    return h


def inside(h: Harness, agent: str, content: str, **extra: Any) -> str:
    payload = {
        "type": extra.pop("memory_type", "finding"),
        "content": content,
        "intent": {"purpose": "test"},
        "confidence": {"score": extra.pop("score", 0.8), "reasoning": "r"},
        **extra,
    }
    return str(h.send("RECORD", agent, payload, session_id=h.session)["memory_unit_id"])  # type: ignore[attr-defined]


def test_attune_and_polls_show_session_units_to_members_only(h: Harness) -> None:
    secret = inside(h, "lead", "the launch date moves to March")
    public = h.record("lead", "the office closes on Friday")["memory_unit_id"]
    assert set(attuned(h, "member")) == {secret, public}
    assert attuned(h, "outsider") == [public]
    assert attuned(h, "outsider", since_epoch=0) == [public]
    assert h.attune("outsider")["context_budget"]["units_available"] == 1
    # joining (once invited) shows it; leaving hides it again
    invite = {"action": "invite", "session_id": h.session, "invitees": ["outsider"]}  # type: ignore[attr-defined]
    h.send("SESSION", "lead", invite)
    h.send("SESSION", "outsider", {"action": "join", "session_id": h.session})  # type: ignore[attr-defined]
    assert set(attuned(h, "outsider")) == {secret, public}
    h.send("SESSION", "outsider", {"action": "leave", "session_id": h.session})  # type: ignore[attr-defined]
    assert attuned(h, "outsider") == [public]


def test_the_operator_sees_every_session(h: Harness) -> None:
    secret = inside(h, "lead", "the launch date moves to March")
    scope = {"scope": {"role": "operator", "max_units": 10}}
    response = h.send("ATTUNE", "operator", scope, token=OPERATOR_TOKEN)
    assert [r["memory_unit"]["id"] for r in response["record"]] == [secret]


def test_a_sessions_rules_hide_types_by_role_and_authority() -> None:
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.register("lead", "lead")
    h.register("analyst", "analyst")
    h.register("architect", "architect")
    h.register("senior", "analyst", authority=6, via=OPERATOR_TOKEN)
    rules = {
        "decision": {"roles": ["lead", "architect"]},
        "human_directive": {"min_authority": 6},
    }
    invitees = ["analyst", "architect", "senior"]
    payload = {"action": "create", "name": "s", "visibility": rules, "invitees": invitees}
    created = h.send("SESSION", "lead", payload)
    session = created["session"]
    assert session["visibility"] == {
        "decision": {"roles": ["lead", "architect"], "min_authority": 0},
        "human_directive": {"roles": None, "min_authority": 6},
    }
    for agent in ("analyst", "architect", "senior"):
        h.send("SESSION", agent, {"action": "join", "session_id": session["id"]})
    ids = {}
    for memory_type in ("finding", "decision", "human_directive"):
        payload = {
            "type": memory_type,
            "content": f"a {memory_type} about the launch",
            "intent": {"purpose": "test"},
            "confidence": {"score": 0.8, "reasoning": "r"},
        }
        ids[memory_type] = h.send("RECORD", "lead", payload, session_id=session["id"])[
            "memory_unit_id"
        ]
    seen = {agent: set(attuned(h, agent)) for agent in ("analyst", "architect", "senior")}
    assert seen["analyst"] == {ids["finding"]}
    assert seen["architect"] == {ids["finding"], ids["decision"]}
    assert seen["senior"] == {ids["finding"], ids["human_directive"]}
    # the creator acts at 8 in its session: it sees its directive
    assert ids["human_directive"] in attuned(h, "lead", include_own=True)
    assert h.replayed().state.sessions[session["id"]]["visibility"] == session["visibility"]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"action": "join", "session_id": "session-x", "visibility": {}}, "not at create"),
        ({"action": "create", "name": "s", "visibility": {"rumour": {}}}, "not a type"),
        ({"action": "create", "name": "s", "visibility": {"decision": {"roles": [""]}}}, "blank"),
        (
            {"action": "create", "name": "s", "visibility": {"decision": {"min_authority": 11}}},
            "11",
        ),
        ({"action": "create", "name": "s", "visibility": {"decision": {"who": 1}}}, "unknown key"),
        ({"action": "create", "name": "s", "visibility": []}, "not an object"),
    ],
)
def test_visibility_rules_are_validated(h: Harness, payload: dict[str, Any], reason: str) -> None:
    refused(Code.INVALID_PAYLOAD, h.send, "SESSION", "lead", payload)
    assert not is_valid("session.request", payload), reason


def test_conflicts_inside_a_session_are_hidden_from_outsiders(h: Harness) -> None:
    a = inside(h, "lead", "the launch is in March")
    b = inside(
        h, "member", "the launch is in May", relations=[{"type": "contradicts", "target_id": a}]
    )
    (conflict,) = h.field.state.conflicts
    assert [c["id"] for c in h.attune("member")["conflicts"]] == [conflict]
    assert h.attune("outsider")["conflicts"] == []
    listed = h.send("DETECT", "outsider", {"mode": "list"})["conflicts"]
    assert listed == []
    assert [c["id"] for c in h.send("DETECT", "member", {"mode": "list"})["conflicts"]] == [
        conflict
    ]
    merge = {
        "conflict_id": conflict,
        "strategy": "last_write_wins",
        "resolution": {"winner_id": None, "synthesis": None, "rationale": "newer"},
    }
    refused(Code.CONFLICT_NOT_FOUND, h.send, "MERGE", "senior", merge)
    refused(Code.UNIT_NOT_FOUND, h.send, "DETECT", "outsider", {"mode": "check", "target_id": b})
    scan = h.send("DETECT", "senior", {"mode": "scan"})
    assert scan["scan_coverage"]["units_scanned"] == 0  # it sees no unit at all


def test_relations_to_units_you_cannot_see_do_not_exist(h: Harness) -> None:
    secret = inside(h, "lead", "the launch date moves to March")
    relation = {"type": "supports", "target_id": secret}
    refused(Code.UNIT_NOT_FOUND, h.record, "outsider", "me too", relations=[relation])
    assert h.record("member", "me too", relations=[relation])["status"] == "accepted"


def test_replay_shows_outsiders_no_trace_of_a_session(h: Harness) -> None:
    secret = inside(h, "lead", "the launch date moves to March")
    public = h.record(
        "member", "builds on it", relations=[{"type": "elaborates", "target_id": secret}]
    )
    public_id = public["memory_unit_id"]

    def replay(agent: str, target_type: str, target_id: str) -> dict[str, Any]:
        payload = {"target_type": target_type, "target_id": target_id, "depth": "full_trace"}
        return h.send("REPLAY", agent, payload)

    refused(Code.UNIT_NOT_FOUND, replay, "outsider", "memory_unit", secret)
    refused(Code.SESSION_NOT_FOUND, replay, "outsider", "session", h.session)  # type: ignore[attr-defined]
    theirs = replay("outsider", "memory_unit", public_id)
    assert [e["memory_unit_id"] for e in theirs["timeline"]] == [public_id]
    assert theirs["total_events"] == 1
    ours = replay("member", "memory_unit", public_id)
    assert {e["memory_unit_id"] for e in ours["timeline"]} == {secret, public_id}


def test_compact_touches_only_what_the_caller_sees(h: Harness) -> None:
    inside(h, "lead", "inside")
    h.record("lead", "outside")
    compact = {"strategy": "archive", "filter": {"types": ["finding"]}}
    assert h.send("COMPACT", "senior", compact)["units_affected"] == 1


def test_tasks_in_a_session_are_hidden_from_outsiders(h: Harness) -> None:
    created = h.send(
        "COORDINATE",
        "lead",
        {"action": "create", "title": "plan the launch"},
        session_id=h.session,  # type: ignore[attr-defined]
    )
    task_id = created["task"]["id"]
    refused(
        Code.TASK_NOT_FOUND,
        h.send,
        "COORDINATE",
        "outsider",
        {"action": "start", "task_id": task_id},
    )
    assert h.send("COORDINATE", "lead", {"action": "list"})["tasks"][0]["id"] == task_id
    replay = {"target_type": "task", "target_id": task_id, "depth": "summary"}
    refused(Code.TASK_NOT_FOUND, h.send, "REPLAY", "outsider", replay)


def test_a_handoff_packages_only_what_both_agents_see() -> None:
    h = Harness()
    for agent in ("lead", "worker", "helper"):
        h.register(agent, "analyst", interests=["launch"])
    created = {"action": "create", "name": "s", "invitees": ["worker", "helper"]}
    session = h.send("SESSION", "lead", created)["session"]["id"]
    h.send("SESSION", "worker", {"action": "join", "session_id": session})
    h.send("SESSION", "helper", {"action": "join", "session_id": session})
    other = h.send("SESSION", "worker", {"action": "create", "name": "private"})["session"]["id"]
    payload = {
        "type": "finding",
        "content": "launch notes only the worker sees",
        "intent": {"purpose": "test"},
        "confidence": {"score": 0.9, "reasoning": "r"},
    }
    private = h.send("RECORD", "worker", payload, session_id=other)["memory_unit_id"]
    shared = h.record("lead", "launch notes everyone sees")["memory_unit_id"]
    task = h.send(
        "COORDINATE", "worker", {"action": "create", "title": "launch", "assignee": "worker"}
    )["task"]["id"]
    handoff = {"task_id": task, "to_agent_id": "helper", "context": {"include_units": [private]}}
    refused(Code.FORBIDDEN, h.send, "HANDOFF", "worker", handoff)
    del handoff["context"]
    response = h.send("HANDOFF", "worker", handoff)
    packaged = [u["memory_unit"]["id"] for u in response["handoff"]["context"]["units"]]
    assert shared in packaged and private not in packaged


# -- end to end: push and polling agree -------------------------------------------------


async def test_an_outsider_is_pushed_nothing_from_inside_a_session(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    server = server_factory()
    async with FieldClient(server.url) as field, aiohttp.ClientSession() as http:
        lead = await field.register("lead", "lead", interests=["launch"])
        member = await field.register("member", "analyst", interests=["launch"])
        outsider = await field.register("outsider", "analyst", interests=["launch"])
        created = await lead.send(
            "SESSION", {"action": "create", "name": "launch", "invitees": ["member"]}
        )
        session_id = created["session"]["id"]
        await member.send("SESSION", {"action": "join", "session_id": session_id})
        events = ["memory.recorded", "session.paused"]
        theirs = await subscribe(outsider, events)
        ours = await subscribe(member, events)
        async with (
            open_ws(server, outsider.token) as outside_ws,
            sse_stream(http, ours["sse_url"], member.token) as inside_sse,
        ):
            await outside_ws.ready()
            await inside_sse.ready()
            lead.session_id = session_id
            secret = await lead.record(
                "finding",
                "the launch moves to March",
                purpose="plan",
                confidence=0.9,
                reasoning="r",
            )
            await lead.send("SESSION", {"action": "pause", "session_id": session_id})
            lead.session_id = None
            sentinel = await lead.record(
                "finding",
                "the launch party is open to all",
                purpose="plan",
                confidence=0.9,
                reasoning="r",
            )
            # streams are in cursor order: once the sentinel arrived, nothing earlier will
            (only,) = await outside_ws.notifications(1)
            assert only["memory_unit_id"] == sentinel["memory_unit_id"]
            seen = await inside_sse.notifications(3)
            assert [e.event for e in seen] == [
                "memory.recorded",
                "session.paused",
                "memory.recorded",
            ]
            assert seen[0].data["memory_unit_id"] == secret["memory_unit_id"]
        # resumed from its first cursor, the outsider's stream is the same
        async with open_ws(server, outsider.token, since=[theirs["cursor"]]) as again:
            frames = await again.ready()
        replayed = [f["data"] for f in frames if f["type"] == "notification"]
        assert [n["memory_unit_id"] for n in replayed] == [sentinel["memory_unit_id"]]
        assert frames[-1]["data"]["replayed"] == 1
        # and polling agrees
        polled = await outsider.attune(max_units=10, since_epoch=0)
        assert [r["memory_unit"]["id"] for r in polled["record"]] == [sentinel["memory_unit_id"]]
        listing = await outsider.get("/v1/conflicts")
        assert listing["conflicts"] == []


def test_a_handoff_of_session_units_is_told_only_to_who_may_see_them() -> None:
    h = Harness()
    for agent in ("lead", "worker", "bystander"):
        h.register(agent, "analyst", interests=["launch"])
    created = {"action": "create", "name": "s", "invitees": ["worker"]}
    session = h.send("SESSION", "lead", created)["session"]["id"]
    h.send("SESSION", "worker", {"action": "join", "session_id": session})
    payload = {
        "type": "finding",
        "content": "launch notes of the session",
        "intent": {"purpose": "test"},
        "confidence": {"score": 0.9, "reasoning": "r"},
    }
    secret = h.send("RECORD", "lead", payload, session_id=session)["memory_unit_id"]
    task = h.send(  # a Field-wide task: its package holds a session unit
        "COORDINATE", "lead", {"action": "create", "title": "launch", "assignee": "lead"}
    )["task"]["id"]
    handoff = {"task_id": task, "to_agent_id": "worker", "context": {"include_units": [secret]}}
    h.send("HANDOFF", "lead", handoff)
    (entry,) = [e for e in h.stored() if e.kind == "handoff.incoming"]
    event = event_of(entry, h.field.state.known_units)
    assert event is not None
    audience = visibility.event_audience(h.field.state, event)
    assert audience is not None
    assert {"lead", "worker"} <= audience and "bystander" not in audience
