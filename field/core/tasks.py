"""Tasks (Coordination Extension): the task state machine and its projection.

A task is created ``pending`` (no assignee) or ``assigned``; from there it
moves by the actions of one table, :data:`TRANSITIONS` (status x action
-> status)::

    pending     --assign--> assigned                 --cancel--> cancelled
    assigned    --assign--> assigned (reassigned)    --start--> in_progress
    in_progress --block--> blocked --unblock--> in_progress
    in_progress --complete--> completed | --fail--> failed
    assigned|in_progress|blocked --release--> pending (assignee cleared)
    in_progress|blocked --assign--> assigned (the new assignee starts again)
    blocked --fail--> failed;   any open status --cancel--> cancelled

``completed``, ``failed`` and ``cancelled`` are terminal. Every change is
one or more log entries whose ``data["task"]`` is the whole task after
the change; applying one replaces the task, so replay rebuilds exactly
the tasks that were acknowledged:

=================== ===========================================================
``task.created``    ``{task}``; notified as ``task.state_changed`` (from null)
``task.assigned``   ``{task, previous_assignee, reason}``: the assignee changed
``task.state_changed`` ``{task, from, action, reason, previous_assignee}``
``task.completed``  ``{task, dependents}``: after the ``task.state_changed``
=================== ===========================================================

``dependents`` lists ``{task_id, assignee, ready}`` for the tasks that
depend on the completed one (``ready``: all their dependencies are now
completed), so the event names whom it concerns without reading state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..contract.errors import Code, NotFound
from ..contract.model import LogEntry
from .machines import step

if TYPE_CHECKING:
    from .state import FieldState

TASK_STATUSES: tuple[str, ...] = (
    "pending",
    "assigned",
    "in_progress",
    "blocked",
    "completed",
    "failed",
    "cancelled",
)
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

#: The task state machine: status -> {action: status after}.
TRANSITIONS: dict[str, dict[str, str]] = {
    "pending": {"assign": "assigned", "cancel": "cancelled"},
    "assigned": {
        "assign": "assigned",
        "start": "in_progress",
        "release": "pending",
        "cancel": "cancelled",
    },
    "in_progress": {
        "assign": "assigned",
        "block": "blocked",
        "complete": "completed",
        "fail": "failed",
        "release": "pending",
        "cancel": "cancelled",
    },
    "blocked": {
        "assign": "assigned",
        "unblock": "in_progress",
        "fail": "failed",
        "release": "pending",
        "cancel": "cancelled",
    },
    "completed": {},
    "failed": {},
    "cancelled": {},
}
#: Every transition action (the COORDINATE actions besides create and list).
TRANSITION_ACTIONS: tuple[str, ...] = (
    "assign",
    "start",
    "block",
    "unblock",
    "complete",
    "fail",
    "release",
    "cancel",
)
ACTIONS: tuple[str, ...] = ("create", *TRANSITION_ACTIONS, "list")
#: Actions only the assignee may take (unless its effective authority is 8 or more).
ASSIGNEE_ACTIONS: frozenset[str] = frozenset(
    {"start", "block", "unblock", "complete", "fail", "release"}
)
PRIORITIES: tuple[str, ...] = ("low", "normal", "high", "critical")


def find(state: FieldState, task_id: str) -> dict[str, Any]:
    task = state.tasks.get(task_id)
    if task is None:
        raise NotFound(
            f"no task {task_id!r} in this Field",
            code=Code.TASK_NOT_FOUND,
            suggested_action='List your tasks with COORDINATE "list".',
        )
    return task


def transition(task: dict[str, Any], action: str) -> str:
    """The status after ``action``, or INVALID_TRANSITION naming the allowed actions."""
    return step(TRANSITIONS, "task", task, action, terminal="it is finished")


def unfinished_dependencies(state: FieldState, task: dict[str, Any]) -> list[str]:
    return [d for d in task["depends_on"] if state.tasks[d]["status"] != "completed"]


def open_tasks(state: FieldState, agent_id: str) -> list[dict[str, Any]]:
    """The tasks assigned to ``agent_id`` that have not finished, oldest first."""
    ids = state.open_tasks_by_agent.get(agent_id, ())
    return sorted((state.tasks[i] for i in ids), key=lambda t: (t["created_epoch"], t["id"]))


def release_tasks(
    state: FieldState, agent_id: str, *, reason: str, epoch: int, actor: str, ts: float
) -> list[LogEntry]:
    """Entries that return every open task of ``agent_id`` to ``pending``, with ``reason``.

    For an agent that leaves or fails: its work goes back to the pool.
    """
    entries = []
    for task in open_tasks(state, agent_id):
        status = transition(task, "release")
        released = {**task, "status": status, "assignee": None, "reason": reason}
        released["updated_epoch"] = epoch
        data = {
            "task": released,
            "from": task["status"],
            "action": "release",
            "reason": reason,
            "previous_assignee": agent_id,
        }
        entries.append(LogEntry(epoch, "task.state_changed", data, actor, ts))
    return entries


# -- the projection ------------------------------------------------------------


def _is_open(task: dict[str, Any] | None) -> bool:
    return task is not None and task["assignee"] is not None and task["status"] not in TERMINAL


def apply_task(state: FieldState, data: dict[str, Any]) -> None:
    """Any task entry: the task as it is after the change replaces the old one."""
    task = {**data["task"], "depends_on": list(data["task"]["depends_on"])}
    task_id = task["id"]
    old = state.tasks.get(task_id)
    if old is None:
        state.task_order.add(task_id)
        for dependency in task["depends_on"]:
            state.dependent_tasks.setdefault(dependency, []).append(task_id)
    elif _is_open(old):
        state.open_tasks_by_agent[old["assignee"]].discard(task_id)
    if _is_open(task):
        state.open_tasks_by_agent.setdefault(task["assignee"], set()).add(task_id)
    state.tasks[task_id] = task
    for agent_id in {old["assignee"] if old else None, task["assignee"]} - {None}:
        _refresh_status(state, agent_id)


def _refresh_status(state: FieldState, agent_id: str) -> None:
    """An agent is ``working`` while it has a task in progress, else ``idle``.

    Other statuses (offline, failed, waiting) belong to other mechanisms and
    are left alone.
    """
    agent = state.agents.get(agent_id)
    if agent is None or agent.status not in ("idle", "working"):
        return
    working = any(
        state.tasks[t]["status"] == "in_progress"
        for t in state.open_tasks_by_agent.get(agent_id, ())
    )
    agent.status = "working" if working else "idle"
