"""The list reads, one page at a time: agents, conflicts, sessions and tasks.

Each list has a fixed order and a key per item, and a page is the items
after the key ``after`` (:mod:`field.core.pages` bounds it in items,
bytes and candidates looked at):

=============  =============================  =================================
list           order                          read by
=============  =============================  =================================
agents         by id                          ``GET /v1/agents``
conflicts      as detected (oldest first)     ``GET /v1/conflicts``, DETECT list
sessions       as created (oldest first)      SESSION list (the caller's)
tasks          as created (oldest first)      COORDINATE list (the caller's)
=============  =============================  =================================

Agents are ordered by id so that a page can start after an agent that
has since deregistered; conflicts, sessions and tasks are never removed,
so their place is fixed. An item present through the whole reading is
on exactly one page; one added or changed meanwhile may or may not be.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Iterator
from typing import Any

from . import pages, sessions, visibility
from .pages import Page, PageRequest
from .state import AgentRecord, FieldState

#: (key, item or None) of the candidates of a list, in its order; None: filtered out.
Candidates = Iterator[tuple[str, dict[str, Any] | None]]


def page_of(
    state: FieldState, body: dict[str, Any], candidates: Candidates, request: PageRequest
) -> Page:
    """A page of ``candidates`` for the response ``body`` (its list still empty)."""
    limits = state.limits
    return pages.collect(
        candidates,
        limit=request.limit,
        room=pages.room(body, limits),
        scan=pages.scan_bound(limits),
    )


def agents(state: FieldState, request: PageRequest, ids: Collection[str] = ()) -> Candidates:
    """Registered agents by id after ``request.after`` (any string); only ``ids`` if given."""
    wanted = set(ids)
    order = state.agent_ids
    start = 0 if request.after is None else bisect_right(order, request.after)
    for i in range(start, len(order)):
        agent_id = order[i]
        if wanted and agent_id not in wanted:
            yield agent_id, None
        else:
            yield agent_id, state.agents[agent_id].to_wire()


def conflicts(
    state: FieldState,
    viewer: AgentRecord,
    request: PageRequest,
    *,
    statuses: Collection[str] = (),
    types: Collection[str] = (),
    involving_agents: Collection[str] = (),
) -> Candidates:
    """Conflicts ``viewer`` may see that match every non-empty filter, as detected."""
    start = state.conflict_order.start(request.after)
    if start is None:
        raise pages.unknown_after("conflict")
    status_set, type_set, agent_set = set(statuses), set(types), set(involving_agents)
    units = state.known_units
    for conflict_id in state.conflict_order.from_place(start):
        conflict = state.conflicts[conflict_id]
        matches = (
            (not status_set or conflict["status"] in status_set)
            and (not type_set or conflict["type"] in type_set)
            and (
                not agent_set
                or units[conflict["unit_a"]]["source"]["agent_id"] in agent_set
                or units[conflict["unit_b"]]["source"]["agent_id"] in agent_set
            )
            and visibility.conflict_visible(state, viewer, conflict)
        )
        yield conflict_id, conflict if matches else None


def member_sessions(state: FieldState, agent_id: str, request: PageRequest) -> Candidates:
    """The sessions ``agent_id`` is a member of or invited to, oldest first."""
    key = _key(state.sessions, request.after, "session")
    for session in sessions.listed_sessions(state, agent_id):
        if key is None or (session["created_epoch"], session["id"]) > key:
            yield session["id"], dict(session)


def own_tasks(state: FieldState, viewer: AgentRecord, request: PageRequest) -> Candidates:
    """The tasks ``viewer`` created or is assigned, that it may see, oldest first."""
    start = state.task_order.start(request.after)
    if start is None:
        raise pages.unknown_after("task")
    for task_id in state.task_order.from_place(start):
        task = state.tasks[task_id]
        mine = viewer.id in (task["created_by"], task["assignee"])
        keep = mine and visibility.task_visible(state, viewer, task)
        yield task_id, dict(task) if keep else None


def _key(items: dict[str, dict[str, Any]], after: str | None, what: str) -> tuple[int, str] | None:
    """The (created_epoch, id) a page after ``after`` follows; None: from the start."""
    if after is None:
        return None
    item = items.get(after)
    if item is None:
        raise pages.unknown_after(what)
    return item["created_epoch"], after
