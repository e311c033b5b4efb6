"""Active subscriptions as columns, one row per subscription.

The matcher scores an event against every row at once, so everything it
needs about a subscription and its agent lives here in numpy arrays:
the event bitmask, ``min_relevance``, the window, the agent (for "not
my own actions" and "my unit"), the agent's role and task codes, and
inverted indexes from keyword to the rows whose agent has that word in
its role or interests. Rows are never reused; a cancelled row is marked
inactive (``active`` is False) and is skipped by a mask.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..core.relevance import Column, Interner, keywords
from .events import EVENT_BIT

#: Up to this many rows, :meth:`SubscriptionRegistry.hits` intersects word sets.
FEW_ROWS = 16


class SubscriptionRegistry:
    """Column store of subscriptions (see the module docstring)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.rows: dict[str, int] = {}
        self.active = Column(np.bool_)
        self.event_mask = Column(np.int64)
        self.min_relevance = Column(np.float64)
        self.include_own = Column(np.bool_)
        self.created_epoch = Column(np.int64)
        self.agent = Column(np.int32)
        self.role = Column(np.int32)
        self.task = Column(np.int32)
        self.role_word_count = Column(np.float64)
        self.interest_word_count = Column(np.float64)
        self.agents = Interner()
        self.roles = Interner()
        self.tasks = Interner()
        self.role_words: dict[str, Column] = {}
        self.interest_words: dict[str, Column] = {}
        #: per row, its agent's role and interest words (for matching a few rows)
        self.row_words: list[tuple[frozenset[str], frozenset[str]]] = []

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, subscription: dict[str, Any], agent: dict[str, Any]) -> None:
        """Add a row for ``subscription``, made by ``agent`` (its wire form)."""
        row = len(self.ids)
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
        self.role.append(self.roles.code(agent["role"]))
        task = agent.get("current_task_id")
        self.task.append(-1 if task is None else self.tasks.code(task))
        role_words = set(keywords(agent["role"]))
        interest_words = {w for phrase in agent["interests"] for w in keywords(phrase)}
        self.row_words.append((frozenset(role_words), frozenset(interest_words)))
        self.role_word_count.append(len(role_words))
        self.interest_word_count.append(len(interest_words))
        indexes = ((role_words, self.role_words), (interest_words, self.interest_words))
        for words, postings in indexes:
            for word in words:
                column = postings.get(word)
                if column is None:
                    column = postings[word] = Column(np.int32)
                column.append(row)

    def cancel(self, subscription_id: str) -> None:
        self.active[self.rows[subscription_id]] = False

    def hits(
        self, kind: str, words: frozenset[str], rows: npt.NDArray[np.intp]
    ) -> npt.NDArray[np.float64]:
        """For each of ``rows``, how many of ``words`` its agent has ("role" or "interest").

        Over many rows this adds up the inverted index, one event keyword at
        a time; for a handful of rows (replaying one subscription) it
        intersects their word sets directly.
        """
        which = 0 if kind == "role" else 1
        if len(rows) <= FEW_ROWS:
            return np.array(
                [len(self.row_words[r][which] & words) for r in rows.tolist()], dtype=np.float64
            )
        postings = self.role_words if which == 0 else self.interest_words
        counts = np.zeros(len(self.ids), dtype=np.float64)
        for word in words:  # a loop over the event's words, never over subscriptions
            column = postings.get(word)
            if column is not None:
                counts[column.view] += 1.0
        return counts[rows]
