"""FEEDBACK (extension): an agent says which units were useful to it, and its relevance learns.

An agent judges units it was pushed or attuned to: ``{"items": [{"memory_unit_id",
"useful"}]}``, 1 to 64 per call (a unit given twice counts once, as last judged). The
Field logs the judgements (``agent.feedback``) and keeps, per agent, what the learning
needs (:class:`~field.ranking.learning.Judged`, bounded whatever the agent judges): the
latest units of each kind and the sums of all their embeddings.

What it learns (:mod:`field.ranking.learning`) joins the agent's interests: the units judged
useful are compared with each unit as interests are, those judged not useful pull closer
units down, and the joined interests move towards the first. Pushes and ATTUNE score with
the same rows (at each FEEDBACK the subscription registry gives the agent's subscriptions
a profile that learned it), from the log alone, so a replay learns the same.
Deregistering forgets what an agent taught.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..contract.errors import Code, NotFound
from ..contract.model import LogEntry
from . import validation, visibility
from .context import Context, Outcome

if TYPE_CHECKING:
    from .field import Field


def feedback(field: Field, ctx: Context) -> Outcome:
    """FEEDBACK: log the caller's judgements of units it may see."""
    items = validation.feedback_payload(ctx.envelope.payload, field.limits)
    assert ctx.agent is not None  # guaranteed by handle(): FEEDBACK is authenticated
    state, agent = field.state, ctx.agent
    for unit_id, _ in items:
        unit = state.units.get(unit_id)
        if (
            unit is None
            or unit["status"] == "purged"
            or not visibility.unit_visible(state, agent, unit)
        ):
            raise NotFound(
                f"no memory unit {unit_id!r} in this Field",
                code=Code.UNIT_NOT_FOUND,
                suggested_action="Judge units the Field pushed or returned to you.",
            )
    data = {"agent_id": agent.id, "items": [[unit_id, useful] for unit_id, useful in items]}
    known = state.feedback.get(agent.id)
    useful = sum(useful for _, useful in items)
    response = {
        "status": "ok",
        "judged": len(items),
        "useful_total": useful + (0 if known is None else known.useful_count),
        "not_useful_total": len(items) - useful + (0 if known is None else known.not_useful_count),
        "epoch": ctx.epoch,
    }
    return Outcome(response, [LogEntry(ctx.epoch, "agent.feedback", data, agent.id, ctx.now)])
