"""Allow lists: per agent, the ids its own operations have touched, by log position.

A subscription filter tests membership in them (``event.task.id in
parameters.task_id``), so an agent hears about what it works on without
naming it. Each list grows from the log alone, as entries are applied:

============== ==============================================================
``task_id``    tasks the agent created, was assigned (any task entry naming it
               assignee), handed off or received (``handoff.incoming``), or
               recorded a unit under (``intent.task_id``)
``unit_id``    units the agent recorded
``conflict_id`` conflicts detected between units one of which it recorded
``session_id`` sessions it was a member of (created or joined)
============== ==============================================================

Lists only grow: every value keeps the position of the entry that first
added it, and values are kept in that order, so the list *as of* position
``p`` is a prefix (the values first added at or before ``p``). A replayed
stream therefore sees each list exactly as the live one did.

Each list holds at most :data:`MAX_ALLOW_LIST` values; once full it takes no
more (later values are not added, and ``full`` says so). A subscription that
must follow more seals its list with bindings instead.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The allow lists the Field keeps, by the name a filter reads (``parameters.<name>``).
ALLOW_LIST_NAMES: tuple[str, ...] = ("task_id", "unit_id", "conflict_id", "session_id")
#: Most values in one agent's list of one name.
MAX_ALLOW_LIST = 1000


@dataclass(slots=True)
class _List:
    """One agent's values of one name, in the order they were first added."""

    values: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    #: the map a filter reads, by how many values it holds (the live one is the whole list)
    maps: dict[int, dict[str, bool]] = field(default_factory=dict)

    def add(self, value: str, position: int) -> None:
        if value in self.seen or len(self.values) >= MAX_ALLOW_LIST:
            return
        self.seen.add(value)
        self.values.append(value)
        self.positions.append(position)

    def as_of(self, position: int) -> dict[str, bool]:
        """``{value: True}`` for the values first added at or before ``position``."""
        count = bisect_right(self.positions, position)
        found = self.maps.get(count)
        if found is None:
            if len(self.maps) >= 8:  # a few prefixes are in use at once: live, a replay or two
                self.maps.clear()
            found = self.maps[count] = dict.fromkeys(self.values[:count], True)
        return found


@dataclass(slots=True)
class AllowLists:
    """Every agent's allow lists (a piece of the projection of the log)."""

    lists: dict[tuple[str, str], _List] = field(default_factory=dict)

    def as_of(self, agent_id: str, name: str, position: int) -> dict[str, bool]:
        """The agent's list ``name`` as of log position ``position``, as a map (a
        filter's ``in`` on a map is one lookup). Empty if it never grew. Read only."""
        found = self.lists.get((agent_id, name))
        return _EMPTY if found is None else found.as_of(position)

    def values(self, agent_id: str, name: str) -> list[str]:
        """All the values of the agent's list ``name``, oldest first."""
        found = self.lists.get((agent_id, name))
        return [] if found is None else list(found.values)

    def full(self, agent_id: str, name: str) -> bool:
        found = self.lists.get((agent_id, name))
        return found is not None and len(found.values) >= MAX_ALLOW_LIST

    def _add(self, agent_id: str | None, name: str, value: Any, position: int) -> None:
        if agent_id is None or not isinstance(value, str):
            return
        found = self.lists.get((agent_id, name))
        if found is None:
            found = self.lists[(agent_id, name)] = _List()
        found.add(value, position)

    def grow(
        self,
        kind: str,
        data: Mapping[str, Any],
        position: int,
        units: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """Add what the entry of ``kind`` at ``position`` gives its agents (``units``:
        every unit by id, purged ones as tombstones, for the authors of a conflict)."""
        if kind == "memory.recorded":
            unit = data["unit"]
            author = unit["source"]["agent_id"]
            self._add(author, "unit_id", unit["id"], position)
            self._add(author, "task_id", unit["intent"].get("task_id"), position)
        elif kind.startswith("task."):
            task = data["task"]
            if kind == "task.created":
                self._add(task["created_by"], "task_id", task["id"], position)
            self._add(task.get("assignee"), "task_id", task["id"], position)
        elif kind == "handoff.incoming":
            record = data["handoff"]
            for agent_id in (record["from_agent_id"], record["to_agent_id"]):
                self._add(agent_id, "task_id", record["task_id"], position)
        elif kind == "conflict.detected":
            conflict = data["conflict"]
            for key in ("unit_a", "unit_b"):
                unit = units.get(conflict[key])
                if unit is not None:
                    self._add(unit["source"]["agent_id"], "conflict_id", conflict["id"], position)
        elif kind.startswith("session."):
            session = data["session"]
            for agent_id in session["members"]:
                self._add(agent_id, "session_id", session["id"], position)


_EMPTY: dict[str, bool] = {}
