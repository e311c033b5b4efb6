"""A plain, obviously-correct relevance scorer: one Python loop over units.

It restates the formula of ``field.ranking.relevance`` from the unit dicts
alone, with no columns and no matrices, so the vectorized scorer can be
checked against it (``tests/test_relevance.py``) and timed against it
(``benchmarks/attune.py``). Embeddings come from the embedder and its
quantized form (the inputs of the formula); the cosine is a plain sum
over coordinates.
"""

from __future__ import annotations

import math
from typing import Any

from field.contract.model import HIDDEN_UNIT_STATUSES, TYPE_IMPORTANCE
from field.ranking.embedding import Embedder, HashingEmbedder, quantize
from field.ranking.relevance import (
    DIVERSITY_DECAY,
    RECENCY_HALF_LIFE,
    Query,
    Weights,
    keywords,
    unit_keywords,
    weights_for,
)


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
    """A text's quantized embedding as integers, and its squared norm (kept per embedder
    and text: embedding is pure, and the reference asks for the same texts again and again)."""
    key = (embedder.name, embedder.dim, text)
    found = _QUANTIZED.get(key)
    if found is None:
        rows, _ = quantize(embedder.embed([text]))
        vector = [int(x) for x in rows[0].tolist()]
        found = _QUANTIZED[key] = (vector, sum(x * x for x in vector))
    return found


_QUANTIZED: dict[tuple[str, int, str], tuple[list[int], int]] = {}
#: (query, the units before the checkpoint, prior) -> (mean, sd): each computed once
_MOMENTS: dict[Any, tuple[float, float]] = {}


def cosine(a: tuple[list[int], int], b: tuple[list[int], int]) -> float:
    """The cosine of two quantized embeddings (0 when either is zero)."""
    (a_vector, a_square), (b_vector, b_square) = a, b
    if a_square == 0 or b_square == 0:
        return 0.0
    return sum(x * y for x, y in zip(a_vector, b_vector, strict=True)) / math.sqrt(
        a_square * b_square
    )


def checkpoint(recorded: int) -> int:
    """How many units a scoring made when ``recorded`` units had been recorded is calibrated
    against: 0 below 8, then the largest power of two not above it, from 65,536 on a
    multiple of 65,536."""
    if recorded < 8:
        return 0
    if recorded >= 65536:
        return recorded - recorded % 65536
    power = 1
    while power * 2 <= recorded:
        power *= 2
    return power


def rounded(unit: tuple[list[int], int]) -> tuple[list[int], int]:
    """A unit's embedding at length 256, rounded to integers (as the calibration sums it)."""
    vector, square = unit
    if square == 0:
        return [0] * len(vector), 0
    whole = [round(256 * x / math.sqrt(square)) for x in vector]
    return whole, 256 * 256


def compared(interests: list[str]) -> list[str]:
    """The interests compared one by one: the first 16 distinct ones."""
    return list(dict.fromkeys(interests))[:16]


def calibrated(
    unit_vectors: list[tuple[list[int], int]],
    row: int,
    texts: list[str],
    embedder: Embedder,
    weights: Weights,
    recorded: int,
    contents: list[str] | None = None,
) -> float | None:
    """The semantic factor of the unit at ``row``, scored when ``recorded`` units had been
    recorded, for interests (and hint) ``texts``.

    Each text that embeds (each once), and when there are several all of them
    joined by newlines, is compared with every unit before the checkpoint of
    ``recorded``: a mean and a standard deviation of those cosines (with 16
    imagined units of the prior's mean and spread) standardize its cosine
    with the unit. The mean of the best text's and the joined text's (the
    best's alone for one text), through the normal distribution, to the
    power (k + 1) / 2 for k texts. None when no text embeds.
    """
    queries = [
        (text, query)
        for text, query in ((t, quantized(t, embedder)) for t in dict.fromkeys(texts))
        if query[1] > 0
    ]
    if not queries:
        return None
    before = unit_vectors[: checkpoint(recorded)]

    def moments(query: tuple[list[int], int]) -> tuple[float, float]:
        # the cosine with a rounded unit: its dot over the length the unit was rounded to
        cosines = [
            0.0
            if unit[1] == 0
            else sum(x * y for x, y in zip(rounded(unit)[0], query[0], strict=True))
            / (256 * math.sqrt(query[1]))
            for unit in before
        ]
        n = len(before) + 16
        mean = (sum(cosines) + 16 * weights.prior_mean) / n
        second = (
            sum(c * c for c in cosines) + 16 * (weights.prior_mean**2 + weights.prior_sd**2)
        ) / n
        return mean, math.sqrt(max(second - mean * mean, 0.01**2))

    def standardized(query: tuple[list[int], int]) -> float:
        units = kept if kept is not None else tuple(tuple(v) for v, _ in before)
        key = (embedder.name, tuple(query[0]), units, weights.prior_mean, weights.prior_sd)
        found = _MOMENTS.get(key)
        if found is None:
            if len(_MOMENTS) > 100_000:
                _MOMENTS.clear()
            found = _MOMENTS[key] = moments(query)
        mean, sd = found
        return (cosine(unit_vectors[row], query) - mean) / sd

    # the moments depend on the query and the units before the checkpoint: kept by their
    # contents when given (cheap to compare), else by their vectors
    kept = tuple(contents[: len(before)]) if contents is not None else None
    best = max(standardized(query) for _, query in queries)
    if len(queries) > 1:
        joined = quantized("\n".join(text for text, _ in queries), embedder)
        best = 0.5 * best + 0.5 * standardized(joined)
    return normal_cdf(best) ** (weights.semantic_power * (len(queries) + 1) / 2)


def normal_cdf(z: float) -> float:
    """The normal distribution function as the Field computes it: erf by Abramowitz and
    Stegun 7.1.26 (within 1.5e-7 of ``math.erf``)."""
    x = abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * math.exp(-x * x)
    return 0.5 * (1.0 + (erf if z >= 0 else -erf))


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
    unit_vectors = [
        (vectors or {}).get(unit["id"]) or quantized(unit["content"], embedder) for unit in units
    ]
    contents = [unit["content"] for unit in units]
    texts = [*compared(query.interests), *([query.context_hint] if query.context_hint else [])]

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
        semantic = calibrated(
            unit_vectors, row, texts, embedder, weights, n, None if vectors else contents
        )
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
