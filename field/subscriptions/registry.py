"""Active subscriptions as columns, one row per subscription.

The matcher scores an event against every row at once, so everything it
needs lives here in numpy arrays: per subscription, the event bitmask,
``min_relevance``, ``include_own``, the creation epoch and the agent (for
"not my own actions" and "my unit"); per agent *profile* (an agent as it
was when it subscribed: role, task, role and interest keywords, with
inverted indexes from keyword to profile, and the quantized embedding
of its interests), which many subscriptions share. Relevance depends
only on the profile, so the matcher scores each profile once and gathers
the scores for the subscriptions. Rows are never reused; a cancelled row
is marked inactive and skipped by a mask.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..core.embedding import Embedder, default_embedder, quantize
from ..core.relevance import Column, Interner, Matrix, keyword_unit, keywords, semantic_text
from .events import EVENT_BIT

#: Up to this many profiles, :meth:`SubscriptionRegistry.hits` intersects word sets.
FEW_ROWS = 16


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
        self.profiles: dict[tuple[str, int], int] = {}
        self.role = Column(np.int32)
        self.task = Column(np.int32)
        self.role_word_count = Column(np.float64)
        #: keywords per interest (:func:`~field.core.relevance.keyword_unit`; 0: none)
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
        #: per profile, the agent as a filter reads it (``subscriber``)
        self.profile_agent: list[dict[str, Any]] = []
        #: per profile, the quantized embedding of its interests and its squared norm
        self.vectors = Matrix(self.embedder.dim)
        self.squares = Column(np.float64)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def profile_count(self) -> int:
        return len(self.profile_words)

    def add(self, subscription: dict[str, Any], agent: dict[str, Any]) -> None:
        """Add a row for ``subscription``, made by ``agent`` (its wire form)."""
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
        self.profile.append(self._profile(agent))
        text = subscription.get("filter")
        if text is None:
            self.filter.append(-1)
        else:
            code = self.filters.code(text)
            if code == len(self.filter_texts):
                self.filter_texts.append(text)
            self.filter.append(code)

    def _profile(self, agent: dict[str, Any]) -> int:
        key = (agent["id"], agent["registered_epoch"])
        profile = self.profiles.get(key)
        if profile is not None:
            return profile
        profile = self.profiles[key] = self.profile_count
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
        vector, square = quantize(self.embedder.embed([semantic_text(agent["interests"])]))
        self.vectors.extend(vector)
        self.squares.append(square[0])
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
