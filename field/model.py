"""Vocabulary of the protocol: the enumerations of spec sections 5 to 7.

Everything here is data. The Field keeps memory units, agents and conflicts
in their wire form (plain dicts that serialize straight to the JSON of spec
Appendix C), so this module only names the closed sets of values and the
limits that bound every field of a request.
"""

from __future__ import annotations

from dataclasses import dataclass

OPERATIONS: tuple[str, ...] = (
    "REGISTER",
    "DEREGISTER",
    "RECORD",
    "ATTUNE",
    "DETECT",
    "MERGE",
    "SUBSCRIBE",
    "REPLAY",
    "COMPACT",
    "COORDINATE",
    "HANDOFF",
    "SESSION",
)

MEMORY_TYPES: frozenset[str] = frozenset(
    {
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
    }
)

#: Type importance for relevance (spec 6.4: decisions and contradictions
#: above observations). Values in [0, 1].
TYPE_IMPORTANCE: dict[str, float] = {
    "decision": 1.0,
    "contradiction": 1.0,
    "human_directive": 1.0,
    "constraint": 0.9,
    "correction": 0.85,
    "synthesis": 0.85,
    "finding": 0.8,
    "question": 0.7,
    "intention": 0.6,
    "assumption": 0.6,
    "observation": 0.5,
}

RELATION_TYPES: frozenset[str] = frozenset(
    {
        "supports",
        "contradicts",
        "depends_on",
        "supersedes",
        "caused_by",
        "elaborates",
        "answers",
        "blocks",
        "informs",
    }
)

UNIT_STATUSES: tuple[str, ...] = (
    "active",
    "draft",
    "superseded",
    "retracted",
    "contested",
    "pending_enrichment",
    "archived",  # extension: COMPACT archive/summarize (hidden from ATTUNE unless asked)
)
#: Statuses ATTUNE never returns (spec 6.4 rule 2).
HIDDEN_UNIT_STATUSES: frozenset[str] = frozenset({"superseded", "retracted"})

AGENT_STATUSES: tuple[str, ...] = ("idle", "working", "waiting", "offline", "failed")

CONFLICT_TYPES: frozenset[str] = frozenset({"factual", "interpretive", "strategic", "priority"})
CONFLICT_STATUSES: tuple[str, ...] = ("detected", "resolving", "resolved", "escalated")
UNRESOLVED_CONFLICT_STATUSES: frozenset[str] = frozenset({"detected", "resolving", "escalated"})
CONFLICT_STRATEGIES: tuple[str, ...] = (
    "last_write_wins",
    "confidence_weighted",
    "authority",
    "evidence_count",
    "synthesis",
    "human_escalation",
    "vote",
)

DETECT_MODES: tuple[str, ...] = ("check", "scan", "list")
ATTUNE_FORMATS: tuple[str, ...] = ("full", "summary", "ids_only")

#: Largest epoch the Field hands out: the largest integer JSON carries exactly.
MAX_EPOCH = 2**53 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds on every request field; each is part of the wire contract."""

    max_body_bytes: int = 1 << 20
    max_content_chars: int = 65536
    max_text_chars: int = 4096
    max_id_chars: int = 256
    max_role_chars: int = 128
    max_list_items: int = 64
    max_interest_chars: int = 256
    max_relations: int = 64
    max_attune_units: int = 1000
    max_attune_conflicts: int = 100
    max_epoch_skew: int = 2**32
    max_subscriptions_per_agent: int = 100
    max_debounce_ms: int = 3_600_000
    max_replay_events: int = 1000
    max_compact_units: int = 1000

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}
