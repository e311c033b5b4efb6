"""The Python SDK of the Field: how to write an agent in Python.

It needs only ``aiohttp`` and ``orjson``: ``pip install akashik-field`` installs
the SDK alone (the server is ``pip install 'akashik-field[server]'``). With a Field
running (``field serve``), this registers two agents, one records a finding,
and the other reads it, ranked for it by ATTUNE, and is notified of it. Run it
again: the agents are the same (their tokens were kept, 0600), and the stream
goes on from where the cursor file says it stopped.

.. code-block:: python

    import asyncio

    from field.client import FieldClient


    async def main() -> None:
        async with FieldClient("http://127.0.0.1:8765") as field:
            researcher = await field.connect(
                "researcher-01", role="market_researcher", token_file="researcher-01.token"
            )
            strategist = await field.connect(
                "strategist-01",
                role="strategist",
                interests=["market size"],
                token_file="strategist-01.token",
            )
            news = await strategist.subscribe(["memory.recorded", "conflict.detected"], name="news")
            recorded = await researcher.record(
                "finding",
                "The EU market size for HR SaaS grows 23% a year",
                purpose="Validate the market size",
                confidence=0.8,
                reasoning="three analyst reports agree",
            )
            print("recorded", recorded["memory_unit_id"])
            context = await strategist.attune(context_hint="market size", max_units=3)
            for scored in context["record"]:
                print(f"attuned {scored['relevance_score']:.2f}", scored["memory_unit"]["content"])
            stream = strategist.notifications(news, cursor_file="strategist-01.cursors")
            async with stream:
                async for notification in stream:  # waits for the next one, then stops
                    print("notified", notification.event, notification.memory_unit_id)
                    break


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
  ``protocol/schemas/*.response.json``, typed (:mod:`field.client.responses`:
  :class:`RecordResponse`, :class:`AttuneResponse` and the rest are
  ``TypedDict`` classes: the dicts read as before); ``subscribe`` returns a :class:`Subscription`.
- :meth:`AgentClient.notifications` is the push stream: an async iterator of
  :class:`Notification` over a WebSocket (or SSE) that reconnects with a
  jittered, capped backoff and resumes from its last cursor, losing and
  repeating nothing; a gap the Field cannot fill raises
  :class:`NotificationGap` (``control=True`` yields it, and ``Overflow``,
  ``Ended`` and ``Disconnected`` events, instead).
- A Field that cannot be reached (connection refused, a host name that does
  not resolve, connecting timed out) raises :class:`FieldUnavailable`, naming
  the URL and the cause. An error response raises :class:`FieldClientError`
  carrying the spec's error body (``code``, ``message``, ``recoverable``,
  ``suggested_action``). Both are a :class:`ClientError`. A request
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
    ClientError,
    FieldClientError,
    FieldUnavailable,
    NotificationGap,
    StoredTokenRefused,
    StreamError,
    StreamUnavailable,
    retry_after_seconds,
)
from .responses import (
    AgentRecord,
    AgentsPage,
    AttuneResponse,
    Conflict,
    ConflictsPage,
    CoordinateResponse,
    DetectResponse,
    FieldCapabilities,
    Handoff,
    HandoffResponse,
    MemoryUnit,
    MergeResponse,
    RecordResponse,
    RegisterResponse,
    ScopedUnit,
    Task,
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
    "AgentRecord",
    "AgentsPage",
    "AttuneResponse",
    "ClientError",
    "Conflict",
    "ConflictsPage",
    "CoordinateResponse",
    "DetectResponse",
    "Disconnected",
    "Ended",
    "Entity",
    "FieldCapabilities",
    "FieldClient",
    "FieldClientError",
    "FieldUnavailable",
    "Gap",
    "Handoff",
    "HandoffResponse",
    "MemoryUnit",
    "MergeResponse",
    "Notification",
    "NotificationGap",
    "NotificationStream",
    "Overflow",
    "Reconnect",
    "RecordResponse",
    "RegisterResponse",
    "Relation",
    "ScopedUnit",
    "StoredToken",
    "StoredTokenRefused",
    "StreamError",
    "StreamEvent",
    "StreamUnavailable",
    "Subscription",
    "Task",
    "TokenFile",
    "TokenStore",
    "retry_after_seconds",
]
