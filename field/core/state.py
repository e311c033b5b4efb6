"""The Field's state: a projection of the event log.

:meth:`FieldState.apply` is the only code that changes the state, and it
takes log entries. The Field decides what happens (``field.py``) by
producing entries and then applying them here; start-up applies the
stored log the same way. So the state after a restart is, by
construction, the state that was acknowledged before it.

Entry kinds and their ``data``:

===================== ===============================================
``field.created``     ``{field_id}``: the first entry of every log
``clock.reserved``    ``{until}``: epochs up to ``until`` may be used
``agent.registered``  ``{agent, token_hash}``
``agent.deregistered````{agent_id}``
``agent.failed``      ``{agent_id, reason, agent, released_tasks}``: it went silent
``agent.recovered``   ``{agent_id}``: a failed agent was heard from again
``memory.recorded``   ``{unit}``: the full MemoryUnit
``memory.superseded`` ``{memory_unit_id, by}`` (+ ``conflict_id`` from MERGE)
``memory.contested``  ``{memory_unit_id, conflict_id}``
``conflict.detected`` ``{conflict}``: the full Conflict
``subscription.created``   ``{subscription}``
``subscription.cancelled`` ``{subscription_id, reason}``
``memory.archived``   ``{memory_unit_id, reason}`` (COMPACT)
``memory.purged``     ``{memory_unit_id, reason, purged_at}`` (COMPACT)
``session.*``         ``{session, ...}``: see :mod:`field.core.sessions`
``task.*``            ``{task, ...}``: see :mod:`field.core.tasks`
``handoff.incoming``  ``{task_id, handoff}``: no state of its own
``conflict.transitioned``  ``{conflict_id, from, to, strategy, by, rationale, epoch}``
                           (+ ``quorum`` when a vote opens)
``conflict.vote_cast``     ``{conflict_id, ballot}``
``conflict.resolved``      ``{conflict, from}``: the resolved Conflict
``memory.reinstated``      ``{memory_unit_id, conflict_id}``: contested → active
===================== ===============================================

Every entry is also indexed by the entities it is about
(:class:`~field.core.entities.EntityIndex`), under its log position, so
that REPLAY can read exactly the entries of a causal chain. A purged
unit leaves ``units`` for ``purged``, which keeps a content-free
tombstone (id, type, source, task, epoch) for readers of old entries;
``known_units`` looks in both.

The conflict lifecycle and what MERGE writes are in :mod:`field.core.conflicts`.

Deregistering an agent cancels its subscriptions too.
"""

from __future__ import annotations

from collections import ChainMap, Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..model import Limits
from ..store.base import LogEntry, StoredEntry
from ..subscriptions.registry import SubscriptionRegistry
from . import sessions, tasks
from .authority import OPERATOR, OPERATOR_ID, STANDARD
from .clock import LamportClock
from .embedding import Embedder
from .entities import EntityIndex
from .relevance import UnitIndex
from .visibility import Membership


@dataclass(slots=True)
class AgentRecord:
    """A registered agent and the hash of its bearer token."""

    id: str
    role: str
    interests: list[str]
    current_task_id: str | None
    registered_epoch: int
    token_hash: str
    status: str = "idle"
    #: authority level of spec 11.2 (see :mod:`field.core.authority`)
    authority: int = STANDARD

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role,
            "status": self.status,
            "interests": list(self.interests),
            "current_task_id": self.current_task_id,
            "registered_epoch": self.registered_epoch,
            "authority": self.authority,
        }


@dataclass(slots=True)
class FieldState:
    """Everything the Field knows, rebuilt from the log."""

    limits: Limits
    field_id: str | None = None
    clock: LamportClock = field(init=False)
    agents: dict[str, AgentRecord] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    revoked_tokens: dict[str, str] = field(default_factory=dict)
    units: dict[str, dict[str, Any]] = field(default_factory=dict)
    units_by_agent: Counter[str] = field(default_factory=Counter)
    unit_statuses: Counter[str] = field(default_factory=Counter)
    #: embeds unit contents and subscriber profiles (None: the default embedder)
    embedder: Embedder | None = None
    index: UnitIndex = field(init=False)
    conflicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per agent, the ids of its open tasks and of the sessions it belongs to
    open_tasks_by_agent: dict[str, set[str]] = field(default_factory=dict)
    sessions_by_member: dict[str, set[str]] = field(default_factory=dict)
    #: who was a member of which session when (for push visibility)
    membership: Membership = field(default_factory=Membership)
    #: per task, the tasks that depend on it
    dependent_tasks: dict[str, list[str]] = field(default_factory=dict)
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    active_subscriptions: dict[str, set[str]] = field(default_factory=dict)
    registry: SubscriptionRegistry = field(init=False)
    #: tombstones of purged units (no content), by id
    purged: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: ``units`` then ``purged``: for readers of entries about units that may be purged
    known_units: ChainMap[str, dict[str, Any]] = field(init=False)
    history: EntityIndex = field(default_factory=EntityIndex)
    #: position of the newest entry applied (live entries are applied before they
    #: are stored, and positions are contiguous, so the next one is this plus one)
    applied_position: int = 0
    last_position: int = 0
    #: timestamp of the newest entry: entry timestamps never decrease
    last_ts: float = 0.0

    def __post_init__(self) -> None:
        self.clock = LamportClock(max_skew=self.limits.max_epoch_skew)
        self.index = UnitIndex(self.embedder)
        self.registry = SubscriptionRegistry(self.index.embedder)
        self.known_units = ChainMap(self.units, self.purged)

    def principal(self, agent_id: str) -> AgentRecord:
        """A registered agent, or the operator (who is no registered agent)."""
        if agent_id == OPERATOR_ID:
            return OPERATOR_RECORD
        return self.agents[agent_id]

    # -- the projection ------------------------------------------------------

    def apply(self, entry: LogEntry | StoredEntry) -> None:
        """Fold one log entry into the state."""
        position = entry.position if isinstance(entry, StoredEntry) else self.applied_position + 1
        self.applied_position = position  # handlers may read the position being applied
        handler = _APPLY.get(entry.kind)
        if handler is not None:
            handler(self, entry.data)
        self.history.note(position, entry.data)
        self.clock.value = max(self.clock.value, entry.epoch)
        self.last_ts = max(self.last_ts, entry.ts)
        if isinstance(entry, StoredEntry):
            self.last_position = entry.position

    def replay(self, entries: Any) -> None:
        """Apply stored entries in order, then settle the clock above them."""
        for entry in entries:
            self.apply(entry)
        self.clock.restore(epoch=self.clock.value, reserved=self.clock.reserved)

    def _field_created(self, data: dict[str, Any]) -> None:
        self.field_id = data["field_id"]

    def _clock_reserved(self, data: dict[str, Any]) -> None:
        self.clock.reserved = max(self.clock.reserved, data["until"])

    def _agent_registered(self, data: dict[str, Any]) -> None:
        agent = data["agent"]
        record = AgentRecord(
            id=agent["id"],
            role=agent["role"],
            interests=list(agent["interests"]),
            current_task_id=agent.get("current_task_id"),
            registered_epoch=agent["registered_epoch"],
            token_hash=data["token_hash"],
            authority=agent.get("authority", STANDARD),
        )
        self.agents[record.id] = record
        self.tokens[record.token_hash] = record.id

    def _agent_deregistered(self, data: dict[str, Any]) -> None:
        record = self.agents.pop(data["agent_id"])
        del self.tokens[record.token_hash]
        self.revoked_tokens[record.token_hash] = record.id
        for subscription_id in sorted(self.active_subscriptions.pop(record.id, ())):
            self._cancel(subscription_id, "agent deregistered")

    def _agent_failed(self, data: dict[str, Any]) -> None:
        self.agents[data["agent_id"]].status = "failed"

    def _agent_recovered(self, data: dict[str, Any]) -> None:
        self.agents[data["agent_id"]].status = "idle"

    def _memory_recorded(self, data: dict[str, Any]) -> None:
        unit = data["unit"]
        self.units[unit["id"]] = unit
        self.units_by_agent[unit["source"]["agent_id"]] += 1
        self.unit_statuses[unit["status"]] += 1
        session_id = unit["source"].get("session_id")
        self.index.add(unit, session_id=session_id if session_id in self.sessions else None)

    def _set_unit_status(self, unit_id: str, status: str) -> None:
        unit = self.units[unit_id]
        self.unit_statuses[unit["status"]] -= 1
        self.unit_statuses[status] += 1
        unit["status"] = status
        self.index.set_status(unit_id, status)

    def _memory_superseded(self, data: dict[str, Any]) -> None:
        self._set_unit_status(data["memory_unit_id"], "superseded")

    def _memory_contested(self, data: dict[str, Any]) -> None:
        self._set_unit_status(data["memory_unit_id"], "contested")

    def _memory_archived(self, data: dict[str, Any]) -> None:
        self._set_unit_status(data["memory_unit_id"], "archived")

    def _memory_purged(self, data: dict[str, Any]) -> None:
        unit = self.units.pop(data["memory_unit_id"])
        self.unit_statuses[unit["status"]] -= 1
        self.units_by_agent[unit["source"]["agent_id"]] -= 1
        self.index.set_status(unit["id"], "purged")
        self.purged[unit["id"]] = tombstone(unit)

    def unit_record(self, unit_id: str) -> dict[str, Any]:
        """A unit, or the tombstone of a purged one (KeyError if neither)."""
        return self.known_units[unit_id]

    def _conflict_detected(self, data: dict[str, Any]) -> None:
        conflict = data["conflict"]
        self.conflicts[conflict["id"]] = conflict

    # conflicts are replaced, never changed in place: an entry's data stays as logged
    def _conflict_transitioned(self, data: dict[str, Any]) -> None:
        conflict = {**self.conflicts[data["conflict_id"]], "status": data["to"]}
        if data["to"] == "escalated":
            conflict["escalation"] = {
                "escalated_by": data["by"],
                "rationale": data["rationale"],
                "epoch": data["epoch"],
            }
        if data.get("quorum") is not None:
            conflict["vote"] = {"quorum": data["quorum"], "opened_by": data["by"], "ballots": []}
        self.conflicts[conflict["id"]] = conflict

    def _conflict_vote_cast(self, data: dict[str, Any]) -> None:
        conflict = self.conflicts[data["conflict_id"]]
        vote = conflict["vote"]
        ballots = [*vote["ballots"], data["ballot"]]
        self.conflicts[conflict["id"]] = {**conflict, "vote": {**vote, "ballots": ballots}}

    def _conflict_resolved(self, data: dict[str, Any]) -> None:
        conflict = data["conflict"]
        self.conflicts[conflict["id"]] = dict(conflict)

    def _memory_reinstated(self, data: dict[str, Any]) -> None:
        self._set_unit_status(data["memory_unit_id"], "active")

    def _subscription_created(self, data: dict[str, Any]) -> None:
        subscription = dict(data["subscription"])
        self.subscriptions[subscription["id"]] = subscription
        owner = subscription["agent_id"]
        self.active_subscriptions.setdefault(owner, set()).add(subscription["id"])
        self.registry.add(subscription, self.principal(owner).to_wire())

    def _subscription_cancelled(self, data: dict[str, Any]) -> None:
        subscription = self.subscriptions[data["subscription_id"]]
        self.active_subscriptions.get(subscription["agent_id"], set()).discard(subscription["id"])
        self._cancel(subscription["id"], data.get("reason", "unsubscribed"))

    def _cancel(self, subscription_id: str, reason: str) -> None:
        subscription = self.subscriptions[subscription_id]
        subscription["status"] = "cancelled"
        subscription["cancel_reason"] = reason
        self.registry.cancel(subscription_id)


_APPLY: dict[str, Callable[[FieldState, dict[str, Any]], None]] = {
    "field.created": FieldState._field_created,
    "clock.reserved": FieldState._clock_reserved,
    "agent.registered": FieldState._agent_registered,
    "agent.deregistered": FieldState._agent_deregistered,
    "agent.failed": FieldState._agent_failed,
    "agent.recovered": FieldState._agent_recovered,
    "memory.recorded": FieldState._memory_recorded,
    "memory.superseded": FieldState._memory_superseded,
    "memory.contested": FieldState._memory_contested,
    "conflict.detected": FieldState._conflict_detected,
    "subscription.created": FieldState._subscription_created,
    "subscription.cancelled": FieldState._subscription_cancelled,
    "memory.archived": FieldState._memory_archived,
    "memory.purged": FieldState._memory_purged,
    **dict.fromkeys(sessions.ENTRY_KIND.values(), sessions.apply_session),
    **dict.fromkeys(
        ("task.created", "task.assigned", "task.state_changed", "task.completed"),
        tasks.apply_task,
    ),
    "conflict.transitioned": FieldState._conflict_transitioned,
    "conflict.vote_cast": FieldState._conflict_vote_cast,
    "conflict.resolved": FieldState._conflict_resolved,
    "memory.reinstated": FieldState._memory_reinstated,
}


def tombstone(unit: dict[str, Any]) -> dict[str, Any]:
    """What the state keeps of a purged unit: who, what type, which task; no content."""
    return {
        "id": unit["id"],
        "type": unit["type"],
        "status": "purged",
        "source": unit["source"],
        "intent": {"task_id": unit["intent"].get("task_id")},
        "epoch": unit["epoch"],
    }


#: The operator: the holder of the operator token, at authority 10 (spec 11.2).
OPERATOR_RECORD = AgentRecord(
    id=OPERATOR_ID,
    role="human_operator",
    interests=[],
    current_task_id=None,
    registered_epoch=0,
    token_hash="",
    authority=OPERATOR,
)
