"""Authority levels of spec 11.2 and the one check privileged operations make.

An agent's authority is a number: the higher, the more it may do. Every
agent registers at :data:`STANDARD`; the operator (the holder of the
operator token from configuration) acts at :data:`OPERATOR`; an agent
that creates a session acts at :data:`SESSION_CREATOR` within it. A
privileged operation calls :func:`require` with the level it needs, so
the whole policy reads as one table of ``require`` calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import AuthError, Code

if TYPE_CHECKING:
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


#: The least authority each operation needs at all (spec 11.2); handlers
#: check the finer rules (whose task, which session, which strategy).
MIN_AUTHORITY: dict[str, int] = {
    "DEREGISTER": AUDIT,
    "REPLAY": AUDIT,
    "ATTUNE": OBSERVER,
    "DETECT": OBSERVER,
    "SUBSCRIBE": OBSERVER,
    "SESSION": OBSERVER,
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
