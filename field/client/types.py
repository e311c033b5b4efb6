"""The SDK's types: the protocol's names as ``Literal`` types, and what a stream yields.

Operation responses are the JSON objects of ``protocol/schemas/*.response.json``,
typed in :mod:`field.client.responses`, except SUBSCRIBE's, which is a
:class:`Subscription` so that it can be handed to
:meth:`AgentClient.notifications`. A stream yields
:class:`Notification` objects and, when asked for them (``control=True``), the
control events :class:`Gap`, :class:`Overflow`, :class:`Ended` and
:class:`Disconnected`. Every one has a ``kind``, so ``match event.kind`` works
as well as ``isinstance``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

MemoryType = Literal[
    "finding",
    "decision",
    "observation",
    "intention",
    "assumption",
    "constraint",
    "question",
    "contradiction",
    "synthesis",
    "correction",
    "human_directive",
]
UnitStatus = Literal[
    "active", "draft", "superseded", "retracted", "contested", "pending_enrichment", "archived"
]
RelationType = Literal[
    "supports",
    "contradicts",
    "depends_on",
    "supersedes",
    "caused_by",
    "elaborates",
    "answers",
    "blocks",
    "informs",
]
SubscriptionEvent = Literal[
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
]
Strategy = Literal[
    "last_write_wins",
    "confidence_weighted",
    "authority",
    "evidence_count",
    "synthesis",
    "human_escalation",
    "vote",
]
ConflictStatus = Literal["detected", "resolving", "resolved", "escalated"]
AgentStatus = Literal["idle", "working", "waiting", "offline", "failed"]
TaskStatus = Literal[
    "pending", "assigned", "in_progress", "blocked", "completed", "failed", "cancelled"
]
ConflictType = Literal["factual", "interpretive", "strategic", "priority"]
DetectMode = Literal["check", "scan", "list"]
AttuneFormat = Literal["full", "summary", "ids_only"]
TemporalLayer = Literal["past", "present", "future"]
ReplayTarget = Literal["task", "memory_unit", "decision", "conflict", "session"]
ReplayDepth = Literal["summary", "detailed", "full_trace"]
CompactStrategy = Literal["summarize", "archive", "purge"]
SessionAction = Literal[
    "create", "invite", "uninvite", "join", "leave", "pause", "resume", "end", "list"
]
TaskAction = Literal[
    "create",
    "assign",
    "start",
    "block",
    "unblock",
    "complete",
    "fail",
    "release",
    "cancel",
    "list",
]
Priority = Literal["low", "normal", "high", "critical"]
Transport = Literal["ws", "sse"]


@dataclass(frozen=True, slots=True)
class Relation:
    """A typed link from the unit being recorded to an existing one (spec 5.4).

    ``Relation("contradicts", unit_id)`` makes a conflict; ``"supersedes"``
    takes the target out of ATTUNE.
    """

    type: RelationType
    target_id: str
    description: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, "target_id": self.target_id, "description": self.description}


@dataclass(frozen=True, slots=True)
class Subscription:
    """What SUBSCRIBE ``subscribe`` answered: hand it to :meth:`AgentClient.notifications`.

    ``cursor`` is the point of its creation (a stream resumed from it gets
    everything the subscription owes); ``created`` is ``False`` when a
    ``name`` found the same subscription already there (and ``None`` from a
    Field that does not say). ``response`` is the whole response payload (its fields
    also read as ``subscription["cursor"]``).
    """

    id: str
    events: tuple[str, ...]
    cursor: str
    epoch: int
    ws_url: str
    sse_url: str
    name: str | None
    created: bool | None
    response: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_response(cls, response: dict[str, Any]) -> Subscription:
        stored = response["subscription"]
        return cls(
            id=response["subscription_id"],
            events=tuple(stored["events"]),
            cursor=response["cursor"],
            epoch=response["epoch"],
            ws_url=response["ws_url"],
            sse_url=response["sse_url"],
            name=stored.get("name"),
            created=response.get("created"),
            response=response,
        )

    def __getitem__(self, key: str) -> Any:
        """The response's fields by name (``subscription["cursor"]``), as before it was typed."""
        return self.response[key]

    @property
    def stored(self) -> dict[str, Any]:
        """The stored subscription (``subscription.json``) with its defaults filled in."""
        stored: dict[str, Any] = self.response["subscription"]
        return stored


@dataclass(frozen=True, slots=True)
class Entity:
    """What a notification is about: ``type`` (``memory_unit``, ``conflict``, ``agent``,
    ``task``, ``session``, ``handoff``) and ``id``."""

    type: str
    id: str


@dataclass(frozen=True, slots=True)
class Notification:
    """One push notification (``protocol/schemas/notification.json``).

    ``cursor`` names its place in the Field's log: the stream resumes after
    it. ``detail`` is there for task, handoff and session events. ``data`` is
    the notification as received (fields a newer Field adds are there).
    """

    subscription_id: str
    event: str
    epoch: int
    cursor: str
    relevance_score: float
    relevance_reason: str
    requires_action: bool
    summary: str
    memory_unit_id: str | None
    conflict_id: str | None
    agent_id: str | None
    entity: Entity
    folded: int
    detail: dict[str, Any] | None
    data: dict[str, Any] = field(repr=False, compare=False)
    kind: Literal["notification"] = field(default="notification", init=False)

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Notification:
        entity = data.get("entity") or {}
        return cls(
            subscription_id=data["subscription_id"],
            event=data["event"],
            epoch=data["epoch"],
            cursor=data["cursor"],
            relevance_score=data.get("relevance_score", 0.0),
            relevance_reason=data.get("relevance_reason", ""),
            requires_action=bool(data.get("requires_action")),
            summary=data.get("summary", ""),
            memory_unit_id=data.get("memory_unit_id"),
            conflict_id=data.get("conflict_id"),
            agent_id=data.get("agent_id"),
            entity=Entity(str(entity.get("type", "")), str(entity.get("id", ""))),
            folded=data.get("folded", 0),
            detail=data.get("detail"),
            data=dict(data),
        )


@dataclass(frozen=True, slots=True)
class Gap:
    """The Field could not resume a subscription from the stream's cursor (``recovered:
    false``: a cursor of another Field, or one ahead of its log).

    The stream goes on live from ``resumed_from``; what happened between
    ``last_cursor`` and it was not notified. ``last_epoch`` is the epoch of
    the last notification the stream yielded (0 if none): poll ATTUNE with
    ``since_epoch=last_epoch`` to catch up.
    """

    subscription_id: str
    reason: str
    last_cursor: str | None
    resumed_from: str
    last_epoch: int
    kind: Literal["gap"] = field(default="gap", init=False)


@dataclass(frozen=True, slots=True)
class Overflow:
    """The Field cut the connection because the consumer fell behind (close 4008).

    Nothing is lost: the stream reconnects at once from the cursor of the last
    notification it yielded for each subscription. ``cursors`` are the
    Field's (the last notification it queued for each).
    """

    reason: str
    cursors: dict[str, str]
    kind: Literal["overflow"] = field(default="overflow", init=False)


@dataclass(frozen=True, slots=True)
class Ended:
    """A subscription ended (cancelled, expired, or its agent deregistered); everything it
    owed was delivered before this."""

    subscription_id: str
    reason: str
    cursor: str
    kind: Literal["ended"] = field(default="ended", init=False)


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The connection dropped (``reason``); the stream reconnects after ``retry_in``
    seconds and resumes from its cursors."""

    reason: str
    retry_in: float
    attempt: int
    kind: Literal["disconnected"] = field(default="disconnected", init=False)


ControlEvent = Gap | Overflow | Ended | Disconnected
StreamEvent = Notification | Gap | Overflow | Ended | Disconnected


@dataclass(frozen=True, slots=True)
class Reconnect:
    """How a stream reconnects: after ``initial`` seconds, each wait ``multiplier`` times
    the last, at most ``maximum``, each drawn at random between half and all of it
    (so that clients cut off together do not come back together). A connection
    that was accepted starts the series over.

    ``give_up_after``: seconds of failing to connect after which the stream
    raises :class:`StreamUnavailable` (``None``: never; the default, since a
    Field that restarts comes back). The defaults keep every wait under the
    Field's ``failure_grace`` (30 s), so an agent that reconnects stays live.
    """

    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0
    give_up_after: float | None = None

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.multiplier < 1:
            raise ValueError("need 0 < initial <= maximum and multiplier >= 1")
        if self.give_up_after is not None and self.give_up_after < 0:
            raise ValueError("give_up_after must not be negative")

    def delay(self, attempt: int, rand: float) -> float:
        """The wait before reconnection ``attempt`` (1, 2, ...); ``rand`` in [0, 1)."""
        ceiling = min(self.maximum, self.initial * self.multiplier ** min(attempt - 1, 64))
        return ceiling * (0.5 + rand / 2)
