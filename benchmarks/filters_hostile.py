"""Hostile filters: what the costliest filters the rules admit take, and what they do to others.

    python benchmarks/filters_hostile.py calibrate [--seconds 0.3]
    python benchmarks/filters_hostile.py attack [--seconds 10] [--subscriptions 100]

``calibrate`` (no server): for each family of costly filters (string building in a
comprehension, nested comprehensions, ``map``, ``matches`` on a text made to defeat RE2's
DFA, scans of a unit's payload, look-ups that copy large entities...) it takes the costliest
member the rules admit (the largest parameter whose static estimate is within the limit),
builds the context that makes it run longest (every value at its largest), and times one
evaluation as the Field runs it (the event projected on what the filter reads and
converted, the subscriber's inputs through the resolver, the budget armed). It prints
the estimate, the time, and the time per estimated step: the largest of those is what a
step costs at worst, and ``MAX_COST`` times it is the longest an admitted filter runs.

``attack`` (a real ``field serve``): a victim writes units one after another (RECORD over
HTTP) for ``--seconds``, first alone, then beside an attacker whose ``--subscriptions``
subscriptions each carry the costliest admitted filter of a family (sealed bindings so
that no two share an evaluation) and who keeps a WebSocket open on them, resuming from
its cursors whenever the Field sets it aside. Prints the victim's RECORD p50/p99 in both
runs and their ratio, and what the attacker's filters were charged.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _common import machine_line

from field.core.filters import (
    MAX_COST,
    MAX_DOCUMENT_CHARS,
    MAX_DOCUMENT_ITEMS,
    Context,
    InvalidFilter,
    TooLarge,
)
from field.model import Limits
from field.subscriptions.filtering import compile_filter

LIMITS = Limits()
CONTENT = LIMITS.max_content_chars
ITEMS = LIMITS.max_json_items


def _keys(count: int, chars: int) -> dict[str, bool]:
    return {f"{i:0{chars}d}": True for i in range(count)}


def _subscriber() -> dict[str, Any]:
    interests = [f"{i:0{LIMITS.max_interest_chars}d}" for i in range(LIMITS.max_list_items)]
    return {
        "id": "a" * 128,
        "role": "r" * 128,
        "interests": interests,
        "authority": 3,
        "current_task": "t" * 256,
    }


def _parameters() -> dict[str, Any]:
    return {name: _keys(1000, 256) for name in ("task_id", "unit_id", "conflict_id", "session_id")}


def _unit(**fields: Any) -> dict[str, Any]:
    unit = {
        "id": "mu_1",
        "type": "finding",
        "content": "x" * CONTENT,
        "confidence": {"score": 0.5, "reasoning": "r" * 4096},
        "intent": {"purpose": "p" * 4096, "task_id": "t" * 256},
        "source": {"agent_id": "a", "agent_role": "r", "session_id": None},
        "relations": [{"type": "supports", "target_id": f"{i:0256d}"} for i in range(64)],
        "status": "active",
        "epoch": 1,
        "timestamp": "2026-01-01T00:00:00Z",
        "visibility": "field",
    }
    unit.update(fields)
    return unit


def _event(**facts: Any) -> dict[str, Any]:
    return {
        "name": "memory.recorded",
        "epoch": 1,
        "cursor": "c" * 40,
        "actor": "a",
        "summary": "s" * 4096,
        "entity": {"type": "memory_unit", "id": "mu_1"},
        "memory_unit_id": "mu_1",
        "conflict_id": None,
        **facts,
    }


def _adversarial_text(chars: int) -> str:
    rng = random.Random(7)
    return "".join(rng.choice("ab") for _ in range(chars))


def _commits() -> list[dict[str, Any]]:
    # as many items as a filter may read of a document (each commit is two: the list's
    # item and the map's entry), the messages sharing its characters
    count = MAX_DOCUMENT_ITEMS // 2 - 1
    per = MAX_DOCUMENT_CHARS // count - len("message")
    return [{"message": "m" * per} for _ in range(count)]


@dataclass(frozen=True)
class Family:
    name: str
    #: the filter for a parameter (the larger, the costlier)
    text: Callable[[int], str]
    #: the event, as ``event_context`` builds it
    event: Callable[[], dict[str, Any]]
    largest: int = 1


FAMILIES = [
    Family(
        "concatenation in a comprehension",
        lambda n: "parameters.task_id.all(k, size(" + " + ".join(["k"] * n) + ") > 0)",
        lambda: _event(unit=_unit()),
        largest=300,
    ),
    Family(
        "nested comprehensions",
        lambda n: (
            "parameters.task_id.all(k, subscriber.interests.all(i, k != i"
            + " && k != i" * (n - 1)
            + "))"
        ),
        lambda: _event(unit=_unit()),
        largest=40,
    ),
    Family(
        "map, copying what it built",
        lambda n: (
            "subscriber.interests.map(i, i"
            + " + i" * (n - 1)
            + ").size() > 0 && parameters.task_id.all(k, size(k) > 0)"
        ),
        lambda: _event(unit=_unit()),
        largest=60,
    ),
    Family(
        "matches on a text made to defeat the DFA",
        lambda n: 'event.summary.matches("a[ab]{' + str(n) + '}c")',
        lambda: _event(summary=_adversarial_text(LIMITS.max_text_chars)),
        largest=120,
    ),
    Family(
        "matches over every relation",
        lambda n: 'event.unit.relations.exists(r, r.target_id.matches("a[ab]{' + str(n) + '}c"))',
        lambda: _event(
            unit=_unit(
                relations=[
                    {"type": "supports", "target_id": _adversarial_text(256)} for _ in range(64)
                ]
            )
        ),
        largest=120,
    ),
    Family(
        "a scan of a payload",
        lambda n: (
            'event.unit.payload.commits.exists(c, c.message.contains("zz")'
            + ' || c.message.contains("zz")' * (n - 1)
            + ")"
        ),
        lambda: _event(unit=_unit(payload={"commits": _commits()})),
        largest=20,
    ),
    Family(
        "copies of a large entity",
        lambda n: " && ".join(["event.task.id in parameters.task_id"] * n),
        lambda: _event(
            task={"id": "t", "items": [{"k": i} for i in range(MAX_DOCUMENT_ITEMS // 2 - 1)]},
        ),
        largest=20,
    ),
    Family(
        "contains over the interests",
        lambda n: (
            "subscriber.interests.exists(i, event.unit.content.contains(i)"
            + " || event.unit.content.contains(i)" * (n - 1)
            + ")"
        ),
        lambda: _event(unit=_unit()),
        largest=40,
    ),
    Family(
        "timestamps parsed per item",
        lambda n: (
            'parameters.task_id.all(k, timestamp(event.unit.timestamp) > timestamp("2020-01-0'
            + '1T00:00:00Z")'
            + ' && timestamp(event.unit.timestamp) > timestamp("2020-01-01T00:00:00Z")' * (n - 1)
            + ")"
        ),
        lambda: _event(unit=_unit()),
        largest=20,
    ),
]


def costliest(family: Family) -> tuple[int, Any] | None:
    """The largest parameter whose filter the rules admit, and its program."""
    best = None
    low, high = 1, family.largest
    while low <= high:
        middle = (low + high) // 2
        try:
            program = compile_filter(family.text(middle))
        except InvalidFilter:
            high = middle - 1
            continue
        best = (middle, program)
        low = middle + 1
    return best


def evaluate_once(program: Any, event: dict[str, Any], subscriber: Any, parameters: Any) -> Any:
    """One evaluation as the Field's filter stage runs it (the allow lists it names)."""
    expression = program.expression
    lists = {name: parameters[name] for name in program.parameters}
    try:
        context = Context(expression.bind("event", event))
    except TooLarge as error:
        return False, str(error)
    variables = expression.bind("subscriber", subscriber)
    variables.update(expression.bind("parameters", lists))
    context.set_variable_resolver(variables.get)
    return expression.outcome(context)


def calibrate(seconds: float) -> float:
    subscriber, parameters = _subscriber(), _parameters()
    print(machine_line())
    print(f"limit: {MAX_COST} steps an evaluation")
    print(f"{'family':44} {'n':>4} {'estimate':>9} {'us/eval':>9} {'ns/step':>8}  outcome")
    worst = 0.0
    for family in FAMILIES:
        found = costliest(family)
        if found is None:
            print(f"{family.name:44} refused at any size")
            continue
        n, program = found
        event = family.event()
        times = []
        outcome = evaluate_once(program, event, subscriber, parameters)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(times) < 3:
            began = time.perf_counter()
            evaluate_once(program, event, subscriber, parameters)
            times.append(time.perf_counter() - began)
        median = statistics.median(times)
        per_step = median / program.expression.cost * 1e9
        worst = max(worst, per_step)
        shown = "true" if outcome == (True, None) else (outcome[1] or "false")[:40]
        print(
            f"{family.name:44} {n:>4} {program.expression.cost:>9} {median * 1e6:>9.1f} "
            f"{per_step:>8.1f}  {shown}"
        )
    print(
        f"\nworst: {worst:.1f} ns a step: an admitted filter runs at most "
        f"{worst * MAX_COST / 1e6:.1f} ms an evaluation"
    )
    return worst


def _random_word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 8)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    calibrating = commands.add_parser("calibrate")
    calibrating.add_argument("--seconds", type=float, default=0.3)
    attacking = commands.add_parser("attack")
    attacking.add_argument("--seconds", type=float, default=10.0)
    attacking.add_argument("--subscriptions", type=int, default=100)
    args = parser.parse_args()
    if args.command == "calibrate":
        calibrate(args.seconds)
    else:
        asyncio.run(attack(args.seconds, args.subscriptions))


async def attack(seconds: float, subscriptions: int) -> None:
    raise SystemExit("attack: not yet")


if __name__ == "__main__":
    sys.exit(main())
