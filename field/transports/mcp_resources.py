"""The resources of an MCP session over HTTP: the Field's entities by URI.

URIs (protocol/README.md, "MCP over HTTP"):

==============================  =============================================
``field://agent``               the session's agent, as ``GET /v1/agents``
``field://units/{id}``          a memory unit the agent may see
``field://conflicts/{id}``      a conflict the agent may see
``field://tasks/{id}``          a task the agent may see
==============================  =============================================

They are read from the state in the writer, like the GET lists.
"""

from __future__ import annotations

import logging
from typing import Any

from ..core import visibility
from ..core.context import Outcome
from ..core.field import Field
from ..core.state import AgentRecord
from ..errors import Code, InvalidPayload, NotFound

logger = logging.getLogger("field.mcp")

SCHEME = "field://"
AGENT_URI = "field://agent"
#: The kinds of ``field://<kind>/{id}`` and what each holds.
TEMPLATES = {
    "units": "A memory unit (full form).",
    "conflicts": "A conflict.",
    "tasks": "A task.",
}
#: Longest id in a resource URI.
MAX_ID_CHARS = 256


def parse_uri(uri: str) -> tuple[str, str | None]:
    """``(kind, id)`` of a resource URI (``("agent", None)`` for the agent), or the error
    that says it names no resource of the Field."""
    if uri == AGENT_URI:
        return "agent", None
    rest = uri[len(SCHEME) :] if uri.startswith(SCHEME) else None
    kind, _, ident = (rest or "").partition("/")
    if rest is None or kind not in TEMPLATES:
        raise NotFound(
            f"no resource at {_shown(uri)}",
            suggested_action="The Field's resources are field://agent and field://units/{id}, "
            "field://conflicts/{id}, field://tasks/{id}.",
        )
    if not ident or "/" in ident or len(ident) > MAX_ID_CHARS:
        raise InvalidPayload(
            f"{_shown(uri)} does not name one {kind[:-1]}: field://{kind}/{{id}}, the id one "
            f"segment of at most {MAX_ID_CHARS} characters",
            suggested_action=f"Read field://{kind}/<id> with the id the Field gave.",
        )
    return kind, ident


def _shown(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def read_entity(field: Field, viewer: AgentRecord, kind: str, ident: str | None) -> Outcome:
    """The body of an entity resource, as ``viewer`` may see it (a writer job)."""
    state = field.state
    body: dict[str, Any]
    if kind == "agent":
        agent = state.agents.get(viewer.id, viewer)
        body = {"agent": agent.to_wire()}
    elif kind == "units":
        assert ident is not None
        unit = state.known_units.get(ident)
        if unit is None or not visibility.entity_visible(state, viewer, "unit", ident):
            raise NotFound(
                f"no memory unit {ident!r} in this Field that you may see",
                code=Code.UNIT_NOT_FOUND,
                suggested_action="Use an id from akashik_attune or a notification.",
            )
        body = {"memory_unit": unit}
    elif kind == "conflicts":
        assert ident is not None
        conflict = state.conflicts.get(ident)
        if conflict is None or not visibility.entity_visible(state, viewer, "conflict", ident):
            raise NotFound(
                f"no conflict {ident!r} in this Field that you may see",
                code=Code.CONFLICT_NOT_FOUND,
                suggested_action="List conflicts with akashik_detect (mode list).",
            )
        body = {"conflict": conflict}
    else:
        assert kind == "tasks" and ident is not None
        task = state.tasks.get(ident)
        if task is None or not visibility.entity_visible(state, viewer, "task", ident):
            raise NotFound(
                f"no task {ident!r} in this Field that you may see",
                code=Code.TASK_NOT_FOUND,
                suggested_action="List your tasks with akashik_coordinate (action list).",
            )
        body = {"task": task}
    body["epoch"] = field.epoch
    return Outcome(body, agent_id=viewer.id)
