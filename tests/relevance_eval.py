"""Ranking quality on a labelled set: the measures of ``benchmarks/relevance.py``.

The set (``benchmarks/data/relevance.json``, described in
``benchmarks/data/README.md``) holds agents with roles and interests and
units with their true audience. :func:`evaluate` records the units into a
Field, through the core's own operations, with every agent subscribed to
``memory.recorded`` at ``min_relevance`` 0, and reads back:

* the relevance of every notification: the subscription score of each
  (agent, unit) pair, labelled relevant when the agent is in the unit's
  audience (pairs with the unit's own recorder are not notified, so not
  counted);
* each agent's ATTUNE page of 10 (scope: its role and interests).

From those it computes ROC AUC, precision and recall of notifications at
thresholds, the share of irrelevant pairs below a threshold and of
relevant pairs at or above it, and precision@10 and nDCG@10 per agent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from field.ranking.embedding import Embedder
from field.ranking.relevance import Query
from field.subscriptions.events import event_of
from field.subscriptions.matcher import Matcher

from .core_util import Harness

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "relevance.json"
#: Each interest of the set described in a sentence, as an agent could register it.
DESCRIBED = DATA.parent / "relevance_interests_described.json"
PAGE = 10


def load(path: Path = DATA) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def described(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every agent's interests replaced by their descriptions."""
    descriptions = orjson.loads(DESCRIBED.read_bytes())
    agents = [
        {**agent, "interests": [descriptions[i] for i in agent["interests"]]}
        for agent in data["agents"]
    ]
    return {**data, "agents": agents}


def select(data: dict[str, Any], split: str | None, source: str | None = None) -> list[Any]:
    """The units of ``split`` ("train", "test"; None: all) and ``source`` (None: both)."""
    return [
        u
        for u in data["units"]
        if (split is None or u["split"] == split) and (source is None or u["source"] == source)
    ]


#: RECORD requires a purpose: a unit whose recorder stated no specific one gets this
GENERIC_PURPOSE = "keep the team informed"


def purpose(unit: dict[str, Any]) -> str:
    return unit.get("purpose") or GENERIC_PURPOSE


@dataclass
class Scored:
    """The subscription score and label of every (agent, unit) pair, and ATTUNE's pages."""

    agents: list[str]
    scores: np.ndarray[Any, np.dtype[np.float64]]
    labels: np.ndarray[Any, np.dtype[np.bool_]]
    #: per agent, the labels of its ATTUNE page (best first) and how many units it should find
    pages: dict[str, tuple[list[bool], int]]
    #: milliseconds per RECORD (embedding included) and per ATTUNE
    record_ms: float
    attune_ms: float
    #: the (agent, unit id) of each pair, aligned with ``scores``
    pairs: list[tuple[str, str]] = field(default_factory=list)


def agent_query(agent: dict[str, Any]) -> Query:
    """ATTUNE's query for a labelled agent: its role and interests, no hint, task or
    recency."""
    return Query(
        agent_id=agent["id"],
        role=agent["role"],
        interests=agent["interests"],
        context_hint=None,
        task_id=None,
        recency_weight=0.0,
        include_own=False,
        since_epoch=None,
    )


def record_units(h: Harness, units: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """RECORD each unit by its recorder; the units by the ids the Field gave them."""
    ids = {}
    for unit in units:
        payload = {
            "type": unit["type"],
            "content": unit["content"],
            "intent": {"purpose": purpose(unit), "question": unit.get("question")},
            "confidence": {"score": unit["confidence"], "reasoning": "labelled set"},
        }
        ids[h.send("RECORD", unit["recorded_by"], payload)["memory_unit_id"]] = unit
    return ids


def notified(h: Harness) -> Iterator[tuple[str, str, float, str]]:
    """Every ``memory.recorded`` notification of ``h``'s subscriptions, as matched live:
    (subscriber, unit id, relevance, reason)."""
    state = h.field.state
    registry = state.registry
    events = [e for e in (event_of(x, state.units) for x in h.stored()) if e is not None]
    events = [e for e in events if e.name == "memory.recorded"]
    for match in Matcher(registry, state.index, state.units).match(events):
        for i, row in enumerate(match.rows.tolist()):
            agent_id = registry.profile_agent[registry.profile.view[row]]["id"]
            yield agent_id, match.event.units[0], float(match.relevance[i]), match.reason(i)


def score_set(
    agents: Sequence[dict[str, Any]], units: Sequence[dict[str, Any]], embedder: Embedder | None
) -> Scored:
    """Record ``units`` into a new Field and score them for every agent, live and by ATTUNE."""
    h = Harness(embedder=embedder)
    for agent in agents:
        h.register(agent["id"], agent["role"], interests=agent["interests"])
    for agent in agents:
        body = {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}}
        h.send("SUBSCRIBE", agent["id"], body)
    start = time.perf_counter()
    ids = record_units(h, units)
    len(h.field.state.index.vectors)  # embeds what is still queued: part of recording
    record_ms = (time.perf_counter() - start) * 1000 / max(1, len(units))

    scores, labels, pairs = [], [], []
    for agent_id, unit_id, relevance, _ in notified(h):
        unit = ids[unit_id]
        scores.append(relevance)
        labels.append(agent_id in unit["audience"])
        pairs.append((agent_id, unit["id"]))

    pages = {}
    start = time.perf_counter()
    for agent in agents:
        record = h.attune(agent["id"], max_units=PAGE)["record"]
        found = [agent["id"] in ids[r["memory_unit"]["id"]]["audience"] for r in record]
        should = sum(agent["id"] in u["audience"] for u in units if u["recorded_by"] != agent["id"])
        pages[agent["id"]] = (found, should)
    attune_ms = (time.perf_counter() - start) * 1000 / max(1, len(agents))
    return Scored(
        agents=[a["id"] for a in agents],
        scores=np.array(scores, dtype=np.float64),
        labels=np.array(labels, dtype=bool),
        pages=pages,
        record_ms=record_ms,
        attune_ms=attune_ms,
        pairs=pairs,
    )


def roc_auc(scores: Iterable[float], labels: Iterable[bool]) -> float:
    """The probability that a relevant pair outscores an irrelevant one (ties count half)."""
    s = np.asarray(list(scores), dtype=np.float64)
    y = np.asarray(list(labels), dtype=bool)
    positives, negatives = int(y.sum()), int((~y).sum())
    if not positives or not negatives:
        return math.nan
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_scores = s[order]
    # average ranks of ties (1-based)
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(s)]
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        ranks[order[a:b]] = (a + 1 + b) / 2.0
    return float((ranks[y].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def by_agent(scored: Scored) -> dict[str, np.ndarray[Any, np.dtype[np.bool_]]]:
    """Per agent, which of the pairs are its own."""
    owner = np.array([agent for agent, _ in scored.pairs])
    return {agent: owner == agent for agent in scored.agents}


def agent_aucs(scored: Scored) -> dict[str, float]:
    """Each agent's ROC AUC over its own pairs (NaN for an agent with no relevant pair)."""
    return {
        agent: roc_auc(scored.scores[mine], scored.labels[mine])
        for agent, mine in by_agent(scored).items()
    }


def at_threshold(scored: Scored, threshold: float) -> dict[str, Any]:
    """Notifications at ``min_relevance`` = ``threshold``: precision, recall and the shares,
    pooled and per agent (the least and the most of any agent)."""
    notified = scored.scores >= threshold
    relevant = scored.labels
    tp = int((notified & relevant).sum())
    below, above = [], []
    for mine in by_agent(scored).values():
        if (mine & ~relevant).any():
            below.append(float((~notified[mine & ~relevant]).mean()))
        if (mine & relevant).any():
            above.append(float(notified[mine & relevant].mean()))
    return {
        "threshold": threshold,
        "precision": tp / max(1, int(notified.sum())),
        "recall": tp / max(1, int(relevant.sum())),
        "irrelevant_below": float((~notified[~relevant]).mean()) if (~relevant).any() else 1.0,
        "relevant_at_or_above": float(notified[relevant].mean()) if relevant.any() else 1.0,
        "irrelevant_below_per_agent": (min(below, default=1.0), max(below, default=1.0)),
        "relevant_at_or_above_per_agent": (min(above, default=1.0), max(above, default=1.0)),
    }


def ndcg(found: list[bool], should: int, k: int = PAGE) -> float:
    """nDCG@k of a page with binary gains (the ideal page holds min(k, should) hits)."""
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, should)))
    if ideal == 0.0:
        return math.nan
    return sum(1.0 / math.log2(i + 2) for i, hit in enumerate(found[:k]) if hit) / ideal


def precision_at(found: list[bool], should: int, k: int = PAGE) -> float:
    """Precision@k; with fewer than k relevant units, of min(k, should) (so 1.0 is reachable)."""
    room = min(k, should)
    return math.nan if room == 0 else sum(found[:k]) / room


def summary(scored: Scored, thresholds: Sequence[float]) -> dict[str, Any]:
    per_agent = {
        agent: {
            "precision_at_10": precision_at(*scored.pages[agent]),
            "ndcg_at_10": ndcg(*scored.pages[agent]),
            "relevant_units": scored.pages[agent][1],
        }
        for agent in scored.agents
    }
    measured = [v for v in per_agent.values() if v["relevant_units"]]
    aucs = [auc for auc in agent_aucs(scored).values() if not math.isnan(auc)]
    return {
        "pairs": len(scored.scores),
        "relevant_pairs": int(scored.labels.sum()),
        "auc": roc_auc(scored.scores, scored.labels),
        "mean_agent_auc": float(np.mean(aucs)) if aucs else math.nan,
        "min_agent_auc": min(aucs, default=math.nan),
        "thresholds": [at_threshold(scored, t) for t in thresholds],
        "attune": per_agent,
        "mean_precision_at_10": float(np.mean([v["precision_at_10"] for v in measured])),
        "mean_ndcg_at_10": float(np.mean([v["ndcg_at_10"] for v in measured])),
        "record_ms": scored.record_ms,
        "attune_ms": scored.attune_ms,
    }
