"""An agent that listens: it prints each notification it is sent, once, across restarts.

Start it, stop it (Ctrl-C), start it again: what was recorded meanwhile is
printed when it comes back, and nothing is printed twice. The Field may
restart too (or be killed): the stream reconnects and resumes by itself. Its
token and its place in the stream are kept in ``FIELD_AGENT_DIR``
(``.field-agents`` by default)::

    python examples/listener.py                   # until Ctrl-C
    python examples/listener.py --count 3         # stop after three notifications

It needs no operator token. A kept token the Field refuses (one another Field
issued, or this one before its data was removed) stops it with what to do,
as do an error response (the Field's message and suggested action) and a URL
where no Field answers. The Field's URL is the first argument, or
``FIELD_URL`` (default ``http://127.0.0.1:8765``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path

from field.client import (
    AgentClient,
    FieldClient,
    FieldClientError,
    Gap,
    NotificationGap,
    StoredTokenRefused,
)

AGENTS = Path(os.environ.get("FIELD_AGENT_DIR", ".field-agents"))


async def catch_up(me: AgentClient, gap: Gap) -> None:
    """The Field could not resume the stream (another Field, or its log was lost): poll for
    what was recorded since the last notification instead."""
    print(f"gap: {gap.reason}; catching up by polling", flush=True)
    missed = await me.attune(since_epoch=gap.last_epoch, max_units=100)
    for scored in missed["record"]:
        print(f"caught up: {scored['memory_unit']['content']}", flush=True)


async def listen(url: str, count: int | None) -> None:
    async with FieldClient(url) as field:
        me = await field.connect(
            "listener",
            role="market_watcher",
            interests=["market size"],
            token_file=AGENTS / "listener.token",
        )
        news = await me.subscribe(
            ["memory.recorded", "conflict.detected", "conflict.resolved"], name="news"
        )
        print(f"listening: {news.id} ({'new' if news.created else 'again'})", flush=True)
        seen = 0
        async with me.notifications(news, cursor_file=AGENTS / "listener.cursors") as stream:
            while True:
                try:
                    async for notification in stream:
                        about = notification.memory_unit_id or notification.conflict_id
                        print(
                            f"{notification.event} {about} "
                            f"(relevance {notification.relevance_score:.2f}): "
                            f"{notification.summary}",
                            flush=True,
                        )
                        seen += 1
                        if seen == count:
                            return
                    return  # the subscription ended (cancelled, or the agent deregistered)
                except NotificationGap as gap:
                    await catch_up(me, gap.gap)  # then go on: the stream is live again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "url", nargs="?", default=os.environ.get("FIELD_URL", "http://127.0.0.1:8765")
    )
    parser.add_argument("--count", type=int, help="stop after this many notifications")
    arguments = parser.parse_args()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(listen(arguments.url, arguments.count))
    except StoredTokenRefused as error:  # a kept token: the message says what to do
        sys.exit(str(error))
    except FieldClientError as error:  # the Field's error response, and what it suggests
        sys.exit(f"{error}\n{error.body.get('suggested_action', '')}".rstrip())
    except ConnectionError as error:  # no Field at the URL
        sys.exit(str(error))


if __name__ == "__main__":
    main()
