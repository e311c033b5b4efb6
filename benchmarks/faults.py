"""Faults for half an hour: the soak mode of tests/fault_harness.py.

    python benchmarks/faults.py [--duration 1800] [--nodes 3] [--seed N] [--rate 10]
                                [--concurrency 2] [--settle 120]

Starts ``--nodes`` ``field serve`` processes on one fresh database of the local PostgreSQL
server (``FIELD_TEST_POSTGRES``, as the tests find it; dropped afterwards), each behind a TCP
proxy of the harness, and injects faults for ``--duration`` seconds, ``--concurrency`` at
most at once (node faults always spare one node): SIGKILL and restart, SIGSTOP for seconds,
``pg_terminate_backend`` of a node's backends, ``LOCK TABLE field_log`` / ``field_log_head``
held for seconds, and latency, a drop, a partition or refusal on a node's proxy. Pauses,
locks and partitions last 1 to 8 s here (the CI mode's 1 to 2.5 s), past the 5 s a node may
hold the log's head row. Meanwhile a writer on every node RECORDs at ``--rate`` units a
second in all, a WebSocket and an SSE subscriber on every node and two pollers on every node
(one staying, one moving at every poll) read, and a webhook receiver takes one subscription's
deliveries.

Prints the seed first, each fault as it ends, then the report: what was written
(acknowledged, unknown, refused), what each reader received, every fault with its time, and
every anomaly with its log position, epoch, the node it was written through, its neighbours
and the nodes' log lines around it. The nodes' stderr stays in the directory the first line
names. Exits 1 on any anomaly or harness error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from _common import bracketed  # puts the repository's root on sys.path: tests/ is a package

from tests.fault_harness import HarnessConfig, run_harness
from tests.postgres_util import CANDIDATES, admin_url


def main() -> int:
    """The run; its exit status (1: an anomaly or a harness error)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of faults")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None, help="the faults' seed (random)")
    parser.add_argument("--rate", type=float, default=10.0, help="RECORD/s in all (10)")
    parser.add_argument("--concurrency", type=int, default=2, help="faults at once (2)")
    parser.add_argument("--settle", type=float, default=120.0, help="seconds to settle (120)")
    args = parser.parse_args()
    if not 10 <= args.duration <= 86400 or not 2 <= args.nodes <= 26:
        parser.error("--duration must be in [10, 86400] and --nodes in [2, 26]")
    if not 0 < args.rate <= 1000 or not 1 <= args.concurrency <= args.nodes:
        parser.error("--rate must be in (0, 1000] and --concurrency in [1, --nodes]")
    if admin_url() is None:
        sys.exit(f"no PostgreSQL server at {' or '.join(CANDIDATES)} (FIELD_TEST_POSTGRES)")
    config = HarnessConfig(
        nodes=args.nodes,
        duration=args.duration,
        rate=args.rate,
        seed=args.seed,
        concurrency=args.concurrency,
        gap=(0.5, 3.0),
        fault_seconds=(1.0, 8.0),
        settle_timeout=args.settle,
    )
    report = asyncio.run(run_harness(config))
    print(report.render(most=200), flush=True)
    if report.ok:
        return 0
    print(f"! {len(report.anomalies)} anomalies, {len(report.errors)} harness errors")
    return 1


if __name__ == "__main__":
    status: list[int] = []
    bracketed(lambda: status.append(main()))  # the machine's speed is printed either way
    sys.exit(status[0] if status else 1)
