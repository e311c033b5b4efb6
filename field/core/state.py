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
``memory.recorded``   ``{unit}``: the full MemoryUnit
``memory.superseded`` ``{memory_unit_id, by}``
``memory.contested``  ``{memory_unit_id, conflict_id}``
``conflict.detected`` ``{conflict}``: the full Conflict
``subscription.created``   ``{subscription}``
``subscription.cancelled`` ``{subscription_id, reason}``
===================== ===============================================

Deregistering an agent cancels its subscriptions too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..model import Limits
from ..store.base import LogEntry, StoredEntry
from ..subscriptions.registry import SubscriptionRegistry
from .authority import OPERATOR, OPERATOR_ID, STANDARD
from .clock import LamportClock
from .embedding import Embedder
from .relevance import UnitIndex


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
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    active_subscriptions: dict[str, set[str]] = field(default_factory=dict)
    registry: SubscriptionRegistry = field(init=False)
    last_position: int = 0
    #: timestamp of the newest entry: entry timestamps never decrease
    last_ts: float = 0.0

    def __post_init__(self) -> None:
        self.clock = LamportClock(max_skew=self.limits.max_epoch_skew)
        self.index = UnitIndex(self.embedder)
        self.registry = SubscriptionRegistry(self.index.embedder)

    def principal(self, agent_id: str) -> AgentRecord:
        """A registered agent, or the operator (who is no registered agent)."""
        if agent_id == OPERATOR_ID:
            return OPERATOR_RECORD
        return self.agents[agent_id]

    # -- the projection ------------------------------------------------------

    def apply(self, entry: LogEntry | StoredEntry) -> None:
        """Fold one log entry into the state."""
        handler = _APPLY.get(entry.kind)
        if handler is not None:
            handler(self, entry.data)
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

    def _memory_recorded(self, data: dict[str, Any]) -> None:
        unit = data["unit"]
        self.units[unit["id"]] = unit
        self.units_by_agent[unit["source"]["agent_id"]] += 1
        self.unit_statuses[unit["status"]] += 1
        self.index.add(unit)

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

    def _conflict_detected(self, data: dict[str, Any]) -> None:
        conflict = data["conflict"]
        self.conflicts[conflict["id"]] = conflict

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
    "memory.recorded": FieldState._memory_recorded,
    "memory.superseded": FieldState._memory_superseded,
    "memory.contested": FieldState._memory_contested,
    "conflict.detected": FieldState._conflict_detected,
    "subscription.created": FieldState._subscription_created,
    "subscription.cancelled": FieldState._subscription_cancelled,
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
