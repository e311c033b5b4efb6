"""The vectorized subscription matcher agrees with the plain reference matcher.

Field states are built through the pure core (the Harness): agents
register, record units (some contradicting or superseding others),
subscribe, unsubscribe and deregister; then every log entry is turned
into an event and matched, and the result is compared with
``tests/reference_matcher.py``.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.subscriptions import matcher as matcher_module
from field.subscriptions.events import SUBSCRIPTION_EVENTS, FieldEvent, event_of
from field.subscriptions.matcher import Match, Matcher
from field.subscriptions.registry import FEW_ROWS

from .core_util import Harness
from .reference_matcher import reference_match, relevance_of

AGENTS = ("a0", "a1", "a2", "a3", "a4")
# "x" and "the" have no keywords at all (too short / a stop word)
ROLES = ("strategist", "market_researcher", "analyst", "risk officer", "market analyst", "x")
WORDS = (
    "market", "size", "pricing", "growth", "competitors", "churn", "risk", "analyst",
    "researcher", "strategist", "officer", "saas", "the",
)  # fmt: skip
TASKS = (None, "t1", "t2")
TYPES = ("finding", "decision", "observation", "question", "constraint", "assumption")
NOTIFIED_EVENTS = (
    "memory.recorded",
    "memory.superseded",
    "memory.contested",
    "conflict.detected",
    "agent.joined",
)

phrase = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)

register_op = st.tuples(
    st.just("register"),
    st.sampled_from(AGENTS),
    st.sampled_from(ROLES),
    st.lists(phrase, max_size=3),
    st.sampled_from(TASKS),
)
# the other steps name their agent by an index into the registered agents
who = st.integers(min_value=0, max_value=9)
record_op = st.tuples(
    st.just("record"),
    who,
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join),  # content
    phrase,  # purpose
    st.one_of(st.none(), phrase),  # question
    st.sampled_from(TYPES),
    st.sampled_from(TASKS),
    # confidence: None = a draft without one; float32 values are stored exactly by the index
    st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0, width=32)),
    st.lists(
        st.tuples(st.sampled_from(["contradicts", "supersedes", "supports"]), st.integers(0, 99)),
        max_size=2,
    ),
)
subscribe_op = st.tuples(
    st.just("subscribe"),
    who,
    st.one_of(
        st.lists(st.sampled_from(NOTIFIED_EVENTS), min_size=1, max_size=5),
        st.lists(st.sampled_from(SUBSCRIPTION_EVENTS), min_size=1, max_size=13),
    ),
    st.one_of(
        st.none(),
        st.sampled_from([0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 1.0]),
        st.floats(min_value=0.0, max_value=1.0),
    ),
    st.booleans(),
)
unsubscribe_op = st.tuples(st.just("unsubscribe"), who, st.integers(0, 99))
deregister_op = st.tuples(st.just("deregister"), who)

program = st.tuples(
    st.lists(register_op, min_size=2, max_size=5),
    st.lists(subscribe_op, min_size=1, max_size=6),
    st.lists(
        st.one_of(
            record_op,
            record_op,
            record_op,
            record_op,
            subscribe_op,
            register_op,
            unsubscribe_op,
            deregister_op,
        ),
        min_size=5,
        max_size=40,
    ),
).map(lambda parts: [step for part in parts for step in part])


def run(steps: list[tuple[Any, ...]]) -> Harness:
    """Drive a Harness through ``steps``, skipping steps that would be refused."""
    h = Harness()
    registered: set[str] = set()
    unit_ids: list[str] = []
    for step in steps:
        kind, agent = step[0], step[1]
        if kind == "register":
            if agent not in registered:
                _, _, role, interests, task = step
                h.register(agent, role, interests=interests, current_task_id=task)
                registered.add(agent)
            continue
        if not registered:
            continue
        agent = sorted(registered)[agent % len(registered)]
        if kind == "record":
            _, _, content, purpose, question, memory_type, task, confidence, relations = step
            payload: dict[str, Any] = {
                "mode": "draft" if confidence is None else "committed",
                "type": memory_type,
                "content": content,
                "intent": {"purpose": purpose, "task_id": task, "question": question},
            }
            if confidence is not None:
                payload["confidence"] = {"score": confidence, "reasoning": "measured"}
            if unit_ids and relations:
                payload["relations"] = [
                    {"type": kind, "target_id": unit_ids[i % len(unit_ids)]}
                    for kind, i in relations
                ]
            response = h.send("RECORD", agent, payload)
            unit_ids.append(response["memory_unit_id"])
        elif kind == "subscribe":
            _, _, events, min_relevance, include_own = step
            subscription = {
                "events": events,
                "min_relevance": min_relevance,
                "include_own": include_own,
            }
            h.send("SUBSCRIBE", agent, {"action": "subscribe", "subscription": subscription})
        elif kind == "unsubscribe":
            mine = sorted(h.field.state.active_subscriptions.get(agent, ()))
            if mine:
                subscription = {"id": mine[step[2] % len(mine)]}
                h.send("SUBSCRIBE", agent, {"action": "unsubscribe", "subscription": subscription})
        elif kind == "deregister":
            h.send("DEREGISTER", agent, {"agent_id": agent})
            registered.discard(agent)
    return h


def subscribe(h: Harness, agent: str, events: list[str], **options: Any) -> str:
    body = {"action": "subscribe", "subscription": {"events": events, **options}}
    response = h.send("SUBSCRIBE", agent, body)
    return str(response["subscription_id"])


def events_of(h: Harness) -> list[FieldEvent]:
    units = h.field.state.units
    return [e for e in (event_of(entry, units) for entry in h.stored()) if e is not None]


def subscription_agents(h: Harness) -> dict[str, dict[str, Any]]:
    """Each subscription's agent as it was registered when it subscribed (from the log)."""
    current: dict[str, dict[str, Any]] = {}
    agents: dict[str, dict[str, Any]] = {}
    for entry in h.stored():
        if entry.kind == "agent.registered":
            current[entry.data["agent"]["id"]] = entry.data["agent"]
        elif entry.kind == "subscription.created":
            subscription = entry.data["subscription"]
            agents[subscription["id"]] = current[subscription["agent_id"]]
    return agents


def recorded_units(h: Harness) -> list[dict[str, Any]]:
    return [e.data["unit"] for e in h.stored() if e.kind == "memory.recorded"]


def matcher_of(h: Harness) -> Matcher:
    state = h.field.state
    return Matcher(state.registry, state.index, state.units)


def as_dict(h: Harness, matches: list[Match]) -> dict[int, dict[str, tuple[float, bool]]]:
    """{event position: {subscription id: (relevance, requires_action)}}."""
    ids = h.field.state.registry.ids
    result: dict[int, dict[str, tuple[float, bool]]] = {}
    for m in matches:
        assert m.event.position not in result, "one Match per event"
        assert len(m.rows), "events that notify nobody are left out"
        result[m.event.position] = {
            ids[row]: (float(rel), bool(act))
            for row, rel, act in zip(
                m.rows.tolist(), m.relevance.tolist(), m.requires_action.tolist(), strict=True
            )
        }
    return result


def key(matches: list[Match]) -> list[tuple[Any, ...]]:
    """Everything in a list of matches, for exact comparison."""
    return [
        (
            m.event.position,
            m.rows.tolist(),
            m.relevance.tolist(),
            m.requires_action.tolist(),
            m.flags.tolist(),
        )
        for m in matches
    ]


def restrict(matches: list[Match], row: int) -> list[tuple[Any, ...]]:
    """The matches of one registry row, as :func:`key` gives them."""
    out = []
    for m in matches:
        hit = np.flatnonzero(m.rows == row)
        if len(hit):
            out.append(
                (
                    m.event.position,
                    m.rows[hit].tolist(),
                    m.relevance[hit].tolist(),
                    m.requires_action[hit].tolist(),
                    m.flags[hit].tolist(),
                )
            )
    return out


def check_against_reference(h: Harness) -> int:
    """The matcher agrees with the reference on every event; returns how many notifications."""
    state = h.field.state
    events = events_of(h)
    units = recorded_units(h)
    subscriptions = list(state.subscriptions.values())
    agents = subscription_agents(h)
    by_id = {s["id"]: s for s in subscriptions}
    got = as_dict(h, matcher_of(h).match(events))
    total = 0
    for event in events:
        expected = reference_match(units, subscriptions, agents, event)
        actual = got.get(event.position, {})
        for sub_id in expected.keys() ^ actual.keys():
            # only a relevance within rounding of min_relevance may go either way
            subscription = by_id[sub_id]
            relevance, _ = relevance_of(units, subscription, agents[sub_id], event)
            assert abs(relevance - subscription["min_relevance"]) <= 1e-9, (
                event,
                sub_id,
                expected.get(sub_id),
                actual.get(sub_id),
            )
        for sub_id in expected.keys() & actual.keys():
            (want, want_act), (have, have_act) = expected[sub_id], actual[sub_id]
            assert abs(want - have) <= 1e-9, (event, sub_id, want, have)
            assert 0.0 <= have <= 1.0
            assert want_act == have_act, (event, sub_id)
        total += len(actual)
    return total


def check_splits(h: Harness) -> None:
    """One event at a time, all at once, in small chunks, or one row at a time: the same."""
    events = events_of(h)
    matcher = matcher_of(h)
    whole = matcher.match(events)
    one_by_one = [m for event in events for m in matcher.match([event])]
    assert key(one_by_one) == key(whole)
    scope = matcher.scope()  # one scope reused for every call (the push hub's way)
    assert key([m for event in events for m in matcher.match([event], scope=scope)]) == key(whole)
    halves = matcher.match(events[: len(events) // 2]) + matcher.match(events[len(events) // 2 :])
    assert key(halves) == key(whole)
    with mock.patch.object(matcher_module, "MATRIX_CELLS", 3):  # chunks of a few events
        assert key(matcher.match(events)) == key(whole)
    registry = h.field.state.registry
    for row in range(len(registry)):
        alone = matcher.match(events, only=np.array([row]))
        assert key(alone) == restrict(whole, row)
    if len(registry) > 2:  # a subset of rows (the live path: rows with a consumer)
        rows = np.arange(0, len(registry), 2)
        subset = matcher.match(events, only=rows)
        scope = matcher.scope(rows)
        reused = [m for event in events for m in matcher.match([event], scope=scope)]
        assert key(reused) == key(subset)
        merged = sorted(
            (entry for row in rows.tolist() for entry in restrict(whole, row)),
            key=lambda entry: entry[0],
        )
        assert [
            (pos, row, rel, act, flag)
            for pos, rows_, rels, acts, flags in key(subset)
            for row, rel, act, flag in zip(rows_, rels, acts, flags, strict=True)
        ] == [
            (pos, rows_[0], rels[0], acts[0], flags[0]) for pos, rows_, rels, acts, flags in merged
        ]


@settings(max_examples=150, deadline=None)
@given(program)
def test_matcher_agrees_with_the_reference(steps: list[Any]) -> None:
    h = run(steps)
    check_against_reference(h)
    check_splits(h)


everyone = st.tuples(
    *(
        st.tuples(
            st.just("register"),
            st.just(agent),
            st.sampled_from(ROLES),
            st.lists(phrase, max_size=3),
            st.sampled_from(TASKS),
        )
        for agent in AGENTS
    )
).map(list)
many_subscriptions = st.tuples(
    everyone,
    st.lists(subscribe_op, min_size=17, max_size=24),
    st.lists(st.one_of(record_op, register_op, unsubscribe_op), min_size=5, max_size=15),
)


@settings(max_examples=15, deadline=None)
@given(many_subscriptions)
def test_matcher_agrees_with_the_reference_over_many_subscriptions(
    prog: tuple[list[Any], list[Any], list[Any]],
) -> None:
    """More than FEW_ROWS rows: relevance comes from the inverted keyword index."""
    registrations, subscriptions, steps = prog
    h = run(registrations + subscriptions + steps)
    assert len(h.field.state.registry) > FEW_ROWS
    check_against_reference(h)
    check_splits(h)


# -- focused cases -------------------------------------------------------------


def record(h: Harness, agent: str, content: str, **options: Any) -> dict[str, Any]:
    """RECORD with a confidence a float32 holds exactly (see the float32 test below)."""
    options.setdefault("score", 0.75)
    return h.record(agent, content, **options)


def notified(h: Harness, subscription_id: str) -> dict[int, tuple[str, float, bool]]:
    """{position: (event name, relevance, requires_action)} for one subscription."""
    row = h.field.state.registry.rows[subscription_id]
    result = {}
    for m in matcher_of(h).match(events_of(h)):
        for r, rel, act in zip(m.rows.tolist(), m.relevance, m.requires_action, strict=True):
            if r == row:
                result[m.event.position] = (m.event.name, float(rel), bool(act))
    return result


def names(h: Harness, subscription_id: str) -> list[str]:
    return [name for name, _, _ in notified(h, subscription_id).values()]


def test_own_actions_are_excluded_unless_include_own() -> None:
    h = Harness()
    h.register("a", "analyst")
    h.register("b", "analyst")
    without = subscribe(h, "a", ["memory.recorded"])
    with_own = subscribe(h, "a", ["memory.recorded"], include_own=True)
    record(h, "a", "my own market finding")
    record(h, "b", "their market finding")
    assert [e.actor for e in events_of(h) if e.name == "memory.recorded"] == ["a", "b"]
    own, theirs = (e.position for e in events_of(h) if e.name == "memory.recorded")
    assert set(notified(h, without)) == {theirs}
    assert set(notified(h, with_own)) == {own, theirs}
    check_against_reference(h)


def test_contradicting_my_unit_requires_action() -> None:
    h = Harness()
    h.register("a", "analyst")
    h.register("b", "strategist")
    mine = record(h, "a", "churn is rising", score=0.25)["memory_unit_id"]
    watch = subscribe(h, "a", ["memory.contested", "conflict.detected"])
    record(h, "b", "churn is flat", relations=[{"type": "contradicts", "target_id": mine}])
    got = notified(h, watch)
    by_name: dict[str, list[tuple[float, bool]]] = {}
    for name, relevance, act in got.values():
        by_name.setdefault(name, []).append((relevance, act))
    assert by_name["conflict.detected"] == [(1.0, True)]
    # both units are contested: mine must be acted on, b's only scores
    contested = sorted(by_name["memory.contested"], key=lambda item: -item[0])
    assert contested[0] == (1.0, True)
    assert len(contested) == 2
    assert contested[1][0] < 1.0 and not contested[1][1]
    check_against_reference(h)


def test_min_relevance_one_passes_only_must_act_events() -> None:
    h = Harness()
    h.register("a", "analyst", interests=["churn"], current_task_id="t1")
    h.register("b", "analyst", interests=["churn"], current_task_id="t1")
    mine = record(h, "a", "churn is rising", score=0.875, task_id="t1")["memory_unit_id"]
    strict = subscribe(h, "a", list(SUBSCRIPTION_EVENTS), min_relevance=1.0)
    loose = subscribe(h, "a", list(SUBSCRIPTION_EVENTS), min_relevance=0.0)
    # highly relevant to a (same role, its interest, its task, a decision) but not must-act
    record(h, "b", "churn decision", memory_type="decision", score=0.9375, task_id="t1")
    h.register("c", "analyst", interests=["churn"], current_task_id="t2")  # another task
    record(
        h,
        "b",
        "churn is flat",
        task_id="t1",
        relations=[{"type": "contradicts", "target_id": mine}],
    )
    strict_got = notified(h, strict)
    assert sorted(name for name, _, _ in strict_got.values()) == [
        "conflict.detected",
        "memory.contested",
    ]
    assert all(rel == 1.0 and act for _, rel, act in strict_got.values())
    loose_got = notified(h, loose).values()
    assert all(rel < 1.0 for _, rel, act in loose_got if not act)  # the rest scored lower
    assert sum(act for _, _, act in loose_got) == 2
    loose_names = names(h, loose)
    assert loose_names.count("memory.recorded") == 2
    assert "agent.joined" in loose_names
    assert loose_names.count("memory.contested") == 2  # mine and b's new unit
    check_against_reference(h)
    # the score formula itself can reach 1.0: a joining agent perfectly aligned with a
    # (same role, all its interests, its task) passes min_relevance 1.0 without being must-act
    h.register("d", "analyst", interests=["churn"], current_task_id="t1")
    joined = [v for v in notified(h, strict).values() if v[0] == "agent.joined"]
    assert joined == [("agent.joined", 1.0, False)]


def test_cancelled_subscriptions_get_nothing() -> None:
    h = Harness()
    h.register("a", "analyst")
    h.register("b", "analyst")
    gone = subscribe(h, "a", list(SUBSCRIPTION_EVENTS))
    kept = subscribe(h, "a", list(SUBSCRIPTION_EVENTS))
    record(h, "b", "a market finding")
    h.send("SUBSCRIBE", "a", {"action": "unsubscribe", "subscription": {"id": gone}})
    record(h, "b", "another market finding")
    h.register("c", "analyst")
    left = subscribe(h, "c", list(SUBSCRIPTION_EVENTS))
    h.send("DEREGISTER", "c", {"agent_id": "c"})
    record(h, "b", "a third market finding")
    assert notified(h, gone) == {}  # not even the event from before it was cancelled
    assert notified(h, left) == {}  # cancelled by deregistration
    assert names(h, kept) == [
        "memory.recorded",
        "memory.recorded",
        "agent.joined",
        "memory.recorded",
    ]
    registry = h.field.state.registry
    for cancelled in (gone, left):
        assert not registry.active.view[registry.rows[cancelled]]
        assert matcher_of(h).match(events_of(h), only=np.array([registry.rows[cancelled]])) == []
    check_against_reference(h)


def test_no_event_from_before_the_subscription() -> None:
    h = Harness()
    h.register("a", "analyst")
    h.register("b", "analyst")
    record(h, "b", "an old market finding")
    sub = subscribe(h, "a", ["memory.recorded", "agent.joined"], include_own=True)
    created = h.field.state.subscriptions[sub]["created_epoch"]
    record(h, "b", "a new market finding")
    h.register("c", "analyst")
    got = notified(h, sub)
    epochs = {e.position: e.epoch for e in events_of(h)}
    assert [name for name, _, _ in got.values()] == ["memory.recorded", "agent.joined"]
    assert all(epochs[position] > created for position in got)
    # an event at the subscription's own epoch does not count either
    same_epoch = FieldEvent(
        position=10**6,
        epoch=created,
        ts=h.time,
        name="agent.joined",
        actor="c",
        entity_type="agent",
        entity_id="c",
        summary="",
        agent=h.field.state.agents["c"].to_wire(),
    )
    assert matcher_of(h).match([same_epoch]) == []
    check_against_reference(h)


def test_relevance_uses_the_exact_confidence_score() -> None:
    h = Harness()
    h.register("a", "analyst")
    h.register("b", "analyst")
    sub = subscribe(h, "a", ["memory.recorded"])
    h.record("b", "their market finding", score=0.8)
    ((name, relevance, _),) = notified(h, sub).values()
    units = recorded_units(h)
    agent = subscription_agents(h)[sub]
    event = next(e for e in events_of(h) if e.name == "memory.recorded")
    expected, _ = relevance_of(units, h.field.state.subscriptions[sub], agent, event)
    assert abs(relevance - expected) < 1e-7  # float32 precision: this much holds
    assert abs(relevance - expected) <= 1e-9


def test_a_scope_made_before_the_registry_changed_is_refused() -> None:
    h = Harness()
    h.register("a", "analyst", interests=["pricing"])
    h.register("w", "writer")
    subscription = {"events": ["memory.recorded"]}
    first = h.send("SUBSCRIBE", "a", {"action": "subscribe", "subscription": subscription})
    matcher = matcher_of(h)
    scope = matcher.scope()
    assert scope.fits(h.field.state.registry)
    h.send("SUBSCRIBE", "a", {"action": "subscribe", "subscription": subscription})
    assert not scope.fits(h.field.state.registry)  # a row was added
    scope = matcher.scope()
    unsubscribe = {"action": "unsubscribe", "subscription": {"id": first["subscription_id"]}}
    h.send("SUBSCRIBE", "a", unsubscribe)
    assert not scope.fits(h.field.state.registry)  # a row was cancelled
    h.record("w", "pricing")
    with pytest.raises(ValueError, match="registry changed"):
        matcher.match(events_of(h), scope=scope)
    (match,) = matcher.match(events_of(h), scope=matcher.scope())
    assert len(match.rows) == 1  # the second subscription, the first being cancelled
