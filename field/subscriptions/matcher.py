"""Vectorized matching of Field events against every subscription.

:meth:`Matcher.match` takes a batch of events and returns, per event,
the subscriptions it notifies, with relevance, ``requires_action`` and
the reason. The work is done on (events x subscriptions) matrices: the
only Python loops run over events and over an event's keywords.

A subscription is notified of an event when all of these hold:

* it is active, was created before the event (a lower epoch), and lists
  the event's name;
* the event's actor is not the subscriber, unless ``include_own``;
* the event's relevance to the subscriber is at least ``min_relevance``.

Relevance (documented in ``protocol/README.md``, "Relevance of events"):

* memory events: the ATTUNE score of the unit for the subscriber, as of
  the event (:func:`field.core.relevance.combine`), its semantic factor
  the cosine of the subscriber's interests embedding with the unit's
  content embedding (one (profiles x units) matrix product per batch);
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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..core.embedding import cosine
from ..core.relevance import SEMANTIC_NOTE, UnitIndex, combine, keywords, recency
from ..model import TYPE_IMPORTANCE
from .events import EVENT_BIT, FieldEvent
from .registry import SubscriptionRegistry

#: Largest (events x subscriptions) matrix built at once; bigger batches are chunked.
MATRIX_CELLS = 1 << 21
#: Up to this many agent profiles, units are scored down the unit columns per profile.
FEW_PROFILES = 4
RECENCY_WEIGHT = 0.25

# reason flags
_SAME_ROLE, _INTERESTS, _TASK, _OWN_UNIT, _CONCERNS_YOU, _YOUR_MOVE = 1, 2, 4, 8, 16, 32
_SEMANTIC = 64
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


@dataclass(frozen=True, slots=True)
class Match:
    """The subscriptions one event notifies (row numbers in the registry)."""

    event: FieldEvent
    rows: npt.NDArray[np.intp]
    relevance: npt.NDArray[np.float64]
    requires_action: npt.NDArray[np.bool_]
    flags: npt.NDArray[np.int64]

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


class Matcher:
    """Scores events against a registry; reads units from a UnitIndex."""

    def __init__(
        self,
        registry: SubscriptionRegistry,
        index: UnitIndex,
        units: Mapping[str, dict[str, Any]],
        *,
        audience: Callable[[FieldEvent], set[str] | None] | None = None,
    ) -> None:
        self.registry = registry
        self.index = index
        self.units = units
        #: the agents that may see an event (None: everyone), for session visibility
        self.audience = audience

    def match(
        self, events: list[FieldEvent], *, only: npt.NDArray[np.intp] | None = None
    ) -> list[Match]:
        """Matches of each event (events with no subscriber are left out).

        ``only`` restricts matching to those registry rows (used to replay
        one subscription's stream from the log).
        """
        n = len(self.registry)
        if n == 0 or not events:
            return []
        rows = np.arange(n) if only is None else np.asarray(only, dtype=np.intp)
        step = max(1, MATRIX_CELLS // max(1, len(rows)))
        matches: list[Match] = []
        for start in range(0, len(events), step):
            matches.extend(self._match_chunk(events[start : start + step], rows))
        return matches

    # -- one chunk of events against the chosen rows ---------------------------

    def _match_chunk(self, events: list[FieldEvent], rows: npt.NDArray[np.intp]) -> list[Match]:
        reg = self.registry
        bits = np.array([EVENT_BIT[e.name] for e in events], dtype=np.int64)[:, None]
        epochs = np.array([e.epoch for e in events], dtype=np.int64)[:, None]
        eligible = (
            reg.active.view[rows][None, :]
            & ((reg.event_mask.view[rows][None, :] & bits) != 0)
            & (reg.created_epoch.view[rows][None, :] < epochs)
        )
        actors = np.array([reg.agents.find(e.actor) for e in events], dtype=np.int32)[:, None]
        own = reg.agent.view[rows][None, :] == actors
        eligible &= ~own | reg.include_own.view[rows][None, :]
        if self.audience is not None:
            subscribers = reg.agent.view[rows]
            for i, event in enumerate(events):
                allowed = self.audience(event)
                if allowed is not None:
                    codes = [reg.agents.find(agent_id) for agent_id in allowed]
                    eligible[i] &= np.isin(subscribers, codes)

        # relevance depends on the agent profile only: score each profile once
        if len(rows) == len(reg):
            profiles, of_row = np.arange(reg.profile_count), reg.profile.view
        else:
            profiles, of_row = np.unique(reg.profile.view[rows], return_inverse=True)
        relevance = np.zeros(eligible.shape, dtype=np.float64)
        flags = np.zeros(eligible.shape, dtype=np.int64)
        authored = np.zeros(eligible.shape, dtype=bool)
        concerned = np.zeros(eligible.shape, dtype=bool)
        acting = np.zeros(eligible.shape, dtype=bool)
        wanted = eligible.any(axis=1).tolist()
        scored: dict[tuple[str, int], tuple[Any, Any]] = {}
        if len(profiles) <= FEW_PROFILES:  # e.g. replaying one stream: score across events
            single = [
                i
                for i, e in enumerate(events)
                if wanted[i] and e.agent is None and len(e.units) == 1
            ]
            pairs = [
                (unit_id, e.epoch)
                for e, want in zip(events, wanted, strict=True)
                if want and e.agent is None
                for unit_id in e.units
            ]
            scored = self._units_for_few_profiles(pairs, profiles)
            if single:  # one unit per event: fill those rows of the matrices at once
                keys = [(events[i].units[0], events[i].epoch) for i in single]
                relevance[single] = np.stack([scored[k][0] for k in keys])[:, of_row]
                flags[single] = np.stack([scored[k][1] for k in keys])[:, of_row]
                authors = np.array(
                    [reg.agents.find(self.units[k[0]]["source"]["agent_id"]) for k in keys],
                    dtype=np.int32,
                )
                authored[single] = reg.agent.view[rows][None, :] == authors[:, None]
                for i in single:
                    wanted[i] = False  # done
        unit_ids = list(
            dict.fromkeys(
                unit_id
                for e, want in zip(events, wanted, strict=True)
                if want and e.agent is None
                for unit_id in e.units
            )
        )
        semantic = self._semantic(profiles, unit_ids)
        column = {unit_id: k for k, unit_id in enumerate(unit_ids)}
        for i, event in enumerate(events):
            if not wanted[i]:
                continue
            if event.agent is not None or event.topic is not None:
                if event.agent is not None:  # agent.joined, agent.failed
                    score, score_flags = self._agent_relevance(event.agent, profiles)
                else:  # task, handoff and session events
                    score, score_flags = self._topic_relevance(event, profiles)
                relevance[i], flags[i] = score[of_row], score_flags[of_row]
                subscribers = reg.agent.view[rows]
                concerned[i] = np.isin(subscribers, [reg.agents.find(a) for a in event.agents])
                acting[i] = np.isin(subscribers, [reg.agents.find(a) for a in event.acting])
                continue
            best = np.full(len(profiles), -1.0)
            best_flags = np.zeros(len(profiles), dtype=np.int64)
            for unit_id in event.units:
                key = (unit_id, event.epoch)
                score, unit_flags = scored.get(key) or self._unit_relevance(
                    unit_id, event.epoch, profiles, semantic[:, column[unit_id]]
                )
                better = score > best
                best = np.where(better, score, best)
                best_flags = np.where(better, unit_flags, best_flags)
                author = reg.agents.find(self.units[unit_id]["source"]["agent_id"])
                authored[i] |= reg.agent.view[rows] == author
            relevance[i], flags[i] = best[of_row], best_flags[of_row]
        involves_own = authored & np.array([e.name in OWN_UNIT_EVENTS for e in events])[:, None]
        must_act = involves_own & np.array([e.name in MUST_ACT_EVENTS for e in events])[:, None]
        relevance = np.where(involves_own | concerned, 1.0, relevance)
        flags |= (
            np.where(involves_own, _OWN_UNIT, 0)
            | np.where(concerned, _CONCERNS_YOU, 0)
            | np.where(acting, _YOUR_MOVE, 0)
        )
        requires_action = must_act | acting
        notify = eligible & (relevance >= reg.min_relevance.view[rows][None, :])

        matches = []
        event_of_hit, columns = np.nonzero(notify)
        bounds = np.searchsorted(event_of_hit, np.arange(len(events) + 1)).tolist()
        for i, event in enumerate(events):
            if bounds[i] == bounds[i + 1]:
                continue
            hit = columns[bounds[i] : bounds[i + 1]]
            matches.append(
                Match(event, rows[hit], relevance[i, hit], requires_action[i, hit], flags[i, hit])
            )
        return matches

    def _semantic(
        self, profiles: npt.NDArray[np.intp], unit_ids: list[str]
    ) -> npt.NDArray[np.float64]:
        """The semantic factor of each (profile, unit): one matrix product.

        NaN where a profile's interests embed to nothing (the factor does
        not apply, as in an ATTUNE without interests or hint).
        """
        reg, index = self.registry, self.index
        if not unit_ids:
            return np.empty((len(profiles), 0), dtype=np.float64)
        rows = np.array([index.rows[unit_id] for unit_id in unit_ids], dtype=np.intp)
        whole = len(profiles) == reg.profile_count  # then profiles is arange: skip the gather
        vectors = reg.vectors.view if whole else reg.vectors.view[profiles]
        squares = (reg.squares.view if whole else reg.squares.view[profiles])[:, None]
        dots = vectors @ index.vectors[rows].T  # exact: integer-valued rows
        closeness = np.maximum(cosine(dots, squares, index.squares[rows][None, :]), 0.0)
        semantic: npt.NDArray[np.float64] = np.where(squares > 0, closeness, np.nan)
        return semantic

    def _unit_relevance(
        self,
        unit_id: str,
        epoch: int,
        profiles: npt.NDArray[np.intp],
        semantic: npt.NDArray[np.float64],
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """ATTUNE's score of one unit for each agent profile, as of ``epoch``."""
        index = self.index
        unit = self.units[unit_id]
        row = index.rows[unit_id]
        role, interest, task, flags = self._alignment(
            profiles,
            unit["source"]["agent_role"],
            index.row_keywords[row],
            unit["intent"].get("task_id"),
        )
        score = combine(
            role=role,
            interest=interest,
            semantic=semantic,
            type_weight=TYPE_IMPORTANCE.get(unit["type"], 0.5),
            task=task,
            confidence=float(index.confidence.view[row]),
            recency=recency(index.count_at(epoch) - 1 - row),
            recency_weight=RECENCY_WEIGHT,
        )
        return score, flags | _semantic_flags(semantic)

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
        interest_share = _share(
            reg.hits("interest", words, profiles), reg.interest_word_count.view[profiles]
        )
        sub_task = reg.task.view[profiles]
        task_code = reg.tasks.find(task_id)
        task = np.where(sub_task >= 0, (sub_task == task_code).astype(np.float64), np.nan)
        return (
            np.maximum(same_role, np.nan_to_num(role_share)),
            np.sqrt(interest_share),
            task,
            _flags(same_role, interest_share, task),
        )

    def _units_for_few_profiles(
        self, pairs: list[tuple[str, int]], profiles: npt.NDArray[np.intp]
    ) -> dict[tuple[str, int], tuple[Any, Any]]:
        """:meth:`_unit_relevance` of many (unit, epoch) pairs for a few profiles at once.

        The same formula, computed down the unit columns (as ATTUNE does) for
        each profile, instead of across profiles for each unit: replaying one
        subscription then costs a few array operations per page of events.
        """
        if not pairs:
            return {}
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
        for j, profile in enumerate(profiles.tolist()):  # a few profiles only
            role_words, interest_words = reg.profile_words[profile]
            same_role = index.role.view[unit_rows] == index.roles.find(reg.profile_role[profile])
            role_share = index.coverage(role_words)
            role = same_role if role_share is None else np.maximum(same_role, role_share[unit_rows])
            share = index.coverage(interest_words)
            interest = None if share is None else share[unit_rows]
            task_id = reg.profile_task[profile]
            task = None
            if task_id is not None:
                task = (index.task.view[unit_rows] == index.tasks.find(task_id)).astype(np.float64)
            square = float(reg.squares.view[profile])
            semantic = None
            if square > 0:
                closeness = index.similarity(reg.vectors.view[profile], square, unit_rows)
                semantic = np.maximum(closeness, 0.0)
            scores[:, j] = combine(
                role=role,
                interest=None if interest is None else np.sqrt(interest),
                semantic=semantic,
                task=task,
                **common,
            )
            flags[:, j] = _flags(
                same_role,
                np.zeros(len(pairs)) if interest is None else interest,
                np.zeros(len(pairs)) if task is None else task,
            ) | (0 if semantic is None else _semantic_flags(semantic))
        return {pair: (scores[k], flags[k]) for k, pair in enumerate(pairs)}

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
            role=role,
            interest=interest,
            type_weight=None,
            task=task,
            confidence=None,
            recency=1.0,
            recency_weight=0.0,
        )
        return score, flags


def _flags(same_role: Any, interest_share: Any, task: Any) -> npt.NDArray[np.int64]:
    flags: npt.NDArray[np.int64] = (
        np.where(same_role, _SAME_ROLE, 0)
        | np.where(np.nan_to_num(interest_share) > 0, _INTERESTS, 0)
        | np.where(task == 1.0, _TASK, 0)
    ).astype(np.int64)
    return flags


def _semantic_flags(semantic: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    flags: npt.NDArray[np.int64] = np.where(semantic >= SEMANTIC_NOTE, _SEMANTIC, 0).astype(
        np.int64
    )
    return flags


def _share(hits: npt.NDArray[np.float64], totals: npt.NDArray[np.float64]) -> Any:
    """hits / totals, NaN where a subscriber has no such words."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, hits / np.where(totals > 0, totals, 1.0), np.nan)
