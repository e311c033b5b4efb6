"""Sessions (Coordination Extension): the session state machine and its projection.

A session is a bounded period of coordinated work with a name, a purpose
and members. Its life is one table, :data:`TRANSITIONS` (status x action
-> status)::

    active --pause--> paused --resume--> active
    active|paused --end--> ended            (terminal)
    join / leave / invite / uninvite: active -> active, paused -> paused

A session is closed: its units are private to its members, so an agent
joins only with an invitation (``invited``: agent ids, set by ``create``
and ``invite``, withdrawn by ``uninvite``, used up by ``join``), or as
its creator, or at session-creator authority (it could invite itself).
Ending a session, and deregistering an agent, withdraw their pending
invitations, so ``invited`` only ever names registered agents.

Every change is one log entry whose ``data["session"]`` is the whole
session after the change (see :data:`ENTRY_KIND`); applying an entry
replaces the session, so the projection is the last entry of each
session. ``session.paused`` and ``session.ended`` are also events.

This module holds no handler (those are in :mod:`field.core.coordination`)
and imports the state only for type checking, so the state can import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..contract.errors import AuthError, Code, NotFound, StateError
from ..contract.model import LogEntry
from .authority import SESSION_CREATOR
from .machines import step

if TYPE_CHECKING:
    from .state import FieldState

SESSION_STATUSES: tuple[str, ...] = ("active", "paused", "ended")

#: The session state machine: status -> {action: status after}.
TRANSITIONS: dict[str, dict[str, str]] = {
    "active": {
        "invite": "active",
        "uninvite": "active",
        "join": "active",
        "leave": "active",
        "pause": "paused",
        "end": "ended",
    },
    "paused": {
        "invite": "paused",
        "uninvite": "paused",
        "join": "paused",
        "leave": "paused",
        "resume": "active",
        "end": "ended",
    },
    "ended": {},
}
#: SESSION actions: ``create`` starts a session, ``list`` reads, the rest are transitions.
ACTIONS: tuple[str, ...] = (
    "create",
    "invite",
    "uninvite",
    "join",
    "leave",
    "pause",
    "resume",
    "end",
    "list",
)
#: Actions that need effective authority 8 (the creator, the operator, a level-8 agent).
PRIVILEGED: frozenset[str] = frozenset({"invite", "uninvite", "pause", "resume", "end"})
#: The log entry kind each action writes.
ENTRY_KIND: dict[str, str] = {
    "create": "session.created",
    "invite": "session.invited",
    "uninvite": "session.uninvited",
    "join": "session.joined",
    "leave": "session.left",
    "pause": "session.paused",
    "resume": "session.resumed",
    "end": "session.ended",
}


def find(state: FieldState, session_id: str) -> dict[str, Any]:
    """The session ``session_id`` or SESSION_NOT_FOUND."""
    session = state.sessions.get(session_id)
    if session is None:
        raise NotFound(
            f"no session {session_id!r} in this Field",
            code=Code.SESSION_NOT_FOUND,
            suggested_action='Create one with SESSION "create", or list yours with "list".',
        )
    return session


def require_active_member(state: FieldState, agent_id: str, session_id: str, what: str) -> None:
    """Refuse ``what`` in ``session_id`` unless it exists, is active and has the agent."""
    session = find(state, session_id)
    if agent_id not in session["members"]:
        raise AuthError(
            f"{agent_id!r} is not a member of session {session_id!r}",
            code=Code.FORBIDDEN,
            recoverable=True,
            suggested_action="Ask its creator for an invitation and join the session "
            f'(SESSION "join") before {what}.',
        )
    if session["status"] != "active":
        raise StateError(
            f"session {session_id!r} is {session['status']}; {what} needs an active session",
            code=Code.INVALID_TRANSITION,
            recoverable=session["status"] == "paused",
            suggested_action="Wait until the session is resumed."
            if session["status"] == "paused"
            else "Work outside the ended session, or in another one.",
            details={"session_id": session_id, "status": session["status"]},
        )


def transition(session: dict[str, Any], action: str) -> str:
    """The status after ``action``, or INVALID_TRANSITION naming the allowed actions."""
    return step(TRANSITIONS, "session", session, action, terminal="it has ended")


def member_sessions(state: FieldState, agent_id: str) -> list[dict[str, Any]]:
    """The sessions ``agent_id`` belongs to, oldest first."""
    ids = state.sessions_by_member.get(agent_id, ())
    return sorted((state.sessions[i] for i in ids), key=lambda s: (s["created_epoch"], s["id"]))


def listed_sessions(state: FieldState, agent_id: str) -> list[dict[str, Any]]:
    """The sessions ``agent_id`` belongs to or is invited to, oldest first."""
    ids = state.sessions_by_member.get(agent_id, set()) | state.invitations.get(agent_id, set())
    return sorted((state.sessions[i] for i in ids), key=lambda s: (s["created_epoch"], s["id"]))


def may_join(session: dict[str, Any], agent_id: str, level: int) -> bool:
    """Whether an agent acting at ``level`` may join ``session`` (see the module doc)."""
    if agent_id in session["invited"] or agent_id == session["created_by"]:
        return True
    return level >= SESSION_CREATOR


def require_invitable(
    state: FieldState, session: dict[str, Any], action: str, invitees: list[str]
) -> None:
    """Refuse an ``invite`` (or ``create``) or ``uninvite`` naming agents it cannot.

    Invitees must be registered agents who are neither members nor invited
    yet; ``uninvite`` names agents invited and not joined.
    """
    unknown = [a for a in invitees if a not in state.agents]
    if action != "uninvite" and unknown:
        raise NotFound(
            f"invitees name {len(unknown)} agent(s) that are not registered, first {unknown[0]!r}",
            code=Code.AGENT_NOT_FOUND,
            suggested_action="Invite registered agents (GET /v1/agents).",
            details={"agent_ids": unknown},
        )
    if action == "uninvite":
        wrong = [a for a in invitees if a not in session["invited"]]
        why = "have no pending invitation"
    else:
        wrong = [a for a in invitees if a in session["members"] or a in session["invited"]]
        why = "are already members or invited"
    if wrong:
        raise StateError(
            f"invitees name {len(wrong)} agent(s) that {why}, first {wrong[0]!r}",
            code=Code.INVALID_TRANSITION,
            recoverable=False,
            suggested_action='Read the session\'s members and invited (SESSION "list").',
            details={"session_id": session["id"], "action": action, "agent_ids": wrong},
        )


def leave_all(
    state: FieldState, agent_id: str, *, reason: str, epoch: int, ts: float
) -> list[LogEntry]:
    """Entries that take ``agent_id`` out of every session it belongs to that has not ended,
    and withdraw its pending invitations."""
    entries = []
    for session in member_sessions(state, agent_id):
        if session["status"] == "ended":
            continue
        left = {
            **session,
            "members": [m for m in session["members"] if m != agent_id],
            "updated_epoch": epoch,
        }
        data = {"session": left, "agent_id": agent_id, "reason": reason}
        entries.append(LogEntry(epoch, "session.left", data, agent_id, ts))
    for session_id in sorted(state.invitations.get(agent_id, ())):
        session = state.sessions[session_id]
        withdrawn = {
            **session,
            "invited": [a for a in session["invited"] if a != agent_id],
            "updated_epoch": epoch,
        }
        data = {"session": withdrawn, "agent_ids": [agent_id], "reason": reason}
        entries.append(LogEntry(epoch, "session.uninvited", data, agent_id, ts))
    return entries


# -- the projection ------------------------------------------------------------


def apply_session(state: FieldState, data: dict[str, Any]) -> None:
    """Any session entry: the session as it is after the change replaces the old one."""
    session = {
        **data["session"],
        "members": list(data["session"]["members"]),
        "invited": list(data["session"].get("invited", ())),  # none in logs from before
    }
    session.setdefault("visibility", {})
    session_id = session["id"]
    old = state.sessions.get(session_id)
    before = set(old["members"]) if old is not None else set()
    after = set(session["members"])
    state.membership.update(session_id, before, after, state.applied_position)
    _reindex(state.sessions_by_member, session_id, before, after)
    was_invited = set(old["invited"]) if old is not None else set()
    _reindex(state.invitations, session_id, was_invited, set(session["invited"]))
    state.sessions[session_id] = session


def _reindex(
    index: dict[str, set[str]], session_id: str, before: set[str], after: set[str]
) -> None:
    """Move ``session_id`` in an agent -> sessions index from ``before``'s agents to ``after``'s."""
    for agent_id in before - after:
        index[agent_id].discard(session_id)
    for agent_id in after - before:
        index.setdefault(agent_id, set()).add(session_id)
