"""Active subscriptions as columns, one row per subscription.

The matcher scores an event against every row at once, so everything it
needs lives here in numpy arrays: per subscription, the event bitmask,
``min_relevance``, ``include_own``, the creation epoch and the agent (for
"not my own actions" and "my unit"); per agent *profile* (an agent as it
was when it subscribed: role, task, role and interest keywords, with
inverted indexes from keyword to profile, and the quantized embedding
of each of its interests), which many subscriptions share. Relevance depends
only on the profile, so the matcher scores each profile once and gathers
the scores for the subscriptions. Rows are never reused; a cancelled row
is marked inactive and skipped by a mask.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ..ranking.calibration import Calibration
from ..ranking.embedding import Embedder, default_embedder
from ..ranking.learning import Judged
from ..ranking.relevance import (
    Column,
    Interests,
    Interner,
    Matrix,
    interest_vectors,
    interests_rows,
    keyword_unit,
    keywords,
    ranges,
)
from .events import EVENT_BIT

#: Up to this many profiles, :meth:`SubscriptionRegistry.hits` intersects word sets.
FEW_ROWS = 16
#: Checkpoints whose interest scales the registry keeps (see :meth:`scales`).
KEPT_SCALES = 8
#: Multiply-adds of one block of rows' scales, and of one step of
#: :meth:`SubscriptionRegistry.scales_in_steps`: 1,024 rows of 128 dimensions, 256 of 256
#: (about 2.5 ms)
SCALE_CELLS = 1 << 24


def _scale_rows(calibration: Calibration) -> int:
    """The rows of one step of :meth:`SubscriptionRegistry.scales_in_steps`."""
    return max(1, SCALE_CELLS // max(1, calibration.dim) ** 2)


class SubscriptionRegistry:
    """Column store of subscriptions (see the module docstring)."""

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or default_embedder()
        #: counts the changes to the rows (added, cancelled): what a matching Scope depends on
        self.version = 0
        self.ids: list[str] = []
        self.rows: dict[str, int] = {}
        self.active = Column(np.bool_)
        self.event_mask = Column(np.int64)
        self.min_relevance = Column(np.float64)
        self.include_own = Column(np.bool_)
        self.created_epoch = Column(np.int64)
        self.agent = Column(np.int32)
        self.profile = Column(np.int32)
        self.agents = Interner()
        #: per subscription, the code of its filter expression's text (-1: no filter);
        #: ``filter_texts[code]`` is the text (subscriptions with one text share a code)
        self.filter = Column(np.int32)
        self.filters = Interner()
        self.filter_texts: list[str] = []
        # per profile
        #: (agent id, registered epoch), and the generation of its feedback once it gave some
        self.profiles: dict[tuple[str, int] | tuple[str, int, int], int] = {}
        self.role = Column(np.int32)
        self.task = Column(np.int32)
        self.role_word_count = Column(np.float64)
        #: keywords per interest (:func:`~field.ranking.relevance.keyword_unit`; 0: none)
        self.interest_unit = Column(np.float64)
        self.roles = Interner()
        self.tasks = Interner()
        self.role_words: dict[str, Column] = {}
        self.interest_words: dict[str, Column] = {}
        #: per profile, its role and interest words (for matching a few profiles)
        self.profile_words: list[tuple[frozenset[str], frozenset[str]]] = []
        #: per profile, its role and task as strings
        self.profile_role: list[str] = []
        self.profile_task: list[str | None] = []
        #: per profile, the agent as a filter reads it (``subscriber``), and its key in
        #: ``profiles``
        self.profile_agent: list[dict[str, Any]] = []
        self.profile_keys: list[tuple[str, int] | tuple[str, int, int]] = []
        #: per profile, where its interests' rows start below, how many rows it has in all
        #: and how many are compared for the best match: its interests (those that embed to
        #: something, each text once: as ATTUNE compares them), then the units its feedback
        #: judged useful; then ``against_count`` rows of units judged not useful; then, for
        #: more than one interest or any feedback, a row of them all joined
        #: (:func:`~field.ranking.relevance.interests_rows`)
        self.interest_start = Column(np.int64)
        self.interest_span = Column(np.int64)
        self.interest_count = Column(np.int64)
        self.against_count = Column(np.int64)
        #: per profile, what its percentile counts, its best match's share of the mix and
        #: the penalty of units judged not useful (:class:`~field.ranking.relevance.Interests`)
        self.compared = Column(np.int64)
        self.weight = Column(np.float64)
        self.penalty = Column(np.float64)
        #: per interest row (profiles' rows end to end), its quantized embedding and its
        #: squared norm
        self.vectors = Matrix(self.embedder.dim)
        self.squares = Column(np.float64)
        #: the same rows as int8 (:func:`packed`): a quarter of the bytes the matcher's
        #: product reads, the same dot products; None from the first row that does not fit
        self.packed: Matrix | None = Matrix(self.embedder.dim, np.int8)
        #: checkpoint position -> each interest row's (scale, shift) there (:meth:`scales`)
        self._scales: dict[int, tuple[Column, Column]] = {}
        #: cancelled subscriptions :meth:`compact` dropped, each with the agent as its
        #: profile was made from (what :meth:`add` needs to add its row again)
        self.retired: dict[str, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def profile_count(self) -> int:
        return len(self.profile_words)

    def add(
        self,
        subscription: dict[str, Any],
        agent: dict[str, Any],
        learned: tuple[Judged, Interests] | None = None,
    ) -> None:
        """Add a row for ``subscription``, made by ``agent`` (its wire form), whose feedback
        taught ``learned`` (:func:`field.core.feedback.learned`)."""
        row = len(self.ids)
        self.version += 1
        self.ids.append(subscription["id"])
        self.rows[subscription["id"]] = row
        self.active.append(subscription["status"] == "active")
        mask = 0
        for name in subscription["events"]:
            mask |= EVENT_BIT[name]
        self.event_mask.append(mask)
        self.min_relevance.append(subscription["min_relevance"])
        self.include_own.append(subscription["include_own"])
        self.created_epoch.append(subscription["created_epoch"])
        self.agent.append(self.agents.code(agent["id"]))
        self.profile.append(self._profile(agent, learned))
        text = subscription.get("filter")
        if text is None:
            self.filter.append(-1)
        else:
            code = self.filters.code(text)
            if code == len(self.filter_texts):
                self.filter_texts.append(text)
            self.filter.append(code)

    def relearn(
        self,
        agent: dict[str, Any],
        learned: tuple[Judged, Interests] | None,
        calibration: Calibration,
    ) -> None:
        """Give ``agent``'s active rows the profile of what its feedback taught.

        A profile learned before, with as many rows, is written over in place (its
        rows, their kept scales, its key): once an agent's lists of judged units are
        full every FEEDBACK has as many rows, so what an agent's feedback adds to the
        registry is bounded, however often it judges.
        """
        code = self.agents.find(agent["id"])
        if code < 0 or learned is None:
            return
        rows = np.flatnonzero((self.agent.view == code) & self.active.view)
        if not len(rows):
            return
        self.version += 1
        judged, interests = learned
        key = (agent["id"], agent["registered_epoch"], judged.generation)
        current = np.unique(self.profile.view[rows])
        vectors, squares = interests_rows(interests)
        if len(current) == 1:
            profile = int(current[0])
            old = self.profile_keys[profile]
            span = int(self.interest_span.view[profile])
            if len(old) == 3 and old[:2] == key[:2] and span == len(vectors):
                self._write_over(profile, key, interests, calibration)
                return
        self.profile.view[rows] = self._profile(agent, learned)

    def _write_over(
        self,
        profile: int,
        key: tuple[str, int, int],
        interests: Interests,
        calibration: Calibration,
    ) -> None:
        vectors, squares = interests_rows(interests)
        start, span = int(self.interest_start.view[profile]), len(vectors)
        self.vectors.view[start : start + span] = vectors
        self.squares.view[start : start + span] = squares
        if self.packed is not None:
            small = packed(vectors)
            if small is None:
                self.packed = None
            else:
                self.packed.view[start : start + span] = small
        against = 0 if interests.against is None else len(interests.against)
        self.interest_count.view[profile] = len(interests.vectors)
        self.against_count.view[profile] = against
        self.compared.view[profile] = interests.compared
        self.weight.view[profile] = interests.weight
        self.penalty.view[profile] = interests.penalty
        del self.profiles[self.profile_keys[profile]]
        self.profiles[key] = profile
        self.profile_keys[profile] = key
        for position, (scale, shift) in self._scales.items():
            end = min(scale.size, start + span)
            if end > start:
                found = calibration.scales(vectors[: end - start], squares[: end - start], position)
                scale.view[start:end], shift.view[start:end] = found

    def _profile(
        self, agent: dict[str, Any], learned: tuple[Judged, Interests] | None = None
    ) -> int:
        key: tuple[str, int] | tuple[str, int, int] = (agent["id"], agent["registered_epoch"])
        if learned is not None:
            key = (*key, learned[0].generation)
        profile = self.profiles.get(key)
        if profile is not None:
            return profile
        profile = self.profiles[key] = self.profile_count
        self.profile_keys.append(key)
        self.role.append(self.roles.code(agent["role"]))
        task = agent.get("current_task_id")
        self.task.append(-1 if task is None else self.tasks.code(task))
        self.profile_role.append(agent["role"])
        self.profile_task.append(task)
        self.profile_agent.append(
            {
                "id": agent["id"],
                "role": agent["role"],
                "interests": list(agent["interests"]),
                "authority": agent.get("authority"),
                "current_task": task,
            }
        )
        role_words = frozenset(keywords(agent["role"]))
        phrases = [frozenset(keywords(phrase)) for phrase in agent["interests"]]
        interest_words = frozenset().union(*phrases)
        self.profile_words.append((role_words, interest_words))
        self.role_word_count.append(len(role_words))
        self.interest_unit.append(keyword_unit(phrases))
        self.interest_start.append(self.squares.size)
        interests = (
            interest_vectors(None, agent["interests"], embedder=self.embedder)
            if learned is None
            else learned[1]
        )
        vectors, squares = interests_rows(interests)
        self.interest_span.append(len(vectors))
        self.interest_count.append(len(interests.vectors))
        against = 0 if interests.against is None else len(interests.against)
        self.against_count.append(against)
        self.compared.append(interests.compared)
        self.weight.append(interests.weight)
        self.penalty.append(interests.penalty)
        self.vectors.extend(vectors)
        self.squares.extend(squares)
        if self.packed is not None:
            small = packed(vectors)
            if small is None:
                self.packed = None
            else:
                self.packed.extend(small)
        indexes = ((role_words, self.role_words), (interest_words, self.interest_words))
        for words, postings in indexes:
            for word in words:
                column = postings.get(word)
                if column is None:
                    column = postings[word] = Column(np.int32)
                column.append(profile)
        return profile

    def cancel(self, subscription_id: str) -> None:
        self.version += 1
        self.active[self.rows[subscription_id]] = False

    def row_of(self, subscription: dict[str, Any]) -> int:
        """The row of ``subscription``; one :meth:`compact` dropped is added again first
        (cancelled, with the profile it had), so that a stream can be replayed to its end."""
        row = self.rows.get(subscription["id"])
        if row is None:
            self.add(subscription, self.retired.pop(subscription["id"]))
            row = self.rows[subscription["id"]]
        return row

    def compact(self, registrations: Collection[tuple[str, int]]) -> None:
        """Drop the cancelled rows, and the profiles no active row uses unless their agent
        is still registered as it was (``registrations``: ``(agent id, registered_epoch)``
        of every registered agent, whose next subscription reuses its profile).

        What is left matches every event exactly as before; a dropped row is kept
        in ``retired`` until :meth:`row_of` asks for it.
        """
        active = self.active.view
        kept_rows = np.flatnonzero(active)
        if len(kept_rows) == len(self.ids):
            return
        key_of = {profile: key for key, profile in self.profiles.items()}
        agents: dict[int, dict[str, Any]] = {}
        for row in np.flatnonzero(~active).tolist():
            profile = int(self.profile.view[row])
            agent = agents.get(profile)
            if agent is None:
                agent = agents[profile] = self._profile_wire(profile, key_of[profile][1])
            self.retired[self.ids[row]] = agent
        used = set(self.profile.view[kept_rows].tolist())
        used.update(p for key, p in self.profiles.items() if key in registrations)
        kept_profiles = np.array(sorted(used), dtype=np.intp)
        renumber = np.full(self.profile_count, -1, dtype=np.int32)
        renumber[kept_profiles] = np.arange(len(kept_profiles), dtype=np.int32)
        self._keep_rows(kept_rows, renumber)
        self._keep_profiles(kept_profiles, key_of)
        self.version += 1

    def _profile_wire(self, profile: int, registered_epoch: int) -> dict[str, Any]:
        """The agent (its wire form, as :meth:`add` takes it) ``profile`` was made from."""
        agent = self.profile_agent[profile]
        return {
            "id": agent["id"],
            "role": agent["role"],
            "interests": list(agent["interests"]),
            "current_task_id": agent["current_task"],
            "registered_epoch": registered_epoch,
            "authority": agent["authority"],
        }

    def _keep_rows(self, kept: npt.NDArray[np.intp], renumber: npt.NDArray[np.int32]) -> None:
        self.ids = [self.ids[row] for row in kept.tolist()]
        self.rows = {subscription_id: row for row, subscription_id in enumerate(self.ids)}
        for name in _ROW_COLUMNS:
            setattr(self, name, _taken(getattr(self, name), kept))
        self.profile = _taken(self.profile, kept)
        self.profile.view[:] = renumber[self.profile.view]

    def _keep_profiles(
        self,
        kept: npt.NDArray[np.intp],
        key_of: dict[int, tuple[str, int] | tuple[str, int, int]],
    ) -> None:
        order = kept.tolist()
        self.profiles = {key_of[old]: new for new, old in enumerate(order)}
        spans = self.interest_span.view[kept]
        rows = ranges(self.interest_start.view[kept], spans)
        for name in _PROFILE_COLUMNS:
            setattr(self, name, _taken(getattr(self, name), kept))
        for name in _PROFILE_LISTS:
            values = getattr(self, name)
            setattr(self, name, [values[old] for old in order])
        vectors = Matrix(self.embedder.dim)
        vectors.extend(self.vectors.view[rows])
        self.vectors = vectors
        if self.packed is not None:
            small = Matrix(self.embedder.dim, np.int8)
            small.extend(self.packed.view[rows])
            self.packed = small
        self.squares = _taken(self.squares, rows)
        self.interest_start = Column(np.int64)
        self.interest_start.extend(np.cumsum(spans) - spans)
        self._scales = {}
        self.role_words, self.interest_words = {}, {}
        for profile, words in enumerate(self.profile_words):
            for found, postings in zip(words, (self.role_words, self.interest_words), strict=True):
                for word in found:
                    column = postings.get(word)
                    if column is None:
                        column = postings[word] = Column(np.int32)
                    column.append(profile)

    def interests(self, profile: int) -> Interests:
        """A profile's interests as ATTUNE compares them (its texts are not kept: the
        number of them is what the factor reads)."""
        start, span, count, against = (
            int(self.interest_start.view[profile]),
            int(self.interest_span.view[profile]),
            int(self.interest_count.view[profile]),
            int(self.against_count.view[profile]),
        )
        joined = None
        if span > count + against:
            joined = self.vectors.view[start + span - 1], float(self.squares.view[start + span - 1])
        rows = slice(start + count, start + count + against)
        return Interests(
            self.vectors.view[start : start + count],
            self.squares.view[start : start + count],
            ("",) * count,
            joined,
            self.vectors.view[rows],
            self.squares.view[rows],
            counted=int(self.compared.view[profile]),
            weight=float(self.weight.view[profile]),
            penalty=float(self.penalty.view[profile]),
        )

    def scales(self, calibration: Calibration, position: int) -> tuple[Any, Any]:
        """Every interest row's (scale, shift) at checkpoint ``position`` of ``calibration``
        (:meth:`~field.ranking.calibration.Calibration.scales`).

        Kept for the last :data:`KEPT_SCALES` checkpoints asked for, and
        extended for the interests added since: a checkpoint comes at most
        once per doubling of the units (then every 65,536), so most batches
        read them whole. The first batch at a new checkpoint makes them for
        every row: :meth:`scales_in_steps` makes them ahead in short steps.
        """
        found = self._extended(calibration, position, self.squares.size)
        return found[0].view, found[1].view

    def scales_in_steps(self, calibration: Calibration, position: int) -> Iterator[None]:
        """Make :meth:`scales` ``(calibration, position)`` ahead, :data:`SCALE_CELLS`
        multiply-adds a step, yielding after each step that made some.

        At a new checkpoint every interest row's scales are made: 0.2-0.6 s at
        300,000 rows, which must not hold the event loop at once. Each row's
        are computed alone, so rows made in steps are the same to the bit as
        rows made at once; rows added between two steps are made too.
        """
        rows = _scale_rows(calibration)
        while True:
            kept = self._scales.get(position)
            done = 0 if kept is None else kept[0].size
            if done >= self.squares.size:
                return
            self._extended(calibration, position, done + rows)
            yield

    def _extended(
        self, calibration: Calibration, position: int, upto: int
    ) -> tuple[Column, Column]:
        """The kept scales of checkpoint ``position``, made for the rows up to ``upto``
        at least (the most recently used)."""
        found = self._scales.pop(position, None)
        if found is None:
            found = (Column(np.float64), Column(np.float64))
        step = _scale_rows(calibration)
        # a block of rows at a time: its float64 temporaries stay in the cache (300,000
        # rows of 128 dimensions at once took 1.6 s, in blocks 0.23 s)
        for done in range(found[0].size, min(upto, self.squares.size), step):
            end = min(upto, done + step)
            scale, shift = calibration.scales(
                self.vectors.view[done:end], self.squares.view[done:end], position
            )
            found[0].extend(scale)
            found[1].extend(shift)
        if len(self._scales) >= KEPT_SCALES:
            del self._scales[next(iter(self._scales))]  # the least recently used
        self._scales[position] = found
        return found

    def hits(
        self, kind: str, words: frozenset[str], profiles: npt.NDArray[np.intp]
    ) -> npt.NDArray[np.float64]:
        """For each of ``profiles``, how many of ``words`` it has ("role" or "interest").

        Over many profiles this adds up the inverted index, one event keyword
        at a time; for a handful (replaying one subscription) it intersects
        their word sets directly.
        """
        which = 0 if kind == "role" else 1
        if len(profiles) <= FEW_ROWS:
            return np.array(
                [len(self.profile_words[p][which] & words) for p in profiles.tolist()],
                dtype=np.float64,
            )
        postings = self.role_words if which == 0 else self.interest_words
        counts = np.zeros(self.profile_count, dtype=np.float64)
        for word in words:  # a loop over the event's words, never over subscriptions
            column = postings.get(word)
            if column is not None:
                counts[column.view] += 1.0
        return counts[profiles]


#: The per-subscription columns (besides ``profile``) and the per-profile ones.
_ROW_COLUMNS = (
    "active",
    "event_mask",
    "min_relevance",
    "include_own",
    "created_epoch",
    "agent",
    "filter",
)
_PROFILE_COLUMNS = (
    "role",
    "task",
    "role_word_count",
    "interest_unit",
    "interest_span",
    "interest_count",
    "against_count",
    "compared",
    "weight",
    "penalty",
)
_PROFILE_LISTS = ("profile_words", "profile_role", "profile_task", "profile_agent", "profile_keys")


def packed(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.int8] | None:
    """``rows`` as int8, or None if one of their values is not an integer from -127 to 127.

    Quantized rows (:func:`~field.ranking.embedding.quantize`) always are, so their
    int8 form holds the same values: converted back to float32, a product with them
    gives the same exact integer dot products, bit for bit.
    """
    if not len(rows):
        return np.zeros(rows.shape, dtype=np.int8)
    if not np.isfinite(rows).all() or np.abs(rows).max() > 127:
        return None
    small = rows.astype(np.int8)
    return small if np.array_equal(small, rows) else None


def _taken(column: Column, rows: npt.NDArray[np.intp]) -> Column:
    """A new column of ``column``'s values at ``rows``."""
    taken = Column(column.view.dtype)
    taken.extend(column.view[rows])
    return taken
