"""What operation handlers take and return, shared by the modules of the core."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..store.base import LogEntry
from . import validation
from .state import AgentRecord


@dataclass(slots=True)
class Outcome:
    """What one operation produced: its response and the entries to make durable."""

    response: dict[str, Any]
    entries: list[LogEntry] = field(default_factory=list)
    #: called with the log positions of ``entries`` once they are durable
    on_durable: Callable[[list[int]], None] | None = None
    #: the agent the operation was authenticated as (liveness counts it as seen)
    agent_id: str | None = None


@dataclass(slots=True)
class Context:
    """What a handler knows of the request it runs: who sent it, its epoch and time."""

    envelope: validation.Envelope
    agent: AgentRecord | None
    epoch: int
    now: float
