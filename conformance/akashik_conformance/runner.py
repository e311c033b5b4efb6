"""Run the checks against a Field and report: a human summary and a JSON document."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from . import checks as _checks  # noqa: F401  (registers every check)
from .registry import REGISTRY, Check, Context, Failed, Skipped, Strength
from .wire import FRAME_TIMEOUT, Wire, WireError, envelope, unique

#: Checks run at once (each registers agents of its own, so they do not interfere).
CONCURRENCY = 8
#: Seconds one check may take before it fails.
CHECK_TIMEOUT = 30.0


@dataclass
class Result:
    id: str
    level: int
    binding: str
    section: str
    strength: str
    title: str
    outcome: str  # pass | fail | skip
    detail: str
    seconds: float


@dataclass
class Report:
    url: str
    claimed_level: int | None
    results: list[Result]

    def must_failures(self) -> list[Result]:
        return [r for r in self.results if r.outcome == "fail" and r.strength == Strength.MUST]

    @property
    def ok(self) -> bool:
        """Every applicable MUST check passed."""
        return not self.must_failures()

    @property
    def strict_ok(self) -> bool:
        """Every applicable check passed, SHOULD and extension checks too."""
        return not any(r.outcome == "fail" for r in self.results)

    def level_reached(self) -> int | None:
        """The highest Level whose MUST checks, and those of every Level below, all pass."""
        reached = None
        for level in range(4):
            musts = [r for r in self.results if r.level == level and r.strength == Strength.MUST]
            if not musts or any(r.outcome == "fail" for r in musts):
                break  # a Level not checked (--level, --check) is not reached either
            reached = level
        return reached

    def counts(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for r in self.results:
            row = table.setdefault(
                f"level {r.level} {r.strength}", {"pass": 0, "fail": 0, "skip": 0}
            )
            row[r.outcome] += 1
        return dict(sorted(table.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "claimed_level": self.claimed_level,
            "level_reached": self.level_reached(),
            "ok": self.ok,
            "strict_ok": self.strict_ok,
            "counts": self.counts(),
            "results": [asdict(r) for r in self.results],
        }

    def summary(self) -> str:
        lines = [f"Akashik conformance of {self.url}"]
        for r in self.results:
            mark = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}[r.outcome]
            line = f"  {mark} L{r.level} {r.strength:<9} {r.binding:<9} {r.id}  ({r.section})"
            lines.append(line)
            if r.outcome != "pass":
                lines.append(f"       {r.detail}")
        lines.append("")
        for level in range(4):
            rows = [r for r in self.results if r.level == level]
            musts = [r for r in rows if r.strength == Strength.MUST]
            passed = sum(r.outcome == "pass" for r in musts)
            applicable = sum(r.outcome != "skip" for r in musts)
            others = [r for r in rows if r.strength != Strength.MUST]
            tally = {o: sum(r.outcome == o for r in others) for o in ("pass", "fail", "skip")}
            lines.append(
                f"Level {level}: {passed} of {applicable} applicable MUST checks pass "
                f"({len(musts) - applicable} skipped); SHOULD/extension: {tally['pass']} pass, "
                f"{tally['fail']} fail, {tally['skip']} skipped"
            )
        reached = self.level_reached()
        if reached is None:
            lines.append("This server is not Level 0 conformant.")
        else:
            musts = [r for r in self.results if r.strength == Strength.MUST and r.level <= reached]
            passed = sum(r.outcome == "pass" for r in musts)
            applicable = sum(r.outcome != "skip" for r in musts)
            lines.append(
                f"This server is Level {reached} conformant: {passed} of {applicable} "
                f"applicable MUST checks pass (it claims Level {self.claimed_level})."
            )
        skipped = [r for r in musts if r.outcome == "skip"]
        if skipped:
            lines.append(f"{len(skipped)} MUST checks were skipped: see their reasons above.")
        return "\n".join(lines)


def select(ids: Iterable[str] | None = None, max_level: int = 3) -> list[Check]:
    """The checks to run: all of Level ``max_level`` and below, or those named."""
    chosen = list(REGISTRY.values()) if ids is None else [REGISTRY[i] for i in ids]
    return [c for c in chosen if c.level <= max_level]


async def capabilities(wire: Wire) -> dict[str, Any]:
    """What the Field says it supports: a throwaway REGISTER's ``field_capabilities``."""
    agent_id = unique("probe")
    answer = await wire.post(
        "/v1/register", envelope("REGISTER", agent_id, {"id": agent_id, "role": "probe"})
    )
    if not answer.ok:
        raise WireError(f"the Field refused a plain REGISTER: {answer.describe()}")
    caps = answer["field_capabilities"] if "field_capabilities" in answer.body else {}
    return caps if isinstance(caps, dict) else {}


async def run_check(check: Check, ctx: Context) -> Result:
    started = time.monotonic()
    try:
        await asyncio.wait_for(check.function(ctx), CHECK_TIMEOUT)
        outcome, detail = "pass", ""
    except Skipped as exc:
        outcome, detail = "skip", str(exc)
    except Failed as exc:
        outcome, detail = "fail", str(exc)
    except TimeoutError:
        outcome, detail = "fail", f"no answer within {CHECK_TIMEOUT:.0f} s"
    except Exception as exc:  # an answer the check could not read is a failure too
        outcome, detail = "fail", f"{type(exc).__name__}: {exc}"
    return Result(
        check.id,
        check.level,
        check.binding.value,
        check.section,
        check.strength.value,
        check.title,
        outcome,
        detail,
        round(time.monotonic() - started, 3),
    )


async def run(
    url: str,
    *,
    operator_token: str | None = None,
    restart: Callable[[], Awaitable[None]] | None = None,
    ids: Iterable[str] | None = None,
    max_level: int = 3,
    frame_timeout: float = FRAME_TIMEOUT,
) -> Report:
    """Run the checks against the Field at ``url``: those that share the Field at once, then
    those that restart it, one by one."""
    chosen = select(ids, max_level)
    async with Wire(url, operator_token=operator_token, frame_timeout=frame_timeout) as wire:
        caps = await capabilities(wire)
        ctx = Context(wire, operator_token, restart, caps)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def bounded(check: Check) -> Result:
            async with gate:
                return await run_check(check, ctx)

        shared = await asyncio.gather(*(bounded(c) for c in chosen if not c.exclusive))
        # those that restart the Field last: a restart is slow, and may fail
        alone_first = sorted((c for c in chosen if c.exclusive), key=lambda c: c.restarts)
        alone = [await run_check(c, ctx) for c in alone_first]
    by_id = {r.id: r for r in [*shared, *alone]}
    results = [by_id[c.id] for c in chosen]
    results.sort(key=lambda r: (r.level, r.id))
    level = caps.get("conformance_level")
    return Report(url, level if isinstance(level, int) else None, results)
