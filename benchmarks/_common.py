"""Helpers shared by the benchmark scripts: envelopes, a progress bar, percentiles."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VOCABULARY = (
    "market size growth pricing competitor churn retention revenue forecast hiring risk "
    "compliance regulation europe saas smb enterprise budget segment channel partner "
    "product roadmap launch feature adoption onboarding support security privacy audit"
).split()
ROLES = ["strategist", "market_researcher", "analyst", "engineer"]


def envelope(operation: str, agent: str, payload: dict[str, Any], epoch: int = 0) -> Any:
    return {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "m",
        "operation": operation,
        "agent_id": agent,
        "session_id": None,
        "epoch": epoch,
        "payload": payload,
    }


def progress(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr."""
    if done % max(1, total // 50) and done != total:
        return
    bar = "#" * (30 * done // max(1, total))
    end = "\n" if done == total else ""
    print(f"\r{label:>12} [{bar:<30}] {done}/{total}", end=end, file=sys.stderr, flush=True)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
