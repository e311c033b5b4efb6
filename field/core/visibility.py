"""Who may see what (spec 11.3): session scoping and per-session role rules.

A memory unit recorded without a session is Field-wide: every agent sees
it. A unit recorded in a session (its ``source.session_id``) is seen only
by the session's members, and among them only by those the session's
``visibility`` rules admit for the unit's type (roles, least authority).
The operator sees everything. What follows from a unit follows its rules:

* a conflict is visible when both its units are;
* a task in a session is visible to the session's members;
* session events reach the session's members.

ATTUNE, DETECT, MERGE, REPLAY, COMPACT, HANDOFF and RECORD relations ask
about *now* (current membership). Push asks about the moment of the
event: :class:`Membership` keeps, per session, the log positions at which
each agent joined and left, so a subscription's stream is the same live
and when it is replayed from the log, whoever joins or leaves later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..ranking.relevance import TYPE_CODE
from .authority import OPERATOR, OPERATOR_ID, SESSION_CREATOR
from .entities import entities_of

if TYPE_CHECKING:
    from ..subscriptions.events import FieldEvent
    from .state import AgentRecord, FieldState

#: A membership span: from the position of the join to that of the leave (None: still in).
Span = list[int | None]


class Membership:
    """Per session and agent, the spans of log positions it was a member for."""

    def __init__(self) -> None:
        self._spans: dict[str, dict[str, list[Span]]] = {}

    def update(self, session_id: str, before: Iterable[str], after: Iterable[str], at: int) -> None:
        """The members changed from ``before`` to ``after`` at log position ``at``."""
        old, new = set(before), set(after)
        spans = self._spans.setdefault(session_id, {})
        for agent_id in new - old:
            spans.setdefault(agent_id, []).append([at, None])
        for agent_id in old - new:
            spans[agent_id][-1][1] = at

    def was_member(self, session_id: str, agent_id: str, position: int) -> bool:
        """Whether ``agent_id`` was a member of ``session_id`` at log ``position``."""
        for start, end in self._spans.get(session_id, {}).get(agent_id, ()):
            assert start is not None
            if start <= position and (end is None or position < end):
                return True
        return False

    def members_at(self, session_id: str, position: int) -> set[str]:
        agents = self._spans.get(session_id, {})
        return {a for a in agents if self.was_member(session_id, a, position)}


def sees_everything(viewer: AgentRecord) -> bool:
    return viewer.authority >= OPERATOR


def session_admits(
    state: FieldState,
    viewer: AgentRecord,
    session_id: str | None,
    memory_type: str | None = None,
    *,
    position: int | None = None,
) -> bool:
    """Whether ``viewer`` may see what belongs to ``session_id`` (of ``memory_type``).

    ``position`` asks as of that log position (push); None asks about now.
    A session the Field does not know (a unit recorded before sessions
    were checked) scopes nothing.
    """
    if session_id is None or sees_everything(viewer):
        return True
    session = state.sessions.get(session_id)
    if session is None:
        return True
    if position is None:
        member = viewer.id in session["members"]
    else:
        member = state.membership.was_member(session_id, viewer.id, position)
    if not member:
        return False
    rule = session.get("visibility", {}).get(memory_type) if memory_type else None
    if rule is None:
        return True
    if rule["roles"] is not None and viewer.role not in rule["roles"]:
        return False
    level = viewer.authority
    if session["created_by"] == viewer.id:
        level = max(level, SESSION_CREATOR)
    return bool(level >= rule["min_authority"])


def unit_visible(
    state: FieldState, viewer: AgentRecord, unit: Mapping[str, Any], *, position: int | None = None
) -> bool:
    session_id = unit["source"].get("session_id")
    return session_admits(state, viewer, session_id, unit["type"], position=position)


def conflict_visible(
    state: FieldState,
    viewer: AgentRecord,
    conflict: Mapping[str, Any],
    *,
    position: int | None = None,
) -> bool:
    units = state.known_units
    return all(
        unit_visible(state, viewer, units[conflict[key]], position=position)
        for key in ("unit_a", "unit_b")
        if conflict[key] in units
    )


def task_visible(
    state: FieldState, viewer: AgentRecord, task: Mapping[str, Any], *, position: int | None = None
) -> bool:
    return session_admits(state, viewer, task.get("session_id"), position=position)


def entity_visible(state: FieldState, viewer: AgentRecord, kind: str, entity_id: str) -> bool:
    """Whether ``viewer`` may see a unit, conflict, task or session (now).

    Entities the state no longer holds (a task or session known only from
    the log) are judged by what the state has; unknown ones are visible.
    """
    if sees_everything(viewer):
        return True
    if kind == "unit":
        unit = state.known_units.get(entity_id)
        return unit is None or unit_visible(state, viewer, unit)
    if kind == "conflict":
        conflict = state.conflicts.get(entity_id)
        return conflict is None or conflict_visible(state, viewer, conflict)
    if kind == "task":
        task = state.tasks.get(entity_id)
        return task is None or task_visible(state, viewer, task)
    if kind == "session":
        return session_admits(state, viewer, entity_id)
    return True


def entry_visible(state: FieldState, viewer: AgentRecord, data: dict[str, Any]) -> bool:
    """Whether ``viewer`` may see a log entry: it may see everything the entry is about."""
    return all(entity_visible(state, viewer, kind, eid) for kind, eid in entities_of(data))


def row_mask(state: FieldState, viewer: AgentRecord) -> npt.NDArray[np.bool_] | None:
    """Which rows of the unit index ``viewer`` may see now; None: all of them."""
    index = state.index
    if sees_everything(viewer) or not index.sessions:
        return None
    codes = index.session.view
    admitted = [-1]
    excluded: list[tuple[int, int]] = []  # (session code, type code) hidden by a rule
    for session_id in state.sessions_by_member.get(viewer.id, ()):
        code = index.sessions.find(session_id)
        if code < 0:
            continue  # no unit recorded in it
        admitted.append(code)
        for memory_type in state.sessions[session_id].get("visibility", {}):
            if not session_admits(state, viewer, session_id, memory_type):
                excluded.append((code, TYPE_CODE[memory_type]))
    mask = np.isin(codes, admitted)
    for code, type_code in excluded:
        mask &= ~((codes == code) & (index.memory_type.view == type_code))
    return mask


def both(
    a: npt.NDArray[np.bool_] | None, b: npt.NDArray[np.bool_] | None
) -> npt.NDArray[np.bool_] | None:
    """The rows two row masks both admit (None admits all)."""
    if a is None:
        return b
    return a if b is None else a & b


def event_audience(state: FieldState, event: FieldEvent) -> set[str] | None:
    """The agents that may be told of ``event``, as of its position; None: everyone.

    An event is scoped by the sessions of what it is about: its units (with
    their types), its task, or the session itself. The operator is always
    in the audience.
    """
    scopes: list[tuple[str | None, str | None]] = []
    for unit_id in event.units:
        unit = state.known_units.get(unit_id)
        if unit is not None:
            scopes.append((unit["source"].get("session_id"), unit["type"]))
    if event.detail:
        task = event.detail.get("task")
        if isinstance(task, dict):
            scopes.append((task.get("session_id"), None))
        handoff = event.detail.get("handoff")
        if isinstance(handoff, dict):  # its package shows units: their rules apply too
            for item in handoff["context"]["units"]:
                unit = item["memory_unit"]
                scopes.append((unit["source"].get("session_id"), unit["type"]))
    if event.entity_type == "session":
        scopes.append((event.entity_id, None))
    audience: set[str] | None = None
    for session_id, memory_type in scopes:
        if session_id is None or session_id not in state.sessions:
            continue
        allowed = {
            agent_id
            for agent_id in state.membership.members_at(session_id, event.position)
            if agent_id in state.agents
            and session_admits(
                state, state.agents[agent_id], session_id, memory_type, position=event.position
            )
        }
        audience = allowed if audience is None else audience & allowed
    if audience is not None:
        audience.add(OPERATOR_ID)
    return audience
