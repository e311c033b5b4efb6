"""Vectorized matching of Field events against every subscription.

:meth:`Matcher.match` takes a batch of events and returns, per event,
the subscriptions it notifies, with relevance, ``requires_action`` and
the reason. Relevance depends on the subscriber's agent profile only, so
it is scored on (events x profiles) matrices; each event is then checked
against the rows that list its name (gathered once per call), with its
profile scores gathered to them. The only Python loops run over events
and over an event's keywords.

A subscription is notified of an event when all of these hold:

* it is active, was created before the event (a lower epoch), and lists
  the event's name;
* the event's actor is not the subscriber, unless ``include_own``;
* the event's relevance to the subscriber is at least ``min_relevance``;
* its ``filter``, if any, is true (the ``screen`` stage,
  :mod:`field.subscriptions.filtering`, on the rows that pass the rest).

Relevance (documented in ``protocol/README.md``, "Relevance of events"):

* memory events: the ATTUNE score of the unit for the subscriber, as of
  the event (:func:`field.ranking.relevance.combine`), its semantic factor
  the calibrated similarity of the subscriber's best interest with the
  unit's content (:mod:`field.ranking.calibration`; one (interests x units)
  matrix product per group of events, over the interest rows as int8);
  1.0 for ``memory.contested`` when the subscriber wrote the unit;
* ``conflict.detected`` and ``conflict.resolved``: 1.0 when the
  subscriber wrote either unit, otherwise the better of the two units'
  scores;
* ``agent.joined``, ``agent.failed``: role, interest and task alignment between the
  subscriber and the joining agent (1.0 for the agents a failure concerns);
* task, handoff and session events: 1.0 for the agents the event
  concerns (:attr:`FieldEvent.agents`), otherwise role, interest and
  task alignment with the event's topic (task title and description, or
  session name and purpose) and task.

``requires_action`` is true when the subscriber's own unit is contested
or in a new conflict (not when a conflict is resolved: nothing is left
to do), or when the subscriber is one of the event's ``acting`` agents
(a task assigned or handed off to it, a dependency of its task
completed, a failed agent's task to reassign).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..ranking.calibration import percentile
from ..ranking.relevance import (
    Column,
    UnitIndex,
    combine,
    interest_factor,
    keywords,
    ranges,
    recency,
)
from .events import EVENT_BIT, FieldEvent
from .registry import FEW_ROWS, SubscriptionRegistry

#: Largest (events x agent profiles) matrix built at once; bigger batches are chunked.
MATRIX_CELLS = 1 << 18
#: Up to this many agent profiles, units are scored down the unit columns per profile.
FEW_PROFILES = 4
#: Interest rows converted from int8 to float32 at once for a product (a block that stays in
#: the cache, 512 KB, while it is multiplied; a block this small is also multiplied on one
#: thread: a threaded BLAS took 10-50 times as long for blocks of 2 MB on a busy machine)
PRODUCT_BLOCK_CELLS = 1 << 17
#: Largest (units x interest rows) product made at once (float32, 64 MB): the units of this
#: many events' worth are multiplied in one pass over the rows, then scored in chunks
PRODUCT_CELLS = 1 << 24
RECENCY_WEIGHT = 0.25

# reason flags
_SAME_ROLE, _INTERESTS, _TASK, _OWN_UNIT, _CONCERNS_YOU, _YOUR_MOVE = 1, 2, 4, 8, 16, 32
_SEMANTIC, _RELATED_ROLE = 64, 128
#: Events of relevance 1 to the authors of the units they involve ...
OWN_UNIT_EVENTS = frozenset({"memory.contested", "conflict.detected", "conflict.resolved"})
#: ... and those of them that require the author's action.
MUST_ACT_EVENTS = frozenset({"memory.contested", "conflict.detected"})
#: Events about tasks, handoffs and sessions (scored by topic, not by units).
TOPIC_EVENTS = frozenset(
    {
        "task.state_changed",
        "task.assigned",
        "task.completed",
        "handoff.incoming",
        "session.paused",
        "session.ended",
    }
)


@dataclass(slots=True, eq=False)
class Match:
    """The subscriptions one event notifies (row numbers in the registry).

    Never changed once built; not frozen because a frozen dataclass of these fields
    takes 2.2 us to build (0.6 us plain), once per event matched, in every publish and
    every replay.
    """

    event: FieldEvent
    rows: npt.NDArray[np.int32]
    relevance: npt.NDArray[np.float64]
    requires_action: npt.NDArray[np.bool_]
    #: the reason flags (compact: a batch's matches hold one entry per notification)
    flags: npt.NDArray[np.uint8]

    def reason(self, i: int) -> str:
        return reason_text(self.event.name, int(self.flags[i]))


_REASONS: dict[tuple[str, int], str] = {}


def reason_text(event: str, flags: int) -> str:
    """A human-readable reason for a notification (cached per event and flags)."""
    key = (event, flags)
    text = _REASONS.get(key)
    if text is None:
        parts = []
        if flags & _OWN_UNIT:
            parts.append("it involves your unit")
        if flags & _YOUR_MOVE:
            parts.append("it needs your action")
        elif flags & _CONCERNS_YOU:
            parts.append("it concerns you")
        if flags & _SAME_ROLE:
            parts.append("same role as you")
        elif flags & _RELATED_ROLE:
            parts.append("a role like yours")
        if flags & _INTERESTS:
            parts.append("matches your interests")
        if flags & _SEMANTIC:
            parts.append("close in meaning to your interests")
        if flags & _TASK:
            parts.append("serves your task")
        general = (
            "no match with your role, interests or task"
            if event in TOPIC_EVENTS
            else "general relevance (type, confidence, recency)"
        )
        detail = "; ".join(parts) if parts else general
        text = _REASONS[key] = f"{event}: {detail}"
    return text


@dataclass(frozen=True, slots=True)
class _Candidates:
    """The rows of a match that are active and list one event name, with their columns."""

    rows: npt.NDArray[np.int32]
    #: each row's position in the scope's profiles
    profile: npt.NDArray[np.intp]
    agent: npt.NDArray[np.int32]
    #: the subscriber where it leaves out its own actions, else -1
    excluded: npt.NDArray[np.int32]
    created: npt.NDArray[np.int64]
    newest: int
    oldest: int
    min_relevance: npt.NDArray[np.float64]


@dataclass(slots=True)
class _InterestRows:
    """The interest rows of a scope's profiles (:meth:`Scope.interest_rows`): gathered
    once, then read by every batch the scope matches."""

    #: their rows in the registry (None: every row, in order: nothing was gathered)
    chosen: npt.NDArray[np.intp] | None
    #: the rows as int8 where the registry has them (:func:`~.registry.packed`), else float32
    vectors: npt.NDArray[Any]
    squares: npt.NDArray[np.float64]
    #: per profile: its rows compared for the best match, its rows of units judged not
    #: useful, its first row here and its joined row's (its first without one)
    counts: npt.NDArray[np.int64]
    against: npt.NDArray[np.int64]
    firsts: npt.NDArray[np.int64]
    joined: npt.NDArray[np.int64]
    #: per profile, what the percentile counts, the best match's share, the penalty
    compared: npt.NDArray[np.int64]
    weight: npt.NDArray[np.float64]
    penalty: npt.NDArray[np.float64]
    #: the rows' (scale, shift) by checkpoint position (the last :data:`KEPT_POSITIONS`)
    scales: dict[int, tuple[Any, Any]]


#: Checkpoint positions whose scales a scope keeps (the units' and a replay's few).
KEPT_POSITIONS = 4


@dataclass(slots=True)
class Scope:
    """The registry rows a match covers, their agent profiles and, filled in as
    events need them, the rows among them that list each event name.

    Made by :meth:`Matcher.scope`; it stays valid, and is reused by
    whoever matches the same rows again (the push hub, for every batch),
    until the registry changes: :meth:`fits` tells.
    """

    rows: npt.NDArray[np.intp]
    profiles: npt.NDArray[np.intp]
    #: each row's position in ``profiles``
    of_row: npt.NDArray[np.intp]
    candidates: dict[str, _Candidates]
    registry: SubscriptionRegistry
    version: int
    #: whether cancelled rows are matched too (replaying a stream up to its end)
    inactive: bool = False
    _interests: _InterestRows | None = None

    def fits(self, registry: SubscriptionRegistry) -> bool:
        """Whether this scope still describes ``registry``'s rows."""
        return registry is self.registry and registry.version == self.version

    def interest_rows(self) -> _InterestRows:
        """The interest rows of :attr:`profiles`, gathered the first time they are asked
        for (every profile of the registry: its rows as they are)."""
        if self._interests is None:
            reg, profiles = self.registry, self.profiles
            counts = reg.interest_count.view[profiles]
            against = reg.against_count.view[profiles]
            spans = reg.interest_span.view[profiles]
            # int8 rows: a quarter of the bytes to gather and to read for every product
            rows = reg.vectors if reg.packed is None else reg.packed
            if len(profiles) == reg.profile_count:  # profiles is arange: no gather
                chosen = None
                vectors, squares = rows.view, reg.squares.view
            else:
                chosen = ranges(reg.interest_start.view[profiles], spans)
                vectors, squares = rows.view[chosen], reg.squares.view[chosen]
            firsts = np.cumsum(spans) - spans
            joined = np.where(spans > counts + against, firsts + spans - 1, firsts)
            self._interests = _InterestRows(
                chosen,
                vectors,
                squares,
                counts,
                against,
                firsts,
                joined,
                reg.compared.view[profiles],
                reg.weight.view[profiles],
                reg.penalty.view[profiles],
                {},
            )
        return self._interests


class Matcher:
    """Scores events against a registry; reads units from a UnitIndex."""

    def __init__(
        self,
        registry: SubscriptionRegistry,
        index: UnitIndex,
        units: Mapping[str, dict[str, Any]],
        *,
        audience: Callable[[FieldEvent], set[str] | None] | None = None,
        screen: Callable[[list[Match]], list[Match]] | None = None,
    ) -> None:
        self.registry = registry
        self.index = index
        self.units = units
        #: the agents that may see an event (None: everyone), for session visibility
        self.audience = audience
        #: the stage after this one (subscription filters), applied to every match
        self.screen = screen

    def scope(self, only: npt.NDArray[np.intp] | None = None, *, inactive: bool = False) -> Scope:
        """The scope of matching against ``only`` those registry rows (None: all of them).

        With ``inactive``, cancelled rows are matched as if active: for a replay of
        one stream from the log up to where it ended, which the caller bounds.
        """
        reg = self.registry
        # relevance depends on the agent profile only: score each profile once
        if only is None:
            rows = np.arange(len(reg))
            profiles, of_row = np.arange(reg.profile_count), reg.profile.view
        else:
            rows = np.asarray(only, dtype=np.intp)
            profiles, of_row = np.unique(reg.profile.view[rows], return_inverse=True)
        of_row = of_row.astype(np.intp, copy=False)
        return Scope(rows, profiles, of_row, {}, reg, reg.version, inactive)

    def match(
        self,
        events: list[FieldEvent],
        *,
        only: npt.NDArray[np.intp] | None = None,
        scope: Scope | None = None,
        inactive: bool = False,
    ) -> list[Match]:
        """Matches of each event (events with no subscriber are left out).

        ``only`` restricts matching to those registry rows (used to replay
        one subscription's stream from the log), also cancelled ones with
        ``inactive``; or ``scope``, made earlier by :meth:`scope` and still
        fitting the registry, gives the rows.
        """
        reg = self.registry
        if len(reg) == 0 or not events:
            return []
        if scope is None:
            scope = self.scope(only, inactive=inactive)
        elif not scope.fits(reg):
            raise ValueError("the scope was made before the registry changed")
        step = max(1, MATRIX_CELLS // max(1, len(scope.profiles)))
        matches: list[Match] = []
        if len(scope.profiles) <= FEW_PROFILES:
            for start in range(0, len(events), step):
                matches.extend(self._match_chunk(events[start : start + step], scope, {}))
            return matches if self.screen is None else self.screen(matches)
        # the interest rows are read once for a group of events, whose units are multiplied
        # together; the group is then scored a chunk at a time
        height = max(1, len(scope.interest_rows().squares))
        group = max(step, PRODUCT_CELLS // height)
        for first in range(0, len(events), group):
            some = events[first : first + group]
            dots = self._dots(some, scope)
            for start in range(0, len(some), step):
                matches.extend(self._match_chunk(some[start : start + step], scope, dots))
        return matches if self.screen is None else self.screen(matches)

    def prepare(self, events: list[FieldEvent], scope: Scope) -> Iterator[None]:
        """Make ahead, in short steps with a yield after each, what :meth:`match` of
        ``events`` against ``scope`` would make in one go: at a calibration checkpoint
        not met before, every interest row's scales
        (:meth:`~.registry.SubscriptionRegistry.scales_in_steps`).

        The matches are the same with or without it; the registry may change
        between the steps (a scope made before may no longer fit).
        """
        if len(scope.profiles) <= FEW_PROFILES:  # scored per profile: no rows' scales
            return
        epochs = [e.epoch for e in self._by_units(events, scope)]
        if not epochs:
            return
        index = self.index
        index.vectors  # noqa: B018 (reading the rows embeds what is queued: checkpoints current)
        calibration = index.calibration
        positions = np.unique(calibration.at(index.count_at(np.array(epochs, dtype=np.int64))))
        for position in positions.tolist():
            if position < len(calibration.checkpoints):  # else not embedded yet: none to make
                yield from self.registry.scales_in_steps(calibration, position)

    def _by_units(self, events: list[FieldEvent], scope: Scope) -> Iterator[FieldEvent]:
        """The events of ``events`` scored by their units (not agents or topics) that some
        row of ``scope`` may be told of: those whose units :meth:`_match_chunk` scores."""
        for e in events:
            if e.agent is None and e.topic is None and e.units:
                c = self._candidates(scope, e.name)
                if len(c.rows) and c.oldest < e.epoch:
                    yield e

    def _dots(self, events: list[FieldEvent], scope: Scope) -> dict[str, npt.NDArray[np.float32]]:
        """Each unit of ``events`` scored by units (not agents or topics), against every
        interest row of the scope: its exact dot products, from one product."""
        index = self.index
        unit_ids: dict[str, None] = {}
        for e in self._by_units(events, scope):
            unit_ids.update(dict.fromkeys(e.units))
        if not unit_ids:
            return {}
        rows = np.array([index.rows[unit_id] for unit_id in unit_ids], dtype=np.intp)
        interests = scope.interest_rows()
        vectors = interests.vectors
        if len(rows) == 1 and interests.chosen is None:
            # one unit against every row: a matrix-vector product of the float32 rows the
            # registry holds beside the int8 ones (5-6 ms at 300,000 rows of 128) takes
            # less than converting the int8 rows a block at a time (8-9 ms)
            vectors = self.registry.vectors.view
        found = products(vectors, index.vectors[rows])
        return {unit_id: found[:, k] for k, unit_id in enumerate(unit_ids)}

    # -- one chunk of events against the chosen rows ---------------------------

    def _candidates(self, scope: Scope, name: str) -> _Candidates:
        """The rows of ``scope`` that are active and list event ``name`` (kept in the scope)."""
        found = scope.candidates.get(name)
        if found is None:
            reg, rows = self.registry, scope.rows
            whole = len(rows) == len(reg)
            masks = reg.event_mask.view if whole else reg.event_mask.view[rows]
            listed = (masks & EVENT_BIT[name]) != 0
            if not scope.inactive:
                listed &= reg.active.view if whole else reg.active.view[rows]
            pick = np.flatnonzero(listed)
            chosen = rows[pick]
            agent = reg.agent.view[chosen]
            created = reg.created_epoch.view[chosen]
            found = scope.candidates[name] = _Candidates(
                rows=chosen.astype(np.int32),
                profile=scope.of_row[pick],
                agent=agent,
                # the subscriber, where its own actions are left out
                excluded=np.where(reg.include_own.view[chosen], -1, agent),
                created=created,
                newest=int(created.max()) if len(created) else -1,
                oldest=int(created.min()) if len(created) else 0,
                min_relevance=reg.min_relevance.view[chosen],
            )
        return found

    def _match_chunk(
        self,
        events: list[FieldEvent],
        scope: Scope,
        dots: dict[str, npt.NDArray[np.float32]],
    ) -> list[Match]:
        reg, profiles = self.registry, scope.profiles
        wanted: list[tuple[FieldEvent, _Candidates]] = []
        for event in events:
            candidates = self._candidates(scope, event.name)
            if len(candidates.rows) and candidates.oldest < event.epoch:
                wanted.append((event, candidates))
        pairs = list(
            dict.fromkeys(
                (unit_id, e.epoch)
                for e, _ in wanted
                if e.agent is None and e.topic is None
                for unit_id in e.units
            )
        )
        if len(profiles) <= FEW_PROFILES:  # e.g. replaying one stream: score across events
            scored = self._units_for_few_profiles(pairs, profiles)
        else:
            scored = self._units_for_many_profiles(pairs, profiles, scope.interest_rows(), dots)
        at = {pair: k for k, pair in enumerate(pairs)}
        matches: list[tuple[int, Match]] = []
        # events about one unit, by a few rows, for everyone: matched as one matrix per name
        few: dict[str, list[int]] = {}
        rest: list[int] = []
        for i, (event, c) in enumerate(wanted):
            simple = (
                len(c.rows) <= FEW_ROWS
                and len(event.units) == 1
                and event.agent is None
                and event.topic is None
                and event.name not in OWN_UNIT_EVENTS
                and (self.audience is None or self.audience(event) is None)
            )
            if simple:
                few.setdefault(event.name, []).append(i)
            else:
                rest.append(i)
        for chosen in few.values():
            keys = [at[(wanted[i][0].units[0], wanted[i][0].epoch)] for i in chosen]
            matches.extend(self._match_few_rows([wanted[i] for i in chosen], chosen, scored, keys))
        for i in rest:
            event, c = wanted[i]
            concerned = acting = authored = None
            if event.agent is not None or event.topic is not None:
                if event.agent is not None:  # agent.joined, agent.failed
                    score, score_flags = self._agent_relevance(event.agent, profiles)
                else:  # task, handoff and session events
                    score, score_flags = self._topic_relevance(event, profiles)
                if event.agents:
                    concerned = np.isin(c.agent, [reg.agents.find(a) for a in event.agents])
                if event.acting:
                    acting = np.isin(c.agent, [reg.agents.find(a) for a in event.acting])
            elif len(event.units) == 1:
                k = at[(event.units[0], event.epoch)]
                score, score_flags = scored[0][k], scored[1][k]
            else:
                score = np.full(len(profiles), -1.0)
                score_flags = np.zeros(len(profiles), dtype=np.int64)
                for unit_id in event.units:
                    k = at[(unit_id, event.epoch)]
                    unit_score, unit_flags = scored[0][k], scored[1][k]
                    better = unit_score > score
                    score = np.where(better, unit_score, score)
                    score_flags = np.where(better, unit_flags, score_flags)
            if event.name in OWN_UNIT_EVENTS and event.agent is None and event.topic is None:
                authors = [
                    reg.agents.find(self.units[u]["source"]["agent_id"]) for u in event.units
                ]
                authored = np.isin(c.agent, authors)
            relevance = score.take(c.profile)
            special = authored if concerned is None else concerned
            if authored is not None and concerned is not None:
                special = authored | concerned
            if special is not None:
                relevance[special] = 1.0
            notify = relevance >= c.min_relevance
            if c.newest >= event.epoch:
                notify &= c.created < event.epoch
            actor = reg.agents.find(event.actor)
            if actor >= 0:
                notify &= c.excluded != actor
            if self.audience is not None:
                allowed = self.audience(event)
                if allowed is not None:
                    codes = [reg.agents.find(agent_id) for agent_id in allowed]
                    notify &= np.isin(c.agent, codes)
            hit = np.flatnonzero(notify)
            if not len(hit):
                continue
            flags = score_flags.astype(np.uint8).take(c.profile.take(hit))
            requires_action = np.zeros(len(hit), dtype=bool)
            if authored is not None:
                own = authored[hit]
                np.bitwise_or(flags, _OWN_UNIT, out=flags, where=own)
                if event.name in MUST_ACT_EVENTS:
                    requires_action |= own
            if concerned is not None:
                np.bitwise_or(flags, _CONCERNS_YOU, out=flags, where=concerned[hit])
            if acting is not None:
                moves = acting[hit]
                np.bitwise_or(flags, _YOUR_MOVE, out=flags, where=moves)
                requires_action |= moves
            matches.append(
                (i, Match(event, c.rows.take(hit), relevance.take(hit), requires_action, flags))
            )
        if few:  # back in event order
            matches.sort(key=lambda item: item[0])
        return [match for _, match in matches]

    def _match_few_rows(
        self,
        wanted: list[tuple[FieldEvent, _Candidates]],
        order: list[int],
        scored: tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]],
        keys: list[int],
    ) -> list[tuple[int, Match]]:
        """Events of one name about one unit each, seen by everyone, against a few rows.

        The rules of :meth:`_match_chunk` (no unit-author or concerned
        overrides apply to them) on one (events x rows) matrix.
        """
        reg = self.registry
        c = wanted[0][1]
        relevance = scored[0][keys][:, c.profile]
        flags = scored[1][keys][:, c.profile].astype(np.uint8)
        epochs = np.array([event.epoch for event, _ in wanted], dtype=np.int64)
        actors = np.array([reg.agents.find(event.actor) for event, _ in wanted], dtype=np.int32)
        notify = relevance >= c.min_relevance[None, :]
        notify &= c.created[None, :] < epochs[:, None]
        notify &= (c.excluded[None, :] != actors[:, None]) | (actors < 0)[:, None]
        of_hit, columns = np.nonzero(notify)
        bounds = np.searchsorted(of_hit, np.arange(len(wanted) + 1)).tolist()
        # gathered once for the whole page; each match holds its slice (a view)
        rows, scores = c.rows[columns], relevance[of_hit, columns]
        reasons, nothing = flags[of_hit, columns], np.zeros(len(columns), dtype=bool)
        matches = []
        for k, (event, _) in enumerate(wanted):
            a, b = bounds[k], bounds[k + 1]
            if a == b:
                continue
            match = Match(event, rows[a:b], scores[a:b], nothing[a:b], reasons[a:b])
            matches.append((order[k], match))
        return matches

    def _semantic(
        self,
        interests: _InterestRows,
        pairs: list[tuple[str, int]],
        made: dict[str, npt.NDArray[np.float32]],
    ) -> npt.NDArray[np.float64]:
        """The semantic factor of each (profile, pair of a unit and an epoch), from the
        units' dot products with the interest rows (``made`` by :meth:`_dots`, for the
        group of events this chunk is part of).

        Every interest row of every profile (``interests``, a scope's) against
        every unit, each cosine standardized at the checkpoint of the pair's
        epoch, and made a percentile of the profile's best interest and joined
        interests, as ATTUNE does
        (:meth:`~field.ranking.relevance.UnitIndex.calibrated`). NaN where a
        profile has no interest that embeds (the factor does not apply, as in
        an ATTUNE without interests or hint).
        """
        reg, index = self.registry, self.index
        counts = interests.counts
        if not pairs:
            return np.empty((len(counts), 0), dtype=np.float64)
        unit_ids = list(dict.fromkeys(unit_id for unit_id, _ in pairs))
        column = {unit_id: k for k, unit_id in enumerate(unit_ids)}
        rows = np.array([index.rows[unit_id] for unit_id in unit_ids], dtype=np.intp)
        vectors, squares, chosen = interests.vectors, interests.squares, interests.chosen
        missing = [unit_id for unit_id in unit_ids if unit_id not in made]
        if missing:  # not in the group's product (none are: the same events' units)
            more = products(vectors, index.vectors[[index.rows[u] for u in missing]])
            made = {**made, **{unit_id: more[:, k] for k, unit_id in enumerate(missing)}}
        dots = np.empty((len(squares), len(unit_ids)), dtype=np.float64)
        for k, unit_id in enumerate(unit_ids):
            dots[:, k] = made[unit_id]
        if len(pairs) != len(unit_ids):  # a unit in events of several epochs
            taken = [column[unit_id] for unit_id, _ in pairs]
            dots, rows = dots[:, taken], rows[taken]
        epochs = np.array([epoch for _, epoch in pairs], dtype=np.int64)
        at = index.calibration.at(index.count_at(epochs))

        def scales(position: int) -> tuple[Any, Any]:
            found = interests.scales.pop(position, None)
            if found is None:
                scale, shift = reg.scales(index.calibration, position)
                found = (scale, shift) if chosen is None else (scale[chosen], shift[chosen])
            if len(interests.scales) >= KEPT_POSITIONS:
                del interests.scales[next(iter(interests.scales))]  # the least recently used
            interests.scales[position] = found
            return found

        standard = index.standardized(dots, vectors, squares, rows, at, scales)
        every = bool(counts.all())  # most often: every profile has an interest
        semantic = np.full((len(counts), len(pairs)), np.nan)
        some = slice(None) if every else np.flatnonzero(counts > 0)
        firsts, counts = interests.firsts[some], counts[some]
        if len(counts):
            # each profile's best interest: its first, then the k-th of those with more
            best = _most(standard, firsts, counts)
            against = interests.against[some]
            if against.any():  # units judged not useful pull a closer unit down
                has = np.flatnonzero(against)
                closest = _most(standard, firsts[has] + counts[has], against[has])
                lead = np.maximum(0.0, closest - best[has])
                best[has] -= interests.penalty[some][has][:, None] * lead
            joined = standard[interests.joined[some]]
            power = index.weights.semantic_power
            compared = interests.compared[some][:, None]
            found = percentile(best, joined, compared, power, interests.weight[some][:, None])
            if every:
                return found
            semantic[some] = found
        return semantic

    def _alignment(
        self,
        profiles: npt.NDArray[np.intp],
        role: str | None,
        words: frozenset[str],
        task_id: str | None,
    ) -> tuple[Any, Any, Any, npt.NDArray[np.int64]]:
        """Role, interest and task factors of each profile against a role, words and task.

        Interest and task are NaN where a profile has no interests or no task.
        """
        reg = self.registry
        same_role = reg.role.view[profiles] == reg.roles.find(role)
        role_share = _share(reg.hits("role", words, profiles), reg.role_word_count.view[profiles])
        interest_hits = reg.hits("interest", words, profiles)
        power = self.index.weights.interest_power
        interest = interest_factor(interest_hits, reg.interest_unit.view[profiles], power)
        sub_task = reg.task.view[profiles]
        task_code = reg.tasks.find(task_id)
        task = np.where(sub_task >= 0, (sub_task == task_code).astype(np.float64), np.nan)
        role = np.maximum(same_role, np.nan_to_num(role_share))
        return role, interest, task, _flags(same_role, role, interest_hits, task)

    def _units_for_few_profiles(
        self, pairs: list[tuple[str, int]], profiles: npt.NDArray[np.intp]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """:meth:`_units_for_many_profiles` for a few profiles: scores and flags of the pairs.

        The same formula, computed down the unit columns (as ATTUNE does) for
        each profile, instead of across profiles for each unit: replaying one
        subscription then costs a few array operations per page of events.
        """
        if not pairs:
            return np.empty((0, len(profiles))), np.empty((0, len(profiles)), dtype=np.int64)
        reg, index = self.registry, self.index
        unit_rows = np.array([index.rows[unit_id] for unit_id, _ in pairs], dtype=np.intp)
        epochs = np.array([epoch for _, epoch in pairs], dtype=np.int64)
        age = index.count_at(epochs) - 1 - unit_rows
        common = {
            "type_weight": index.type_weight.view[unit_rows],
            "confidence": index.confidence.view[unit_rows],
            "recency": recency(age),
            "recency_weight": RECENCY_WEIGHT,
        }
        scores = np.empty((len(pairs), len(profiles)), dtype=np.float64)
        flags = np.empty((len(pairs), len(profiles)), dtype=np.int64)
        unit_roles = index.role.view[unit_rows]
        for j, profile in enumerate(profiles.tolist()):  # a few profiles only
            interest_words = reg.profile_words[profile][1]
            role_of = reg.profile_role[profile]
            same_role = unit_roles == index.roles.find(role_of)
            role = index.role_factor(role_of).take(unit_roles)
            hits = index.hits(interest_words, unit_rows)
            interest = None
            if hits is not None:
                interest = interest_factor(
                    hits, reg.interest_unit.view[profile], index.weights.interest_power
                )
            task_id = reg.profile_task[profile]
            task = None
            if task_id is not None:
                task = (index.task.view[unit_rows] == index.tasks.find(task_id)).astype(np.float64)
            semantic = None
            interests = reg.interests(profile)
            if interests.texts:
                semantic = index.calibrated(interests, unit_rows, index.count_at(epochs))[0]
            scores[:, j] = combine(
                index.weights,
                role=role,
                interest=interest,
                semantic=semantic,
                task=task,
                **common,
            )
            flags[:, j] = _flags(
                same_role,
                role,
                np.zeros(len(pairs)) if hits is None else hits,
                np.zeros(len(pairs)) if task is None else task,
            ) | (0 if semantic is None else _semantic_flags(semantic, index.weights.semantic_note))
        return scores, flags

    def _units_for_many_profiles(
        self,
        pairs: list[tuple[str, int]],
        profiles: npt.NDArray[np.intp],
        interests: _InterestRows,
        dots: dict[str, npt.NDArray[np.float32]],
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """ATTUNE's score of each (unit, epoch) pair for each agent profile.

        One (pairs x profiles) matrix per factor, the units' keywords counted
        into it from the inverted profile indexes in one call. The formula is
        :func:`~field.ranking.relevance.combine` fused: which factors apply
        depends on the profile only, so the weights' sum is one row, and a
        factor that does not apply adds 0.0, as in ``combine`` (the same
        operations in the same order, so the same bits).
        """
        if not pairs:
            return np.empty((0, len(profiles))), np.empty((0, len(profiles)), dtype=np.int64)
        reg, index = self.registry, self.index
        # a pair at a time: the (rows x 1) arrays of one pair are read as one run each,
        # where those of several pairs take an inner loop per row (2.3x as long for two)
        semantic = np.empty((len(pairs), len(profiles)), dtype=np.float64)
        for k, pair in enumerate(pairs):
            semantic[k] = self._semantic(interests, [pair], dots)[:, 0]
        unit_rows = np.array([index.rows[unit_id] for unit_id, _ in pairs], dtype=np.intp)
        epochs = np.array([epoch for _, epoch in pairs], dtype=np.int64)
        row_list = unit_rows.tolist()
        words = [index.row_keywords[row] for row in row_list]
        unit_roles = index.role.view[unit_rows]
        role_words = [index.role_keywords[code] for code in unit_roles.tolist()]
        roles = [reg.roles.find(index.role_names[code]) for code in unit_roles.tolist()]
        same_role = reg.role.view[profiles][None, :] == np.array(roles, dtype=np.int32)[:, None]
        role_count = reg.role_word_count.view[profiles]
        interest_unit = reg.interest_unit.view[profiles]
        sub_task = reg.task.view[profiles]
        names = index.tasks.names  # the units' tasks from the index: no unit is decoded
        tasks = [
            reg.tasks.find(names[code] if code >= 0 else None)
            for code in index.task.view[unit_rows].tolist()
        ]
        task = sub_task[None, :] == np.array(tasks, dtype=np.int32)[:, None]
        task &= (sub_task >= 0)[None, :]
        has_interest = interest_unit > 0
        has_semantic = ~np.isnan(semantic[0]) if len(semantic) else np.zeros(0, dtype=bool)
        w = index.weights
        weight = w.role + w.interest * has_interest
        weight = weight + w.semantic * has_semantic
        weight = weight + w.type
        weight = weight + w.task * (sub_task >= 0)
        weight = weight + w.confidence
        # role: the same role, else the share of the subscriber's role words in the recorder's
        role_hits = self._hits(reg.role_words, role_words, profiles)
        role = np.divide(role_hits, role_count, out=role_hits, where=role_count > 0)
        np.maximum(role, same_role, out=role)
        flags = np.where(same_role, _SAME_ROLE, np.where(role > 0, _RELATED_ROLE, 0))
        total = role
        total *= w.role
        # interest: matched keywords over keywords per interest, at most 1, to a power
        interest_hits = self._hits(reg.interest_words, words, profiles)
        flags |= np.where(interest_hits > 0, _INTERESTS, 0)
        interest = np.divide(interest_hits, interest_unit, out=interest_hits, where=has_interest)
        np.minimum(interest, 1.0, out=interest)
        np.power(interest, w.interest_power, out=interest)
        interest *= w.interest
        total += interest
        semantic = np.nan_to_num(semantic, nan=0.0)
        flags |= np.where(semantic >= w.semantic_note, _SEMANTIC, 0)
        semantic *= w.semantic
        total += semantic
        total += w.type * index.type_weight.view[unit_rows][:, None]
        total += w.task * task.astype(np.float64)
        total += w.confidence * index.confidence.view[unit_rows][:, None]
        total /= weight
        ages = index.count_at(epochs) - 1 - unit_rows
        freshness = (1.0 - RECENCY_WEIGHT) + RECENCY_WEIGHT * recency(ages)
        total *= freshness[:, None]
        scores = np.clip(total, 0.0, 1.0, out=total)
        flags |= np.where(task, _TASK, 0)
        return scores, flags

    def _hits(
        self,
        postings: dict[str, Column],
        words: list[frozenset[str]],
        profiles: npt.NDArray[np.intp],
    ) -> npt.NDArray[np.float64]:
        """(len(words) x profiles): how many of each word set every profile has."""
        reg = self.registry
        found: list[npt.NDArray[np.int32]] = []
        lengths = []
        for word_set in words:  # a loop over the events' words, never over subscriptions
            total = 0
            for word in word_set:
                column = postings.get(word)
                if column is not None:
                    found.append(column.view)
                    total += column.size
            lengths.append(total)
        width = len(profiles)
        if not found:
            return np.zeros((len(words), width), dtype=np.float64)
        of = np.repeat(np.arange(len(words)), lengths)
        at = np.concatenate(found).astype(np.intp)
        if width != reg.profile_count:  # profiles is a subset: map profile -> its column
            position = np.full(reg.profile_count, -1, dtype=np.intp)
            position[profiles] = np.arange(width)
            at = position[at]
            keep = at >= 0
            of, at = of[keep], at[keep]
        counts = np.bincount(of * width + at, minlength=len(words) * width)
        return counts.reshape(len(words), width).astype(np.float64)

    def _agent_relevance(
        self, agent: dict[str, Any], profiles: npt.NDArray[np.intp]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """Role, interest and task alignment of each agent profile with a joining agent."""
        words = frozenset(keywords(agent["role"])) | frozenset(
            w for phrase in agent["interests"] for w in keywords(phrase)
        )
        return self._aligned(profiles, agent["role"], words, agent.get("current_task_id"))

    def _topic_relevance(
        self, event: FieldEvent, profiles: npt.NDArray[np.intp]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """Alignment of each agent profile with a task, handoff or session event.

        The topic has no role of its own: role counts through the share of
        the subscriber's role words in the topic.
        """
        return self._aligned(profiles, None, frozenset(keywords(event.topic)), event.task_id)

    def _aligned(
        self,
        profiles: npt.NDArray[np.intp],
        role_of: str | None,
        words: frozenset[str],
        task_of: str | None,
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """Role, interest and task alignment alone (no type, confidence or recency)."""
        role, interest, task, flags = self._alignment(profiles, role_of, words, task_of)
        score = combine(
            self.index.weights,
            role=role,
            interest=interest,
            type_weight=None,
            task=task,
            confidence=None,
            recency=1.0,
            recency_weight=0.0,
        )
        return score, flags


def products(rows: npt.NDArray[Any], units: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``rows @ units.T``: the dot products of quantized interest rows (float32, or int8 as
    the registry packs them) with quantized unit rows, exact, so the same bits either way.

    Int8 rows are converted to float32 a block of :data:`PRODUCT_BLOCK_CELLS` at a time
    and multiplied while the block is in the cache: the product reads a quarter of the
    bytes of the float32 rows. One unit is a matrix-vector product (a one-column matrix
    product costs far more in a threaded BLAS).
    """
    count, width = rows.shape
    if rows.dtype == np.float32:
        if len(units) == 1:
            single: npt.NDArray[np.float32] = (rows @ units[0])[:, None]
            return single
        whole: npt.NDArray[np.float32] = rows @ units.T
        return whole
    out = np.empty((len(units), count), dtype=np.float32)  # transposed: each unit's row
    step = max(1, PRODUCT_BLOCK_CELLS // max(1, width))
    block = np.empty((min(step, count), width), dtype=np.float32)
    across = np.ascontiguousarray(units.T)
    for start in range(0, count, step):
        part = rows[start : start + step]
        converted = block[: len(part)]
        np.copyto(converted, part, casting="unsafe")  # exact: integers of at most 127
        if len(units) == 1:
            np.dot(converted, units[0], out=out[0, start : start + len(part)])
        else:
            out[:, start : start + len(part)] = (converted @ across).T
    return out.T


def _flags(same_role: Any, role: Any, interest_hits: Any, task: Any) -> npt.NDArray[np.int64]:
    flags: npt.NDArray[np.int64] = (
        np.where(same_role, _SAME_ROLE, np.where(np.asarray(role) > 0, _RELATED_ROLE, 0))
        | np.where(np.nan_to_num(interest_hits) > 0, _INTERESTS, 0)
        | np.where(task == 1.0, _TASK, 0)
    ).astype(np.int64)
    return flags


def _semantic_flags(semantic: npt.NDArray[np.float64], note: float) -> npt.NDArray[np.int64]:
    flags: npt.NDArray[np.int64] = np.where(semantic >= note, _SEMANTIC, 0).astype(np.int64)
    return flags


def _share(hits: npt.NDArray[np.float64], totals: npt.NDArray[np.float64]) -> Any:
    """hits / totals, NaN where a subscriber has no such words."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, hits / np.where(totals > 0, totals, 1.0), np.nan)


def _most(
    standard: npt.NDArray[np.float64], firsts: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Per profile (a run of ``counts`` rows of ``standard`` from ``firsts``, each at least
    one), the largest of its rows: a loop over the rows per profile, a few."""
    most = standard[firsts]
    for k in range(1, int(counts.max())):
        more = counts > k
        if more.all():
            np.maximum(most, standard[firsts + k], out=most)
        else:
            has = np.flatnonzero(more)
            most[has] = np.maximum(most[has], standard[firsts[has] + k])
    return most
