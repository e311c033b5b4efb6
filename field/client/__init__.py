"""A small async client for a Field's HTTP binding.

::

    async with FieldClient("http://127.0.0.1:8765") as field:
        researcher = await field.register("researcher-01", "market_researcher")
        unit = await researcher.record(
            "finding", "EU HR SaaS grows 23% a year",
            purpose="Validate market size", confidence=0.8, reasoning="three reports",
        )
        context = await researcher.attune(max_units=10)

Every call sends a full envelope (spec 5.1) and keeps the agent's Lamport
clock: the envelope carries the highest epoch the agent has seen, and
each response's ``epoch`` moves it forward.
"""

from __future__ import annotations

import itertools
from types import TracebackType
from typing import Any

import aiohttp
import orjson

__all__ = ["AgentClient", "FieldClient", "FieldClientError"]


class FieldClientError(Exception):
    """The Field answered with an error response (spec 8.1)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.code = body.get("code")
        super().__init__(f"{status} {self.code}: {body.get('message')}")


class FieldClient:
    """Connection to one Field; makes :class:`AgentClient` handles."""

    def __init__(self, base_url: str, *, session: aiohttp.ClientSession | None = None) -> None:
        self.base_url = base_url.rstrip("/")
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
            self._session = aiohttp.ClientSession()
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
        """One HTTP exchange; returns the JSON body or raises FieldClientError."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else orjson.dumps(body)
        async with self.session.request(
            method, self.base_url + path, data=data, headers=headers
        ) as response:
            payload: dict[str, Any] = orjson.loads(await response.read())
            if response.status >= 400:
                raise FieldClientError(response.status, payload)
            return payload

    async def register(
        self,
        agent_id: str,
        role: str,
        *,
        interests: list[str] | None = None,
        current_task_id: str | None = None,
        required_operations: list[str] | None = None,
    ) -> AgentClient:
        payload: dict[str, Any] = {"id": agent_id, "role": role}
        if interests is not None:
            payload["interests"] = interests
        if current_task_id is not None:
            payload["current_task_id"] = current_task_id
        if required_operations is not None:
            payload["required_operations"] = required_operations
        body = self.envelope("REGISTER", agent_id, payload)
        response = await self.request("POST", "/v1/register", body=body)
        agent = AgentClient(self, agent_id, response["token"], role=role)
        agent.registration = response
        agent.epoch = response["epoch"]
        return agent

    async def status(self) -> dict[str, Any]:
        return await self.request("GET", "/v1/field/status")


class AgentClient:
    """One registered agent: its token, role and Lamport clock."""

    def __init__(self, field: FieldClient, agent_id: str, token: str, *, role: str) -> None:
        self.field = field
        self.id = agent_id
        self.token = token
        self.role = role
        self.epoch = 0
        self.session_id: str | None = None
        self.registration: dict[str, Any] = {}

    async def send(self, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Send one operation; returns its response payload."""
        body = self.field.envelope(
            operation, self.id, payload, epoch=self.epoch, session_id=self.session_id
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
        payload: dict[str, Any] = {
            "mode": mode,
            "type": memory_type,
            "content": content,
            "intent": {"purpose": purpose, "task_id": task_id},
            **extra,
        }
        if confidence is not None or reasoning is not None:
            payload["confidence"] = {
                k: v for k, v in (("score", confidence), ("reasoning", reasoning)) if v is not None
            }
        if relations:
            payload["relations"] = relations
        return await self.send("RECORD", payload)

    async def attune(
        self, *, max_units: int = 10, role: str | None = None, **options: Any
    ) -> dict[str, Any]:
        """ATTUNE; scope fields and the payload's own fields may both be given."""
        payload_keys = {"context_hint", "format"}
        scope = {"role": role or self.role, "max_units": max_units}
        payload: dict[str, Any] = {}
        for key, value in options.items():
            (payload if key in payload_keys else scope)[key] = value
        payload["scope"] = scope
        return await self.send("ATTUNE", payload)

    async def detect(self, mode: str = "list", **filters: Any) -> dict[str, Any]:
        payload: dict[str, Any] = {"mode": mode}
        if filters:
            payload["filter"] = filters
        return await self.send("DETECT", payload)

    async def deregister(self) -> dict[str, Any]:
        return await self.send("DEREGISTER", {"agent_id": self.id})

    async def get(self, path: str) -> dict[str, Any]:
        return await self.field.request("GET", path, token=self.token)
