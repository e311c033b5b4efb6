"""The resources and push of ``field mcp``: those of the Field's own ``/mcp``, relayed.

``field mcp`` is a client of the Field; for resources it is a client of the Field's MCP
endpoint (``/mcp``, :mod:`field.transports.mcp`), on MCP 2026-07-28 (one request at a
time, no session), as the bridge's agent (its ``--agent-id``, or the one agent it
acts for). What it reads, lists and listens to is the Field's answer, relayed as is
(freshness hints, errors and their error bodies included), so the stdio server offers
the same resources as ``/mcp`` on both protocol revisions:

- ``resources/list``, ``resources/templates/list``, ``resources/read``: one request to
  the Field each.
- ``subscriptions/listen`` (2026-07-28): one listen stream to the Field for each, its
  acknowledgement, updates and graceful end relayed; a stream the Field drops is an
  error of this one, and the client listens again.
- ``resources/subscribe`` (2025-era): one listen stream to the Field for every URI the
  client subscribes to (:class:`Push`), its updates sent as
  ``notifications/resources/updated``. A stream the Field drops (it restarted, say) is
  opened again, and each subscription resource is then announced once: its next read
  starts after the cursor of the last read relayed (``?since=``), so the client misses
  nothing across the Field's restart.

The agent's subscription resources outside a session hold one cursor per subscription
at the Field, shared by every client of the agent that reads them outside a session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ResourceUpdated, Subscription, SubscriptionLost
from mcp.shared.exceptions import MCPError

logger = logging.getLogger("field.mcp")

_E = TypeVar("_E", bound=BaseException)

#: The protocol ``field mcp`` speaks to the Field's ``/mcp``.
UPSTREAM_VERSION = "2026-07-28"
SUBSCRIPTIONS = "field://subscriptions/"
#: Longest wait before a dropped stream is opened again (doubling from a tenth of a second):
#: a Field that restarts is heard again within a second of listening.
MAX_BACKOFF = 1.0


class Upstream:
    """The Field's ``/mcp`` as the agent of a token (given by ``token()``, which raises the
    :class:`MCPError` a request without an agent gets)."""

    def __init__(self, url: str, token: Callable[[], str], *, timeout: float | None) -> None:
        self.url = url.rstrip("/") + "/mcp"
        self.token = token
        self.timeout = timeout
        #: the cursor of the last read of each subscription resource relayed
        self.cursors: dict[str, str] = {}
        #: subscription resources whose next read names its cursor (the Field restarted)
        self.resume: set[str] = set()

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {self.token()}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=self.timeout) as http,
            Client(
                streamable_http_client(self.url, http_client=http), mode=UPSTREAM_VERSION
            ) as client,
        ):
            yield client

    async def request(self, call: Callable[[Client], Awaitable[Any]]) -> Any:
        """One request to the Field; one it could not answer is the client's error."""
        try:
            async with self.client() as client:
                return await call(client)
        except Exception as exc:  # the Field's refusal, or no Field to answer
            raise _relayed(self.url, exc) from None

    async def read(self, uri: str) -> Any:
        base = uri.partition("?")[0]
        asked = uri
        if base == uri and uri in self.resume and uri in self.cursors:
            asked = f"{uri}?since={self.cursors[uri]}"
        result = await self.request(lambda client: client.read_resource(asked))
        if base.startswith(SUBSCRIPTIONS):
            self.resume.discard(base)
            self._keep_cursor(base, result)
        return result

    def _keep_cursor(self, uri: str, result: types.ReadResourceResult) -> None:
        for content in result.contents:
            if isinstance(content, types.TextResourceContents):
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    cursor = json.loads(content.text).get("cursor")
                    if isinstance(cursor, str):
                        self.cursors[uri] = cursor

    @asynccontextmanager
    async def listen(self, uris: list[str]) -> AsyncIterator[Subscription]:
        """A listen stream of the Field on ``uris``, acknowledged."""
        try:
            async with self.client() as client, client.listen(resource_subscriptions=uris) as sub:
                yield sub
        except Exception as exc:
            lost = _found(exc, SubscriptionLost)
            if lost is not None:
                raise lost from None
            raise _relayed(self.url, exc) from None


def _found(exc: BaseException, kind: type[_E]) -> _E | None:
    """``exc`` if it is a ``kind``, or the first ``kind`` in it (an exception group)."""
    if isinstance(exc, kind):
        return exc
    for inner in exc.exceptions if isinstance(exc, BaseExceptionGroup) else ():
        found = _found(inner, kind)
        if found is not None:
            return found
    return None


def _relayed(url: str, exc: BaseException) -> MCPError:
    """The Field's MCP error in ``exc``, or the error of a Field that did not answer."""
    error = _found(exc, MCPError)
    return error if error is not None else _unavailable(url, exc)


def _unavailable(url: str, exc: BaseException) -> MCPError:
    reason = str(exc) or type(exc).__name__
    body = {
        "code": "FIELD_UNAVAILABLE",
        "message": f"no answer from the Field at {url}: {reason}"[:500],
        "operation": None,
        "recoverable": True,
        "suggested_action": "Check that the Field is running, then retry.",
    }
    return MCPError(types.INTERNAL_ERROR, f"FIELD_UNAVAILABLE: {body['message']}", body)


class Push:
    """``resources/subscribe`` of the stdio client, as one listen stream of the Field on
    every URI it subscribed to; each update sent with ``send``."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.uris: set[str] = set()
        self.send: Callable[[str], Awaitable[None]] | None = None
        self._task: asyncio.Task[None] | None = None

    async def subscribe(self, uri: str, send: Callable[[str], Awaitable[None]]) -> None:
        """Follow ``uri`` too; an error of the Field (no such resource, not the agent's)
        is raised and nothing changes."""
        self.send = send
        if uri not in self.uris:
            await self._follow(self.uris | {uri})

    async def unsubscribe(self, uri: str) -> None:
        if uri in self.uris:
            await self._follow(self.uris - {uri})

    async def _follow(self, uris: set[str]) -> None:
        """Listen on ``uris`` instead, once the Field acknowledged them."""
        old, self._task = self._task, None
        if uris:
            acked = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(self._stream(sorted(uris), acked))
            try:
                await acked
            except BaseException:
                task.cancel()
                self._task = old
                raise
            self._task = task
        self.uris = uris
        if old is not None:
            old.cancel()

    async def _stream(self, uris: list[str], acked: asyncio.Future[None]) -> None:
        """Relay the Field's updates until cancelled; open the stream again if it drops."""
        backoff = 0.1
        while True:
            try:
                async with self.upstream.listen(uris) as stream:
                    if acked.done():  # opened again: say what may have been missed
                        for uri in uris:
                            if uri.startswith(SUBSCRIPTIONS):
                                self.upstream.resume.add(uri)
                                await self._send(uri)
                    else:
                        acked.set_result(None)
                    backoff = 0.1
                    async for event in stream:
                        if isinstance(event, ResourceUpdated):
                            await self._send(event.uri)
            except Exception as exc:
                if not acked.done():
                    acked.set_exception(exc)
                    return
                logger.warning("the Field's listen stream ended: %s; listening again", exc)
            await asyncio.sleep(backoff)  # the Field is away: try again a little later
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _send(self, uri: str) -> None:
        if self.send is not None:
            await self.send(uri)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
