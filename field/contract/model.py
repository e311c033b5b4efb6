"""Vocabulary of the protocol: the enumerations of spec sections 5 to 7, and the
log entries every operation produces.

Everything here is data. The Field keeps memory units, agents and conflicts
in their wire form (plain dicts that serialize straight to the JSON of spec
Appendix C), so this module only names the closed sets of values and the
limits that bound every field of a request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    "FEEDBACK",  # extension: field.core.feedback
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
    #: how far one envelope's epoch may pull the clock ahead, and how fast in all
    #: (epochs per second of the Field's age): see field/contract/clock.py
    max_epoch_skew: int = 2**20
    max_epoch_rate: int = 2**16
    max_subscriptions_per_agent: int = 100
    #: active subscriptions one RAP thread (``group_id``) may hold
    max_subscriptions_per_thread: int = 32
    max_debounce_ms: int = 3_600_000
    #: seconds of inactivity after which every subscription of the agent expires, at most
    #: (``--max-subscription-timeout``); 0: no Field-wide bound
    max_subscription_timeout_s: int = 0
    max_replay_events: int = 1000
    max_compact_units: int = 1000
    #: bounds on every JSON document the Field parses, checked before anything reads it
    max_json_depth: int = 32
    max_json_items: int = 10_000
    #: bounds on what one read returns (pages are cut to fit, saying what was left out);
    #: a response body is at most as large as a request body: what a maximal read
    #: costs everyone else grows with it (benchmarks/README.md, "Large reads")
    max_response_bytes: int = 1 << 20
    max_page_items: int = 1000

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


# -- the log's entries: what every operation produces and the log stores ----------


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One state change, before it has a position."""

    epoch: int
    kind: str
    data: dict[str, Any]
    agent_id: str | None = None
    ts: float = 0.0


@dataclass(slots=True)
class StoredEntry:
    """One state change as stored in the log (never changed once read: not frozen only
    because a frozen dataclass costs 0.5 us more to build, and replays build millions)."""

    position: int
    epoch: int
    kind: str
    data: dict[str, Any]
    agent_id: str | None
    ts: float
