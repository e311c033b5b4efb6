"""A small async client for a Field's HTTP binding.

::

    async with FieldClient("http://127.0.0.1:8765") as field:
        researcher = await field.register("researcher-01", "market_researcher")
        unit = await researcher.record(
            "finding", "EU HR SaaS grows 23% a year",
            purpose="Validate market size", confidence=0.8, reasoning="three reports",
        )
        context = await researcher.attune(max_units=10)

There is one method per operation (``record``, ``attune``, ``detect``,
``merge``, ``subscribe``/``unsubscribe``/``subscriptions``, ``replay``,
``compact``, ``session``, ``coordinate``, ``handoff``, ``deregister``), each a
thin layer over :meth:`AgentClient.send` that builds the payload of
``protocol/README.md`` and returns the response payload as a dict, and one
per GET endpoint (``agents``, ``conflicts``). An error response raises
:class:`FieldClientError` carrying the spec's error body.

Lists come in pages (``after``, ``limit``, ``next``): each list method
returns one page, and :meth:`AgentClient.every` follows ``next`` to the end::

    everyone = await researcher.every(researcher.agents, "agents")
    mine = await researcher.every(researcher.coordinate, "tasks", action="list")

Every call sends a full envelope (spec 5.1) and keeps the agent's Lamport
clock: the envelope carries the highest epoch the agent has seen, and
each response's ``epoch`` moves it forward.

A request the Field turns away before running it (``503 OVERLOADED`` or
``429 RATE_LIMITED``, each with ``Retry-After``) is sent again after the
wait it names, at most ``retries`` times (3 by default; 0 never), each wait
at most ``max_retry_wait`` seconds; past that the error is raised, with the
wait the Field asked for in :attr:`FieldClientError.retry_after`.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
import orjson

__all__ = ["AgentClient", "FieldClient", "FieldClientError"]


class _Unset:
    """Marker for "argument not given" where ``None`` is a meaningful value."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that were given (not None): optional payload fields left out."""
    return {key: value for key, value in fields.items() if value is not None}


#: How the client waits before sending a refused request again.
_sleep = asyncio.sleep
#: Error codes of requests the Field refused before running them: safe to send again.
RETRIED_CODES = frozenset({"OVERLOADED", "RATE_LIMITED"})


class FieldClientError(Exception):
    """The Field answered with an error response (spec 8.1)."""

    def __init__(
        self, status: int, body: dict[str, Any], *, retry_after: float | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.code = body.get("code")
        #: seconds the Field asked the client to wait (``Retry-After``), if it did
        self.retry_after = retry_after
        super().__init__(f"{status} {self.code}: {body.get('message')}")


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header in seconds: delay-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class FieldClient:
    """Connection to one Field; makes :class:`AgentClient` handles."""

    def __init__(
        self,
        base_url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout: float | None = None,
        retries: int = 3,
        max_retry_wait: float = 30.0,
    ) -> None:
        """``timeout`` bounds each request in seconds (``None``: aiohttp's default);
        ``retries`` and ``max_retry_wait`` say how a refused request is sent again."""
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.max_retry_wait = max_retry_wait
        self._session = session
        self._owns_session = session is None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> FieldClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.timeout) if self.timeout else None
            self._session = (
                aiohttp.ClientSession(timeout=timeout) if timeout else aiohttp.ClientSession()
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    def envelope(
        self,
        operation: str,
        agent_id: str,
        payload: dict[str, Any],
        *,
        epoch: int = 0,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        return {
            "protocol": "akashik",
            "version": "0.1.0",
            "id": f"msg-{next(self._ids)}",
            "operation": operation,
            "agent_id": agent_id,
            "session_id": session_id,
            "epoch": epoch,
            "payload": payload,
        }

    async def request(
        self, method: str, path: str, *, body: Any = None, token: str | None = None
    ) -> dict[str, Any]:
        """One HTTP exchange; returns the JSON body or raises FieldClientError.

        A refusal with ``Retry-After`` (``OVERLOADED``, ``RATE_LIMITED``: nothing ran)
        is sent again after that wait, plus up to a tenth more at random so that the
        clients refused together do not come back together.
        """
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else orjson.dumps(body)
        for attempt in itertools.count():
            try:
                return await self._exchange(method, path, data, headers)
            except FieldClientError as error:
                wait = error.retry_after
                if (
                    error.code not in RETRIED_CODES
                    or wait is None
                    or attempt >= self.retries
                    or wait > self.max_retry_wait
                ):
                    raise
                await _sleep(wait * (1 + random.random() / 10))
        raise AssertionError("unreachable")

    async def _exchange(
        self, method: str, path: str, data: bytes | None, headers: dict[str, str]
    ) -> dict[str, Any]:
        async with self.session.request(
            method, self.base_url + path, data=data, headers=headers
        ) as response:
            payload: dict[str, Any] = orjson.loads(await response.read())
            if response.status >= 400:
                wait = retry_after_seconds(response.headers.get("Retry-After"))
                raise FieldClientError(response.status, payload, retry_after=wait)
            return payload

    async def register(
        self,
        agent_id: str,
        role: str,
        *,
        interests: list[str] | None = None,
        current_task_id: str | None = None,
        required_operations: list[str] | None = None,
        authority: int | None = None,
        operator_token: str | None = None,
        previous_token: str | None = None,
        registration_token: str | None = None,
    ) -> AgentClient:
        """REGISTER ``agent_id``; returns its handle, holding the new token.

        An ``authority`` above 4 needs the Field's ``operator_token``. An id
        that deregistered is retired: only its last token (``previous_token``,
        the one DEREGISTER revoked) or the operator's registers it again. A
        Field whose registration is ``token`` needs a ``registration_token``
        the operator issued.
        """
        payload: dict[str, Any] = {"id": agent_id, "role": role}
        payload |= _given(
            interests=interests,
            current_task_id=current_task_id,
            required_operations=required_operations,
            authority=authority,
            registration_token=registration_token,
        )
        body = self.envelope("REGISTER", agent_id, payload)
        bearer = operator_token or previous_token
        response = await self.request("POST", "/v1/register", body=body, token=bearer)
        agent = AgentClient(self, agent_id, response["token"], role=role)
        agent.registration = response
        agent.epoch = response["epoch"]
        return agent

    def agent(self, agent_id: str, token: str, *, role: str | None = None) -> AgentClient:
        """A handle for an agent registered earlier (or elsewhere) whose token is known.

        Without ``role``, the first call that needs it looks it up
        (:meth:`AgentClient.refresh`).
        """
        return AgentClient(self, agent_id, token, role=role)

    async def status(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/field/status")


class AgentClient:
    """One registered agent: its token, role and Lamport clock.

    ``session_id`` is put in every envelope (RECORD and COORDINATE ``create``
    use it, spec 5.1); :meth:`session` does not change it, set it yourself.
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
        self.registration: dict[str, Any] = {}

    def __repr__(self) -> str:  # never show the token
        return f"AgentClient({self.id!r}, role={self.role!r}, epoch={self.epoch})"

    async def send(
        self,
        operation: str,
        payload: dict[str, Any],
        *,
        session_id: str | None | _Unset = UNSET,
    ) -> dict[str, Any]:
        """Send one operation; returns its response payload.

        ``session_id`` overrides :attr:`session_id` for this envelope only.
        """
        session = self.session_id if isinstance(session_id, _Unset) else session_id
        body = self.field.envelope(
            operation, self.id, payload, epoch=self.epoch, session_id=session
        )
        path = f"/v1/{operation.lower()}"
        response = await self.field.request("POST", path, body=body, token=self.token)
        if isinstance(response.get("epoch"), int):
            self.epoch = max(self.epoch, response["epoch"])
        return response

    async def record(
        self,
        memory_type: str,
        content: str,
        *,
        purpose: str,
        confidence: float | None = None,
        reasoning: str | None = None,
        mode: str = "committed",
        task_id: str | None = None,
        relations: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """RECORD a memory unit (spec 6.3); ``extra`` goes into the payload as is."""
        payload: dict[str, Any] = {
            "mode": mode,
            "type": memory_type,
            "content": content,
            "intent": {"purpose": purpose, "task_id": task_id},
            **extra,
        }
        if confidence is not None or reasoning is not None:
            payload["confidence"] = _given(score=confidence, reasoning=reasoning)
        if relations:
            payload["relations"] = relations
        return await self.send("RECORD", payload)

    async def attune(
        self, *, max_units: int = 10, role: str | None = None, **options: Any
    ) -> dict[str, Any]:
        """ATTUNE (spec 6.4); scope fields and the payload's own fields may both be given.

        ``context_hint``, ``format`` and ``since_epoch`` go into the payload,
        everything else into the scope. To poll, pass ``since_epoch`` = the
        ``epoch`` of the previous poll's response (0 at first).
        """
        payload_keys = {"context_hint", "format", "since_epoch"}
        if role is None and self.role is None:
            await self.refresh()
        scope = {"role": role or self.role, "max_units": max_units}
        payload: dict[str, Any] = {}
        for key, value in options.items():
            (payload if key in payload_keys else scope)[key] = value
        payload["scope"] = scope
        return await self.send("ATTUNE", payload)

    async def detect(
        self,
        mode: str = "list",
        *,
        target_id: str | None = None,
        after: str | None = None,
        limit: int | None = None,
        **filters: Any,
    ) -> dict[str, Any]:
        """DETECT (spec 6.5): ``check`` a unit, ``scan`` the Field or ``list`` conflicts.

        ``filters`` (``status``, ``types``, ``involving_agents``) form the filter;
        ``after`` and ``limit`` page a ``list``.
        """
        payload: dict[str, Any] = {"mode": mode}
        payload |= _given(target_id=target_id, after=after, limit=limit)
        if filters:
            payload["filter"] = filters
        return await self.send("DETECT", payload)

    async def merge(
        self,
        conflict_id: str,
        strategy: str,
        *,
        rationale: str,
        winner_id: str | None = None,
        synthesis: str | None = None,
        quorum: int | None = None,
    ) -> dict[str, Any]:
        """MERGE (spec 6.6): resolve, escalate or vote on a conflict."""
        resolution = {"rationale": rationale}
        resolution |= _given(winner_id=winner_id, synthesis=synthesis, quorum=quorum)
        payload = {"conflict_id": conflict_id, "strategy": strategy, "resolution": resolution}
        return await self.send("MERGE", payload)

    async def subscribe(
        self,
        events: list[str],
        *,
        min_relevance: float | None = None,
        debounce_ms: int | None = None,
        include_own: bool | None = None,
    ) -> dict[str, Any]:
        """SUBSCRIBE ``subscribe`` (spec 6.7); the response names the new subscription."""
        subscription: dict[str, Any] = {"events": events}
        subscription |= _given(
            min_relevance=min_relevance, debounce_ms=debounce_ms, include_own=include_own
        )
        return await self.send("SUBSCRIBE", {"action": "subscribe", "subscription": subscription})

    async def unsubscribe(self, subscription_id: str) -> dict[str, Any]:
        """SUBSCRIBE ``unsubscribe``: cancel one of this agent's subscriptions."""
        payload = {"action": "unsubscribe", "subscription": {"id": subscription_id}}
        return await self.send("SUBSCRIBE", payload)

    async def subscriptions(self) -> dict[str, Any]:
        """SUBSCRIBE ``list``: this agent's subscriptions."""
        return await self.send("SUBSCRIBE", {"action": "list"})

    async def replay(
        self, target_type: str, target_id: str, *, depth: str = "summary"
    ) -> dict[str, Any]:
        """REPLAY (spec 6.8): the history of a task, unit, decision, conflict or session."""
        payload = {"target_type": target_type, "target_id": target_id, "depth": depth}
        return await self.send("REPLAY", payload)

    async def compact(self, strategy: str, **criteria: Any) -> dict[str, Any]:
        """COMPACT (spec 6.9); ``criteria`` (``max_age_epochs``, ``session_id``,
        ``types``, ``status``) form the filter, which must name at least one."""
        return await self.send("COMPACT", {"strategy": strategy, "filter": criteria})

    async def session(
        self, action: str, session_id: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """SESSION: ``create`` (with ``name``), ``invite`` and ``uninvite`` (with
        ``invitees``), ``join`` (once invited), ``leave``, ``pause``, ``resume``,
        ``end`` or ``list``; ``fields`` are ``name``, ``purpose``, ``reason``,
        ``invitees`` (agent ids; ``create`` may invite at once) and ``visibility``."""
        payload = {"action": action, **_given(session_id=session_id), **fields}
        return await self.send("SESSION", payload)

    async def coordinate(
        self,
        action: str,
        task_id: str | None = None,
        *,
        session_id: str | None | _Unset = UNSET,
        **fields: Any,
    ) -> dict[str, Any]:
        """COORDINATE: ``create`` (with ``title``), ``assign`` (with ``assignee``),
        ``start``, ``block``, ``unblock``, ``complete``, ``fail``, ``release``,
        ``cancel`` or ``list``. A task is created in the envelope's session:
        :attr:`session_id`, or ``session_id`` given here."""
        payload = {"action": action, **_given(task_id=task_id), **fields}
        return await self.send("COORDINATE", payload, session_id=session_id)

    async def handoff(
        self,
        task_id: str,
        to_agent_id: str,
        *,
        notes: str | None = None,
        max_units: int | None = None,
        include_units: list[str] | None = None,
    ) -> dict[str, Any]:
        """HANDOFF ``task_id`` to ``to_agent_id`` with a context package."""
        payload: dict[str, Any] = {"task_id": task_id, "to_agent_id": to_agent_id}
        payload |= _given(notes=notes)
        context = _given(max_units=max_units, include_units=include_units)
        if context:
            payload["context"] = context
        return await self.send("HANDOFF", payload)

    async def deregister(self) -> dict[str, Any]:
        """DEREGISTER (spec 6.2): the token is revoked."""
        return await self.send("DEREGISTER", {"agent_id": self.id})

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
    ) -> dict[str, Any]:
        """A page of ``GET /v1/agents``: registered agents by id, only ``ids`` if given."""
        return await self.get("/v1/agents", after=after, limit=limit, id=ids)

    async def conflicts(
        self,
        *,
        status: list[str] | None = None,
        types: list[str] | None = None,
        involving_agents: list[str] | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """A page of ``GET /v1/conflicts`` (default: the unresolved ones), oldest first."""
        return await self.get(
            "/v1/conflicts",
            status=status,
            type=types,
            involving_agent=involving_agents,
            after=after,
            limit=limit,
        )

    async def every(
        self, read: Callable[..., Awaitable[dict[str, Any]]], key: str, **arguments: Any
    ) -> list[dict[str, Any]]:
        """Every item of a paged list: ``read(after=..., **arguments)`` page after page,
        following ``next`` until it is null; ``key`` names the list in each page."""
        items: list[dict[str, Any]] = []
        after = None
        while True:
            page = await read(**arguments, **_given(after=after))
            items += page[key]
            after = page["next"]
            if after is None:
                return items

    async def refresh(self) -> dict[str, Any]:
        """Fetch this agent's record (``GET /v1/agents``) and take its ``role``."""
        listing = await self.agents(ids=[self.id])
        for agent in listing["agents"]:
            if agent["id"] == self.id:
                self.role = agent["role"]
                record: dict[str, Any] = agent
                return record
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
