"""Field events: the log entries a subscription can be notified of.

Every notification is about exactly one log entry, so a notification's
cursor is that entry's position. :func:`event_of` turns a stored entry
into a :class:`FieldEvent` (or None for entries no one subscribes to);
it reads only the entry and immutable facts (a unit's content), so it
gives the same event live and when a stream is replayed from the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..contract.model import StoredEntry
from ..contract.text import shorten

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
_EVENT_OF_KIND = {"agent.registered": "agent.joined", "task.created": "task.state_changed"}

SUMMARY_CHARS = 160


def event_name(kind: str) -> str | None:
    """The event a log entry of ``kind`` is, or None (checked before building one)."""
    name = _EVENT_OF_KIND.get(kind, kind)
    return name if name in EVENT_BIT else None


@dataclass(slots=True)
class FieldEvent:
    """One notifiable change, as every subscriber sees it.

    Never changed once built; not frozen because a frozen dataclass of
    these fields takes 2 us to build (0.4 us plain), once per log entry
    in every replay and every publish.
    """

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
    #: Agents the event concerns (relevance 1 for their subscriptions) ...
    agents: tuple[str, ...] = ()
    #: ... and those of them who must act on it (``requires_action``).
    acting: tuple[str, ...] = ()
    #: Task, handoff and session events: what they are about, in words, and the
    #: task, for the relevance to everyone else (role, interest, task alignment).
    topic: str | None = None
    task_id: str | None = None
    #: The task, handoff, session or failed agent as of the event (the notification's
    #: ``detail``).
    detail: dict[str, Any] | None = None
    #: The entity as of the event, by the name a filter reads it under (``unit``,
    #: ``conflict``, ``task`` and ``handoff``, ``agent``, ``session``): see
    #: :mod:`field.subscriptions.filtering`.
    facts: dict[str, Any] | None = None

    @property
    def entity_key(self) -> str:
        return f"{self.entity_type}:{self.entity_id}"


def _short(text: str, limit: int = SUMMARY_CHARS) -> str:
    return shorten(text, limit)


def event_of(entry: StoredEntry, units: Mapping[str, dict[str, Any]]) -> FieldEvent | None:
    """The event a stored entry is, or None; ``units`` maps unit ids to units.

    ``units`` must hold the tombstones of purged units too (they have no
    content: the summary then says the unit was purged).
    """
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
            facts={"unit": unit},
        )
    if name in ("memory.superseded", "memory.contested"):
        unit = units[data["memory_unit_id"]]
        verb = "superseded by " + data["by"] if name == "memory.superseded" else "contested"
        status = name.removeprefix("memory.")  # the unit's status as of the event
        return FieldEvent(
            *at,
            actor=actor,
            entity_type="memory_unit",
            entity_id=unit["id"],
            memory_unit_id=unit["id"],
            conflict_id=data.get("conflict_id"),
            units=(unit["id"],),
            summary=f"{unit['type']} {unit['id']} {verb}: "
            + (_short(unit["content"]) if "content" in unit else "(since purged)"),
            facts={"unit": {**unit, "status": status}},
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
            facts={"conflict": conflict},
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
            facts={"conflict": conflict},
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
            facts={"agent": agent},
        )
    if name == "agent.failed":
        agent = data["agent"]
        released = data.get("released_tasks", [])
        creators = tuple(dict.fromkeys(t["created_by"] for t in released))
        return FieldEvent(
            *at,
            actor=actor,
            entity_type="agent",
            entity_id=agent["id"],
            agent=agent,
            summary=f"agent {agent['id']} ({agent['role']}) failed: {data['reason']}"
            + (f"; {len(released)} task(s) back to pending" if released else ""),
            # whoever created its tasks must reassign them
            agents=creators,
            acting=creators,
            # the agent as the failure left it, why, and the tasks back to pending
            detail={
                "agent": {**agent, "status": "failed", "failure_reason": data["reason"]},
                "reason": data["reason"],
                "released_tasks": released,
            },
            facts={"agent": agent},
        )
    if name.startswith(("task.", "handoff.")):
        return _task_event(entry, name, units)
    if name in ("session.paused", "session.ended"):
        session = {"invited": [], **data["session"]}  # none in logs from before invitations
        verb = name.removeprefix("session.")
        reason = data.get("reason")
        return FieldEvent(
            *at,
            actor=actor,
            entity_type="session",
            entity_id=session["id"],
            agents=tuple(session["members"]),
            topic=f"{session['name']} {session.get('purpose') or ''}",
            detail={"session": session, "reason": reason},
            summary=f"session {session['id']} ({_short(session['name'], 80)}) {verb}"
            + (f": {_short(reason, 80)}" if reason else ""),
            facts={"session": session},
        )
    return None  # events of operations this Field does not implement yet


def _task_event(
    entry: StoredEntry, name: str, units: Mapping[str, dict[str, Any]]
) -> FieldEvent | None:
    """``task.state_changed``, ``task.assigned``, ``task.completed``, ``handoff.incoming``."""
    data = entry.data
    task = data["task"]
    at = (entry.position, entry.epoch, entry.ts, name)
    about = {
        "topic": f"{task['title']} {task.get('description') or ''}",
        "task_id": task["id"],
    }
    title = f"task {task['id']} ({_short(task['title'], 80)})"
    concerned = [task["created_by"], task["assignee"], data.get("previous_assignee")]
    acting: list[str | None] = []
    if name == "task.state_changed":
        before = data.get("from")
        detail = {"task": task, "from": before, "action": data.get("action", "create")}
        summary = f"{title}: {before or 'new'} -> {task['status']}"
    elif name == "task.assigned":
        detail = {"task": task, "previous_assignee": data.get("previous_assignee")}
        acting = [task["assignee"]]
        summary = f"{title} assigned to {task['assignee']}"
    elif name == "task.completed":
        dependents = data["dependents"]
        detail = {"task": task, "dependents": dependents}
        concerned += [d["assignee"] for d in dependents]
        acting = [d["assignee"] for d in dependents if d["ready"]]
        summary = f"{title} completed" + (f": {_short(task['result'])}" if task["result"] else "")
    elif name == "handoff.incoming":
        record = data["handoff"]
        concerned = [record["to_agent_id"], record["from_agent_id"], task["created_by"]]
        acting = [record["to_agent_id"]]
        detail = {"handoff": handoff_wire(record, units), "task": task}
        summary = f"{title} handed off by {record['from_agent_id']} to {record['to_agent_id']}"
        if record["notes"]:
            summary += f": {_short(record['notes'])}"
        return FieldEvent(
            *at,
            actor=entry.agent_id,
            entity_type="handoff",
            entity_id=record["id"],
            agents=_ids(concerned),
            acting=_ids(acting),
            detail=detail,
            summary=summary,
            facts={"task": task, "handoff": detail["handoff"]},
            **about,
        )
    else:
        return None
    if data.get("reason"):
        detail["reason"] = data["reason"]
    return FieldEvent(
        *at,
        actor=entry.agent_id,
        entity_type="task",
        entity_id=task["id"],
        agents=_ids(concerned + acting),
        acting=_ids(acting),
        detail=detail,
        summary=summary,
        facts={"task": task},
        **about,
    )


def _ids(agents: list[str | None]) -> tuple[str, ...]:
    """The agent ids, without None and repeats, in order."""
    return tuple(dict.fromkeys(a for a in agents if a is not None))


def handoff_wire(record: dict[str, Any], units: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """A handoff as the response and the notification show it, from its log form.

    The log keeps each packaged unit as its id, its status at the handoff,
    score and reason; everything else about a unit is immutable, so the
    package reads the same live and when replayed.
    """
    scoped = [
        {
            "memory_unit": {**units[item["memory_unit_id"]], "status": item["status"]},
            "relevance_score": item["relevance_score"],
            "relevance_reason": item["relevance_reason"],
            "format": "full",
        }
        for item in record["units"]
    ]
    return {
        "id": record["id"],
        "task_id": record["task_id"],
        "from_agent_id": record["from_agent_id"],
        "to_agent_id": record["to_agent_id"],
        "notes": record["notes"],
        "context": {"units": scoped, "conflicts": record["conflicts"], "notes": record["notes"]},
        "epoch": record["epoch"],
    }
