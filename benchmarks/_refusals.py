"""Requests the Field refused for now: waited out as told, sent again, and counted.

The Field answers work it will not take now with ``503 OVERLOADED`` (admission control,
the request queue's bound, a starting server) or ``429 RATE_LIMITED`` (a rate limit), each
with a ``Retry-After`` header. A refused request changed nothing, so sending the very same
request again after that wait neither loses a write nor makes one twice. The benchmarks'
HTTP clients do that through :func:`post` and count every refusal by kind in a
:class:`Refusals`, which their summaries print beside the throughput and the latencies: a
reader sees how many requests admission refused, rather than a benchmark that died at the
first refusal. Latencies are those of the attempt the Field answered, not of the waits.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from _common import envelope

from field.client.errors import retry_after_seconds

#: (status, code) of the refusals that are waited out and sent again.
RETRIED = {(503, "OVERLOADED"), (429, "RATE_LIMITED")}
#: Refusals of one request after which a benchmark gives up on it (and fails).
MAX_REFUSALS = 100


@dataclass
class Refusals:
    """Refusals counted by kind (``"503 OVERLOADED"``), and the seconds waited after them."""

    counts: Counter[str] = field(default_factory=Counter)
    waited: float = 0.0

    def note(self, kind: str, wait: float) -> None:
        self.counts[kind] += 1
        self.waited += wait

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __bool__(self) -> bool:
        return self.total > 0

    def as_dict(self) -> dict[str, Any]:
        """Plain data, to send from a client process (see :meth:`add`)."""
        return {"counts": dict(self.counts), "waited": self.waited}

    def add(self, other: Refusals | dict[str, Any]) -> Refusals:
        data = other.as_dict() if isinstance(other, Refusals) else other
        self.counts.update(data["counts"])
        self.waited += data["waited"]
        return self

    def describe(self) -> str:
        """``none``, or ``12 (503 OVERLOADED 10, 429 RATE_LIMITED 2; 14 s waited in all, ...)``."""
        if not self:
            return "none"
        kinds = ", ".join(f"{kind} {n:,}" for kind, n in sorted(self.counts.items()))
        return f"{self.total:,} ({kinds}; {self.waited:,.0f} s waited in all, each sent again)"


def refusal(status: int, headers: Any, answer: Any) -> tuple[str, float] | None:
    """(kind, seconds to wait) when the answer is a refusal to wait out, else None."""
    code = answer.get("code") if isinstance(answer, dict) else None
    if (status, code) not in RETRIED:
        return None
    wait = retry_after_seconds(headers.get("Retry-After"))
    if wait is None:
        details = answer.get("details") or {}
        wait = float(details.get("retry_after") or 1.0)
    return f"{status} {code}", wait


@dataclass
class Reply:
    """The Field's answer to the last attempt of a request."""

    status: int
    #: the body as read (parsed by ``answer`` only when asked for)
    raw: bytes
    #: ``time.perf_counter()`` when that attempt was sent and when its answer was read
    began: float
    ended: float
    #: ``time.time()`` when that attempt was sent
    sent_at: float
    #: the last attempt was refused too (given up: ``until`` would have passed)
    refused: bool = False

    @property
    def ms(self) -> float:
        return (self.ended - self.began) * 1000

    @functools.cached_property
    def answer(self) -> Any:
        """The body as JSON (as text if it is not JSON, None if empty)."""
        return parse(self.raw)


def parse(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    refusals: Refusals,
    *,
    until: float | None = None,
) -> Reply:
    """POST ``body`` until the Field does not refuse it for now (see the module).

    Each refusal is counted in ``refusals`` and waited out (``Retry-After``) before the same
    body is sent again. With ``until`` (a ``time.perf_counter()`` value), a refusal whose wait
    would end past it is counted and returned (``refused``) instead.
    """
    refused = 0
    while True:
        sent_at, began = time.time(), time.perf_counter()
        async with session.post(url, data=body, headers=headers) as response:
            raw = await response.read()
            status, response_headers = response.status, response.headers
        ended = time.perf_counter()
        # only a 503 or 429 is parsed here: a large answer costs this process nothing more
        found = refusal(status, response_headers, parse(raw)) if status in (503, 429) else None
        if found is None:
            return Reply(status, raw, began, ended, sent_at)
        kind, wait = found
        refusals.note(kind, wait)
        refused += 1
        if until is not None and time.perf_counter() + wait > until:
            return Reply(status, raw, began, ended, sent_at, refused=True)
        if refused >= MAX_REFUSALS:
            raise RuntimeError(f"{url}: refused {refused} times in a row, last {kind}: {raw!r}")
        await asyncio.sleep(wait)


async def send(
    session: aiohttp.ClientSession,
    url: str,
    operation: str,
    agent: str,
    payload: Any,
    token: str | None,
    refusals: Refusals,
) -> Reply:
    """The operation's envelope POSTed to ``url``'s ``/v1/<operation>`` (with ``token``, if
    any), sent again after each refusal's Retry-After (:func:`post`); fails on any other
    answer than 200."""
    body = orjson.dumps(envelope(operation, agent, payload))
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    reply = await post(session, f"{url}/v1/{operation.lower()}", body, headers, refusals)
    if reply.status != 200:
        raise RuntimeError(f"{operation} failed: {reply.status} {reply.raw[:300]!r}")
    return reply
