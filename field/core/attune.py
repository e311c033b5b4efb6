"""ATTUNE (spec 6.4): the units that matter to an agent, ranked, in a page of bounded size.

A ranking is :class:`field.ranking.relevance.Ranking`'s: every candidate
bounded over the index's columns, the matrix product only for the rows that
may make the page, in bounded steps; a poll scores its few new rows at once.
This module chooses the page and builds it; when the Field builds pages in
steps (:attr:`field.core.field.Field.sliced_reads`), the ranking's steps come
first, then the page's, and the Field may change between them: the ranking
reads what never changes, and each unit is shown as it was when ranked.

The page is walked in order, best first for a ranking and oldest first for
a poll (``since_epoch``), and each unit is taken while three bounds allow
it:

* ``max_units``, the scope's page size;
* ``max_tokens``, the scope's optional budget: a unit is taken in the
  richest form that fits (full, else summary), and the walk stops at the
  first unit that fits in neither;
* ``max_response_bytes``, the Field's: the walk stops at the first unit
  whose item would take the encoded body past it.

Whatever the walk's order, the page is returned sorted by relevance, best
first (spec 6.4 rule 4; ties in the walk's order): a poll's page is the
oldest new units, listed by relevance.

``context_budget.limited_by`` names the bound that ended the page, or is
``None`` when every matching unit was returned. A poll always takes its
first unit (so polling cannot stall), and the byte bound never leaves a
page empty: one unit is far smaller than the bound. Because a poll's
page is a prefix of the oldest new units, its ``epoch`` (that of the
newest unit taken, when some were left out; else of the newest unit held:
:func:`as_of`) lets the next poll continue with nothing lost or repeated,
whichever bound cut the page, and whichever node answers it. Units not
embedded yet (a sentence model embeds after the commit:
:attr:`~field.ranking.relevance.UnitIndex.scorable`) are no candidates, and an
ATTUNE's ``epoch`` stays below the first of them.

Sizes are measured, not guessed: each item is encoded once as it is
taken, and the rest of the body with the largest values its fields can
take (:func:`field.core.pages.room`). The work is that of the page: a
unit that is not taken is not explained, summarized or encoded.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson

from ..contract.model import Limits
from ..contract.text import first_sentence
from ..ranking import relevance
from . import pages, validation, visibility
from .context import Context, Outcome
from .state import AgentRecord, FieldState

if TYPE_CHECKING:
    from .field import Field

#: Characters of a unit's content in its summary form.
SUMMARY_CHARS = 240
#: The ``conflicts`` of a response fill at most this share of ``max_response_bytes``.
CONFLICTS_SHARE = 0.25
#: What may end a page, as ``context_budget.limited_by`` names it.
LIMITED_BY = ("max_units", "max_tokens", "max_response_bytes")

#: A page is built in steps of at most this many units, or this many bytes of items
#: (when the Field builds pages in steps: :attr:`field.core.field.Field.sliced_reads`).
STEP_UNITS = 16
STEP_BYTES = 128 << 10


def attune(field: Field, ctx: Context) -> Outcome:
    """ATTUNE: a ranked page of the units the caller may see."""
    scope = validation.attune_payload(ctx.envelope.payload, field.limits)
    assert ctx.agent is not None  # guaranteed by handle(): ATTUNE is authenticated
    state, agent = field.state, ctx.agent
    query = _query(scope, agent, state)
    index = state.index
    rows = relevance.candidates(index, query, visibility.row_mask(state, agent))
    limits = field.limits
    budget = {
        "units_returned": scope["max_units"],  # the largest values, to measure the room
        "units_available": 0,
        "tokens_used": scope["max_tokens"],
        "tokens_budget": scope["max_tokens"],
        "limited_by": "max_response_bytes",
    }
    response = {
        "status": "ok",
        "record": [],
        "conflicts": _conflicts_for(state, agent, limits),
        "context_budget": budget,
        "epoch": as_of(index, query.since_epoch),
    }
    threshold = scope["relevance_threshold"]
    recorded = len(index)
    if query.since_epoch is not None:
        # a poll: few rows, scored at once
        scores = relevance.score(index, query, rows)
        keep = scores >= threshold
        rows, scores = rows[keep], scores[keep]
        available = len(rows)
        # rows ascend by epoch: a prefix is the oldest new units, so the
        # next poll can continue exactly where this page stops
        rows, scores = rows[: scope["max_units"]], scores[: scope["max_units"]]
        budget["units_available"] = available
        room = pages.room(response, limits)
        query.look_up(rows)
        row_list = rows.tolist()
        page = _Page(
            response,
            query,
            scope,
            rows=row_list,
            scores=scores.tolist(),
            # each unit's encoding as it is now (decoded only if the page takes it)
            units=[state.units.encoded(index.ids[row]) for row in row_list],
            recorded=recorded,
            room=room,
            available=available,
        )
        steps = page.steps(index)
    else:
        ranking = relevance.Ranking(
            index, query, rows, count=scope["max_units"], threshold=threshold
        )
        # the statuses the ranking was made with: a unit's encoding is the unit as
        # recorded with its status, the one thing of it that may change meanwhile
        statuses = index.status.view.copy() if field.sliced_reads else None
        steps = _ranked_page(
            state, response, query, scope, ranking, rows, statuses, recorded=recorded, limits=limits
        )
    if field.sliced_reads:
        return Outcome(response, rest=steps)
    for _ in steps:
        pass
    return Outcome(response)


def _ranked_page(
    state: FieldState,
    response: dict[str, Any],
    query: relevance.Query,
    scope: dict[str, Any],
    ranking: relevance.Ranking,
    candidates: npt.NDArray[np.intp],
    statuses: npt.NDArray[np.int8] | None,
    *,
    recorded: int,
    limits: Limits,
) -> Iterator[None]:
    """The ranking's steps, then the page's, of a full ATTUNE.

    ``statuses`` (a copy of the units' status codes when the ranking was made, when the
    steps may run while the Field changes) gives the units as they were then: a unit
    whose status changed since is shown with its status of then, and one purged since
    is left out (its content is no longer the Field's to give).
    """
    yield from ranking.steps()
    index = state.index
    rows = candidates[ranking.positions]
    response["context_budget"]["units_available"] = ranking.available
    room = pages.room(response, limits)
    query.look_up(rows)
    row_list = rows.tolist()
    units = []
    kept = []
    for row, row_score in zip(row_list, ranking.scores.tolist(), strict=True):
        encoded = _as_ranked(state, index, row, statuses)
        if encoded is not None:
            units.append(encoded)
            kept.append((row, row_score))
    page = _Page(
        response,
        query,
        scope,
        rows=[row for row, _ in kept],
        scores=[row_score for _, row_score in kept],
        units=units,
        recorded=recorded,
        room=room,
        available=ranking.available,
    )
    yield from page.steps(index)


def _as_ranked(
    state: FieldState,
    index: relevance.UnitIndex,
    row: int,
    statuses: npt.NDArray[np.int8] | None,
) -> bytes | None:
    """The encoding of the unit of ``row`` as it was when ranked (see :func:`_ranked_page`)."""
    unit_id = index.ids[row]
    if statuses is None or index.status.view[row] == statuses[row]:
        return state.units.encoded(unit_id)
    if unit_id not in state.units:
        return None  # purged since
    unit = state.units[unit_id]
    unit["status"] = relevance.STATUS_NAMES[int(statuses[row])]
    return orjson.dumps(unit)


def as_of(index: relevance.UnitIndex, since_epoch: int | None) -> int:
    """The ``epoch`` of an ATTUNE: the newest unit its answer could hold, and for a poll
    never below ``since_epoch`` (a page cut short says the newest unit it took instead).

    Not the clock's reading: an epoch backed by the log. Units ascend by epoch in the
    index as in the log, and a unit recorded later, on any node, has a greater epoch than
    every unit before it (its writer applied them first), so a poll from this epoch gets
    every unit the answer could not hold, once. Units not embedded yet (a sentence model
    embeds after the commit) are not held yet: the epoch stays below the first of them.
    """
    scorable = index.scorable
    newest = int(index.epoch.view[scorable - 1]) if scorable else 0
    return newest if since_epoch is None else max(newest, since_epoch)


def _query(scope: dict[str, Any], agent: AgentRecord, state: FieldState) -> relevance.Query:
    return relevance.Query(
        agent_id=agent.id,
        role=scope["role"],
        interests=scope["interests"] if scope["interests"] is not None else agent.interests,
        context_hint=scope["context_hint"],
        task_id=scope["active_task_id"] or agent.current_task_id,
        recency_weight=scope["recency_weight"],
        include_own=scope["include_own"],
        since_epoch=scope["since_epoch"],
        include_archived=scope["include_archived"],
        judged=state.feedback.get(agent.id),
    )


class _Page:
    """Takes the ranked units into ``response`` in order while the bounds allow.

    It reads only what it was given when the ranking was made (the units'
    encodings then, how many units were recorded) and what never changes
    once it exists (a row's keywords and place), so the Field may go on
    changing while it is built in :meth:`steps`.
    """

    def __init__(
        self,
        response: dict[str, Any],
        query: relevance.Query,
        scope: dict[str, Any],
        *,
        rows: list[int],
        scores: list[float],
        units: list[bytes],
        recorded: int,
        room: int,
        available: int,
    ) -> None:
        self._response, self._query = response, query
        self._format, self._budget = scope["format"], scope["max_tokens"]
        self._ranked = list(zip(rows, scores, units, strict=True))
        self._recorded, self._room, self._available = recorded, room, available
        #: a poll always takes its first unit, so that polling cannot stall
        self._make_progress = scope["since_epoch"] is not None
        #: tokens of what was taken (with ``max_tokens``), bytes of its items and commas
        self.tokens = 0
        self.bytes = 0

    def steps(self, index: relevance.UnitIndex) -> Iterator[None]:
        """Build the page, pausing after every :data:`STEP_UNITS` units or
        :data:`STEP_BYTES` bytes; the response is complete once this is exhausted."""
        taken: list[tuple[float, dict[str, Any], dict[str, Any]]] = []  # score, unit, item
        stopped_by = None
        step_units = step_bytes = 0
        for row, row_score, encoded in self._ranked:
            if step_units >= STEP_UNITS or step_bytes >= STEP_BYTES:
                yield
                step_units = step_bytes = 0
            unit = orjson.loads(encoded)  # as it was when ranked, status included
            form = self._form(unit, must=self._make_progress and not taken)
            if form is None:
                stopped_by = "max_tokens"
                break
            name, shown, cost = form
            item = self._item(index, row, unit, row_score, name, shown)
            size = pages.encoded_size(item) + (1 if taken else 0)
            if taken and self.bytes + size > self._room:
                stopped_by = "max_response_bytes"
                break
            self.tokens += cost
            self.bytes += size
            taken.append((row_score, unit, item))
            step_units += 1
            step_bytes += size
        self._finish(taken, stopped_by)

    def _finish(
        self, taken: list[tuple[float, dict[str, Any], dict[str, Any]]], stopped_by: str | None
    ) -> None:
        response, budget = self._response, self._response["context_budget"]
        taken.sort(key=lambda t: -t[0])  # stable: ties keep the walk's order
        response["record"] = [item for _, _, item in taken]
        budget["units_returned"] = len(taken)
        budget["tokens_used"] = self.tokens if self._budget is not None else None
        if len(taken) == self._available:
            budget["limited_by"] = None
        else:
            budget["limited_by"] = stopped_by or "max_units"
            if self._make_progress:  # a poll continues after the newest unit taken
                response["epoch"] = max(unit["epoch"] for _, unit, _ in taken)

    def _form(self, unit: dict[str, Any], *, must: bool) -> tuple[str, dict[str, Any], int] | None:
        """The richest form of ``unit`` within the token budget, with its cost.

        None when no form fits, unless ``must``: then the shortest form.
        """
        if self._budget is None:
            name, shown = next(_forms(unit, self._format))
            return name, shown, 0
        shortest = None
        for name, shown in _forms(unit, self._format):
            cost = tokens(shown)
            if self.tokens + cost <= self._budget:
                return name, shown, cost
            shortest = (name, shown, cost)
        return shortest if must else None

    def _item(
        self,
        index: relevance.UnitIndex,
        row: int,
        unit: dict[str, Any],
        row_score: float,
        form: str,
        shown: dict[str, Any],
    ) -> dict[str, Any]:
        """One ScopedMemoryUnit of the response."""
        reason = relevance.explain(index, self._query, unit, row_score, recorded=self._recorded)
        scored = {
            "relevance_score": round(row_score, 6),
            "relevance_reason": reason,
            "format": form,
        }
        if form == "ids_only":
            return {**shown, **scored}
        return {"memory_unit": shown, **scored}


def _forms(unit: dict[str, Any], fmt: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The forms a unit may take in the response, richest first, each made when asked for."""
    if fmt == "ids_only":
        yield "ids_only", {"memory_unit_id": unit["id"], "epoch": unit["epoch"]}
        return
    if fmt == "full":
        yield "full", unit
    yield "summary", summarize(unit)


def summarize(unit: dict[str, Any]) -> dict[str, Any]:
    """The unit in summary form: first sentence of its content, short confidence."""
    summary = dict(unit)
    summary.pop("payload", None)  # an inbound event's payload: in the full form only
    summary["content"] = first_sentence(unit["content"], SUMMARY_CHARS)
    confidence = unit.get("confidence")
    if confidence is not None:
        summary["confidence"] = {
            k: confidence[k] for k in ("score", "reasoning") if k in confidence
        }
    return summary


def tokens(unit: dict[str, Any]) -> int:
    """Estimated tokens of a serialized unit: four bytes of JSON per token."""
    return math.ceil(len(orjson.dumps(unit)) / 4)


def _conflicts_for(state: FieldState, agent: AgentRecord, limits: Limits) -> list[dict[str, Any]]:
    """Unresolved conflicts the agent may see, its own first, then newest first.

    At most ``max_attune_conflicts`` of them, and as many as fit in
    :data:`CONFLICTS_SHARE` of the response (DETECT ``list`` pages through
    them all). Read from the state's indexes of unresolved conflicts, newest
    first, so the work is that of the conflicts shown, not of all of them.
    """
    own = state.unresolved_by_agent.get(agent.id, {})
    others = (c for c in _newest_first(state, state.unresolved) if c["id"] not in own)
    room = int(limits.max_response_bytes * CONFLICTS_SHARE)
    shown: list[dict[str, Any]] = []
    for conflict in itertools.chain(_newest_first(state, own), others):
        if len(shown) == limits.max_attune_conflicts:
            break
        if not visibility.conflict_visible(state, agent, conflict):
            continue
        room -= pages.encoded_size(conflict) + 1
        if room < 0:
            break
        shown.append(conflict)
    return shown


def _newest_first(state: FieldState, ids: dict[str, None]) -> Iterator[dict[str, Any]]:
    """The conflicts ``ids`` (in detection order, so by epoch) newest first; those of one
    epoch in detection order."""
    group: list[dict[str, Any]] = []
    for conflict_id in reversed(ids):
        conflict = state.conflicts[conflict_id]
        if group and conflict["epoch"] != group[-1]["epoch"]:
            yield from reversed(group)
            group = []
        group.append(conflict)
    yield from reversed(group)
