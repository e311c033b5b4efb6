"""Faults as a habit: three ``field serve`` nodes on one PostgreSQL database, each behind a
TCP proxy the test controls, through every kind of fault the harness knows
(tests/fault_harness.py: kills, pauses, terminated backends, locked tables, latency, drops,
partitions, refusals) while writers, pushers (WebSocket and SSE), pollers and a webhook
receiver run. Afterwards every acknowledged write is in the log once, every stream, poller
and the webhook holds every unit once and in order, and the log's epochs ascend.

The run's seed is printed first; ``FIELD_FAULTS_SEED=<seed>`` repeats its faults (their
timing against the load still varies). The half-hour soak of the same is
``benchmarks/faults.py``. Without a reachable PostgreSQL server the test is skipped, naming
the URL tried.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")

from .fault_harness import FAULT_KINDS, HarnessConfig, run_harness  # noqa: E402
from .postgres_util import require_postgres  # noqa: E402

pytestmark = pytest.mark.slow

#: Seconds of faults: every kind once takes about 20 of them, then a few more at random (the
#: soak, benchmarks/faults.py, draws them for half an hour).
FAULT_SECONDS = 24.0


async def test_every_kind_of_fault_loses_and_repeats_nothing(tmp_path: Path) -> None:
    require_postgres()
    seed = os.environ.get("FIELD_FAULTS_SEED")
    config = HarnessConfig(
        nodes=3,
        duration=FAULT_SECONDS,
        rate=8.0,
        seed=int(seed) if seed else None,
        gap=(0.3, 1.0),
        fault_seconds=(1.0, 2.5),
        settle_timeout=30.0,
        workdir=tmp_path,
    )
    report = await run_harness(config)
    print(report.render())
    assert {fault.kind for fault in report.faults} == set(FAULT_KINDS), report.render()
    assert report.counts["acknowledged"] > 0 and report.counts["notifications"] > 0
    assert report.ok, report.render()
