"""What a ``matches`` filter costs per evaluation: the CEL library's own ``matches`` (which
compiles its pattern on every call) against the Field's (RE2, compiled once per pattern), in
one process on the same texts; and the slowest search a pattern the Field accepts can make.

    python benchmarks/patterns.py [--rounds 2000]

Every filter a subscription holds is evaluated once per event that reaches it (identical
texts once in all), so a filter's cost is paid per event, by the writer's loop.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import cel
from _common import bracketed

from field.contract.model import Limits
from field.expressions.filters import MAX_PATTERN_WIDTH, Context, compile_expression
from field.subscriptions.filtering import filter_shapes

REALISTIC = {
    "a word": r"deploy",
    "case-insensitive alternatives": r"(?i)incident|outage|sev[0-9]",
    "a word class": r"\bdeploy\w*",
    "a ticket id": r"\b[A-Z]{2,6}-[0-9]{1,6}\b",
    "a commit hash": r"\b[0-9a-f]{40}\b",
    "letters of any script": r"\pL+ \pL+",
}
#: what a subscription filter's event may hold (a summary of 4096 characters, a unit's
#: content of 65536)
SHAPES = filter_shapes(Limits())
SUMMARY = "finding from researcher-01: the checkout deploy of PAY-1234 caused an outage"


def per_evaluation(function: Any, rounds: int) -> float:
    """Microseconds per call, the best of three runs of ``rounds``."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(rounds):
            function()
        best = min(best, time.perf_counter() - start)
    return best / rounds * 1e6


def library(text: str, variables: dict[str, Any]) -> Any:
    program = cel.compile(text)

    def evaluate() -> Any:
        try:
            return program.execute(variables)
        except RuntimeError:  # a pattern it cannot compile: no match, as in a filter
            return None

    return evaluate


def field(text: str, variables: dict[str, Any]) -> Any:
    expression = compile_expression(text, ["event"], field="filter", shapes=SHAPES)
    context = Context(expression.bind_all(variables))
    return lambda: expression.evaluate(context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    variables = {"event": {"summary": SUMMARY}}
    print(f"per evaluation, on a {len(SUMMARY)}-character summary (us):")
    print(f"{'pattern':<32} {'library':>10} {'field':>10} {'ratio':>8}")
    for name, pattern in REALISTIC.items():
        text = f'event.summary.matches(r"{pattern}")'
        before = per_evaluation(library(text, variables), args.rounds)
        after = per_evaluation(field(text, variables), args.rounds)
        print(f"{name:<32} {before:>10.1f} {after:>10.1f} {before / after:>7.0f}x")

    hostile = r"\w{1,100}\w{1,100}\w{1,100}z"
    text = f'event.summary.matches(r"{hostile}")'
    cost = per_evaluation(library(text, variables), 3) / 1000
    print(f"\n{hostile}: {cost:.1f} ms an evaluation with the library's matches (which then")
    print("fails: too large); the Field refuses it at SUBSCRIBE (422 INVALID_FILTER).")

    # The slowest the Field accepts: ambiguity a DFA cannot hold, as wide as allowed, on a
    # text made to keep every thread alive (random a and b), at each size.
    widest = f"a[ab]{{{MAX_PATTERN_WIDTH - 6}}}c"
    rng = random.Random(1)
    print(f"\nthe widest accepted pattern at its worst, {widest} (ms an evaluation):")
    for chars, where in ((4096, "summary"), (65536, "content")):

        def event(text: str, where: str = where) -> dict[str, Any]:
            return {"summary": text} if where == "summary" else {"unit": {"content": text}}

        adverse = {"event": event("".join(rng.choice("ab") for _ in range(chars)))}
        plain = {"event": event(("the checkout deploy " * chars)[:chars])}
        path = "event.summary" if where == "summary" else "event.unit.content"
        text = f'{path}.matches(r"{widest}")'
        worst = per_evaluation(field(text, adverse), 3) / 1000
        usual = per_evaluation(field(text, plain), 3) / 1000
        print(f"  {chars:>6} characters: {worst:8.2f} (random a/b)  {usual:8.3f} (prose)")


if __name__ == "__main__":
    bracketed(main)
