"""Hostile filters: what the costliest filters the rules admit take, and what they do to others.

    python benchmarks/filters_hostile.py calibrate [--seconds 0.3]
    python benchmarks/filters_hostile.py attack [--seconds 10] [--subscriptions 100]
                                               [--share S] [--large-rate 1]
                                               [--reconnect-delay 0] [--durable]

``calibrate`` (no server): for each family of costly filters (string building in a
comprehension, nested comprehensions, ``map``, ``matches`` on a text made to defeat RE2's
DFA, scans of a unit's payload, look-ups that copy large entities...) it takes the costliest
member the rules admit (the largest parameter whose static estimate is within the limit),
builds the context that makes it run longest (every value at its largest), and times one
evaluation as the Field runs it (the event projected on what the filter reads and
converted, the subscriber's inputs through the resolver, the budget armed). It prints
the estimate, the time, and the time per estimated step: the largest of those is what a
step costs at worst, and ``MAX_COST`` times it is the longest an admitted filter runs.

``attack`` (a real ``field serve``, a fresh one per phase, in memory unless ``--durable``;
registration open, rate limits out of reach: ``_common.LOAD_RATES``): a victim agent
records units one after another (RECORD over HTTP, one in flight, a sentence each) for
``--seconds`` after a second's warm-up, timing each RECORD. The phases:

1. alone: the baseline;
2. beside an attacker (a process of its own) holding ``--subscriptions`` subscriptions
   to ``memory.recorded`` (``min_relevance`` 0, ``include_own``) without filters, on one
   WebSocket: what matching them costs, before any filter;
3. the same subscriptions, each carrying the costliest admitted filter of one family in
   turn, each text its own (salted) so that no two share an evaluation. The Field sets
   the attacker's streams aside whenever its filters have used their share (they then
   catch up from the log on the same connection); were it to end the connection, the
   attacker would open it again from its cursors, at once after 4008 (as the SDK does)
   or ``--reconnect-delay`` seconds later;
4. with ``--large-rate`` above 0: the attacker recording only maximal units (65,536
   characters of a and b, 64 relations) at that rate, no subscriptions;
5. phases 3 and 4 together.

In every phase the attacker first registers with every profile field at its largest and
fills its allow list ``task_id`` (1,000 ids of 256 characters, a small unit each), so
every server holds the same log when the victim starts, and what its filters read of
``subscriber`` and ``parameters`` is at its largest. (A unit's ``payload`` comes only from
an inbound source, not from RECORD: the family that scans one errs on every unit here.)

Prints, per phase, the victim's RECORD p50/p99 (ms) and RECORDs a second with their ratios
to phase 1 and the CPU of the server and of the attacker over the measured window; for the
attacker, the notifications it received, its connections, how often the Field set its
streams aside (``field_streams_set_aside_total``) or ended them (by reason), how far
behind the log its cursors ended, and the filter errors SUBSCRIBE list shows
(``filter.errors``, ``last_error``). ``--share`` is passed to
the server as ``--filter-share`` (0: off). Target: the victim's p50 beside the attacker
at most 2x its p50 alone.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing
import queue
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from _common import bracketed, envelope, machine_line, pct
from fanout import HOST, cpu_seconds, start_field

from field.contract.model import Limits
from field.expressions.filters import (
    MAX_COST,
    MAX_DOCUMENT_CHARS,
    MAX_DOCUMENT_ITEMS,
    Context,
    InvalidFilter,
    TooLarge,
)
from field.server.config import Config
from field.subscriptions.allow_lists import MAX_ALLOW_LIST
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
        "matches with a small DFA over the content",
        lambda n: (
            'event.unit.content.matches("(?i)a{3}[^a]*(?:ab|ba)[ab]*[^a]a")'
            + ' && event.unit.content.matches("(?i)a{3}[^a]*(?:ab|ba)[ab]*[^a]ab")' * (n - 1)
        ),
        lambda: _event(unit=_unit(content=_adversarial_text(CONTENT))),
        largest=8,
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
        times: list[float] = []
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


# -- attack: a real server ---------------------------------------------------------------

ATTACKER = "attacker"
VICTIM = "victim"
#: Units the attacker records first, each under a task id of its own at the longest an id
#: may be: its allow list ``task_id`` then holds as many values as a list may, as long as
#: they may be (what ``parameters.task_id`` is at its largest, as ``calibrate`` has it).
TASK_IDS = [f"{i:0{LIMITS.max_id_chars}d}" for i in range(MAX_ALLOW_LIST)]
#: RECORDs of the attacker's set-up in flight at once.
SET_UP_CONCURRENCY = 16
#: Seconds before the victim's measured window (not measured).
WARMUP = 1.0
#: Seconds to wait for the attacker's set-up, and for its report.
ATTACKER_TIMEOUT = 300.0
#: Times the attacker's set-up and report try an operation the Field refuses as overloaded.
OVERLOADED_TRIES = 20

_SUBJECTS = (
    "Churn among SMB accounts",
    "The enterprise pipeline in Europe",
    "Trial-to-paid conversion",
    "Average deal size in the mid-market segment",
    "Support ticket volume",
    "Net revenue retention",
    "Partner-sourced revenue",
    "Onboarding completion",
)
_MOVES = ("rose", "fell", "held at", "recovered to", "slipped to")
_PERIODS = ("in Q3", "last month", "over the past six weeks", "after the price change")
_CAUSES = (
    "mostly in accounts that adopted the new reporting feature",
    "as two competitors discounted aggressively",
    "after the onboarding flow was shortened",
    "concentrated in accounts with fewer than 20 seats",
    "which the budget forecast had not assumed",
    "with the largest change in the compliance-heavy segments",
)


def _sentence(rng: random.Random, n: int) -> str:
    return (
        f"{rng.choice(_SUBJECTS)} {rng.choice(_MOVES)} {rng.randint(2, 40)}% "
        f"{rng.choice(_PERIODS)}, {rng.choice(_CAUSES)} (note {n})."
    )


def _victim_unit(rng: random.Random, n: int) -> dict[str, Any]:
    return {
        "type": rng.choice(("finding", "observation")),
        "content": _sentence(rng, n),
        "intent": {"purpose": "quarterly market review", "task_id": "task-q3-review"},
        "confidence": {"score": round(rng.uniform(0.5, 0.95), 2), "reasoning": "CRM export"},
    }


def _salted(family: Family, salt: str) -> Family:
    """``family`` with texts of their own: a text is compiled once and shared, and one
    that reads only ``event`` (or reads it and the subscriber) runs once an event for all
    the subscriptions holding it, so a salt makes each subscription's evaluation its own."""
    return dataclasses.replace(family, text=lambda n: f'"{salt}" != "" && ({family.text(n)})')


def attack_filters(count: int) -> tuple[list[tuple[Family, int, int]], list[tuple[str, str]]]:
    """The admitted families (family, parameter, estimate), and ``count`` (family name,
    filter text) pairs, one family after another, each text its own."""
    width = len(str(max(count - 1, 0)))
    admitted = []
    for family in FAMILIES:
        found = costliest(_salted(family, "s" + "0" * width))
        if found is not None:
            admitted.append((family, found[0], found[1].expression.cost))
    if not admitted:
        raise SystemExit("attack: no family has an admitted member")
    texts = []
    for i in range(count):
        family, n, _ = admitted[i % len(admitted)]
        texts.append((family.name, _salted(family, f"s{i:0{width}d}").text(n)))
    return admitted, texts


async def _call(
    session: aiohttp.ClientSession,
    base: str,
    operation: str,
    agent: str,
    payload: dict[str, Any],
    token: str | None,
) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = orjson.dumps(envelope(operation, agent, payload))
    async with session.post(f"{base}/v1/{operation.lower()}", data=body, headers=headers) as reply:
        answer: dict[str, Any] = orjson.loads(await reply.read())
        if reply.status == 503:
            raise Overloaded(f"{operation} by {agent}: {answer}")
        if reply.status != 200:
            raise RuntimeError(f"{operation} by {agent}: {reply.status} {answer}")
        return answer


class Overloaded(RuntimeError):
    """The Field refused an operation for now (503 OVERLOADED, admission control)."""


def _position(cursor: str) -> int:
    return int(cursor.rpartition("-")[2])


@dataclass(frozen=True)
class Plan:
    """What the attacker does in one phase."""

    port: int
    #: (family name, filter text or None) of each subscription; none: it only sets up
    #: (and writes)
    filters: list[tuple[str, str | None]]
    #: maximal units it records a second (0: none)
    large_rate: float
    #: seconds it waits before opening its WebSocket again after 4008 (0: at once)
    reconnect_delay: float = 0.0


class Attacker:
    """One agent: its set-up, its subscriptions, a WebSocket on them resumed from its
    cursors whenever the Field ends it, and maximal units at a steady rate."""

    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.port = port
        self.base = f"http://{HOST}:{port}"
        self.token: str | None = None
        self.units: list[str] = []
        self.family_of: dict[str, str] = {}
        #: subscription → the cursor to resume after (the furthest the Field said)
        self.positions: dict[str, str] = {}
        self.counts: Counter[str] = Counter()
        #: overflow frames by their reason (``filter time``, ``outbox overflow``...)
        self.set_aside: Counter[str] = Counter()
        #: how each connection ended: its close code, or the client's error
        self.closes: Counter[str] = Counter()
        self.large_seconds: list[float] = []
        self.large_refused = 0

    async def call(self, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
        """An operation, tried again while the Field is overloaded (503)."""
        for _ in range(OVERLOADED_TRIES - 1):
            try:
                return await _call(
                    self.session, self.base, operation, ATTACKER, payload, self.token
                )
            except Overloaded:
                await asyncio.sleep(0.5)
        return await _call(self.session, self.base, operation, ATTACKER, payload, self.token)

    async def send(self, operation: str, payload: dict[str, Any]) -> int:
        """An operation, once: its status."""
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"}
        body = orjson.dumps(envelope(operation, ATTACKER, payload))
        url = f"{self.base}/v1/{operation.lower()}"
        async with self.session.post(url, data=body, headers=headers) as reply:
            await reply.read()
            return reply.status

    async def set_up(self) -> None:
        """REGISTER with every field at its largest, then fill the allow list ``task_id``."""
        profile = {
            "id": ATTACKER,
            "role": "r" * LIMITS.max_role_chars,
            "interests": [
                f"{i:0{LIMITS.max_interest_chars}d}" for i in range(LIMITS.max_list_items)
            ],
        }
        self.token = (await self.call("REGISTER", profile))["token"]
        gate = asyncio.Semaphore(SET_UP_CONCURRENCY)

        async def one(task_id: str) -> str:
            unit = {
                "type": "observation",
                "content": "picked up the task",
                "intent": {"purpose": "planning", "task_id": task_id},
                "confidence": {"score": 0.5, "reasoning": "set-up"},
            }
            async with gate:
                return str((await self.call("RECORD", unit))["memory_unit_id"])

        self.units = list(await asyncio.gather(*(one(task_id) for task_id in TASK_IDS)))

    async def subscribe(self, filters: list[tuple[str, str | None]]) -> None:
        for family, text in filters:
            subscription = {
                "events": ["memory.recorded"],
                "include_own": True,  # its own maximal units too
                "min_relevance": 0.0,  # every unit reaches the filter
            }
            if text is not None:
                subscription["filter"] = text
            answer = await self.call(
                "SUBSCRIBE", {"action": "subscribe", "subscription": subscription}
            )
            subscription_id = answer["subscription_id"]
            self.family_of[subscription_id] = family
            self.positions[subscription_id] = answer["cursor"]

    async def stream(self, connected: asyncio.Event, delay: float) -> None:
        """One WebSocket on every subscription, opened again from the cursors whenever it
        ends: after 4008, ``delay`` seconds later (0: at once, as the SDK does)."""
        url = f"ws://{HOST}:{self.port}/v1/ws"
        headers = {"Authorization": f"Bearer {self.token}"}
        while True:
            query = urlencode(
                [("since", f"{s}@{c}") for s, c in sorted(self.positions.items())],
                quote_via=quote,
            )
            try:
                async with self.session.ws_connect(
                    f"{url}?{query}", headers=headers, max_msg_size=0, compress=0
                ) as ws:
                    self.counts["connections"] += 1
                    connected.set()
                    async for message in ws:
                        if message.type is not aiohttp.WSMsgType.TEXT:
                            break
                        self._frame(orjson.loads(message.data))
                    self.closes[str(ws.close_code)] += 1
                    if ws.close_code == 4008:
                        await asyncio.sleep(delay)
                        continue
            except (aiohttp.ClientError, OSError) as error:
                self.closes[type(error).__name__] += 1
            await asyncio.sleep(0.05)  # anything else: not in a tight loop

    def _frame(self, frame: dict[str, Any]) -> None:
        kind, data = frame.get("type"), frame.get("data") or {}
        if kind == "notification":
            self.counts["notifications"] += 1
            self._advance(data["subscription_id"], data["cursor"])
        elif kind == "overflow":
            self.set_aside[str(data.get("reason", "")).partition(":")[0]] += 1
            for subscription_id, cursor in data.get("cursors", {}).items():
                self._advance(subscription_id, cursor)
        elif kind == "live":
            self.counts["live"] += 1
            self._advance(data["subscription_id"], data["cursor"])
        elif kind == "resume":
            self.counts["resumes"] += 1
            self.counts["not recovered"] += not data.get("recovered", True)

    def _advance(self, subscription_id: str, cursor: str) -> None:
        known = self.positions.get(subscription_id)
        if known is None or _position(cursor) > _position(known):
            self.positions[subscription_id] = cursor

    async def record_large(self, rate: float) -> None:
        """Units as large as RECORD takes, ``rate`` a second (one at a time): content at
        its limit, a text of a and b (RE2's worst for ``a[ab]{n}c``, and no interest of the
        attacker's is in it, so every ``contains`` reads all of it), relations at theirs."""
        rng = random.Random(11)
        text = _adversarial_text(CONTENT)
        relations = [
            {"type": "supports", "target_id": u} for u in self.units[: LIMITS.max_relations]
        ]
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            cut = rng.randrange(CONTENT)
            unit = {
                "type": "observation",
                "content": text[cut:] + text[:cut],
                "intent": {"purpose": "p" * LIMITS.max_text_chars, "task_id": TASK_IDS[0]},
                "confidence": {"score": 0.5, "reasoning": "r" * LIMITS.max_text_chars},
                "relations": relations,
            }
            began = time.perf_counter()
            status = await self.send("RECORD", unit)
            if status == 200:
                self.large_seconds.append(time.perf_counter() - began)
            else:  # refused (503 OVERLOADED, admission control): the next one at its time
                self.large_refused += 1
            due = max(due + 1 / rate, loop.time())
            await asyncio.sleep(due - loop.time())

    async def report(self) -> dict[str, Any]:
        """What the attacker got, and what SUBSCRIBE list shows of its filters."""
        listed = await self.call("SUBSCRIBE", {"action": "list"})
        errors: Counter[str] = Counter()
        last_errors: dict[str, str] = {}
        for subscription in listed["subscriptions"]:
            shown = subscription.get("filter") or {}
            family = self.family_of.get(subscription["id"], "?")
            errors[family] += shown.get("errors", 0)
            if shown.get("last_error"):
                last_errors[family] = shown["last_error"]
        async with self.session.get(f"{self.base}/v1/field/status") as reply:
            last = orjson.loads(await reply.read())["log"]["last_position"]
        async with self.session.get(f"{self.base}/metrics") as reply:
            exposition = (await reply.read()).decode()
        set_aside = sum(
            float(line.rpartition(" ")[2])
            for line in exposition.splitlines()
            if line.startswith("field_streams_set_aside_total")
        )
        behind = sorted(last - _position(c) for c in self.positions.values())
        return {
            "counts": dict(self.counts),
            "set_aside": dict(self.set_aside),
            "streams_set_aside": int(set_aside),
            "closes": dict(self.closes),
            "large_seconds": self.large_seconds,
            "large_refused": self.large_refused,
            "errors": dict(errors),
            "last_errors": last_errors,
            "behind": behind,
            "last_position": last,
        }


def _attacker_process(plan: Plan, stop: Any, out: Any) -> None:
    """The attacker in a process of its own (its work is not the victim's): puts
    ``{"ready": True}`` once set up, then its report once ``stop`` is set."""
    try:
        out.put(asyncio.run(_attack(plan, stop, out)))
    except Exception as error:  # reported to the parent, which stops the run
        out.put({"error": f"{type(error).__name__}: {error}"})


async def _attack(plan: Plan, stop: Any, out: Any) -> dict[str, Any]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        attacker = Attacker(session, plan.port)
        await attacker.set_up()
        tasks = []
        if plan.filters:
            await attacker.subscribe(plan.filters)
            connected = asyncio.Event()
            tasks.append(asyncio.create_task(attacker.stream(connected, plan.reconnect_delay)))
            await asyncio.wait_for(connected.wait(), 60)
        if plan.large_rate > 0:
            tasks.append(asyncio.create_task(attacker.record_large(plan.large_rate)))
        out.put({"ready": True})
        while not stop.is_set():
            await asyncio.sleep(0.05)
            for task in tasks:
                if task.done():
                    task.result()  # raises what ended it
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return await attacker.report()


@dataclass
class Phase:
    name: str
    #: seconds each measured RECORD of the victim took
    seconds: list[float] = field(default_factory=list)
    refused: Counter[int] = field(default_factory=Counter)
    #: cores used in the measured window: the server, the attacker's process
    server_cpu: float = 0.0
    attacker_cpu: float = 0.0
    attacker: dict[str, Any] = field(default_factory=dict)

    def p(self, q: float) -> float:
        """A percentile of the victim's latency, in ms (nan: no RECORD was accepted)."""
        return pct(self.seconds, q) * 1000 if self.seconds else float("nan")


async def _victim(base: str, seconds: float, phase: Phase, pids: tuple[int, int]) -> None:
    """One agent recording one unit after another for ``WARMUP`` + ``seconds``."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        profile = {"id": VICTIM, "role": "market_researcher", "interests": ["churn", "pricing"]}
        token = (await _call(session, base, "REGISTER", VICTIM, profile, None))["token"]
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        rng = random.Random(3)
        start = time.perf_counter()
        opens, closes = start + WARMUP, start + WARMUP + seconds
        cpu: list[float] | None = None
        n = 0
        while (now := time.perf_counter()) < closes:
            if cpu is None and now >= opens:
                cpu = [cpu_seconds(pid) for pid in pids]
            body = orjson.dumps(envelope("RECORD", VICTIM, _victim_unit(rng, n)))
            n += 1
            began = time.perf_counter()
            async with session.post(f"{base}/v1/record", data=body, headers=headers) as reply:
                await reply.read()
            took = time.perf_counter() - began
            if reply.status != 200:
                phase.refused[reply.status] += 1
                await asyncio.sleep(0.005)  # 503 OVERLOADED: a little later, as a client should
            elif began >= opens:
                phase.seconds.append(took)
        assert cpu is not None
        elapsed = time.perf_counter() - opens
        phase.server_cpu = (cpu_seconds(pids[0]) - cpu[0]) / elapsed
        phase.attacker_cpu = (cpu_seconds(pids[1]) - cpu[1]) / elapsed


def _receive(out: Any, child: Any) -> dict[str, Any]:
    """The attacker's next message (raises what it failed with, or if it is gone)."""
    deadline = time.monotonic() + ATTACKER_TIMEOUT
    while True:
        try:
            message: dict[str, Any] = out.get(timeout=1)
        except queue.Empty:
            if not child.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"no word from the attacker (exit code {child.exitcode})"
                ) from None
            continue
        if "error" in message:
            raise RuntimeError(f"the attacker failed: {message['error']}")
        return message


def run_phase(args: argparse.Namespace, name: str, plan_of: Callable[[int], Plan]) -> Phase:
    """One phase on a fresh server: the attacker set up (and at work, as planned), then the
    victim measured."""
    flags = ["--registration", "open"]
    if args.share is not None:
        flags += ["--filter-share", str(args.share)]
    phase = Phase(name)
    with tempfile.TemporaryDirectory() as tmp:
        server, port = start_field(*flags, data_dir=tmp if args.durable else None)
        context = multiprocessing.get_context("spawn")
        stop, out = context.Event(), context.Queue()
        child = context.Process(target=_attacker_process, args=(plan_of(port), stop, out))
        try:
            child.start()
            _receive(out, child)
            if child.pid is None:
                raise RuntimeError("the attacker's process has no pid")
            pids = (server.pid, child.pid)
            asyncio.run(_victim(f"http://{HOST}:{port}", args.seconds, phase, pids))
            stop.set()
            phase.attacker = _receive(out, child)
        finally:
            stop.set()
            child.join(30)
            if child.is_alive():
                child.kill()
            server.stop()
    print(f"  {name}: done", file=sys.stderr)
    return phase


def attack(args: argparse.Namespace) -> list[Phase]:
    admitted, filters = attack_filters(args.subscriptions)
    plain: list[tuple[str, str | None]] = [("no filter", None)] * len(filters)
    phases: list[tuple[str, list[tuple[str, str | None]], float]] = [
        ("alone", [], 0.0),
        ("attacker's subscriptions, no filters", plain, 0.0),
        ("attacker's filters", list(filters), 0.0),
    ]
    if args.large_rate > 0:
        phases += [
            ("attacker's large units only", [], args.large_rate),
            ("filters + large units", list(filters), args.large_rate),
        ]
    results = []
    for name, chosen, rate in phases:
        plan = partial(Plan, filters=chosen, large_rate=rate, reconnect_delay=args.reconnect_delay)
        results.append(run_phase(args, name, plan))
    _print_attack(args, admitted, filters, results)
    return results


def _print_attack(
    args: argparse.Namespace,
    admitted: list[tuple[Family, int, int]],
    filters: list[tuple[str, str]],
    phases: list[Phase],
) -> None:
    defaults = Config()
    share = (
        f"--filter-share {args.share:g}" + (" (off)" if args.share == 0 else "")
        if args.share is not None
        else f"--filter-share {defaults.filter_share:g} (the default)"
    )
    store = "a SQLite log in a fresh directory" if args.durable else "--in-memory"
    print(
        f"\nfield serve ({store}), a fresh one per phase; {share}, --filter-burst "
        f"{defaults.filter_burst:g}; rate limits out of reach"
    )
    print(
        f"attacker: {len(filters)} subscriptions to memory.recorded (include_own, "
        f"min_relevance 0), the costliest admitted filter of each family in turn, each text "
        f"its own; its allow list task_id full ({len(TASK_IDS)} ids of {LIMITS.max_id_chars} "
        f"chars), {LIMITS.max_list_items} interests of {LIMITS.max_interest_chars} chars; one "
        f"WebSocket, opened again from its cursors whenever it is ended ("
        + (f"{args.reconnect_delay:g} s after 4008)" if args.reconnect_delay else "at once)")
    )
    counts = Counter(name for name, _ in filters)
    print(f"  {'family':44} {'n':>4} {'estimate':>9} {'subs':>5}")
    for family, n, cost in admitted:
        print(f"  {family.name:44} {n:>4} {cost:>9} {counts[family.name]:>5}")
    if args.large_rate > 0:
        print(
            f"  and maximal units ({CONTENT:,} chars of content, {LIMITS.max_relations} "
            f"relations, intent and reasoning at {LIMITS.max_text_chars} chars) at "
            f"{args.large_rate:g} a second"
        )
    print(
        f"victim: one agent, RECORD over HTTP one at a time (a sentence each), "
        f"{args.seconds:g} s measured after {WARMUP:g} s\n"
    )
    base = phases[0]
    rate = len(base.seconds) / args.seconds
    print(
        f"{'phase':37} {'p50 ms':>7} {'p99 ms':>7} {'RECORD/s':>9} {'p50 x':>6} {'p99 x':>6} "
        f"{'/s x':>5} {'server CPU':>11} {'attacker CPU':>13}"
    )
    for phase in phases:
        per_second = len(phase.seconds) / args.seconds
        print(
            f"{phase.name:37} {phase.p(0.5):>7.2f} {phase.p(0.99):>7.2f} {per_second:>9.0f} "
            f"{phase.p(0.5) / base.p(0.5):>6.2f} {phase.p(0.99) / base.p(0.99):>6.2f} "
            f"{per_second / rate:>5.2f} {phase.server_cpu:>10.0%} {phase.attacker_cpu:>12.0%}"
            + (f"  refused: {dict(phase.refused)}" if phase.refused else "")
        )
    print()
    for phase in phases[1:]:
        _print_attacker(phase)
    # the target is about filters: the phases with them (the plain subscriptions are what
    # any subscriber costs, filters or not: the reference beside them)
    filtered = [p for p in phases[1:] if "filters" in p.name and "no filters" not in p.name]
    worst = max(phase.p(0.5) / base.p(0.5) for phase in filtered)
    print(
        f"\ntarget: the victim's p50 beside the attacker's filters <= 2x alone: {worst:.2f}x "
        "at worst, " + ("met" if worst <= 2 else "NOT met")
    )


def _print_attacker(phase: Phase) -> None:
    got = phase.attacker
    counts = got["counts"]
    large = got["large_seconds"]
    parts = []
    if counts.get("connections"):
        behind = got["behind"]
        parts.append(
            f"{counts.get('notifications', 0):,} notifications over {counts['connections']:,} "
            f"connections ({counts.get('live', 0):,} streams went live); set aside "
            f"{got['streams_set_aside']:,} times (ended: {got['set_aside'] or 0}); closes "
            f"{got['closes']}; cursors "
            f"{behind[len(behind) // 2]:,} entries behind the log's {got['last_position']:,} "
            f"(median; {behind[0]:,} to {behind[-1]:,})"
        )
    if large or got["large_refused"]:
        p50 = f", p50 {pct(large, 0.5) * 1000:.0f} ms" if large else ""
        refused = f", {got['large_refused']} refused (503)" if got["large_refused"] else ""
        parts.append(f"{len(large)} large units written{p50}{refused}")
    print(f"{phase.name}: " + "; ".join(parts))
    errors = {family: count for family, count in got["errors"].items() if count}
    for family, count in sorted(errors.items()):
        shown = got["last_errors"].get(family, "")
        print(f"  filter errors, {family}: {count:,} (last: {shown[:90]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    calibrating = commands.add_parser("calibrate")
    calibrating.add_argument("--seconds", type=float, default=0.3)
    attacking = commands.add_parser("attack")
    attacking.add_argument("--seconds", type=float, default=10.0, help="measured per phase (10)")
    attacking.add_argument("--subscriptions", type=int, default=100, help="the attacker's (100)")
    attacking.add_argument(
        "--share", type=float, help="passed as --filter-share (0: off; default: the server's)"
    )
    attacking.add_argument(
        "--large-rate",
        type=float,
        default=1.0,
        help="maximal units the attacker records a second, in two more phases (1; 0: none)",
    )
    attacking.add_argument(
        "--reconnect-delay",
        type=float,
        default=0.0,
        help="seconds the attacker waits after 4008 before it connects again (0: at once)",
    )
    attacking.add_argument(
        "--durable", action="store_true", help="a SQLite log in a fresh directory, not in memory"
    )
    args = parser.parse_args()
    if args.command == "calibrate":
        calibrate(args.seconds)
    else:
        if not 1 <= args.subscriptions <= 10_000 or args.seconds <= 0:
            parser.error("--subscriptions must be 1 to 10000 and --seconds above 0")
        if args.large_rate < 0 or args.reconnect_delay < 0:
            parser.error("--large-rate and --reconnect-delay must not be negative")
        bracketed(lambda: attack(args))


if __name__ == "__main__":
    main()
