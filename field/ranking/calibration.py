"""Calibrated similarity: how a unit ranks among the Field's own units, per interest.

A raw cosine means a different thing for each interest and each
embedder: a two-word interest and a sentence rarely pass 0.5 with a
sentence model, a static model puts every text 0.2-0.4 from every
other, and a broad interest sits closer to everything than a narrow
one. So the semantic factor of relevance is not the cosine but where
the cosine stands in the distribution of that interest's cosines over
the units the Field holds:

* ``z = (cos - mean) / sd``, the mean and standard deviation of the
  interest's cosine with the Field's units, computed exactly from two
  running sums of the units' unit-length embeddings (:class:`Calibration`):
  their sum ``s`` and the sum of their outer products ``M``. For an
  interest ``q`` (unit length), ``mean = q.s / n`` and
  ``E[cos^2] = q M q / n``: any interest, new or old, is calibrated
  without reading a single unit;
* an agent's evidence is the mean of its best interest's ``z`` and the
  ``z`` of all its interests as one text (a unit about one interest, a
  unit about the agent as a whole), and its semantic factor
  ``Phi(z) ** ((k + 1) / 2)`` (:func:`percentile`), ``Phi`` the normal
  distribution function and ``k`` how many interests were compared: the
  best of ``k`` draws is not a draw, and the power takes its advantage
  back, so about the same share of the Field's units pass a threshold for
  an agent of one interest as for an agent of five. ``0.9`` means "closer
  than about 90% of this Field's units, for this agent".

**Determinism.** The sums hold integers: each unit's embedding is
scaled to length :data:`SCALE` and rounded, so every sum is exact in
float64 whatever order or batch size adds it up. A scoring made when
``n`` units had been recorded is calibrated against the sums of the
first :func:`checkpoint` ``(n)`` units (0, 8, 16, 32, ... doubling to
65,536, then every 65,536): ATTUNE scores every unit against the same
sums (identical texts score alike), and a notification against those of
its event, so a unit is scored the same when it is pushed, attuned to
while it is the newest, replayed from the log or read back from a
snapshot. Each checkpoint's sums are kept (one ``dim x dim`` matrix,
128 KB at 128 dimensions; about 30 of them at a million units).

**Few units.** The sums start from :data:`PRIOR_UNITS` imagined units
whose cosine with any interest has the embedder's typical mean and
spread (``Weights.prior_mean`` and ``prior_sd``, measured on the
labelled set), so the first units of a Field are calibrated against
that prior and the Field's own units take over as they come.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from .embedding import Vectors

#: the length each unit embedding is scaled to before rounding (integers in the sums)
SCALE = 256.0
#: units added at once up to which their outer products are summed by ``einsum`` on the
#: calling thread rather than by BLAS: 43 us for three units against 129 (a poll that
#: follows a few new units pays it), 313 against 186 for 32
FEW_ROWS = 8
#: imagined units of the prior (see the module docstring)
PRIOR_UNITS = 16
#: checkpoints double up to here, then come every this many units
CHECKPOINT_STEP = 1 << 16
#: the first checkpoint after 0
FIRST_CHECKPOINT = 8
#: the smallest standard deviation a calibration uses (an interest all units match alike)
MIN_SD = 0.01


def checkpoint(counts: Any) -> Any:
    """The units a scoring made when ``counts`` units had been recorded is calibrated
    against: 0 below 8, then the largest power of two up to ``counts``, from 65,536 on the
    largest multiple of 65,536 (see the module docstring)."""
    r = np.asarray(counts, dtype=np.int64)
    doubling = np.where(
        r < FIRST_CHECKPOINT,
        0,
        np.left_shift(1, np.floor(np.log2(np.maximum(r, 1))).astype(np.int64)),
    )
    return np.where(r >= CHECKPOINT_STEP, (r // CHECKPOINT_STEP) * CHECKPOINT_STEP, doubling)


def _next_checkpoint(count: int) -> int:
    if count < FIRST_CHECKPOINT:
        return FIRST_CHECKPOINT
    if count < CHECKPOINT_STEP:
        return 1 << count.bit_length()
    return (count // CHECKPOINT_STEP + 1) * CHECKPOINT_STEP


class Calibration:
    """Running sums of the units' embeddings, kept at every checkpoint."""

    def __init__(self, dim: int, *, prior_mean: float, prior_sd: float) -> None:
        self.dim = dim
        self.prior_mean = prior_mean
        self.prior_sd = prior_sd
        #: units added so far
        self.count = 0
        self._sum = np.zeros(dim, dtype=np.float64)
        self._outer = np.zeros((dim, dim), dtype=np.float64)
        #: the checkpoints reached, ascending, and the sums at each
        self.checkpoints: list[int] = [0]
        self._sums: list[npt.NDArray[np.float64]] = [self._sum.copy()]
        self._outers: list[npt.NDArray[np.float64]] = [self._outer.copy()]

    def add(self, rows: Vectors, squares: npt.NDArray[np.float64]) -> None:
        """Add units' quantized rows (and their squared norms), in row order."""
        start = 0
        while start < len(rows):
            due = _next_checkpoint(self.count)
            stop = min(len(rows), start + due - self.count)
            self._accumulate(rows[start:stop], squares[start:stop])
            self.count += stop - start
            start = stop
            if self.count == due:
                self.checkpoints.append(due)
                self._sums.append(self._sum.copy())
                self._outers.append(self._outer.copy())

    def _accumulate(self, rows: Vectors, squares: npt.NDArray[np.float64]) -> None:
        norms = np.sqrt(squares)
        scaled = np.zeros(rows.shape, dtype=np.float64)
        np.divide(
            rows.astype(np.float64) * SCALE, norms[:, None], out=scaled, where=norms[:, None] > 0
        )
        whole = np.rint(scaled)  # integers of at most SCALE: every sum below is exact
        self._sum += whole.sum(axis=0)
        if len(whole) <= FEW_ROWS:
            # exact in float32 too (a sum of FEW_ROWS products of at most SCALE ** 2 is an
            # integer below 2 ** 24); BLAS hands a product this thin to its threads
            few = whole.astype(np.float32)
            self._outer += np.einsum("ki,kj->ij", few, few)
        else:
            self._outer += whole.T @ whole

    def at(self, counts: Any) -> npt.NDArray[np.intp]:
        """The position in :attr:`checkpoints` of a scoring made when ``counts`` units had
        been recorded (a number or an array): that of the sums of the first
        :func:`checkpoint` ``(counts)`` units."""
        reached = np.array(self.checkpoints, dtype=np.int64)
        found: npt.NDArray[np.intp] = np.searchsorted(reached, checkpoint(counts)).astype(np.intp)
        return found

    def moments(
        self, vectors: Vectors, squares: npt.NDArray[np.float64], at: int
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Mean and standard deviation of each interest's cosine with the units of
        checkpoint ``at`` (a position in :attr:`checkpoints`), the prior included.

        ``vectors`` are quantized interest rows and ``squares`` their squared
        norms (a zero row gets mean 0 and sd 1: it never scores).
        """
        units = self.checkpoints[at]
        total = units + PRIOR_UNITS
        rows = vectors.astype(np.float64)
        norms = np.sqrt(squares)
        safe = np.where(norms > 0, norms, 1.0)
        # exact integers up to the division: rows of at most 127, sums of at most SCALE
        first = (rows @ self._sums[at]) / (SCALE * safe)
        second = np.einsum("ij,ij->i", rows @ self._outers[at], rows) / (SCALE * SCALE * safe**2)
        prior = PRIOR_UNITS
        mean = (first + prior * self.prior_mean) / total
        raw = (second + prior * (self.prior_mean**2 + self.prior_sd**2)) / total
        sd = np.sqrt(np.maximum(raw - mean * mean, MIN_SD * MIN_SD))
        return np.where(norms > 0, mean, 0.0), np.where(norms > 0, sd, 1.0)

    def scales(
        self, vectors: Vectors, squares: npt.NDArray[np.float64], at: int
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Per interest, what turns a dot product with a unit into the standardized cosine
        (:meth:`moments`): ``z = dot * scale / |unit| - shift``, with ``scale = 1 / (|q| sd)``
        and ``shift = mean / sd`` (scale 0 for a zero row)."""
        mean, sd = self.moments(vectors, squares, at)
        norms = np.sqrt(squares)
        scale = np.zeros(len(norms), dtype=np.float64)
        np.divide(1.0, norms * sd, out=scale, where=norms > 0)
        shift: npt.NDArray[np.float64] = mean / sd
        return scale, shift


def standardized(
    dots: npt.NDArray[Any],
    unit_squares: npt.NDArray[np.float64],
    scale: npt.NDArray[np.float64],
    shift: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """``z`` of each (interest, unit) from exact dot products (:meth:`Calibration.scales`);
    a unit with no features has cosine 0 with everything."""
    inverse = np.zeros(len(unit_squares), dtype=np.float64)
    np.divide(1.0, np.sqrt(unit_squares), out=inverse, where=unit_squares > 0)
    out: npt.NDArray[np.float64] = dots * scale[:, None]
    out *= inverse[None, :]
    out -= shift[:, None]
    return out


def normal_cdf(z: Any) -> npt.NDArray[np.float64]:
    """The standard normal distribution function, elementwise (error below 1.5e-7).

    Abramowitz and Stegun 7.1.26 for erf: plain arithmetic, the same
    bits on every machine and for every array shape.
    """
    z = np.asarray(z, dtype=np.float64)
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-x * x)
    result: npt.NDArray[np.float64] = 0.5 * (1.0 + np.where(z >= 0, erf, -erf))
    return result


def percentile(
    best: Any, joined: Any, compared: Any, power: float = 1.0, weight: Any = 0.5
) -> npt.NDArray[np.float64]:
    """The semantic factor of an agent of ``compared`` interests (and hint): ``best`` its
    best interest's standardized similarity, ``joined`` that of all of them as one text
    (read where ``compared`` is above 1).

    ``Phi(z) ** ((compared + 1) / 2)`` with ``z`` the mean of the two (``best``
    alone for one interest): the best interest finds a unit about one of them,
    the joined text a unit about the agent as a whole, and half the advantage
    of the best of ``compared`` draws is taken back by the power. ``power``
    raises the result further (the weights' ``semantic_power``). ``weight`` is the best
    interest's share of the mean (an agent's feedback makes it more: :mod:`field.ranking.learning`);
    above one half ``joined`` is read whatever ``compared`` is.
    """
    count = np.maximum(np.asarray(compared, dtype=np.float64), 1.0)
    weight = np.asarray(weight, dtype=np.float64)
    mixed = weight * np.asarray(best) + (1.0 - weight) * np.asarray(joined)
    z = np.where((count > 1) | (weight != 0.5), mixed, best)
    # the power as exp(log): np.power takes shortcuts for some scalar exponents, and a
    # score must have the same bits whether its exponent came as a scalar or an array
    with np.errstate(divide="ignore"):
        result: npt.NDArray[np.float64] = np.exp(
            np.log(normal_cdf(z)) * (power * (count + 1.0) / 2.0)
        )
    return result
