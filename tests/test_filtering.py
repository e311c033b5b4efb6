"""Subscription filters and allow lists in the pure core (no event loop, no I/O).

* the CEL stage never changes the vectorized stage's answers when it has nothing to say
  (filter ``true`` or none);
* live matching (batch by batch, as the push hub does) and a resumed stream (one
  subscription's rows over the whole log) agree under filters, allow lists and bindings;
* allow lists as of each position equal a plain recomputation from the log.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.errors import FieldError
from field.contract.model import StoredEntry
from field.expressions.tree import parse
from field.subscriptions import filtering
from field.subscriptions.allow_lists import ALLOW_LIST_NAMES
from field.subscriptions.events import event_of
from field.subscriptions.filtering import FilterStage, event_context
from field.subscriptions.matcher import Matcher

from . import test_matcher
from .core_util import Harness
from .schema_util import assert_valid
from .test_matcher import events_of, key, matcher_of, program

FILTERS = (  # the allow list filters first: the first subscriptions of a program get them
    "event.unit.intent.task_id in parameters.task_id",
    '!(event.entity.id in parameters.unit_id) || event.entity.type == "agent"',
    "has(event.conflict) && event.conflict.id in parameters.conflict_id",
    "event.memory_unit_id in parameters.unit_id",
    None,
    "true",
    'event.unit.type == "decision"',
    'has(event.unit) && event.unit.status == "contested"',
    "has(event.unit) && subscriber.current_task == event.unit.intent.task_id",
    'event.task.id == "t1"',  # fails on every memory event: no match, counted
)
BINDINGS = (None, {"task_id": ["t1"]}, {"unit_id": []})


def screened(h: Harness) -> Matcher:
    state = h.field.state
    return Matcher(state.registry, state.index, state.known_units, screen=h.field.filters.screen)


class _WithFilter(Harness):
    """A Harness whose subscriptions all carry one filter (and bindings)."""

    text: str | None = "true"
    bindings: dict[str, list[str]] | None = None

    def send(self, operation: str, agent_id: str, payload: dict[str, Any], **kw: Any) -> Any:
        if operation == "SUBSCRIBE" and payload.get("action") == "subscribe":
            subscription = {**payload["subscription"], "filter": self.text}
            if self.bindings is not None:
                subscription["bindings"] = self.bindings
            payload = {**payload, "subscription": subscription}
        return super().send(operation, agent_id, payload, **kw)


@settings(max_examples=60, deadline=None)
@given(program, st.sampled_from([None, "true", "true || event.epoch > 0"]))
def test_a_filter_that_is_true_or_absent_changes_nothing(steps: Any, text: str | None) -> None:
    plain = test_matcher.run(steps)
    expected = key(matcher_of(plain).match(events_of(plain)))
    assert key(screened(plain).match(events_of(plain))) == expected  # no filter at all
    with (
        mock.patch.object(test_matcher, "Harness", _WithFilter),
        mock.patch.object(_WithFilter, "text", text),
    ):
        filtered = test_matcher.run(steps)
    assert key(screened(filtered).match(events_of(filtered))) == expected
    assert all(not s.get("filter") or s["filter"]["errors"] == 0 for s in listed(filtered))


def listed(h: Harness) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for agent_id in sorted(h.field.state.active_subscriptions):
        if agent_id in h.tokens and agent_id in h.field.state.agents:
            out += h.send("SUBSCRIBE", agent_id, {"action": "list"})["subscriptions"]
    return out


# -- live and resumed agree --------------------------------------------------------


class _Live(Harness):
    """Matches each operation's entries as they are committed, as the push hub does:
    the active rows after the batch, then the rows the batch ended, up to their end."""

    def __init__(self) -> None:
        super().__init__()
        self.live: set[tuple[int, str]] = set()
        self.choice = 0

    def send(self, operation: str, agent_id: str, payload: dict[str, Any], **kw: Any) -> Any:
        if operation == "SUBSCRIBE" and payload.get("action") == "subscribe":
            subscription = {**payload["subscription"]}
            subscription["filter"] = FILTERS[self.choice % len(FILTERS)]
            bindings = BINDINGS[(self.choice // 2) % len(BINDINGS)]
            self.choice += 1
            if bindings is not None:
                subscription["bindings"] = bindings
            payload = {**payload, "subscription": subscription}
        start = len(self.entries)
        response = super().send(operation, agent_id, payload, **kw)
        batch = self.stored()[start:]
        state = self.field.state
        events = [e for e in (event_of(x, state.known_units) for x in batch) if e is not None]
        matcher = screened(self)
        ids = state.registry.ids
        for match in matcher.match(events):
            self.live |= {(match.event.position, ids[row]) for row in match.rows.tolist()}
        for entry in batch:
            for sid, subscription in state.subscriptions.items():
                if subscription.get("ended_position") == entry.position:
                    row = np.array([state.registry.rows[sid]])
                    before = [e for e in events if e.position < entry.position]
                    for match in matcher.match(before, only=row, inactive=True):
                        self.live.add((match.event.position, sid))
        return response


def resumed(h: Harness) -> set[tuple[int, str]]:
    """Every subscription's stream read from the log after the fact, up to its end."""
    state = h.field.state
    events = events_of(h)
    matcher = screened(h)
    found = set()
    for sid, subscription in state.subscriptions.items():
        end = subscription.get("ended_position")
        mine = [e for e in events if end is None or e.position < end]
        row = np.array([state.registry.rows[sid]])
        for match in matcher.match(mine, only=row, inactive=True):
            found.add((match.event.position, sid))
    return found


@settings(max_examples=80, deadline=None)
@given(program)
def test_filtered_live_and_resumed_streams_agree(steps: Any) -> None:
    with mock.patch.object(test_matcher, "Harness", _Live):
        h = test_matcher.run(steps)
    assert isinstance(h, _Live)
    assert h.live == resumed(h)
    # and a Field rebuilt from the log (compiling every filter again) resumes the same
    rebuilt = h.replayed()
    again = Harness.__new__(Harness)
    again.field, again.entries = rebuilt, h.entries
    assert resumed(again) == h.live


# -- allow lists ---------------------------------------------------------------------


AGENTS = ("w0", "w1", "w2")
step = st.one_of(
    st.tuples(st.just("record"), st.integers(0, 2), st.sampled_from([None, "T0", "T1"])),
    st.tuples(st.just("contradict"), st.integers(0, 2), st.integers(0, 30)),
    st.tuples(st.just("task"), st.integers(0, 2), st.sampled_from([None, 0, 1, 2])),
    st.tuples(st.just("assign"), st.integers(0, 2), st.integers(0, 30), st.integers(0, 2)),
    st.tuples(st.just("handoff"), st.integers(0, 2), st.integers(0, 30), st.integers(0, 2)),
    st.tuples(st.just("session"), st.integers(0, 2), st.lists(st.integers(0, 2), max_size=2)),
    st.tuples(st.just("join"), st.integers(0, 2), st.integers(0, 30)),
)


def agents_of_three() -> Harness:
    h = Harness(operator_token=OPERATOR)
    for agent in AGENTS:  # w0 is senior: it may create and assign tasks for others
        h.register(
            agent,
            "analyst",
            via=OPERATOR if agent == "w0" else None,
            authority=6 if agent == "w0" else 3,
            current_task_id={"w1": "T0", "w2": "T1"}.get(agent),
        )
    return h


def drive(steps: list[tuple[Any, ...]], h: Harness | None = None) -> Harness:
    h = agents_of_three() if h is None else h
    units: list[str] = []
    tasks: list[str] = []
    sessions: list[str] = []
    for kind, who, *args in steps:
        agent = AGENTS[who]
        try:
            if kind == "record":
                units.append(
                    h.record(agent, "market sizing note", task_id=args[0])["memory_unit_id"]
                )
            elif kind == "contradict" and units:
                relation = {"type": "contradicts", "target_id": units[args[0] % len(units)]}
                units.append(h.record(agent, "not so", relations=[relation])["memory_unit_id"])
            elif kind == "task":
                payload: dict[str, Any] = {"action": "create", "title": "size the market"}
                if args[0] is not None:
                    payload["assignee"] = AGENTS[args[0]]
                tasks.append(h.send("COORDINATE", agent, payload)["task"]["id"])
            elif kind == "assign" and tasks:
                task_id = tasks[args[0] % len(tasks)]
                payload = {"action": "assign", "task_id": task_id, "assignee": AGENTS[args[1]]}
                h.send("COORDINATE", agent, payload)
            elif kind == "handoff" and tasks:
                payload = {"task_id": tasks[args[0] % len(tasks)], "to_agent_id": AGENTS[args[1]]}
                h.send("HANDOFF", agent, payload)
            elif kind == "session":
                invitees = sorted({AGENTS[i] for i in args[0]} - {agent})
                payload = {"action": "create", "name": "pricing", "invitees": invitees}
                sessions.append(h.send("SESSION", agent, payload)["session"]["id"])
            elif kind == "join" and sessions:
                payload = {"action": "join", "session_id": sessions[args[0] % len(sessions)]}
                h.send("SESSION", agent, payload)
        except FieldError:
            continue  # refused: nothing changed
    return h


def plain_allow_lists(entries: list[StoredEntry]) -> dict[tuple[str, str], set[str]]:
    """The allow lists after ``entries``, recomputed plainly from the rules."""
    lists: dict[tuple[str, str], set[str]] = {}
    authors: dict[str, str] = {}

    def add(agent: str | None, name: str, value: str | None) -> None:
        if agent is not None and value is not None:
            lists.setdefault((agent, name), set()).add(value)

    for entry in entries:
        data = entry.data
        if entry.kind == "memory.recorded":
            unit = data["unit"]
            authors[unit["id"]] = unit["source"]["agent_id"]
            add(authors[unit["id"]], "unit_id", unit["id"])
            add(authors[unit["id"]], "task_id", unit["intent"].get("task_id"))
        elif entry.kind in ("task.created", "task.assigned", "task.state_changed"):
            if entry.kind == "task.created":
                add(data["task"]["created_by"], "task_id", data["task"]["id"])
            add(data["task"]["assignee"], "task_id", data["task"]["id"])
        elif entry.kind == "handoff.incoming":
            add(data["handoff"]["from_agent_id"], "task_id", data["task_id"])
            add(data["handoff"]["to_agent_id"], "task_id", data["task_id"])
        elif entry.kind == "conflict.detected":
            for side in ("unit_a", "unit_b"):
                add(authors[data["conflict"][side]], "conflict_id", data["conflict"]["id"])
        elif entry.kind.startswith("session."):
            for member in data["session"]["members"]:
                add(member, "session_id", data["session"]["id"])
    return lists


@settings(max_examples=40, deadline=None)
@given(st.lists(step, min_size=3, max_size=25))
def test_allow_lists_as_of_each_position_match_a_plain_recomputation(steps: Any) -> None:
    h = drive(steps)
    stored = h.stored()
    lists = h.field.state.allow_lists
    for position in range(1, len(stored) + 1):
        expected = plain_allow_lists(stored[:position])
        for agent in AGENTS:
            for name in ALLOW_LIST_NAMES:
                got = set(lists.as_of(agent, name, position))
                assert got == expected.get((agent, name), set()), (position, agent, name)
    # a Field rebuilt from the log holds the same lists
    rebuilt = h.replayed().state.allow_lists
    for agent in AGENTS:
        for name in ALLOW_LIST_NAMES:
            assert rebuilt.values(agent, name) == lists.values(agent, name)


# -- focused cases -------------------------------------------------------------------


OPERATOR = "operator-token-0123456789"


def field_of_two() -> Harness:
    """A reader and a writer (senior: it may create tasks for others)."""
    h = Harness(operator_token=OPERATOR)
    h.register("reader", "analyst", current_task_id="t1")
    h.register("writer", "analyst", via=OPERATOR, authority=6)
    return h


def subscribe(h: Harness, agent: str, text: str | None, **more: Any) -> str:
    subscription = {"events": ["memory.recorded", "task.assigned"], "filter": text, **more}
    response = h.send("SUBSCRIBE", agent, {"action": "subscribe", "subscription": subscription})
    assert_valid("subscription", response["subscription"])
    return str(response["subscription_id"])


def notified(h: Harness, subscription_id: str) -> list[int]:
    row = np.array([h.field.state.registry.rows[subscription_id]])
    return [m.event.position for m in screened(h).match(events_of(h), only=row)]


def positions_of(h: Harness, responses: list[dict[str, Any]]) -> list[int]:
    by_unit = {
        e.data["unit"]["id"]: p for p, e in enumerate(h.entries, 1) if e.kind == "memory.recorded"
    }
    return [by_unit[r["memory_unit_id"]] for r in responses]


def test_an_empty_unsealed_allow_list_matches_nothing_until_it_grows() -> None:
    h = field_of_two()
    negated = subscribe(h, "reader", "!(event.unit.intent.task_id in parameters.task_id)")
    member = subscribe(h, "reader", "event.unit.intent.task_id in parameters.task_id")
    before = h.record("writer", "growth", task_id="t7")
    h.record("reader", "my own note", task_id="t7")  # the reader's task_id list: {t7}
    after = h.record("writer", "growth again", task_id="t7")
    other = h.record("writer", "elsewhere", task_id="t8")
    assert notified(h, member) == positions_of(h, [after])
    assert notified(h, negated) == positions_of(h, [other])
    assert h.field.filters.status(member) == {
        "expression": "event.unit.intent.task_id in parameters.task_id",
        "errors": 0,
        "last_error": None,
    }
    assert before  # recorded while the list was empty: no match, and no error


def test_bindings_seal_the_list_against_the_agents_later_operations() -> None:
    h = field_of_two()
    text = "event.unit.intent.task_id in parameters.task_id"
    sealed = subscribe(h, "reader", text, bindings={"task_id": ["t1", "t1", "t2"]})
    grown = subscribe(h, "reader", text)
    listed_ = h.send("SUBSCRIBE", "reader", {"action": "list"})["subscriptions"]
    assert {s["id"]: s.get("bindings") for s in listed_} == {
        sealed: {"task_id": ["t1", "t2"]},
        grown: None,
    }
    h.record("reader", "mine", task_id="t3")  # grows the reader's own list with t3
    t1 = h.record("writer", "on t1", task_id="t1")
    t3 = h.record("writer", "on t3", task_id="t3")
    assert notified(h, sealed) == positions_of(h, [t1])
    assert notified(h, grown) == positions_of(h, [t3])


def test_task_assignment_is_in_the_list_for_the_assignment_itself() -> None:
    h = field_of_two()
    sid = subscribe(h, "reader", "has(event.task) && event.task.id in parameters.task_id")
    task = h.send(
        "COORDINATE", "writer", {"action": "create", "title": "price it", "assignee": "reader"}
    )["task"]
    h.send("COORDINATE", "writer", {"action": "create", "title": "else", "assignee": "writer"})
    events = {e.position: e for e in events_of(h)}
    got = [events[p] for p in notified(h, sid)]
    assert [(e.name, e.entity_id) for e in got] == [("task.assigned", task["id"])]


def test_evaluation_errors_are_no_match_and_counted_once_per_event() -> None:
    h = field_of_two()
    failing = subscribe(h, "reader", 'event.task.title == "x"')
    h.record("writer", "one")
    h.record("writer", "two")
    assert notified(h, failing) == []
    assert notified(h, failing) == []  # read again (a resumed stream): not counted again
    status = h.field.filters.status(failing)
    assert status is not None and status["errors"] == 2
    assert "task" in status["last_error"]
    (shown,) = h.send("SUBSCRIBE", "reader", {"action": "list"})["subscriptions"]
    assert shown["filter"]["errors"] == 2
    assert_valid("subscription", shown)


def test_subscriber_is_the_agent_as_registered() -> None:
    h = field_of_two()
    sid = subscribe(
        h,
        "reader",
        'subscriber.current_task == event.unit.intent.task_id && subscriber.role == "analyst"'
        " && subscriber.authority >= 0 && subscriber.id == 'reader'",
    )
    on_t1 = h.record("writer", "on my task", task_id="t1")
    h.record("writer", "off my task", task_id="t2")
    assert notified(h, sid) == positions_of(h, [on_t1])


def test_event_context_of_every_kind_matches_the_schema() -> None:
    h = field_of_two()
    h.register("third", "auditor")
    first = h.record("writer", "EU market grows")
    h.record(
        "reader",
        "it shrinks",
        relations=[{"type": "contradicts", "target_id": first["memory_unit_id"]}],
    )
    task = h.send("COORDINATE", "writer", {"action": "create", "title": "t", "assignee": "writer"})
    h.send("HANDOFF", "writer", {"task_id": task["task"]["id"], "to_agent_id": "reader"})
    session = h.send("SESSION", "writer", {"action": "create", "name": "s"})["session"]
    h.send("SESSION", "writer", {"action": "pause", "session_id": session["id"]})
    names = set()
    for event in events_of(h):
        context = {
            "event": event_context(event, f"{h.field.field_tag}-{event.position}"),
            "subscriber": {
                "id": "reader",
                "role": "analyst",
                "interests": [],
                "authority": 3,
                "current_task": "t1",
            },
            "parameters": {"task_id": {"t1": True}},
        }
        assert_valid("filter-context", context)
        names.add(event.name)
    assert names >= {
        "memory.recorded",
        "memory.contested",
        "conflict.detected",
        "agent.joined",
        "task.state_changed",
        "task.assigned",
        "handoff.incoming",
        "session.paused",
    }


def test_a_recorded_unit_reads_as_recorded_though_its_status_changed_since() -> None:
    h = field_of_two()
    sid = subscribe(h, "reader", 'event.unit.status == "active"')
    first = h.record("writer", "EU market grows")
    h.record(
        "writer", "no", relations=[{"type": "contradicts", "target_id": first["memory_unit_id"]}]
    )
    assert h.field.state.units[first["memory_unit_id"]]["status"] == "contested"
    recorded = [e.position for e in events_of(h) if e.name == "memory.recorded"]
    assert notified(h, sid) == recorded  # both units were active when recorded


# -- the probes' shortcut ------------------------------------------------------------


def every_match(h: Harness, stage: FilterStage) -> set[tuple[int, str, float]]:
    state = h.field.state
    matcher = Matcher(state.registry, state.index, state.known_units, screen=stage.screen)
    ids = state.registry.ids
    return {
        (match.event.position, ids[row], round(float(relevance), 9))
        for match in matcher.match(events_of(h))
        for row, relevance in zip(match.rows.tolist(), match.relevance.tolist(), strict=True)
    }


@settings(max_examples=80, deadline=None)
@given(program)
def test_the_probes_shortcut_answers_as_evaluating_every_input(steps: Any) -> None:
    """A filter read through probes (``x in parameters.n``, ``x == subscriber.f``) is
    evaluated once per distinct set of answers; the notifications are those of evaluating
    it for every distinct input, errors counted alike."""
    with mock.patch.object(test_matcher, "Harness", _Live):
        h = test_matcher.run(steps)
    state = h.field.state
    cursor = h.field.filters._cursor
    shortcut, plain = FilterStage(state, cursor), FilterStage(state, cursor)
    with mock.patch.object(filtering, "_probes", lambda text: None):
        expected = every_match(h, plain)
    assert every_match(h, shortcut) == expected
    for subscription_id in state.subscriptions:
        assert shortcut.status(subscription_id) == plain.status(subscription_id)


def test_what_reads_the_subscriber_otherwise_gets_no_probes() -> None:
    def probes(text: str) -> Any:
        return filtering._probes(parse(text, "f"))

    assert probes("event.unit.intent.task_id in parameters.task_id") == (
        filtering.Probe(("unit", "intent", "task_id"), "parameters", "task_id", True),
    )
    assert probes("subscriber.current_task == event.unit.intent.task_id && true") == (
        filtering.Probe(("unit", "intent", "task_id"), "subscriber", "current_task", False),
    )
    for text in (
        '"x" + event.unit.intent.task_id in parameters.task_id',  # the operand is larger
        "event.unit.intent.task_id in parameters.task_id.map(t, t)",
        "size(parameters.task_id) > 1",
        "subscriber.interests.exists(i, i == event.unit.type)",
        "!event.unit.status in parameters.task_id",
        "event.unit.intent.task_id == subscriber.current_task + 'x'",
    ):
        assert probes(text) is None, text
    # inside a string literal nothing is read
    assert probes('event.unit.type == "subscriber.role" && event.x in parameters.unit_id') == (
        filtering.Probe(("x",), "parameters", "unit_id", True),
    )


PROBED = (
    "event.unit.intent.task_id in parameters.task_id",
    "has(event.task) && event.task.id in parameters.task_id",
    "event.memory_unit_id in parameters.unit_id || event.entity.id in parameters.conflict_id",
    "has(event.unit) && event.unit.intent.task_id == subscriber.current_task",
    "event.entity.id in parameters.session_id || subscriber.id != event.actor",
)
subscriptions = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.integers(0, len(PROBED) - 1),
        st.sampled_from([None, {"task_id": ["T0"]}, {"task_id": ["T1"]}, {"unit_id": []}]),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(step, min_size=3, max_size=25), subscriptions)
def test_probed_filters_over_allow_lists_answer_as_evaluating_every_input(
    steps: Any, wanted: Any
) -> None:
    h = agents_of_three()
    # two subscribers whose current tasks differ, reading it through one probe
    for who, choice, bindings in [(1, 3, None), (2, 3, None), *wanted]:
        subscription: dict[str, Any] = {
            "events": ["memory.recorded", "task.assigned", "task.state_changed", "agent.joined"],
            "filter": PROBED[choice],
            "include_own": True,
        }
        if bindings is not None and "parameters" in PROBED[choice]:
            subscription["bindings"] = bindings
        h.send("SUBSCRIBE", AGENTS[who], {"action": "subscribe", "subscription": subscription})
    drive(steps, h)
    state = h.field.state
    cursor = h.field.filters._cursor
    shortcut, plain = FilterStage(state, cursor), FilterStage(state, cursor)
    with mock.patch.object(filtering, "_probes", lambda text: None):
        expected = every_match(h, plain)
    assert every_match(h, shortcut) == expected
    assert shortcut.evaluations <= plain.evaluations
    # past the bound on kept answers they are all dropped, and found again: same results
    forgetful = FilterStage(state, cursor)
    with mock.patch.object(filtering, "ANSWER_CELLS", 0):
        assert every_match(h, forgetful) == expected
        assert forgetful._answer_cells <= 1024  # cleared at every new set of values
