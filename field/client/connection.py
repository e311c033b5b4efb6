""":class:`FieldClient`: one Field's HTTP binding, registration, and agents that come back.

Every request is one HTTP exchange with the Field (``request``); envelopes
are built here (``envelope``) with message ids of this client. A request the
Field turns away before running it (``503 OVERLOADED``, ``429 RATE_LIMITED``,
each with ``Retry-After``) is sent again after the wait it names.

A Field of several nodes (several servers on one PostgreSQL log) is one
client with ``nodes``: the other nodes' base URLs. Requests and push streams
go to one node at a time; when a connection to it fails, the client moves
to the next. A request that could not connect (nothing was sent) is sent to
the next node at once, and so is a ``GET``; an operation whose connection
broke after it was sent is not (a write's outcome is then unknown: the error
is raised), but the next request goes elsewhere.
Streams resume on the next node from their cursors, which are valid on
every node.

:meth:`FieldClient.connect` is register-or-reuse: the first run registers
and keeps the token in a :class:`~field.client.tokens.TokenStore`, later runs
use it again after checking it with the Field.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
from collections.abc import Sequence
from types import TracebackType
from typing import Any, cast

import aiohttp
import orjson

from .agent import AgentClient
from .errors import FieldClientError, FieldUnavailable, StoredTokenRefused, retry_after_seconds
from .responses import RegisterResponse
from .tokens import StoredToken, TokenFile, TokenStore

logger = logging.getLogger("field.client")

#: Seconds a request may take when no ``timeout`` is given (aiohttp's default).
DEFAULT_TIMEOUT = 300.0
#: Error codes of requests the Field refused before running them: safe to send again.
RETRIED_CODES = frozenset({"OVERLOADED", "RATE_LIMITED"})


async def _wait(seconds: float) -> None:
    """Wait before sending a refused request again (``field.client._sleep``, so that a
    test may replace it)."""
    from . import _sleep

    await _sleep(seconds)


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that were given (not None): optional payload fields left out."""
    return {key: value for key, value in fields.items() if value is not None}


class FieldClient:
    """Connection to one Field; makes :class:`AgentClient` handles.

    Use it as an async context manager (or call :meth:`close`): it owns an
    ``aiohttp.ClientSession`` unless one is given.
    """

    def __init__(
        self,
        base_url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout: float | None = None,
        connect_timeout: float = 10.0,
        retries: int = 3,
        max_retry_wait: float = 30.0,
        nodes: Sequence[str] = (),
    ) -> None:
        """``timeout`` bounds each request in seconds (``None``: aiohttp's default);
        ``connect_timeout`` bounds connecting to the Field (a Field that accepts no
        connection in that long is :class:`FieldUnavailable`; a ``timeout`` shorter than
        it ends first, as a plain ``TimeoutError``); ``retries`` and ``max_retry_wait``
        say how a refused request is sent again; ``nodes`` are the base URLs of the
        Field's other nodes, tried in turn when ``base_url`` cannot be reached."""
        if isinstance(nodes, str):
            raise TypeError("nodes is a list of base URLs, not one string")
        self.urls = tuple(dict.fromkeys(u.rstrip("/") for u in (base_url, *nodes)))
        self._node = 0
        self.timeout = timeout
        self.connect_timeout = connect_timeout
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
    def base_url(self) -> str:
        """The base URL of the node requests and streams go to now."""
        return self.urls[self._node]

    def failed(self, url: str) -> None:
        """A connection to the node at ``url`` failed: from now on, use the next one
        (unless another failure already moved on from it)."""
        if url == self.base_url and len(self.urls) > 1:
            self._node = (self._node + 1) % len(self.urls)
            logger.warning("the Field's node at %s failed; moving to %s", url, self.base_url)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session (made on first use)."""
        if self._session is None:
            total = self.timeout or DEFAULT_TIMEOUT
            timeout = aiohttp.ClientTimeout(total=total, sock_connect=self.connect_timeout)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def close(self) -> None:
        """Close the session, if this client made it."""
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
        """The envelope of one message (spec 5.1) with a fresh message ``id``."""
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
        """One HTTP exchange; returns the JSON body or raises FieldClientError (the Field
        answered with an error) or FieldUnavailable (no node could be connected to).

        A refusal with ``Retry-After`` (``OVERLOADED``, ``RATE_LIMITED``: nothing ran)
        is sent again after that wait, plus up to a tenth more at random so that the
        clients refused together do not come back together.
        """
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else orjson.dumps(body)
        unreached = 0  # nodes tried in a row that could not be connected to
        for attempt in itertools.count():
            url = self.base_url
            try:
                return await self._exchange(method, path, data, headers)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as error:
                # nothing was sent: any request may go to the next node at once
                self.failed(url)
                unreached += 1
                if unreached < len(self.urls):
                    continue
                unavailable = FieldUnavailable.of(self.urls, error)
                if unavailable is None:
                    raise
                raise unavailable from error
            except (aiohttp.ClientConnectionError, OSError):
                # sent, maybe run: only a GET (which changes nothing) is sent again at once;
                # the next request goes elsewhere anyway
                self.failed(url)
                unreached += 1
                if method != "GET" or unreached >= len(self.urls):
                    raise
                continue
            except FieldClientError as error:
                wait = error.retry_after
                if (
                    error.code not in RETRIED_CODES
                    or wait is None
                    or attempt >= self.retries
                    or wait > self.max_retry_wait
                ):
                    raise
                await _wait(wait * (1 + random.random() / 10))
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

        The token is shown once: keep it (:attr:`AgentClient.token`), or use
        :meth:`connect`, which keeps it for you. An ``authority`` above 4 needs
        the Field's ``operator_token``. An id that deregistered is retired:
        only its last token (``previous_token``, the one DEREGISTER revoked) or
        the operator's registers it again. A Field whose registration is
        ``token`` needs a ``registration_token`` the operator issued.
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
        answer = await self.request("POST", "/v1/register", body=body, token=bearer)
        response = cast(RegisterResponse, answer)
        agent = AgentClient(self, agent_id, response["token"], role=response["agent"]["role"])
        agent.registration = response
        agent.info = response["agent"]
        agent.epoch = response["epoch"]
        return agent

    def agent(self, agent_id: str, token: str, *, role: str | None = None) -> AgentClient:
        """A handle for an agent registered earlier (or elsewhere) whose token is known.

        Without ``role``, the first call that needs it looks it up
        (:meth:`AgentClient.refresh`). Nothing is checked here; :meth:`connect`
        checks a kept token with the Field.
        """
        return AgentClient(self, agent_id, token, role=role)

    async def connect(
        self,
        agent_id: str,
        *,
        role: str,
        token_file: str | os.PathLike[str] | None = None,
        store: TokenStore | None = None,
        interests: list[str] | None = None,
        current_task_id: str | None = None,
        required_operations: list[str] | None = None,
        authority: int | None = None,
        operator_token: str | None = None,
        registration_token: str | None = None,
    ) -> AgentClient:
        """The agent ``agent_id``: registered on the first run, the same agent on later runs.

        The token is kept in ``token_file`` (a :class:`TokenFile`: JSON, mode
        0600, written atomically) or in another ``store``:

        - nothing kept yet: REGISTER (with the other arguments, as
          :meth:`register`) and keep the new token;
        - a token kept: check it with the Field (it must be ``agent_id``'s:
          SUBSCRIBE ``list``, then ``GET /v1/agents`` for the agent's record)
          and use it; ``role``, ``interests`` and the rest were fixed when the
          agent registered (a different ``role`` is logged, and the
          registered one is used: ATTUNE scopes default to it);
        - a kept token of an agent that deregistered: register the id again
          with it (the Field lets the last token take a retired id back) and
          keep the new one.

        A kept token the Field refuses otherwise raises
        :class:`StoredTokenRefused`, saying why, and leaves the store as it
        was. Without a store this is :meth:`register`. ``409 AGENT_ID_TAKEN``
        on a first run (the id was registered by someone who kept its token
        elsewhere) is raised as it is.
        """
        if token_file is not None and store is not None:
            raise TypeError("give token_file or store, not both")
        if token_file is not None:
            store = TokenFile(token_file)
        registering: dict[str, Any] = {
            "interests": interests,
            "current_task_id": current_task_id,
            "required_operations": required_operations,
            "authority": authority,
            "operator_token": operator_token,
            "registration_token": registration_token,
        }
        if store is None:
            return await self.register(agent_id, role, **registering)
        kept = store.load()
        if kept is not None and kept.agent_id != agent_id:
            raise ValueError(
                f"{store.describe()} keeps the token of agent {kept.agent_id!r}, not {agent_id!r}"
            )
        if kept is None:
            agent = await self.register(agent_id, role, **registering)
        else:
            agent = await self._reuse(kept, role, store, registering)
            if agent.token == kept.token:
                return agent
        registered = agent.registration
        field_id = None if registered is None else registered["field_capabilities"]["field_id"]
        store.save(StoredToken(agent_id, agent.token, field_id, self.base_url))
        return agent

    async def _reuse(
        self, kept: StoredToken, role: str, store: TokenStore, registering: dict[str, Any]
    ) -> AgentClient:
        """The agent of a kept token, checked with the Field (see :meth:`connect`)."""
        agent = AgentClient(self, kept.agent_id, kept.token, role=role)
        try:
            await agent.subscriptions()  # the token is this agent's (403 otherwise)
        except FieldClientError as error:
            if error.code == "AGENT_NOT_REGISTERED":  # deregistered: take the id back
                # with its last token (or the operator's, which an authority above 4 needs)
                return await self.register(
                    kept.agent_id, role, previous_token=kept.token, **registering
                )
            raise StoredTokenRefused(
                error,
                agent_id=kept.agent_id,
                location=store.describe(),
                explanation=await self._why_refused(error, kept),
            ) from None
        record = await agent.refresh()
        agent.info = record
        if record["role"] != role:
            logger.warning(
                "agent %s is registered with role %r, not %r: the registered role is used",
                kept.agent_id,
                record["role"],
                role,
            )
        agent.reused = True
        return agent

    async def _why_refused(self, error: FieldClientError, kept: StoredToken) -> str:
        """What a refused kept token means, and what to do."""
        if error.code == "FORBIDDEN":
            return "It is another agent's token: keep each agent's token in its own store."
        if error.code != "UNAUTHENTICATED":
            return "Check the token, or ask the Field's operator."
        field_id = None
        with contextlib.suppress(
            FieldClientError,
            FieldUnavailable,
            aiohttp.ClientError,
            TimeoutError,
            orjson.JSONDecodeError,
        ):
            field_id = (await self.status()).get("field_id")
        if kept.field_id is not None and field_id is not None and field_id != kept.field_id:
            return (
                f"It was issued by Field {kept.field_id} ({kept.url}), and {self.base_url} is "
                f"Field {field_id}: connect to the Field that issued it, or move the store "
                "away to register the agent here."
            )
        return (
            "This Field never issued it (a Field whose log was lost or kept in memory forgets "
            "its tokens): move the store away to register the agent again."
        )

    async def status(self) -> dict[str, Any]:
        """``GET /v1/field/status`` (public): the Field's id, epoch, counts and limits."""
        return await self.request("GET", "/v1/field/status")
