"""Conflicts: their lifecycle (spec 7.1), MERGE (spec 6.6) and DETECT (spec 6.5).

The lifecycle is data: :data:`TRANSITIONS` maps a conflict status to the
statuses it may move to and the authority (spec 11.2) each move needs.
Nothing else decides whether a move is legal; MERGE, the docs and the
tests all read this table. A MERGE asks for a *path* of moves (its
strategy and the conflict's status give it, :func:`path_of`); every move
of the path must be in the table, or the MERGE is refused with
INVALID_TRANSITION and changes nothing.

Invariants, kept by the handlers and relied on by the projection:

* a conflict's status changes only through ``conflict.transitioned`` and
  ``conflict.resolved`` entries, one per move, so the log shows the path
  (a deterministic strategy writes detected → resolving, then resolved);
* ``resolving`` means a vote is open: a deterministic strategy passes
  through it within one MERGE, so nothing else ever rests there;
* a resolved conflict supersedes its loser (both originals, in
  synthesis), and its winner returns from ``contested`` to ``active``
  once no other unresolved conflict involves it;
* a pair of units has at most one unresolved conflict from detection.

DETECT ``check`` and ``scan`` find conflicts nobody declared (semantic and
temporal detection below). Similarity is computed as block matrix
products over unit vectors; only the pairs above the threshold leave
numpy, and the work per call is capped by :data:`MAX_SCAN_UNITS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson

from ..contract.clock import iso_timestamp
from ..contract.errors import Code, InvalidPayload, NotFound, StateError
from ..contract.model import UNRESOLVED_CONFLICT_STATUSES, LogEntry
from ..contract.text import shorten
from ..ranking.embedding import Vectors
from ..ranking.relevance import STATUS_CODE, TYPE_CODE
from . import authority, listing, sessions, validation, visibility
from .context import Context, Outcome

if TYPE_CHECKING:
    from .field import Field
    from .state import AgentRecord, FieldState

# -- the lifecycle -------------------------------------------------------------------

#: status -> {status it may move to: authority the move needs} (spec 7.1, 11.2)
TRANSITIONS: dict[str, dict[str, int]] = {
    "detected": {"resolving": authority.SENIOR, "escalated": authority.SENIOR},
    "resolving": {"resolved": authority.SENIOR, "escalated": authority.SENIOR},
    "escalated": {"resolved": authority.OPERATOR},
    "resolved": {},
}
#: Strategies that pick the winner from the units themselves.
COMPUTED = ("last_write_wins", "confidence_weighted", "evidence_count")
#: Strategies that settle a conflict in one MERGE.
DETERMINISTIC = (*COMPUTED, "authority", "synthesis")
#: Authority that casts a ballot into an open vote (opening one is a MERGE: senior).
BALLOT_AUTHORITY = authority.STANDARD
#: Ballots that close a vote when the opening MERGE names no quorum.
DEFAULT_QUORUM = 3
#: Unit statuses that still stand in a conflict: scanned by DETECT, counted as support.
STANDING = ("active", "contested")


def path_of(status: str, strategy: str, *, ballot_closes: bool = False) -> list[str]:
    """The statuses a MERGE with ``strategy`` moves a conflict in ``status`` through."""
    if strategy == "human_escalation":
        return ["escalated"]
    if strategy == "vote":
        if status == "resolving":  # a ballot into the open vote
            return ["resolved"] if ballot_closes else []
        return ["resolving"]
    if status == "detected":
        return ["resolving", "resolved"]
    return ["resolved"]


def check_path(conflict: dict[str, Any], strategy: str, path: list[str]) -> list[int]:
    """The authority each move of ``path`` needs; INVALID_TRANSITION if one is not allowed."""
    needs, current = [], conflict["status"]
    for target in path:
        allowed = TRANSITIONS[current]
        if target not in allowed:
            raise StateError(
                f"conflict {conflict['id']} is {current}: strategy {strategy} would move it "
                f"to {target}, which the conflict lifecycle does not allow",
                code=Code.INVALID_TRANSITION,
                recoverable=False,
                suggested_action=_transition_advice(current),
                details={
                    "from": current,
                    "to": target,
                    "strategy": strategy,
                    "allowed": sorted(allowed),
                },
            )
        needs.append(allowed[target])
        current = target
    return needs


def _transition_advice(status: str) -> str:
    if status == "resolved":
        return "The conflict is already resolved; read its resolution with DETECT list."
    if status == "escalated":
        return "Only the operator resolves an escalated conflict, with a deterministic strategy."
    return "Check the conflict's status with DETECT list and pick a strategy it allows."


# -- MERGE -----------------------------------------------------------------------------


def conflict_session(state: FieldState, conflict: dict[str, Any]) -> str | None:
    """The session a conflict is within: the one both its units were recorded in; None if
    they were recorded in different sessions or outside any."""
    sessions_of = {
        (state.known_units.get(unit_id) or {}).get("source", {}).get("session_id")
        for unit_id in (conflict["unit_a"], conflict["unit_b"])
    }
    return sessions_of.pop() if len(sessions_of) == 1 else None


def merge(field: Field, ctx: Context) -> Outcome:
    """MERGE: resolve, escalate or vote on a conflict (spec 6.6)."""
    request = validation.merge_payload(ctx.envelope.payload, field.limits)
    assert ctx.agent is not None  # guaranteed by handle(): MERGE is authenticated
    agent = ctx.agent
    state = field.state
    conflict = state.conflicts.get(request["conflict_id"])
    if conflict is None or not visibility.conflict_visible(state, agent, conflict):
        raise NotFound(
            f"no conflict {request['conflict_id']!r} in this Field",
            code=Code.CONFLICT_NOT_FOUND,
            suggested_action="List conflicts with DETECT mode list.",
        )
    strategy = request["strategy"]
    voting = strategy == "vote" and "vote" in conflict  # a ballot, once a vote was opened
    need = BALLOT_AUTHORITY if voting else authority.SENIOR
    # in the session both units belong to, its creator acts at 8, as everywhere in it
    level = authority.effective_authority(state, agent, conflict_session(state, conflict))
    authority.require(level, need, "casting a ballot" if voting else "MERGE")
    winner = request["winner_id"]
    if winner is not None and winner not in (conflict["unit_a"], conflict["unit_b"]):
        raise InvalidPayload(
            f"resolution.winner_id {winner!r} is not a unit of conflict {conflict['id']}",
            suggested_action=f"Name {conflict['unit_a']} or {conflict['unit_b']}.",
        )
    merger = _Merge(field, ctx, conflict, request)
    if voting and conflict["status"] == "resolving":
        return merger.ballot()
    path = path_of(conflict["status"], strategy)
    for step, needed in zip(path, check_path(conflict, strategy, path), strict=True):
        authority.require(level, needed, f"moving a conflict to {step}")
    if strategy == "human_escalation":
        return merger.escalate()
    if strategy == "vote":
        return merger.open_vote()
    if strategy == "synthesis":
        if ctx.envelope.session_id is not None:  # the new unit goes into that session
            sessions.require_active_member(
                state, agent.id, ctx.envelope.session_id, "recording a synthesis"
            )
        return merger.resolve(None, synthesis=request["synthesis"])
    if strategy == "authority":
        return merger.resolve(winner)
    computed = _computed_winner(state, conflict, strategy)
    if winner is not None and winner != computed:
        raise StateError(
            f"strategy {strategy} picks {computed}, not the winner_id given ({winner})",
            code=Code.MERGE_FAILED,
            suggested_action="Leave winner_id out, or use strategy authority to name the winner.",
            details={"computed_winner_id": computed},
        )
    return merger.resolve(computed)


class _Merge:
    """The entries and the response of one MERGE."""

    def __init__(
        self, field: Field, ctx: Context, conflict: dict[str, Any], request: dict[str, Any]
    ) -> None:
        assert ctx.agent is not None
        self.field = field
        self.state = field.state
        self.ctx = ctx
        self.agent_id = ctx.agent.id
        self.conflict = conflict
        self.request = request
        self.entries: list[LogEntry] = []

    def _entry(self, kind: str, data: dict[str, Any]) -> None:
        self.entries.append(LogEntry(self.ctx.epoch, kind, data, self.agent_id, self.ctx.now))

    def _move(self, status: str, target: str, **extra: Any) -> dict[str, Any]:
        data = {
            "conflict_id": self.conflict["id"],
            "from": status,
            "to": target,
            "strategy": self.request["strategy"],
            "by": self.agent_id,
            "rationale": self.request["rationale"],
            "epoch": self.ctx.epoch,
            **extra,
        }
        self._entry("conflict.transitioned", data)
        return data

    def _outcome(
        self,
        status: str,
        conflict: dict[str, Any],
        *,
        superseded: list[str] | None = None,
        new_unit_id: str | None = None,
    ) -> Outcome:
        notified: list[str] = []
        if status == "resolved":
            authors = (self.state.units[conflict[k]]["source"]["agent_id"] for k in UNIT_KEYS)
            notified = sorted(set(authors))
        response = {
            "status": status,
            "conflict": conflict,
            "side_effects": {
                "superseded_units": superseded or [],
                "new_unit_id": new_unit_id,
                "notified_agents": notified,
            },
            "epoch": self.ctx.epoch,
        }
        return Outcome(response, self.entries)

    def escalate(self) -> Outcome:
        status = self.conflict["status"]
        self._move(status, "escalated")
        escalation = {
            "escalated_by": self.agent_id,
            "rationale": self.request["rationale"],
            "epoch": self.ctx.epoch,
        }
        return self._outcome(
            "escalated", {**self.conflict, "status": "escalated", "escalation": escalation}
        )

    def _require_supersede(self, unit_ids: list[str], action: str) -> None:
        """The merging agent must be allowed to take each unit out of ATTUNE.

        A unit already superseded is out of it: losing changes nothing for it.
        """
        assert self.ctx.agent is not None
        for unit_id in unit_ids:
            unit = self.state.units[unit_id]
            if unit["status"] != "superseded":
                authority.require_supersede(self.state, self.ctx.agent, unit, action)

    def open_vote(self) -> Outcome:
        # either unit may lose the vote: the opener answers for both, so the
        # ballot that decides needs no authority over them
        self._require_supersede([self.conflict[k] for k in UNIT_KEYS], "opening a vote on")
        quorum = self.request["quorum"] or DEFAULT_QUORUM
        self._move(self.conflict["status"], "resolving", quorum=quorum)
        vote: dict[str, Any] = {"quorum": quorum, "opened_by": self.agent_id, "ballots": []}
        self.conflict = {**self.conflict, "status": "resolving", "vote": vote}
        return self.ballot()

    def ballot(self) -> Outcome:
        vote = self.conflict["vote"]
        if any(b["agent_id"] == self.agent_id for b in vote["ballots"]):
            raise StateError(
                f"agent {self.agent_id!r} has already voted on conflict {self.conflict['id']}",
                code=Code.MERGE_FAILED,
                recoverable=False,
                suggested_action="Each agent casts one ballot; wait for the others.",
            )
        ballot = {
            "agent_id": self.agent_id,
            "winner_id": self.request["winner_id"],
            "rationale": self.request["rationale"],
            "epoch": self.ctx.epoch,
        }
        self._entry("conflict.vote_cast", {"conflict_id": self.conflict["id"], "ballot": ballot})
        ballots = [*vote["ballots"], ballot]
        self.conflict = {**self.conflict, "vote": {**vote, "ballots": ballots}}
        winner = _vote_winner(self.conflict)
        if winner is None:
            return self._outcome("pending_vote", self.conflict)
        check_path(self.conflict, "vote", ["resolved"])
        tally = _tally(self.conflict)
        counts = ", ".join(f"{unit}: {n}" for unit, n in tally.items())
        rationale = f"vote ({counts}; quorum {vote['quorum']}): {vote_rationale(self.conflict)}"
        return self.resolve(winner, rationale=rationale, voted=True)

    def resolve(
        self,
        winner: str | None,
        *,
        synthesis: str | None = None,
        rationale: str | None = None,
        voted: bool = False,
    ) -> Outcome:
        """Resolve for ``winner`` (None: ``synthesis`` replaces both units).

        The resolver must be allowed to supersede every loser, unless a
        vote decided (``voted``): its opener was checked against both units.
        """
        conflict, state = self.conflict, self.state
        if synthesis is not None:
            losers = [conflict["unit_a"], conflict["unit_b"]]
        else:
            assert winner is not None
            losers = [conflict[k] for k in UNIT_KEYS if conflict[k] != winner]
        if not voted:
            self._require_supersede(losers, "resolving a conflict against")
        superseded = [u for u in losers if state.units[u]["status"] != "superseded"]
        status = conflict["status"]
        if status == "detected":
            self._move(status, "resolving")
            status = "resolving"
        new_unit_id = None
        if synthesis is not None:
            unit = self._synthesis_unit(synthesis)
            new_unit_id = unit["id"]
            self._entry("memory.recorded", {"unit": unit})
        by = new_unit_id or winner
        for unit_id in superseded:
            data = {"memory_unit_id": unit_id, "by": by, "conflict_id": conflict["id"]}
            self._entry("memory.superseded", data)
        resolution = {
            "strategy": self.request["strategy"],
            "winner_id": winner,
            "rationale": rationale or self.request["rationale"],
            "resolved_by": self.agent_id,
            "epoch_resolved": self.ctx.epoch,
            "synthesis_unit_id": new_unit_id,
        }
        resolved = {**conflict, "status": "resolved", "resolution": resolution}
        self._entry("conflict.resolved", {"conflict": resolved, "from": status})
        if (
            winner is not None
            and state.units[winner]["status"] == "contested"
            and _free_of_conflicts(state, winner, conflict["id"])
        ):
            data = {"memory_unit_id": winner, "conflict_id": conflict["id"]}
            self._entry("memory.reinstated", data)
        return self._outcome("resolved", resolved, superseded=superseded, new_unit_id=new_unit_id)

    def _synthesis_unit(self, content: str) -> dict[str, Any]:
        """The new ``synthesis`` unit: by the merging agent, superseding both originals."""
        conflict, units = self.conflict, self.state.units
        assert self.ctx.agent is not None
        scores = [_confidence(units[conflict[k]]) for k in UNIT_KEYS]
        relations = [
            {
                "type": "supersedes",
                "target_id": conflict[k],
                "description": f"synthesis resolving {conflict['id']}",
            }
            for k in UNIT_KEYS
        ]
        return {
            "id": self.field.new_id("mem"),
            "mode": "committed",
            "type": "synthesis",
            "content": content,
            "intent": {
                "purpose": f"Resolve conflict {conflict['id']} by synthesis",
                "task_id": None,
                "question": None,
            },
            "confidence": {
                "score": max(scores),
                "reasoning": self.request["rationale"],
                "evidence": [],
                "assumptions": [],
            },
            "relations": relations,
            "source": {
                "agent_id": self.agent_id,
                "agent_role": self.ctx.agent.role,
                "session_id": self.ctx.envelope.session_id,
                "timestamp": iso_timestamp(self.ctx.now),
            },
            "status": "active",
            "epoch": self.ctx.epoch,
        }


UNIT_KEYS = ("unit_a", "unit_b")


def _confidence(unit: dict[str, Any]) -> float:
    """A unit's confidence score (0.5 for a draft recorded without one, as in ATTUNE)."""
    score = (unit.get("confidence") or {}).get("score")
    return 0.5 if score is None else float(score)


def _supporters(state: FieldState, unit_id: str) -> int:
    """Standing units (other than itself) with a ``supports`` relation to ``unit_id``."""
    # units are held encoded: read only those whose bytes name the relation and the target
    target = orjson.dumps(unit_id)
    count = 0
    for encoded in state.units.encodings():
        if b'"supports"' not in encoded or target not in encoded:
            continue
        unit = orjson.loads(encoded)
        count += (
            unit["status"] in STANDING
            and unit["id"] != unit_id
            and any(
                r["type"] == "supports" and r["target_id"] == unit_id for r in unit["relations"]
            )
        )
    return count


_MEASURES: dict[str, Callable[[FieldState, dict[str, Any]], float]] = {
    "last_write_wins": lambda state, unit: float(unit["epoch"]),
    "confidence_weighted": lambda state, unit: _confidence(unit),
    "evidence_count": lambda state, unit: float(_supporters(state, unit["id"])),
}


def _computed_winner(state: FieldState, conflict: dict[str, Any], strategy: str) -> str:
    """The unit a computed strategy prefers; MERGE_FAILED on a tie."""
    a, b = (state.units[conflict[k]] for k in UNIT_KEYS)
    measure = _MEASURES[strategy]
    score_a, score_b = measure(state, a), measure(state, b)
    if score_a == score_b:
        raise StateError(
            f"strategy {strategy} cannot decide conflict {conflict['id']}: "
            f"both units score {score_a:g}",
            code=Code.MERGE_FAILED,
            suggested_action="Use another strategy: authority, synthesis, vote or "
            "human_escalation.",
            details={"scores": {a["id"]: score_a, b["id"]: score_b}},
        )
    return str(a["id"] if score_a > score_b else b["id"])


def _tally(conflict: dict[str, Any]) -> dict[str, int]:
    tally = {conflict[k]: 0 for k in UNIT_KEYS}
    for ballot in conflict["vote"]["ballots"]:
        tally[ballot["winner_id"]] += 1
    return tally


def _vote_winner(conflict: dict[str, Any]) -> str | None:
    """The winner once quorum ballots are in and one unit leads; None while pending."""
    vote = conflict["vote"]
    if len(vote["ballots"]) < vote["quorum"]:
        return None
    (a, votes_a), (b, votes_b) = _tally(conflict).items()
    if votes_a == votes_b:
        return None  # a tie at quorum waits for another ballot
    return a if votes_a > votes_b else b


def vote_rationale(conflict: dict[str, Any]) -> str:
    """The rationale of the ballot that opened the vote."""
    return str(conflict["vote"]["ballots"][0]["rationale"])


def _free_of_conflicts(state: FieldState, unit_id: str, except_id: str) -> bool:
    """No unresolved conflict other than ``except_id`` involves ``unit_id``."""
    return not any(
        c["id"] != except_id
        and c["status"] in UNRESOLVED_CONFLICT_STATUSES
        and unit_id in (c["unit_a"], c["unit_b"])
        for c in state.conflicts.values()
    )


# -- DETECT ----------------------------------------------------------------------------

#: Cosine similarity from which two units are the same claim (semantic detection).
SEMANTIC_THRESHOLD = 0.80
#: Lower bar when the older unit is established and more confident (temporal detection).
TEMPORAL_THRESHOLD = 0.65
#: Confidence from which an active unit is established.
ESTABLISHED_CONFIDENCE = 0.7
#: Most units one check or scan compares (the newest ones in scope).
MAX_SCAN_UNITS = 4096
#: Most conflicts one check or scan creates (the most similar pairs first).
MAX_NEW_CONFLICTS = 100
#: Rows of one block of the similarity matrix (BLOCK_ROWS x MAX_SCAN_UNITS floats).
BLOCK_ROWS = 256
#: Types that make no claim to contradict.
NON_CLAIM_TYPES = frozenset({"question", "intention", "contradiction"})
_STANDING_CODES = np.array([STATUS_CODE[s] for s in sorted(STANDING)], dtype=np.int8)
_NON_CLAIM_CODES = np.array([TYPE_CODE[t] for t in sorted(NON_CLAIM_TYPES)], dtype=np.int8)
DETECTION_AUTHORITY = authority.STANDARD

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_WORD = re.compile(r"[a-z]+(?:'t)?")
_NEGATIONS = frozenset({"not", "no", "never", "cannot", "none", "neither", "nor", "without"})


def vectors_for(state: FieldState, unit_ids: list[str]) -> Vectors:
    """Unit-length content vectors of ``unit_ids`` (one row each, in order).

    Read from the unit index's stored embeddings (a unit not embedded yet
    is embedded for the check: :meth:`~field.ranking.relevance.UnitIndex.rows_vectors`);
    rows with no features stay zero (they are similar to nothing).
    """
    index = state.index
    rows = np.array([index.rows[unit_id] for unit_id in unit_ids], dtype=np.intp)
    vectors, squares = index.rows_vectors(rows)
    vectors = vectors.astype(np.float32)
    norms = np.sqrt(squares).astype(np.float32)[:, None]
    np.divide(vectors, norms, out=vectors, where=norms > 0)
    return vectors


def numbers_of(text: str) -> frozenset[float]:
    """The numbers a text states ("1,000" and "1000" are one number)."""
    found = set()
    for match in _NUMBER.findall(text):
        cleaned = match.replace(",", "")
        try:
            found.add(float(cleaned))
        except ValueError:  # "1.2.3": a version, not a quantity
            continue
    return frozenset(found)


def negated(text: str) -> bool:
    """Whether a text negates its claim: an odd number of negations."""
    normalized = text.lower().replace("\u2019", "'")
    count = sum(w in _NEGATIONS or w.endswith("n't") for w in _WORD.findall(normalized))
    return bool(count % 2 == 1)


def detect(field: Field, ctx: Context) -> Outcome:
    """DETECT: list known conflicts, or check one unit or scan the Field for new ones."""
    request = validation.detect_payload(ctx.envelope.payload, field.limits)
    assert ctx.agent is not None  # guaranteed by handle(): DETECT is authenticated
    if request["mode"] == "list":
        return _listed(field, ctx, request)
    authority.require(ctx.agent.authority, DETECTION_AUTHORITY, f"DETECT {request['mode']}")
    state = field.state
    target = request["target_id"]
    if (
        target is not None
        and request["mode"] == "check"
        and (
            target not in state.units
            or not visibility.unit_visible(state, ctx.agent, state.units[target])
        )
    ):
        raise NotFound(
            f"no memory unit {target!r} in this Field",
            code=Code.UNIT_NOT_FOUND,
            suggested_action="Check a unit id the Field returned.",
        )
    check = target if request["mode"] == "check" else None
    scope, in_scope = _scope(state, ctx.agent, exclude=check)
    found = _find(state, scope, check, request["involving_agents"])
    entries, new = _new_conflicts(field, ctx, found)
    if check is not None:
        known = [
            c
            for c in field.list_conflicts(
                ctx.agent, statuses=request["status"], types=request["types"]
            )
            if check in (c["unit_a"], c["unit_b"])
        ]
        conflicts = known + [c for c in new if _matches(c, request)]
    else:
        conflicts = [c for c in new if _matches(c, request)]
    coverage = {
        "units_scanned": len(scope) if check is None or _standing(state, check) else 0,
        "new_conflicts_found": len(new),
        "units_in_scope": in_scope,
    }
    response = {
        "status": "ok",
        "conflicts": conflicts,
        "scan_coverage": coverage,
        "epoch": ctx.epoch,
    }
    return Outcome(response, entries)


def _listed(field: Field, ctx: Context, request: dict[str, Any]) -> Outcome:
    """DETECT list: a page of the conflicts the caller may see that match the filter."""
    assert ctx.agent is not None  # guaranteed by handle(): DETECT is authenticated
    body: dict[str, Any] = {
        "status": "ok",
        "conflicts": [],
        "scan_coverage": {"units_scanned": 0, "new_conflicts_found": 0},
        "next": None,
        "epoch": ctx.epoch,
    }
    candidates = listing.conflicts(
        field.state,
        ctx.agent,
        request["page"],
        statuses=request["status"],
        types=request["types"],
        involving_agents=request["involving_agents"],
    )
    page = listing.page_of(field.state, body, candidates, request["page"])
    body["conflicts"], body["next"] = page.items, page.next
    return Outcome(body)


def _matches(conflict: dict[str, Any], request: dict[str, Any]) -> bool:
    return (not request["status"] or conflict["status"] in request["status"]) and (
        not request["types"] or conflict["type"] in request["types"]
    )


def _standing(state: FieldState, unit_id: str) -> bool:
    unit = state.units[unit_id]
    return unit["status"] in STANDING and unit["type"] not in NON_CLAIM_TYPES


def _scope(state: FieldState, viewer: AgentRecord, *, exclude: str | None) -> tuple[list[str], int]:
    """The newest standing claims ``viewer`` may see (at most MAX_SCAN_UNITS), oldest first,
    and how many exist."""
    index = state.index
    mask = np.isin(index.status.view, _STANDING_CODES)
    mask &= ~np.isin(index.memory_type.view, _NON_CLAIM_CODES)
    visible = visibility.row_mask(state, viewer)
    if visible is not None:
        mask &= visible
    if exclude is not None and exclude in index.rows:
        mask[index.rows[exclude]] = False
    mask[index.scorable :] = False  # a scan covers the units embedded when it runs
    rows = np.flatnonzero(mask)
    return [index.ids[row] for row in rows[-MAX_SCAN_UNITS:].tolist()], len(rows)


def _find(
    state: FieldState, scope: list[str], check: str | None, agents: list[str]
) -> list[tuple[str, str, float, str]]:
    """New contradicting pairs (older, newer, similarity, method), most similar first."""
    if check is not None:
        if not _standing(state, check) or not scope:
            return []
        # by the index's epochs: the units are decoded once, below, not for the sort
        rows, epochs_of = state.index.rows, state.index.epoch.view
        ids = sorted([*scope, check], key=lambda u: int(epochs_of[rows[u]]))
        left = np.array([ids.index(check)])
    else:
        ids = scope
        left = np.arange(len(ids))
    if len(ids) < 2:
        return []
    units = [state.units[u] for u in ids]
    vectors = vectors_for(state, ids)
    epochs = np.array([u["epoch"] for u in units], dtype=np.int64)
    confidence = np.array([_confidence(u) for u in units])
    established = np.array(
        [u["status"] == "active" and u["mode"] == "committed" for u in units]
    ) & (confidence >= ESTABLISHED_CONFIDENCE)
    number_sets = [numbers_of(u["content"]) for u in units]
    codes: dict[frozenset[float], int] = {frozenset(): 0}
    numbers = np.array([codes.setdefault(s, len(codes)) for s in number_sets], dtype=np.int64)
    negation = np.array([negated(u["content"]) for u in units])
    wanted = set(agents)
    by_agent = np.array([not wanted or u["source"]["agent_id"] in wanted for u in units])
    position = {unit_id: i for i, unit_id in enumerate(ids)}
    known = _unresolved_pairs(state, position)

    pairs_i, pairs_j, sims = [], [], []
    for start in range(0, len(left), BLOCK_ROWS):
        block = left[start : start + BLOCK_ROWS]
        sim = vectors[block] @ vectors.T  # (block x units)
        i, j = np.nonzero(sim >= TEMPORAL_THRESHOLD)
        s = sim[i, j]
        i = block[i]
        keep = i != j
        i, j, s = i[keep], j[keep], s[keep]
        older, newer = np.minimum(i, j), np.maximum(i, j)  # rows ascend by epoch
        if check is None:
            keep = i < j  # each pair once
            older, newer, s = older[keep], newer[keep], s[keep]
        pairs_i.append(older)
        pairs_j.append(newer)
        sims.append(s)
    i, j, s = np.concatenate(pairs_i), np.concatenate(pairs_j), np.concatenate(sims)
    disagree = ((numbers[i] != numbers[j]) & (numbers[i] != 0) & (numbers[j] != 0)) | (
        negation[i] != negation[j]
    )
    temporal = established[i] & (confidence[i] > confidence[j]) & (epochs[i] < epochs[j])
    semantic = s >= SEMANTIC_THRESHOLD
    new = ~np.isin(i * len(ids) + j, known)
    keep = disagree & (temporal | semantic) & (by_agent[i] | by_agent[j]) & new
    i, j, s, temporal = i[keep], j[keep], s[keep], temporal[keep]
    order = np.lexsort((j, i, -s))[:MAX_NEW_CONFLICTS]
    return [
        (ids[i[k]], ids[j[k]], float(s[k]), "temporal" if temporal[k] else "semantic")
        for k in order.tolist()
    ]


def _unresolved_pairs(state: FieldState, position: dict[str, int]) -> npt.NDArray[np.int64]:
    """Codes ``older * n + newer`` of the scoped pairs that have an unresolved conflict."""
    n = len(position)
    codes = []
    for conflict in state.conflicts.values():
        if conflict["status"] not in UNRESOLVED_CONFLICT_STATUSES:
            continue
        a, b = position.get(conflict["unit_a"]), position.get(conflict["unit_b"])
        if a is not None and b is not None:
            codes.append(min(a, b) * n + max(a, b))
    return np.array(codes, dtype=np.int64)


def _new_conflicts(
    field: Field, ctx: Context, found: list[tuple[str, str, float, str]]
) -> tuple[list[LogEntry], list[dict[str, Any]]]:
    """``conflict.detected`` and ``memory.contested`` entries for pairs DETECT found."""
    assert ctx.agent is not None
    units = field.state.units
    entries: list[LogEntry] = []
    conflicts: list[dict[str, Any]] = []
    contested: dict[str, str] = {}
    for older, newer, similarity, method in found:
        conflict: dict[str, Any] = {
            "id": field.new_id("conflict"),
            "type": "factual",
            "status": "detected",
            "unit_a": older,
            "unit_b": newer,
            "description": _describe(units[older], units[newer], similarity, method),
            "detected_by": method,
            "epoch": ctx.epoch,
        }
        conflicts.append(conflict)
        detected = {"conflict": conflict}
        entries.append(LogEntry(ctx.epoch, "conflict.detected", detected, ctx.agent.id, ctx.now))
        contested.setdefault(older, conflict["id"])
        contested.setdefault(newer, conflict["id"])
    for unit_id, conflict_id in sorted(contested.items()):
        if units[unit_id]["status"] == "active":
            data = {"memory_unit_id": unit_id, "conflict_id": conflict_id}
            entries.append(LogEntry(ctx.epoch, "memory.contested", data, ctx.agent.id, ctx.now))
    return entries, conflicts


def _describe(older: dict[str, Any], newer: dict[str, Any], similarity: float, method: str) -> str:
    """Why DETECT flagged the pair, for people."""
    a_numbers, b_numbers = numbers_of(older["content"]), numbers_of(newer["content"])
    if a_numbers and b_numbers and a_numbers != b_numbers:
        what = f"disagree on a number ({_numbers(a_numbers)} vs {_numbers(b_numbers)})"
    else:
        what = "disagree on a negation"
    claims = f"{_shorten(older['content'])!r} vs {_shorten(newer['content'])!r}"
    if method == "temporal":
        return (
            f"newer {newer['id']} (confidence {_confidence(newer):g}) contradicts established "
            f"{older['id']} (confidence {_confidence(older):g}): similar claims "
            f"(cosine {similarity:.2f}) that {what}: {claims}"
        )
    return (
        f"{older['id']} and {newer['id']} make similar claims (cosine {similarity:.2f}) "
        f"that {what}: {claims}"
    )


def _numbers(values: frozenset[float]) -> str:
    return ", ".join(f"{v:g}" for v in sorted(values))


def _shorten(text: str, limit: int = 80) -> str:
    return shorten(text, limit)
