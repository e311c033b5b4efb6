""":class:`AgentClient`: one registered agent, one typed method per operation.

Each method builds the payload ``protocol/README.md`` describes from keyword
arguments whose defaults say what the protocol leaves optional, sends it in
an envelope the agent fills in itself (message ``id``, its Lamport ``epoch``,
its ``session_id``) and returns the response payload: a typed dict of
:mod:`field.client.responses` for the main operations (SUBSCRIBE ``subscribe``
returns a :class:`~field.client.types.Subscription`), the plain dict of its
schema for the others. An error response raises
:class:`~field.client.errors.FieldClientError`; a Field that cannot be reached,
:class:`~field.client.errors.FieldUnavailable`.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, cast, overload
from urllib.parse import urlencode

from .errors import FieldClientError
from .responses import (
    AgentRecord,
    AgentsPage,
    AttuneResponse,
    ConflictsPage,
    CoordinateResponse,
    DetectResponse,
    HandoffResponse,
    MergeResponse,
    RecordResponse,
    RegisterResponse,
)
from .stream import NotificationStream
from .types import (
    AttuneFormat,
    CompactStrategy,
    ConflictStatus,
    ConflictType,
    DetectMode,
    MemoryType,
    Notification,
    Priority,
    Reconnect,
    Relation,
    ReplayDepth,
    ReplayTarget,
    SessionAction,
    Strategy,
    StreamEvent,
    Subscription,
    SubscriptionEvent,
    TaskAction,
    TemporalLayer,
    Transport,
    UnitStatus,
)

if TYPE_CHECKING:
    from .connection import FieldClient


class _Unset:
    """Marker for "argument not given" where ``None`` is a meaningful value."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that were given (not None): optional payload fields left out."""
    return {key: value for key, value in fields.items() if value is not None}


def _subscription_id(subscription: str | Subscription) -> str:
    return subscription.id if isinstance(subscription, Subscription) else subscription


def _relations(relations: Iterable[Relation | Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [r.to_wire() if isinstance(r, Relation) else dict(r) for r in relations]


class AgentClient:
    """One registered agent: its token, role and Lamport clock.

    ``epoch`` is the highest epoch the agent has seen (responses and
    notifications move it forward); every envelope carries it. ``session_id``
    is put in every envelope (RECORD and COORDINATE ``create`` use it, spec
    5.1); :meth:`session` does not change it: set it yourself, or pass
    ``session_id=`` to :meth:`coordinate`. ``info`` is the agent's record
    (``agent.json``) when known (:meth:`FieldClient.register` and
    :meth:`FieldClient.connect` set it; :meth:`refresh` fetches it), ``None``
    otherwise; ``registration`` is the REGISTER response when this handle
    registered the agent; ``reused`` is true for an agent
    :meth:`FieldClient.connect` found registered already.
    """

    def __init__(
        self, field: FieldClient, agent_id: str, token: str, *, role: str | None = None
    ) -> None:
        self.field = field
        self.id = agent_id
        self.token = token
        self.role = role
        self.epoch = 0
        self.session_id: str | None = None
        self.registration: RegisterResponse | None = None
        self.info: AgentRecord | None = None
        self.reused = False
        #: the ``since_epoch`` of the next :meth:`poll`
        self.poll_epoch = 0
        #: creation cursors of subscriptions this client made that no stream has seen yet
        self.fresh_subscriptions: dict[str, str] = {}

    def __repr__(self) -> str:  # never show the token
        return f"AgentClient({self.id!r}, role={self.role!r}, epoch={self.epoch})"

    def observe(self, epoch: int) -> None:
        """Move the agent's clock to ``epoch`` if it is later (Lamport: max of both)."""
        if epoch > self.epoch:
            self.epoch = epoch

    async def send(
        self,
        operation: str,
        payload: dict[str, Any],
        *,
        session_id: str | None | _Unset = UNSET,
    ) -> dict[str, Any]:
        """Send one operation with this agent's envelope; returns its response payload.

        ``session_id`` overrides :attr:`session_id` for this envelope only.
        """
        session = self.session_id if isinstance(session_id, _Unset) else session_id
        body = self.field.envelope(
            operation, self.id, payload, epoch=self.epoch, session_id=session
        )
        path = f"/v1/{operation.lower()}"
        response = await self.field.request("POST", path, body=body, token=self.token)
        if isinstance(response.get("epoch"), int):
            self.observe(response["epoch"])
        return response

    # -- memory ------------------------------------------------------------------------

    @overload
    async def record(
        self,
        memory_type: MemoryType,
        content: str,
        *,
        purpose: str,
        confidence: float,
        reasoning: str,
        mode: Literal["committed"] = "committed",
        task_id: str | None = None,
        question: str | None = None,
        evidence: Sequence[str] | None = None,
        assumptions: Sequence[str] | None = None,
        relations: Iterable[Relation | Mapping[str, Any]] | None = None,
    ) -> RecordResponse: ...

    @overload
    async def record(
        self,
        memory_type: MemoryType,
        content: str,
        *,
        purpose: str,
        mode: Literal["draft"],
        confidence: float | None = None,
        reasoning: str | None = None,
        task_id: str | None = None,
        question: str | None = None,
        evidence: Sequence[str] | None = None,
        assumptions: Sequence[str] | None = None,
        relations: Iterable[Relation | Mapping[str, Any]] | None = None,
    ) -> RecordResponse: ...

    async def record(
        self,
        memory_type: MemoryType,
        content: str,
        *,
        purpose: str,
        confidence: float | None = None,
        reasoning: str | None = None,
        mode: Literal["committed", "draft"] = "committed",
        task_id: str | None = None,
        question: str | None = None,
        evidence: Sequence[str] | None = None,
        assumptions: Sequence[str] | None = None,
        relations: Iterable[Relation | Mapping[str, Any]] | None = None,
    ) -> RecordResponse:
        """RECORD a memory unit (spec 6.3); returns ``memory_unit_id``, ``epoch`` and the
        ``conflicts_detected`` its relations made.

        ``purpose`` (the intent) is always required. A committed unit (the
        default) needs ``confidence`` (a score in [0, 1]) **and** ``reasoning``
        (why that score); a ``mode="draft"`` unit may leave both out.
        ``evidence`` and ``assumptions`` go into the confidence; ``task_id`` and
        ``question`` into the intent. ``relations`` link to existing units:
        ``Relation("contradicts", unit_id)`` makes a conflict,
        ``Relation("supersedes", unit_id)`` replaces the unit. The envelope's
        session (:attr:`session_id`) scopes the unit to that session.
        """
        if mode == "committed" and (confidence is None or reasoning is None):
            raise TypeError(
                "a committed unit needs confidence= (a score in [0, 1]) and reasoning= "
                "(why); record it with mode='draft' to leave them out"
            )
        intent = {"purpose": purpose, **_given(task_id=task_id, question=question)}
        payload: dict[str, Any] = {
            "mode": mode,
            "type": memory_type,
            "content": content,
            "intent": intent,
        }
        scored = _given(
            score=confidence,
            reasoning=reasoning,
            evidence=None if evidence is None else list(evidence),
            assumptions=None if assumptions is None else list(assumptions),
        )
        if scored:
            payload["confidence"] = scored
        if relations is not None:
            payload["relations"] = _relations(relations)
        return cast(RecordResponse, await self.send("RECORD", payload))

    async def attune(
        self,
        *,
        max_units: int = 10,
        role: str | None = None,
        context_hint: str | None = None,
        since_epoch: int | None = None,
        format: AttuneFormat | None = None,
        interests: Sequence[str] | None = None,
        active_task_id: str | None = None,
        max_tokens: int | None = None,
        relevance_threshold: float | None = None,
        recency_weight: float | None = None,
        include_own: bool | None = None,
        include_archived: bool | None = None,
        temporal_layers: Sequence[TemporalLayer] | None = None,
        **scope: Any,
    ) -> AttuneResponse:
        """ATTUNE (spec 6.4): the units most relevant to this agent, ranked, and open conflicts.

        The scope's ``role`` defaults to the agent's registered role (known from
        :meth:`FieldClient.register` and :meth:`FieldClient.connect`; looked up
        once otherwise). ``interests`` and ``active_task_id`` default, on the
        Field, to the agent's registered ones. ``since_epoch`` polls: only units
        recorded after that epoch, oldest first (see :meth:`poll`).
        ``context_hint``, ``format`` and ``since_epoch`` go into the payload, the
        rest into the scope; ``scope`` passes fields this SDK does not know as they
        are (the Field refuses unknown ones).
        """
        if role is None and self.role is None:
            await self.refresh()
        fields = _given(
            interests=None if interests is None else list(interests),
            active_task_id=active_task_id,
            max_tokens=max_tokens,
            relevance_threshold=relevance_threshold,
            recency_weight=recency_weight,
            include_own=include_own,
            include_archived=include_archived,
            temporal_layers=None if temporal_layers is None else list(temporal_layers),
        )
        payload: dict[str, Any] = _given(
            context_hint=context_hint, since_epoch=since_epoch, format=format
        )
        payload["scope"] = {"role": role or self.role, "max_units": max_units, **fields, **scope}
        return cast(AttuneResponse, await self.send("ATTUNE", payload))

    async def poll(self, *, max_units: int = 100, **options: Any) -> AttuneResponse:
        """ATTUNE what was recorded since the previous poll (the first: everything), oldest
        first; :attr:`poll_epoch` keeps the place, so no unit comes twice or is skipped.

        ``options`` are :meth:`attune`'s. A page holding fewer units than are new
        (``context_budget.limited_by``) continues on the next poll.
        """
        response = await self.attune(max_units=max_units, since_epoch=self.poll_epoch, **options)
        self.poll_epoch = max(self.poll_epoch, response["epoch"])
        return response

    async def detect(
        self,
        mode: DetectMode = "list",
        *,
        target_id: str | None = None,
        status: Sequence[ConflictStatus] | None = None,
        types: Sequence[ConflictType] | None = None,
        involving_agents: Sequence[str] | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> DetectResponse:
        """DETECT (spec 6.5): ``check`` one unit (``target_id`` required), ``scan`` the Field,
        or ``list`` conflicts (a page: ``after``, ``limit``, then ``next``).

        ``status``, ``types`` and ``involving_agents`` filter the conflicts.
        """
        payload: dict[str, Any] = {"mode": mode}
        payload |= _given(target_id=target_id, after=after, limit=limit)
        conflict_filter = _given(
            status=None if status is None else list(status),
            types=None if types is None else list(types),
            involving_agents=None if involving_agents is None else list(involving_agents),
        )
        if conflict_filter:
            payload["filter"] = conflict_filter
        return cast(DetectResponse, await self.send("DETECT", payload))

    async def merge(
        self,
        conflict_id: str,
        strategy: Strategy,
        *,
        rationale: str,
        winner_id: str | None = None,
        synthesis: str | None = None,
        quorum: int | None = None,
    ) -> MergeResponse:
        """MERGE (spec 6.6): resolve, escalate or vote on a conflict, saying why (``rationale``).

        ``authority`` and ``vote`` need the ``winner_id``; ``synthesis`` needs the
        ``synthesis`` text (recorded as a new unit); ``quorum`` opens a vote.
        The computed strategies (``last_write_wins``, ``confidence_weighted``,
        ``evidence_count``) pick the winner themselves.
        """
        resolution = {"rationale": rationale}
        resolution |= _given(winner_id=winner_id, synthesis=synthesis, quorum=quorum)
        payload = {"conflict_id": conflict_id, "strategy": strategy, "resolution": resolution}
        return cast(MergeResponse, await self.send("MERGE", payload))

    # -- subscriptions -----------------------------------------------------------------

    async def subscribe(
        self,
        events: Iterable[SubscriptionEvent],
        *,
        name: str | None = None,
        min_relevance: float | None = None,
        debounce_ms: int | None = None,
        include_own: bool | None = None,
        filter: str | None = None,
        bindings: Mapping[str, Sequence[str]] | None = None,
        timeout: str | None = None,
        delivery: Mapping[str, Any] | None = None,
    ) -> Subscription:
        """SUBSCRIBE to ``events``; returns the :class:`Subscription`, for
        :meth:`notifications`.

        Subscriptions are durable: one made at every start of a program would
        be one more each time (and a WebSocket streams them all). Give it a
        ``name`` (1-100 of ``A-Z a-z 0-9 . _ : -``) and subscribing again with
        the same name and definition returns the same subscription
        (``created`` is ``False``); another definition under that name is
        ``409 SUBSCRIPTION_NAME_TAKEN``. ``min_relevance`` (0.45 recommended)
        drops events less relevant to this agent, ``debounce_ms`` folds the
        notifications of one entity in a window, ``include_own`` also notifies
        the agent's own events, ``filter`` is a CEL expression, ``bindings``
        seal its allow lists, ``timeout`` (``"72h"``) expires it after that long
        without activity, and ``delivery`` (``{"type": "webhook", "url": ...}``)
        has the Field POST the notifications instead of streaming them.
        """
        subscription: dict[str, Any] = {"events": list(events)}
        subscription |= _given(
            name=name,
            min_relevance=min_relevance,
            debounce_ms=debounce_ms,
            include_own=include_own,
            filter=filter,
            bindings=None if bindings is None else {k: list(v) for k, v in bindings.items()},
            timeout=timeout,
            delivery=None if delivery is None else dict(delivery),
        )
        payload = {"action": "subscribe", "subscription": subscription}
        made = Subscription.from_response(await self.send("SUBSCRIBE", payload))
        if made.created is not False:  # a new one: a stream owes it from its creation
            self.fresh_subscriptions[made.id] = made.cursor
        return made

    async def unsubscribe(self, subscription: str | Subscription) -> dict[str, Any]:
        """SUBSCRIBE ``unsubscribe``: cancel one of this agent's subscriptions (its streams
        end after what it owes)."""
        subscription_id = _subscription_id(subscription)
        self.fresh_subscriptions.pop(subscription_id, None)
        payload = {"action": "unsubscribe", "subscription": {"id": subscription_id}}
        return await self.send("SUBSCRIBE", payload)

    async def subscriptions(self) -> dict[str, Any]:
        """SUBSCRIBE ``list``: this agent's active subscriptions (``subscriptions``)."""
        return await self.send("SUBSCRIBE", {"action": "list"})

    async def resume_delivery(self, subscription: str | Subscription) -> dict[str, Any]:
        """SUBSCRIBE ``resume``: start a ``failing`` or ``suspended`` webhook delivery again."""
        subscription_id = _subscription_id(subscription)
        payload = {"action": "resume", "subscription": {"id": subscription_id}}
        return await self.send("SUBSCRIBE", payload)

    @overload
    def notifications(
        self,
        *subscriptions: Subscription | str,
        since: str | Mapping[str, str] | None = None,
        cursor_file: str | os.PathLike[str] | None = None,
        transport: Transport = "ws",
        reconnect: Reconnect | None = None,
        heartbeat: float = 30.0,
        max_message_bytes: int = 32 * 1024 * 1024,
        control: Literal[False] = False,
    ) -> NotificationStream[Notification]: ...

    @overload
    def notifications(
        self,
        *subscriptions: Subscription | str,
        since: str | Mapping[str, str] | None = None,
        cursor_file: str | os.PathLike[str] | None = None,
        transport: Transport = "ws",
        reconnect: Reconnect | None = None,
        heartbeat: float = 30.0,
        max_message_bytes: int = 32 * 1024 * 1024,
        control: Literal[True],
    ) -> NotificationStream[StreamEvent]: ...

    def notifications(
        self,
        *subscriptions: Subscription | str,
        since: str | Mapping[str, str] | None = None,
        cursor_file: str | os.PathLike[str] | None = None,
        transport: Transport = "ws",
        reconnect: Reconnect | None = None,
        heartbeat: float = 30.0,
        max_message_bytes: int = 32 * 1024 * 1024,
        control: bool = False,
    ) -> NotificationStream[Notification] | NotificationStream[StreamEvent]:
        """The agent's notifications, as an async iterator that reconnects by itself.

        .. code-block:: python

            import asyncio

            from field.client import FieldClient


            async def main() -> None:
                async with FieldClient("http://127.0.0.1:8765") as field:
                    me = await field.connect("watcher-01", role="lead", token_file="watcher.token")
                    # include_own: notified of its own units too (by default, only others')
                    news = await me.subscribe(["memory.recorded"], name="mine", include_own=True)
                    unit = await me.record(
                        "observation",
                        "A stream resumes from its cursor file",
                        purpose="show a stream",
                        confidence=0.9,
                        reasoning="a demo",
                    )
                    print("recorded", unit["memory_unit_id"])
                    # each run goes on after what the last one processed: nothing twice
                    async with me.notifications(news, cursor_file="news.cursors") as stream:
                        async for notification in stream:
                            print("notified", notification.event, notification.memory_unit_id)
                            break


            asyncio.run(main())

        Streams ``subscriptions`` (all of the agent's when none is given) over
        one WebSocket (``transport="sse"``: one Server-Sent Events stream each,
        for the subscriptions active when it starts).

        **Where each subscription starts**: ``since`` (one cursor for all, or
        subscription id → cursor), else what ``cursor_file`` kept from an
        earlier run, else the creation of a subscription this client just made
        (so nothing between ``subscribe`` and the first connection is missed),
        else now. With a ``cursor_file``, a :class:`Subscription` it holds no
        cursor for has had nothing processed yet: it starts from its creation.
        A named subscription found again (``created`` false) is not new:
        without ``since`` or a ``cursor_file`` it starts now. So a program that
        subscribes by name and keeps a ``cursor_file`` gets each event once,
        however often it starts (and wherever it stopped).

        **Resuming**: when the connection drops (the Field restarted or was
        killed, the network failed, the consumer fell behind: ``overflow``) the
        stream reconnects after a jittered, capped backoff (``reconnect``) and
        resumes after the last notification it yielded: nothing lost, nothing
        repeated. ``stream.cursors`` are where it stands; with ``cursor_file``
        they are also written there (mode 0600, replaced whole) each time the
        loop asks for the next notification, and when the stream closes
        without an error.

        **What it yields**: :class:`~field.client.types.Notification` objects.
        A subscription the Field cannot resume (``recovered: false``: a cursor
        of another Field, or ahead of its log) raises
        :class:`~field.client.errors.NotificationGap`, saying where the gap
        starts; iterate again to go on live. A refused token raises
        :class:`FieldClientError` (not retried);
        :class:`~field.client.errors.StreamUnavailable` is raised only if
        ``reconnect.give_up_after`` says so. With ``control=True`` the stream
        also yields ``Gap`` (instead of raising), ``Overflow``, ``Ended`` and
        ``Disconnected`` events. It ends when every subscription it was given
        has ended (cancelled, expired) or the agent deregistered.

        While it is connected the agent is live (no heartbeat requests are
        needed); ``heartbeat`` pings find a dead connection, and no message
        over ``max_message_bytes`` is read. Close it (``async with``, or
        ``await stream.aclose()``) when done.
        """
        return NotificationStream(
            self,
            [s.id if isinstance(s, Subscription) else s for s in subscriptions],
            origins={s.id: s.cursor for s in subscriptions if isinstance(s, Subscription)},
            since=since,
            cursor_file=cursor_file,
            transport=transport,
            control=control,
            reconnect=reconnect or Reconnect(),
            heartbeat=heartbeat,
            max_message_bytes=max_message_bytes,
        )

    # -- history -----------------------------------------------------------------------

    async def replay(
        self, target_type: ReplayTarget, target_id: str, *, depth: ReplayDepth = "summary"
    ) -> dict[str, Any]:
        """REPLAY (spec 6.8): the history of a task, unit, decision, conflict or session."""
        payload = {"target_type": target_type, "target_id": target_id, "depth": depth}
        return await self.send("REPLAY", payload)

    async def compact(
        self,
        strategy: CompactStrategy,
        *,
        max_age_epochs: int | None = None,
        session_id: str | None = None,
        types: Sequence[MemoryType] | None = None,
        status: Sequence[UnitStatus] | None = None,
    ) -> dict[str, Any]:
        """COMPACT (spec 6.9): ``archive``, ``summarize`` or ``purge`` the units every given
        criterion matches; at least one criterion is required. Needs authority 6."""
        criteria = _given(
            max_age_epochs=max_age_epochs,
            session_id=session_id,
            types=None if types is None else list(types),
            status=None if status is None else list(status),
        )
        return await self.send("COMPACT", {"strategy": strategy, "filter": criteria})

    # -- coordination ------------------------------------------------------------------

    async def session(
        self,
        action: SessionAction,
        session_id: str | None = None,
        *,
        name: str | None = None,
        purpose: str | None = None,
        reason: str | None = None,
        invitees: Sequence[str] | None = None,
        visibility: Mapping[str, Any] | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """SESSION: ``create`` (``name`` required; may invite ``invitees`` at once),
        ``invite`` and ``uninvite`` (``invitees``), ``join`` (once invited), ``leave``,
        ``pause``, ``resume``, ``end`` (each of these with ``session_id``) or ``list``
        (a page: ``after``, ``limit``). ``visibility`` (``create`` only) restricts
        memory types to roles or authority."""
        payload: dict[str, Any] = {"action": action}
        payload |= _given(
            session_id=session_id,
            name=name,
            purpose=purpose,
            reason=reason,
            invitees=None if invitees is None else list(invitees),
            visibility=None if visibility is None else dict(visibility),
            after=after,
            limit=limit,
        )
        return await self.send("SESSION", payload)

    async def coordinate(
        self,
        action: TaskAction,
        task_id: str | None = None,
        *,
        session_id: str | None | _Unset = UNSET,
        title: str | None = None,
        description: str | None = None,
        assignee: str | None = None,
        depends_on: Sequence[str] | None = None,
        priority: Priority | None = None,
        reason: str | None = None,
        result: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> CoordinateResponse:
        """COORDINATE a task: ``create`` (``title`` required), ``assign`` (``assignee``),
        ``start``, ``block``, ``unblock``, ``complete`` (with a ``result``), ``fail``,
        ``release``, ``cancel`` (each with ``task_id``) or ``list`` (a page). A task is
        created in the envelope's session: :attr:`session_id`, or ``session_id`` here."""
        payload: dict[str, Any] = {"action": action}
        payload |= _given(
            task_id=task_id,
            title=title,
            description=description,
            assignee=assignee,
            depends_on=None if depends_on is None else list(depends_on),
            priority=priority,
            reason=reason,
            result=result,
            after=after,
            limit=limit,
        )
        response = await self.send("COORDINATE", payload, session_id=session_id)
        return cast(CoordinateResponse, response)

    async def handoff(
        self,
        task_id: str,
        to_agent_id: str,
        *,
        notes: str | None = None,
        max_units: int | None = None,
        include_units: Sequence[str] | None = None,
    ) -> HandoffResponse:
        """HANDOFF ``task_id`` to ``to_agent_id`` with ``notes`` and a context package the
        Field assembles (``include_units`` first, up to ``max_units`` in all)."""
        payload: dict[str, Any] = {"task_id": task_id, "to_agent_id": to_agent_id}
        payload |= _given(notes=notes)
        context = _given(
            max_units=max_units,
            include_units=None if include_units is None else list(include_units),
        )
        if context:
            payload["context"] = context
        return cast(HandoffResponse, await self.send("HANDOFF", payload))

    async def feedback(
        self, useful: Iterable[str] = (), not_useful: Iterable[str] = ()
    ) -> dict[str, Any]:
        """FEEDBACK (extension): the units (ids) that were ``useful`` to this agent and those
        ``not_useful``, 1 to 64 in all; its relevance, pushed and attuned, learns from them.
        Returns ``judged`` and the totals so far (``useful_total``, ``not_useful_total``)."""
        items = [{"memory_unit_id": unit_id, "useful": True} for unit_id in useful]
        items += [{"memory_unit_id": unit_id, "useful": False} for unit_id in not_useful]
        return await self.send("FEEDBACK", {"items": items})

    async def deregister(self) -> dict[str, Any]:
        """DEREGISTER (spec 6.2): the token is revoked and the id retired (only this token,
        or the operator's, registers it again: :meth:`FieldClient.connect` does)."""
        return await self.send("DEREGISTER", {"agent_id": self.id})

    # -- reads -------------------------------------------------------------------------

    async def get(self, path: str, **params: Any) -> dict[str, Any]:
        """A GET endpoint with this agent's token (``/v1/agents``, ``/v1/conflicts``).

        ``params`` are its query parameters (a list repeats one); None leaves one out.
        """
        query = urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        return await self.field.request(
            "GET", f"{path}?{query}" if query else path, token=self.token
        )

    async def agents(
        self,
        *,
        after: str | None = None,
        limit: int | None = None,
        ids: list[str] | None = None,
    ) -> AgentsPage:
        """A page of ``GET /v1/agents``: registered agents by id, only ``ids`` if given."""
        return cast(AgentsPage, await self.get("/v1/agents", after=after, limit=limit, id=ids))

    async def conflicts(
        self,
        *,
        status: list[str] | None = None,
        types: list[str] | None = None,
        involving_agents: list[str] | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> ConflictsPage:
        """A page of ``GET /v1/conflicts`` (default: the unresolved ones), oldest first."""
        page = await self.get(
            "/v1/conflicts",
            status=status,
            type=types,
            involving_agent=involving_agents,
            after=after,
            limit=limit,
        )
        return cast(ConflictsPage, page)

    async def every(
        self, read: Callable[..., Awaitable[Mapping[str, Any]]], key: str, **arguments: Any
    ) -> list[dict[str, Any]]:
        """Every item of a paged list: ``read(after=..., **arguments)`` page after page,
        following ``next`` until it is null; ``key`` names the list in each page.

        .. code-block:: python

            import asyncio

            from field.client import FieldClient


            async def main() -> None:
                async with FieldClient("http://127.0.0.1:8765") as field:
                    me = await field.connect("census-01", role="clerk", token_file="census.token")
                    everyone = await me.every(me.agents, "agents", limit=100)
                    print("registered:", ", ".join(agent["id"] for agent in everyone))


            asyncio.run(main())
        """
        items: list[dict[str, Any]] = []
        after = None
        while True:
            page = await read(**arguments, **_given(after=after))
            items += page[key]
            after = page["next"]
            if after is None:
                return items

    async def refresh(self) -> AgentRecord:
        """Fetch this agent's record (``GET /v1/agents``) and take its ``role``."""
        listing = await self.agents(ids=[self.id])
        for agent in listing["agents"]:
            if agent["id"] == self.id:
                self.role = agent["role"]
                self.info = agent
                return agent
        raise FieldClientError(
            404,
            {
                "code": "AGENT_NOT_FOUND",
                "message": f"agent {self.id} is not registered",
                "operation": None,
                "recoverable": False,
                "suggested_action": "Register the agent again.",
            },
        )
