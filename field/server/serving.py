"""The uvicorn server ``field serve`` runs: a signal is a normal stop, push streams end the
Field's way, and the caller hears when the server takes connections."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn
from starlette.applications import Starlette

#: Seconds between uvicorn's ticks, and the count at which its counter starts again (a day)
TICK_SECONDS = 0.1
TICKS_WRAP = 864000


class FieldServer(uvicorn.Server):
    """uvicorn's server, but a SIGINT or SIGTERM is a normal stop: exit status 0.

    (uvicorn re-raises the signal after its graceful shutdown, which would
    end the process by that signal instead.) ``on_started`` is called once the
    app has started and the server accepts connections.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        app: Starlette,
        *,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.app = app
        self.on_started = on_started
        #: the loop the server runs on (a signal handler may run elsewhere)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set on the loop when the server is to stop: the main loop's wait ends there
        self._stopping = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()

    async def main_loop(self) -> None:
        """uvicorn's ticks (the date header, once a second; the stop), but a stop ends the
        wait for the next tick at once instead of up to a tenth of a second later."""
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % TICKS_WRAP
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_SECONDS):
                    await self._stopping.wait()

    def stop(self) -> None:
        """Stop as SIGTERM does, from any thread."""
        self.handle_exit(signal.SIGTERM, None)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C skips the graceful wait
            return
        self.should_exit = True
        if self._loop is None:  # not started
            return
        # End push streams ourselves, before uvicorn drops the connections:
        # WebSockets close with 1001 and SSE streams end with a shutdown event.
        hub = getattr(self.app.state, "push_hub", None)
        mcp = getattr(self.app.state, "mcp", None)  # MCP sessions' streams end likewise
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server ended already
            self._loop.call_soon_threadsafe(self._stopping.set)
            for stop in (hub, mcp):
                if stop is not None:
                    self._loop.call_soon_threadsafe(stop.shutdown)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's, after the push streams are told to end (the call above may not have
        run yet): every stream ends the Field's way, whatever uvicorn then does."""
        for name in ("push_hub", "mcp"):
            stop = getattr(self.app.state, name, None)
            if stop is not None:
                stop.shutdown()
        await super().shutdown(sockets)
