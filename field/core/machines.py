"""One step of an explicit state machine, shared by the session and task tables."""

from __future__ import annotations

from typing import Any

from ..contract.errors import Code, StateError


def step(
    transitions: dict[str, dict[str, str]],
    kind: str,
    record: dict[str, Any],
    action: str,
    *,
    terminal: str,
) -> str:
    """The status of ``record`` (a ``kind``) after ``action``, per ``transitions``.

    A move the table does not allow is INVALID_TRANSITION with the allowed
    actions in ``details``; ``terminal`` says why a final status allows none.
    """
    status = record["status"]
    after = transitions[status].get(action)
    if after is None:
        allowed = list(transitions[status])
        raise StateError(
            f"{kind} {record['id']} is {status}; {action!r} is not allowed"
            + (f" (allowed: {', '.join(allowed)})" if allowed else f" ({terminal})"),
            code=Code.INVALID_TRANSITION,
            recoverable=False,
            suggested_action=f"Read the {kind}'s status and choose an allowed action.",
            details={
                f"{kind}_id": record["id"],
                "from": status,
                "action": action,
                "allowed_actions": allowed,
            },
        )
    return after
