"""Inbound events: signed events accepted per second, end to end, beside RECORD over HTTP.

    python benchmarks/sources.py [--clients 32] [--seconds 8] [--scheme github standard]

Starts a ``field serve`` child process on a fresh SQLite data directory (``--sync full``,
the default) with an operator token, defines a source, and has ``--clients`` senders
(one HTTP connection each) post GitHub-style pull-request events (about 2 KB of JSON),
each signed as its sender signs it and with a delivery id of its own, in a closed loop
for ``--warmup`` + ``--seconds`` seconds. The source has a filter over the payload and a
content template, so every event goes the whole way: body limit, HMAC over the raw body,
(Standard Webhooks: timestamp), parse, filter, the delivery-id check and one write
through the single writer. One agent subscribed to ``memory.recorded`` reads its SSE
stream meanwhile: an event counts as delivered end to end once its notification arrived.

As a baseline in the same run, the same clients send RECORD (``POST /v1/record``) to a
second server, as ``benchmarks/writes.py`` does.

After each run: ``GET /v1/field/status`` counts the source's accepted events, the SQLite
log holds that many ``memory.recorded`` entries, and the subscriber received that many
notifications; each must equal the acknowledged events.

A request the server refuses (``503 OVERLOADED``, ``429 RATE_LIMITED``) is
waited out for its ``Retry-After`` and sent again, the same signed event with
the same delivery id (the Field recorded nothing for it, so it is not taken
for a duplicate, nor written twice), unless the wait would end past the run;
the ``refused`` column counts the refusals, a line names their kinds, and a
latency is the accepted attempt's.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from _common import bracketed, envelope, pct, progress
from _refusals import Refusals, Reply
from _refusals import post as post_retried
from writes import FieldServer, count_logged_units, get_json, new_loop, record_payload

OPERATOR_TOKEN = "benchmark-operator-token-0123456789"
GITHUB_SECRET = "benchmark github secret"
STANDARD_KEY = b"s" * 32
STANDARD_SECRET = "whsec_" + base64.b64encode(STANDARD_KEY).decode()


def source_definition(scheme: str) -> dict[str, Any]:
    return {
        "name": scheme,
        "scheme": scheme,
        "secret": GITHUB_SECRET if scheme == "github" else STANDARD_SECRET,
        "filter": "payload.action == 'opened' && payload.pull_request.draft == false",
        "unit": {
            "type": "observation",
            "content": "PR #{payload.number} {payload.pull_request.title} by "
            "{payload.pull_request.user.login} in {payload.repository.full_name}",
            "purpose": "Follow pull requests of {payload.repository.full_name}",
            "confidence": 0.9,
        },
    }


def pull_request(rng: random.Random, n: int) -> bytes:
    """A GitHub ``pull_request`` ``opened`` payload of about 2 KB."""
    words = " ".join(
        rng.choice(["fix", "add", "retry", "cache", "sources", "log"]) for _ in range(6)
    )
    return orjson.dumps(
        {
            "action": "opened",
            "number": n,
            "pull_request": {
                "id": 1_000_000 + n,
                "number": n,
                "state": "open",
                "draft": False,
                "title": words,
                "body": "Summary of the change. " * 40,
                "user": {"login": f"dev-{n % 50}", "id": n % 50, "type": "User"},
                "labels": [{"name": "feature"}, {"name": "backend"}],
                "head": {"ref": f"branch-{n}", "sha": hashlib.sha1(str(n).encode()).hexdigest()},
                "base": {"ref": "main"},
            },
            "repository": {
                "id": 42,
                "full_name": "buoyant-systems/agent-mesh",
                "private": False,
                "owner": {"login": "buoyant-systems"},
            },
            "sender": {"login": f"dev-{n % 50}"},
        }
    )


def signed_headers(scheme: str, body: bytes, delivery: str) -> dict[str, str]:
    if scheme == "github":
        digest = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
        return {
            "Content-Type": "application/json",
            "X-GitHub-Event": "pull_request",
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": f"sha256={digest}",
        }
    timestamp = str(int(time.time()))
    mac = hmac.digest(STANDARD_KEY, f"{delivery}.{timestamp}.".encode() + body, hashlib.sha256)
    return {
        "Content-Type": "application/json",
        "webhook-id": delivery,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }


@dataclass
class Run:
    acknowledged: int = 0
    samples: list[tuple[float, float]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    #: requests refused for now, waited out and sent again
    refusals: Refusals = field(default_factory=Refusals)
    window: tuple[float, float] = (0.0, 0.0)
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    notified: int = 0
    status_accepted: int = -1
    log_units: int = -1

    @property
    def rate(self) -> float:
        t0, t1 = self.window
        return sum(1 for _, e in self.samples if t0 <= e <= t1) / (t1 - t0)

    def latency(self, q: float) -> float:
        t0, t1 = self.window
        return pct([(e - s) * 1000 for s, e in self.samples if s >= t0 and e <= t1], q)

    def note(self, reply: Reply) -> None:
        if reply.refused:  # refused until the deadline: counted in refusals, not sent again
            return
        status = reply.status
        answer = reply.answer if isinstance(reply.answer, dict) else {}
        if status == 200 and answer.get("status") == "accepted":
            self.acknowledged += 1
            self.samples.append((reply.began, reply.ended))
        else:
            key = f"{status} {answer.get('code') or answer.get('status')}"
            self.errors[key] = self.errors.get(key, 0) + 1


async def sender(
    url: str, scheme: str, index: int, run: Run, start: asyncio.Event, deadline: list[float]
) -> None:
    """One sender: its own connection; signed events in a closed loop until the deadline."""
    rng = random.Random(index)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        await start.wait()
        n = 0
        target = f"{url}/v1/sources/{scheme}/events"
        while time.perf_counter() < deadline[0]:
            body = pull_request(rng, index * 1_000_000 + n)
            headers = signed_headers(scheme, body, f"delivery-{index}-{n}")
            n += 1
            reply = await post_retried(
                session, target, body, headers, run.refusals, until=deadline[0]
            )
            run.note(reply)


async def recorder(
    url: str,
    token: str,
    agent: str,
    index: int,
    run: Run,
    start: asyncio.Event,
    deadline: list[float],
) -> None:
    """The baseline: RECORD in a closed loop, as benchmarks/writes.py sends it."""
    rng = random.Random(index)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        await start.wait()
        n = 0
        while time.perf_counter() < deadline[0]:
            body = orjson.dumps(envelope("RECORD", agent, record_payload(rng, n)))
            n += 1
            target = f"{url}/v1/record"
            reply = await post_retried(
                session, target, body, headers, run.refusals, until=deadline[0]
            )
            run.note(reply)


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: Any,
    token: str | None = None,
    refusals: Refusals | None = None,
) -> Any:
    """Set-up: the answer to ``body``, sent again after each refusal's Retry-After."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    counted = Refusals() if refusals is None else refusals
    reply = await post_retried(session, url, orjson.dumps(body), headers, counted)
    if reply.status != 200:
        raise RuntimeError(f"{url}: {reply.status} {reply.answer}")
    return reply.answer


async def subscriber(session: aiohttp.ClientSession, url: str, run: Run) -> asyncio.Task[None]:
    """An agent subscribed to memory.recorded, counting notifications on its SSE stream."""
    agent = "watcher"
    body = envelope("REGISTER", agent, {"id": agent, "role": "watcher"})
    registered = await post(session, f"{url}/v1/register", body, None, run.refusals)
    token = registered["token"]
    payload = {"action": "subscribe", "subscription": {"events": ["memory.recorded"]}}
    body = envelope("SUBSCRIBE", agent, payload)
    subscribed = await post(session, f"{url}/v1/subscribe", body, token, run.refusals)
    ready = asyncio.Event()

    async def read() -> None:
        timeout = aiohttp.ClientTimeout(total=None)
        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        async with session.get(subscribed["sse_url"], headers=headers, timeout=timeout) as stream:
            async for line in stream.content:
                if line.startswith(b"event: live"):
                    ready.set()
                elif line.startswith(b"id:"):
                    run.notified += 1

    task = asyncio.create_task(read())
    await asyncio.wait_for(ready.wait(), 30)
    return task


async def drive(server: FieldServer, args: argparse.Namespace, scheme: str | None) -> Run:
    """``scheme`` None: the RECORD baseline."""
    run = Run()
    start = asyncio.Event()
    deadline = [float("inf")]
    async with aiohttp.ClientSession() as session:
        if scheme is None:
            tokens = []
            for i in range(args.clients):
                agent = f"writer-{i:02d}"
                body = envelope("REGISTER", agent, {"id": agent, "role": "writer"})
                answer = await post(session, f"{server.url}/v1/register", body, None, run.refusals)
                tokens.append((agent, answer["token"]))
            tasks = [
                asyncio.create_task(recorder(server.url, token, agent, i, run, start, deadline))
                for i, (agent, token) in enumerate(tokens)
            ]
        else:
            await post(
                session,
                f"{server.url}/v1/sources",
                source_definition(scheme),
                OPERATOR_TOKEN,
                run.refusals,
            )
            tasks = [
                asyncio.create_task(sender(server.url, scheme, i, run, start, deadline))
                for i in range(args.clients)
            ]
        reader = await subscriber(session, server.url, run)
        now = time.perf_counter()
        run.window = (now + args.warmup, now + args.warmup + args.seconds)
        deadline[0] = run.window[1]
        cpu0, client0 = server.cpu_seconds(), time.process_time()
        start.set()
        label = scheme or "RECORD"
        ticks = int((args.warmup + args.seconds) * 10)
        for tick in range(ticks):
            progress(tick, ticks, label)
            await asyncio.sleep(0.1)
        await asyncio.gather(*tasks)
        progress(ticks, ticks, label)
        run.server_cpu = server.cpu_seconds() - cpu0
        run.client_cpu = time.process_time() - client0
        for _ in range(100):  # the last notifications are on their way
            if run.notified >= run.acknowledged:
                break
            await asyncio.sleep(0.1)
        reader.cancel()
        status = await get_json(server.url + "/v1/field/status")
        if scheme is None:
            run.status_accepted = sum(status["counts"]["memory_units"].values())
        else:
            run.status_accepted = status["sources"][scheme]["accepted"]
        run.log_units = count_logged_units(server.data_dir)
    return run


def run_case(args: argparse.Namespace, scheme: str | None) -> Run:
    with tempfile.TemporaryDirectory(prefix="field-sources-") as tmp:
        token_file = Path(tmp) / "operator-token"
        token_file.write_text(OPERATOR_TOKEN)
        flags = ["--sync", args.sync, "--log-level", "info"]
        flags += ["--operator-token-file", str(token_file)]
        with FieldServer(Path(tmp) / "data", *flags) as server:
            loop, _ = new_loop()
            try:
                return loop.run_until_complete(drive(server, args, scheme))
            finally:
                loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured time per case")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in per case")
    parser.add_argument("--sync", choices=["full", "normal"], default="full")
    parser.add_argument(
        "--scheme", nargs="+", choices=["github", "standard"], default=["github", "standard"]
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the RECORD baseline")
    args = parser.parse_args()
    if not 1 <= args.clients <= 256:
        parser.error("--clients must be between 1 and 256")
    if not 0 < args.seconds <= 60 or not 0 <= args.warmup <= 10:
        parser.error("--seconds must be in (0, 60] and --warmup in [0, 10]")

    cases: list[tuple[str, Run]] = [(scheme, run_case(args, scheme)) for scheme in args.scheme]
    if not args.no_baseline:
        cases.append(("RECORD (baseline)", run_case(args, None)))
    _, loop_name = new_loop()
    print(
        f"\nInbound signed events over HTTP: {args.clients} senders, one connection each, "
        f"closed loop, --sync {args.sync}; {args.seconds:g} s measured after {args.warmup:g} s "
        f"warm-up; one SSE subscriber to memory.recorded (load generator: one Python "
        f"process, {loop_name})"
    )
    print(
        f"{'case':<20}{'events/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'srv CPU':>9}{'gen CPU':>9}"
        f"{'acked':>9}{'pushed':>9}{'refused':>9}{'durable':>9}"
    )
    failed = False
    seconds = args.warmup + args.seconds
    for name, run in cases:
        whole = run.status_accepted == run.acknowledged == run.log_units == run.notified
        failed |= not whole or bool(run.errors)
        print(
            f"{name:<20}{run.rate:>10,.0f}{run.latency(0.5):>9.2f}{run.latency(0.99):>9.2f}"
            f"{run.server_cpu / seconds:>9.0%}{run.client_cpu / seconds:>9.0%}"
            f"{run.acknowledged:>9,}{run.notified:>9,}{run.refusals.total:>9,}"
            f"{'yes' if whole else 'NO':>9}"
        )
        if run.refusals:
            print(f"  {name}: refused {run.refusals.describe()}")
        if run.errors or not whole:
            print(
                f"  {name}: acknowledged {run.acknowledged}, status {run.status_accepted}, "
                f"log {run.log_units}, pushed {run.notified}; errors {run.errors or 'none'}"
            )
    if not args.no_baseline:
        baseline = cases[-1][1].rate
        for name, run in cases[:-1]:
            print(f"{name}: {run.rate / baseline:.2f}x RECORD over HTTP")
    print(
        "durable: the status counts, the memory.recorded entries of the SQLite log and the "
        "notifications the subscriber received equal the acknowledged events;\nrefused: "
        "requests answered 503 OVERLOADED or 429 RATE_LIMITED, each sent again after its "
        "Retry-After (not an error)"
    )
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    bracketed(main)
