"""The Field: operations in, responses and log entries out.

:meth:`Field.handle` is the whole protocol core. It validates an envelope,
authenticates its sender, runs the operation against the current state
and returns an :class:`Outcome`: the response payload and the log entries
that record what changed. It does no I/O: the caller (the service) makes
the entries durable before it releases the response.

Every operation is all-or-nothing. Handlers only read the state and build
entries; :meth:`Field._commit` then advances the Lamport clock and applies
the entries through the same projection that replays the log. A request
that fails raises a :class:`~field.errors.FieldError` before anything is
committed, so it changes nothing and consumes no epoch.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from .. import PROTOCOL_VERSION
from ..errors import AuthError, Code, FieldError, NotFound, StateError
from ..model import (
    CONFLICT_STRATEGIES,
    DETECT_MODES,
    OPERATIONS,
    UNRESOLVED_CONFLICT_STATUSES,
    Limits,
)
from ..store.base import LogEntry, StoredEntry
from ..subscriptions.events import SUBSCRIPTION_EVENTS
from ..subscriptions.stream import format_cursor
from . import (
    authority,
    conflicts,
    coordination,
    history,
    relevance,
    sessions,
    tasks,
    validation,
    visibility,
)
from .authority import OPERATOR_ID, STANDARD
from .clock import iso_timestamp
from .context import Context, Outcome
from .embedding import Embedder, default_embedder
from .state import OPERATOR_RECORD, AgentRecord, FieldState

#: Operations implemented by this Field, in spec order: all of them.
SUPPORTED_OPERATIONS: tuple[str, ...] = OPERATIONS
#: Level 3 of spec section 9: every operation, the Coordination Extension, all seven
#: MERGE strategies, embeddings, authority and session visibility, four bindings
#: (HTTP, WebSocket, SSE push, MCP).
CONFORMANCE_LEVEL = 3
SUMMARY_CHARS = 240


@dataclass(slots=True)
class Ids:
    """Sources of identifiers and secrets; tests replace them for determinism."""

    token: Callable[[], str] = lambda: secrets.token_urlsafe(32)
    suffix: Callable[[], str] = lambda: secrets.token_hex(10)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Field:
    """The protocol state machine of one Field."""

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        persistent: bool = True,
        now: Callable[[], float] = time.time,
        ids: Ids | None = None,
        operator_token: str | None = None,
        read_entries: Callable[[Sequence[int]], list[StoredEntry]] | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.limits = limits or Limits()
        #: hash of the operator token (spec 11.2, level 10); None: no operator
        self._operator_hash = hash_token(operator_token) if operator_token else None
        self.persistent = persistent
        #: embeds unit contents for semantic relevance; recomputed at every replay
        self.embedder = embedder or default_embedder()
        self.state = FieldState(self.limits, embedder=self.embedder)
        self._now = now
        self._ids = ids or Ids()
        #: reads log entries by position (REPLAY); the service wires it to its log
        self.read_entries = read_entries
        self._handlers: dict[str, Callable[[Context], Outcome]] = {
            "REGISTER": self._register,
            "DEREGISTER": self._deregister,
            "RECORD": self._record,
            "ATTUNE": self._attune,
            "DETECT": self._detect,
            "MERGE": self._merge,
            "SUBSCRIBE": self._subscribe,
            "REPLAY": lambda ctx: history.replay(self, ctx),
            "COMPACT": lambda ctx: history.compact(self, ctx),
            "COORDINATE": functools.partial(coordination.coordinate, self),
            "HANDOFF": functools.partial(coordination.handoff, self),
            "SESSION": functools.partial(coordination.session, self),
        }

    # -- life cycle ------------------------------------------------------------

    def replay(self, entries: Iterable[StoredEntry]) -> None:
        """Rebuild the state from a stored log (start-up and recovery)."""
        self.state.replay(entries)

    def genesis(self) -> list[LogEntry]:
        """The entries that start a new log: the Field's identity."""
        if self.state.field_id is not None:
            return []
        entry = LogEntry(0, "field.created", {"field_id": self.new_id("field")}, ts=self._now())
        self.state.apply(entry)
        return [entry]

    def new_id(self, prefix: str) -> str:
        """A fresh Field-assigned id: ``<prefix>-`` and 20 hex digits."""
        return f"{prefix}-{self._ids.suffix()}"

    @property
    def epoch(self) -> int:
        return self.state.clock.value

    @property
    def field_tag(self) -> str:
        """The prefix of this Field's cursors, so a cursor names its Field."""
        field_id = self.state.field_id or "field-0"
        return field_id.removeprefix("field-")[:12]

    # -- the one entry point ---------------------------------------------------

    def handle(self, body: Any, *, token: str | None, operation: str | None = None) -> Outcome:
        """Run one enveloped operation; ``operation`` is the endpoint's, if any."""
        envelope = validation.envelope(body, expected_operation=operation, limits=self.limits)
        try:
            handler = self._handlers[envelope.operation]  # the envelope names a known one
            if envelope.operation == "REGISTER":
                agent = OPERATOR_RECORD if token and self._is_operator(token) else None
            else:
                agent = self.authenticate(token)
            registering = envelope.operation == "REGISTER"
            if agent is not None and agent.id != envelope.agent_id and not registering:
                raise AuthError(
                    f"the bearer token belongs to agent {agent.id!r}, not {envelope.agent_id!r}",
                    code=Code.FORBIDDEN,
                    recoverable=False,
                    suggested_action="Send each agent's requests with its own token.",
                )
            if agent is not None and not registering:
                authority.require(
                    agent.authority,
                    authority.MIN_AUTHORITY.get(envelope.operation, authority.STANDARD),
                    envelope.operation,
                )
            epoch = self.state.clock.next(envelope.epoch)
            now = self._entry_time()
            outcome = handler(Context(envelope, agent, epoch, now))
            if agent is not None and agent.status == "failed":
                # a failed agent that is heard from again has recovered
                data = {"agent_id": agent.id}
                outcome.entries.insert(0, LogEntry(epoch, "agent.recovered", data, agent.id, now))
            self._commit(epoch, outcome.entries)
            outcome.agent_id = envelope.agent_id if agent is None or registering else agent.id
            return outcome
        except FieldError as error:
            error.operation = error.operation or envelope.operation
            raise

    def authenticate(self, token: str | None) -> AgentRecord:
        """The registered agent a bearer token belongs to."""
        if not token:
            raise AuthError("this request needs 'Authorization: Bearer <token>'")
        if self._is_operator(token):
            return OPERATOR_RECORD
        digest = hash_token(token)
        agent_id = self.state.tokens.get(digest)
        if agent_id is not None:
            agent = self.state.agents[agent_id]
            if hmac.compare_digest(agent.token_hash, digest):
                return agent
        revoked = self.state.revoked_tokens.get(digest)
        if revoked is not None:
            raise AuthError(
                f"agent {revoked!r} has deregistered; its token is no longer valid",
                code=Code.AGENT_NOT_REGISTERED,
                suggested_action="Call REGISTER again to get a new token.",
            )
        raise AuthError("the bearer token is not one this Field issued")

    # -- liveness (no envelope: the server decides these) ----------------------

    def fail_agent(self, agent_id: str, reason: str) -> Outcome:
        """Declare a registered agent failed (it went silent); no-op if it is not live."""
        agent = self.state.agents.get(agent_id)
        if agent is None or agent.status == "failed":
            return Outcome({"status": "unchanged"})
        epoch = self.state.clock.next(0)
        now = self._entry_time()
        released = tasks.release_tasks(
            self.state, agent_id, reason=f"{agent_id} failed", epoch=epoch, actor=agent_id, ts=now
        )
        data = {
            "agent_id": agent_id,
            "reason": reason,
            "agent": agent.to_wire(),
            # the tasks flagged for reassignment and who created them
            "released_tasks": [
                {"task_id": e.data["task"]["id"], "created_by": e.data["task"]["created_by"]}
                for e in released
            ],
        }
        entries = [LogEntry(epoch, "agent.failed", data, agent_id, now), *released]
        self._commit(epoch, entries)
        return Outcome({"status": "failed", "epoch": epoch}, entries)

    def recover_agent(self, agent_id: str) -> Outcome:
        """A failed agent is back (it reconnected); no-op if it is not failed."""
        agent = self.state.agents.get(agent_id)
        if agent is None or agent.status != "failed":
            return Outcome({"status": "unchanged"})
        epoch = self.state.clock.next(0)
        now = self._entry_time()
        entries = [LogEntry(epoch, "agent.recovered", {"agent_id": agent_id}, agent_id, now)]
        self._commit(epoch, entries)
        return Outcome({"status": "recovered", "epoch": epoch}, entries)

    def _entry_time(self) -> float:
        """The timestamp of the next entries: wall time, but never before the last entry's."""
        return max(self.state.last_ts, self._now())

    def _is_operator(self, token: str) -> bool:
        return self._operator_hash is not None and hmac.compare_digest(
            self._operator_hash, hash_token(token)
        )

    def _commit(self, epoch: int, entries: list[LogEntry]) -> None:
        reserved = self.state.clock.advance(epoch)
        if reserved is not None:
            entries.append(LogEntry(epoch, "clock.reserved", {"until": reserved}, ts=self._now()))
        for entry in entries:
            self.state.apply(entry)

    # -- REGISTER / DEREGISTER -------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        return {
            "conformance_level": CONFORMANCE_LEVEL,
            "supported_operations": list(SUPPORTED_OPERATIONS),
            "protocol_version": PROTOCOL_VERSION,
            "persistence": self.persistent,
            "conflict_strategies": list(CONFLICT_STRATEGIES),
            "field_id": self.state.field_id or "",
            "detect_modes": list(DETECT_MODES),
            "limits": self.limits.as_dict(),
            "embedder": self.embedder.name,
        }

    def _register(self, ctx: Context) -> Outcome:
        request = validation.register_payload(ctx.envelope.payload, self.limits)
        if request["id"] != ctx.envelope.agent_id:
            raise AuthError(
                "REGISTER payload id must equal the envelope agent_id",
                code=Code.FORBIDDEN,
                suggested_action="Register under the id you send the envelope from.",
            )
        missing = [op for op in request["required_operations"] if op not in SUPPORTED_OPERATIONS]
        if missing:
            raise StateError(
                f"this Field does not support {', '.join(missing)}",
                code=Code.UNSUPPORTED_OPERATION,
                recoverable=False,
                suggested_action="Connect to a Field that supports them, or drop them.",
                details={
                    "status": "rejected",
                    "rejection_reason": f"unsupported operations: {', '.join(missing)}",
                    "missing_operations": missing,
                    "field_capabilities": self.capabilities(),
                },
            )
        if request["authority"] > STANDARD and ctx.agent is not OPERATOR_RECORD:
            raise AuthError(
                f"registering with authority {request['authority']} needs the operator token",
                code=Code.INSUFFICIENT_AUTHORITY,
                recoverable=False,
                suggested_action="Register at authority 4 or lower, or have the operator "
                "register the agent with its token.",
            )
        if request["id"] in self.state.agents or request["id"] == OPERATOR_ID:
            raise StateError(
                f"agent id {request['id']!r} is already registered",
                code=Code.AGENT_ID_TAKEN,
                suggested_action="Register under a different id.",
            )
        token = self._ids.token()
        agent = {
            "id": request["id"],
            "role": request["role"],
            "interests": request["interests"],
            "current_task_id": request["current_task_id"],
            "registered_epoch": ctx.epoch,
            "authority": request["authority"],
        }
        entry = LogEntry(
            ctx.epoch,
            "agent.registered",
            {"agent": agent, "token_hash": hash_token(token)},
            agent_id=request["id"],
            ts=ctx.now,
        )
        response = {
            "status": "registered",
            "agent": {**agent, "status": "idle"},
            "field_capabilities": self.capabilities(),
            "rejection_reason": None,
            "token": token,
            "epoch": ctx.epoch,
        }
        return Outcome(response, [entry])

    def _deregister(self, ctx: Context) -> Outcome:
        target = validation.deregister_payload(ctx.envelope.payload)
        if target == OPERATOR_ID:
            raise AuthError(
                "the operator is not a registered agent and cannot deregister",
                code=Code.FORBIDDEN,
                recoverable=False,
                suggested_action="Remove the operator token from the configuration instead.",
            )
        if target != ctx.envelope.agent_id:
            raise AuthError(
                "an agent can only deregister itself",
                code=Code.FORBIDDEN,
                recoverable=False,
                suggested_action="Send DEREGISTER from the agent that leaves.",
            )
        # its tasks go back to the pool and it leaves its sessions, then it is gone
        entries = tasks.release_tasks(
            self.state,
            target,
            reason="assignee deregistered",
            epoch=ctx.epoch,
            actor=target,
            ts=ctx.now,
        )
        reassigned = len(entries)
        entries += sessions.leave_all(
            self.state, target, reason="agent deregistered", epoch=ctx.epoch, ts=ctx.now
        )
        entries.append(
            LogEntry(
                ctx.epoch, "agent.deregistered", {"agent_id": target}, agent_id=target, ts=ctx.now
            )
        )
        response = {
            "status": "ok",
            "cleanup": {
                "units_orphaned": self.state.units_by_agent[target],
                "tasks_reassigned": reassigned,
            },
            "epoch": ctx.epoch,
        }
        return Outcome(response, entries)

    # -- RECORD ----------------------------------------------------------------

    def _record(self, ctx: Context) -> Outcome:
        request = validation.record_payload(ctx.envelope.payload, self.limits)
        assert ctx.agent is not None  # guaranteed by handle(): RECORD is authenticated
        if ctx.envelope.session_id is not None:
            sessions.require_active_member(
                self.state, ctx.agent.id, ctx.envelope.session_id, "recording"
            )
        for relation in request["relations"]:
            target = self.state.units.get(relation["target_id"])
            if target is None or not visibility.unit_visible(self.state, ctx.agent, target):
                raise NotFound(
                    f"relation target {relation['target_id']!r} is not a memory unit in this Field",
                    code=Code.UNIT_NOT_FOUND,
                    suggested_action="Relate only to units the Field returned.",
                )
        unit_id = self.new_id("mem")
        unit = {
            "id": unit_id,
            **request,
            "source": {
                "agent_id": ctx.agent.id,
                "agent_role": ctx.agent.role,
                "session_id": ctx.envelope.session_id,
                "timestamp": iso_timestamp(ctx.now),
            },
            "status": "draft" if request["mode"] == "draft" else "active",
            "epoch": ctx.epoch,
        }
        entries = [LogEntry(ctx.epoch, "memory.recorded", {"unit": unit}, ctx.agent.id, ctx.now)]
        conflicts = self._relation_effects(ctx, unit, entries)
        response = {
            "status": "accepted",
            "memory_unit_id": unit_id,
            "epoch": ctx.epoch,
            "conflicts_detected": conflicts,
            "rejection_reason": None,
        }
        return Outcome(response, entries)

    def _relation_effects(
        self, ctx: Context, unit: dict[str, Any], entries: list[LogEntry]
    ) -> list[str]:
        """Entries for ``supersedes`` and ``contradicts`` relations; returns new conflicts."""
        agent_id = unit["source"]["agent_id"]
        superseded: set[str] = set()
        contested: dict[str, str] = {}  # unit -> the first conflict that contests it
        conflicts: list[str] = []
        for relation in unit["relations"]:
            target = relation["target_id"]
            if relation["type"] == "supersedes" and target not in superseded:
                superseded.add(target)
                data = {"memory_unit_id": target, "by": unit["id"]}
                entries.append(LogEntry(ctx.epoch, "memory.superseded", data, agent_id, ctx.now))
            elif relation["type"] == "contradicts":
                conflict_id = self.new_id("conflict")
                description = relation["description"] or (
                    f"{unit['id']} contradicts {target}: "
                    f"{_shorten(unit['content'], 80)!r} vs "
                    f"{_shorten(self.state.units[target]['content'], 80)!r}"
                )
                conflict = {
                    "id": conflict_id,
                    "type": "factual",
                    "status": "detected",
                    "unit_a": target,
                    "unit_b": unit["id"],
                    "description": description,
                    "detected_by": "explicit",
                    "epoch": ctx.epoch,
                }
                conflicts.append(conflict_id)
                data = {"conflict": conflict}
                entries.append(LogEntry(ctx.epoch, "conflict.detected", data, agent_id, ctx.now))
                contested.setdefault(target, conflict_id)
                contested.setdefault(unit["id"], conflict_id)
        for unit_id in sorted(contested.keys() - superseded):
            if self._status_after(unit_id, unit) in ("active", "draft"):
                data = {"memory_unit_id": unit_id, "conflict_id": contested[unit_id]}
                entries.append(LogEntry(ctx.epoch, "memory.contested", data, agent_id, ctx.now))
        return conflicts

    def _status_after(self, unit_id: str, new_unit: dict[str, Any]) -> str:
        if unit_id == new_unit["id"]:
            return str(new_unit["status"])
        return str(self.state.units[unit_id]["status"])

    # -- ATTUNE ----------------------------------------------------------------

    def _attune(self, ctx: Context) -> Outcome:
        scope = validation.attune_payload(ctx.envelope.payload, self.limits)
        assert ctx.agent is not None  # guaranteed by handle(): ATTUNE is authenticated
        agent = ctx.agent
        query = relevance.Query(
            agent_id=agent.id,
            role=scope["role"],
            interests=scope["interests"] if scope["interests"] is not None else agent.interests,
            context_hint=scope["context_hint"],
            task_id=scope["active_task_id"] or agent.current_task_id,
            recency_weight=scope["recency_weight"],
            include_own=scope["include_own"],
            since_epoch=scope["since_epoch"],
            include_archived=scope["include_archived"],
        )
        index = self.state.index
        rows = relevance.candidates(index, query, visibility.row_mask(self.state, agent))
        scores = relevance.score(index, query, rows)
        polling = query.since_epoch is not None
        threshold = scope["relevance_threshold"]
        if polling:
            keep = scores >= threshold
            rows, scores = rows[keep], scores[keep]
            available = len(rows)
            # rows ascend by epoch: a prefix is the oldest new units, so the
            # next poll can continue exactly where this page stops
            walk = np.arange(min(available, scope["max_units"]))
            rows, scores = rows[walk], scores[walk]
        else:
            best, scores, available = relevance.best_diversified(
                index, rows, scores, count=scope["max_units"], threshold=threshold
            )
            rows = rows[best]
        chosen, tokens_used = self._fit(rows, scores, scope, make_progress=polling)
        chosen.sort(key=lambda item: -item[1])  # stable: ties keep epoch order
        record = [self._scoped(query, *item) for item in chosen]
        epoch = ctx.epoch
        if polling and len(chosen) < available:
            epoch = max(self.state.units[index.ids[row]]["epoch"] for row, *_ in chosen)
        response = {
            "status": "ok",
            "record": record,
            "conflicts": self._conflicts_for(agent),
            "context_budget": {
                "units_returned": len(record),
                "units_available": available,
                "tokens_used": tokens_used,
                "tokens_budget": scope["max_tokens"],
            },
            "epoch": epoch,
        }
        return Outcome(response)

    def _fit(
        self, rows: np.ndarray, scores: np.ndarray, scope: dict[str, Any], *, make_progress: bool
    ) -> tuple[list[tuple[int, float, str, dict[str, Any]]], int | None]:
        """Walk ``rows`` in order, taking each in the richest form ``max_tokens`` allows.

        The walk stops at the first unit that does not fit in any form. A
        poll (``make_progress``) always takes its first unit, in its
        shortest form, so that polling can never stall on one large unit.
        """
        budget = scope["max_tokens"]
        units, ids = self.state.units, self.state.index.ids
        chosen: list[tuple[int, float, str, dict[str, Any]]] = []
        used = 0
        for row, row_score in zip(rows.tolist(), scores.tolist(), strict=True):
            forms = _forms(units[ids[row]], scope["format"])
            if budget is None:
                chosen.append((row, row_score, *forms[0]))
                continue
            costed = [(name, shown, _tokens(shown)) for name, shown in forms]
            fitting = [form for form in costed if used + form[2] <= budget]
            if fitting:
                name, shown, cost = fitting[0]
            elif chosen or not make_progress:
                break
            else:
                name, shown, cost = costed[-1]
            used += cost
            chosen.append((row, row_score, name, shown))
        return chosen, (used if budget is not None else None)

    def _scoped(
        self, query: relevance.Query, row: int, row_score: float, form: str, shown: dict[str, Any]
    ) -> dict[str, Any]:
        """One ScopedMemoryUnit of the ATTUNE response."""
        unit = self.state.units[self.state.index.ids[row]]
        scored = {
            "relevance_score": round(row_score, 6),
            "relevance_reason": relevance.explain(self.state.index, query, unit, row_score),
            "format": form,
        }
        if form == "ids_only":
            return {**shown, **scored}
        return {"memory_unit": shown, **scored}

    def _conflicts_for(self, agent: AgentRecord) -> list[dict[str, Any]]:
        """Unresolved conflicts the agent may see, its own first, then newest first."""
        units = self.state.known_units
        agent_id = agent.id
        unresolved = [
            c
            for c in self.state.conflicts.values()
            if c["status"] in UNRESOLVED_CONFLICT_STATUSES
            and visibility.conflict_visible(self.state, agent, c)
        ]

        def involves_agent(conflict: dict[str, Any]) -> bool:
            return any(
                units[conflict[key]]["source"]["agent_id"] == agent_id
                for key in ("unit_a", "unit_b")
            )

        unresolved.sort(key=lambda c: (not involves_agent(c), -c["epoch"]))
        return unresolved[: self.limits.max_attune_conflicts]

    # -- SUBSCRIBE -------------------------------------------------------------

    def _subscribe(self, ctx: Context) -> Outcome:
        request = validation.subscribe_payload(
            ctx.envelope.payload, self.limits, SUBSCRIPTION_EVENTS
        )
        assert ctx.agent is not None  # guaranteed by handle(): SUBSCRIBE is authenticated
        agent_id = ctx.agent.id
        if request["action"] == "list":
            mine = sorted(self.state.active_subscriptions.get(agent_id, ()))
            subscriptions = [self._subscription_wire(s) for s in mine]
            return Outcome({"status": "ok", "subscriptions": subscriptions, "epoch": ctx.epoch})
        if request["action"] == "unsubscribe":
            subscription = self.active_subscription(request["id"], agent_id)
            data = {"subscription_id": subscription["id"], "reason": "unsubscribed"}
            entry = LogEntry(ctx.epoch, "subscription.cancelled", data, agent_id, ctx.now)
            cancelled = {**self._subscription_wire(subscription["id"]), "status": "cancelled"}
            body = {
                "status": "ok",
                "subscription_id": subscription["id"],
                "subscription": cancelled,
                "epoch": ctx.epoch,
            }
            return Outcome(body, [entry])
        active = self.state.active_subscriptions.get(agent_id, set())
        cap = self.limits.max_subscriptions_per_agent
        if len(active) >= cap:
            raise StateError(
                f"agent {agent_id!r} already has {cap} active subscriptions",
                code=Code.SUBSCRIPTION_LIMIT,
                suggested_action="Unsubscribe from one first, or widen an existing one.",
            )
        subscription_id = self.new_id("sub")
        subscription = {
            "id": subscription_id,
            "agent_id": agent_id,
            "events": request["events"],
            "min_relevance": request["min_relevance"],
            "debounce_ms": request["debounce_ms"],
            "include_own": request["include_own"],
            "status": "active",
            "created_epoch": ctx.epoch,
        }
        entry = LogEntry(
            ctx.epoch, "subscription.created", {"subscription": subscription}, agent_id, ctx.now
        )
        response: dict[str, Any] = {
            "status": "ok",
            "subscription_id": subscription_id,
            "subscription": subscription,
            "epoch": ctx.epoch,
            "cursor": None,
            "ws_url": "/v1/ws",
            "sse_url": f"/v1/subscriptions/{subscription_id}/events",
        }

        def with_cursor(positions: list[int]) -> None:
            response["cursor"] = format_cursor(self.field_tag, positions[0])

        return Outcome(response, [entry], on_durable=with_cursor)

    def owned_subscription(self, subscription_id: str, agent_id: str) -> dict[str, Any]:
        """The caller's subscription ``subscription_id``; refuses other agents'."""
        subscription = self.state.subscriptions.get(subscription_id)
        if subscription is None:
            raise NotFound(
                f"no subscription {subscription_id!r} in this Field",
                code=Code.SUBSCRIPTION_NOT_FOUND,
                suggested_action='List your subscriptions with action "list".',
            )
        if subscription["agent_id"] != agent_id:
            raise AuthError(
                f"subscription {subscription_id!r} belongs to another agent",
                code=Code.FORBIDDEN,
                recoverable=False,
                suggested_action="Only the agent that subscribed can read or cancel it.",
            )
        return subscription

    def active_subscription(self, subscription_id: str, agent_id: str) -> dict[str, Any]:
        """The caller's subscription, which must still be active (INVALID_TRANSITION if not)."""
        subscription = self.owned_subscription(subscription_id, agent_id)
        if subscription["status"] != "active":
            raise StateError(
                f"subscription {subscription_id} is cancelled",
                code=Code.INVALID_TRANSITION,
                recoverable=False,
                suggested_action="It no longer notifies; subscribe again if needed.",
            )
        return subscription

    def _subscription_wire(self, subscription_id: str) -> dict[str, Any]:
        subscription = self.state.subscriptions[subscription_id]
        return {k: v for k, v in subscription.items() if k != "cancel_reason"}

    # -- DETECT ----------------------------------------------------------------

    def _detect(self, ctx: Context) -> Outcome:
        return conflicts.detect(self, ctx)

    def _merge(self, ctx: Context) -> Outcome:
        return conflicts.merge(self, ctx)

    # -- reads outside the protocol (GET endpoints) ----------------------------

    def list_conflicts(
        self,
        viewer: AgentRecord,
        *,
        statuses: Iterable[str] = (),
        types: Iterable[str] = (),
        involving_agents: Iterable[str] = (),
    ) -> list[dict[str, Any]]:
        """Conflicts ``viewer`` may see matching every non-empty filter, oldest first."""
        status_set, type_set, agent_set = set(statuses), set(types), set(involving_agents)
        units = self.state.known_units
        result = []
        for conflict in self.state.conflicts.values():
            if status_set and conflict["status"] not in status_set:
                continue
            if type_set and conflict["type"] not in type_set:
                continue
            if agent_set and not agent_set & {
                units[conflict[key]]["source"]["agent_id"] for key in ("unit_a", "unit_b")
            }:
                continue
            if not visibility.conflict_visible(self.state, viewer, conflict):
                continue
            result.append(conflict)
        return result

    def list_agents(self) -> list[dict[str, Any]]:
        return [agent.to_wire() for agent in self.state.agents.values()]

    def status(self) -> dict[str, Any]:
        state = self.state
        return {
            "status": "ok",
            "field_id": state.field_id or "",
            "protocol_version": PROTOCOL_VERSION,
            "conformance_level": CONFORMANCE_LEVEL,
            "epoch": state.clock.value,
            "persistence": self.persistent,
            "counts": {
                "agents": len(state.agents),
                "memory_units": {k: v for k, v in state.unit_statuses.items() if v},
                "conflicts": {
                    "total": len(state.conflicts),
                    "unresolved": sum(
                        c["status"] in UNRESOLVED_CONFLICT_STATUSES
                        for c in state.conflicts.values()
                    ),
                },
            },
            "limits": self.limits.as_dict(),
        }


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _summarize(unit: dict[str, Any]) -> dict[str, Any]:
    """The unit in summary form: first sentence of its content, short confidence."""
    content = unit["content"].strip()
    sentence_end = content.find(". ")
    first = content if sentence_end < 0 else content[: sentence_end + 1]
    summary = dict(unit)
    summary["content"] = _shorten(first, SUMMARY_CHARS)
    confidence = unit.get("confidence")
    if confidence is not None:
        summary["confidence"] = {
            k: confidence[k] for k in ("score", "reasoning") if k in confidence
        }
    return summary


def _forms(unit: dict[str, Any], fmt: str) -> list[tuple[str, dict[str, Any]]]:
    """The forms a unit may take in an ATTUNE response, richest first."""
    if fmt == "ids_only":
        return [("ids_only", {"memory_unit_id": unit["id"], "epoch": unit["epoch"]})]
    summary = ("summary", _summarize(unit))
    return [("full", unit), summary] if fmt == "full" else [summary]


def _tokens(unit: dict[str, Any]) -> int:
    """Estimated tokens of a serialized unit: four bytes of JSON per token."""
    return math.ceil(len(orjson.dumps(unit)) / 4)
