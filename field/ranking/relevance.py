"""Relevance of memory units to an attuning agent, computed over columns.

The :class:`UnitIndex` keeps one row per memory unit, in the order the
units were recorded (so rows ascend by epoch), as numpy columns, plus an
inverted index from keyword to rows. :func:`score` rates every candidate
row at once; nothing loops over units in Python.

The index also holds each unit's content embedding (``vectors``, in the
quantized form of :func:`field.ranking.embedding.quantize`), computed in
batches: :meth:`UnitIndex.add` queues the content and the first read of
the vectors (or a full batch) embeds what is queued, so a replay of the
whole log embeds 1,024 units per call. Live, a batch is full at
:data:`EMBED_LIVE` units, and always at :data:`EMBED_BATCH_CHARS`
characters, so no read (nor record) ever pays for embedding more than
that: the queue never holds a backlog of long contents for the next
ATTUNE to embed.

With a sentence model (milliseconds per text) the index is
:attr:`~UnitIndex.deferred`: reading it embeds nothing, and whoever owns
the Field embeds what is queued elsewhere (:meth:`UnitIndex.queued`, then
:meth:`UnitIndex.supply`: the server does it after the commit, off its
event loop). Meanwhile only the first :attr:`~UnitIndex.scorable` rows,
those embedded, are scored: ATTUNE's candidates and DETECT's scan stop
there, and a poll's ``epoch`` stays below the first unit not yet embedded.

A score is ``content * ((1 - rw) + rw * recency)`` where ``rw`` is the
scope's ``recency_weight`` and ``content`` is the weighted mean of the
factors that apply to this request:

=========  ======  ===============================================  ==========
factor     weight  value                                            applies
=========  ======  ===============================================  ==========
role       W_ROLE  1 for a unit by an agent of the same role, else  always
                   the share of the role's keywords in the
                   recorder's role
interest   W_INT   ``min(1, m / k) ** power``: ``m`` the            interests
                   interest and hint keywords found in the unit's   or hint
                   content, purpose and question, ``k`` the
                   keywords per interest (:func:`keyword_unit`)
semantic   W_SEM   the calibrated similarity of the unit's content  the hint or
                   with the best of the interests and the hint,     interests
                   each embedded on its own: how many of the        embed
                   Field's units it is closer than
                   (:mod:`~field.ranking.calibration`)
type       W_TYPE  :data:`~field.contract.model.TYPE_IMPORTANCE`             always
task       W_TASK  1 when the unit serves the agent's task          a task
confidence W_CONF  confidence.score (0.5 for a draft without one)   always
=========  ======  ===============================================  ==========

The weights, the interest power and the recommended threshold (a
:class:`Weights`) are the same for every embedder, chosen by measurement on
the labelled sets (``benchmarks/relevance.py``), but for hashing's heavier
keywords; :func:`weights_for` gives hashing (:data:`LEXICAL`) and the models
(:data:`SENTENCE`) each the prior of its calibration.
What a unit says is its content, purpose and question: who recorded it
counts through the role factor alone, so a unit by a ``market_researcher``
does not match an interest in "market".

Recency halves every ``RECENCY_HALF_LIFE`` units recorded after the unit,
and takes at most ``rw`` of the score away from an old unit: a new unit
(as every unit is when subscriptions are matched) keeps its content
score whole. Every factor lies in [0, 1] and the weights are normalized,
so the score does too. :func:`combine` is the formula; ATTUNE applies it to many units
for one agent (:func:`score`), subscription matching to one unit for many
subscribers (``field.subscriptions.matcher``). A unit's score depends
only on the unit, the agent, how many units were recorded after it and
the units before the calibration checkpoint of the scoring (which the
number of units recorded by then decides), never on the rest of the log,
so a notification replayed from the log scores exactly as it did live.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import sys
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from ..contract.model import MEMORY_TYPES, TYPE_IMPORTANCE, UNIT_STATUSES
from .calibration import Calibration, percentile, standardized
from .embedding import STOPWORDS, Embedder, Vectors, cosine, default_embedder, quantize
from .learning import LEARNED, Judged

RECENCY_HALF_LIFE = 256.0
DIVERSITY_DECAY = 0.92


@dataclass(frozen=True, slots=True)
class Weights:
    """The formula's weights and shape for one kind of embedder, and its threshold.

    Chosen by measurement on the training split of the labelled set
    (``benchmarks/relevance.py --tune``): a lexical embedder's cosine says
    little beyond the words an interest shares with a unit, a sentence
    embedder's says more than the words do, so each gets its own.
    """

    #: ``lexical`` or ``sentence``: the profile's name (status and docs)
    name: str
    role: float
    interest: float
    semantic: float
    type: float
    task: float
    confidence: float
    #: the interest factor is the share of an interest's keywords matched, to this power
    interest_power: float
    #: the ``min_relevance`` the docs recommend with this embedder: on the labelled set it
    #: keeps most irrelevant units out of a stream and the most relevant ones in
    threshold: float
    #: the typical mean and spread of an interest's cosine with a unit, for this kind of
    #: embedder: the prior of the calibration (:mod:`field.ranking.calibration`)
    prior_mean: float = 0.0
    prior_sd: float = 0.1
    #: the semantic factor is the calibrated percentile to this power: most units of a Field
    #: are about something else, and their percentiles spread evenly over [0, 1]; a power
    #: keeps them low, so that role, task and keywords still order them
    semantic_power: float = 1.0
    #: what an agent's feedback teaches (:mod:`field.ranking.learning`): how far the joined row
    #: moves towards the units judged useful and away from the others; the share of a unit's
    #: lead over its best match a closer unit judged not useful takes; the best match's
    #: share of the mixed similarity once the agent gave feedback (0.5 before)
    feedback_useful: float = 2.0
    feedback_not_useful: float = 2.0
    feedback_penalty: float = 0.5
    feedback_weight: float = 0.65

    @property
    def semantic_note(self) -> float:
        """The semantic factor of a calibrated similarity of :data:`SEMANTIC_NOTE`."""
        note: float = SEMANTIC_NOTE**self.semantic_power
        return note

    def calibrated(self, factor: float) -> float:
        """The calibrated similarity (how many of the Field's units a unit is closer than)
        behind a semantic ``factor``."""
        return float(factor ** (1.0 / self.semantic_power))


#: the hashing embedder's. The threshold and most weights are every embedder's: the semantic
#: factor is calibrated (a percentile of the Field's own units, :mod:`field.ranking.calibration`),
#: so one threshold means about the same share of a Field's units for every agent and every
#: embedder. Hashing's calibration has its own prior (its cosines are lower, more spread),
#: and its keywords weigh more: its embedding sees little beyond the words themselves
LEXICAL = Weights(
    name="lexical",
    role=0.10,
    interest=0.60,
    semantic=1.0,
    type=0.05,
    task=0.50,
    confidence=0.05,
    interest_power=0.5,
    threshold=0.45,
    prior_mean=0.02,
    prior_sd=0.10,
    semantic_power=4.0,
    feedback_useful=4.0,
    feedback_not_useful=1.0,
    feedback_penalty=2.0,
)
#: every embedder of a model (wordllama, the default; minilm, sentence-transformers)
SENTENCE = replace(
    LEXICAL,
    name="sentence",
    interest=0.20,
    prior_mean=0.07,
    prior_sd=0.09,
    feedback_useful=2.0,
    feedback_not_useful=2.0,
    feedback_penalty=0.5,
)


def weights_for(embedder: Embedder) -> Weights:
    """The weights that fit ``embedder``: :data:`LEXICAL` for hashing, else :data:`SENTENCE`."""
    return LEXICAL if embedder.name.startswith("hashing") else SENTENCE


#: a calibrated similarity at least this high (closer than 90% of the Field's units) is named
#: in ``relevance_reason`` (:meth:`Weights.semantic_note`: the semantic factor it is)
SEMANTIC_NOTE = 0.9
#: units embedded per call of the embedder
EMBED_BATCH = 1024
#: units a record queues before it embeds them: bounds the work of the write that happens to
#: flush the queue (wordllama: about 35-110 us a unit, 4-15 ms for 128; at 650 units of 100
#: characters, where the characters' bound came first, that write's batch waited 25-35 ms).
#: A replay embeds EMBED_BATCH at a time (:meth:`UnitIndex.in_bulk`)
EMBED_LIVE = 128
#: characters embedded per call at most (beyond one content): with :data:`EMBED_LIVE`, bounds
#: the work of the request that happens to flush the queue when contents are long
EMBED_BATCH_CHARS = 65536
#: Interests of an agent compared one by one with a unit (the first ones; see
#: :func:`interest_vectors`)
COMPARED_INTERESTS = 16
#: Query texts whose embeddings the index keeps (see :meth:`UnitIndex.embed`).
QUERY_TEXTS = 256
#: A step of a :class:`Ranking` reads at most this many cells (rows x dimensions) of the
#: unit matrix: 4 MB of float32, 4,096 rows of 256 dimensions, 2,730 of 384
STEP_CELLS = 1 << 20
#: A :class:`Ranking` first scores exactly this many rows beyond the page's (of the highest
#: bounds), then eight times as many at each round
FIRST_ROWS = 1024

#: "purged" is no unit status: it marks the row a purged unit leaves behind (COMPACT)
STATUS_CODE = {status: code for code, status in enumerate((*UNIT_STATUSES, "purged"))}
STATUS_NAMES = tuple(STATUS_CODE)
#: Up to this many (rows x query words), coverage reads the rows' keyword sets directly.
FEW_CELLS = 4096
TYPE_CODE = {memory_type: code for code, memory_type in enumerate(sorted(MEMORY_TYPES))}
_HIDDEN_CODES = np.array(
    [STATUS_CODE["superseded"], STATUS_CODE["retracted"], STATUS_CODE["purged"]], dtype=np.int8
)
_ARCHIVED_CODE = STATUS_CODE["archived"]
#: per status code, whether a unit of that status is shown (not among the hidden codes)
_SHOWN = ~np.isin(np.arange(len(STATUS_CODE), dtype=np.int8), _HIDDEN_CODES)

_WORD = re.compile(r"[a-z0-9]+")

_Scales = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
#: per calibration, the scales of query rows at a checkpoint (:meth:`UnitIndex._scales`):
#: kept beside the index, not in it (a snapshot holds what the index is, not what it saw)
_SCALED: weakref.WeakKeyDictionary[Calibration, dict[tuple[bytes, bytes, int], _Scales]] = (
    weakref.WeakKeyDictionary()
)


def ranges(starts: npt.NDArray[Any], lengths: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    """The integers of ``[start, start + length)`` for each (start, length), end to end."""
    lengths = np.asarray(lengths, dtype=np.intp)
    total = int(lengths.sum())
    shift = np.asarray(starts, dtype=np.intp) - (np.cumsum(lengths) - lengths)
    found: npt.NDArray[np.intp] = np.arange(total, dtype=np.intp) + np.repeat(shift, lengths)
    return found


def _product(block: Vectors, vectors: Vectors) -> Vectors:
    """``block @ vectors.T`` on this thread: a BLAS call on several threads waits for a
    busy core (milliseconds on a loaded machine) where a part of the matrix takes less.
    Exact all the same: the rows are integers, and so is every partial sum."""
    found: Vectors
    if vectors.ndim == 1:
        found = np.einsum("ij,j->i", block, vectors)
    else:
        found = np.einsum("ij,kj->ik", block, vectors)
    return found


def keywords(text: str | None) -> list[str]:
    """The keywords of ``text``: lower-case words, no stop words, plural 's' removed.

    Each word of the text is looked at once (a long content repeats its words),
    and kept as the one string of that word (interned): the index holds every
    unit's keywords, and units share most of their words.
    """
    if not text:
        return []
    words = []
    for word in dict.fromkeys(_WORD.findall(text.lower())):
        if len(word) < 2 or word in STOPWORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        words.append(sys.intern(word))
    return words


def unit_keywords(unit: dict[str, Any]) -> frozenset[str]:
    intent = unit["intent"]
    text = " ".join(
        part for part in (unit["content"], intent.get("purpose"), intent.get("question")) if part
    )
    return frozenset(keywords(text))


class Interner:
    """Maps strings to small integer codes (for columns)."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        #: the strings by code
        self.names: list[str] = []

    def __len__(self) -> int:
        return len(self._codes)

    def code(self, value: str) -> int:
        code = self._codes.get(value)
        if code is None:
            code = self._codes[value] = len(self._codes)
            self.names.append(value)
        return code

    def find(self, value: str | None) -> int:
        if value is None:
            return -2
        return self._codes.get(value, -2)


class Column:
    """A growable numpy column (amortized O(1) append)."""

    def __init__(self, dtype: npt.DTypeLike, capacity: int = 64) -> None:
        self._data = np.zeros(capacity, dtype=dtype)
        self.size = 0

    @classmethod
    def of(cls, values: npt.NDArray[Any]) -> Column:
        """A column holding ``values`` (copied once, with an eighth more room to grow)."""
        column = cls(values.dtype, capacity=max(2, len(values) + len(values) // 8))
        column._data[: len(values)] = values
        column.size = len(values)
        return column

    def append(self, value: Any) -> None:
        if self.size == len(self._data):
            self._data = np.concatenate([self._data, np.zeros_like(self._data)])
        self._data[self.size] = value
        self.size += 1

    def extend(self, values: npt.NDArray[Any]) -> None:
        needed = self.size + len(values)
        while needed > len(self._data):
            self._data = np.concatenate([self._data, np.zeros_like(self._data)])
        self._data[self.size : needed] = values
        self.size = needed

    @property
    def view(self) -> npt.NDArray[Any]:
        return self._data[: self.size]

    def __setitem__(self, index: int, value: Any) -> None:
        self._data[index] = value


#: Rows of the next buffer an append-only :class:`Matrix` fills per row appended (the buffer
#: is begun at two thirds of the current one: it holds every row before that one is full)
AHEAD_ROWS = 4
#: Capacity below which a :class:`Matrix` grows at once (the copy is short)
AHEAD_FROM = 4096


class Matrix:
    """A growable matrix of fixed width (amortized O(1) append of row blocks): float32,
    or another ``dtype`` the rows are converted to as they are copied in.

    Grown by half again when full, all rows copied at once; or, for rows that never change
    once appended (``extend(..., ahead=True)``), into the next buffer a few rows with each
    append from two thirds full on, so that no append copies them all: the unit index's
    33,000 rows of 256 float32 took one record 150 ms to copy (each page of the new buffer
    faulted in, on a loaded host), the cost of a growth spread over the appends instead.
    """

    def __init__(self, width: int, dtype: npt.DTypeLike = np.float32) -> None:
        self._data: npt.NDArray[Any] = np.zeros((64, width), dtype=dtype)
        self.size = 0
        #: the next, larger buffer while rows are moved into it ahead, and how many are
        self._next: npt.NDArray[Any] | None = None
        self._moved = 0

    @classmethod
    def of(cls, rows: npt.NDArray[Any], width: int) -> Matrix:
        """A matrix holding ``rows`` (of any numeric type: converted as they are copied,
        once, with an eighth more room to grow)."""
        matrix = cls(width)
        count = len(rows)
        matrix._data = np.zeros((max(64, count + count // 8), width), dtype=np.float32)
        matrix._data[:count] = rows
        matrix.size = count
        return matrix

    def extend(self, rows: npt.NDArray[Any], *, ahead: bool = False) -> None:
        """Append ``rows``; ``ahead``: this matrix's rows are never changed once appended,
        so they may be moved into the next buffer before this one is full."""
        needed = self.size + len(rows)
        if ahead:
            self._move_ahead(len(rows), needed)
        if needed > len(self._data):
            capacity = max(needed, len(self._data) * 3 // 2)
            grown = np.zeros((capacity, self._data.shape[1]), dtype=self._data.dtype)
            self._copy(grown, 0, self.size)
            self._data = grown
        self._data[self.size : needed] = rows
        self.size = needed

    def _move_ahead(self, count: int, needed: int) -> None:
        capacity = len(self._data)
        if self._next is None:
            if capacity < AHEAD_FROM or needed * 3 <= capacity * 2:
                return
            size = max(needed, capacity * 3 // 2)
            self._next, self._moved = np.empty((size, self._data.shape[1]), self._data.dtype), 0
        stop = min(self.size, self._moved + AHEAD_ROWS * count)
        self._copy(self._next, self._moved, stop)
        self._moved = stop
        if needed <= capacity:
            return
        if needed <= len(self._next):  # full: the rows not moved yet, then the next buffer
            self._copy(self._next, self._moved, self.size)
            self._data = self._next
        self._next = None  # (else too small for this block: grown at once, as without)

    def _copy(self, to: npt.NDArray[Any], start: int, stop: int) -> None:
        """Copy rows ``start`` to ``stop`` of this matrix's buffer into ``to``."""
        to[start:stop] = self._data[start:stop]

    @property
    def view(self) -> npt.NDArray[Any]:
        """The rows (float32 unless the matrix was made with another ``dtype``)."""
        return self._data[: self.size]


class KeywordRows:
    """Each unit's keywords, by row: codes in one flat column, the rows end to end.

    About 4 bytes a keyword (and 8 a row), where a frozenset per row took
    some 700 bytes a unit. ``rows[row]`` is the row's keywords as a
    frozenset, made when asked for (a poll's few rows, the units of an
    answer, the events of a batch); :meth:`count` counts matches over many
    rows without making any.
    """

    def __init__(self) -> None:
        self._codes = Column(np.int32)
        #: per row, where its codes end in ``_codes``
        self._ends = Column(np.int64)
        self._code_of: dict[str, int] = {}
        self._words: list[str] = []

    def __len__(self) -> int:
        return self._ends.size

    def append(self, words: Iterable[str]) -> None:
        """The keywords of the next row (distinct)."""
        codes = []
        for word in words:
            code = self._code_of.get(word)
            if code is None:
                code = self._code_of[word] = len(self._words)
                self._words.append(word)
            codes.append(code)
        self._codes.extend(np.array(codes, dtype=np.int32))
        self._ends.append(self._codes.size)

    def __getitem__(self, row: int) -> frozenset[str]:
        ends = self._ends.view
        start = int(ends[row - 1]) if row > 0 else 0
        words = self._words
        return frozenset(words[code] for code in self._codes.view[start : int(ends[row])].tolist())

    def count(self, words: Iterable[str], rows: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        """Per row of ``rows``, how many of ``words`` (distinct) its keywords hold."""
        wanted = [code for word in set(words) if (code := self._code_of.get(word)) is not None]
        counts = np.zeros(len(rows), dtype=np.float64)
        if not wanted or not len(rows):
            return counts
        ends = self._ends.view
        stops = ends[rows]
        starts = np.where(rows > 0, ends[rows - 1], 0)
        lengths = stops - starts
        total = int(lengths.sum())
        if total == 0:
            return counts
        # the positions of every row's codes, the rows one after the other
        at = ranges(starts, lengths)
        found = np.isin(self._codes.view[at], np.array(wanted, dtype=np.int32))
        of = np.repeat(np.arange(len(rows)), lengths)
        # weighted, the counts are float64 (numpy's stubs say intp whatever the weights)
        return cast(npt.NDArray[np.float64], np.bincount(of, weights=found, minlength=len(rows)))


def keyword_unit(phrases: Iterable[frozenset[str]]) -> float:
    """Keywords per phrase: the distinct keywords of ``phrases`` over how many have any.

    The interest factor counts a unit's matched keywords in this unit, so
    a unit that matches one whole interest scores as high for an agent of
    five interests as for an agent of one. 0.0 when no phrase has keywords.
    """
    sets = [words for words in phrases if words]
    if not sets:
        return 0.0
    return len(frozenset().union(*sets)) / len(sets)


def interest_factor(hits: Any, unit: Any, power: float) -> Any:
    """The interest factor of ``hits`` matched keywords: ``min(1, hits / unit) ** power``.

    ``unit`` is :func:`keyword_unit` of the interests (and hint); NaN where it is 0.
    """
    hits = np.asarray(hits, dtype=np.float64)
    unit = np.asarray(unit, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(unit > 0, np.minimum(hits / np.where(unit > 0, unit, 1.0), 1.0), np.nan)
    return np.power(share, power)


def _interest_of(hits: npt.NDArray[np.float64], unit: float, power: float) -> Any:
    """:func:`interest_factor` of many rows' ``hits`` (whole numbers, few distinct ones):
    computed once per distinct count and gathered, the same values."""
    if len(hits) < 64:
        return interest_factor(hits, unit, power)
    counts = hits.astype(np.intp)
    table = interest_factor(np.arange(int(counts.max()) + 1, dtype=np.float64), unit, power)
    return np.asarray(table).take(counts)


def role_alignment(
    role: str, words: frozenset[str], other: str, other_words: frozenset[str]
) -> float:
    """The role factor: 1.0 for the same role, else the share of ``role``'s keywords
    (``words``) in ``other``'s (``other_words``)."""
    if role == other:
        return 1.0
    return len(words & other_words) / len(words) if words else 0.0


class UnitIndex:
    """Column store of memory units for vectorized scoring."""

    #: units queued before :meth:`add` embeds them (a class default: snapshots leave it out)
    _batch = EMBED_LIVE

    def __init__(self, embedder: Embedder | None = None, weights: Weights | None = None) -> None:
        self.embedder = embedder or default_embedder()
        #: the formula's weights: by default those for this embedder (:func:`weights_for`)
        self.weights = weights or weights_for(self.embedder)
        #: the running sums that calibrate every similarity (:mod:`field.ranking.calibration`)
        self.calibration = Calibration(
            self.embedder.dim, prior_mean=self.weights.prior_mean, prior_sd=self.weights.prior_sd
        )
        #: embeddings of query texts (interests and hints) by text: a poller asks the same
        self._texts: dict[str, tuple[Vectors, float]] = {}
        #: quantized content embeddings, one row per unit (see :attr:`vectors`)
        self._vectors = Matrix(self.embedder.dim)
        self._squares = Column(np.float64)
        self._queued: list[str] = []
        self._queued_chars = 0
        #: whether what is queued waits to be :meth:`supply`-ed, not embedded when read
        #: (a setting of the process, not state: snapshots leave it out)
        self.deferred = False
        self.ids: list[str] = []
        self.rows: dict[str, int] = {}
        self.row_keywords = KeywordRows()
        self.epoch = Column(np.int64)
        self.status = Column(np.int8)
        self.type_weight = Column(np.float64)
        self.confidence = Column(np.float64)
        self.agent = Column(np.int32)
        self.role = Column(np.int32)
        self.task = Column(np.int32)
        #: the session a unit was recorded in (-1: none, or one the Field does not know)
        self.session = Column(np.int32)
        self.memory_type = Column(np.int8)
        self.sessions = Interner()
        self.agents = Interner()
        self.roles = Interner()
        #: per role code, the role's name and keywords (for the role factor)
        self.role_names: list[str] = []
        self.role_keywords: list[frozenset[str]] = []
        #: per attuning role, its role factor for each role code (see :meth:`role_factor`)
        self._role_factors: dict[str, npt.NDArray[np.float64]] = {}
        self.tasks = Interner()
        self._postings: dict[str, Column] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, unit: dict[str, Any], *, session_id: str | None = None) -> None:
        """Index ``unit``; ``session_id`` is the known session it was recorded in, if any."""
        row = len(self.ids)
        self.ids.append(unit["id"])
        self.rows[unit["id"]] = row
        self.epoch.append(unit["epoch"])
        self.status.append(STATUS_CODE[unit["status"]])
        self.type_weight.append(TYPE_IMPORTANCE.get(unit["type"], 0.5))
        score = (unit.get("confidence") or {}).get("score")
        self.confidence.append(0.5 if score is None else score)
        self.agent.append(self.agents.code(unit["source"]["agent_id"]))
        role = unit["source"]["agent_role"]
        role_code = self.roles.code(role)
        if role_code == len(self.role_names):
            self.role_names.append(role)
            self.role_keywords.append(frozenset(keywords(role)))
        self.role.append(role_code)
        task = unit["intent"].get("task_id")
        self.task.append(-1 if task is None else self.tasks.code(task))
        self.session.append(-1 if session_id is None else self.sessions.code(session_id))
        self.memory_type.append(TYPE_CODE[unit["type"]])
        words = unit_keywords(unit)  # what the unit says: never who said it
        self.row_keywords.append(words)
        for word in words:
            postings = self._postings.get(word)
            if postings is None:
                # most words are in few units (numbers, names): start small
                postings = self._postings[word] = Column(np.int32, capacity=2)
            postings.append(row)
        self._queued.append(unit["content"])
        self._queued_chars += len(unit["content"])
        if self.deferred:
            return
        if len(self._queued) >= self._batch or self._queued_chars >= EMBED_BATCH_CHARS:
            self.flush()

    @contextlib.contextmanager
    def in_bulk(self) -> Iterator[None]:
        """Meanwhile :meth:`add` queues :data:`EMBED_BATCH` units before it embeds them, as
        many as a call embeds (a replay: no request waits for it, and a large batch costs
        less a unit), rather than :data:`EMBED_LIVE`."""
        outer = "_batch" not in vars(self)  # (a replay within a replay leaves it to the outer)
        self._batch = EMBED_BATCH
        try:
            yield
        finally:
            if outer:
                del self._batch  # back to the class default: nothing of it in the state

    def flush(self) -> None:
        """Embed every queued unit now (deferred or not)."""
        while self._queued:
            start, texts = self.queued(EMBED_BATCH, EMBED_BATCH_CHARS)
            self.supply(start, *quantize(self.embedder.embed(texts)))

    @property
    def scorable(self) -> int:
        """How many rows, from the first, can be scored: all of them unless
        :attr:`deferred` (reading the vectors embeds what is queued), else those
        embedded so far."""
        return len(self._vectors.view) if self.deferred else len(self.ids)

    @property
    def waiting(self) -> int:
        """Units queued for embedding."""
        return len(self._queued)

    @property
    def waiting_chars(self) -> int:
        """Characters of the units queued for embedding."""
        return self._queued_chars

    def queued(self, count: int, chars: int) -> tuple[int, list[str]]:
        """The row of the first queued unit and the contents of the next ones to embed:
        at most ``count`` of them and ``chars`` characters (but at least one)."""
        texts: list[str] = []
        size = 0
        for text in self._queued[:count]:
            if texts and size + len(text) > chars:
                break
            texts.append(text)
            size += len(text)
        return len(self._vectors.view), texts

    def supply(self, start: int, rows: Vectors, squares: npt.NDArray[np.float64]) -> bool:
        """Take the quantized embeddings of the queued units from row ``start`` on
        (:func:`~field.ranking.embedding.quantize` of what :meth:`queued` gave); False,
        and nothing taken, when the index has moved on from ``start``."""
        if start != len(self._vectors.view) or len(rows) > len(self._queued):
            return False
        self._vectors.extend(rows, ahead=True)  # rows never change once embedded
        self._squares.extend(squares)
        self.calibration.add(rows, squares)
        self._queued_chars -= sum(len(text) for text in self._queued[: len(rows)])
        del self._queued[: len(rows)]
        return True

    def rows_vectors(self, rows: npt.NDArray[np.intp]) -> tuple[Vectors, npt.NDArray[np.float64]]:
        """The quantized embeddings of ``rows`` and their squared norms; a row still
        queued (deferred) is embedded for the caller, and stays queued."""
        scorable = len(self.vectors)  # embeds what is queued, unless deferred
        late = rows >= scorable
        if not late.any():
            return self.vectors[rows], self.squares[rows]
        vectors = np.zeros((len(rows), self.embedder.dim), dtype=np.float32)
        squares = np.zeros(len(rows), dtype=np.float64)
        vectors[~late], squares[~late] = self.vectors[rows[~late]], self.squares[rows[~late]]
        texts = [self._queued[row - scorable] for row in rows[late].tolist()]
        vectors[late], squares[late] = quantize(self.embedder.embed(texts))
        return vectors, squares

    @property
    def vectors(self) -> Vectors:
        """The units' content embeddings, an (n x dim) float32 matrix aligned with ``ids``
        (:attr:`deferred`: its first :attr:`scorable` rows, those embedded so far).

        Rows are quantized (:func:`~field.ranking.embedding.quantize`):
        integer-valued, so dot products are exact; divide by the norms
        (:attr:`squares`) for cosines, or use :meth:`similarity`.
        """
        if self._queued and not self.deferred:
            self.flush()
        return self._vectors.view

    @property
    def squares(self) -> npt.NDArray[np.float64]:
        """Squared norms of :attr:`vectors` (0 for a content with no features)."""
        if self._queued and not self.deferred:
            self.flush()
        return self._squares.view

    def vector(self, unit_id: str) -> tuple[Vectors, float]:
        """One unit's quantized embedding and its squared norm."""
        row = self.rows[unit_id]
        return self.vectors[row], float(self.squares[row])

    def embed(self, text: str) -> tuple[Vectors, float]:
        """A text's quantized embedding and squared norm, comparable with the rows.

        The last :data:`QUERY_TEXTS` texts are kept: an agent that polls
        asks with the same interests every time, and embedding is pure.
        """
        found = self._texts.get(text)
        if found is None:
            found = embed_one(self.embedder, text)
            if len(self._texts) >= QUERY_TEXTS:
                del self._texts[next(iter(self._texts))]  # the oldest
            self._texts[text] = found
        return found

    def similarity(
        self, vector: Vectors, square: float, rows: npt.NDArray[np.intp] | None = None
    ) -> npt.NDArray[np.float64]:
        """Cosine of ``vector`` (quantized, with its squared norm) with each of ``rows``.

        All rows when ``rows`` is None. Exact, so equal whichever way it is
        computed: a few rows are gathered first, most rows multiplied whole.
        """
        if rows is None:
            return cosine(self.vectors @ vector, self.squares, square)
        return cosine(self.dots(vector, rows), self.squares[rows], square)

    def dots(
        self, vectors: Vectors, rows: npt.NDArray[np.intp], matrix: Vectors | None = None
    ) -> Vectors:
        """Exact dot products of ``rows`` with a quantized vector (or of each of ``vectors``:
        then one column per row of ``vectors``): a few rows gathered first, most multiplied
        whole (the rows from the first to the last of ``rows``).

        ``matrix`` is the unit rows to read (by default :attr:`vectors`): rows never change
        once embedded, so a view taken earlier gives the same products.
        """
        if matrix is None:
            matrix = self.vectors
        if not len(rows):
            return np.zeros((0, *vectors.shape[:-1]), dtype=np.float32)
        low, high = int(rows.min()), int(rows.max()) + 1
        if 4 * len(rows) < high - low:
            return _product(matrix[rows], vectors)
        if low == 0 and high == len(matrix):
            return (matrix @ vectors.T)[rows]
        return _product(matrix[low:high], vectors)[rows - low]

    def calibrated(
        self,
        interests: Interests,
        rows: npt.NDArray[np.intp],
        counts: Any = None,
        *,
        held: tuple[Vectors, npt.NDArray[np.float64]] | None = None,
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.intp]]:
        """The semantic factor of ``rows`` for ``interests``, and which interest is the
        best for each row.

        ``counts`` is how many units had been recorded when each row is scored
        (a number or one per row; None: now). Each interest's cosine, and the
        joined text's, is standardized against the Field's units at that
        count's checkpoint and made a percentile (:mod:`field.ranking.calibration`).
        Exact, so the same for one row or many.

        ``held`` is the unit rows and their squared norms to read, views taken earlier
        (with ``counts`` of that time): what rows hold never changes once embedded, so
        the factors are those that would have been computed then.
        """
        if not len(rows):
            return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.intp)
        vectors, squares = interests_rows(interests)
        # exact integer dot products; reading the rows embeds what is queued, so the
        # checkpoints are current
        matrix, unit_squares = held if held is not None else (self.vectors, self.squares)
        dots = self.dots(vectors, rows, matrix).T.astype(np.float64)
        at = self.calibration.at(self.scorable if counts is None else counts)
        # one checkpoint for every row (a scalar count): no search for distinct ones
        columns = at if np.ndim(at) == 0 else np.broadcast_to(at, rows.shape)
        scales = functools.partial(self._scales, vectors, squares)
        standard = self.standardized(
            dots, vectors, squares, rows, columns, scales, unit_squares=unit_squares
        )
        count = len(interests.texts)
        best = standard[:count].argmax(axis=0)
        top = standard[best, np.arange(len(rows))]
        against = 0 if interests.against is None else len(interests.against)
        if against:
            closest = standard[count : count + against].max(axis=0)
            top = top - interests.penalty * np.maximum(0.0, closest - top)
        mixed = standard[-1] if interests.joined is not None else standard[0]
        factor = percentile(
            top, mixed, interests.compared, self.weights.semantic_power, interests.weight
        )
        return factor, best

    def _scales(
        self, vectors: Vectors, squares: npt.NDArray[np.float64], position: int
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """:meth:`~field.ranking.calibration.Calibration.scales`, kept for the last
        :data:`QUERY_TEXTS` (interest rows, checkpoint): a poller asks with the same
        interests, and a checkpoint's sums never change once reached."""
        kept = _SCALED.get(self.calibration)
        if kept is None:
            kept = _SCALED[self.calibration] = {}
        key = (vectors.tobytes(), squares.tobytes(), position)
        found = kept.pop(key, None)
        if found is None:
            found = self.calibration.scales(vectors, squares, position)
            if len(kept) >= QUERY_TEXTS:
                del kept[next(iter(kept))]  # the least recently used
        kept[key] = found
        return found

    def standardized(
        self,
        dots: npt.NDArray[Any],
        vectors: Vectors,
        squares: npt.NDArray[np.float64],
        rows: npt.NDArray[np.intp],
        at: npt.NDArray[np.intp],
        scales: Any = None,
        *,
        unit_squares: npt.NDArray[np.float64] | None = None,
    ) -> npt.NDArray[np.float64]:
        """``(cosine - mean) / sd`` of each (interest, unit of ``rows``) from their exact
        dot products, the mean and sd those of the interest's cosines at checkpoint
        position ``at`` (one per column, or one for all).

        ``scales`` may map a checkpoint position to the interests' (scale, shift)
        (:meth:`~field.ranking.calibration.Calibration.scales`), computed earlier for
        the same ``vectors``; otherwise they are computed here. ``unit_squares`` is the
        units' squared norms to read (by default :attr:`squares`).
        """
        unit_squares = (self.squares if unit_squares is None else unit_squares)[rows]
        # one position for all (a number, or one repeated: a broadcast has stride 0)
        single = np.ndim(at) == 0 or (at.ndim == 1 and at.strides[0] == 0)
        positions = np.asarray(at).reshape(-1)[:1] if single else np.unique(at)
        if len(positions) == 1:
            position = int(positions[0])
            found = None if scales is None else scales(position)
            scale, shift = found or self.calibration.scales(vectors, squares, position)
            return standardized(dots, unit_squares, scale, shift)
        out = np.empty_like(dots)
        for position in positions.tolist():
            found = None if scales is None else scales(position)
            scale, shift = found or self.calibration.scales(vectors, squares, position)
            columns = np.flatnonzero(at == position)
            out[:, columns] = standardized(dots[:, columns], unit_squares[columns], scale, shift)
        return out

    def set_status(self, unit_id: str, status: str) -> None:
        self.status[self.rows[unit_id]] = STATUS_CODE[status]

    def postings(self, word: str) -> npt.NDArray[np.int32]:
        column = self._postings.get(word)
        return column.view if column is not None else np.empty(0, dtype=np.int32)

    def hits(
        self, words: Iterable[str], rows: npt.NDArray[np.intp] | None = None
    ) -> npt.NDArray[np.float64] | None:
        """Per row (of ``rows``, or of the index), how many of ``words`` the unit contains.

        None for no words. For a few rows (a poll's new units) the rows' own
        keyword sets are read; otherwise the postings of each word, a loop
        over query words, never over units. Both count the same words.
        """
        unique = set(words)
        if not unique:
            return None
        if rows is not None and len(rows) * len(unique) <= FEW_CELLS:
            return self.row_keywords.count(unique, rows)
        postings = [self.postings(word) for word in unique]
        hits = np.bincount(np.concatenate(postings), minlength=len(self.ids)).astype(np.float64)
        return hits if rows is None else hits.take(rows)

    def role_factor(self, role: str) -> npt.NDArray[np.float64]:
        """The role factor of a unit for an agent of ``role``, per recorder role code.

        :func:`role_alignment` of ``role`` with each role the index knows;
        kept per attuning role (the last :data:`QUERY_TEXTS` of them) and
        extended as new roles appear.
        """
        known = self._role_factors.pop(role, None)
        count = len(self.role_names)
        if known is None or len(known) < count:
            start = 0 if known is None else len(known)
            words = frozenset(keywords(role))
            more = [
                role_alignment(role, words, self.role_names[code], self.role_keywords[code])
                for code in range(start, count)
            ]
            fresh = np.array(more, dtype=np.float64)
            known = fresh if known is None else np.concatenate([known, fresh])
        if len(self._role_factors) >= QUERY_TEXTS:
            del self._role_factors[next(iter(self._role_factors))]  # the least recently used
        self._role_factors[role] = known
        return known

    def count_at(self, epoch: Any) -> Any:
        """How many units had been recorded at ``epoch`` (a number or an array of them)."""
        return np.searchsorted(self.epoch.view, epoch, side="right")


@dataclass(slots=True, kw_only=True)
class Query:
    """What the Field knows about the attuning agent and its scope."""

    agent_id: str
    role: str
    interests: list[str]
    context_hint: str | None
    task_id: str | None
    recency_weight: float
    include_own: bool
    since_epoch: int | None
    #: extension: archived units (COMPACT) are candidates only when asked for
    include_archived: bool = False
    #: extension: what the agent's FEEDBACK taught (:mod:`field.ranking.learning`)
    judged: Judged | None = None
    interest_words: frozenset[str] = field(init=False)
    #: the keywords of the interests and the hint, and the keywords per such phrase
    match_words: frozenset[str] = field(init=False)
    match_unit: float = field(init=False)
    #: each interest with its keywords (explained per unit, so computed once)
    interest_keywords: tuple[tuple[str, frozenset[str]], ...] = field(init=False)
    hint_words: frozenset[str] = field(init=False)
    role_words: frozenset[str] = field(init=False)
    #: the embedded interests and hint (:func:`interest_vectors`)
    _vectors: Interests | None = field(init=False, default=None)
    #: the rows :meth:`semantic` scored last, their factor and best interest (for :meth:`closeness`)
    _scored: tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], npt.NDArray[np.intp]] | None = (
        field(init=False, default=None)
    )
    #: row -> (semantic factor, best interest) of the rows a page is about to explain
    _near: dict[int, tuple[float, int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.interest_keywords = tuple((i, frozenset(keywords(i))) for i in self.interests)
        self.interest_words = frozenset(w for _, words in self.interest_keywords for w in words)
        self.hint_words = frozenset(keywords(self.context_hint))
        self.role_words = frozenset(keywords(self.role))
        self.match_words = self.interest_words | self.hint_words
        phrases = [words for _, words in self.interest_keywords]
        self.match_unit = keyword_unit([*phrases, self.hint_words])

    def vectors(self, index: UnitIndex) -> Interests:
        """Each interest's embedding, and the hint's (those that embed to something)."""
        if self._vectors is None:
            self._vectors = interest_vectors(
                index, self.interests, self.context_hint, judged=self.judged
            )
        return self._vectors

    def semantic(
        self, index: UnitIndex, rows: npt.NDArray[np.intp]
    ) -> npt.NDArray[np.float64] | None:
        """The semantic factor of ``rows``; None when the interests and hint embed to nothing."""
        found = self._factor(index, rows)
        if found is None:
            return None
        self._scored = (rows, *found)
        return found[0]

    def look_up(self, rows: npt.NDArray[np.intp]) -> None:
        """Read the semantic factors of ``rows`` (a page to explain) in one pass.

        Those among the rows :meth:`semantic` scored last are kept for
        :meth:`closeness`.
        """
        if self._scored is None or not len(rows) or not len(self._scored[0]):
            return
        scored_rows, scored, best = self._scored
        at = np.minimum(np.searchsorted(scored_rows, rows), len(scored_rows) - 1)
        found = scored_rows[at] == rows
        pairs = zip(scored[at[found]].tolist(), best[at[found]].tolist(), strict=True)
        self._near.update(zip(rows[found].tolist(), pairs, strict=True))

    def closeness(self, index: UnitIndex, row: int) -> tuple[float, str] | None:
        """The semantic factor of one row and the interest (or hint) that gave it; None
        when the interests and hint embed to nothing.

        Read from the rows :meth:`semantic` scored last when they hold it
        (they ascend, as :func:`candidates` gives them); the factor is exact,
        so the same as computed alone.
        """
        near = self._near.get(row)
        if near is None and self._scored is not None:
            rows, scored, best = self._scored
            at = int(np.searchsorted(rows, row))
            if at < len(rows) and rows[at] == row:
                near = float(scored[at]), int(best[at])
        if near is None:
            found = self._factor(index, np.array([row], dtype=np.intp))
            if found is None:
                return None
            near = float(found[0][0]), int(found[1][0])
        return near[0], self.vectors(index).texts[near[1]]

    def _factor(
        self, index: UnitIndex, rows: npt.NDArray[np.intp]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.intp]] | None:
        interests = self.vectors(index)
        if not interests.texts:
            return None
        return index.calibrated(interests, rows)


@dataclass(frozen=True, slots=True)
class Interests:
    """An agent's interests (and hint) as the semantic factor compares them: each text that
    embeds to something, once, and all of them as one text; with what its feedback taught
    (:mod:`field.ranking.learning`), the units it judged useful and not, and the joined row
    moved towards the first and away from the others."""

    #: quantized rows of the texts, then of the units judged useful, and their squared
    #: norms (none zero): the best of them is a unit's best match
    vectors: Vectors
    squares: npt.NDArray[np.float64]
    #: per row of ``vectors``, its text (:data:`~field.ranking.learning.LEARNED` for a unit)
    texts: tuple[str, ...]
    #: the texts joined by newlines, embedded (None for fewer than two texts and no
    #: feedback), or that row as the feedback moved it
    joined: tuple[Vectors, float] | None
    #: rows of the units judged not useful (none zero): a unit closer to one of them than
    #: to its best match scores lower
    against: Vectors | None = None
    against_squares: npt.NDArray[np.float64] | None = None
    #: the interests (and hint) among ``texts``: the percentile's power counts them
    counted: int = -1
    #: the best match's share of the mixed similarity (the joined row's: the rest)
    weight: float = 0.5
    #: how much of a unit's lead over its best match a closer unit judged not useful takes
    penalty: float = 0.0

    @property
    def compared(self) -> int:
        """The texts the percentile's power counts."""
        return len(self.texts) if self.counted < 0 else self.counted


def interest_vectors(
    index: UnitIndex | None,
    interests: Iterable[str],
    hint: str | None = None,
    *,
    embedder: Embedder | None = None,
    judged: Judged | None = None,
) -> Interests:
    """:class:`Interests` of ``interests`` and ``hint``, embedded by ``index`` (which keeps
    the query texts it embedded) or else by ``embedder``, each text alone; with what
    ``judged`` (an agent's feedback) taught, read from ``index``.

    The first :data:`COMPARED_INTERESTS` distinct interests are compared (an agent may
    register 64): what one query costs to embed is bounded, whatever an agent sends.
    """
    if index is not None:
        embed, dim = index.embed, index.embedder.dim
    else:
        assert embedder is not None
        embed, dim = functools.partial(embed_one, embedder), embedder.dim
    compared = list(dict.fromkeys(interests))[:COMPARED_INTERESTS]
    found = [(text, *embed(text)) for text in dict.fromkeys([*compared, *([hint] if hint else [])])]
    kept = [(text, vector, square) for text, vector, square in found if square > 0]
    texts = tuple(text for text, _, _ in kept)
    vectors = np.stack([v for _, v, _ in kept]) if kept else np.zeros((0, dim), np.float32)
    squares = np.array([square for _, _, square in kept], dtype=np.float64)
    joined = embed("\n".join(texts)) if len(texts) > 1 else None
    if judged is None or not judged.count or index is None:
        return Interests(vectors, squares, texts, joined)
    weights = index.weights
    anchor = joined if joined is not None else (vectors[0], squares[0]) if kept else None
    moved = judged.moved(anchor, weights.feedback_useful, weights.feedback_not_useful)
    liked, liked_squares = index.rows_vectors(np.array(judged.liked, dtype=np.intp))
    disliked, disliked_squares = index.rows_vectors(np.array(judged.disliked, dtype=np.intp))
    keep, drop = liked_squares > 0, disliked_squares > 0
    return Interests(
        np.concatenate([vectors, liked[keep]]),
        np.concatenate([squares, liked_squares[keep]]),
        texts + (LEARNED,) * int(keep.sum()),
        moved if moved[1] > 0 else joined,
        disliked[drop],
        disliked_squares[drop],
        counted=max(2, len(texts)),  # the moved joined row is compared too
        weight=weights.feedback_weight,
        penalty=weights.feedback_penalty,
    )


def interests_rows(interests: Interests) -> tuple[Vectors, npt.NDArray[np.float64]]:
    """Every row of ``interests`` (and squared norm) in the order the registry holds them:
    the compared rows, the rows judged not useful, the joined row."""
    vectors, squares = interests.vectors, interests.squares
    parts, norms = [vectors], [squares]
    if interests.against is not None and len(interests.against):
        assert interests.against_squares is not None
        parts.append(interests.against)
        norms.append(interests.against_squares)
    if interests.joined is not None:
        parts.append(interests.joined[0][None, :])
        norms.append(np.array([interests.joined[1]]))
    if len(parts) == 1:
        return vectors, squares
    return np.concatenate(parts), np.concatenate(norms)


def embed_one(embedder: Embedder, text: str) -> tuple[Vectors, float]:
    """One text's quantized row and squared norm, embedded alone (as ATTUNE embeds it)."""
    rows, squares = quantize(embedder.embed([text]))
    return rows[0], float(squares[0])


def candidates(
    index: UnitIndex, query: Query, visible: npt.NDArray[np.bool_] | None = None
) -> npt.NDArray[np.intp]:
    """Rows ATTUNE may return: shown, not the caller's own, after since_epoch, and
    embedded (:attr:`UnitIndex.scorable`).

    ``visible`` masks the rows the caller may see (session visibility);
    None: all of them. Rows ascend by epoch, so a poll (``since_epoch``) looks at
    the rows after it alone: its work is that of the new units.
    """
    scorable = index.scorable  # not embedded yet (a deferred index): no candidates
    start = 0
    if query.since_epoch is not None:
        epochs = index.epoch.view[:scorable]
        start = int(np.searchsorted(epochs, query.since_epoch, side="right"))
    if start >= scorable:
        return np.empty(0, dtype=np.intp)
    status = index.status.view[start:scorable]
    mask = _SHOWN.take(status)
    if visible is not None:
        mask &= visible[start:scorable]
    if not query.include_archived:
        mask &= status != _ARCHIVED_CODE
    if not query.include_own:
        own = index.agents.find(query.agent_id)
        if own >= 0:
            mask &= index.agent.view[start:scorable] != own
    found: npt.NDArray[np.intp] = np.flatnonzero(mask)
    if start:
        found += start
    return found


def combine(
    weights: Weights,
    *,
    role: Any,
    interest: Any,
    semantic: Any = None,
    type_weight: Any,
    task: Any,
    confidence: Any,
    recency: Any,
    recency_weight: float,
    complete: bool = False,
) -> npt.NDArray[np.float64]:
    """The relevance formula (module docstring) over broadcastable factor arrays.

    ``interest``, ``semantic`` and ``task`` may be None (applies nowhere) or hold NaN
    where the factor does not apply; such factors drop out of the mean. A
    caller whose factors hold no NaN says ``complete`` and skips that work
    (the result is the same to the bit).
    """
    numerator: Any = 0.0
    denominator: Any = 0.0
    for weight, values in (
        (weights.role, role),
        (weights.interest, interest),
        (weights.semantic, semantic),
        (weights.type, type_weight),
        (weights.task, task),
        (weights.confidence, confidence),
    ):
        if values is None:
            continue
        values = np.asarray(values, dtype=np.float64)
        if complete:
            numerator = numerator + weight * values
            denominator = denominator + weight
            continue
        applies = ~np.isnan(values)
        numerator = numerator + weight * np.where(applies, values, 0.0)
        denominator = denominator + weight * applies
    content = numerator / denominator
    freshness = (1.0 - recency_weight) + recency_weight * np.asarray(recency, dtype=np.float64)
    result: npt.NDArray[np.float64] = np.clip(content * freshness, 0.0, 1.0)
    return result


def recency(age: Any) -> Any:
    """Recency of a unit with ``age`` units recorded after it.

    Whole ages (what every caller passes) are read from a table of
    ``exp2(-age / RECENCY_HALF_LIFE)`` that grows with the Field up to
    :data:`_RECENCY_ZERO`, from where the exponential is 0.0: the same
    values (the elementwise ``exp2`` of the same numbers), a gather
    instead of an exponential per unit.
    """
    ages = np.asarray(age)
    if ages.dtype.kind not in "iu" or ages.size == 0 or ages.min() < 0:
        return np.exp2(-np.asarray(age, dtype=np.float64) / RECENCY_HALF_LIFE)
    global _recency_table
    table = _recency_table
    oldest = int(ages.max())
    if oldest >= len(table) and len(table) <= _RECENCY_ZERO:
        size = min(max(oldest + 1, 2 * len(table)), _RECENCY_ZERO + 1)
        more = np.arange(len(table), size, dtype=np.float64)
        table = _recency_table = np.concatenate([table, np.exp2(-more / RECENCY_HALF_LIFE)])
    if oldest >= len(table):  # past the zero: every older unit's recency is 0.0 too
        ages = np.minimum(ages, len(table) - 1)
    return table.take(ages)


#: The first age whose recency is 0.0: ``exp2(-1075)`` rounds to zero, and all below it.
_RECENCY_ZERO = int(1075 * RECENCY_HALF_LIFE)
#: ``exp2(-age / RECENCY_HALF_LIFE)`` for ages 0, 1, ... (see :func:`recency`).
_recency_table: npt.NDArray[np.float64] = np.exp2(-np.arange(4096.0) / RECENCY_HALF_LIFE)


@dataclass(slots=True)
class Factors:
    """The factors of some rows for one query (None: the factor applies to none of them)."""

    role: npt.NDArray[np.float64]
    interest: npt.NDArray[np.float64] | None
    semantic: npt.NDArray[np.float64] | None
    type_weight: npt.NDArray[np.float64]
    task: npt.NDArray[np.float64] | None
    confidence: npt.NDArray[np.float64]
    recency: npt.NDArray[np.float64]


def factors(
    index: UnitIndex,
    query: Query,
    rows: npt.NDArray[np.intp],
    *,
    semantic: bool = True,
    recorded: int | None = None,
) -> Factors:
    """Each factor of the formula (module docstring) for each row in ``rows``; without
    ``semantic``, all but the semantic factor (None: left for the caller). Recency is
    that of when ``recorded`` units had been recorded (default: now)."""
    if recorded is None:
        recorded = len(index)
    hits = index.hits(query.match_words, rows)
    task = None
    if query.task_id is not None:
        task = (index.task.view[rows] == index.tasks.find(query.task_id)).astype(np.float64)
    return Factors(
        role=index.role_factor(query.role).take(index.role.view[rows]),
        interest=(
            None
            if hits is None
            else _interest_of(hits, query.match_unit, index.weights.interest_power)
        ),
        semantic=query.semantic(index, rows) if semantic else None,
        type_weight=index.type_weight.view[rows],
        task=task,
        confidence=index.confidence.view[rows],
        recency=recency(recorded - 1 - rows),
    )


#: What :func:`bounds` adds to a bound, relative and absolute: far more than the rounding
#: of its float32 arithmetic (a few parts in ten million) and of the exact float64 score
_BOUND_SLACK = 1e-5


def bounds(index: UnitIndex, query: Query, rows: npt.NDArray[np.intp]) -> npt.NDArray[np.float32]:
    """For each of ``rows`` (ascending), a number its score (:func:`score`) never exceeds,
    whatever its semantic factor: the formula with a semantic factor of 1 (it is at most 1,
    and the score grows with it), computed over the columns from the first row to the last
    without gathering them, in float32, plus :data:`_BOUND_SLACK`."""
    if not len(rows):
        return np.empty(0, dtype=np.float32)
    f32 = np.float32
    w = index.weights
    high = int(rows[-1]) + 1
    recorded = len(index)
    denominator = w.role + w.semantic + w.type + w.confidence
    roles = index.role_factor(query.role).astype(f32) * f32(w.role)
    total = roles.take(index.role.view[:high])
    total += f32(w.semantic)
    part = np.multiply(index.type_weight.view[:high], w.type, dtype=f32)
    total += part
    np.multiply(index.confidence.view[:high], w.confidence, out=part, dtype=f32)
    total += part
    if query.match_words:
        denominator += w.interest
        postings = [index.postings(word) for word in query.match_words]
        postings = [found for found in postings if len(found)]
        if postings:
            hits = np.bincount(np.concatenate(postings), minlength=recorded)[:high]
            values = interest_factor(
                np.arange(int(hits.max()) + 1, dtype=np.float64),
                query.match_unit,
                w.interest_power,
            )
            total += (np.asarray(values, dtype=f32) * f32(w.interest)).take(hits)
    if query.task_id is not None:
        denominator += w.task
        code = index.tasks.find(query.task_id)
        if code >= 0:
            total += np.where(index.task.view[:high] == code, f32(w.task), f32(0.0))
    total *= f32(1.0 / denominator)
    # recency: row i is recorded - 1 - i units old; the table's values from the newest
    # row back (0 past the table's end, as recency itself)
    weight = query.recency_weight
    if weight:
        fresh = np.full(high, 1.0 - weight, dtype=f32)
        recency(np.array([recorded - 1], dtype=np.intp))  # the table grows to cover them
        table64 = _recency_table
        newest_age = recorded - high  # of row high - 1
        oldest_age = min(recorded - 1, len(table64) - 1)
        if newest_age <= oldest_age:
            span = table64[newest_age : oldest_age + 1][::-1]  # row (recorded-1-oldest_age) on
            start = recorded - 1 - oldest_age
            fresh[start:high] += np.multiply(span, weight, dtype=f32)
        total *= fresh
    found = total[rows]
    found *= f32(1.0 + _BOUND_SLACK)
    found += f32(_BOUND_SLACK)
    return found


def score(index: UnitIndex, query: Query, rows: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
    """Relevance in [0, 1] of each row in ``rows`` to ``query``."""
    if len(rows) == 0:
        return np.empty(0, dtype=np.float64)
    f = factors(index, query, rows)
    return combine(
        index.weights,
        role=f.role,
        interest=f.interest,
        semantic=f.semantic,
        type_weight=f.type_weight,
        task=f.task,
        confidence=f.confidence,
        recency=f.recency,
        recency_weight=query.recency_weight,
        complete=True,  # every factor applies to every row, or is None
    )


def diversify(
    index: UnitIndex, rows: npt.NDArray[np.intp], scores: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Scores discounted by ``DIVERSITY_DECAY`` per better-ranked unit of the same source.

    The k-th best unit of one agent keeps ``DIVERSITY_DECAY ** k`` of its
    score (ties go to the earlier unit), so a page is not filled by a
    single prolific agent.
    """
    if len(rows) < 2:
        return scores
    sources = index.agent.view[rows]
    order = np.lexsort((-scores, sources))  # by source, then best first; stable
    grouped = sources[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    group_sizes = np.diff(np.r_[starts, len(grouped)])
    occurrence = np.empty(len(rows), dtype=np.int64)
    occurrence[order] = np.arange(len(grouped)) - np.repeat(starts, group_sizes)
    discounted: npt.NDArray[np.float64] = scores * np.power(DIVERSITY_DECAY, occurrence)
    return discounted


def best_diversified(
    index: UnitIndex,
    rows: npt.NDArray[np.intp],
    scores: npt.NDArray[np.float64],
    *,
    count: int,
    threshold: float,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], int]:
    """The ``count`` best units after :func:`diversify`, and how many pass ``threshold``.

    Returns positions into ``rows`` (best first), their diversified scores,
    and the number of candidates whose diversified score is at least
    ``threshold``. Diversifying every candidate needs a sort of all of
    them; instead this diversifies a pool of the best raw scores, which
    gives the same answer whenever the pool's ``count``-th diversified
    score beats the best raw score left outside it (a discount never
    raises a score, and units outside the pool rank below every pool unit
    of their source). Otherwise it falls back to diversifying everything.
    """
    n = len(rows)
    found = _best_of(index, np.arange(n), rows, scores, count, threshold, -math.inf, n)
    assert found is not None  # nothing was left out: always decided
    return found


def _best_of(
    index: UnitIndex,
    positions: npt.NDArray[np.intp],
    rows: npt.NDArray[np.intp],
    scores: npt.NDArray[np.float64],
    count: int,
    threshold: float,
    bound: float,
    total: int,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], int] | None:
    """:func:`best_diversified` of ``total`` candidates of which only ``rows`` (at
    ``positions`` among them, ascending) were scored; every other one scores at most
    ``bound`` (``-inf``: none was left out). None when that is not enough to know.

    A pool of the best raw scores is tried first, then every scored row: a unit that
    scores above everything left out has every better unit of its source in what was
    looked at, so its diversified score is exact, and the answer is if the
    ``count``-th best diversified score beats everything left out (and, for a
    threshold, so does the threshold: then every unit that passes it was looked at).
    """
    n = len(rows)
    pool_size = min(n, 4 * count + 64)
    if pool_size < n:
        pool = np.argpartition(-scores, pool_size - 1)[:pool_size]
        outside = max(bound, float(scores[pool].min()))  # every unit outside: at most this
        found = _decided(
            index, positions[pool], rows[pool], scores[pool], count, threshold, outside, total
        )
        if found is not None:
            return found
    return _decided(index, positions, rows, scores, count, threshold, bound, total)


def _decided(
    index: UnitIndex,
    positions: npt.NDArray[np.intp],
    rows: npt.NDArray[np.intp],
    scores: npt.NDArray[np.float64],
    count: int,
    threshold: float,
    outside: float,
    total: int,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64], int] | None:
    discounted = diversify(index, rows, scores)
    if outside > -math.inf:  # some units were left out: each scores at most ``outside``
        kth = float(np.partition(discounted, -count)[-count]) if count <= len(rows) else -1.0
        if not (kth > outside and (threshold == 0.0 or threshold > outside)):
            return None
    available = total if threshold == 0.0 else int((discounted >= threshold).sum())
    return (*_ranked(positions, discounted, count, threshold), available)


class Ranking:
    """:func:`score` then :func:`best_diversified` of ATTUNE's candidates, the same answer,
    computed in bounded steps (:meth:`steps`) and mostly without the matrix product.

    Every candidate is bounded when the ranking is made (:func:`bounds`: a score grows
    with its semantic factor, which is at most 1); the semantic factor (a product with the
    unit's embedding), and the exact score, only for the rows that might be among the
    best. Rows are scored exactly in rounds, highest bound first, and the ranking ends as
    soon as the rows scored decide it (:func:`_best_of`): for a top 10 of 100,000 units
    (the benchmarks' set-up), 1,034 rows. Each step scores at most :data:`STEP_CELLS`
    cells of the unit matrix.

    Everything read after the ranking is made is what never changes: the unit rows and
    squared norms as of then (views), the calibration checkpoint and the recency of then,
    each row's other factors.
    So the steps may run while the Field goes on changing, and give the ranking of the
    moment it was made.
    """

    def __init__(
        self,
        index: UnitIndex,
        query: Query,
        rows: npt.NDArray[np.intp],
        *,
        count: int,
        threshold: float,
    ) -> None:
        self._index, self._query, self._rows = index, query, rows
        self._count, self._threshold = count, threshold
        #: the result, once :meth:`steps` is exhausted: positions into the candidates
        #: (best first), their diversified scores, how many candidates pass the threshold
        self.positions: npt.NDArray[np.intp] = np.empty(0, dtype=np.intp)
        self.scores: npt.NDArray[np.float64] = np.empty(0, dtype=np.float64)
        self.available = 0
        self._interests: Interests | None = None
        if not len(rows):
            return
        interests = query.vectors(index)
        if not interests.texts:  # no semantic factor: nothing to multiply, decided now
            scores = score(index, query, rows)
            self.positions, self.scores, self.available = best_diversified(
                index, rows, scores, count=count, threshold=threshold
            )
            return
        self._interests = interests
        # read the rows first: that embeds what is queued (unless deferred), then the count
        self._held = (index.vectors, index.squares)
        self._counts = index.scorable
        self._recorded = len(index)
        self._bounds = bounds(index, query, rows)

    def _scored(
        self, part: npt.NDArray[np.intp], semantic: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """The scores of the candidates at positions ``part``, their semantic factors
        given: :func:`score`'s, to the bit (the factors of rows that never change, the
        recency of when the ranking was made)."""
        rows = self._rows[part]
        f = factors(self._index, self._query, rows, semantic=False, recorded=self._recorded)
        return combine(
            self._index.weights,
            role=f.role,
            interest=f.interest,
            semantic=semantic,
            type_weight=f.type_weight,
            task=f.task,
            confidence=f.confidence,
            recency=f.recency,
            recency_weight=self._query.recency_weight,
            complete=True,
        )

    def steps(self) -> Iterator[None]:
        """Rank, pausing after each bounded step; the result is set once this is exhausted."""
        interests = self._interests
        if interests is None:
            return
        index, rows, count = self._index, self._rows, self._count
        n = len(rows)
        bounds = self._bounds
        left = bounds.copy()  # the bounds of the rows not scored yet (-inf once scored)
        scored = np.zeros(n, dtype=np.bool_)
        raw = np.zeros(n, dtype=np.float64)
        semantic = np.zeros(n, dtype=np.float64)
        best = np.zeros(n, dtype=np.intp)
        per_step = max(1024, STEP_CELLS // max(1, index.embedder.dim))
        size = min(n, count + FIRST_ROWS)
        while True:
            if size >= n:
                pick = np.flatnonzero(~scored)
            else:
                cut = float(np.partition(bounds, n - size)[n - size])
                pick = np.flatnonzero(left >= cut)
                if not len(pick):
                    pick = np.flatnonzero(left == left.max())
            left[pick] = -math.inf
            scored[pick] = True
            for start in range(0, len(pick), per_step):
                if start:
                    yield
                part = pick[start : start + per_step]
                factor, which = index.calibrated(
                    interests, rows[part], self._counts, held=self._held
                )
                semantic[part], best[part] = factor, which
                raw[part] = self._scored(part, factor)
            taken = np.flatnonzero(scored)
            bound = -math.inf if len(taken) == n else float(left.max())
            found = _best_of(
                index, taken, rows[taken], raw[taken], count, self._threshold, bound, n
            )
            if found is not None:
                break
            size = min(n, size * 8)
            yield
        self.positions, self.scores, self.available = found
        # what a page explains reads the factors of the rows scored (all it can show)
        self._query._scored = (rows[taken], semantic[taken], best[taken])

    def run(self) -> Ranking:
        """Every step at once."""
        for _ in self.steps():
            pass
        return self


def _ranked(
    positions: npt.NDArray[np.intp],
    discounted: npt.NDArray[np.float64],
    count: int,
    threshold: float,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    keep = discounted >= threshold
    positions, discounted = positions[keep], discounted[keep]
    if len(positions) > count:
        # the count best; among equal scores at the cut, the earlier units
        kth = np.partition(discounted, len(discounted) - count)[len(discounted) - count]
        above = np.flatnonzero(discounted > kth)
        tied = np.flatnonzero(discounted == kth)
        tied = tied[np.argsort(positions[tied], kind="stable")][: count - len(above)]
        top = np.concatenate([above, tied])
        positions, discounted = positions[top], discounted[top]
    order = np.lexsort((positions, -discounted))  # best first; ties to the earlier unit
    return positions[order], discounted[order]


def explain(
    index: UnitIndex,
    query: Query,
    unit: dict[str, Any],
    rank_score: float,
    *,
    recorded: int | None = None,
) -> str:
    """A human-readable reason for one unit's score.

    ``recorded`` is how many units had been recorded when it was scored
    (default: now); the unit's row and keywords never change.
    """
    row = index.rows[unit["id"]]
    words = index.row_keywords[row]
    source = unit["source"]
    parts = [f"{unit['type'].replace('_', ' ')} from {source['agent_id']} ({source['agent_role']})"]
    if source["agent_role"] == query.role:
        parts.append("same role as you")
    else:
        shared = query.role_words & index.role_keywords[int(index.role.view[row])]
        if shared:
            parts.append(f"a role like yours ({', '.join(sorted(shared))})")
    matched = []
    if query.interest_words & words:  # one set operation for the units that match none
        matched = [i for i, own in query.interest_keywords if own & words]
    if matched:
        parts.append(f"matches your interests: {', '.join(matched)}")
    hint = sorted(query.hint_words & words)
    if hint:
        parts.append(f"matches your context hint ({', '.join(hint[:5])})")
    closeness = query.closeness(index, row)
    if closeness is not None and closeness[0] >= index.weights.semantic_note:
        factor, text = closeness
        share = min(99, math.floor(index.weights.calibrated(factor) * 100))  # never "100%"
        if text == LEARNED:
            about = "the units you found useful"
        else:
            about = "your context hint" if text == query.context_hint else f'your interest "{text}"'
        parts.append(f"close in meaning to {about} (closer than {share}% of units)")
    if query.task_id is not None and unit["intent"].get("task_id") == query.task_id:
        parts.append(f"serves your task {query.task_id}")
    score_value = (unit.get("confidence") or {}).get("score")
    if score_value is not None:
        parts.append(f"confidence {score_value:.2f}")
    age = (len(index) if recorded is None else recorded) - 1 - row
    if age == 0:
        parts.append("the newest unit")
    else:
        parts.append(f"{age} unit{'s' if age > 1 else ''} recorded since")
    if unit["status"] == "contested":
        parts.append("contested")
    return "; ".join(parts) + f" (relevance {rank_score:.2f})"
