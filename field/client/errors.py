"""What the SDK raises, in one tree:

.. code-block:: text

    Exception
    └── ClientError               anything the SDK raises
        ├── FieldClientError      the Field answered with an error response (spec 8.1)
        │   └── StoredTokenRefused    FieldClient.connect(): the kept token was refused
        ├── FieldUnavailable      no Field answers at the URL (also a ConnectionError)
        └── StreamError           a notification stream cannot go on as asked
            ├── NotificationGap   the Field could not resume a subscription: events were missed
            └── StreamUnavailable reconnecting gave up (Reconnect.give_up_after)

A request that cannot reach the Field (the connection is refused, the host
name does not resolve, connecting times out: nothing was sent) raises
:class:`FieldUnavailable`, naming the URL and the cause. Other network
failures of plain requests (the connection broke after the request was sent:
it may have run) are aiohttp's (``aiohttp.ClientError``, ``TimeoutError``).
A notification stream that cannot make its first connection raises
:class:`FieldUnavailable` too; once connected, it catches network failures
itself and reconnects. A stream whose token is refused raises
:class:`FieldClientError` (``UNAUTHENTICATED`` or ``AGENT_NOT_REGISTERED``):
it is not retried.
"""

from __future__ import annotations

import email.utils
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from .types import Gap


class ClientError(Exception):
    """Anything the SDK raises: catch it to catch them all."""


class FieldClientError(ClientError):
    """The Field answered with an error response (spec 8.1).

    ``body`` is the error response (``code``, ``message``, ``recoverable``,
    ``suggested_action``, maybe ``details``); ``status`` its HTTP status.
    """

    def __init__(
        self, status: int, body: dict[str, Any], *, retry_after: float | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.code = body.get("code")
        #: seconds the Field asked the client to wait (``Retry-After``), if it did
        self.retry_after = retry_after
        super().__init__(f"{status} {self.code}: {body.get('message')}")

    @property
    def recoverable(self) -> bool:
        """Whether the Field says the request may succeed if sent again (changed or later)."""
        return bool(self.body.get("recoverable"))


class StoredTokenRefused(FieldClientError):
    """:meth:`FieldClient.connect` found a token kept for the agent, and the Field refused it.

    The token is left where it was (it may be the only proof of the agent id).
    ``location`` names the store, ``field_id`` the Field that issued the token
    when the store knows it. The message says what to do.
    """

    def __init__(
        self,
        error: FieldClientError,
        *,
        agent_id: str,
        location: str,
        explanation: str,
    ) -> None:
        super().__init__(error.status, error.body, retry_after=error.retry_after)
        self.agent_id = agent_id
        self.location = location
        self.args = (
            f"the token kept for agent {agent_id!r} in {location} was refused: "
            f"{error.status} {error.code}: {error.body.get('message')}. {explanation}",
        )


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


class FieldUnavailable(ClientError, ConnectionError):
    """No Field answers at the URL: nothing was sent.

    The message names the URL and the cause, e.g. ``no Field at
    http://127.0.0.1:8765: connection refused (is field serve running?)``.
    ``urls`` are the nodes that were tried (the client's base URL and its
    ``nodes``), ``reason`` the cause in words; the aiohttp error is the
    ``__cause__``. It is a :class:`ConnectionError` (so an :class:`OSError`)
    as well: ``except OSError`` goes on catching it.
    """

    def __init__(self, urls: Sequence[str], reason: str, *, hint: str) -> None:
        self.urls = tuple(urls)
        self.url = self.urls[0]
        self.reason = reason
        super().__init__(f"no Field at {', '.join(self.urls)}: {reason} ({hint})")

    @classmethod
    def of(cls, urls: Sequence[str], error: BaseException) -> FieldUnavailable | None:
        """What ``error`` (raised while connecting to ``urls``) means, if it means that no
        Field answers there; ``None`` for a failure that says otherwise (TLS: a server
        answered, and its certificate or handshake was refused)."""
        if isinstance(error, aiohttp.ClientSSLError):
            return None
        if isinstance(error, aiohttp.ConnectionTimeoutError):
            return cls(urls, "timed out connecting", hint="is field serve running, and reachable?")
        if not isinstance(error, aiohttp.ClientConnectorError):
            return None
        cause = error.os_error
        if isinstance(cause, socket.gaierror):
            reason = f"the host name {error.host!r} does not resolve ({cause.strerror})"
            return cls(urls, reason, hint="is the URL right?")
        if isinstance(cause, ConnectionRefusedError):
            return cls(urls, "connection refused", hint="is field serve running?")
        if isinstance(cause, TimeoutError):
            return cls(urls, "timed out connecting", hint="is field serve running, and reachable?")
        reason = cause.strerror or str(cause) or type(cause).__name__
        return cls(urls, reason[:1].lower() + reason[1:], hint="is field serve running?")


class StreamError(ClientError):
    """A notification stream cannot go on as asked."""


class NotificationGap(StreamError):
    """The Field could not resume a subscription from the stream's cursor (``recovered: false``).

    Raised by a stream iterated without ``control=True``; the stream goes on
    live from :attr:`Gap.resumed_from` when it is iterated again. What happened
    in between was not notified: catch up by polling, e.g.
    ``await agent.attune(since_epoch=gap.last_epoch)``.
    """

    def __init__(self, gap: Gap) -> None:
        self.gap = gap
        super().__init__(
            f"subscription {gap.subscription_id} could not be resumed from "
            f"{gap.last_cursor!r}: {gap.reason}; it goes on live from {gap.resumed_from}"
        )


class StreamUnavailable(StreamError):
    """Reconnecting has failed for longer than :attr:`Reconnect.give_up_after` seconds.

    The last failure is the ``__cause__``; :attr:`cursors` are where the
    stream stood (pass them as ``since`` to a new stream to go on).
    """

    def __init__(self, message: str, cursors: dict[str, str]) -> None:
        super().__init__(message)
        self.cursors = cursors
