"""What idle streams cost the writer: RECORD latency with many open, uninterested streams.

    python benchmarks/publish.py [--streams 0 1000 10000] [--records 400]

Every committed batch is published to the push hub before its responses
are released, so whatever the hub does per batch is paid by every write.
This runs the Field's single writer (``FieldService`` over an in-memory
log, with its ``PushHub``; no sockets) and times RECORDs one after the
other (p50 and p99, after a warm-up) with that many live streams open,
each its own subscription of one of 1,000 agents, of two kinds:

* **other events**: subscribed to ``agent.failed``, which a RECORD never
  produces;
* **below threshold**: subscribed to ``memory.recorded`` with
  ``min_relevance`` 1.0, so every RECORD is matched against them (in the
  vectorized matcher) and none is notified.

The ratio is against the same run's latency with no stream open: a
publish should cost what its events need, not what is connected.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

from _common import VOCABULARY, bracketed, envelope, pct, progress

from field.contract.model import Limits
from field.core.field import Field
from field.engine.push import PushHub
from field.engine.service import FieldService
from field.store.memory import MemoryEventLog

KINDS = {
    "other events": {"events": ["agent.failed"]},
    "below threshold": {"events": ["memory.recorded"], "min_relevance": 1.0},
}
AGENTS = 1000


async def measure(streams: int, subscription: dict[str, Any], records: int) -> list[float]:
    """Seconds per RECORD with ``streams`` live streams of ``subscription``."""
    limits = Limits(max_subscriptions_per_agent=10**6)
    service = FieldService(MemoryEventLog(), lambda: Field(limits=limits))
    hub = PushHub(service)
    await service.start()
    tokens: dict[str, str] = {}

    async def call(operation: str, agent: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = envelope(operation, agent, payload)
        token = tokens.get(agent)
        outcome = await service.execute(lambda f: f.handle(body, token=token), operation=operation)
        return outcome.response

    try:
        for agent in ["writer", *(f"a{i}" for i in range(min(streams, AGENTS)))]:
            payload = {"id": agent, "role": "analyst", "interests": ["pricing"]}
            tokens[agent] = (await call("REGISTER", agent, payload))["token"]
        for n in range(streams):
            progress(n + 1, streams, f"{streams:,} streams")
            agent = f"a{n % AGENTS}"
            payload = {"action": "subscribe", "subscription": subscription}
            subscription_id = (await call("SUBSCRIBE", agent, payload))["subscription_id"]
            connection = hub.connect(agent, "sse")
            hub.attach(connection, subscription_id, None)
        rng = random.Random(5)
        times = []
        for _ in range(records):
            payload = {
                "type": "finding",
                "content": " ".join(rng.choices(VOCABULARY, k=12)),
                "intent": {"purpose": "publish benchmark"},
                "confidence": {"score": 0.8, "reasoning": "generated"},
            }
            start = time.perf_counter()
            await call("RECORD", "writer", payload)
            times.append(time.perf_counter() - start)
        queued = [f for c in hub.connections for f in c.outbox.drain_now(10**6)]
        assert all(f.cursor is None for f in queued), "an idle stream was notified"
        return times[records // 10 :]  # after a warm-up
    finally:
        await service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[0, 1000, 10000])
    parser.add_argument("--records", type=int, default=400)
    args = parser.parse_args()
    rows = []
    for kind, subscription in KINDS.items():
        for streams in args.streams:
            times = asyncio.run(measure(streams, subscription, args.records))
            rows.append((kind, streams, statistics.median(times), pct(times, 0.99)))
    print(
        f"\nRECORD latency through the writer with idle live streams ({args.records} RECORDs "
        "one after the other, in-memory log, no sockets)"
    )
    print(f"{'streams':<17}{'count':>8}{'p50 ms':>9}{'p99 ms':>9}{'p50 / none':>12}")
    base = {kind: p50 for kind, streams, p50, _ in rows if streams == 0}
    for kind, streams, p50, p99 in rows:
        ratio = f"{p50 / base[kind]:>11.1f}x" if kind in base else f"{'':>12}"
        print(f"{kind:<17}{streams:>8,}{p50 * 1000:>9.3f}{p99 * 1000:>9.3f}{ratio}")


if __name__ == "__main__":
    bracketed(main)
