"""What an agent's feedback teaches its relevance (FEEDBACK, :mod:`field.core.feedback`).

Per agent the Field keeps :class:`Judged`: the sums of the unit-length content embeddings
of the units it judged useful and of those it judged not, and their counts. From them, what the
agent's relevance profile compares units with (:class:`~field.ranking.relevance.Interests`):

* **the units themselves**: the latest :data:`EXEMPLARS` judged useful are compared with
  each unit like interests (each calibrated like one: its own mean and sd over the Field's
  units), so a unit close to one of them matches as well as a unit close to an interest;
  the latest :data:`EXEMPLARS` judged not useful pull a unit down when it is closer to one
  of them than to its best match (by ``penalty`` times the difference);
* **the joined row, moved** (Rocchio's formula): ``j + B * U / n_u - C * D / n_d``, ``j``
  the unit-length joined interests (or the one interest), ``U`` and ``D`` the sums, ``n_u``
  and ``n_d`` their counts (a term of no judgement left out), normalized and quantized;
  the mix then weighs the best match more (``weight``).

The weights are the embedder's (:class:`~field.ranking.relevance.Weights`), chosen on the
labelled set's training split with simulated feedback (``benchmarks/feedback.py``). The
power of the percentile still counts the interests only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .embedding import quantize

#: Units judged useful, and not useful, an agent's profile compares with (the latest).
EXEMPLARS = 32
#: The text a unit judged useful stands for among an agent's interests (no interest is
#: this text: an interest is printable).
LEARNED = "\x00learned"


@dataclass(slots=True)
class Judged:
    """What one agent said of units: the latest rows of each kind in the unit index, and the
    sums of all their unit-length embeddings with their counts."""

    useful: npt.NDArray[np.float64]
    not_useful: npt.NDArray[np.float64]
    useful_count: int = 0
    not_useful_count: int = 0
    #: rows (in the unit index) of the latest units judged useful, and not, oldest first
    liked: list[int] = field(default_factory=list)
    disliked: list[int] = field(default_factory=list)
    #: FEEDBACK operations so far (its profile's generation)
    generation: int = 0

    @classmethod
    def empty(cls, dim: int) -> Judged:
        return cls(np.zeros(dim), np.zeros(dim))

    @property
    def count(self) -> int:
        return self.useful_count + self.not_useful_count

    def add(self, row: int, vector: Any, square: float, useful: bool) -> None:
        """One judgement of the unit at ``row`` (its quantized embedding and squared norm);
        a unit judged again moves to the end of its new kind's list."""
        for rows in (self.liked, self.disliked):
            if row in rows:
                rows.remove(row)
        rows = self.liked if useful else self.disliked
        rows.append(row)
        del rows[:-EXEMPLARS]
        if square <= 0:
            return  # a content with no features is like nothing
        unit = vector.astype(np.float64) / np.sqrt(square)
        if useful:
            self.useful += unit
            self.useful_count += 1
        else:
            self.not_useful += unit
            self.not_useful_count += 1

    def moved(
        self, anchor: tuple[Any, float] | None, useful: float, not_useful: float
    ) -> tuple[Any, float]:
        """``anchor`` (a quantized row and its squared norm; None: nothing) moved towards the
        units judged useful and away from the others, quantized, with its squared norm (0
        when it comes to nothing)."""
        row = np.zeros(len(self.useful))
        if anchor is not None and anchor[1] > 0:
            row += anchor[0].astype(np.float64) / np.sqrt(anchor[1])
        if self.useful_count:
            row += useful * self.useful / self.useful_count
        if self.not_useful_count:
            row -= not_useful * self.not_useful / self.not_useful_count
        norm = float(np.sqrt(row @ row))
        if norm == 0.0:
            return np.zeros(len(row), dtype=np.float32), 0.0
        rows, squares = quantize((row / norm)[None, :].astype(np.float32))
        return rows[0], float(squares[0])
