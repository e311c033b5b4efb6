"""SESSION, COORDINATE and HANDOFF: the operations of the Coordination Extension.

Each handler takes the :class:`~field.core.field.Field` and the request's
:class:`~field.core.context.Context`, reads the state, checks authority
(spec 11.2, through :func:`~field.core.authority.require` and
:func:`~field.core.authority.effective_authority`) and the state machines
of :mod:`field.core.sessions` and :mod:`field.core.tasks`, and returns an
:class:`~field.core.context.Outcome` whose log entries record the change.
Like every handler, they raise before building anything on bad input, so
a refused request changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..contract.errors import AuthError, Code, InvalidPayload, NotFound, StateError
from ..contract.model import UNRESOLVED_CONFLICT_STATUSES, LogEntry
from ..ranking import relevance
from ..subscriptions.events import handoff_wire
from . import listing, sessions, tasks, validation, visibility
from .authority import (
    SENIOR,
    SESSION_CREATOR,
    STANDARD,
    effective_authority,
    require,
)
from .context import Context, Outcome
from .state import AgentRecord, FieldState

if TYPE_CHECKING:
    from .field import Field


def _caller(ctx: Context) -> AgentRecord:
    if ctx.agent is None:  # handle() authenticates every operation but REGISTER
        raise AuthError("this operation needs an authenticated agent")
    return ctx.agent


# -- SESSION -------------------------------------------------------------------


def session(field: Field, ctx: Context) -> Outcome:
    """SESSION: create, invite, uninvite, join, leave, pause, resume, end or list sessions."""
    request = validation.session_payload(ctx.envelope.payload, field.limits, sessions.ACTIONS)
    agent = _caller(ctx)
    state = field.state
    action = request["action"]
    if action == "list":
        body: dict[str, Any] = {"status": "ok", "sessions": [], "next": None, "epoch": ctx.epoch}
        candidates = listing.member_sessions(state, agent.id, request["page"])
        page = listing.page_of(state, body, candidates, request["page"])
        body["sessions"], body["next"] = page.items, page.next
        return Outcome(body)
    if action == "create":
        return _create_session(field, ctx, agent, request)
    current = sessions.find(state, request["session_id"])
    level = effective_authority(state, agent, current["id"])
    if action in sessions.PRIVILEGED:
        require(level, SESSION_CREATOR, f"{action} of a session")
    status = sessions.transition(current, action)
    changed = {**current, "status": status, "updated_epoch": ctx.epoch}
    data: dict[str, Any] = {"reason": request["reason"]}
    if action in ("invite", "uninvite"):
        sessions.require_invitable(state, current, action, request["invitees"])
        gone = set(request["invitees"]) if action == "uninvite" else set()
        kept = [a for a in current["invited"] if a not in gone]
        changed["invited"] = kept + (request["invitees"] if action == "invite" else [])
        data["agent_ids"] = request["invitees"]
    elif action == "join":
        if agent.id in current["members"]:
            raise _already(f"{agent.id!r} is already a member of session {current['id']}")
        if not sessions.may_join(current, agent.id, level):
            raise AuthError(
                f"{agent.id!r} has no invitation to session {current['id']}",
                code=Code.FORBIDDEN,
                recoverable=True,
                suggested_action="Ask the session's creator to invite you "
                '(SESSION "invite"), then join.',
            )
        # the creator comes first whenever it is a member (back after leaving, too)
        creator = agent.id == current["created_by"]
        changed["members"] = (
            [agent.id, *current["members"]] if creator else [*current["members"], agent.id]
        )
        changed["invited"] = [a for a in current["invited"] if a != agent.id]  # used up
        data["agent_id"] = agent.id
    elif action == "leave":
        if agent.id not in current["members"]:
            raise _already(f"{agent.id!r} is not a member of session {current['id']}")
        changed["members"] = [m for m in current["members"] if m != agent.id]
        data["agent_id"] = agent.id
    elif action == "end":
        changed["invited"] = []  # no one joins an ended session
    data["session"] = changed
    entry = LogEntry(ctx.epoch, sessions.ENTRY_KIND[action], data, agent.id, ctx.now)
    return Outcome({"status": "ok", "session": changed, "epoch": ctx.epoch}, [entry])


def _create_session(
    field: Field, ctx: Context, agent: AgentRecord, request: dict[str, Any]
) -> Outcome:
    """SESSION ``create``: the caller is the first member, ``invitees`` are invited at once."""
    require(agent.authority, STANDARD, "creating a session")
    created = {
        "id": field.new_id("session"),
        "name": request["name"],
        "purpose": request["purpose"],
        "status": "active",
        "created_by": agent.id,
        "members": [agent.id],
        "invited": [],
        "created_epoch": ctx.epoch,
        "updated_epoch": ctx.epoch,
        "visibility": request["visibility"],
    }
    sessions.require_invitable(field.state, created, "create", request["invitees"])
    created["invited"] = request["invitees"]
    entry = LogEntry(ctx.epoch, "session.created", {"session": created}, agent.id, ctx.now)
    return Outcome({"status": "ok", "session": created, "epoch": ctx.epoch}, [entry])


def _already(message: str) -> StateError:
    return StateError(
        message,
        code=Code.INVALID_TRANSITION,
        recoverable=False,
        suggested_action='List your sessions with SESSION "list".',
    )


# -- COORDINATE ------------------------------------------------------------------


def coordinate(field: Field, ctx: Context) -> Outcome:
    """COORDINATE: create a task, move it through its state machine, or list tasks."""
    request = validation.coordinate_payload(
        ctx.envelope.payload, field.limits, tasks.ACTIONS, tasks.PRIORITIES
    )
    agent = _caller(ctx)
    state = field.state
    action = request["action"]
    if action == "list":
        body: dict[str, Any] = {"status": "ok", "tasks": [], "next": None, "epoch": ctx.epoch}
        candidates = listing.own_tasks(state, agent, request["page"])
        page = listing.page_of(state, body, candidates, request["page"])
        body["tasks"], body["next"] = page.items, page.next
        return Outcome(body)
    if action == "create":
        return _create(field, ctx, agent, request)
    task = _visible_task(state, agent, request["task_id"])
    if action != "cancel":
        _require_session_active(state, task, action)
    level = effective_authority(state, agent, task["session_id"])
    if action == "cancel":
        require(level, SESSION_CREATOR, "cancelling a task")
    elif action == "assign":
        require(level, STANDARD, "assigning a task")
        if request["assignee"] != agent.id:
            require(level, SENIOR, "assigning a task to another agent")
        elif task["assignee"] not in (None, agent.id):
            require(level, SENIOR, "taking over another agent's task")
    elif task["assignee"] != agent.id and level < SESSION_CREATOR:
        raise _not_assignee(task, action, SESSION_CREATOR)
    status = tasks.transition(task, action)
    changed = {
        **task,
        "status": status,
        "reason": request["reason"],
        "updated_epoch": ctx.epoch,
    }
    if action == "assign":
        return _assign(state, ctx, agent, task, changed, request["assignee"])
    if action == "start":
        waiting = tasks.unfinished_dependencies(state, task)
        if waiting:
            raise StateError(
                f"task {task['id']} depends on unfinished tasks: {', '.join(waiting)}",
                code=Code.INVALID_TRANSITION,
                recoverable=True,
                suggested_action="Start it once its dependencies are completed.",
                details={
                    "task_id": task["id"],
                    "from": task["status"],
                    "action": action,
                    "unfinished_dependencies": waiting,
                },
            )
    if action == "release":
        changed["assignee"] = None
    if action == "complete":
        changed["result"] = request["result"]
    data = {"task": changed, "from": task["status"], "action": action, "reason": request["reason"]}
    if action == "release":
        data["previous_assignee"] = task["assignee"]
    entries = [LogEntry(ctx.epoch, "task.state_changed", data, agent.id, ctx.now)]
    if action == "complete":
        done = {"task": changed, "dependents": _dependents(state, task["id"])}
        entries.append(LogEntry(ctx.epoch, "task.completed", done, agent.id, ctx.now))
    return Outcome({"status": "ok", "task": changed, "epoch": ctx.epoch}, entries)


def _create(field: Field, ctx: Context, agent: AgentRecord, request: dict[str, Any]) -> Outcome:
    state = field.state
    session_id = ctx.envelope.session_id
    if session_id is not None:
        sessions.require_active_member(state, agent.id, session_id, "creating a task")
    level = effective_authority(state, agent, session_id)
    require(level, STANDARD, "creating a task")
    assignee = request["assignee"]
    if assignee is not None:
        if assignee != agent.id:
            require(level, SENIOR, "creating a task for another agent")
        _require_assignable(state, assignee, session_id)
    missing = [d for d in request["depends_on"] if d not in state.tasks]
    if missing:
        raise NotFound(
            f"depends_on names unknown tasks: {', '.join(missing)}",
            code=Code.TASK_NOT_FOUND,
            suggested_action="Depend only on tasks the Field returned.",
            details={"missing_tasks": missing},
        )
    task = {
        "id": field.new_id("task"),
        "title": request["title"],
        "description": request["description"],
        "status": "pending" if assignee is None else "assigned",
        "created_by": agent.id,
        "assignee": assignee,
        "session_id": session_id,
        "depends_on": request["depends_on"],
        "priority": request["priority"],
        "result": None,
        "reason": request["reason"],
        "created_epoch": ctx.epoch,
        "updated_epoch": ctx.epoch,
    }
    entries = [LogEntry(ctx.epoch, "task.created", {"task": task}, agent.id, ctx.now)]
    if assignee is not None:
        data = {"task": task, "previous_assignee": None, "reason": request["reason"]}
        entries.append(LogEntry(ctx.epoch, "task.assigned", data, agent.id, ctx.now))
    return Outcome({"status": "ok", "task": task, "epoch": ctx.epoch}, entries)


def _assign(
    state: FieldState,
    ctx: Context,
    agent: AgentRecord,
    task: dict[str, Any],
    changed: dict[str, Any],
    assignee: str,
) -> Outcome:
    _require_assignable(state, assignee, task["session_id"])
    if assignee == task["assignee"]:
        raise StateError(
            f"task {task['id']} is already assigned to {assignee!r}",
            code=Code.INVALID_TRANSITION,
            recoverable=False,
            suggested_action="Assign it to another agent, or leave it.",
        )
    changed["assignee"] = assignee
    entries = _reassignment(ctx, agent.id, task, changed, "assign")
    return Outcome({"status": "ok", "task": changed, "epoch": ctx.epoch}, entries)


def _reassignment(
    ctx: Context, actor: str, task: dict[str, Any], changed: dict[str, Any], action: str
) -> list[LogEntry]:
    """``task.state_changed`` (when the status moves) then ``task.assigned``.

    ``task.assigned`` comes last: a debounce window that folds the task's
    events keeps the one that asks the new assignee to act.
    """
    entries = []
    reason = changed["reason"]
    previous = task["assignee"]
    if changed["status"] != task["status"]:
        data = {
            "task": changed,
            "from": task["status"],
            "action": action,
            "reason": reason,
            "previous_assignee": previous,
        }
        entries.append(LogEntry(ctx.epoch, "task.state_changed", data, actor, ctx.now))
    data = {"task": changed, "previous_assignee": previous, "reason": reason}
    entries.append(LogEntry(ctx.epoch, "task.assigned", data, actor, ctx.now))
    return entries


def _require_session_active(state: FieldState, task: dict[str, Any], action: str) -> None:
    """Work on a task of a session happens while the session is active."""
    if task["session_id"] is None:
        return
    current = sessions.find(state, task["session_id"])
    if current["status"] != "active":
        raise StateError(
            f"task {task['id']} belongs to session {current['id']}, which is "
            f"{current['status']}; {action} needs an active session",
            code=Code.INVALID_TRANSITION,
            recoverable=current["status"] == "paused",
            suggested_action="Wait until the session is resumed."
            if current["status"] == "paused"
            else "Only cancel is possible in an ended session.",
            details={"session_id": current["id"], "status": current["status"]},
        )


def _require_assignable(state: FieldState, agent_id: str, session_id: str | None) -> None:
    if agent_id not in state.agents:
        raise NotFound(
            f"no registered agent {agent_id!r} to take the task",
            code=Code.AGENT_NOT_FOUND,
            suggested_action="Assign tasks to registered agents (GET /v1/agents).",
        )
    if session_id is not None and agent_id not in state.sessions[session_id]["members"]:
        raise AuthError(
            f"{agent_id!r} is not a member of session {session_id!r}, which the task belongs to",
            code=Code.FORBIDDEN,
            recoverable=True,
            suggested_action="Invite the agent to the session; it can join then.",
        )


def _not_assignee(task: dict[str, Any], action: str, override: int) -> AuthError:
    return AuthError(
        f"only the assignee of task {task['id']} ({task['assignee']!r}) may {action} it, "
        f"or an agent with authority {override} in its session",
        code=Code.FORBIDDEN,
        recoverable=False,
        suggested_action="Ask the assignee, or an agent with enough authority.",
    )


def _dependents(state: FieldState, task_id: str) -> list[dict[str, Any]]:
    """The open tasks that depend on ``task_id``; ``ready`` once it completes."""
    out = []
    for dependent_id in state.dependent_tasks.get(task_id, ()):
        dependent = state.tasks[dependent_id]
        if dependent["status"] in tasks.TERMINAL:
            continue
        ready = all(
            d == task_id or state.tasks[d]["status"] == "completed" for d in dependent["depends_on"]
        )
        out.append({"task_id": dependent_id, "assignee": dependent["assignee"], "ready": ready})
    return out


# -- HANDOFF -----------------------------------------------------------------------


def handoff(field: Field, ctx: Context) -> Outcome:
    """HANDOFF: reassign a task to another agent with the context it needs."""
    request = validation.handoff_payload(ctx.envelope.payload, field.limits)
    agent = _caller(ctx)
    state = field.state
    task = _visible_task(state, agent, request["task_id"])
    _require_session_active(state, task, "a handoff")
    level = effective_authority(state, agent, task["session_id"])
    if task["assignee"] != agent.id and level < SENIOR:
        raise _not_assignee(task, "hand off", SENIOR)
    target = request["to_agent_id"]
    if target == agent.id:
        raise InvalidPayload("to_agent_id is the sender: a handoff goes to another agent")
    _require_assignable(state, target, task["session_id"])
    if target == task["assignee"]:
        raise StateError(
            f"task {task['id']} is already assigned to {target!r}",
            code=Code.INVALID_TRANSITION,
            recoverable=False,
            suggested_action="Hand it off to another agent.",
        )
    status = tasks.transition(task, "assign")
    missing = [
        u
        for u in request["include_units"]
        if u not in state.units or not visibility.unit_visible(state, agent, state.units[u])
    ]
    if missing:
        raise NotFound(
            f"context.include_units names unknown units: {', '.join(missing)}",
            code=Code.UNIT_NOT_FOUND,
            suggested_action="Include only units the Field returned.",
        )
    receiver = state.agents[target]
    hidden = [
        u
        for u in request["include_units"]
        if not visibility.unit_visible(state, receiver, state.units[u])
    ]
    if hidden:
        raise AuthError(
            f"{target!r} may not see {', '.join(hidden)} (session visibility, spec 11.3)",
            code=Code.FORBIDDEN,
            recoverable=True,
            suggested_action="Leave those units out of context.include_units.",
        )
    reason = f"handoff from {agent.id}"
    changed = {
        **task,
        "status": status,
        "assignee": target,
        "reason": reason,
        "updated_epoch": ctx.epoch,
    }
    units = _package(state, task, agent.id, target, request)
    record = {
        "id": field.new_id("handoff"),
        "task_id": task["id"],
        "from_agent_id": agent.id,
        "to_agent_id": target,
        "notes": request["notes"],
        "units": units,
        "conflicts": _conflicts_of(
            state, [u["memory_unit_id"] for u in units], (agent, state.agents[target])
        ),
        "epoch": ctx.epoch,
    }
    entries = _reassignment(ctx, agent.id, task, changed, "assign")
    data = {"task_id": task["id"], "handoff": record, "task": changed}
    entries.append(LogEntry(ctx.epoch, "handoff.incoming", data, agent.id, ctx.now))
    response = {
        "status": "ok",
        "handoff": handoff_wire(record, state.units),
        "task": changed,
        "epoch": ctx.epoch,
    }
    return Outcome(response, entries)


def _visible_task(state: FieldState, agent: AgentRecord, task_id: str) -> dict[str, Any]:
    """The task ``task_id`` if ``agent`` may see it, else TASK_NOT_FOUND."""
    task = tasks.find(state, task_id)
    if not visibility.task_visible(state, agent, task):  # as if unknown: no trace
        raise NotFound(
            f"no task {task_id!r} in this Field",
            code=Code.TASK_NOT_FOUND,
            suggested_action='List your tasks with COORDINATE "list".',
        )
    return task


def _package(
    state: FieldState, task: dict[str, Any], sender: str, target: str, request: dict[str, Any]
) -> list[dict[str, Any]]:
    """The units of a handoff, each with its score and reason for the target.

    First the units the sender included, then the units recorded for the
    task (newest first), then the target's best units by ATTUNE relevance
    with the task as its active task and the title as context hint, up to
    ``max_units`` in all besides the included ones.
    """
    index = state.index
    agent = state.agents[target]
    query = relevance.Query(
        agent_id=target,
        role=agent.role,
        interests=agent.interests,
        context_hint=task["title"],
        task_id=task["id"],
        recency_weight=0.25,
        include_own=False,
        since_epoch=None,
    )
    included = [index.rows[u] for u in request["include_units"]]
    picked: dict[int, str] = dict.fromkeys(included, f"included by {sender}")
    room = max(0, request["max_units"] - len(included))
    everyone = relevance.Query(
        agent_id=target,
        role=agent.role,
        interests=[],
        context_hint=None,
        task_id=None,
        recency_weight=0.0,
        include_own=True,
        since_epoch=None,
    )
    # the package goes to the target and back to the sender: both must see it all
    seen_by_target = visibility.both(
        visibility.row_mask(state, agent), visibility.row_mask(state, state.principal(sender))
    )
    visible = relevance.candidates(index, everyone, seen_by_target)
    for row in visible[index.task.view[visible] == index.tasks.find(task["id"])][::-1].tolist():
        if room == 0:
            break
        if row not in picked:
            picked[row] = f"recorded for {task['id']}"
            room -= 1
    if room:
        rows = relevance.candidates(index, query, seen_by_target)
        rows = rows[~np.isin(rows, np.array(list(picked), dtype=np.intp))]
        # ATTUNE's ranking: the same best rows, scoring only those that can be among them
        ranking = relevance.Ranking(index, query, rows, count=room, threshold=0.0)
        for _ in ranking.steps():
            pass
        for row in rows[ranking.positions].tolist():
            picked[row] = "best for you"
    chosen = np.array(list(picked), dtype=np.intp)
    chosen_scores = relevance.score(index, query, chosen).tolist()
    units = []
    for (row, why), row_score in zip(picked.items(), chosen_scores, strict=True):
        unit = state.units[index.ids[row]]
        units.append(
            {
                "memory_unit_id": unit["id"],
                "status": unit["status"],
                "relevance_score": round(row_score, 6),
                "relevance_reason": f"{why}: {relevance.explain(index, query, unit, row_score)}",
            }
        )
    return units


def _conflicts_of(
    state: FieldState, unit_ids: list[str], viewers: tuple[AgentRecord, ...]
) -> list[dict[str, Any]]:
    """The unresolved conflicts involving any of ``unit_ids`` that all ``viewers`` may see."""
    wanted = set(unit_ids)
    return [
        dict(c)
        for c in state.conflicts.values()
        if c["status"] in UNRESOLVED_CONFLICT_STATUSES
        and {c["unit_a"], c["unit_b"]} & wanted
        and all(visibility.conflict_visible(state, viewer, c) for viewer in viewers)
    ]
