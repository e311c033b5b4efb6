"""The contract read as a client author reads it: where ``protocol/README.md`` settles a
question (a "**Choice**"), the Field does what it says.

Each section is one question: ``requires_action``, liveness and why an agent
failed, where debounce windows lie, the order of a poll's page, and the smaller
choices (superseding twice, the reserved id ``operator``, COMPACT's
``units_remaining``, a session creator that leaves and comes back).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import orjson

from field.core import visibility
from field.subscriptions.events import SUBSCRIPTION_EVENTS, event_of
from field.subscriptions.matcher import Matcher
from field.subscriptions.stream import Notification, encode_event, encode_notification

from .core_util import Harness
from .schema_util import assert_valid

README = Path(__file__).resolve().parent.parent / "protocol" / "README.md"
OPERATOR_TOKEN = "operator-token-0123456789"


def section(title: str) -> str:
    """The text of the README section headed ``title`` (up to the next heading)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#)", text, re.S | re.M)
    assert match is not None, title
    return match.group(1)


def subscribe(h: Harness, agent: str, events: list[str], **options: Any) -> str:
    body = {"action": "subscribe", "subscription": {"events": events, **options}}
    return str(h.send("SUBSCRIBE", agent, body)["subscription_id"])


def notifications(h: Harness, since: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """(subscriber, notification) for every notification of the log after ``since``: matched
    as the push hub matches them (visibility, filters) and encoded as it encodes them."""
    state = h.field.state
    events = [e for e in (event_of(x, state.known_units) for x in h.stored()[since:]) if e]
    out = []
    matcher = Matcher(
        state.registry,
        state.index,
        state.known_units,
        audience=functools.partial(visibility.event_audience, state),
        screen=h.field.filters.screen,
    )
    for match in matcher.match(events):
        shared = encode_event(match.event, f"{h.field.field_tag}-{match.event.position}")
        for i, row in enumerate(match.rows.tolist()):
            subscription_id = state.registry.ids[row]
            notification = Notification(
                subscription_id,
                match.event,
                float(match.relevance[i]),
                match.reason(i),
                bool(match.requires_action[i]),
                shared=shared,
            )
            body = orjson.loads(encode_notification(notification))
            assert_valid("notification", body)
            out.append((state.subscriptions[subscription_id]["agent_id"], body))
    return out


# -- requires_action: one definition, one table ---------------------------------------


def test_the_requires_action_table_lists_every_event() -> None:
    text = section("Relevance of events")
    table = text[text.index("| Event | Relevance 1 for | `requires_action` for |") :]
    listed = re.findall(r"`([a-z]+\.[a-z_]+)`", "\n".join(table.split("\n\n")[0].splitlines()))
    named = [n for n in listed if n in SUBSCRIPTION_EVENTS]
    assert sorted(set(named)) == sorted(SUBSCRIPTION_EVENTS)


def test_requires_action_is_set_exactly_as_the_table_says() -> None:
    """Every one of the 13 events is produced with every agent subscribed to all of them;
    the agents told to act are those of the table's last column, and only they."""
    h = Harness(operator_token=OPERATOR_TOKEN)
    h.register("lead", "lead", via=OPERATOR_TOKEN, authority=6)
    for agent in ("worker", "other", "watcher"):
        h.register(agent, "analyst", interests=["churn"])
    for agent in ("lead", "worker", "other", "watcher"):
        subscribe(h, agent, list(SUBSCRIPTION_EVENTS))
    since = len(h.entries)
    # a conflict over the worker's unit, resolved against it
    mine = h.record("worker", "churn is rising")["memory_unit_id"]
    theirs = h.record(
        "other", "churn is flat", relations=[{"type": "contradicts", "target_id": mine}]
    )
    (conflict_id,) = theirs["conflicts_detected"]
    h.send(
        "MERGE",
        "lead",
        {
            "conflict_id": conflict_id,
            "strategy": "authority",
            "resolution": {"winner_id": theirs["memory_unit_id"], "rationale": "newer data"},
        },
    )

    # tasks: assigned, completed with a dependent now ready, handed off
    def coordinate(agent: str, **payload: Any) -> dict[str, Any]:
        return dict(h.send("COORDINATE", agent, payload)["task"])

    first = coordinate("lead", action="create", title="collect churn data", assignee="worker")
    coordinate("lead", action="create", title="model churn", assignee="other",
               depends_on=[first["id"]])  # fmt: skip
    coordinate("worker", action="start", task_id=first["id"])
    coordinate("worker", action="complete", task_id=first["id"])
    third = coordinate("lead", action="create", title="report churn", assignee="worker")
    h.send("HANDOFF", "worker", {"task_id": third["id"], "to_agent_id": "other"})
    # a session paused and ended
    created = h.send(
        "SESSION", "lead", {"action": "create", "name": "churn", "invitees": ["watcher"]}
    )
    session_id = created["session"]["id"]
    h.send("SESSION", "watcher", {"action": "join", "session_id": session_id})
    h.send("SESSION", "lead", {"action": "pause", "session_id": session_id})
    h.send("SESSION", "lead", {"action": "end", "session_id": session_id})
    # a newcomer, and the worker failing with a task the lead created
    h.register("late", "analyst")
    coordinate("lead", action="create", title="recheck churn", assignee="worker")
    h.entries.extend(h.field.fail_agent("worker", "silent").entries)

    got = notifications(h, since)
    assert {body["event"] for _, body in got} == set(SUBSCRIPTION_EVENTS)
    acting: dict[str, set[str]] = {name: set() for name in SUBSCRIPTION_EVENTS}
    for agent, body in got:
        if body["requires_action"]:
            acting[body["event"]].add(agent)
            assert body["relevance_score"] == 1.0, body
            assert "it needs your action" in body["relevance_reason"] or (
                "it involves your unit" in body["relevance_reason"]
            )
    assert acting == {
        "memory.recorded": set(),
        "memory.superseded": set(),  # the worker's unit: told, not asked to act
        "memory.contested": {"worker"},
        "conflict.detected": {"worker"},  # the other author caused it
        "conflict.resolved": set(),
        "agent.joined": set(),
        "agent.failed": {"lead"},  # it created the failed agent's open task
        "task.state_changed": set(),
        "task.assigned": {"worker", "other"},
        "task.completed": {"other"},  # its dependent task is ready
        "handoff.incoming": {"other"},
        "session.paused": set(),
        "session.ended": set(),
    }
