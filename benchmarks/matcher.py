"""Subscription matching: time per event against 1k, 10k and 100k subscriptions.

    python benchmarks/matcher.py [--subscriptions 1000 10000 100000] [--events 200]
                                 [--embedder hashing]

For each size, builds a Field (in the core, no I/O) with up to 5,000 agents
holding that many subscriptions in total (mixed event types, thresholds
0 to 0.7 and debounce windows), records ``--events`` units and times:

* the vectorized :class:`~field.subscriptions.matcher.Matcher` on the whole
  batch (the median of 3 runs), and one event at a time ("single", each
  call making its scope; "kept", one scope made once and reused, as the
  push hub does between batches), after the index has embedded the
  recorded units (its work, measured by ``attune.py``);
* a plain loop over subscriptions computing the same rules per
  subscription in Python (facts of the event computed once, the semantic
  factor from the embeddings the registry and index hold), on a sample of
  the events: the baseline.

Prints ms per event, events per second and the speed-up over the loop.

With ``--filtered F`` (default 0.1), a fraction F of the subscriptions carry a
CEL filter (:data:`FILTERS`: four texts that read only ``event``, one that reads
``subscriber``, one that reads ``parameters`` sealed by per-subscription
bindings). The table then also gives the time per event of the whole stage
(matcher and filters, one scope kept, as the push hub runs it) beside the
vectorized stage alone on the same Field, and the filter evaluations per
event. Last, the cost of one evaluation of each of those expressions with the
library the Field uses (``cel``) and with ``cel-python`` (``celpy``), same
expressions and contexts, same run: once with the context converted on every
call, once with it converted ahead (a ``cel.Context`` with ``event`` added once
and the rest through a resolver, as the Field does; a ``celpy`` activation
converted once).

With ``--distinct N`` (e.g. 100000) the script measures matching at N distinct
agent profiles instead: N agents, each with its own two interests (two words
each from the words of the labelled set, ``benchmarks/data/relevance.json``),
hold one subscription each (memory.recorded and two other names, thresholds
and debounce as above), so the registry holds N distinct profiles and three
interest rows per profile (two interests and the two joined). Per embedder
(``--embedder hashing wordllama``) it records ``2 * --events`` units and times
the last ``--events`` (all at one calibration checkpoint, reached once before
timing): one event at a time with a kept scope ("single", the push hub's way)
and all of them in one call ("batch"), beside the raw cost of what matching must
read: NumPy's product of the registry's (interest rows x dim) float32 matrix, as
the Field stores it, by the event's unit vector (single) or by all the events'
vectors at once (batch). It also times a new checkpoint's scales (every interest row's):
in one call over every row, in the first match (a block of rows at a time), and made ahead
in steps by ``Matcher.prepare`` as the push hub makes them (the longest step is how long
the event loop is held). ``--before TREE`` also times the matcher of another tree of this
project on the same Field, in alternate rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import random
import re
import statistics
import sys
import time
from typing import Any

import numpy as np
from _common import ROLES, ROOT, VOCABULARY, bracketed, envelope, progress

from field.contract.model import TYPE_IMPORTANCE, Limits, StoredEntry
from field.core.field import Field, Ids
from field.ranking.embedding import load_embedder
from field.ranking.relevance import RECENCY_HALF_LIFE, keywords, unit_keywords
from field.subscriptions.events import SUBSCRIPTION_EVENTS, event_of
from field.subscriptions.matcher import Matcher
from tests.reference_matcher import RECENCY_WEIGHT, alignment, combine, eligible

EVENT_CHOICES = [*SUBSCRIPTION_EVENTS[:4], "agent.joined"]
#: The filters of the filtered subscriptions, in equal shares.
FILTERS = (
    'event.unit.type == "decision"',
    "event.unit.confidence.score >= 0.5",
    'event.unit.content.contains("pricing")',
    'event.unit.intent.task_id in ["task-1", "task-2", "task-3"]',
    "event.unit.intent.task_id == subscriber.current_task",
    "event.unit.intent.task_id in parameters.task_id",
)


def build(
    subscriptions: int,
    events: int,
    rng: random.Random,
    filtered: float = 0.0,
    embedder: str = "hashing",
) -> tuple[Field, list[Any]]:
    counter = iter(range(1, 10**9))
    limits = Limits(max_subscriptions_per_agent=10**6)
    field = Field(
        limits=limits,
        ids=Ids(suffix=lambda: f"{next(counter):020x}"),
        embedder=load_embedder(embedder),
    )
    log = list(field.genesis())
    tokens = {}
    agents = min(subscriptions, 5000)
    for i in range(agents):
        payload = {
            "id": f"a{i}",
            "role": ROLES[i % len(ROLES)],
            "interests": [" ".join(rng.sample(VOCABULARY, 2)) for _ in range(2)],
            "current_task_id": f"task-{i % 50}",
        }
        tokens[f"a{i}"] = field.handle(envelope("REGISTER", f"a{i}", payload), token=None)
    tokens = {k: v.response["token"] for k, v in tokens.items()}
    for n in range(subscriptions):
        progress(n + 1, subscriptions, "subscribing")
        agent = f"a{n % agents}"
        sub = {
            "events": rng.sample(EVENT_CHOICES, 3),
            "min_relevance": rng.choice([0.0, 0.3, 0.5, 0.7]),
            "debounce_ms": rng.choice([0, 0, 100, 1000]),
        }
        if rng.random() < filtered:
            text = sub["filter"] = FILTERS[n % len(FILTERS)]
            if "parameters" in text:
                # sealed to the agent's own task and one other
                own = f"task-{(n % agents) % 50}"
                sub["bindings"] = {"task_id": [own, f"task-{rng.randrange(50)}"]}
        payload = {"action": "subscribe", "subscription": sub}
        field.handle(envelope("SUBSCRIBE", agent, payload), token=tokens[agent])
    writer = "a0"
    for n in range(events):
        payload = {
            "type": rng.choice(["finding", "decision", "observation"]),
            "content": " ".join(rng.choices(VOCABULARY, k=12)),
            "intent": {"purpose": "benchmark", "task_id": f"task-{n % 50}"},
            "confidence": {"score": rng.random(), "reasoning": "generated"},
        }
        outcome = field.handle(envelope("RECORD", writer, payload), token=tokens[writer])
        log.extend(outcome.entries)
    stored = [
        StoredEntry(i, e.epoch, e.kind, e.data, e.agent_id, e.ts) for i, e in enumerate(log, 1)
    ]
    found = [event_of(entry, field.state.units) for entry in stored]
    return field, [e for e in found if e is not None and e.name == "memory.recorded"]


def loop_match(field: Field, event: Any) -> int:
    """The baseline: the same rules, one subscription at a time, in Python.

    The factors and their mean are those of the tests' plain reference matcher
    (``tests/reference_matcher.py``); the embeddings are the ones the index and the
    registry hold (the reference embeds each text again, which is not the baseline's
    point)."""
    state = field.state
    unit = state.units[event.memory_unit_id]
    row = state.index.rows[unit["id"]]
    recorder = unit["source"]["agent_role"]
    recorder_words = frozenset(keywords(recorder))
    words = unit_keywords(unit)  # what the unit says, never who said it
    age = state.index.count_at(event.epoch) - 1 - row
    recency = 2.0 ** (-age / RECENCY_HALF_LIFE)
    registry = state.registry
    weights = state.index.weights
    unit_row = np.array([row], dtype=np.intp)
    recorded = state.index.count_at(event.epoch)
    notified = 0
    for subscription in state.subscriptions.values():
        if not eligible(subscription, event):
            continue
        agent = state.agents[subscription["agent_id"]]
        subscriber = {
            "role": agent.role,
            "interests": agent.interests,
            "current_task_id": agent.current_task_id,
        }
        factors = alignment(
            subscriber, recorder, recorder_words, words, unit["intent"].get("task_id")
        )
        # the semantic factor, from the embeddings the registry and the index hold
        profile = int(registry.profile.view[registry.rows[subscription["id"]]])
        interests = registry.interests(profile)
        if interests.texts:
            semantic = state.index.calibrated(interests, unit_row, recorded)[0]
            factors.append((weights.semantic, float(semantic[0])))
        factors.append((weights.type, TYPE_IMPORTANCE[unit["type"]]))
        factors.append((weights.confidence, unit["confidence"]["score"]))
        if combine(factors, recency, RECENCY_WEIGHT) >= subscription["min_relevance"]:
            notified += 1
    return notified


def measure(
    subscriptions: int, events: int, rng: random.Random, filtered: float, embedder: str
) -> dict[str, Any]:
    field, found = build(subscriptions, events, rng, filtered, embedder)
    state = field.state
    matcher = Matcher(state.registry, state.index, state.units)
    _ = state.index.vectors  # embed the recorded units (the index's work, not timed)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        matches = matcher.match(found)
        runs.append((time.perf_counter() - start) / len(found))
    batch = statistics.median(runs)
    start = time.perf_counter()
    for event in found:
        matcher.match([event])
    single = (time.perf_counter() - start) / len(found)
    start = time.perf_counter()
    scope = matcher.scope()  # made once and kept, as the push hub keeps it between batches
    for event in found:
        matcher.match([event], scope=scope)
    kept = (time.perf_counter() - start) / len(found)
    # the whole stage: vectorized matching, then the filters (each event on its own)
    screened = Matcher(state.registry, state.index, state.units, screen=field.filters.screen)
    evaluations = field.filters.evaluations
    start = time.perf_counter()
    delivered = 0
    for event in found:
        delivered += sum(len(m.rows) for m in screened.match([event], scope=scope))
    with_filters = (time.perf_counter() - start) / len(found)
    counted = field.filters.evaluations - evaluations
    sample = found[: max(3, min(len(found), 2_000_000 // subscriptions))]
    start = time.perf_counter()
    looped = [loop_match(field, event) for event in sample]
    loop = (time.perf_counter() - start) / len(sample)
    vector_counts = {m.event.position: len(m.rows) for m in matches}
    agree = all(vector_counts.get(e.position, 0) == n for e, n in zip(sample, looped, strict=True))
    fanout = sum(len(m.rows) for m in matches) / len(found)
    return {
        "batch": batch,
        "single": single,
        "kept": kept,
        "loop": loop,
        "fanout": fanout,
        "agree": agree,
        "filtered": with_filters,
        "delivered": delivered / len(found),
        "evaluations": counted / len(found),
        "with_filter": sum(1 for s in state.subscriptions.values() if s.get("filter")),
    }


def interest_words() -> list[str]:
    """The words distinct interests are made of: those of the labelled set's texts (4
    letters or more, about 1,800), then the benchmark's vocabulary."""
    text = (ROOT / "benchmarks" / "data" / "relevance.json").read_text().lower()
    found = sorted(set(re.findall(r"[a-z]{4,}", text)) - set(VOCABULARY))
    return [*found, *VOCABULARY]


def build_distinct(agents: int, units: int, embedder: str, rng: random.Random) -> Field:
    """A Field of ``agents`` agents, each with its own two interests and one subscription,
    and ``units`` recorded units."""
    counter = iter(range(1, 10**9))
    field = Field(
        limits=Limits(max_subscriptions_per_agent=10),
        ids=Ids(suffix=lambda: f"{next(counter):020x}"),
        embedder=load_embedder(embedder),
    )
    list(field.genesis())
    words = interest_words()
    seen: set[tuple[str, ...]] = set()
    for i in range(agents):
        progress(i + 1, agents, "agents")
        interests = (" ".join(rng.sample(words, 2)), " ".join(rng.sample(words, 2)))
        while interests in seen:  # each agent its own pair of interests
            interests = (" ".join(rng.sample(words, 2)), " ".join(rng.sample(words, 2)))
        seen.add(interests)
        payload = {
            "id": f"a{i}",
            "role": ROLES[i % len(ROLES)],
            "interests": list(interests),
            "current_task_id": f"task-{i % 50}",
        }
        outcome = field.handle(envelope("REGISTER", f"a{i}", payload), token=None)
        if i == 0:
            token = outcome.response["token"]  # a0 records the units
        others = rng.sample([name for name in EVENT_CHOICES if name != "memory.recorded"], 2)
        sub = {
            "events": ["memory.recorded", *others],
            "min_relevance": rng.choice([0.0, 0.3, 0.5, 0.7]),
            "debounce_ms": rng.choice([0, 0, 100, 1000]),
        }
        payload = {"action": "subscribe", "subscription": sub}
        field.handle(envelope("SUBSCRIBE", f"a{i}", payload), token=outcome.response["token"])
    for n in range(units):
        payload = {
            "type": rng.choice(["finding", "decision", "observation"]),
            "content": " ".join(rng.choices(words, k=12)),
            "intent": {"purpose": "benchmark", "task_id": f"task-{n % 50}"},
            "confidence": {"score": rng.random(), "reasoning": "generated"},
        }
        field.handle(envelope("RECORD", "a0", payload), token=token)
    return field


def tree_matcher(tree: str) -> Any:
    """The Matcher class of another tree of this project (its ``field`` package loaded
    under another name), to time on the same Field: it reads the registry's columns."""
    name = "field_" + re.sub(r"\W", "_", os.path.basename(os.path.abspath(tree)))
    package = os.path.join(tree, "field")
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(package, "__init__.py"), submodule_search_locations=[package]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.subscriptions.matcher").Matcher


def measure_distinct(
    agents: int, events: int, embedder: str, rounds: int, before: str | None
) -> dict[str, Any]:
    """ms per event at ``agents`` distinct profiles: this tree's matcher (and ``before``'s),
    one event at a time and in one batch, and the raw products, in alternate rounds."""
    field = build_distinct(agents, 2 * events, embedder, random.Random(7))
    state = field.state
    index, registry = state.index, state.registry
    entries = [
        StoredEntry(i, unit["epoch"], "memory.recorded", {"unit": unit}, "a0", "")
        for i, unit in enumerate(list(state.units.values())[events - 1 : 2 * events - 1], 1)
    ]
    found = [event_of(entry, state.units) for entry in entries]
    timed = [event for event in found if event is not None]
    matchers = {"after": Matcher(registry, index, state.units)}
    if before is not None:
        matchers["before"] = tree_matcher(before)(registry, index, state.units)
    scopes = {name: matcher.scope() for name, matcher in matchers.items()}
    stored = registry.vectors.view  # (interest rows x dim) float32, as the Field holds it
    rows = np.array([index.rows[event.memory_unit_id] for event in timed], dtype=np.intp)
    units = np.ascontiguousarray(index.vectors[rows])
    # the checkpoint's scales, made in one go by a first match, then in steps ahead of it
    # (Matcher.prepare, as the push hub makes them): the loop is held for the longest step
    calibration = index.calibration
    position = int(calibration.at(index.count_at(timed[0].epoch)))
    start = time.perf_counter()  # every row's in one call, as they were made before blocks
    calibration.scales(registry.vectors.view, registry.squares.view, position)
    whole = time.perf_counter() - start
    registry._scales.clear()
    start = time.perf_counter()
    matchers["after"].match(timed[:1], scope=scopes["after"])
    warm = time.perf_counter() - start
    registry._scales.clear()
    steps, start = [], time.perf_counter()
    for _ in matchers["after"].prepare(timed[:1], scopes["after"]):
        steps.append(time.perf_counter() - start)
        start = time.perf_counter()
    matchers["after"].match(timed[:1], scope=scopes["after"])
    then = time.perf_counter() - start
    times: dict[str, list[float]] = {}

    def timing(label: str, call: Any, per: int) -> None:
        start = time.perf_counter()
        call()
        times.setdefault(label, []).append((time.perf_counter() - start) / per)

    for _ in range(rounds):
        for row in units:
            timing("raw single", lambda row=row: stored @ row, 1)
        timing("raw batch", lambda: stored @ units.T, len(units))
        for name, matcher in matchers.items():
            scope = scopes[name]
            for event in timed:
                timing(
                    f"{name} single", lambda e=event, m=matcher, s=scope: m.match([e], scope=s), 1
                )
            timing(f"{name} batch", lambda m=matcher, s=scope: m.match(timed, scope=s), len(timed))
    agree = None
    if before is not None:
        got = {n: [(m.event.position, m.rows.tolist(), m.relevance.tolist())
                   for m in matcher.match(timed, scope=scopes[n])]
               for n, matcher in matchers.items()}  # fmt: skip
        agree = got["after"] == got["before"]
    notified = sum(len(m.rows) for m in matchers["after"].match(timed, scope=scopes["after"]))
    return {
        "embedder": embedder,
        "profiles": registry.profile_count,
        "rows": stored.shape,
        "times": {label: statistics.median(values) for label, values in times.items()},
        "notified": notified / len(timed),
        "agree": agree,
        "warm": warm,
        "whole": whole,
        "steps": steps,
        "then": then,
    }


def print_distinct(results: list[dict[str, Any]], rounds: int) -> None:
    with open("/proc/loadavg") as file:
        load = " ".join(file.read().split()[:3])
    print(f"\n{rounds} rounds, medians; load average {load}")
    print(
        f"{'embedder':<16} {'profiles':>9} {'rows x dim':>13} {'tree':>7} {'single ms/ev':>13} "
        f"{'raw single':>11} {'ratio':>6} {'batch ms/ev':>12} {'raw batch':>10} {'ratio':>6} "
        f"{'notified/ev':>12}"
    )
    for r in results:
        t = r["times"]
        for name in ("before", "after"):
            if f"{name} single" not in t:
                continue
            single, batch = t[f"{name} single"], t[f"{name} batch"]
            shape = "{} x {}".format(*r["rows"])
            print(
                f"{r['embedder']:<16} {r['profiles']:>9,} {shape:>13} {name:>7} "
                f"{single * 1e3:>13.2f} {t['raw single'] * 1e3:>11.2f} "
                f"{single / t['raw single']:>5.2f}x {batch * 1e3:>12.3f} "
                f"{t['raw batch'] * 1e3:>10.3f} {batch / t['raw batch']:>5.2f}x "
                f"{r['notified']:>12,.0f}"
            )
        if r["agree"] is not None:
            print(
                f"{'':<16} the two trees notified the same rows with the same relevance: "
                f"{r['agree']}"
            )
        steps = r["steps"]
        print(
            f"{'':<16} a new checkpoint's scales: in one call {r['whole'] * 1e3:,.0f} ms; "
            f"in the first match {r['warm'] * 1e3:,.0f} ms; "
            f"ahead in {len(steps):,} steps, the longest {max(steps, default=0) * 1e3:.1f} ms "
            f"(all {sum(steps) * 1e3:,.0f} ms), then the match {r['then'] * 1e3:.1f} ms"
        )


def compare_libraries(rounds: int = 3000) -> list[tuple[str, float, float, float, float]]:
    """µs per evaluation of each of FILTERS: cel and celpy, converting the context on
    every call, and with it converted ahead. Without celpy (cel-python, the ``bench``
    extra) its columns are NaN."""
    import cel

    try:
        import celpy
    except ImportError:
        celpy = None

    unit = {
        "id": "mu-1",
        "type": "decision",
        "content": " ".join(VOCABULARY[:300]),
        "confidence": {"score": 0.7, "reasoning": "generated"},
        "intent": {"purpose": "benchmark", "task_id": "task-2"},
        "source": {"agent_id": "a0", "agent_role": "analyst", "session_id": None},
        "relations": [],
        "status": "active",
        "epoch": 10,
        "payload": {"pull_request": {"user": {"login": "alice"}, "body": "x" * 1500}},
    }
    context = {
        "event": {"name": "memory.recorded", "epoch": 10, "cursor": "f-10", "unit": unit},
        "subscriber": {"id": "a1", "role": "analyst", "interests": ["pricing"],
                       "authority": 3, "current_task": "task-2"},
        "parameters": {"task_id": {"task-1": True, "task-2": True, "task-3": True}},
    }  # fmt: skip
    env = None if celpy is None else celpy.Environment()
    rows = []
    for text in FILTERS:
        program = cel.compile(text)
        ahead = cel.Context()
        ahead.add_variable("event", context["event"])
        rest = {"subscriber": context["subscriber"], "parameters": context["parameters"]}
        ahead.set_variable_resolver(rest.get)
        if celpy is None or env is None:
            plain = _per_call(lambda p=program: p.execute(context), rounds)
            kept = _per_call(lambda p=program, c=ahead: p.execute(c), rounds)
            rows.append((text, plain, kept, math.nan, math.nan))
            continue
        celpy_program = env.program(env.compile(text))
        activation = {k: celpy.json_to_cel(v) for k, v in context.items()}
        assert program.execute(ahead) == bool(celpy_program.evaluate(activation)), text
        rows.append(
            (
                text,
                _per_call(lambda p=program: p.execute(context), rounds),
                _per_call(lambda p=program, c=ahead: p.execute(c), rounds),
                _per_call(
                    lambda p=celpy_program: p.evaluate(
                        {k: celpy.json_to_cel(v) for k, v in context.items()}
                    ),
                    max(50, rounds // 20),
                ),
                _per_call(
                    lambda p=celpy_program, a=activation: p.evaluate(a), max(50, rounds // 5)
                ),
            )
        )
    return rows


def _per_call(call: Any, rounds: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(rounds):
        call()
    return (time.perf_counter() - start) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscriptions", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--filtered", type=float, default=0.1, help="share with a filter")
    parser.add_argument(
        "--embedder", nargs="+", default=["hashing"], help="the Field's embedder (hashing)"
    )
    parser.add_argument("--distinct", type=int, help="time N distinct agent profiles instead")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --distinct's timings")
    parser.add_argument("--before", help="with --distinct, also time this tree's matcher")
    args = parser.parse_args()
    if args.distinct:
        results = [
            measure_distinct(args.distinct, args.events, name, args.rounds, args.before)
            for name in args.embedder
        ]
        print_distinct(results, args.rounds)
        return
    rows = []
    for size in args.subscriptions:
        found = measure(
            size, args.events, random.Random(args.seed), args.filtered, args.embedder[0]
        )
        rows.append((size, found))
    print(
        f"\n{'subscriptions':>13} {'batch ms/ev':>12} {'single ms/ev':>13} {'kept ms/ev':>11} "
        f"{'events/s':>9} {'loop ms/ev':>11} {'speed-up':>9} {'notified/ev':>12} {'agree':>6}"
    )
    for size, r in rows:
        print(
            f"{size:>13,} {r['batch'] * 1000:>12.3f} {r['single'] * 1000:>13.3f} "
            f"{r['kept'] * 1000:>11.3f} {1 / r['batch']:>9,.0f} {r['loop'] * 1000:>11.2f} "
            f"{r['loop'] / r['batch']:>8.0f}x "
            f"{r['fanout']:>12,.0f} {str(r['agree']):>6}"
        )
    print(
        f"\nfilters ({args.filtered:.0%} of subscriptions): the whole stage, one event at a "
        "time, scope kept"
    )
    print(
        f"{'subscriptions':>13} {'filtered':>9} {'vectorized ms/ev':>17} "
        f"{'with filters ms/ev':>19} {'evaluations/ev':>15} {'delivered/ev':>13}"
    )
    for size, r in rows:
        print(
            f"{size:>13,} {r['with_filter']:>9,} {r['kept'] * 1000:>17.3f} "
            f"{r['filtered'] * 1000:>19.3f} {r['evaluations']:>15,.1f} {r['delivered']:>13,.0f}"
        )
    print("\none evaluation, µs (context converted each call | converted ahead)")
    if importlib.util.find_spec("celpy") is None:
        print(
            "cel-python (celpy) is not installed: the comparison with it is skipped "
            "(install it with pip install '.[bench]')"
        )
    print(f"{'expression':<58} {'cel':>7} {'cel ahead':>10} {'celpy':>8} {'celpy ahead':>12}")
    for text, plain, ahead, celpy_plain, celpy_ahead in compare_libraries():
        celpy_columns = (
            f"{celpy_plain:>8.0f} {celpy_ahead:>12.1f}"
            if not math.isnan(celpy_plain)
            else f"{'-':>8} {'-':>12}"
        )
        print(f"{text:<58} {plain:>7.1f} {ahead:>10.2f} {celpy_columns}")


if __name__ == "__main__":
    bracketed(main)
