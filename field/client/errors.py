"""What the SDK raises, in one tree::

    Exception
    ├── FieldClientError          the Field answered with an error response (spec 8.1)
    │   └── StoredTokenRefused    FieldClient.connect(): the kept token was refused
    └── StreamError               a notification stream cannot go on as asked
        ├── NotificationGap       the Field could not resume a subscription: events were missed
        └── StreamUnavailable     reconnecting gave up (Reconnect.give_up_after)

Network failures of plain requests are aiohttp's (``aiohttp.ClientError``,
``TimeoutError``); a notification stream catches those itself and reconnects.
A stream whose token is refused raises :class:`FieldClientError`
(``UNAUTHENTICATED`` or ``AGENT_NOT_REGISTERED``): it is not retried.
"""

from __future__ import annotations

import email.utils
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Gap


class FieldClientError(Exception):
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


class StreamError(Exception):
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
