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
``subscription.created``   ``{subscription}`` (+ ``delivery``: a durable delivery's record)
``subscription.cancelled`` ``{subscription_id, reason}``
``delivery.acked``    ``{cursors: {subscription_id: position}}``: deliveries acknowledged
                      up to those cursors (+ ``term``: the sender's, with several nodes)
``delivery.changed``  ``{subscription_id, action, reason}``: a delivery's state moved
                      (see :mod:`field.subscriptions.delivery`; + ``term`` as above when
                      the sender wrote it)
``delivery.term``     ``{term, node}``: ``node`` took the deliveries' lease under ``term``
                      and sends from here on (several nodes on one log)
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
``source.defined``    ``{source}``: an inbound event source (its secret sealed)
``source.removed``    ``{name}``
``registration_token.*``   see :mod:`field.core.registration`
``agent.feedback``    ``{agent_id, items: [[memory_unit_id, useful], ...]}`` (FEEDBACK)
===================== ===============================================

A ``memory.recorded`` entry of an inbound event also has ``delivery``:
``{source, id, timestamp, digest}`` (see :mod:`field.core.sources`).

Every entry is also indexed by the entities it is about
(:class:`~field.core.entities.EntityIndex`), under its log position, so
that REPLAY can read exactly the entries of a causal chain. A purged
unit leaves ``units`` for ``purged``, which keeps a content-free
tombstone (id, type, source, task, epoch) for readers of old entries;
``known_units`` looks in both.

The conflict lifecycle and what MERGE writes are in :mod:`field.core.conflicts`.

**The deliveries' term.** With several nodes on one log, one sends the
durable deliveries, the holder of a lease whose every grant has a new,
higher number (:mod:`field.store.lease`). A node that gains the lease
writes ``delivery.term`` before it sends anything, and every entry it
writes as the sender carries that term; ``delivery_term`` is the newest
term the log holds, and the Field writes nothing for a sender whose term is
below it (``Field.ack_deliveries`` and the others answer ``superseded``).
The check is made when the entry is written, never when it is applied: an
entry the log holds is applied whatever its term, and entries of logs
written before terms existed have none.

Deregistering an agent cancels its subscriptions too, and retires its id:
``retired`` keeps the hash of the id's last token until the id is
registered again (see ``Field._register``), so an id never passes to a
different registrant with the units recorded under it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import ChainMap, Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..contract.clock import LamportClock
from ..contract.model import UNRESOLVED_CONFLICT_STATUSES, Limits, LogEntry, StoredEntry
from ..ranking.embedding import Embedder
from ..ranking.learning import Judged
from ..ranking.relevance import Column, Interests, UnitIndex, interest_vectors
from ..subscriptions import delivery
from ..subscriptions.allow_lists import AllowLists
from ..subscriptions.registry import SubscriptionRegistry
from . import registration, sessions, sources, tasks
from .authority import OPERATOR, OPERATOR_ID, STANDARD
from .entities import EntityIndex
from .pages import Order
from .units import Units
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
    #: why the agent is ``failed`` (its ``agent.failed`` entry's reason); None otherwise
    failure_reason: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "id": self.id,
            "role": self.role,
            "status": self.status,
            "interests": list(self.interests),
            "current_task_id": self.current_task_id,
            "registered_epoch": self.registered_epoch,
            "authority": self.authority,
        }
        if self.failure_reason is not None:
            wire["failure_reason"] = self.failure_reason
        return wire


@dataclass(slots=True)
class FieldState:
    """Everything the Field knows, rebuilt from the log."""

    limits: Limits
    field_id: str | None = None
    clock: LamportClock = field(init=False)
    agents: dict[str, AgentRecord] = field(default_factory=dict)
    #: the ids of ``agents``, sorted: the order ``GET /v1/agents`` pages through
    agent_ids: list[str] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    revoked_tokens: dict[str, str] = field(default_factory=dict)
    #: deregistered agent id -> hash of its last token: the id is retired, and only
    #: that token (its registrant coming back) or the operator may register it again
    retired: dict[str, str] = field(default_factory=dict)
    #: memory units by id, each held encoded (:mod:`field.core.units`)
    units: Units = field(default_factory=Units)
    units_by_agent: Counter[str] = field(default_factory=Counter)
    #: per agent, what its FEEDBACK said of units (:mod:`field.core.feedback`)
    feedback: dict[str, Judged] = field(default_factory=dict)
    #: per unit, by its row in ``index``, its author's authority level when it recorded
    #: it: superseding another agent's unit needs as much (see :meth:`authority_of`)
    unit_authority: Column = field(default_factory=lambda: Column(np.int8))
    unit_statuses: Counter[str] = field(default_factory=Counter)
    #: embeds unit contents and subscriber profiles (None: the default embedder)
    embedder: Embedder | None = None
    index: UnitIndex = field(init=False)
    conflicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: conflicts and tasks in the order they were created (lists page through them)
    conflict_order: Order = field(default_factory=Order)
    task_order: Order = field(default_factory=Order)
    #: the unresolved conflicts in the order they were detected, all of them and, per
    #: agent, those involving its units (ATTUNE reads the newest without a scan)
    unresolved: dict[str, None] = field(default_factory=dict)
    unresolved_by_agent: dict[str, dict[str, None]] = field(default_factory=dict)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per agent, the ids of its open tasks and of the sessions it belongs to
    open_tasks_by_agent: dict[str, set[str]] = field(default_factory=dict)
    sessions_by_member: dict[str, set[str]] = field(default_factory=dict)
    #: per agent, the sessions it has a pending invitation to
    invitations: dict[str, set[str]] = field(default_factory=dict)
    #: who was a member of which session when (for push visibility)
    membership: Membership = field(default_factory=Membership)
    #: per task, the tasks that depend on it
    dependent_tasks: dict[str, list[str]] = field(default_factory=dict)
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    active_subscriptions: dict[str, set[str]] = field(default_factory=dict)
    #: the durable deliveries (webhook, RAP) by subscription: record, cursor, state
    deliveries: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the newest term of the deliveries' lease the log holds, and the node that took it
    #: (0 and None until a node of several claims the deliveries: see the module docstring)
    delivery_term: int = 0
    delivery_node: str | None = None
    registry: SubscriptionRegistry = field(init=False)
    #: inbound event sources by name (see :mod:`field.core.sources`)
    sources: dict[str, sources.Source] = field(default_factory=dict)
    #: registration tokens the operator issued (see :mod:`field.core.registration`)
    registration_tokens: registration.Tokens = field(default_factory=registration.Tokens)
    #: tombstones of purged units (no content), by id
    purged: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: ``units`` then ``purged``: for readers of entries about units that may be purged
    known_units: ChainMap[str, dict[str, Any]] = field(init=False)
    history: EntityIndex = field(default_factory=EntityIndex)
    #: per agent, the ids its operations touched, by position (subscription filters)
    allow_lists: AllowLists = field(default_factory=AllowLists)
    #: position of the newest entry applied (live entries are applied before they
    #: are stored, and positions are contiguous, so the next one is this plus one)
    applied_position: int = 0
    last_position: int = 0
    #: timestamp of the newest entry: entry timestamps never decrease
    last_ts: float = 0.0

    def __post_init__(self) -> None:
        self.clock = LamportClock(
            max_skew=self.limits.max_epoch_skew, rate=self.limits.max_epoch_rate
        )
        self.index = UnitIndex(self.embedder)
        self.registry = SubscriptionRegistry(self.index.embedder)
        self.known_units = ChainMap(self.units, self.purged)

    def registry_row(self, subscription_id: str) -> int:
        """The subscription's row in ``registry``; a cancelled one a snapshot left out is
        added again (see :meth:`SubscriptionRegistry.compact`)."""
        return self.registry.row_of(self.subscriptions[subscription_id])

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
        self.allow_lists.grow(entry.kind, entry.data, position, self.known_units)
        self.history.note(position, entry.data)
        self.clock.value = max(self.clock.value, entry.epoch)
        if self.clock.origin is None:  # the Field's first entry: its creation
            self.clock.origin = entry.ts
        self.last_ts = max(self.last_ts, entry.ts)
        if isinstance(entry, StoredEntry):
            self.last_position = entry.position

    def replay(self, entries: Any) -> None:
        """Apply stored entries in order, then settle the clock above them."""
        with self.index.in_bulk():
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
        insort(self.agent_ids, record.id)
        self.tokens[record.token_hash] = record.id
        self.retired.pop(record.id, None)
        registration.apply_use(self, data.get("registration_token"))

    def _agent_deregistered(self, data: dict[str, Any]) -> None:
        record = self.agents.pop(data["agent_id"])
        del self.agent_ids[bisect_left(self.agent_ids, record.id)]
        del self.tokens[record.token_hash]
        self.revoked_tokens[record.token_hash] = record.id
        self.retired[record.id] = record.token_hash
        self.feedback.pop(record.id, None)  # what it taught leaves with it
        for subscription_id in sorted(self.active_subscriptions.pop(record.id, ())):
            self._cancel(subscription_id, "agent deregistered")

    def _agent_failed(self, data: dict[str, Any]) -> None:
        agent = self.agents[data["agent_id"]]
        agent.status = "failed"
        agent.failure_reason = data["reason"]

    def _agent_recovered(self, data: dict[str, Any]) -> None:
        agent = self.agents[data["agent_id"]]
        agent.status = "idle"
        agent.failure_reason = None

    def _memory_recorded(self, data: dict[str, Any]) -> None:
        unit = data["unit"]
        delivery = data.get("delivery")
        if delivery is not None:  # an inbound event; its source may since be gone
            source = self.sources.get(delivery["source"])
            if source is not None:
                source.accepted += 1
                # an entry written by an older version has no ``digest``
                source.deliveries.note(
                    delivery["id"], delivery["timestamp"], delivery.get("digest")
                )
        self.units.add(unit)
        self.units_by_agent[unit["source"]["agent_id"]] += 1
        self.unit_statuses[unit["status"]] += 1
        session_id = unit["source"].get("session_id")
        self.unit_authority.append(self._author_authority(unit))  # the row index.add gives it
        self.index.add(unit, session_id=session_id if session_id in self.sessions else None)

    def _author_authority(self, unit: dict[str, Any]) -> int:
        """The unit's author's own level (not a session creator's 8), as the unit is applied.

        Applied in log order, the author is registered (or is the operator)
        at this point both live and in a replay, so the level is a function
        of the log like the rest of the state, and stays with the unit when
        its author deregisters.
        """
        author = unit["source"]["agent_id"]
        record = OPERATOR_RECORD if author == OPERATOR_ID else self.agents.get(author)
        return STANDARD if record is None else record.authority  # None: no log of this Field

    def _set_unit_status(self, unit_id: str, status: str) -> None:
        self.unit_statuses[self.units.set_status(unit_id, status)] -= 1
        self.unit_statuses[status] += 1
        self.index.set_status(unit_id, status)

    def _memory_superseded(self, data: dict[str, Any]) -> None:
        self._set_unit_status(data["memory_unit_id"], "superseded")

    def _memory_contested(self, data: dict[str, Any]) -> None:
        self._set_unit_status(data["memory_unit_id"], "contested")

    def _memory_archived(self, data: dict[str, Any]) -> None:
        self._set_unit_status(data["memory_unit_id"], "archived")

    def _memory_purged(self, data: dict[str, Any]) -> None:
        unit = self.units.pop(data["memory_unit_id"])
        self.unit_authority[self.index.rows[unit["id"]]] = STANDARD
        self.unit_statuses[unit["status"]] -= 1
        self.units_by_agent[unit["source"]["agent_id"]] -= 1
        self.index.set_status(unit["id"], "purged")
        self.purged[unit["id"]] = tombstone(unit)

    def authority_of(self, unit_id: str) -> int:
        """The authority level superseding ``unit_id`` needs: its author's when it recorded it
        (STANDARD for a unit purged or not known)."""
        row = self.index.rows.get(unit_id)
        return STANDARD if row is None else int(self.unit_authority.view[row])

    def unit_record(self, unit_id: str) -> dict[str, Any]:
        """A unit, or the tombstone of a purged one (KeyError if neither)."""
        return self.known_units[unit_id]

    def _conflict_detected(self, data: dict[str, Any]) -> None:
        conflict = data["conflict"]
        self.conflicts[conflict["id"]] = conflict
        self.conflict_order.add(conflict["id"])
        self._track_unresolved(conflict)

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
        self._track_unresolved(conflict)

    def _conflict_vote_cast(self, data: dict[str, Any]) -> None:
        conflict = self.conflicts[data["conflict_id"]]
        vote = conflict["vote"]
        ballots = [*vote["ballots"], data["ballot"]]
        self.conflicts[conflict["id"]] = {**conflict, "vote": {**vote, "ballots": ballots}}

    def _conflict_resolved(self, data: dict[str, Any]) -> None:
        conflict = data["conflict"]
        self.conflicts[conflict["id"]] = dict(conflict)
        self._track_unresolved(conflict)

    def _track_unresolved(self, conflict: dict[str, Any]) -> None:
        """Keep ``unresolved`` and ``unresolved_by_agent`` in step with a conflict's status.

        A conflict is detected unresolved and, once resolved, stays so: it is
        added once, at detection (so both keep detection order), and removed once.
        """
        conflict_id = conflict["id"]
        agents = {self.known_units[conflict[k]]["source"]["agent_id"] for k in ("unit_a", "unit_b")}
        if conflict["status"] in UNRESOLVED_CONFLICT_STATUSES:
            self.unresolved.setdefault(conflict_id, None)
            for agent_id in agents:
                self.unresolved_by_agent.setdefault(agent_id, {}).setdefault(conflict_id, None)
            return
        self.unresolved.pop(conflict_id, None)
        for agent_id in agents:
            mine = self.unresolved_by_agent.get(agent_id)
            if mine is not None:
                mine.pop(conflict_id, None)
                if not mine:
                    del self.unresolved_by_agent[agent_id]

    def _memory_reinstated(self, data: dict[str, Any]) -> None:
        self._set_unit_status(data["memory_unit_id"], "active")

    def _subscription_created(self, data: dict[str, Any]) -> None:
        subscription = dict(data["subscription"])
        # a durable delivery's public part is shown from its record (``deliveries``)
        subscription.pop("delivery", None)
        subscription["created_position"] = self.applied_position  # its cursor, if asked again
        self.subscriptions[subscription["id"]] = subscription
        owner = subscription["agent_id"]
        self.active_subscriptions.setdefault(owner, set()).add(subscription["id"])
        self.registry.add(subscription, self.principal(owner).to_wire(), self.learned(owner))
        record = data.get("delivery")
        if record is not None:
            # a RAP delivery owes its tool result first: the entry before its subscription
            first = self.applied_position - (record["type"] == "rap")
            self.deliveries[subscription["id"]] = {
                **record,
                "agent_id": owner,
                "created_position": self.applied_position,
                "acked": first,
                "state": "active",
                "reason": None,
            }

    def _subscription_cancelled(self, data: dict[str, Any]) -> None:
        subscription = self.subscriptions[data["subscription_id"]]
        self.active_subscriptions.get(subscription["agent_id"], set()).discard(subscription["id"])
        self._cancel(subscription["id"], data.get("reason", "unsubscribed"))

    def _cancel(self, subscription_id: str, reason: str) -> None:
        subscription = self.subscriptions[subscription_id]
        subscription["status"] = "cancelled"
        subscription["cancel_reason"] = reason
        # where its stream ends: a durable delivery still owes what came before
        subscription["ended_position"] = self.applied_position
        self.registry.cancel(subscription_id)

    def _agent_feedback(self, data: dict[str, Any]) -> None:
        """FEEDBACK (:mod:`field.core.feedback`): the agent's :class:`Judged` takes the
        judgements, and its subscriptions a profile that learned them."""
        agent = self.principal(data["agent_id"])  # the operator's subscriptions learn too
        judged = self.feedback.get(agent.id)
        if judged is None:
            judged = self.feedback[agent.id] = Judged.empty(self.index.embedder.dim)
        index = self.index
        rows = np.array([index.rows[unit_id] for unit_id, _ in data["items"]], dtype=np.intp)
        vectors, squares = index.rows_vectors(rows)
        for (_, useful), row, vector, square in zip(
            data["items"], rows.tolist(), vectors, squares.tolist(), strict=True
        ):
            judged.add(row, vector, square, useful)
        judged.generation += 1
        self.registry.relearn(agent.to_wire(), self.learned(agent.id), index.calibration)

    def learned(self, agent_id: str) -> tuple[Judged, Interests] | None:
        """What ``agent_id``'s feedback taught, with its interests as its subscriptions
        compare them (:mod:`field.ranking.learning`); None when it gave none."""
        judged = self.feedback.get(agent_id)
        if judged is None:
            return None
        agent = self.principal(agent_id)
        return judged, interest_vectors(self.index, agent.interests, judged=judged)

    def _source_defined(self, data: dict[str, Any]) -> None:
        definition = data["source"]
        source = sources.compiled(definition)
        previous = self.sources.get(source.name)
        if previous is not None:  # a new definition keeps what the source has seen
            source.deliveries, source.accepted = previous.deliveries, previous.accepted
        self.sources[source.name] = source

    def _source_removed(self, data: dict[str, Any]) -> None:
        del self.sources[data["name"]]

    def _delivery_acked(self, data: dict[str, Any]) -> None:
        for subscription_id, position in data["cursors"].items():
            record = self.deliveries[subscription_id]
            record["acked"] = max(record["acked"], position)

    def _delivery_changed(self, data: dict[str, Any]) -> None:
        record = self.deliveries[data["subscription_id"]]
        record["state"] = delivery.TRANSITIONS[record["state"]][data["action"]]
        record["reason"] = data.get("reason")

    def _delivery_term(self, data: dict[str, Any]) -> None:
        if data["term"] > self.delivery_term:
            self.delivery_term = data["term"]
            self.delivery_node = data["node"]


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
    "delivery.acked": FieldState._delivery_acked,
    "delivery.changed": FieldState._delivery_changed,
    "delivery.term": FieldState._delivery_term,
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
    "source.defined": FieldState._source_defined,
    "source.removed": FieldState._source_removed,
    "registration_token.issued": registration.apply_issued,
    "registration_token.revoked": registration.apply_revoked,
    "agent.feedback": FieldState._agent_feedback,
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
