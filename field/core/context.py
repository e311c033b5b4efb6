"""What operation handlers take and return, shared by the modules of the core."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..contract.model import LogEntry
from ..subscriptions.delivery import RapCall
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
    #: a large read's remaining work on ``response``, in bounded steps (see
    #: ``Field.sliced_reads``): whoever releases the response runs them all first,
    #: and may let other work run between them; they read no state that may change
    rest: Iterator[None] | None = None


@dataclass(slots=True)
class Context:
    """What a handler knows of the request it runs: who sent it, its epoch and time."""

    envelope: validation.Envelope
    agent: AgentRecord | None
    epoch: int
    now: float
    #: the bearer token of a REGISTER (None for every other operation): the proof
    #: that a retired agent id is taken back by its own registrant
    bearer: str | None = None
    #: the RAP invocation the request came in (its SUBSCRIBE is delivered to its
    #: callback), or None for every other binding
    rap: RapCall | None = None
