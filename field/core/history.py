"""REPLAY and COMPACT: reading a chain back from the log, and aging memory out.

REPLAY (spec 6.8) rebuilds the timeline of a unit, decision, conflict,
task or session *from the log*: the state's
:class:`~field.core.entities.EntityIndex` names the log positions of the
entries about every entity and the links between them, a walk over those
links gives the causal chain, and the Field's log reader returns exactly
those entries. The core does no I/O: the reader is a callable the
service wires to its :class:`~field.store.base.EventLog`.

COMPACT (spec 6.9) never touches the log. ``archive`` marks units
``archived`` (hidden from ATTUNE unless the scope asks), ``summarize``
records ``synthesis`` units over groups of originals and archives them,
``purge`` removes units from the active store and leaves a tombstone
entry ``memory.purged`` in the log. What a strategy does to a unit of
each status is one table, :data:`COMPACT_TRANSITIONS`. Like superseding,
compacting another agent's unit needs at least its author's authority
(:func:`~field.core.authority.may_supersede`); other units are left alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson

from ..contract.clock import iso_timestamp
from ..contract.errors import Code, NotFound, OperationalError, StateError
from ..contract.model import (
    UNIT_STATUSES,
    UNRESOLVED_CONFLICT_STATUSES,
    Limits,
    LogEntry,
    StoredEntry,
)
from ..contract.text import shorten
from ..ranking.relevance import STATUS_CODE, TYPE_CODE
from . import sessions, validation, visibility
from .authority import AUDIT, SENIOR, SESSION_CREATOR, may_supersede, require
from .context import Context, Outcome
from .entities import Entity, entities_of
from .state import FieldState, tombstone

if TYPE_CHECKING:
    from .field import Field


class ReadEntries(Protocol):
    """Reads the log entries at the given positions (ascending; see EventLog.read_positions)."""

    def __call__(
        self, positions: Sequence[int], *, max_bytes: int | None = None
    ) -> list[StoredEntry]: ...


#: What one REPLAY may read of the log, as a multiple of ``max_response_bytes``: the
#: decoding runs in the writer, and a chain of thousands of 64 KB units must not hold it.
READ_BUDGET_SCALE = 8

#: A summary REPLAY walks and reads up to this many times ``max_replay_events``.
SUMMARY_SCALE = 10
#: Events of the target itself a summary timeline keeps: the first and last half of these.
SUMMARY_KEY_EVENTS = 20
#: Originals summarized by one synthesis unit.
SYNTHESIS_GROUP = 16
DESCRIPTION_CHARS = 160
#: Agents a summary's text names.
SUMMARY_AGENTS = 20

#: Authority each COMPACT strategy needs (spec 11.2): purging destroys, so it takes more.
COMPACT_AUTHORITY: dict[str, int] = {
    "archive": SENIOR,
    "summarize": SENIOR,
    "purge": SESSION_CREATOR,
}

#: strategy -> {status of a matching unit -> its status afterwards}. A unit whose
#: status is absent is left alone ("archived" units are not archived again).
COMPACT_TRANSITIONS: dict[str, dict[str, str]] = {
    "archive": {s: "archived" for s in UNIT_STATUSES if s != "archived"},
    "summarize": {s: "archived" for s in UNIT_STATUSES if s != "archived"},
    "purge": {s: "purged" for s in UNIT_STATUSES},
}

_TARGET_KIND = {
    "memory_unit": "unit",
    "decision": "unit",
    "conflict": "conflict",
    "task": "task",
    "session": "session",
}
_NOT_FOUND = {
    "unit": Code.UNIT_NOT_FOUND,
    "conflict": Code.CONFLICT_NOT_FOUND,
    "task": Code.TASK_NOT_FOUND,
    "session": Code.SESSION_NOT_FOUND,
}
_HOPS = {"detailed": 1, "full_trace": None, "summary": None}


# -- REPLAY --------------------------------------------------------------------


def replay(field: Field, ctx: Context) -> Outcome:
    """REPLAY: the timeline of the target's causal chain, read from the log."""
    request = validation.replay_payload(ctx.envelope.payload, field.limits)
    assert ctx.agent is not None  # guaranteed by handle(): REPLAY is authenticated
    require(ctx.agent.authority, AUDIT, "REPLAY")
    state = field.state
    root = _root(state, request["target_type"], request["target_id"])
    if not visibility.entity_visible(state, ctx.agent, *root):
        raise NotFound(
            f"no {request['target_type']} {request['target_id']!r} that you may see",
            code=_NOT_FOUND[root[0]],
            suggested_action="Replay what the Field shows you: sessions you are in, units "
            "and tasks recorded in them or outside any session.",
        )
    depth = request["depth"]
    bound = field.limits.max_replay_events
    walk_limit = bound * SUMMARY_SCALE if depth == "summary" else bound
    chain, complete = state.history.walk(root, hops=_HOPS[depth], limit=walk_limit)
    positions = sorted({p for entity in chain for p in state.history.positions(entity)})
    if depth != "summary" and (not complete or len(positions) > bound):
        raise _too_large(request, f"has more than {bound} events", max_replay_events=bound)
    if field.read_entries is None:
        raise OperationalError(
            "this Field has no event log to read REPLAY from",
            code=Code.UNSUPPORTED_OPERATION,
        )
    read = positions if depth != "summary" else positions[: bound * SUMMARY_SCALE]
    budget = field.limits.max_response_bytes * READ_BUDGET_SCALE
    entries = field.read_entries(read, max_bytes=budget)
    if len(entries) < len(read):  # the chain's entries hold more than one REPLAY reads
        if depth != "summary":
            reason = f"holds more than the {budget} bytes of events one REPLAY reads"
            raise _too_large(request, reason, max_read_bytes=budget)
        read = read[: len(entries)]
    # what the caller may not see leaves no trace (spec 11.3), not even a count
    hidden = len(entries)
    entries = [e for e in entries if visibility.entry_visible(state, ctx.agent, e.data)]
    hidden -= len(entries)
    agents = sorted({e.agent_id for e in entries if e.agent_id is not None})
    if depth == "summary":
        own = set(_key_positions(state.history.positions(root)))
        shown = [e for e in entries if e.position in own]
    else:
        shown = entries
    if not complete:
        cut = (
            f" (The chain is larger: only its first {len(chain)} units and conflicts were walked.)"
        )
    elif len(read) < len(positions):
        cut = f" (Only the first {len(read)} events of the chain were read.)"
    else:
        cut = ""
    response = {
        "status": "ok",
        "timeline": [_event(entry) for entry in shown],
        "summary": _summary(state, request, chain, entries, agents, len(positions) - hidden) + cut,
        # a summary reads up to 10x more events: it lists as many agents as a timeline can
        "agents_involved": agents[:bound],
        "total_events": len(positions) - hidden,
        "epoch": ctx.epoch,
    }
    _check_size(response, field.limits, request)
    return Outcome(response)


def _check_size(response: dict[str, Any], limits: Limits, request: dict[str, Any]) -> None:
    """REPLAY_TOO_LARGE for a response past ``max_response_bytes``.

    A summary never is under the default limits (20 events, 1,000 agent ids);
    a timeline of ``max_replay_events`` events of about 400 bytes each neither,
    unless its ids and quoted contents are long.
    """
    size = len(orjson.dumps(response))
    if size <= limits.max_response_bytes:
        return
    bound = limits.max_response_bytes
    reason = f"would take {size} bytes, more than the {bound} a response may"
    raise _too_large(request, reason, max_response_bytes=bound)


def _too_large(request: dict[str, Any], reason: str, **details: int) -> StateError:
    """REPLAY_TOO_LARGE: the timeline ``request`` asks for ``reason``; ``details`` the bound."""
    return StateError(
        f"the {request['depth']} timeline of {request['target_type']} {request['target_id']} "
        + reason,
        code=Code.REPLAY_TOO_LARGE,
        recoverable=True,
        suggested_action='Use depth "summary", or "detailed" for a "full_trace".',
        details=details,
    )


def _root(state: FieldState, target_type: str, target_id: str) -> Entity:
    """The entity REPLAY starts from, or the *_NOT_FOUND error of its type."""
    kind = _TARGET_KIND[target_type]
    root = (kind, target_id)
    if kind == "unit":
        unit = state.known_units.get(target_id)
        if unit is None:
            raise NotFound(
                f"no memory unit {target_id!r} in this Field",
                code=Code.UNIT_NOT_FOUND,
                suggested_action="Replay a unit id the Field returned.",
            )
        if target_type == "decision" and unit["type"] != "decision":
            raise NotFound(
                f"memory unit {target_id!r} is a {unit['type']}, not a decision",
                code=Code.UNIT_NOT_FOUND,
                suggested_action='Replay it with target_type "memory_unit".',
            )
    elif kind == "conflict" and target_id not in state.conflicts:
        raise NotFound(
            f"no conflict {target_id!r} in this Field",
            code=Code.CONFLICT_NOT_FOUND,
            suggested_action="List conflicts with DETECT mode list.",
        )
    elif kind == "task" and target_id not in state.tasks and not state.history.known(root):
        raise NotFound(
            f"no task {target_id!r} in this Field",
            code=Code.TASK_NOT_FOUND,
            suggested_action="Replay a task the Field knows of.",
        )
    elif kind == "session" and target_id not in state.sessions and not state.history.known(root):
        raise NotFound(
            f"no session {target_id!r} in this Field",
            code=Code.SESSION_NOT_FOUND,
            suggested_action="Replay a session the Field knows of.",
        )
    return root


def _key_positions(positions: list[int]) -> list[int]:
    """The target's own events a summary shows: all, or the first and last ones."""
    if len(positions) <= SUMMARY_KEY_EVENTS:
        return positions
    half = SUMMARY_KEY_EVENTS // 2
    return positions[:half] + positions[-half:]


def _event(entry: StoredEntry) -> dict[str, Any]:
    """One ReplayEvent (spec 6.8)."""
    about = entities_of(entry.data)
    unit_id = next((i for kind, i in about if kind == "unit"), None)
    task_id = next((i for kind, i in about if kind == "task"), None)
    return {
        "epoch": entry.epoch,
        "event_type": entry.kind,
        "agent_id": entry.agent_id or "field",
        "description": describe(entry),
        "memory_unit_id": unit_id,
        "task_id": task_id,
    }


def describe(entry: StoredEntry) -> str:
    """A one-line human-readable account of a log entry."""
    data, actor = entry.data, entry.agent_id or "the Field"
    unit = data.get("unit")
    if entry.kind == "memory.recorded" and isinstance(unit, dict):
        return f"{actor} recorded {unit['type']} {unit['id']}: {_short(unit['content'])}"
    if entry.kind == "memory.superseded":
        return f"{data['memory_unit_id']} was superseded by {data['by']}"
    if entry.kind == "memory.contested":
        return f"{data['memory_unit_id']} was contested by {data['conflict_id']}"
    if entry.kind == "memory.archived":
        return f"{actor} archived {data['memory_unit_id']} ({data['reason']})"
    if entry.kind == "memory.purged":
        return f"{actor} purged {data['memory_unit_id']} ({data['reason']})"
    conflict = data.get("conflict")
    if entry.kind == "conflict.detected" and isinstance(conflict, dict):
        return (
            f"conflict {conflict['id']} between {conflict['unit_a']} and {conflict['unit_b']}: "
            + _short(conflict["description"])
        )
    named = ", ".join(f"{kind} {i}" for kind, i in entities_of(data))
    return f"{entry.kind} by {actor}" + (f" ({named})" if named else "")


def _summary(
    state: FieldState,
    request: dict[str, Any],
    chain: list[Entity],
    entries: list[StoredEntry],
    agents: list[str],
    total: int,
) -> str:
    kind, target_id = _TARGET_KIND[request["target_type"]], request["target_id"]
    if kind == "unit":
        unit = state.known_units[target_id]
        head = f"{unit['type']} {target_id} by {unit['source']['agent_id']}, now {unit['status']}"
        if "content" in unit:
            head += f': "{_short(unit["content"], 120)}"'
    elif kind == "conflict":
        conflict = state.conflicts[target_id]
        head = (
            f"conflict {target_id} ({conflict['type']}, {conflict['status']}) between "
            f"{conflict['unit_a']} and {conflict['unit_b']}"
        )
    else:
        head = f"{kind} {target_id}"
    if not entries:
        return head + ". No events."
    units = sum(1 for e in chain if e[0] == "unit")
    conflicts = sum(1 for e in chain if e[0] == "conflict")
    kinds = Counter(e.kind for e in entries)
    counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    text = (
        f"{head}. {total} event{'s' if total != 1 else ''} from epoch {entries[0].epoch} to "
        f"{entries[-1].epoch} over {units} unit{'s' if units != 1 else ''} and {conflicts} "
        f"conflict{'s' if conflicts != 1 else ''}, by {_named(agents)}: {counts}."
    )
    return text


def _named(agents: list[str]) -> str:
    """The agents a summary names: the first :data:`SUMMARY_AGENTS`, then how many more."""
    if not agents:
        return "no agent"
    named = ", ".join(agents[:SUMMARY_AGENTS])
    more = len(agents) - SUMMARY_AGENTS
    return named + (f" and {more} more" if more > 0 else "")


def _short(text: str, limit: int = DESCRIPTION_CHARS) -> str:
    return shorten(text, limit)


# -- COMPACT -------------------------------------------------------------------


def compact(field: Field, ctx: Context) -> Outcome:
    """COMPACT: archive, summarize or purge the units a filter matches."""
    request = validation.compact_payload(ctx.envelope.payload, field.limits)
    assert ctx.agent is not None  # guaranteed by handle(): COMPACT is authenticated
    strategy = request["strategy"]
    require(ctx.agent.authority, COMPACT_AUTHORITY[strategy], f"COMPACT {strategy}")
    if strategy == "summarize" and ctx.envelope.session_id is not None:
        # the synthesis units go into that session: as for RECORD, members only
        sessions.require_active_member(
            field.state, ctx.agent.id, ctx.envelope.session_id, "summarizing into it"
        )
    # only units the caller sees (the others do not exist for it), not in an unresolved
    # conflict and that it may take out of ATTUNE (its own, or recorded at no more than its
    # authority): the others are left alone, and counted as skipped
    state = field.state
    in_conflict = _in_unresolved_conflicts(state)
    matching = []
    skipped = {"in_conflict": 0, "authority": 0}
    for unit in _matching(state, request, ctx.epoch):
        if not visibility.unit_visible(state, ctx.agent, unit):
            continue
        if unit["id"] in in_conflict:
            skipped["in_conflict"] += 1
        elif not may_supersede(state, ctx.agent, unit):
            skipped["authority"] += 1
        else:
            matching.append(unit)
    chosen = matching[: field.limits.max_compact_units]
    entries: list[LogEntry] = []
    created = 0
    reclaimed = 0
    actor = ctx.agent.id
    if strategy == "archive":
        for unit in chosen:
            entries.append(_archived(ctx, actor, unit["id"], "archived by COMPACT"))
    elif strategy == "summarize":
        for group in _groups(chosen):
            synthesis = _synthesis(field, ctx, group)
            entries.append(
                LogEntry(ctx.epoch, "memory.recorded", {"unit": synthesis}, actor, ctx.now)
            )
            created += 1
            reason = f"summarized by COMPACT into {synthesis['id']}"
            entries.extend(_archived(ctx, actor, unit["id"], reason) for unit in group)
    else:
        purged_at = iso_timestamp(ctx.now)
        for unit in chosen:
            data = {
                "memory_unit_id": unit["id"],
                "reason": f"purged by COMPACT ({actor})",
                "purged_at": purged_at,
            }
            entries.append(LogEntry(ctx.epoch, "memory.purged", data, actor, ctx.now))
            reclaimed += len(orjson.dumps(unit)) - len(orjson.dumps(tombstone(unit)))
    response = {
        "status": "ok",
        "units_affected": len(chosen),
        "synthesis_units_created": created,
        "storage_reclaimed_bytes": reclaimed,
        "units_remaining": len(matching) - len(chosen),
        "units_skipped": skipped,
        "epoch": ctx.epoch,
    }
    return Outcome(response, entries)


def _archived(ctx: Context, actor: str, unit_id: str, reason: str) -> LogEntry:
    data = {"memory_unit_id": unit_id, "reason": reason}
    return LogEntry(ctx.epoch, "memory.archived", data, actor, ctx.now)


def _in_unresolved_conflicts(state: FieldState) -> set[str]:
    """The units in an unresolved conflict: never compacted, since resolving the
    conflict needs them as they are."""
    return {
        conflict[key]
        for conflict in state.conflicts.values()
        if conflict["status"] in UNRESOLVED_CONFLICT_STATUSES
        for key in ("unit_a", "unit_b")
    }


def _matching(state: FieldState, request: dict[str, Any], epoch: int) -> list[dict[str, Any]]:
    """Units the filter matches that the strategy changes, oldest first."""
    transitions = COMPACT_TRANSITIONS[request["strategy"]]
    age = request["max_age_epochs"]
    types, statuses = set(request["types"]), set(request["status"])
    # the index's columns choose the rows; only those units are read (they are held encoded)
    index = state.index
    wanted = [STATUS_CODE[s] for s in transitions if not statuses or s in statuses]
    mask = np.isin(index.status.view, wanted)
    if age is not None:
        mask &= index.epoch.view <= epoch - age
    if types:
        mask &= np.isin(index.memory_type.view, [TYPE_CODE[t] for t in types])
    found = []
    for row in np.flatnonzero(mask).tolist():
        unit = state.units[index.ids[row]]
        if (
            request["session_id"] is not None
            and unit["source"]["session_id"] != request["session_id"]
        ):
            continue
        found.append(unit)
    found.sort(key=lambda unit: unit["epoch"])
    return found


def _groups(units: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Originals grouped by (session, task, type), oldest first, at most SYNTHESIS_GROUP each."""
    by_key: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for unit in units:
        key = (
            unit["source"]["session_id"] or "",
            unit["intent"].get("task_id") or "",
            unit["type"],
        )
        by_key.setdefault(key, []).append(unit)
    return [
        members[start : start + SYNTHESIS_GROUP]
        for members in by_key.values()
        for start in range(0, len(members), SYNTHESIS_GROUP)
    ]


def _synthesis(field: Field, ctx: Context, group: list[dict[str, Any]]) -> dict[str, Any]:
    """A synthesis unit standing for ``group``, related to each original by ``caused_by``."""
    assert ctx.agent is not None
    first = group[0]
    task_id = first["intent"].get("task_id")
    scores = [u["confidence"]["score"] for u in group if "score" in (u.get("confidence") or {})]
    lines = [
        f"- {u['id']} ({u['source']['agent_id']}, epoch {u['epoch']}): {_short(u['content'], 240)}"
        for u in group
    ]
    where = "".join(
        f", {label} {value}"
        for label, value in (("task", task_id), ("session", first["source"]["session_id"]))
        if value
    )
    content = f"Summary of {len(group)} {first['type']} units{where}:\n" + "\n".join(lines)
    return {
        "id": field.new_id("mem"),
        "mode": "committed",
        "type": "synthesis",
        "content": content[: field.limits.max_content_chars],
        "intent": {
            "purpose": f"COMPACT summarize: stands for {len(group)} archived units",
            "task_id": task_id,
            "question": None,
        },
        "confidence": {
            "score": round(math.fsum(scores) / len(scores), 6) if scores else 0.5,
            "reasoning": "the mean confidence of the summarized units",
        },
        "relations": [
            {"type": "caused_by", "target_id": u["id"], "description": "summarized original"}
            for u in group
        ],
        "source": {
            "agent_id": ctx.agent.id,
            "agent_role": ctx.agent.role,
            "session_id": ctx.envelope.session_id,
            "timestamp": iso_timestamp(ctx.now),
        },
        "status": "active",
        "epoch": ctx.epoch,
    }
