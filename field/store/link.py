"""One PostgreSQL connection of a cluster mechanism, used from a thread of its own.

Presence (:mod:`field.store.presence`) and leases (:mod:`field.store.lease`)
each keep one synchronous psycopg connection beside the log's, as
:mod:`field.store.postgres` does, but each in a single worker thread of
its own rather than ``asyncio.to_thread``'s pool: calls on the connection
run one at a time and in order, so a call the event loop stopped waiting
for (a lease's renewal past its deadline) is never raced by the next one, and
closing the connection queues behind it instead of pulling the socket
from under it.

**Bounded waits.** A dead network must not hold a call for minutes: the
connection asks for TCP keepalives and a TCP user timeout (libpq's
``keepalives*`` and ``tcp_user_timeout``), and every statement has a
``statement_timeout`` and a ``lock_timeout``. A call that fails drops a
broken connection; the next call opens a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from field.store.postgres import CONNECT_TIMEOUT, redact

try:
    import psycopg
except ImportError:  # pragma: no cover - the postgres extra is not installed
    psycopg = None  # type: ignore[assignment]

T = TypeVar("T")


class Link:
    """One connection to ``url`` and the one thread that uses it (see the module docstring)."""

    def __init__(self, url: str, *, name: str, timeout: float) -> None:
        self.url = url
        self.where = redact(url)
        self.name = name
        #: seconds a statement, a lock wait or unacknowledged bytes may take
        self.timeout = timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._conn: Any = None
        self._closed = False

    async def run(self, work: Callable[[Any], T]) -> T:
        """``work(connection)`` in the link's thread, after every call queued before it;
        a :class:`psycopg.Error` propagates (the connection is dropped if it broke)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._call, work))

    async def close(self) -> None:
        """Close the connection after the calls queued, and end the thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._drop)
        finally:
            self._executor.shutdown(wait=False)

    # -- in the link's thread --------------------------------------------------------

    def _call(self, work: Callable[[Any], T]) -> T:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self._drop()
            self._conn = conn = self._connect()
        try:
            return work(conn)
        except psycopg.Error:
            if conn.closed or conn.broken:
                self._drop()
            raise

    def _connect(self) -> Any:
        ms = max(1, int(self.timeout * 1000))
        conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=self.name,
            keepalives=1,
            keepalives_idle=max(1, int(self.timeout)),
            keepalives_interval=1,
            keepalives_count=3,
            tcp_user_timeout=ms,
        )
        try:
            # SET takes no parameters; ms is an int
            conn.execute(f"SET statement_timeout = {ms}")
            conn.execute(f"SET lock_timeout = {ms}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                conn.close()
