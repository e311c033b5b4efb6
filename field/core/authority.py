"""Authority levels of spec 11.2 and the one check privileged operations make.

An agent's authority is a number: the higher, the more it may do. Every
agent registers at :data:`STANDARD`; the operator (the holder of the
operator token from configuration) acts at :data:`OPERATOR`; an agent
that creates a session acts at :data:`SESSION_CREATOR` within it. A
privileged operation calls :func:`require` with the level it needs, so
the whole policy reads as one table of ``require`` calls.

Taking a unit out of everyone's ATTUNE (superseding it by RECORD or
MERGE, or COMPACT) is the other rule, :func:`may_supersede`: an agent may
do it to its own units, and to another agent's only at (at least) the
author's own level when it recorded the unit, so an operator's directive
yields only to the operator. The author's level is its registered one: a
session creator moderates its session at 8, but creating a session does
not make its own units weigh more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..contract.errors import AuthError, Code

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .state import AgentRecord, FieldState

#: The agent id the operator sends its envelopes under; no agent may register it.
OPERATOR_ID = "operator"

OPERATOR = 10  #: override any decision, resolve any conflict (escalations too)
SESSION_CREATOR = 8  #: cancel tasks, pause and end sessions, set policies
SENIOR = 6  #: merge conflicts, create tasks for other agents
STANDARD = 4  #: record, attune, coordinate its own tasks
OBSERVER = 2  #: attune (read only), subscribe
AUDIT = 0  #: replay (read history only)

LEVEL_NAMES: dict[int, str] = {
    OPERATOR: "human operator",
    SESSION_CREATOR: "session creator",
    SENIOR: "senior agent",
    STANDARD: "standard agent",
    OBSERVER: "observer agent",
    AUDIT: "audit agent",
}


def require(have: int, need: int, action: str) -> None:
    """Refuse ``action`` with INSUFFICIENT_AUTHORITY unless ``have >= need``."""
    if have < need:
        raise AuthError(
            f"{action} needs authority {need} ({LEVEL_NAMES.get(need, 'custom')}); "
            f"the agent has {have}",
            code=Code.INSUFFICIENT_AUTHORITY,
            recoverable=False,
            suggested_action="Ask an agent or operator with enough authority to do it.",
        )


#: What a caller of the operator's own endpoints is told to send instead.
SEND_OPERATOR_TOKEN = "Send the operator's bearer token (--operator-token-file)."


def require_operator(
    agent: AgentRecord, message: str, suggested_action: str = SEND_OPERATOR_TOKEN
) -> None:
    """Refuse anyone but the operator itself (not a level: its token) with
    INSUFFICIENT_AUTHORITY and ``message``: the check of the operator's own endpoints
    (registration tokens, sources, declaring an agent failed, the log's events)."""
    if agent.id != OPERATOR_ID:
        raise AuthError(
            message,
            code=Code.INSUFFICIENT_AUTHORITY,
            recoverable=False,
            suggested_action=suggested_action,
        )


#: The least authority each operation needs at all (spec 11.2); handlers
#: check the finer rules (whose task, which session, which strategy).
MIN_AUTHORITY: dict[str, int] = {
    "DEREGISTER": AUDIT,
    "REPLAY": AUDIT,
    "ATTUNE": OBSERVER,
    "DETECT": OBSERVER,
    "SUBSCRIBE": OBSERVER,
    "SESSION": OBSERVER,
    "FEEDBACK": OBSERVER,
    "RECORD": STANDARD,
    "MERGE": STANDARD,
    "COORDINATE": STANDARD,
    "HANDOFF": STANDARD,
    "COMPACT": SENIOR,
}


def effective_authority(state: FieldState, agent: AgentRecord, session_id: str | None) -> int:
    """The level ``agent`` acts at within session ``session_id`` (None: outside any).

    The creator of a session acts at :data:`SESSION_CREATOR` within it while
    it is a member (leaving, or deregistering, gives that up); everyone else
    at its own level.
    """
    level = agent.authority
    if session_id is not None:
        session = state.sessions.get(session_id)
        if (
            session is not None
            and session["created_by"] == agent.id
            and agent.id in session["members"]
        ):
            level = max(level, SESSION_CREATOR)
    return level


def may_supersede(state: FieldState, agent: AgentRecord, unit: Mapping[str, Any]) -> bool:
    """Whether ``agent`` may take ``unit`` out of ATTUNE (supersede, archive, purge).

    Its own units always; another agent's when its effective authority in
    the unit's session is at least the author's level when it recorded the
    unit (:meth:`FieldState.authority_of`).
    """
    if unit["source"]["agent_id"] == agent.id:
        return True
    level = effective_authority(state, agent, unit["source"].get("session_id"))
    return level >= state.authority_of(unit["id"])


def require_supersede(
    state: FieldState, agent: AgentRecord, unit: Mapping[str, Any], action: str
) -> None:
    """Refuse ``action`` on ``unit`` with INSUFFICIENT_AUTHORITY unless :func:`may_supersede`."""
    if may_supersede(state, agent, unit):
        return
    need = state.authority_of(unit["id"])
    have = effective_authority(state, agent, unit["source"].get("session_id"))
    raise AuthError(
        f"{action} unit {unit['id']} of agent {unit['source']['agent_id']!r} needs authority "
        f"{need} ({LEVEL_NAMES.get(need, 'custom')}), its author's level; "
        f"the agent has {have}",
        code=Code.INSUFFICIENT_AUTHORITY,
        recoverable=False,
        suggested_action="Record a unit that contradicts it instead (a conflict that an "
        "agent with enough authority resolves), or ask that agent or the operator.",
    )
