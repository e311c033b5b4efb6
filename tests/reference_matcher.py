"""A plain, obviously-correct subscription matcher: Python loops, no numpy, no registry.

It restates the rules of ``field.subscriptions.matcher`` (its module
docstring) from the unit, subscription and agent dicts alone, so the
vectorized :class:`~field.subscriptions.matcher.Matcher` can be checked
against it (``tests/test_matcher.py``).

A subscription is notified of an event when

* it is active, was created at a lower epoch than the event, and lists
  the event's name;
* the event's actor is not the subscriber, unless ``include_own``;
* the event's relevance to the subscriber is at least ``min_relevance``.

Relevance:

* memory events: the ATTUNE score of the event's unit for the
  subscriber's agent, as of the event (recency weight 0.25, recency
  counted over the units recorded up to the event's epoch; the semantic
  factor compares the unit's content with the agent's interests);
  ``memory.contested`` gives 1.0 (and ``requires_action``) when the
  subscriber wrote the unit;
* ``conflict.detected``: 1.0 (and ``requires_action``) when the
  subscriber wrote either unit, otherwise the better of the two units'
  scores;
* ``conflict.resolved``: the same, but never ``requires_action``;
* ``agent.joined``: role, interest and task alignment of the subscriber
  with the joining agent's role and interest keywords; no type, no
  confidence, recency weight 0;
* task, handoff and session events: 1.0 for the agents the event
  concerns (``event.agents``; ``requires_action`` for ``event.acting``),
  otherwise the alignment of the subscriber with the event's topic
  keywords and task, as for ``agent.joined`` but with no role of its own.
"""

from __future__ import annotations

from typing import Any

from field.contract.model import TYPE_IMPORTANCE
from field.ranking.embedding import HashingEmbedder
from field.ranking.relevance import RECENCY_HALF_LIFE, keywords, weights_for
from field.subscriptions.events import FieldEvent

from .reference_relevance import calibrated, compared, interest_value, quantized, words_of

EMBEDDER = HashingEmbedder()
WEIGHTS = weights_for(EMBEDDER)

RECENCY_WEIGHT = 0.25
MUST_ACT_EVENTS = ("memory.contested", "conflict.detected")
OWN_UNIT_EVENTS = (*MUST_ACT_EVENTS, "conflict.resolved")


def agent_words(agent: dict[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    """An agent's role keywords and interest keywords."""
    role_words = frozenset(keywords(agent["role"]))
    interest_words = frozenset(w for phrase in agent["interests"] for w in keywords(phrase))
    return role_words, interest_words


def _share(found: frozenset[str], wanted: frozenset[str]) -> float | None:
    """The share of ``wanted`` found in ``found`` (None when nothing is wanted)."""
    if not wanted:
        return None
    return len(found & wanted) / len(wanted)


def combine(factors: list[tuple[float, float]], recency: float, recency_weight: float) -> float:
    content = sum(w * v for w, v in factors) / sum(w for w, _ in factors)
    return min(1.0, max(0.0, content * (1.0 - recency_weight + recency_weight * recency)))


def alignment(
    agent: dict[str, Any],
    other_role: str | None,
    role_against: frozenset[str],
    interest_against: frozenset[str],
    other_task: str | None,
) -> list[tuple[float, float]]:
    """The role, interest and task factors of ``agent`` towards something (a unit or agent).

    Role: 1 for the same role, else the share of the agent's role words in
    ``role_against``; interest: the agent's interest keywords found in
    ``interest_against``, over its keywords per interest.
    """
    role_words, _ = agent_words(agent)
    factors = []
    role = 1.0 if agent["role"] == other_role else 0.0
    role_share = _share(role_against, role_words)
    if role_share is not None:
        role = max(role, role_share)
    factors.append((WEIGHTS.role, role))
    phrases = [frozenset(keywords(phrase)) for phrase in agent["interests"]]
    interest = interest_value(interest_against, phrases, WEIGHTS.interest_power)
    if interest is not None:
        factors.append((WEIGHTS.interest, interest))
    if agent.get("current_task_id") is not None:
        factors.append((WEIGHTS.task, 1.0 if agent["current_task_id"] == other_task else 0.0))
    return factors


def unit_score(
    units: list[dict[str, Any]], unit_id: str, agent: dict[str, Any], epoch: int
) -> float:
    """ATTUNE's score of one unit for ``agent`` as of ``epoch`` (``units`` in recording order)."""
    row = next(i for i, u in enumerate(units) if u["id"] == unit_id)
    unit = units[row]
    recorded_by_then = sum(1 for u in units if u["epoch"] <= epoch)
    age = recorded_by_then - 1 - row
    recorder = unit["source"]["agent_role"]
    factors = alignment(
        agent,
        recorder,
        frozenset(keywords(recorder)),
        words_of(unit),
        unit["intent"].get("task_id"),
    )
    unit_vectors = [quantized(u["content"], EMBEDDER) for u in units]
    contents = [u["content"] for u in units]
    semantic = calibrated(
        unit_vectors,
        row,
        compared(agent["interests"]),
        EMBEDDER,
        WEIGHTS,
        recorded_by_then,
        contents,
    )
    if semantic is not None:
        factors.append((WEIGHTS.semantic, semantic))
    factors.append((WEIGHTS.type, TYPE_IMPORTANCE[unit["type"]]))
    confidence = (unit.get("confidence") or {}).get("score")
    factors.append((WEIGHTS.confidence, 0.5 if confidence is None else confidence))
    recency = 2.0 ** (-age / RECENCY_HALF_LIFE)
    return combine(factors, recency, RECENCY_WEIGHT)


def agent_score(agent: dict[str, Any], joining: dict[str, Any]) -> float:
    """Alignment of a subscriber's ``agent`` with a ``joining`` agent."""
    role_words, interest_words = agent_words(joining)
    words = role_words | interest_words
    factors = alignment(agent, joining["role"], words, words, joining.get("current_task_id"))
    return combine(factors, 1.0, 0.0)


def topic_score(agent: dict[str, Any], event: FieldEvent) -> float:
    """Alignment of a subscriber's ``agent`` with a task, handoff or session event."""
    topic = frozenset(keywords(event.topic))
    factors = alignment(agent, None, topic, topic, event.task_id)
    return combine(factors, 1.0, 0.0)


def eligible(subscription: dict[str, Any], event: FieldEvent) -> bool:
    """Active, created before the event, listing it, and not the subscriber's own action."""
    return (
        subscription["status"] == "active"
        and subscription["created_epoch"] < event.epoch
        and event.name in subscription["events"]
        and (subscription["include_own"] or event.actor != subscription["agent_id"])
    )


def relevance_of(
    units: list[dict[str, Any]],
    subscription: dict[str, Any],
    agent: dict[str, Any],
    event: FieldEvent,
) -> tuple[float, bool]:
    """(relevance, requires_action) of ``event`` for one subscription, before any filter."""
    if event.name in ("agent.joined", "agent.failed"):
        assert event.agent is not None
        if subscription["agent_id"] in event.agents:
            return 1.0, subscription["agent_id"] in event.acting
        return agent_score(agent, event.agent), False
    if event.topic is not None:
        if subscription["agent_id"] in event.agents:
            return 1.0, subscription["agent_id"] in event.acting
        return topic_score(agent, event), False
    by_id = {u["id"]: u for u in units}
    if event.name in OWN_UNIT_EVENTS and any(
        by_id[unit_id]["source"]["agent_id"] == subscription["agent_id"] for unit_id in event.units
    ):
        return 1.0, event.name in MUST_ACT_EVENTS
    best = max(unit_score(units, unit_id, agent, event.epoch) for unit_id in event.units)
    return best, False


def reference_match(
    units: list[dict[str, Any]],
    subscriptions: list[dict[str, Any]],
    agents: dict[str, dict[str, Any]],
    event: FieldEvent,
) -> dict[str, tuple[float, bool]]:
    """{subscription id: (relevance, requires_action)} of the subscriptions ``event`` notifies.

    ``units`` are all recorded units in recording order; ``subscriptions``
    are the stored subscription dicts; ``agents`` maps a subscription id to
    its agent as it was when it subscribed (id, role, interests,
    current_task_id).
    """
    notified = {}
    for subscription in subscriptions:
        if not eligible(subscription, event):
            continue
        relevance, requires_action = relevance_of(
            units, subscription, agents[subscription["id"]], event
        )
        if relevance >= subscription["min_relevance"]:
            notified[subscription["id"]] = (relevance, requires_action)
    return notified
