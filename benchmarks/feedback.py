"""Relevance feedback: how much an agent's relevance improves when it says which units were useful.

    python benchmarks/feedback.py [--embedder wordllama [minilm hashing]] [--items 0 10 20 50]
                                  [--seed 0] [--json] [--designs field ...]

An experiment for a future feedback operation (an agent tells the Field that a unit was useful
or not): no server code changes, the candidate updates of the agent's profile are computed here
over the Field's own factors. Every unit of the labelled set (``benchmarks/data/relevance.json``,
both splits) is recorded into one Field by its recorder, as a server would hold them, and every
agent is scored as ATTUNE scores (:func:`field.ranking.relevance.factors`, calibrated against the
Field's units, no recency). Then, per agent:

* **feedback** comes from the **train** split only, labelled by the set (useful: the agent is in
  the unit's audience), on N units chosen three ways: ``top``, the N train units the agent's
  score ranks best before any feedback (what it was pushed or attuned to); ``rounds``, the same
  in rounds of 5 (score, show the 5 best unseen, take their feedback, update, score again);
  ``random``, N train units drawn at random (seeded);
* the profile is updated by a **design** (below) and the **test** split is scored: pooled ROC
  AUC over every (agent, unit) test pair but the recorder's, each agent's own AUC (mean and
  least), and nDCG@10 of each agent's page of test units (diversified as ATTUNE does, no
  recency), at N = 0, 10, 20, 50 and with every train unit's label (``all``).

``field`` is what the Field does (``FEEDBACK``, ``field/ranking/learning.py``: ``exemplars``
below, with the embedder's weights): its own code, fed the same feedback, nothing to choose;
``--designs field`` runs it alone, in seconds. The other designs, which chose it, each
computable from a few vectors per agent (the sums of the useful and of the
not useful units' unit-length embeddings, their counts) and deterministic:

* ``interest-row``: a Rocchio vector ``v = a*mean(interests) + b*U/(n_u + k) - c*D/(n_d + k)``
  (``U``, ``D`` the sums of the useful and not useful units' unit vectors, ``k`` a pseudo-count
  that lets a few items move the profile less) is quantized like the other rows and compared
  as one more interest: calibrated like one (its own mean and sd over the Field's units), the
  best interest's z is the best of the interests and ``v``, averaged with the joined text's;
  ``counted`` says whether ``v`` counts as a compared interest in the percentile's power;
* ``joined-row``: the joined text's row replaced by ``a*joined + b*U/(n_u + k) - c*D/(n_d + k)``;
* ``both``: the two at once, with the same ``b``, ``c``, ``k``;
* ``exemplars``: each useful unit (the latest :data:`EXEMPLARS`) compared as one more
  interest, calibrated as one: the best z is ``max(best interest z, max_e z_e)``; each not
  useful unit (the latest :data:`EXEMPLARS`) that is closer to a unit than that best pulls it
  down, ``best -= lambda * max(0, max_d z_d - best)``; the joined row moved as in
  ``joined-row`` (``b``, ``c``; none: kept) and weighted ``joined_weight`` (0.5 without
  feedback, as the Field does);
* ``linear``: ``interest-row`` (its chosen settings) plus a per-agent ridge correction,
  ``score + x . w``, ``x`` the unit's fixed factors (the interests' best z, the joined z, the
  keyword, role, type and confidence factors, 1), ``w`` fitted to the feedback's residuals
  (label minus score) with penalty ``lambda``: the feedback's ``x`` and labels are kept.

``a`` is 1 (the vector is normalized: only ``b/a`` and ``c/a`` matter). The settings of each
design are chosen per embedder on the **train** split alone: its units are cut in two folds
(``zlib.crc32(id) // 10 % 2``), feedback is taken from one and AUC read on the other, both ways,
for ``rounds`` and ``random`` at N = 10 and 20; the settings of the best mean are then run on
train -> test. The test split is never read before that.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from _common import machine_line

from field.ranking import relevance
from field.ranking.calibration import percentile, standardized
from field.ranking.embedding import load_embedder, quantize
from field.ranking.learning import Judged
from tests import relevance_eval as ev
from tests.core_util import Harness

Array = npt.NDArray[Any]

#: feedback items are given this many at a time in the ``rounds`` regime
ROUND = 5
REGIMES = ("top", "rounds", "random")
#: the regimes and the numbers of items the settings are chosen on (train split only)
CHOOSE_REGIMES = ("rounds", "random")
CHOOSE_ITEMS = (10, 20)
#: feedback items whose factors the ``linear`` design keeps (the latest)
LINEAR_ITEMS = 64
#: useful units, and not useful ones, the ``exemplars`` design keeps (the latest of each)
EXEMPLARS = 32


# -- the Field and each agent's fixed factors -----------------------------------------------


@dataclass
class Agent:
    """One agent's candidate rows (every unit but its own) and the factors that feedback does
    not change, aligned with ``rows``."""

    id: str
    rows: Array
    labels: Array
    train: Array
    fold: Array
    role: Array
    interest: Array | None
    type_weight: Array
    confidence: Array
    #: z of each interest, and of the joined text (None for one interest), per row
    z_interests: Array
    z_joined: Array | None
    #: interests compared (the percentile's k)
    count: int
    #: unit-length embeddings: the interests' mean, the joined text's, each row's unit
    interest_mean: Array
    joined: Array | None
    units: Array
    #: the Field's own semantic factor (for the check that this script scores as it does)
    semantic: Array
    #: the interests it registered (the ``field`` design compares them as the Field does)
    interests: list[str] = field(default_factory=list)


@dataclass
class Setup:
    embedder: str
    index: relevance.UnitIndex
    weights: relevance.Weights
    at: int
    agents: list[Agent]
    seconds: float
    #: z of every unit's row (as an interest) with every unit: ``unit_z[u, r]``
    unit_z: Array

    def exemplar_z(self, agent: Agent, positions: list[int]) -> Array:
        """z of some of the agent's rows (each as an interest) with each of its rows."""
        found: Array = self.unit_z[np.ix_(agent.rows[positions], agent.rows)]
        return found

    def z(self, agent: Agent, vector: Array) -> Array:
        """z of a profile vector (float, any length) with each of the agent's rows: quantized
        like every row and calibrated against the Field's units, as an interest is."""
        row, square = quantize(vector[None, :].astype(np.float32))
        if square[0] == 0:
            return np.full(len(agent.rows), -np.inf)
        dots = self.index.dots(row, agent.rows).T.astype(np.float64)
        scale, shift = self.index.calibration.scales(row, square, self.at)
        z: Array = standardized(dots, self.index.squares[agent.rows], scale, shift)[0]
        return z

    def combine(self, agent: Agent, semantic: Array) -> Array:
        return relevance.combine(
            self.weights,
            role=agent.role,
            interest=agent.interest,
            semantic=semantic,
            type_weight=agent.type_weight,
            task=None,
            confidence=agent.confidence,
            recency=1.0,
            recency_weight=0.0,
        )


def unit_rows(vectors: Array, squares: Array) -> Array:
    norms = np.sqrt(np.asarray(squares, dtype=np.float64))
    out = np.zeros(vectors.shape, dtype=np.float64)
    np.divide(vectors.astype(np.float64), norms[:, None], out=out, where=norms[:, None] > 0)
    return out


def build(data: dict[str, Any], spec: str) -> Setup:
    """Record every unit into one Field and read each agent's factors."""
    start = time.perf_counter()
    h = Harness(embedder=load_embedder(spec))
    for agent in data["agents"]:
        h.register(agent["id"], agent["role"], interests=agent["interests"])
    by_id = ev.record_units(h, data["units"])
    index = h.field.state.index
    units = unit_rows(index.vectors, index.squares)
    at = int(index.calibration.at(len(index)))
    agents = []
    for agent in data["agents"]:
        query = ev.agent_query(agent)
        rows = relevance.candidates(index, query)
        f = relevance.factors(index, query, rows)
        assert f.semantic is not None and f.task is None
        interests = query.vectors(index)
        vectors, squares = interests.vectors, interests.squares
        if interests.joined is not None:
            vectors = np.concatenate([vectors, interests.joined[0][None, :]])
            squares = np.append(squares, interests.joined[1])
        dots = index.dots(vectors, rows).T.astype(np.float64)
        z = index.standardized(dots, vectors, squares, rows, np.broadcast_to(at, rows.shape))
        count = len(interests.texts)
        ids = [by_id[index.ids[r]]["id"] for r in rows.tolist()]
        agents.append(
            Agent(
                id=agent["id"],
                rows=rows,
                labels=np.array([agent["id"] in by_id[index.ids[r]]["audience"] for r in rows]),
                train=np.array([by_id[index.ids[r]]["split"] == "train" for r in rows]),
                fold=np.array([zlib.crc32(i.encode()) // 10 % 2 for i in ids]),
                role=f.role,
                interest=f.interest,
                type_weight=f.type_weight,
                confidence=f.confidence,
                z_interests=z[:count],
                z_joined=z[count] if interests.joined is not None else None,
                count=count,
                interest_mean=unit_rows(interests.vectors, interests.squares).mean(0),
                joined=(
                    None
                    if interests.joined is None
                    else unit_rows(interests.joined[0][None, :], np.array([interests.joined[1]]))[0]
                ),
                units=units[rows],
                semantic=f.semantic,
                interests=list(agent["interests"]),
            )
        )
    vectors, squares = index.vectors, index.squares
    scale, shift = index.calibration.scales(vectors, squares, at)
    dots = vectors.astype(np.float64) @ vectors.T.astype(np.float64)
    unit_z = standardized(dots, squares, scale, shift)
    setup = Setup(spec, index, index.weights, at, agents, time.perf_counter() - start, unit_z)
    for agent in agents:  # this script's semantic factor is the Field's, to the bit
        mine = percentile(
            agent.z_interests.max(0),
            agent.z_joined if agent.z_joined is not None else 0.0,
            agent.count,
            setup.weights.semantic_power,
        )
        assert np.array_equal(mine, agent.semantic), agent.id
    return setup


# -- feedback and the designs -------------------------------------------------------------


@dataclass
class Feedback:
    """What the Field would keep per agent: the sums of the useful and not useful units'
    unit-length embeddings and their counts (and, for ``linear``, the latest items)."""

    useful: Array
    useless: Array
    n_useful: int = 0
    n_useless: int = 0
    items: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, dim: int) -> Feedback:
        return cls(np.zeros(dim), np.zeros(dim))

    def add(self, agent: Agent, position: int) -> None:
        if agent.labels[position]:
            self.useful = self.useful + agent.units[position]
            self.n_useful += 1
        else:
            self.useless = self.useless + agent.units[position]
            self.n_useless += 1
        self.items = [*self.items, position]

    def latest(self, agent: Agent, useful: bool, count: int) -> list[int]:
        """The latest ``count`` items of the label ``useful``."""
        return [i for i in self.items if agent.labels[i] == useful][-count:]

    @property
    def size(self) -> int:
        return self.n_useful + self.n_useless

    def moved(self, anchor: Array, b: float, c: float, k: float) -> Array:
        """``anchor + b*U/(n_u + k) - c*D/(n_d + k)`` (a term with no items is 0)."""
        v = anchor.copy()
        if self.n_useful:
            v += b * self.useful / (self.n_useful + k)
        if self.n_useless:
            v -= c * self.useless / (self.n_useless + k)
        return v


class Design:
    name = "none"

    def grid(self) -> list[dict[str, Any]]:
        return [{}]

    def scores(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array:
        return s.combine(agent, agent.semantic)


def _joined(agent: Agent) -> Array | float:
    return agent.z_joined if agent.z_joined is not None else 0.0


class InterestRow(Design):
    name = "interest-row"

    def grid(self) -> list[dict[str, Any]]:
        return [
            {"b": b, "c": c, "k": k, "counted": counted}
            for b, c, k, counted in itertools.product(
                (1.0, 2.0, 4.0, 8.0), (0.0, 0.5, 1.0), (0.0, 5.0), (False, True)
            )
        ]

    def best_z(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array:
        best: Array = agent.z_interests.max(0)
        if fb.size:
            v = fb.moved(agent.interest_mean, p["b"], p["c"], p["k"])
            best = np.maximum(best, s.z(agent, v))
        return best

    def semantic(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array:
        count = agent.count + (1 if fb.size and p["counted"] else 0)
        best = self.best_z(s, agent, fb, p)
        return percentile(best, _joined(agent), count, s.weights.semantic_power)

    def scores(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array:
        return s.combine(agent, self.semantic(s, agent, fb, p))


class JoinedRow(Design):
    name = "joined-row"

    def grid(self) -> list[dict[str, Any]]:
        return [
            {"b": b, "c": c, "k": k}
            for b, c, k in itertools.product((1.0, 2.0, 4.0, 8.0), (0.0, 0.5, 1.0, 2.0), (0.0, 5.0))
        ]

    def joined_z(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array | float:
        if not fb.size:
            return _joined(agent)
        anchor = agent.joined if agent.joined is not None else agent.interest_mean
        return s.z(agent, fb.moved(anchor, p["b"], p["c"], p["k"]))

    def scores(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array:
        joined = self.joined_z(s, agent, fb, p)
        # an agent of one interest has no joined text: the moved row is averaged in as one
        count = max(agent.count, 2) if fb.size else agent.count
        semantic = percentile(agent.z_interests.max(0), joined, count, s.weights.semantic_power)
        return s.combine(agent, semantic)


class Both(Design):
    name = "both"

    def grid(self) -> list[dict[str, Any]]:
        return [
            {"b": b, "c": c, "k": k, "counted": False}
            for b, c, k in itertools.product((1.0, 2.0, 4.0, 8.0), (0.0, 0.5, 1.0, 2.0), (0.0, 5.0))
        ]

    def scores(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array:
        best = InterestRow().best_z(s, agent, fb, p)
        joined = JoinedRow().joined_z(s, agent, fb, p)
        count = max(agent.count, 2) if fb.size else agent.count
        return s.combine(agent, percentile(best, joined, count, s.weights.semantic_power))


class Exemplars(Design):
    """Each useful unit compared as one more interest, each not useful one held against the
    units it is closer to than the interests are, and the joined row moved as ``joined-row``."""

    name = "exemplars"

    def grid(self) -> list[dict[str, Any]]:
        joined = ((None, None), (2.0, 1.0), (2.0, 2.0), (4.0, 1.0), (4.0, 2.0))
        return [
            {"penalty": penalty, "lambda": lam, "b": b, "c": c, "joined_weight": weight}
            for penalty, lam, (b, c), weight in itertools.product(
                (0.0,), (0.0, 0.5, 1.0, 2.0), joined, (0.5, 0.35)
            )
            if b is not None or weight == 0.5
        ]

    def scores(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array:
        best = agent.z_interests.max(0)
        joined = agent.z_joined if agent.z_joined is not None else best
        count = agent.count
        if fb.size:
            useful = fb.latest(agent, True, EXEMPLARS)
            if useful:
                best = np.maximum(best, s.exemplar_z(agent, useful).max(0) - p["penalty"])
            useless = fb.latest(agent, False, EXEMPLARS)
            if useless and p["lambda"]:
                closer = s.exemplar_z(agent, useless).max(0) - best
                best = best - p["lambda"] * np.maximum(closer, 0.0)
            if p["b"] is not None:
                anchor = agent.joined if agent.joined is not None else agent.interest_mean
                joined = s.z(agent, fb.moved(anchor, p["b"], p["c"], 0.0))
                count = max(count, 2)
        # no feedback: the Field's own mean of the two
        weight = (p["joined_weight"] if fb.size else 0.5) if count > 1 else 0.0
        z = (1.0 - weight) * best + weight * joined
        # percentile of one z: Phi(z) ** (power * (count + 1) / 2)
        return s.combine(agent, percentile(z, z, count, s.weights.semantic_power))


class FieldDesign(Design):
    """What the Field does (``FEEDBACK``, :mod:`field.ranking.learning`): the feedback folded
    into a :class:`~field.ranking.learning.Judged` in order, the agent's interests made with it
    (:func:`~field.ranking.relevance.interest_vectors`) and scored by the unit index, with the
    embedder's weights; nothing to choose."""

    name = "field"

    def scores(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array:
        if not fb.size:
            return s.combine(agent, agent.semantic)
        judged = Judged.empty(s.index.embedder.dim)
        for position in fb.items:
            row = int(agent.rows[position])
            square = float(s.index.squares[row])
            judged.add(row, s.index.vectors[row], square, bool(agent.labels[position]))
        interests = relevance.interest_vectors(s.index, agent.interests, judged=judged)
        return s.combine(agent, s.index.calibrated(interests, agent.rows)[0])


class Linear(Design):
    """``interest-row`` at ``base`` plus a ridge correction on fixed factors."""

    name = "linear"

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base

    def grid(self) -> list[dict[str, Any]]:
        return [{"lambda": value} for value in (3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)]

    @staticmethod
    def features(agent: Agent) -> Array:
        interest = (
            np.zeros(len(agent.rows)) if agent.interest is None else np.nan_to_num(agent.interest)
        )
        columns = [
            agent.z_interests.max(0),
            agent.z_joined if agent.z_joined is not None else np.zeros(len(agent.rows)),
            interest,
            agent.role,
            agent.type_weight,
            agent.confidence,
            np.ones(len(agent.rows)),
        ]
        return np.stack(columns, axis=1)

    def scores(self, s: Setup, agent: Agent, fb: Feedback, p: dict[str, Any]) -> Array:
        base = InterestRow().scores(s, agent, fb, self.base)
        if not fb.size:
            return base
        x = self.features(agent)
        items = np.array(fb.items[-LINEAR_ITEMS:])
        residual = agent.labels[items].astype(np.float64) - base[items]
        xi = x[items]
        w = np.linalg.solve(xi.T @ xi + p["lambda"] * np.eye(x.shape[1]), xi.T @ residual)
        out: Array = base + x @ w
        return out


# -- simulation and measures --------------------------------------------------------------


def ranked(scores: Array, positions: Array) -> Array:
    """``positions`` best first by ``scores``; ties to the earlier row."""
    out: Array = positions[np.lexsort((positions, -scores[positions]))]
    return out


def simulate(
    s: Setup,
    agent: Agent,
    design: Design,
    params: dict[str, Any],
    pool: Array,
    regime: str,
    items: list[int],
    rng: np.random.Generator,
) -> dict[int, Array]:
    """The agent's scores after feedback on N items of ``pool`` (positions into its rows), for
    each N of ``items`` (ascending; N beyond the pool takes the whole pool)."""
    fb = Feedback.empty(agent.units.shape[1])
    given: list[int] = []
    order: Array | None = None
    if regime == "random":
        order = rng.permutation(pool)
    elif regime == "top":
        order = ranked(design.scores(s, agent, fb, params), pool)
    out = {}
    for n in items:
        n = min(n, len(pool))
        while len(given) < n:
            if order is not None:
                picked = order[len(given) : n].tolist()
            else:
                current = design.scores(s, agent, fb, params)
                unseen = np.setdiff1d(pool, np.array(given, dtype=np.intp))
                picked = ranked(current, unseen)[: min(ROUND, n - len(given))].tolist()
            for position in picked:
                fb.add(agent, position)
            given.extend(picked)
        out[n] = design.scores(s, agent, fb, params)
    return out


def measures(s: Setup, scores: list[Array], masks: list[Array]) -> dict[str, float]:
    """Pooled and per-agent ROC AUC and mean nDCG@10 over the rows of ``masks``."""
    pooled_s = np.concatenate([sc[m] for sc, m in zip(scores, masks, strict=True)])
    pooled_y = np.concatenate([a.labels[m] for a, m in zip(s.agents, masks, strict=True)])
    aucs, ndcgs = [], []
    for agent, sc, m in zip(s.agents, scores, masks, strict=True):
        auc = ev.roc_auc(sc[m], agent.labels[m])
        if not math.isnan(auc):
            aucs.append(auc)
        rows = agent.rows[m]
        diversified = relevance.diversify(s.index, rows, sc[m])
        page = ranked(diversified, np.arange(len(rows)))[: ev.PAGE]
        gain = ev.ndcg(agent.labels[m][page].tolist(), int(agent.labels[m].sum()))
        if not math.isnan(gain):
            ndcgs.append(gain)
    return {
        "auc": ev.roc_auc(pooled_s, pooled_y),
        "mean_agent_auc": float(np.mean(aucs)),
        "min_agent_auc": float(min(aucs)),
        "ndcg_at_10": float(np.mean(ndcgs)),
    }


def run(
    s: Setup,
    design: Design,
    params: dict[str, Any],
    pools: list[Array],
    evals: list[Array],
    regime: str,
    items: list[int],
    seed: int,
) -> dict[int, dict[str, float]]:
    """Measures at each N of ``items`` (a huge N: the whole pool)."""
    per_agent = [
        simulate(s, agent, design, params, pool, regime, items, np.random.default_rng([seed, j]))
        for j, (agent, pool) in enumerate(zip(s.agents, pools, strict=True))
    ]
    out = {}
    for n in items:
        scores = [found[min(n, len(pool))] for found, pool in zip(per_agent, pools, strict=True)]
        out[n] = measures(s, scores, evals)
    return out


def choose(s: Setup, design: Design, seed: int) -> tuple[dict[str, Any], float]:
    """The settings of ``design`` with the best mean pooled AUC inside the train split."""
    best: tuple[float, dict[str, Any]] | None = None
    for params in design.grid():
        found = []
        for fold in (0, 1):
            pools = [np.flatnonzero(a.train & (a.fold == fold)) for a in s.agents]
            evals = [a.train & (a.fold != fold) for a in s.agents]
            for regime in CHOOSE_REGIMES:
                result = run(s, design, params, pools, evals, regime, list(CHOOSE_ITEMS), seed)
                found.extend(r["auc"] for r in result.values())
        score = float(np.mean(found))
        if best is None or score > best[0]:
            best = (score, params)
    assert best is not None
    return best[1], best[0]


ALL = 1 << 30


def evaluate(
    data: dict[str, Any],
    spec: str,
    items: list[int],
    seed: int,
    verbose: bool,
    only: list[str] | None = None,
) -> dict[str, Any]:
    s = build(data, spec)
    if verbose:
        print(f"{spec}: recorded and scored the set in {s.seconds:.1f} s", file=sys.stderr)
    pools = [np.flatnonzero(a.train) for a in s.agents]
    tests = [~a.train for a in s.agents]
    steps = sorted(set(items)) + [ALL]
    designs: list[Design] = [FieldDesign(), InterestRow(), JoinedRow(), Both(), Exemplars()]
    if only is not None:
        designs = [d for d in designs if d.name in only]
    chosen: dict[str, dict[str, Any]] = {}
    results: dict[str, Any] = {}
    start = time.perf_counter()
    for design in designs:
        params, train_auc = choose(s, design, seed)
        chosen[design.name] = {"params": params, "train_auc": train_auc}
    if (only is None or "linear" in only) and "interest-row" in chosen:
        base = chosen["interest-row"]["params"] if "interest-row" in chosen else {}
        linear = Linear(base)
        params, train_auc = choose(s, linear, seed)
        chosen["linear"] = {"params": {**params, "base": linear.base}, "train_auc": train_auc}
        designs.append(linear)
    choosing = time.perf_counter() - start
    for design in designs:
        params = chosen[design.name]["params"]
        results[design.name] = {
            regime: {
                ("all" if n == ALL else str(n)): m
                for n, m in run(s, design, params, pools, tests, regime, steps, seed).items()
            }
            for regime in REGIMES
        }
    return {
        "embedder": spec,
        "pairs": int(sum(t.sum() for t in tests)),
        "relevant_pairs": int(sum(a.labels[t].sum() for a, t in zip(s.agents, tests, strict=True))),
        "without_feedback": measures(
            s, [Design().scores(s, a, Feedback.empty(1), {}) for a in s.agents], tests
        ),
        "chosen": chosen,
        "results": results,
        "seconds": {
            "build": s.seconds,
            "choose": choosing,
            "total": time.perf_counter() - start + s.seconds,
        },
    }


def report(found: dict[str, Any]) -> None:
    base = found["without_feedback"]
    print(
        f"embedder {found['embedder']}: test split, {found['pairs']} pairs, "
        f"{found['relevant_pairs']} relevant; without feedback AUC {base['auc']:.3f} "
        f"(per agent mean {base['mean_agent_auc']:.3f}, least {base['min_agent_auc']:.3f}), "
        f"nDCG@10 {base['ndcg_at_10']:.3f}"
    )
    for name, regimes in found["results"].items():
        chosen = found["chosen"][name]
        params = ", ".join(f"{k}={v}" for k, v in chosen["params"].items())
        print(f"  design {name} ({params}; train-split AUC {chosen['train_auc']:.3f})")
        print("    N    " + "".join(f"{r + ' AUC/mean/min/nDCG':<30}" for r in REGIMES))
        for n in next(iter(regimes.values())):
            cells = []
            for regime in REGIMES:
                m = regimes[regime][n]
                cells.append(
                    f"{m['auc']:.3f} {m['mean_agent_auc']:.3f} {m['min_agent_auc']:.3f} "
                    f"{m['ndcg_at_10']:.3f}".ljust(30)
                )
            print(f"    {n:<4} " + "".join(cells))
    seconds = found["seconds"]
    print(
        f"  {seconds['build']:.1f} s to record and score, {seconds['choose']:.1f} s to choose "
        f"the settings, {seconds['total']:.1f} s in all"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedder", nargs="+", default=["wordllama"])
    parser.add_argument("--items", type=int, nargs="+", default=[0, 10, 20, 50])
    parser.add_argument("--seed", type=int, default=0, help="of the random feedback")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--designs",
        nargs="+",
        choices=("field", "interest-row", "joined-row", "both", "exemplars", "linear"),
        help="only these designs (default: all; field alone needs no search: seconds)",
    )
    args = parser.parse_args()
    data = ev.load()
    found = [
        evaluate(data, spec, args.items, args.seed, not args.json, args.designs)
        for spec in args.embedder
    ]
    if args.json:
        print(json.dumps(found, indent=1))
        return
    print(machine_line())
    for one in found:
        report(one)


if __name__ == "__main__":
    main()
