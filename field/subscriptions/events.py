"""Field events: the log entries a subscription can be notified of.

Every notification is about exactly one log entry, so a notification's
cursor is that entry's position. :func:`event_of` turns a stored entry
into a :class:`FieldEvent` (or None for entries no one subscribes to);
it reads only the entry and immutable facts (a unit's content), so it
gives the same event live and when a stream is replayed from the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..store.base import StoredEntry

#: The 13 SubscriptionEvent names of spec 6.7, in a fixed order (bit i = name i).
SUBSCRIPTION_EVENTS: tuple[str, ...] = (
    "memory.recorded",
    "memory.superseded",
    "memory.contested",
    "conflict.detected",
    "conflict.resolved",
    "task.state_changed",
    "task.assigned",
    "task.completed",
    "handoff.incoming",
    "agent.joined",
    "agent.failed",
    "session.paused",
    "session.ended",
)
EVENT_BIT: dict[str, int] = {name: 1 << i for i, name in enumerate(SUBSCRIPTION_EVENTS)}

#: Log entry kind → the event it is, where they differ.
_EVENT_OF_KIND = {"agent.registered": "agent.joined"}

SUMMARY_CHARS = 160


@dataclass(frozen=True, slots=True)
class FieldEvent:
    """One notifiable change, as every subscriber sees it."""

    position: int
    epoch: int
    ts: float
    name: str
    actor: str | None
    entity_type: str
    entity_id: str
    summary: str
    memory_unit_id: str | None = None
    conflict_id: str | None = None
    #: Units the event is about: their authors get relevance 1 where it says so.
    units: tuple[str, ...] = ()
    #: The joining agent's record, for agent.joined.
    agent: dict[str, Any] | None = None

    @property
    def entity_key(self) -> str:
        return f"{self.entity_type}:{self.entity_id}"


def _short(text: str, limit: int = SUMMARY_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def event_of(entry: StoredEntry, units: dict[str, dict[str, Any]]) -> FieldEvent | None:
    """The event a stored entry is, or None; ``units`` maps unit ids to units."""
    name = _EVENT_OF_KIND.get(entry.kind, entry.kind)
    if name not in EVENT_BIT:
        return None
    data = entry.data
    at = (entry.position, entry.epoch, entry.ts, name)
    actor = entry.agent_id
    if name == "memory.recorded":
        unit = data["unit"]
        return FieldEvent(
            *at,
            actor=actor,
            entity_type="memory_unit",
            entity_id=unit["id"],
            memory_unit_id=unit["id"],
            units=(unit["id"],),
            summary=f"{unit['type']} from {unit['source']['agent_id']}: {_short(unit['content'])}",
        )
    if name in ("memory.superseded", "memory.contested"):
        unit = units[data["memory_unit_id"]]
        verb = "superseded by " + data["by"] if name == "memory.superseded" else "contested"
        return FieldEvent(
            *at,
            actor=actor,
            entity_type="memory_unit",
            entity_id=unit["id"],
            memory_unit_id=unit["id"],
            conflict_id=data.get("conflict_id"),
            units=(unit["id"],),
            summary=f"{unit['type']} {unit['id']} {verb}: {_short(unit['content'])}",
        )
    if name == "conflict.detected":
        conflict = data["conflict"]
        return FieldEvent(
            *at,
            actor=actor,
            entity_type="conflict",
            entity_id=conflict["id"],
            conflict_id=conflict["id"],
            units=(conflict["unit_a"], conflict["unit_b"]),
            summary=f"conflict between {conflict['unit_a']} and {conflict['unit_b']}: "
            + _short(conflict["description"]),
        )
    if name == "conflict.resolved":
        conflict = data["conflict"]
        resolution = conflict["resolution"]
        outcome = resolution["synthesis_unit_id"] or resolution["winner_id"]
        return FieldEvent(
            *at,
            actor=actor,
            entity_type="conflict",
            entity_id=conflict["id"],
            conflict_id=conflict["id"],
            units=(conflict["unit_a"], conflict["unit_b"]),
            summary=f"conflict {conflict['id']} resolved by {resolution['strategy']} "
            f"in favour of {outcome}: " + _short(conflict["description"]),
        )
    if name == "agent.joined":
        agent = data["agent"]
        return FieldEvent(
            *at,
            actor=actor,
            entity_type="agent",
            entity_id=agent["id"],
            agent=agent,
            summary=f"agent {agent['id']} joined as {agent['role']}",
        )
    return None  # events of operations this Field does not implement yet
