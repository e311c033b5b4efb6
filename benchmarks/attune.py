"""ATTUNE latency over many active units, in the core (no HTTP, no log).

    python benchmarks/attune.py [--units 100000] [--runs 50] [--embedder wordllama]
                                [--no-baseline]

Builds a Field with ``--units`` committed units from 50 agents, then times:

* a full ATTUNE (interests, context hint, task; top 10 of every unit),
* a ``since_epoch`` poll that finds a handful of new units,
* a HANDOFF of a new task to the reader, whose package holds its best 10 units
  (ATTUNE's ranking with the task as its active task and the title as hint),
* the plain per-unit Python scorer of ``tests/reference_relevance.py`` on
  the same Field and query, as the baseline the vectorized scorer is
  compared with (it runs on fewer units, scaled, since it is slow).

Prints p50 and p99 in milliseconds and the ratio to the baseline. The Field embeds with
the core's default (hashing) unless ``--embedder`` names another (as ``field serve
--embedder``: the server's default is wordllama). ``--no-baseline`` skips the per-unit
scorer (with a model's embedder it takes minutes: it scores unit by unit in Python).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from _common import VOCABULARY, bracketed, envelope, pct, progress, unit_payload

from field.core.field import Field, Ids
from field.ranking import relevance
from field.ranking.embedding import Embedder, load_embedder
from tests.reference_relevance import reference_scores


def build(
    units: int, rng: random.Random, embedder: Embedder | None = None
) -> tuple[Field, dict[str, str]]:
    counter = iter(range(1, 10**9))
    field = Field(ids=Ids(suffix=lambda: f"{next(counter):020x}"), embedder=embedder)
    field.genesis()
    tokens = {}
    for i in range(51):
        agent = f"agent-{i}"
        role = ["strategist", "market_researcher", "analyst", "engineer"][i % 4]
        payload = {"id": agent, "role": role, "interests": rng.sample(VOCABULARY, 3)}
        outcome = field.handle(envelope("REGISTER", agent, payload), token=None)
        tokens[agent] = outcome.response["token"]
    for n in range(units):
        progress(n, units, "recording")
        agent = f"agent-{rng.randrange(1, 51)}"
        field.handle(envelope("RECORD", agent, unit_payload(rng)), token=tokens[agent])
    progress(units, units, "recording")
    return field, tokens


def timed(fn: Any, runs: int, label: str, setup: Any = None) -> list[float]:
    samples = []
    for i in range(runs):
        progress(i, runs, label)
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    progress(runs, runs, label)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--embedder", help="as field serve --embedder (default: hashing)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the per-unit scorer")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    embedder = None if args.embedder is None else load_embedder(args.embedder)
    field, tokens = build(args.units, rng, embedder)
    reader = "agent-0"
    scope = {
        "role": "strategist",
        "max_units": 10,
        "interests": ["pricing", "churn"],
        "active_task_id": "task-7",
    }

    def full() -> None:
        payload = {"scope": scope, "context_hint": "pricing for smb enterprise"}
        field.handle(envelope("ATTUNE", reader, payload), token=tokens[reader])

    writer = "agent-1"
    cursor = {"epoch": field.epoch}

    def write_three() -> None:  # a few new units since the last poll (not timed)
        for _ in range(3):
            payload = {
                "type": "finding",
                "content": "new pricing data",
                "intent": {"purpose": "p"},
                "confidence": {"score": 0.5, "reasoning": "r"},
            }
            field.handle(envelope("RECORD", writer, payload), token=tokens[writer])

    def poll() -> None:
        payload = {"scope": {**scope, "since_epoch": cursor["epoch"]}}
        response = field.handle(envelope("ATTUNE", reader, payload), token=tokens[reader])
        cursor["epoch"] = response.response["epoch"]

    full_ms = timed(full, args.runs, "full")
    poll_ms = timed(poll, args.runs, "poll", setup=write_three)
    task: dict[str, str] = {}

    def new_task() -> None:  # a task of agent-2's to hand off (not timed)
        payload = {"action": "create", "title": "pricing for smb", "assignee": "agent-2"}
        outcome = field.handle(envelope("COORDINATE", "agent-2", payload), token=tokens["agent-2"])
        task["id"] = outcome.response["task"]["id"]

    def handoff() -> None:
        payload = {"task_id": task["id"], "to_agent_id": reader, "context": {"max_units": 10}}
        outcome = field.handle(envelope("HANDOFF", "agent-2", payload), token=tokens["agent-2"])
        assert outcome.response["status"] == "ok", outcome.response

    handoff_ms = timed(handoff, args.runs, "handoff", setup=new_task)

    units = list(field.state.units.values())
    print(f"\nATTUNE over {len(units):,} active units ({args.runs} runs each)")
    print(f"{'case':<34}{'p50 ms':>10}{'p99 ms':>10}")
    print(f"{'full scope, top 10':<34}{pct(full_ms, 0.5):>10.2f}{pct(full_ms, 0.99):>10.2f}")
    poll_row = f"{'since_epoch poll, 3 new units':<34}"
    print(f"{poll_row}{pct(poll_ms, 0.5):>10.2f}{pct(poll_ms, 0.99):>10.2f}")
    handoff_row = f"{'HANDOFF, the best 10 for the target':<34}"
    print(f"{handoff_row}{pct(handoff_ms, 0.5):>10.2f}{pct(handoff_ms, 0.99):>10.2f}")
    if args.no_baseline:
        return
    base_units = units[: min(len(units), 5000)]
    query = relevance.Query(
        agent_id=reader,
        role="strategist",
        interests=["pricing", "churn"],
        context_hint="pricing for smb enterprise",
        task_id="task-7",
        recency_weight=0.25,
        include_own=False,
        since_epoch=None,
    )
    index = field.state.index
    vectors = {  # the embeddings the index holds (a plain scorer reads them, too)
        u["id"]: (
            [int(x) for x in index.vectors[index.rows[u["id"]]].tolist()],
            int(index.squares[index.rows[u["id"]]]),
        )
        for u in base_units
    }
    start = time.perf_counter()
    reference_scores(base_units, query, embedder, vectors=vectors)
    loop_ms = (time.perf_counter() - start) * 1000 * len(units) / len(base_units)

    print(
        f"{'baseline: per-unit Python loop':<34}{loop_ms:>10.1f}{'':>10}"
        f"  (scaled from {len(base_units):,} units)"
    )
    print(f"vectorized full ATTUNE is {loop_ms / statistics.median(full_ms):,.0f}x the loop")


if __name__ == "__main__":
    bracketed(main)
