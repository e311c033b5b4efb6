"""Which log entries are about which entities: the index REPLAY reads the log by.

REPLAY must rebuild a timeline from the append-only log (spec 6.8), and the
core does no I/O, so the state keeps, per entity, the log positions of the
entries about it (plain ints), and the links between entities that a
causal chain follows. The Field then reads exactly those positions.

What an entry is about is decided by convention, from its ``data`` alone,
so entries of operations written later are indexed without changes here:

============  ==========================================================
entity        an entry is about it when its data has
============  ==========================================================
unit          ``unit`` (an object with ``id``) or ``memory_unit_id``
conflict      ``conflict`` (an object with ``id``) or ``conflict_id``
task          ``task`` (an object with ``id``) or ``task_id``, or a
              ``unit`` whose ``intent.task_id`` is set
session       ``session`` (an object with ``id``) or ``session_id``, or a
              ``unit`` whose ``source.session_id`` is set
============  ==========================================================

Links (undirected) join units and conflicts: a unit and the targets of its
``relations``; a conflict object and its ``unit_a`` / ``unit_b``; and any
units and conflicts named by one entry. A task or session has *members*:
the units whose entries are about it.
"""

from __future__ import annotations

from typing import Any

#: An entity: (kind, id), kind one of ``unit``, ``conflict``, ``task``, ``session``.
Entity = tuple[str, str]

KINDS: tuple[str, ...] = ("unit", "conflict", "task", "session")
_ID_KEYS = {
    "unit": "memory_unit_id",
    "conflict": "conflict_id",
    "task": "task_id",
    "session": "session_id",
}


def _object_id(value: Any) -> str | None:
    if isinstance(value, dict):
        found = value.get("id")
        if isinstance(found, str):
            return found
    return None


def entities_of(data: dict[str, Any]) -> list[Entity]:
    """The entities an entry with this ``data`` is about, each once, in a fixed order."""
    found: list[Entity] = []
    for kind in KINDS:
        for value in (_object_id(data.get(kind)), data.get(_ID_KEYS[kind])):
            if isinstance(value, str) and (kind, value) not in found:
                found.append((kind, value))
    unit = data.get("unit")
    if isinstance(unit, dict):
        task = (unit.get("intent") or {}).get("task_id")
        session = (unit.get("source") or {}).get("session_id")
        for kind, value in (("task", task), ("session", session)):
            if isinstance(value, str) and (kind, value) not in found:
                found.append((kind, value))
    return found


class EntityIndex:
    """Per entity, the positions of the log entries about it; and the links between them.

    Positions are kept by kind, then id: most entities (units) have one entry, so a
    single position is held as an int and only a second one makes a list (a unit's
    positions cost about 80 bytes rather than 220 with a tuple key and a list).
    """

    def __init__(self) -> None:
        self._positions: dict[str, dict[str, int | list[int]]] = {kind: {} for kind in KINDS}
        self._links: dict[Entity, set[Entity]] = {}

    def note(self, position: int, data: dict[str, Any]) -> None:
        """Index the entry at ``position`` (called for every entry, in log order)."""
        about = entities_of(data)
        if not about:
            return
        for kind, ident in about:
            table = self._positions[kind]
            held = table.get(ident)
            if held is None:
                table[ident] = position
            elif isinstance(held, int):
                table[ident] = [held, position]
            else:
                held.append(position)
        chain = [e for e in about if e[0] in ("unit", "conflict")]
        groups = [e for e in about if e[0] in ("task", "session")]
        for a in chain:
            for b in chain:
                if a[0] != b[0]:
                    self._link(a, b)
            for group in groups:  # members: a group reaches its units, not the reverse
                self._links.setdefault(group, set()).add(a)
        unit_id = _object_id(data.get("unit"))
        if unit_id is not None:
            for relation in data["unit"].get("relations") or ():
                target = relation.get("target_id") if isinstance(relation, dict) else None
                if isinstance(target, str):
                    self._link(("unit", unit_id), ("unit", target))
        conflict = data.get("conflict")
        conflict_id = _object_id(conflict)
        if conflict_id is not None and isinstance(conflict, dict):
            for key in ("unit_a", "unit_b"):
                if isinstance(conflict.get(key), str):
                    self._link(("conflict", conflict_id), ("unit", conflict[key]))

    def _link(self, a: Entity, b: Entity) -> None:
        if a != b:
            self._links.setdefault(a, set()).add(b)
            self._links.setdefault(b, set()).add(a)

    def positions(self, entity: Entity) -> list[int]:
        """Log positions of the entries about ``entity``, ascending."""
        held = self._positions[entity[0]].get(entity[1])
        if held is None:
            return []
        return [held] if isinstance(held, int) else list(held)

    def known(self, entity: Entity) -> bool:
        return entity[1] in self._positions[entity[0]]

    def neighbours(self, entity: Entity) -> set[Entity]:
        """Linked units and conflicts (for a task or session: its units)."""
        return self._links.get(entity, set())

    def walk(self, root: Entity, *, hops: int | None, limit: int) -> tuple[list[Entity], bool]:
        """Entities within ``hops`` links of ``root`` (None: all), breadth first.

        Stops after ``limit`` entities; the flag says whether the walk was
        complete. Only the root may be a task or session: the walk never
        steps from a unit into the groups it belongs to.
        """
        seen = {root}
        order = [root]
        frontier = [root]
        depth = 0
        while frontier and (hops is None or depth < hops):
            depth += 1
            following: list[Entity] = []
            for entity in frontier:
                for neighbour in sorted(self.neighbours(entity)):
                    if neighbour in seen or neighbour[0] not in ("unit", "conflict"):
                        continue
                    if len(order) >= limit:
                        return order, False
                    seen.add(neighbour)
                    order.append(neighbour)
                    following.append(neighbour)
            frontier = following
        return order, True
