"""Driving the pure Field core from tests, with no event loop and no I/O."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from field.contract.model import LogEntry, StoredEntry
from field.core.context import Outcome
from field.core.field import Field, Ids
from field.store import MemoryEventLog


class Harness:
    """A Field plus the log entries it produced, with deterministic ids and time."""

    def __init__(self, **kwargs: Any) -> None:
        counter = itertools.count(1)
        tokens = itertools.count(1)
        self.time = 1_780_000_000.0
        #: the Field's ids: a Field that takes over (a restart) goes on with them
        self.ids = Ids(
            token=lambda: f"token-{next(tokens)}", suffix=lambda: f"{next(counter):020x}"
        )
        self.field = Field(now=lambda: self.time, ids=self.ids, **kwargs)
        self.field.read_entries = self.read_positions
        self.entries: list[LogEntry] = list(self.field.genesis())
        self.tokens: dict[str, str] = {}
        self.epochs: dict[str, int] = {}
        self._ids = itertools.count(1)

    def send(
        self,
        operation: str,
        agent_id: str,
        payload: dict[str, Any],
        *,
        epoch: int | None = None,
        token: str | None = None,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        envelope = {
            "protocol": "akashik",
            "version": "0.1.0",
            "id": f"msg-{next(self._ids)}",
            "operation": operation,
            "agent_id": agent_id,
            "session_id": session_id,
            "epoch": self.epochs.get(agent_id, 0) if epoch is None else epoch,
            "payload": payload,
        }
        if token is None:
            token = self.tokens.get(agent_id)
        outcome: Outcome = self.field.handle(envelope, token=token, operation=operation)
        self.entries.extend(outcome.entries)
        response = outcome.response
        if isinstance(response.get("epoch"), int):
            self.epochs[agent_id] = max(self.epochs.get(agent_id, 0), response["epoch"])
        return response

    def register(
        self, agent_id: str, role: str = "researcher", *, via: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        """Register ``agent_id``; ``via`` is a bearer token to send (the operator's)."""
        payload = {"id": agent_id, "role": role, **extra}
        response = self.send("REGISTER", agent_id, payload, token=via)
        self.tokens[agent_id] = response["token"]
        return response

    def record(
        self,
        agent_id: str,
        content: str = "a finding",
        *,
        memory_type: str = "finding",
        score: float = 0.8,
        task_id: str | None = None,
        relations: list[dict[str, Any]] | None = None,
        mode: str = "committed",
        purpose: str = "to test",
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "mode": mode,
            "type": memory_type,
            "content": content,
            "intent": {"purpose": purpose, "task_id": task_id},
            "confidence": {"score": score, "reasoning": "measured"},
        }
        if relations:
            payload["relations"] = relations
        return self.send("RECORD", agent_id, payload)

    def record_at(self, agent_id: str, epoch: int, memory_type: str) -> dict[str, Any]:
        """A committed unit sent with envelope epoch ``epoch``."""
        payload = {
            "type": memory_type,
            "content": f"{memory_type} on the market by {agent_id}",
            "intent": {"purpose": "test"},
            "confidence": {"score": 0.7, "reasoning": "generated"},
        }
        return self.send("RECORD", agent_id, payload, epoch=epoch)

    def attune(self, agent_id: str, max_units: int = 100, **scope: Any) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        for key in ("context_hint", "format"):
            if key in scope:
                payload[key] = scope.pop(key)
        role = scope.pop("role", self.field.state.agents[agent_id].role)
        payload["scope"] = {"role": role, "max_units": max_units, **scope}
        return self.send("ATTUNE", agent_id, payload)

    def stored(self) -> list[StoredEntry]:
        """The entries so far as a log would store them."""
        return [
            StoredEntry(i, e.epoch, e.kind, e.data, e.agent_id, e.ts)
            for i, e in enumerate(self.entries, start=1)
        ]

    def read_positions(
        self, positions: Sequence[int], *, max_bytes: int | None = None
    ) -> list[StoredEntry]:
        """The entries at ``positions``, as a log's ``read_positions`` returns them."""
        log = MemoryEventLog()
        log.append(self.entries)
        return log.read_positions(positions, max_bytes=max_bytes)

    def replayed(self) -> Field:
        """A new Field rebuilt from this one's entries, as at start-up."""
        field = Field(read_entries=self.read_positions)
        field.replay(self.stored())
        return field
