"""``/mcp``, made on its first request.

The MCP SDK is the heaviest thing ``field serve`` imports: about a third of its start (its
types for two protocol revisions are pydantic models) and 25 MB. A Field nobody asks
for MCP never imports it. The first request to ``/mcp`` imports it on a worker
thread, so the event loop keeps serving the other transports meanwhile, then builds
and starts the binding (:class:`~.streamable_http.McpHttpBinding`) on the loop.
Requests that arrive during the load wait for it, and every request after it goes
straight to the binding.

The load happens at most once. If it fails, the request is answered 500
``INTERNAL_ERROR`` with the cause in the server's log, and the next request tries
again. Once the server is stopping, no load begins: ``/mcp`` answers 503, as a
stopped binding does.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...contract.errors import Overloaded, internal_error
from ..access import access_of
from ..web import error_response

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from ...engine.service import FieldService
    from .streamable_http import McpHttpBinding

logger = logging.getLogger("field.mcp")

#: The module that imports the SDK, imported on a worker thread at the first request.
BINDING_MODULE = f"{__package__}.streamable_http"


class DeferredMcp:
    """The ASGI endpoint ``/mcp`` and its lifetime in the app's lifespan, as
    :class:`~.streamable_http.McpHttpBinding` offers them, with the binding made by
    ``build`` when the first request comes."""

    def __init__(self, build: Callable[[], McpHttpBinding]) -> None:
        self._build = build
        self._service: FieldService | None = None
        #: the binding, once made and started
        self.binding: McpHttpBinding | None = None
        self._loading: asyncio.Future[McpHttpBinding] | None = None
        self._stopping = False

    async def start(self, service: FieldService) -> None:
        """Note the started service the binding will be started on; nothing is imported."""
        self._service = service

    async def _load(self) -> McpHttpBinding:
        await asyncio.to_thread(importlib.import_module, BINDING_MODULE)
        binding = self._build()
        assert self._service is not None, "start() comes before the first request"
        await binding.start(self._service)
        if self._stopping:  # the server began stopping during the load
            await binding.stop()
            raise Overloaded("the Field is not running")
        self.binding = binding
        return binding

    async def _loaded(self) -> McpHttpBinding:
        if self.binding is not None:
            return self.binding
        if self._stopping or self._service is None:
            raise Overloaded("the Field is not running")
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load())
            self._loading.add_done_callback(self._forget_failure)
        # shielded: a client that goes away during the load does not cancel it for the rest
        return await asyncio.shield(self._loading)

    def _forget_failure(self, loading: asyncio.Future[McpHttpBinding]) -> None:
        failed = loading.cancelled() or loading.exception() is not None
        if failed and self._loading is loading:
            self._loading = None  # the next request tries again

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.binding is None:
            access = access_of(scope)
            if access is not None:
                access.transport = "mcp"
            try:
                await self._loaded()
            except Overloaded as refusal:
                await error_response(refusal)(scope, receive, send)
                return
            except Exception:
                logger.exception("MCP over HTTP could not be loaded")
                await error_response(internal_error())(scope, receive, send)
                return
        assert self.binding is not None
        await self.binding(scope, receive, send)

    def shutdown(self) -> None:
        """The server is stopping: end every session now (see the binding's), and begin no
        load."""
        self._stopping = True
        if self.binding is not None:
            self.binding.shutdown()

    async def stop(self) -> None:
        """End every session and wait for them; a load under way ends first."""
        self._stopping = True
        loading = self._loading
        if loading is not None and not loading.done():
            await asyncio.gather(loading, return_exceptions=True)
        if self.binding is not None:
            await self.binding.stop()
