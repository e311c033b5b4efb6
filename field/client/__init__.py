"""The Python SDK of the Field: how to write an agent in Python.

::

    import asyncio
    from field.client import FieldClient

    async def main() -> None:
        async with FieldClient("http://127.0.0.1:8765") as field:
            # registered on the first run, the same agent (its token kept 0600) on the next
            me = await field.connect("researcher-01", role="market_researcher",
                                     token_file="researcher-01.token")
            news = await me.subscribe(["memory.recorded", "conflict.detected"],
                                      name="news", min_relevance=0.2)
            await me.record("finding", "EU HR SaaS grows 23% a year",
                            purpose="Validate market size", confidence=0.8,
                            reasoning="three analyst reports")
            async for notification in me.notifications(news):
                print(notification.event, notification.summary)

    asyncio.run(main())

- :class:`FieldClient` is the connection to one Field: :meth:`~FieldClient.connect`
  (register or reuse, the token kept in a :class:`TokenFile` or another
  :class:`TokenStore`), :meth:`~FieldClient.register`, :meth:`~FieldClient.agent`
  (a handle from a known token), :meth:`~FieldClient.status`.
- :class:`AgentClient` is one agent, with one typed method per operation
  (``record``, ``attune``/``poll``, ``detect``, ``merge``, ``subscribe``/
  ``unsubscribe``/``subscriptions``, ``replay``, ``compact``, ``session``,
  ``coordinate``, ``handoff``, ``deregister``) and per GET endpoint (``agents``,
  ``conflicts``; ``every`` follows pages). Their keyword arguments say what the
  protocol requires (a committed ``record`` needs ``confidence`` and
  ``reasoning``). The envelope (message id, the agent's Lamport ``epoch``,
  ``session_id``) is filled in for you; each response's ``epoch`` moves the
  agent's clock forward. Responses are the JSON objects of
  ``protocol/schemas/*.response.json``; ``subscribe`` returns a
  :class:`Subscription`.
- :meth:`AgentClient.notifications` is the push stream: an async iterator of
  :class:`Notification` over a WebSocket (or SSE) that reconnects with a
  jittered, capped backoff and resumes from its last cursor, losing and
  repeating nothing; a gap the Field cannot fill raises
  :class:`NotificationGap` (``control=True`` yields it, and ``Overflow``,
  ``Ended`` and ``Disconnected`` events, instead).
- An error response raises :class:`FieldClientError` carrying the spec's error
  body (``code``, ``message``, ``recoverable``, ``suggested_action``). A request
  the Field turns away before running it (``503 OVERLOADED`` or
  ``429 RATE_LIMITED``, each with ``Retry-After``) is sent again after the wait
  it names, at most ``retries`` times (3 by default; 0 never), each wait at most
  ``max_retry_wait`` seconds; past that the error is raised, with the wait the
  Field asked for in :attr:`FieldClientError.retry_after`.
"""

from __future__ import annotations

import asyncio

from .agent import UNSET, AgentClient
from .connection import RETRIED_CODES, FieldClient
from .errors import (
    FieldClientError,
    NotificationGap,
    StoredTokenRefused,
    StreamError,
    StreamUnavailable,
    retry_after_seconds,
)
from .stream import NotificationStream
from .tokens import StoredToken, TokenFile, TokenStore
from .types import (
    Disconnected,
    Ended,
    Entity,
    Gap,
    Notification,
    Overflow,
    Reconnect,
    Relation,
    StreamEvent,
    Subscription,
)

#: How the client waits before sending a refused request again (replaceable in tests).
_sleep = asyncio.sleep

__all__ = [
    "RETRIED_CODES",
    "UNSET",
    "AgentClient",
    "Disconnected",
    "Ended",
    "Entity",
    "FieldClient",
    "FieldClientError",
    "Gap",
    "Notification",
    "NotificationGap",
    "NotificationStream",
    "Overflow",
    "Reconnect",
    "Relation",
    "StoredToken",
    "StoredTokenRefused",
    "StreamError",
    "StreamEvent",
    "StreamUnavailable",
    "Subscription",
    "TokenFile",
    "TokenStore",
    "retry_after_seconds",
]
