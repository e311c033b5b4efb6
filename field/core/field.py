"""The Field: operations in, responses and log entries out.

:meth:`Field.handle` is the whole protocol core. It validates an envelope,
authenticates its sender, runs the operation against the current state
and returns an :class:`Outcome`: the response payload and the log entries
that record what changed. It does no I/O: the caller (the service) makes
the entries durable before it releases the response.

Every operation is all-or-nothing. Handlers only read the state and build
entries; :meth:`Field._commit` then advances the Lamport clock and applies
the entries through the same projection that replays the log. A request
that fails raises a :class:`~field.contract.errors.FieldError` before anything is
committed, so it changes nothing and consumes no epoch.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import PROTOCOL_VERSION
from ..contract.clock import iso_timestamp
from ..contract.errors import AuthError, Code, FieldError, NotFound, StateError
from ..contract.model import (
    CONFLICT_STRATEGIES,
    DETECT_MODES,
    MAX_EPOCH,
    OPERATIONS,
    UNRESOLVED_CONFLICT_STATUSES,
    Limits,
    LogEntry,
    StoredEntry,
)
from ..contract.text import shorten
from ..ranking.embedding import Embedder, default_embedder
from ..subscriptions.delivery import Progress, RapCall
from ..subscriptions.filtering import FilterStage, FilterTime
from ..subscriptions.stream import format_cursor
from . import (
    attune,
    authority,
    conflicts,
    coordination,
    feedback,
    history,
    listing,
    registration,
    sessions,
    sources,
    subscribe,
    tasks,
    validation,
    visibility,
)
from .authority import OPERATOR_ID
from .context import Context, Outcome
from .egress import EgressPolicy
from .pages import PageRequest
from .secrets import SecretBox, new_secret
from .state import OPERATOR_RECORD, AgentRecord, FieldState

#: Operations implemented by this Field, in spec order: all of them.
SUPPORTED_OPERATIONS: tuple[str, ...] = OPERATIONS
#: Registered agents a Field holds at most, unless configured otherwise. An agent costs
#: about 0.5 KB of the state bare and about 3 KB with a subscription (its profile in the
#: matcher's columns), so 100,000 bounds that to a few hundred MB: far above what real
#: deployments register, far below what would exhaust a small server.
DEFAULT_MAX_AGENTS = 100_000
#: Level 3 of spec section 9: every operation, the Coordination Extension, all seven
#: MERGE strategies, embeddings, authority and session visibility, four bindings
#: (HTTP, WebSocket, SSE push, MCP).
CONFORMANCE_LEVEL = 3


#: The reason of an ``agent.failed`` entry the operator wrote (then ": " and its own, if given).
OPERATOR_FAILED = "declared failed by the operator"


@dataclass(slots=True)
class Ids:
    """Sources of identifiers and secrets; tests replace them for determinism."""

    token: Callable[[], str] = lambda: secrets.token_urlsafe(32)
    suffix: Callable[[], str] = lambda: secrets.token_hex(10)
    webhook_secret: Callable[[], str] = new_secret


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
        read_entries: history.ReadEntries | None = None,
        embedder: Embedder | None = None,
        egress: EgressPolicy | None = None,
        secret_box: SecretBox | None = None,
        registration_policy: str = "open",
        max_agents: int = DEFAULT_MAX_AGENTS,
        filter_time: FilterTime | None = None,
        delivery_progress: Progress | None = None,
    ) -> None:
        self.limits = limits or Limits()
        if registration_policy not in registration.POLICIES:
            raise ValueError(f"registration must be one of {', '.join(registration.POLICIES)}")
        #: who may REGISTER (see field.core.registration), and how many agents at most
        self.registration = registration_policy
        self.max_agents = max_agents
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
        #: while the log cannot be written: makes the error every write is refused with
        #: (reads go on, and the clock stays within its durable reservation)
        self.writes_refused: Callable[[], FieldError] | None = None
        #: set when applying committed entries failed part-way: the state no longer
        #: follows from the log, and the owner must rebuild it before anything else runs
        self.broken = False
        #: whether a large read (ATTUNE) may leave the building of its page to
        #: ``Outcome.rest``, to be run in steps between other work (the service's
        #: choice); otherwise every response is complete when ``handle`` returns
        self.sliced_reads = False
        #: which URLs a webhook may be delivered to (addresses; DNS is the transport's)
        self.egress = egress or EgressPolicy()
        #: seals webhook secrets for the log (a key of this process's only, by default)
        self.secret_box = secret_box or SecretBox(secrets.token_bytes(32))
        #: how far each durable delivery is, for SUBSCRIBE list (None: no engine sends any)
        self.delivery_progress = delivery_progress
        #: subscription filters: the stage after the vectorized matcher, and its counts
        #: each agent's share of the time subscription filters take (None: unbounded)
        self.filter_time = filter_time
        self.filters = FilterStage(
            self.state,
            lambda position: format_cursor(self.field_tag, position),
            time=filter_time,
        )
        self._handlers: dict[str, Callable[[Context], Outcome]] = {
            "REGISTER": self._register,
            "DEREGISTER": self._deregister,
            "RECORD": self._record,
            "ATTUNE": functools.partial(attune.attune, self),
            "DETECT": self._detect,
            "MERGE": self._merge,
            "SUBSCRIBE": functools.partial(subscribe.subscribe, self),
            "REPLAY": lambda ctx: history.replay(self, ctx),
            "COMPACT": lambda ctx: history.compact(self, ctx),
            "COORDINATE": functools.partial(coordination.coordinate, self),
            "HANDOFF": functools.partial(coordination.handoff, self),
            "SESSION": functools.partial(coordination.session, self),
            "FEEDBACK": functools.partial(feedback.feedback, self),
        }

    # -- life cycle ------------------------------------------------------------

    def replay(self, entries: Iterable[StoredEntry]) -> None:
        """Rebuild the state from a stored log (start-up and recovery)."""
        self.state.replay(entries)

    def restore(self, state: FieldState) -> None:
        """Take ``state`` (read from a snapshot of this Field's log) as the Field's own; the
        entries after its ``last_position`` are then replayed as usual."""
        self.state = state
        self.filters = FilterStage(
            state,
            lambda position: format_cursor(self.field_tag, position),
            time=self.filter_time,
        )

    def genesis(self) -> list[LogEntry]:
        """The entries that start a new log: the Field's identity."""
        if self.state.field_id is not None:
            return []
        entry = LogEntry(0, "field.created", {"field_id": self.new_id("field")}, ts=self._now())
        self.state.apply(entry)
        return [entry]

    def new_secret(self) -> str:
        """A fresh webhook secret (``whsec_`` and base64)."""
        return self._ids.webhook_secret()

    def now(self) -> float:
        """The Field's wall time (seconds since the epoch)."""
        return self._now()

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

    def handle(
        self,
        body: Any,
        *,
        token: str | None,
        operation: str | None = None,
        rap: RapCall | None = None,
    ) -> Outcome:
        """Run one enveloped operation; ``operation`` is the endpoint's, if any; ``rap``
        the RAP invocation it came in, if it did."""
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
            now = self._entry_time()
            epoch = self._next_epoch(envelope.epoch, now)
            bearer = token if registering else None  # REGISTER: proof of a retired id
            outcome = handler(Context(envelope, agent, epoch, now, bearer, rap))
            if agent is not None and agent.status == "failed" and self._may_write(outcome):
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
        now = self._entry_time()
        epoch = self._next_epoch(0, now)
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

    def declare_failed(self, token: str | None, agent_id: str, body: Any) -> Outcome:
        """The operator declares a registered agent failed (an extension): the same
        ``agent.failed`` entry as a liveness failure, its tasks released the same way;
        ``{"status": "unchanged"}`` if it is failed already."""
        authority.require_operator(
            self.authenticate(token),
            "only the operator declares an agent failed: this needs the operator token",
        )
        given = validation.fail_request(body)
        if agent_id not in self.state.agents:
            raise NotFound(
                f"no agent {validation.shown(agent_id)} is registered in this Field",
                code=Code.AGENT_NOT_FOUND,
                suggested_action="List the agents with GET /v1/agents.",
            )
        reason = OPERATOR_FAILED if given is None else f"{OPERATOR_FAILED}: {given}"
        return self.fail_agent(agent_id, reason)

    def recover_agent(self, agent_id: str) -> Outcome:
        """A failed agent is back (it reconnected); no-op if it is not failed."""
        agent = self.state.agents.get(agent_id)
        if agent is None or agent.status != "failed":
            return Outcome({"status": "unchanged"})
        now = self._entry_time()
        epoch = self._next_epoch(0, now)
        entries = [LogEntry(epoch, "agent.recovered", {"agent_id": agent_id}, agent_id, now)]
        self._commit(epoch, entries)
        return Outcome({"status": "recovered", "epoch": epoch}, entries)

    def _entry_time(self) -> float:
        """The timestamp of the next entries: wall time, but never before the last entry's."""
        return max(self.state.last_ts, self._now())

    @property
    def has_operator(self) -> bool:
        """Whether the Field was given an operator token (without one it has no operator)."""
        return self._operator_hash is not None

    def is_operator(self, token: str) -> bool:
        """Whether ``token`` is the operator's (constant time; no state is read)."""
        return self._is_operator(token)

    def _is_operator(self, token: str) -> bool:
        return self._operator_hash is not None and hmac.compare_digest(
            self._operator_hash, hash_token(token)
        )

    def _next_epoch(self, received: int, now: float) -> int:
        """The next operation's epoch; while writes are refused, never past the reservation."""
        clock = self.state.clock
        limit = clock.reserved if self.writes_refused is not None else MAX_EPOCH
        return clock.next(received, now, limit=limit)

    def _may_write(self, outcome: Outcome) -> bool:
        """Whether a side entry (a failed agent's recovery) may join ``outcome``.

        A read must not become a write while writes are refused.
        """
        return self.writes_refused is None or bool(outcome.entries)

    def _commit(self, epoch: int, entries: list[LogEntry]) -> None:
        """Advance the clock to ``epoch`` and apply ``entries``: the only place state changes.

        A write is refused here, before anything changes, while the log cannot
        be written or when the clock could not move (:meth:`LamportClock.frozen`).
        """
        clock = self.state.clock
        if entries:
            if self.writes_refused is not None:
                raise self.writes_refused()
            if clock.frozen(epoch):
                raise clock.overflow_error()
        reserved = clock.advance(epoch)
        if reserved is not None:
            entries.append(LogEntry(epoch, "clock.reserved", {"until": reserved}, ts=self._now()))
        try:
            for entry in entries:
                self.state.apply(entry)
        except Exception:
            self.broken = True
            raise

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
            "relevance": {
                "weights": self.state.index.weights.name,
                "recommended_min_relevance": self.state.index.weights.threshold,
            },
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
        ticket = registration.admit(self, request, ctx)  # the policy, and authority
        if request["id"] == OPERATOR_ID or request["id"].startswith(sources.AGENT_PREFIX):
            whose = "the operator's" if request["id"] == OPERATOR_ID else "inbound sources'"
            raise StateError(
                f"agent id {request['id']!r} is reserved ({whose}); no agent may register it",
                code=Code.AGENT_ID_TAKEN,
                suggested_action="Register under a different id.",
                details={"agent_id": request["id"], "reserved": True},
            )
        if request["id"] in self.state.agents:
            raise StateError(
                f"agent id {request['id']!r} is already registered",
                code=Code.AGENT_ID_TAKEN,
                suggested_action="Register under a different id.",
            )
        self._require_registrant(request["id"], ctx)
        registration.require_room(self)
        token = self._ids.token()
        agent = {
            "id": request["id"],
            "role": request["role"],
            "interests": request["interests"],
            "current_task_id": request["current_task_id"],
            "registered_epoch": ctx.epoch,
            "authority": request["authority"],
        }
        data: dict[str, Any] = {"agent": agent, "token_hash": hash_token(token)}
        if ticket is not None:  # one use of it, counted with the registration itself
            data["registration_token"] = ticket.id
        entry = LogEntry(ctx.epoch, "agent.registered", data, agent_id=request["id"], ts=ctx.now)
        response = {
            "status": "registered",
            "agent": {**agent, "status": "idle"},
            "field_capabilities": self.capabilities(),
            "rejection_reason": None,
            "token": token,
            "epoch": ctx.epoch,
        }
        return Outcome(response, [entry])

    def _require_registrant(self, agent_id: str, ctx: Context) -> None:
        """Refuse a retired id unless its last registrant (or the operator) takes it back.

        An id is never reused by a different registrant: the units recorded
        under it would become the newcomer's own. Its registrant proves
        itself with the token DEREGISTER revoked, sent as the bearer token.
        """
        last_token = self.state.retired.get(agent_id)
        if last_token is None or ctx.agent is OPERATOR_RECORD:
            return
        if ctx.bearer and hmac.compare_digest(last_token, hash_token(ctx.bearer)):
            return
        raise StateError(
            f"agent id {agent_id!r} belonged to an agent that deregistered; "
            "only that agent (with its last token) or the operator may register it again",
            code=Code.AGENT_ID_TAKEN,
            suggested_action="Register under a different id, or send the id's last token "
            "as the bearer token to take it back.",
        )

    def _deregister(self, ctx: Context) -> Outcome:
        target = validation.deregister_payload(ctx.envelope.payload)
        if target == OPERATOR_ID:
            raise AuthError(
                "the operator is not a registered agent and cannot deregister",
                code=Code.FORBIDDEN,
                recoverable=False,
                suggested_action="Remove the operator token from the configuration instead.",
            )
        by_operator = ctx.agent is OPERATOR_RECORD
        if target != ctx.envelope.agent_id and not by_operator:
            raise AuthError(
                "an agent can only deregister itself (the operator may deregister any)",
                code=Code.FORBIDDEN,
                recoverable=False,
                suggested_action="Send DEREGISTER from the agent that leaves.",
            )
        if target not in self.state.agents:  # only the operator names another agent
            raise NotFound(
                f"no agent {target!r} is registered in this Field",
                code=Code.AGENT_NOT_FOUND,
                suggested_action="List the agents with GET /v1/agents.",
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
        # the actor is whoever sent it: the agent itself, or the operator
        actor = OPERATOR_ID if by_operator else target
        data = {"agent_id": target}
        entries.append(LogEntry(ctx.epoch, "agent.deregistered", data, agent_id=actor, ts=ctx.now))
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
            if relation["type"] == "supersedes":
                authority.require_supersede(self.state, ctx.agent, target, "superseding")
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
                    f"{shorten(unit['content'], 80)!r} vs "
                    f"{shorten(self.state.units[target]['content'], 80)!r}"
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

    # -- SUBSCRIBE and durable deliveries (field/core/subscribe.py) -------------

    def active_subscription(self, subscription_id: str, agent_id: str) -> dict[str, Any]:
        """The caller's subscription, which must still be active (INVALID_TRANSITION if not)."""
        return subscribe.active_subscription(self.state, subscription_id, agent_id)

    def streamable_subscription(
        self, subscription_id: str, agent_id: str, cursor: str | None
    ) -> dict[str, Any]:
        """The caller's subscription a stream may read from ``cursor``: active, or
        cancelled after the cursor (it owes what came before its end)."""
        return subscribe.streamable_subscription(self, subscription_id, agent_id, cursor)

    # What the sender of the deliveries writes. ``term``: the term under which it holds the
    # deliveries' lease, with several nodes (None: a Field of one node, nothing to check).
    # A sender whose term is below the newest the log holds is answered ``superseded``
    # and nothing is written: another node took the deliveries over after it.

    def claim_deliveries(self, term: int, node: str) -> Outcome:
        """``node`` took the deliveries' lease under ``term``: a ``delivery.term`` entry,
        written before it sends anything (``unchanged`` if the log holds it already)."""
        return self._superseded(term) or self.system(
            lambda epoch, now: subscribe.term_entries(self, term, node, epoch, now)
        )

    def ack_deliveries(self, positions: dict[str, int], term: int | None = None) -> Outcome:
        """Deliveries acknowledged up to ``positions`` (by subscription): one entry for all."""
        return self._superseded(term) or self.system(
            lambda epoch, now: subscribe.ack_entries(self, positions, epoch, now, term)
        )

    def change_delivery(
        self, subscription_id: str, action: str, reason: str | None, term: int | None = None
    ) -> Outcome:
        """Move a durable delivery's state (``fail``, ``recover``, ``suspend``, ``end``)."""
        return self._superseded(term) or self.system(
            lambda epoch, now: subscribe.change_entries(
                self, subscription_id, action, reason, epoch, now, term
            )
        )

    def _superseded(self, term: int | None) -> Outcome | None:
        """The answer to a sender whose ``term`` is below the log's newest (None: it may
        write)."""
        newest = self.state.delivery_term
        if term is None or term >= newest:
            return None
        return Outcome({"status": "superseded", "term": newest})

    def cancel_rap(
        self, agent_id: str, group_id: str, tool_call_id: str | None, reason: str
    ) -> Outcome:
        """Cancel the agent's RAP subscriptions of thread ``group_id`` (one call's, if given)
        and end their deliveries: the runtime let go of them, they owe it nothing."""
        return self.system(
            lambda epoch, now: subscribe.cancel_entries(
                self, agent_id, group_id, tool_call_id, reason, epoch, now
            )
        )

    def forget_rap(self, subscription_id: str, reason: str, term: int | None = None) -> Outcome:
        """A RAP runtime no longer knows a subscription: cancel it, end its delivery (the
        sender's report, fenced by its ``term`` as :meth:`ack_deliveries` is)."""
        return self._superseded(term) or self.system(
            lambda epoch, now: subscribe.forgotten_entries(
                self, subscription_id, reason, epoch, now, term
            )
        )

    def expire_subscriptions(self, agent_id: str, idle: float) -> Outcome:
        """Cancel the agent's subscriptions whose timeout ``idle`` seconds of inactivity
        reached (``reason``: expired); the agent itself is not failed."""
        return self.system(
            lambda epoch, now: subscribe.expiry_entries(self, agent_id, idle, epoch, now)
        )

    def system(self, build: Callable[[int, float], list[LogEntry]]) -> Outcome:
        """An operation the server itself makes: ``build`` gives its entries, if any."""
        now = self._entry_time()
        epoch = self._next_epoch(0, now)
        entries = build(epoch, now)
        if not entries:
            return Outcome({"status": "unchanged"})
        self._commit(epoch, entries)
        return Outcome({"status": "ok", "epoch": epoch}, entries)

    # -- inbound event sources (field/core/sources.py) ---------------------------

    def define_source(self, token: str | None, body: Any) -> Outcome:
        """The operator defines (or redefines) a source."""
        return sources.define(self, token, body)

    def remove_source(self, token: str | None, name: str) -> Outcome:
        """The operator removes a source."""
        return sources.remove(self, token, name)

    def list_sources(self, token: str | None) -> list[sources.Source]:
        """The defined sources, by name; the operator's only."""
        sources.require_operator(self, token)
        return [self.state.sources[name] for name in sorted(self.state.sources)]

    def ingest_event(self, event: sources.Event) -> Outcome:
        """A verified inbound event becomes a unit of its source (or is refused)."""
        return sources.ingest(self, event)

    # -- registration tokens (field/core/registration.py) -------------------------

    def issue_registration_token(self, token: str | None, body: Any) -> Outcome:
        """The operator issues a registration token (its secret is in the response only)."""
        return registration.issue(self, token, body)

    def revoke_registration_token(self, token: str | None, token_id: str) -> Outcome:
        """The operator revokes a registration token."""
        return registration.revoke(self, token, token_id)

    def registration_tokens(self, token: str | None) -> dict[str, Any]:
        """The registration tokens held, for the operator."""
        return registration.listing(self, token)

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

    def agents_page(self, request: PageRequest, *, ids: Sequence[str] = ()) -> dict[str, Any]:
        """``GET /v1/agents``: a page of the registered agents by id (only ``ids`` if given)."""
        body: dict[str, Any] = {"status": "ok", "agents": [], "next": None, "epoch": self.epoch}
        page = listing.page_of(self.state, body, listing.agents(self.state, request, ids), request)
        body["agents"], body["next"] = page.items, page.next
        return body

    def conflicts_page(
        self, viewer: AgentRecord, request: PageRequest, **filters: Sequence[str]
    ) -> dict[str, Any]:
        """``GET /v1/conflicts``: a page of the conflicts ``viewer`` may see that match
        ``filters`` (``statuses``, ``types``, ``involving_agents``), oldest first."""
        body: dict[str, Any] = {"status": "ok", "conflicts": [], "next": None, "epoch": self.epoch}
        candidates = listing.conflicts(self.state, viewer, request, **filters)
        page = listing.page_of(self.state, body, candidates, request)
        body["conflicts"], body["next"] = page.items, page.next
        return body

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
