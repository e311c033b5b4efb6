"""A plain, obviously-correct relevance scorer: one Python loop over units.

It restates the formula of ``field.core.relevance`` from the unit dicts
alone, with no columns and no matrices, so the vectorized scorer can be
checked against it (``tests/test_relevance.py``) and timed against it
(``benchmarks/attune.py``). Embeddings come from the embedder and its
quantized form (the inputs of the formula); the cosine is a plain sum
over coordinates.
"""

from __future__ import annotations

import math
from typing import Any

from field.core.embedding import Embedder, HashingEmbedder, quantize
from field.core.relevance import (
    DIVERSITY_DECAY,
    RECENCY_HALF_LIFE,
    Query,
    Weights,
    keywords,
    semantic_text,
    unit_keywords,
    weights_for,
)
from field.model import HIDDEN_UNIT_STATUSES, TYPE_IMPORTANCE


def words_of(unit: dict[str, Any]) -> frozenset[str]:
    """What the unit says (content, purpose, question): never who said it."""
    return unit_keywords(unit)


def role_factor(role: str, other_role: str) -> float:
    """1 for the same role, else the share of ``role``'s keywords in ``other_role``'s."""
    if role == other_role:
        return 1.0
    words = frozenset(keywords(role))
    return len(words & frozenset(keywords(other_role))) / len(words) if words else 0.0


def interest_value(
    found: frozenset[str], phrases: list[frozenset[str]], power: float
) -> float | None:
    """The interest factor: keywords of ``phrases`` in ``found``, over keywords per phrase,
    to ``power``.

    None when no phrase has a keyword (the factor does not apply).
    """
    phrases = [p for p in phrases if p]
    if not phrases:
        return None
    wanted = frozenset().union(*phrases)
    per_phrase = len(wanted) / len(phrases)
    return min(1.0, len(found & wanted) / per_phrase) ** power


def quantized(text: str, embedder: Embedder) -> tuple[list[int], int]:
    """A text's quantized embedding as integers, and its squared norm."""
    rows, _ = quantize(embedder.embed([text]))
    vector = [int(x) for x in rows[0].tolist()]
    return vector, sum(x * x for x in vector)


def closeness(unit: tuple[list[int], int], query: tuple[list[int], int]) -> float | None:
    """The semantic factor: cosine clipped at 0; None when the query embeds to nothing."""
    (unit_vector, unit_square), (query_vector, query_square) = unit, query
    if query_square == 0:
        return None
    if unit_square == 0:
        return 0.0
    dot = sum(a * b for a, b in zip(unit_vector, query_vector, strict=True))
    return max(0.0, dot / math.sqrt(unit_square * query_square))


def reference_scores(
    units: list[dict[str, Any]],
    query: Query,
    embedder: Embedder | None = None,
    *,
    vectors: dict[str, tuple[list[int], int]] | None = None,
    weights: Weights | None = None,
) -> dict[str, float]:
    """Score of every candidate unit (``units`` in recording order), by unit id.

    ``vectors`` may give the units' quantized embeddings (as the index
    holds them); otherwise each unit's content is embedded here. The
    weights are the embedder's unless given.
    """
    embedder = embedder or HashingEmbedder()
    weights = weights or weights_for(embedder)
    all_words = [words_of(u) for u in units]
    n = len(units)
    query_vector = quantized(semantic_text(query.interests, query.context_hint), embedder)

    phrases = [frozenset(keywords(i)) for i in query.interests]
    phrases.append(frozenset(keywords(query.context_hint)))
    scores = {}
    for row, unit in enumerate(units):
        if unit["status"] in HIDDEN_UNIT_STATUSES:
            continue
        if not query.include_own and unit["source"]["agent_id"] == query.agent_id:
            continue
        if query.since_epoch is not None and unit["epoch"] <= query.since_epoch:
            continue
        factors = [(weights.role, role_factor(query.role, unit["source"]["agent_role"]))]
        interest = interest_value(all_words[row], phrases, weights.interest_power)
        if interest is not None:
            factors.append((weights.interest, interest))
        unit_vector = (vectors or {}).get(unit["id"]) or quantized(unit["content"], embedder)
        semantic = closeness(unit_vector, query_vector)
        if semantic is not None:
            factors.append((weights.semantic, semantic))
        factors.append((weights.type, TYPE_IMPORTANCE[unit["type"]]))
        if query.task_id is not None:
            factors.append((weights.task, float(unit["intent"]["task_id"] == query.task_id)))
        confidence = (unit.get("confidence") or {}).get("score")
        factors.append((weights.confidence, 0.5 if confidence is None else confidence))
        content = sum(w * v for w, v in factors) / sum(w for w, _ in factors)
        recency = 2.0 ** (-(n - 1 - row) / RECENCY_HALF_LIFE)
        rw = query.recency_weight
        scores[unit["id"]] = min(1.0, max(0.0, content * (1 - rw + rw * recency)))
    return scores


def reference_diversify(
    units: dict[str, dict[str, Any]], scores: dict[str, float]
) -> dict[str, float]:
    """Each agent's k-th best unit keeps DIVERSITY_DECAY**k of its score."""
    seen: dict[str, int] = {}
    result = {}
    for unit_id in sorted(scores, key=lambda u: -scores[u]):
        source = units[unit_id]["source"]["agent_id"]
        k = seen.get(source, 0)
        seen[source] = k + 1
        result[unit_id] = scores[unit_id] * DIVERSITY_DECAY**k
    return result
