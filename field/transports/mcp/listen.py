"""MCP's ``subscriptions/listen`` streams (protocol 2026-07-28), and what an agent keeps
outside a session.

On the 2026-07-28 protocol there is no session: every request stands alone, and a
client that wants to be told of changes sends ``subscriptions/listen``, whose response
is the stream (over HTTP, an SSE response; over stdio, frames tied to the request's
id). The stream is acknowledged first (``notifications/subscriptions/acknowledged``,
naming what the Field honours: the resource URIs, never the list-changed kinds, whose
lists do not change while it runs), then carries ``notifications/resources/updated``
for those URIs, each stamped with the request's id, and ends gracefully with the
request's result when the Field stops.

MCP itself replays nothing a dropped stream missed; the Field does better. A
subscription resource read outside a session belongs to the agent
(:class:`AgentResources`): its cursor stays when the stream that told of it drops, so
a read after the client listens again returns exactly what it has not read. A read
may also name the cursor to start after (``field://subscriptions/{id}?since=<cursor>``,
each read returns its ``cursor``), which is how a client resumes across a restart of
the Field, which keeps no reader's cursor in its log.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

from . import resources

#: Resource URIs one listen stream may name.
MAX_LISTEN_URIS = 256


class FeedHolder(Protocol):
    """What a subscription resource's feed belongs to: a session, or an agent outside one."""

    @property
    def created(self) -> dict[str, str]: ...

    @property
    def feeds(self) -> dict[str, resources.SubscriptionFeed]: ...

    def updated(self, uri: str) -> None: ...


class ListenStream:
    """One ``subscriptions/listen`` stream: the URIs it was granted, and those that have
    something new and wait to be sent (each once, however often it changed meanwhile:
    at most one per URI, so the backlog is bounded by the URIs)."""

    __slots__ = ("uris", "_pending", "_wake", "_closed")

    def __init__(self, uris: frozenset[str]) -> None:
        self.uris = uris
        self._pending: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._closed = False

    def updated(self, uri: str) -> None:
        """``uri`` has something new (never waits)."""
        if uri in self.uris and not self._closed:
            self._pending[uri] = None
            self._wake.set()

    def close(self) -> None:
        """End the stream gracefully, once what is pending has been sent."""
        self._closed = True
        self._wake.set()

    async def next(self) -> str | None:
        """The next URI to tell of; None: the stream ends gracefully."""
        while True:
            if self._pending:
                uri = next(iter(self._pending))
                del self._pending[uri]
                return uri
            if self._closed:
                return None
            self._wake.clear()
            await self._wake.wait()


@dataclass(eq=False)
class AgentResources:
    """The subscription resources of one agent outside any session (its requests on the
    2026-07-28 protocol, or stateless ones): one feed, one cursor, per subscription,
    whichever request reads it; and its open listen streams."""

    agent_id: str
    #: the cursor a subscription made outside a session starts from, until it is read
    created: dict[str, str] = field(default_factory=dict)
    feeds: dict[str, resources.SubscriptionFeed] = field(default_factory=dict)
    streams: set[ListenStream] = field(default_factory=set)
    #: open listen streams naming each feed's URI
    listening: dict[str, int] = field(default_factory=dict)
    #: subscriptions that ended: their feeds are forgotten once they let go
    cancelled: set[str] = field(default_factory=set)
    #: when a request of the agent last used it, on the monotonic clock
    used: float = field(default_factory=time.monotonic)

    def updated(self, uri: str) -> None:
        """Tell the agent's listen streams that ``uri`` has something new."""
        for stream in self.streams:
            stream.updated(uri)

    def listen(self, stream: ListenStream) -> None:
        """Open ``stream``: the feeds it names tell of what waits to be read (again, if
        an earlier stream was told and dropped before the client read)."""
        self.streams.add(stream)
        for feed in self.feeds.values():
            if feed.uri in stream.uris:
                self.listening[feed.uri] = self.listening.get(feed.uri, 0) + 1
                feed.told = False
                feed.subscribe()

    def added(self, feed: resources.SubscriptionFeed) -> None:
        """A feed made while streams naming its URI are open: it tells them."""
        count = sum(feed.uri in stream.uris for stream in self.streams)
        if count:
            self.listening[feed.uri] = count
            feed.subscribe()

    def unlisten(self, stream: ListenStream) -> None:
        """Close ``stream``: a feed no stream names any more tells nobody."""
        if stream not in self.streams:
            return
        self.streams.discard(stream)
        for feed in self.feeds.values():
            count = self.listening.get(feed.uri, 0)
            if feed.uri in stream.uris and count:
                if count == 1:
                    del self.listening[feed.uri]
                    feed.unsubscribe()
                else:
                    self.listening[feed.uri] = count - 1
        self.used = time.monotonic()

    def idle(self, since: float) -> bool:
        """Nothing held: no feed, no stream, and unused since ``since``."""
        return not self.feeds and not self.streams and self.used <= since

    def rest(self, since: float) -> None:
        """Let go of the push connections of the feeds no stream names and nobody read
        since ``since``; their cursors are kept (a read attaches again from there), ended
        feeds are forgotten."""
        for subscription_id, feed in list(self.feeds.items()):
            if feed.used > since or self.listening.get(feed.uri):
                continue
            feed.release()
            if feed.ended is not None or subscription_id in self.cancelled:
                del self.feeds[subscription_id]
                self.cancelled.discard(subscription_id)

    def ended(self, subscription_id: str) -> None:
        """The subscription ended: forget where it would start, and its feed once idle."""
        self.created.pop(subscription_id, None)
        if subscription_id in self.feeds:
            self.cancelled.add(subscription_id)

    def release(self) -> None:
        """Let go of everything (the agent deregistered, the Field stops)."""
        for feed in self.feeds.values():
            feed.release()
        self.feeds.clear()
        self.listening.clear()
        for stream in list(self.streams):
            stream.close()
