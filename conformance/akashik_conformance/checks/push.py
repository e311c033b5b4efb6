"""Push (spec 6.7, Level 2): notifications over WebSocket and SSE, their shape, order,
`min_relevance`, debounce, and resuming from a cursor with nothing missed or repeated.

A subscription to `memory.recorded` is told of every unit anyone records, so the checks of
order and resuming run one at a time, after the others: the only units recorded meanwhile are
their own, and "the first notification after resuming" is the one they expect. The others
look only at notifications about their own units, and share the Field."""

from __future__ import annotations

from typing import Any

from ..registry import Binding, Context, Skipped, Strength, check, expect, expect_ok, fail
from ..wire import Agent, PushStream

SPEC_FIELDS: dict[str, type | tuple[type, ...]] = {
    "subscription_id": str,
    "event": str,
    "epoch": int,
    "relevance_score": (int, float),
    "summary": str,
    "requires_action": bool,
}


async def _setup(ctx: Context, name: str, **options: Any) -> tuple[Agent, Agent, dict[str, Any]]:
    """A recorder, a subscriber to `memory.recorded`, and the SUBSCRIBE answer."""
    ctx.require("SUBSCRIBE")
    recorder = await ctx.wire.register(f"{name}-rec")
    subscriber = await ctx.wire.register(f"{name}-sub")
    events = options.pop("events", ["memory.recorded"])
    body = expect_ok(await subscriber.subscribe(events, **options), "SUBSCRIBE")
    expect(isinstance(body.get("subscription_id"), str), "no subscription_id")
    return recorder, subscriber, body


def _cursor(subscription: dict[str, Any]) -> str:
    cursor = subscription.get("cursor")
    if not isinstance(cursor, str):
        raise Skipped("SUBSCRIBE gives no `cursor` to start a stream from (an extension)")
    return cursor


async def _record(recorder: Agent, count: int, label: str) -> list[str]:
    ids = []
    for n in range(count):
        answer = expect_ok(await recorder.record(f"{label} unit {n}."), "RECORD")
        ids.append(answer["memory_unit_id"])
    return ids


async def _exactly(
    stream: PushStream,
    recorder: Agent,
    expected: list[str],
    what: str,
    delivered: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The stream delivers the `memory.recorded` of exactly ``expected``, in order, once each,
    and nothing of the units ``delivered`` before; returns them and the sentinel's.

    A sentinel unit recorded afterwards bounds the wait: once its notification arrives, every
    earlier one has (a stream is in log order), so anything extra would have shown. Each
    notification is judged as it comes, so a wrong one fails the check at once.
    """
    sentinel = expect_ok(await recorder.record(f"{what}: sentinel."), "RECORD")["memory_unit_id"]
    order = [*expected, sentinel]
    watched = set(order) | set(delivered)
    got: list[dict[str, Any]] = []
    while len(got) < len(order):
        found = await stream.notifications(lambda d: d.get("memory_unit_id") in watched, 1)
        owed = order[len(got)]
        if not found:
            fail(f"{what}: no notification of {owed} ({len(got)} of {len(expected)} came)")
        unit = found[0]["memory_unit_id"]
        if unit in delivered:
            fail(f"{what}: notified again of {unit}, delivered before")
        if unit != owed:
            seen = [n["memory_unit_id"] for n in got]
            kind = "again" if unit in seen else "out of order, or one was lost"
            fail(f"{what}: got {unit} where {owed} was owed ({kind}); recorded {expected}")
        got.append(found[0])
    epochs = [n["epoch"] for n in got]
    expect(epochs == sorted(epochs), f"{what}: epochs out of order: {epochs}")
    return got  # the sentinel's last


@check("P-ws-notification", level=2, section="6.7", binding=Binding.WEBSOCKET)
async def ws_notification(ctx: Context) -> None:
    """A WebSocket notification has the spec's fields, for the subscription and the unit."""
    recorder, subscriber, sub = await _setup(ctx, "wsn")
    stream = await ctx.wire.websocket(subscriber.token, since=[_cursor(sub)])
    try:
        ids = await _record(recorder, 1, "shape")
        data = (await _exactly(stream, recorder, ids, "WebSocket"))[0]
        for key, kind in SPEC_FIELDS.items():
            expect(isinstance(data.get(key), kind), f"`{key}` is {data.get(key)!r}")
        expect("conflict_id" in data, "no `conflict_id` (null for memory events)")
        expect(data["subscription_id"] == sub["subscription_id"], "wrong subscription_id")
        expect(data["event"] == "memory.recorded", f"event {data['event']!r}")
        expect(0 <= data["relevance_score"] <= 1, f"relevance_score {data['relevance_score']}")
    finally:
        await stream.close()


@check("P-ws-order", level=2, section="6.7", binding=Binding.WEBSOCKET, exclusive=True)
async def ws_order(ctx: Context) -> None:
    """Over WebSocket, every matching event is notified once, in order, none missing."""
    recorder, subscriber, sub = await _setup(ctx, "wso")
    stream = await ctx.wire.websocket(subscriber.token, since=[_cursor(sub)])
    try:
        ids = await _record(recorder, 6, "order")
        await _exactly(stream, recorder, ids, "WebSocket")
    finally:
        await stream.close()


@check("P-sse-order", level=2, section="6.7", binding=Binding.SSE, exclusive=True)
async def sse_order(ctx: Context) -> None:
    """Over SSE, every matching event is notified once, in order, each with its cursor id."""
    recorder, subscriber, sub = await _setup(ctx, "sseo")
    stream = await ctx.wire.sse(sub["subscription_id"], subscriber.token, since=_cursor(sub))
    try:
        ids = await _record(recorder, 6, "sse order")
        got = await _exactly(stream, recorder, ids, "SSE")
        expect(all(n["subscription_id"] == sub["subscription_id"] for n in got), "wrong ids")
    finally:
        await stream.close()


async def _resume(ctx: Context, name: str, sse: bool, restart: bool = False) -> None:
    recorder, subscriber, sub = await _setup(ctx, name)
    sub_id = sub["subscription_id"]

    async def connect(since: str) -> PushStream:
        if sse:
            return await ctx.wire.sse(sub_id, subscriber.token, since=since)
        return await ctx.wire.websocket(subscriber.token, since=[f"{sub_id}@{since}"])

    stream = await connect(_cursor(sub))
    try:
        first = await _record(recorder, 3, f"{name} before")
        got = await _exactly(stream, recorder, first, "before the disconnect")
        first.append(got[-1]["memory_unit_id"])  # the sentinel's: owed after the cursor too
    finally:
        await stream.close()
    cursor = got[1].get("cursor")  # processed two of four: resume after the second
    if not isinstance(cursor, str):
        raise Skipped("notifications carry no `cursor` to resume from (an extension)")
    if restart:
        if ctx.restart is None:
            raise Skipped("the suite may not restart this Field (--restart-command)")
        if not ctx.capabilities.get("persistence"):
            raise Skipped("the Field reports persistence: false")
        await ctx.restart()
    later = await _record(recorder, 3, f"{name} away")
    stream = await connect(cursor)
    try:
        resume = await stream.until("resume")
        if resume is None:
            fail("no `resume` frame")
        expect(resume["data"].get("recovered") is True, f"not recovered: {resume['data']}")
        await _exactly(stream, recorder, [*first[2:], *later], "after resuming", tuple(first[:2]))
    finally:
        await stream.close()


@check(
    "P-ws-resume",
    level=2,
    section="6.7",
    strength=Strength.EXTENSION,
    binding=Binding.WEBSOCKET,
    exclusive=True,
)
async def ws_resume(ctx: Context) -> None:
    """A WebSocket resumed from a cursor gets what it missed, exactly once, in order."""
    await _resume(ctx, "wsr", sse=False)


@check(
    "P-sse-resume",
    level=2,
    section="6.7",
    strength=Strength.EXTENSION,
    binding=Binding.SSE,
    exclusive=True,
)
async def sse_resume(ctx: Context) -> None:
    """An SSE stream resumed with `since` gets what it missed, exactly once, in order."""
    await _resume(ctx, "sser", sse=True)


@check(
    "P-ws-resume-restart",
    level=2,
    section="6.7, 9 Level 1 rule 1",
    strength=Strength.EXTENSION,
    binding=Binding.WEBSOCKET,
    restarts=True,
)
async def ws_resume_restart(ctx: Context) -> None:
    """Resuming across a restart of the Field misses nothing and repeats nothing."""
    await _resume(ctx, "wsrr", sse=False, restart=True)


@check("P-ws-min-relevance", level=2, section="6.7", binding=Binding.WEBSOCKET)
async def ws_min_relevance(ctx: Context) -> None:
    """A subscription gets exactly the notifications scoring at least its `min_relevance`."""
    ctx.require("SUBSCRIBE")
    recorder = await ctx.wire.register("minr-rec", role="engineer")
    subscriber = await ctx.wire.register(
        "minr-sub", role="engineer", interests=["database migration", "postgres"]
    )
    threshold = 0.5
    everything = expect_ok(await subscriber.subscribe(["memory.recorded"]), "SUBSCRIBE")
    relevant = expect_ok(
        await subscriber.subscribe(["memory.recorded"], min_relevance=threshold), "SUBSCRIBE"
    )
    since = [f"{s['subscription_id']}@{_cursor(s)}" for s in (everything, relevant)]
    stream = await ctx.wire.websocket(subscriber.token, since=since)
    try:
        ids = []
        for content in (
            "The postgres database migration finished; schema v12 is live.",
            "Bananas are yellow when ripe.",
            "The database migration to postgres 16 needs a maintenance window.",
            "Lunch is soup on Fridays.",
            "Sentinel: the postgres database migration checklist is final.",
        ):
            ids.append(expect_ok(await recorder.record(content), "RECORD")["memory_unit_id"])
        # each subscription's stream is in order: its sentinel comes after all it is owed
        sentinel, pending = ids[-1], {everything["subscription_id"], relevant["subscription_id"]}
        found = []
        while pending:
            batch = await stream.notifications(lambda d: d.get("memory_unit_id") in ids, 1)
            if not batch:
                break
            found.extend(batch)
            if batch[0]["memory_unit_id"] == sentinel:
                pending.discard(batch[0]["subscription_id"])
    finally:
        await stream.close()
    by_sub: dict[str, dict[str, float]] = {}
    for data in found:
        by_sub.setdefault(data["subscription_id"], {})[data["memory_unit_id"]] = data[
            "relevance_score"
        ]
    control = by_sub.get(everything["subscription_id"], {})
    expect(len(control) == len(ids), f"min_relevance 0 received {len(control)} of {len(ids)}")
    above = {unit for unit, score in control.items() if score >= threshold}
    if not above or above == set(control):
        raise Skipped(f"every unit scored on one side of {threshold}: {sorted(control.values())}")
    got = by_sub.get(relevant["subscription_id"], {})
    below = {unit: score for unit, score in got.items() if score < threshold}
    expect(not below, f"min_relevance {threshold} delivered lower scores: {below}")
    expect(set(got) == above, f"min_relevance {threshold}: got {sorted(got)}, owed {sorted(above)}")


@check(
    "P-ws-debounce", level=2, section="6.7", strength=Strength.EXTENSION, binding=Binding.WEBSOCKET
)
async def ws_debounce(ctx: Context) -> None:
    """With `debounce_ms`, the notifications of one unit in one window fold into one."""
    recorder, subscriber, sub = await _setup(
        ctx, "deb", events=["memory.recorded", "memory.superseded"], debounce_ms=400
    )
    stream = await ctx.wire.websocket(subscriber.token, since=[_cursor(sub)])
    try:
        for _ in range(5):  # the two events may straddle a window's edge: then try again
            old = expect_ok(await recorder.record("The sprint ends Friday."), "RECORD")
            old_id = old["memory_unit_id"]
            expect_ok(
                await recorder.record(
                    "The sprint ends Thursday.",
                    relations=[{"type": "supersedes", "target_id": old_id}],
                ),
                "RECORD",
            )
            about: list[dict[str, Any]] = []
            while not any(n["event"] == "memory.superseded" for n in about):
                found = await stream.notifications(
                    lambda d, u=old_id: d.get("memory_unit_id") == u, 1
                )
                expect(found, "no memory.superseded notification for the superseded unit")
                about.extend(found)
            windows = {str(n.get("window")) for n in about}
            if len(about) > 1 and len(windows) == len(about) and "None" not in windows:
                continue  # one window each: nothing to fold
            expect(
                len(about) == 1,
                f"{len(about)} notifications of one unit in one window: "
                f"{[n['event'] for n in about]}",
            )
            folded = about[0].get("folded")
            expect(folded is None or folded >= 1, f"folded is {folded!r}")
            return
        raise Skipped("the events fell into different windows five times")
    finally:
        await stream.close()


@check("P-ws-end", level=2, section="6.7", strength=Strength.EXTENSION, binding=Binding.WEBSOCKET)
async def ws_end(ctx: Context) -> None:
    """Unsubscribing ends the subscription's stream with an `end` frame."""
    _, subscriber, sub = await _setup(ctx, "end")
    stream = await ctx.wire.websocket(subscriber.token, since=[_cursor(sub)])
    try:
        live = await stream.until("live")
        expect(live is not None, "no `live` frame after the resume")
        payload = {"action": "unsubscribe", "subscription": {"id": sub["subscription_id"]}}
        body = expect_ok(await subscriber.send("SUBSCRIBE", payload), "unsubscribe")
        expect(body["subscription"]["status"] == "cancelled", "not cancelled")
        end = await stream.until("end")
        if end is None:
            fail("no `end` frame")
        expect(end["data"]["subscription_id"] == sub["subscription_id"], "`end` of another")
    finally:
        await stream.close()
