"""Real-browser tests: headless Chromium (Debian's ``chromium``) driven by Playwright.

Nothing here downloads a browser: Playwright launches ``/usr/bin/chromium``
(``.ci/run`` installs the package when it is missing). Without it, the tests
marked :data:`needs_chromium` are skipped, saying why.

Usage::

    from .browser import PageServer, chromium_page, needs_chromium

    @needs_chromium
    async def test_x() -> None:
        with PageServer("<p>hello</p>") as site:
            async with chromium_page(site.url) as page:
                assert await page.evaluate("document.body.textContent") == "hello"

:class:`PageServer` serves one HTML page from its own loopback port, i.e. its own
origin (``site.origin``), as a page of another site would be.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

#: Debian's Chromium: the only browser these tests use.
CHROMIUM = Path("/usr/bin/chromium")
#: Milliseconds Playwright waits for anything in the page.
TIMEOUT_MS = 15_000

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"real-browser test: {CHROMIUM} is missing (apt-get install -y chromium; "
    ".ci/run installs it)",
)


class PageServer:
    """One HTML page at ``/`` on a loopback port of its own, in a thread."""

    def __init__(self, html: str, *, host: str = "127.0.0.1") -> None:
        body = html.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # quiet

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        port = self._server.server_address[1]
        #: the page's origin, as the browser sends it in ``Origin``
        self.origin = f"http://{host}:{port}"
        self.url = self.origin + "/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> PageServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@asynccontextmanager
async def chromium_page(url: str) -> AsyncIterator[Any]:
    """A new headless Chromium with one page, opened at ``url``; closed after."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = await browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            await page.goto(url)
            yield page
        finally:
            await browser.close()
