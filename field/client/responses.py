"""What the main operations answer, typed: the JSON objects of ``protocol/schemas``.

Each response is a :class:`~typing.TypedDict`: at run time the dict the
Field sent (``result["conflict"]["resolution"]["winner_id"]`` reads as
always, and fields a newer Field adds are there), for a type checker a
document whose keys and value types are known, so ``mypy --strict`` follows
``(await agent.record(...))["memory_unit_id"]`` to a ``str``. ``NotRequired``
marks what the Field leaves out in some answers: read those with ``.get()``
or after checking, as the schema says when they are present.

=========================== ===================================================
:class:`RegisterResponse`   ``FieldClient.register`` (``AgentClient.registration``)
:class:`RecordResponse`     ``AgentClient.record``
:class:`AttuneResponse`     ``AgentClient.attune`` and ``poll``
:class:`DetectResponse`     ``AgentClient.detect``
:class:`ConflictsPage`      ``AgentClient.conflicts`` (``GET /v1/conflicts``)
:class:`MergeResponse`      ``AgentClient.merge``
:class:`CoordinateResponse` ``AgentClient.coordinate``
:class:`HandoffResponse`    ``AgentClient.handoff``
:class:`AgentsPage`         ``AgentClient.agents`` (``GET /v1/agents``)
=========================== ===================================================

SUBSCRIBE ``subscribe`` answers a :class:`~field.client.types.Subscription`.
The other operations answer the plain dicts of their schemas.
"""

# no "from __future__ import annotations": a TypedDict reads NotRequired[...] from its
# annotations as they are evaluated, which postponed (string) annotations are not
from typing import Any, Literal, NotRequired, TypedDict

from .types import (
    AgentStatus,
    ConflictStatus,
    ConflictType,
    MemoryType,
    Priority,
    RelationType,
    Strategy,
    TaskStatus,
    UnitStatus,
)

# -- agents and the Field ---------------------------------------------------------------


class AgentRecord(TypedDict):
    """A registered agent (``agent.json``)."""

    id: str
    role: str
    status: AgentStatus
    interests: list[str]
    current_task_id: str | None
    registered_epoch: NotRequired[int]
    authority: NotRequired[int]
    #: only while ``status`` is ``failed``: why the Field declared the agent failed
    failure_reason: NotRequired[str]


class Relevance(TypedDict):
    """The relevance formula's weights and the ``min_relevance`` recommended with them."""

    weights: Literal["lexical", "sentence"]
    recommended_min_relevance: float


class FieldCapabilities(TypedDict):
    """What the Field supports (``field-capabilities.json``)."""

    conformance_level: int
    supported_operations: list[str]
    protocol_version: str
    persistence: bool
    conflict_strategies: list[Strategy]
    field_id: str
    detect_modes: list[Literal["check", "scan", "list"]]
    limits: dict[str, int]
    embedder: NotRequired[str]
    relevance: NotRequired[Relevance]


class RegisterResponse(TypedDict):
    """REGISTER: the agent's record and its ``token`` (shown this once)."""

    status: Literal["registered"]
    agent: AgentRecord
    field_capabilities: FieldCapabilities
    rejection_reason: None
    token: str
    epoch: int


class AgentsPage(TypedDict):
    """A page of ``GET /v1/agents``: ``next`` is the ``after`` of the next page (None: done)."""

    status: Literal["ok"]
    agents: list[AgentRecord]
    next: str | None
    epoch: int


# -- memory units -----------------------------------------------------------------------


class Intent(TypedDict):
    purpose: str
    task_id: NotRequired[str | None]
    question: NotRequired[str | None]


class Confidence(TypedDict, total=False):
    score: float
    reasoning: str
    evidence: list[str]
    assumptions: list[str]


class Source(TypedDict):
    agent_id: str
    agent_role: str
    session_id: str | None
    #: RFC 3339, UTC, e.g. ``2026-03-01T10:30:00.123Z``
    timestamp: str


class UnitRelation(TypedDict):
    """A unit's link to another (``relation.json``), as the Field stores it."""

    type: RelationType
    target_id: str
    description: NotRequired[str | None]


class MemoryUnit(TypedDict):
    """A memory unit (``memory-unit.json``)."""

    id: str
    mode: Literal["draft", "committed"]
    type: MemoryType
    content: str
    intent: Intent
    confidence: NotRequired[Confidence]
    source: Source
    relations: list[UnitRelation]
    status: UnitStatus
    epoch: int
    #: the parsed body of the inbound event a source recorded as this unit
    payload: NotRequired[dict[str, Any]]


class ScopedUnit(TypedDict):
    """One unit of an ATTUNE answer with its relevance (``scoped-memory-unit.json``).

    ``format`` ``full`` or ``summary``: the unit is in ``memory_unit``;
    ``ids_only``: only its ``memory_unit_id`` and ``epoch`` are there.
    """

    memory_unit: NotRequired[MemoryUnit]
    memory_unit_id: NotRequired[str]
    epoch: NotRequired[int]
    relevance_score: float
    relevance_reason: str
    format: Literal["full", "summary", "ids_only"]


class RecordResponse(TypedDict):
    """RECORD: the new unit's id, and the conflicts its ``contradicts`` relations made."""

    status: Literal["accepted"]
    memory_unit_id: str
    epoch: int
    conflicts_detected: list[str]
    rejection_reason: None


# -- conflicts --------------------------------------------------------------------------


class Resolution(TypedDict):
    strategy: Strategy
    winner_id: str | None
    rationale: str
    resolved_by: str
    epoch_resolved: int
    #: the unit strategy ``synthesis`` created; None otherwise
    synthesis_unit_id: NotRequired[str | None]


class Ballot(TypedDict):
    agent_id: str
    winner_id: str
    rationale: str
    epoch: int


class Vote(TypedDict):
    """The vote MERGE strategy ``vote`` opened, with its ballots."""

    quorum: int
    opened_by: str
    ballots: list[Ballot]


class Escalation(TypedDict):
    escalated_by: str
    rationale: str
    epoch: int


class Conflict(TypedDict):
    """A conflict between two units (``conflict.json``); ``resolution`` once resolved."""

    id: str
    type: ConflictType
    status: ConflictStatus
    unit_a: str
    unit_b: str
    description: str
    detected_by: Literal["explicit", "semantic", "logical", "temporal"]
    resolution: NotRequired[Resolution]
    vote: NotRequired[Vote]
    escalation: NotRequired[Escalation]
    epoch: int


class ContextBudget(TypedDict):
    units_returned: int
    units_available: int
    tokens_used: int | None
    tokens_budget: int | None
    #: the bound that ended the page while more units matched; None when all were returned
    limited_by: NotRequired[Literal["max_units", "max_tokens", "max_response_bytes"] | None]


class AttuneResponse(TypedDict):
    """ATTUNE: the units most relevant to the agent (``record``), ranked, and open conflicts."""

    status: Literal["ok"]
    record: list[ScopedUnit]
    conflicts: list[Conflict]
    context_budget: ContextBudget
    epoch: int


class ScanCoverage(TypedDict):
    units_scanned: int
    new_conflicts_found: int
    units_in_scope: NotRequired[int]


class DetectResponse(TypedDict):
    """DETECT: the conflicts found (``check``, ``scan``) or listed (``list``: a page)."""

    status: Literal["ok"]
    conflicts: list[Conflict]
    scan_coverage: ScanCoverage
    next: NotRequired[str | None]
    epoch: int


class ConflictsPage(TypedDict):
    """A page of ``GET /v1/conflicts``: ``next`` is the ``after`` of the next page."""

    status: Literal["ok"]
    conflicts: list[Conflict]
    next: str | None
    epoch: int


class SideEffects(TypedDict):
    superseded_units: list[str]
    new_unit_id: str | None
    notified_agents: list[str]


class MergeResponse(TypedDict):
    """MERGE: the conflict as it now is (``resolved``, ``escalated``, or ``pending_vote``)."""

    status: Literal["resolved", "escalated", "pending_vote"]
    conflict: Conflict
    side_effects: SideEffects
    epoch: int


# -- coordination -----------------------------------------------------------------------


class Task(TypedDict):
    """A task (``task.json``)."""

    id: str
    title: str
    description: str | None
    status: TaskStatus
    created_by: str
    assignee: str | None
    session_id: str | None
    depends_on: list[str]
    priority: Priority
    result: str | None
    reason: str | None
    created_epoch: int
    updated_epoch: int


class CoordinateResponse(TypedDict):
    """COORDINATE: the ``task`` an action changed, or a page of ``tasks`` (``list``, with
    ``next``)."""

    status: Literal["ok"]
    task: NotRequired[Task]
    tasks: NotRequired[list[Task]]
    next: NotRequired[str | None]
    epoch: int


class HandoffContext(TypedDict):
    """The context package of a handoff: units as they were, unresolved conflicts, notes."""

    units: list[ScopedUnit]
    conflicts: list[Conflict]
    notes: str | None


class Handoff(TypedDict):
    id: str
    task_id: str
    from_agent_id: str
    to_agent_id: str
    notes: str | None
    context: HandoffContext
    epoch: int


class HandoffResponse(TypedDict):
    """HANDOFF: the handoff with its context package, and the task now assigned."""

    status: Literal["ok"]
    handoff: Handoff
    task: Task
    epoch: int
