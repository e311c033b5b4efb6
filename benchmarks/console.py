"""What the console costs: a snapshot's build time and size, and the writer beside it.

    python benchmarks/console.py [--agents 100 1000 10000] [--seconds 5] [--streams 32]

The Field's writer (``FieldService``, in-memory log, its ``PushHub``; no
sockets) with that many agents, each with one subscription read by a live
stream, 100 open conflicts and as many resolved. Then:

* **build**: the time to build one tick's snapshot, its shared part (status,
  agents, connections, rates) and the part of one viewer (the operator: every
  conflict and subscription; an agent: its own), median of 30 builds, and
  the bytes of the operator's snapshot;
* **writer**: RECORD latency (p50, p99, max; one after the other for
  ``--seconds``, the first tenth not counted) with no console open, then with
  ``--streams`` console streams
  open (each its own agent, the operator's among them), ticking and drained
  as a browser would read them. Every committed batch makes the console tick
  (at most five times a second), and a tick runs on the event loop the
  writer runs on: what it costs, some writes wait for.

The garbage collector is set as ``field serve`` sets it, once the Field is
populated.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

from _common import VOCABULARY, bracketed, envelope, pct, progress

from field.cli.main import _tune_gc
from field.contract.model import Limits
from field.core.egress import EgressPolicy
from field.core.field import Field
from field.core.secrets import SecretBox
from field.engine.delivery import DeliveryEngine, DeliverySettings
from field.engine.push import PushHub
from field.engine.ratelimits import AgentRateLimits
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog
from field.transports.console import ConsoleFeed, viewer_of
from field.transports.door import FrontDoor
from field.transports.http import HTTPBinding
from field.transports.runtime import Running, Runtime

OPERATOR_TOKEN = "console-benchmark-operator-token"
CONFLICTS = 100


class Run:
    """A writer, a hub and a console feed over one in-memory Field."""

    def __init__(self) -> None:
        limits = Limits(max_subscriptions_per_agent=10**6)
        self.service = FieldService(
            MemoryEventLog(), lambda: Field(limits=limits, operator_token=OPERATOR_TOKEN)
        )
        self.hub = PushHub(self.service)
        deliveries = DeliveryEngine(
            self.service,
            self.hub,
            DeliverySettings(),
            policy=EgressPolicy(),
            secret_box=SecretBox(bytes(32)),
        )
        runtime = Runtime()
        runtime.start(Running(self.service, self.hub, deliveries))
        door = FrontDoor(runtime, rate_limits=AgentRateLimits(None))
        status = HTTPBinding(runtime, door, limits=Limits()).status
        self.feed = ConsoleFeed(runtime, status=status)
        self.tokens: dict[str, str] = {"operator": OPERATOR_TOKEN}
        self.rng = random.Random(5)

    async def call(self, operation: str, agent: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = envelope(operation, agent, payload)
        token = self.tokens.get(agent)
        outcome = await self.service.execute(
            lambda f: f.handle(body, token=token), operation=operation
        )
        return outcome.response

    async def register(self, agent: str) -> None:
        payload = {"id": agent, "role": "analyst", "interests": ["pricing"]}
        self.tokens[agent] = (await self.call("REGISTER", agent, payload))["token"]

    async def record(self, agent: str, **more: Any) -> dict[str, Any]:
        payload = {
            "type": "finding",
            "content": " ".join(self.rng.choices(VOCABULARY, k=12)),
            "intent": {"purpose": "console benchmark"},
            "confidence": {"score": 0.8, "reasoning": "generated"},
            **more,
        }
        return await self.call("RECORD", agent, payload)

    async def populate(self, agents: int) -> None:
        await self.register("writer")
        for n in range(agents):
            progress(n + 1, agents, f"{agents:,} agents")
            agent = f"a{n}"
            await self.register(agent)
            subscription = {"events": ["agent.failed"]}
            payload = {"action": "subscribe", "subscription": subscription}
            subscription_id = (await self.call("SUBSCRIBE", agent, payload))["subscription_id"]
            self.hub.attach(self.hub.connect(agent, "sse"), subscription_id, None)
        for n in range(2 * CONFLICTS):
            first = await self.record("writer")
            relation = {"type": "contradicts", "target_id": first["memory_unit_id"]}
            second = await self.record("a0", relations=[relation])
            if n % 2:
                resolution = {"rationale": "benchmark", "winner_id": first["memory_unit_id"]}
                payload = {
                    "conflict_id": second["conflicts_detected"][0],
                    "strategy": "authority",
                    "resolution": resolution,
                }
                await self.call("MERGE", "operator", payload)

    def builds(self) -> dict[str, float | int]:
        """Median seconds of each part of a snapshot, and the operator's snapshot size."""
        field = self.service.field
        operator = viewer_of(field, OPERATOR_TOKEN)
        agent = viewer_of(field, self.tokens["a0"])
        times: dict[str, list[float]] = {"shared": [], "operator": [], "agent": []}
        for _ in range(30):
            start = time.perf_counter()
            shared = self.feed._shared_part(self.hub)
            times["shared"].append(time.perf_counter() - start)
            for name, viewer in (("operator", operator), ("agent", agent)):
                start = time.perf_counter()
                self.feed._viewer_part(self.hub, viewer, viewer.record)
                times[name].append(time.perf_counter() - start)
        part = self.feed._viewer_part(self.hub, operator, operator.record)
        import orjson

        size = len(shared) + len(orjson.dumps(part))
        return {**{k: statistics.median(v) for k, v in times.items()}, "bytes": size}

    async def writes(self, seconds: float) -> list[float]:
        times: list[float] = []
        until = time.perf_counter() + seconds
        while (start := time.perf_counter()) < until:
            await self.record("writer")
            times.append(time.perf_counter() - start)
        return times[len(times) // 10 :]

    async def with_console(self, streams: int, seconds: float) -> tuple[list[float], int]:
        """RECORD latency with ``streams`` console streams open, drained; and the snapshots
        they were offered."""
        field = self.service.field
        viewers = [viewer_of(field, OPERATOR_TOKEN)]
        viewers += [viewer_of(field, self.tokens[f"a{n}"]) for n in range(streams - 1)]
        opened = [self.feed.open(self.hub, viewer) for viewer in viewers]
        received = 0

        async def drain(outbox: Any) -> None:
            nonlocal received
            while await outbox.get() is not None:
                received += 1

        readers = [asyncio.create_task(drain(s.connection.outbox)) for s in opened]
        try:
            return await self.writes(seconds), received
        finally:
            for stream in opened:
                stream.end(None)
                self.feed.close(stream)
            await asyncio.gather(*readers)


async def measure(agents: int, seconds: float, streams: int) -> dict[str, Any]:
    run = Run()
    await run.service.start()
    try:
        await run.populate(agents)
        _tune_gc()  # the collector's settings of ``field serve``, past what was populated
        builds = run.builds()
        alone = await run.writes(seconds)
        beside, snapshots = await run.with_console(streams, seconds)
        return {"builds": builds, "alone": alone, "beside": beside, "snapshots": snapshots}
    finally:
        run.hub.shutdown()
        await run.service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--streams", type=int, default=32)
    args = parser.parse_args()
    results = {n: asyncio.run(measure(n, args.seconds, args.streams)) for n in args.agents}
    print(
        f"\nOne snapshot's build (median of 30; each agent has one subscription read by a "
        f"live stream; {CONFLICTS} open conflicts and {CONFLICTS} resolved)"
    )
    print(f"{'agents':>8}{'shared ms':>11}{'operator ms':>13}{'agent ms':>10}{'KB':>8}")
    for agents, result in results.items():
        b = result["builds"]
        print(
            f"{agents:>8,}{b['shared'] * 1000:>11.2f}{b['operator'] * 1000:>13.2f}"
            f"{b['agent'] * 1000:>10.3f}{b['bytes'] / 1024:>8.0f}"
        )
    print(
        f"\nRECORD latency (one after the other for {args.seconds:g} s, in-memory log), alone "
        f"and with {args.streams} console streams open"
    )
    print(
        f"{'agents':>8}{'alone p50':>11}{'p99':>8}{'max':>8}{'console p50':>13}{'p99':>8}"
        f"{'max':>8}{'snapshots':>11}"
    )
    for agents, result in results.items():
        row = f"{agents:>8,}"
        for times, width in ((result["alone"], 11), (result["beside"], 13)):
            row += f"{statistics.median(times) * 1000:>{width}.3f}"
            row += f"{pct(times, 0.99) * 1000:>8.2f}{max(times) * 1000:>8.2f}"
        print(row + f"{result['snapshots']:>11,}")


if __name__ == "__main__":
    bracketed(main)
