"""A ``since_epoch`` poll through the Field's service in one process, no HTTP.

    python benchmarks/attune_service.py [--units 20000] [--runs 80] [--embedder wordllama]
                                        [--before TREE]

What ``attune_http.py`` times over HTTP, without HTTP: a
:class:`~field.engine.service.FieldService` on an in-memory log in this process, the
agents and ``--units`` units of ``attune.py``'s set-up, then in alternating rounds a poll
after 3 new units (the RECORDs not timed) and a poll with none. Unlike ``attune.py``
(the core alone, called straight) every operation goes through the service as the HTTP
binding sends it, so what the writer and its threads do beside a request is in the figure.
``--before TREE`` runs the same in a child process on the source tree ``TREE`` (an older
checkout), alternating with this one, ``--rounds`` times. Prints p50 and p99 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import ROOT, VOCABULARY, bracketed, envelope, pct, unit_payload

SCOPE = {
    "role": "strategist",
    "max_units": 10,
    "interests": ["pricing", "churn"],
    "active_task_id": "task-7",
}
NEW_UNIT = {
    "type": "finding",
    "content": "new pricing data",
    "intent": {"purpose": "p"},
    "confidence": {"score": 0.5, "reasoning": "r"},
}


async def measure(units: int, runs: int, embedder_name: str) -> dict[str, list[float]]:
    """The polls' times in ms: ``after_writes`` and ``none_new``."""
    import field.cli  # noqa: F401  (OpenBLAS's settings, as field serve sets them)
    from field.core.field import Field
    from field.engine.service import FieldService
    from field.ranking.embedding import load_embedder
    from field.store.memory import MemoryEventLog

    embedder = load_embedder(embedder_name)
    service = FieldService(MemoryEventLog(), lambda: Field(embedder=embedder))
    await service.start()

    async def send(operation: str, agent: str, payload: Any, token: str | None) -> Any:
        message = envelope(operation, agent, payload)
        outcome = await service.execute(
            lambda f: f.handle(message, token=token, operation=operation), operation=operation
        )
        return outcome.response

    try:
        rng = random.Random(7)
        tokens: dict[str, str] = {}
        for i in range(51):
            agent = f"agent-{i}"
            role = ["strategist", "market_researcher", "analyst", "engineer"][i % 4]
            payload = {"id": agent, "role": role, "interests": rng.sample(VOCABULARY, 3)}
            tokens[agent] = (await send("REGISTER", agent, payload, None))["token"]
        for _ in range(units):
            agent = f"agent-{rng.randrange(1, 51)}"
            await send("RECORD", agent, unit_payload(rng), tokens[agent])
        reader, writer = "agent-0", "agent-1"
        cursor = (await send("ATTUNE", reader, {"scope": SCOPE}, tokens[reader]))["epoch"]
        samples: dict[str, list[float]] = {"after_writes": [], "none_new": []}
        for _ in range(runs):
            for case in samples:
                if case == "after_writes":
                    for _ in range(3):
                        await send("RECORD", writer, NEW_UNIT, tokens[writer])
                poll = {"scope": {**SCOPE, "since_epoch": cursor}}
                start = time.perf_counter()
                answer = await send("ATTUNE", reader, poll, tokens[reader])
                samples[case].append((time.perf_counter() - start) * 1000)
                cursor = answer["epoch"]
        return samples
    finally:
        await service.stop()


def run_tree(tree: str | None, args: argparse.Namespace) -> dict[str, list[float]]:
    """One measurement: here, or in a child process on ``tree``'s ``field``."""
    if tree is None:
        return asyncio.run(measure(args.units, args.runs, args.embedder))
    command = [sys.executable, __file__, "--child", "--units", str(args.units)]
    command += ["--runs", str(args.runs), "--embedder", args.embedder]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, str(ROOT / "benchmarks")])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith("{"))
    result: dict[str, list[float]] = json.loads(line)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=80)
    parser.add_argument("--embedder", default="wordllama", help="as field serve --embedder")
    parser.add_argument("--before", help="also measure the Field of this source tree")
    parser.add_argument("--rounds", type=int, default=2, help="alternations with --before")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.units <= 1_000_000 or not 1 <= args.runs <= 10_000:
        parser.error("--units must be in [1, 1000000] and --runs in [1, 10000]")
    if args.child:
        print(json.dumps(run_tree(None, args)))
        return
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    if args.before is not None:
        trees = [("before", str(Path(args.before).resolve())), *trees]
    rounds = args.rounds if args.before is not None else 1
    print(
        f"ATTUNE through the service in one process: {args.units:,} units, --embedder "
        f"{args.embedder}, {args.runs} polls of each kind a round"
    )
    print(f"{'tree':<12}{'round':>6}{'poll after 3 new, p50':>24}{'p99':>8}{'none new, p50':>16}")
    for round_ in range(1, rounds + 1):
        for name, tree in trees:
            samples = run_tree(tree, args)
            after, none = samples["after_writes"], samples["none_new"]
            print(
                f"{name:<12}{round_:>6}{statistics.median(after):>21.2f} ms{pct(after, 0.99):>8.2f}"
                f"{statistics.median(none):>13.2f} ms"
            )


if __name__ == "__main__":
    bracketed(main)
