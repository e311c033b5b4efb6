"""Level 1 (spec section 9): capabilities, Lamport epochs, DEREGISTER, conflicts, polling."""

from __future__ import annotations

from ..registry import Context, Skipped, Strength, check, expect, expect_error, expect_ok, fail
from ..wire import envelope, unique


@check("L1-register-capabilities", level=1, section="6.1 rule 3")
async def register_capabilities(ctx: Context) -> None:
    """REGISTER returns `field_capabilities` with the spec's five fields."""
    agent = await ctx.wire.register("caps")
    caps = agent.registration.get("field_capabilities")
    if not isinstance(caps, dict):
        fail("no field_capabilities")
    expect(caps.get("conformance_level") in (0, 1, 2, 3), "conformance_level not 0-3")
    expect(caps.get("protocol_version") == "0.1.0", "protocol_version is not 0.1.0")
    expect(isinstance(caps.get("persistence"), bool), "persistence is not a boolean")
    ops = caps.get("supported_operations")
    expect(
        isinstance(ops, list) and {"REGISTER", "RECORD", "ATTUNE"} <= set(ops),
        f"supported_operations {ops!r} lacks the Level 0 operations",
    )
    expect(isinstance(caps.get("conflict_strategies"), list), "conflict_strategies not a list")


@check("L1-register-required-operations", level=1, section="6.1 rule 2")
async def register_required_operations(ctx: Context) -> None:
    """A REGISTER requiring an unsupported operation is rejected, naming what is missing."""
    agent_id = unique("reqop")
    payload = {"id": agent_id, "role": "r", "required_operations": ["RECORD", "TELEPORT"]}
    answer = await ctx.wire.post("/v1/register", envelope("REGISTER", agent_id, payload))
    body = answer.body if isinstance(answer.body, dict) else {}
    if answer.ok:
        expect(body.get("status") == "rejected", "registered despite a missing operation")
        reason = body.get("rejection_reason") or ""
    else:
        reason = str((body.get("details") or {}).get("rejection_reason") or body.get("message"))
    expect("TELEPORT" in reason, f"the rejection does not name TELEPORT: {answer.describe()}")
    again = await ctx.wire.post(
        "/v1/register", envelope("REGISTER", agent_id, {"id": agent_id, "role": "r"})
    )
    expect(again.ok, f"a rejected REGISTER kept the id: {again.describe()}")


@check("L1-record-missing-confidence", level=1, section="6.3 rule 3, 8.2")
async def record_missing_confidence(ctx: Context) -> None:
    """A committed RECORD without confidence score or reasoning is MISSING_CONFIDENCE."""
    agent = await ctx.wire.register("mconf")
    base = {"mode": "committed", "type": "finding", "content": "c", "intent": {"purpose": "p"}}
    for confidence in (None, {"reasoning": "r"}, {"score": 0.5}):
        payload = dict(base)
        if confidence is not None:
            payload["confidence"] = confidence
        answer = await agent.send("RECORD", payload)
        expect_error(answer, 422, "MISSING_CONFIDENCE", f"confidence={confidence!r}")
        expect(answer["recoverable"] is True, "MISSING_CONFIDENCE is not recoverable")


@check("L1-epoch-lamport", level=1, section="9 Level 1 rule 3")
async def epoch_lamport(ctx: Context) -> None:
    """Epochs increase with every operation and follow an envelope epoch ahead of the clock."""
    agent = await ctx.wire.register("clock")
    epochs = []
    for n in range(3):
        epochs.append(expect_ok(await agent.record(f"Tick {n}."), "RECORD")["epoch"])
    expect(epochs == sorted(set(epochs)), f"RECORD epochs do not increase: {epochs}")
    agent.epoch = epochs[-1] + 500
    ahead = expect_ok(await agent.record("Tick ahead."), "RECORD")["epoch"]
    expect(ahead > epochs[-1] + 500, f"epoch {ahead} did not pass the envelope's {agent.epoch}")


@check("L1-deregister", level=1, section="6.2")
async def deregister(ctx: Context) -> None:
    """DEREGISTER removes the agent and keeps its units; its token then stops working."""
    ctx.require("DEREGISTER")
    leaver = await ctx.wire.register("leaver")
    reader = await ctx.wire.register("stayer")
    unit = expect_ok(await leaver.record("Left behind on purpose."), "RECORD")["memory_unit_id"]
    body = expect_ok(await leaver.send("DEREGISTER", {"agent_id": leaver.id}), "DEREGISTER")
    expect(body.get("status") == "ok", f"status {body.get('status')!r}")
    cleanup = body.get("cleanup") or {}
    expect(isinstance(cleanup.get("units_orphaned"), int), "no cleanup.units_orphaned")
    expect(unit in await reader.find({unit}), "the leaver's unit is gone")
    after = await leaver.record("Still here?")
    expect(
        after.status in (401, 403) and after.code in ("AGENT_NOT_REGISTERED", "UNAUTHENTICATED"),
        f"an operation after DEREGISTER: {after.describe()}",
    )
    agents = await ctx.wire.get(f"/v1/agents?id={leaver.id}", token=reader.token)
    if agents.ok:
        ids = {agent["id"] for agent in agents["agents"]}
        expect(leaver.id not in ids, "the agent is still in GET /v1/agents")


@check("L1-conflict-explicit", level=1, section="6.3 rule 9, 6.5, 5.7")
async def conflict_explicit(ctx: Context) -> None:
    """A `contradicts` relation creates a detected, explicit Conflict that DETECT list shows."""
    ctx.require("DETECT")
    a = await ctx.wire.register("ca")
    b = await ctx.wire.register("cb")
    first = expect_ok(await a.record("The API allows 100 requests a minute."), "RECORD")
    second = expect_ok(
        await b.record(
            "The API allows 500 requests a minute.",
            relations=[
                {
                    "type": "contradicts",
                    "target_id": first["memory_unit_id"],
                    "description": "limits differ",
                }
            ],
        ),
        "RECORD with contradicts",
    )
    created = second.get("conflicts_detected") or []
    expect(created, f"conflicts_detected is {created!r}")
    listed = expect_ok(
        await a.send("DETECT", {"mode": "list", "filter": {"involving_agents": [a.id]}}), "DETECT"
    )
    conflicts = {c["id"]: c for c in listed["conflicts"] if c["id"] in created}
    expect(conflicts, "DETECT list does not show the conflict")
    explicit = [c for c in conflicts.values() if c["detected_by"] == "explicit"]
    expect(explicit, "no conflict of the RECORD is `explicit`")
    conflict = explicit[0]
    expect(conflict["status"] == "detected", f"status {conflict['status']!r}")
    pair = {conflict["unit_a"], conflict["unit_b"]}
    expect(pair == {first["memory_unit_id"], second["memory_unit_id"]}, "wrong units")
    attuned = expect_ok(await a.attune(50), "ATTUNE")
    expect(
        conflict["id"] in {c["id"] for c in attuned["conflicts"]},
        "ATTUNE does not include the unresolved conflict over the agent's unit",
    )


@check("L1-detect-list-filter", level=1, section="6.5")
async def detect_list_filter(ctx: Context) -> None:
    """DETECT list honours its filter: a status nothing has returns no conflict."""
    ctx.require("DETECT")
    a = await ctx.wire.register("fa")
    b = await ctx.wire.register("fb")
    first = expect_ok(await a.record("Deploys happen on Tuesdays."), "RECORD")["memory_unit_id"]
    second = expect_ok(
        await b.record(
            "Deploys never happen on Tuesdays.",
            relations=[{"type": "contradicts", "target_id": first}],
        ),
        "RECORD",
    )
    ours = set(second.get("conflicts_detected") or [])
    expect(ours, "the contradicts relation created no conflict")
    for status, present in (("detected", True), ("resolved", False)):
        payload = {"mode": "list", "filter": {"status": [status], "involving_agents": [a.id]}}
        listed = expect_ok(await a.send("DETECT", payload), "DETECT list")["conflicts"]
        expect(all(c["status"] == status for c in listed), f"{status}: a conflict outside it")
        expect(
            all(first in (c["unit_a"], c["unit_b"]) for c in listed),
            "a conflict not involving the agent's unit",
        )
        shown = bool(ours & {c["id"] for c in listed})
        expect(shown == present, f"filter status {status}: the conflict shown is {shown}")


@check("L1-attune-since-epoch", level=1, section="6.4 rule 7, 6.7 (polling)", exclusive=True)
async def attune_since_epoch(ctx: Context) -> None:
    """Polling ATTUNE with `since_epoch` returns every new unit exactly once, then nothing.

    Run alone: the pages are three units long, and other checks' units would fill them."""
    recorder = await ctx.wire.register("poll-rec")
    poller = await ctx.wire.register("poll")
    start = expect_ok(await poller.attune(1), "ATTUNE")["epoch"]
    recorded = []
    for n in range(7):
        recorded.append(
            expect_ok(await recorder.record(f"Poll unit {n}."), "RECORD")["memory_unit_id"]
        )
    wanted, seen, since = set(recorded), [], start
    for _ in range(200):  # other checks record too: their units share the pages
        page = expect_ok(await poller.attune(3, since_epoch=since), "ATTUNE since_epoch")
        for item in page["record"]:
            unit = item["memory_unit"]
            expect(unit["epoch"] > since, f"unit epoch {unit['epoch']} not after {since}")
            if unit["id"] in wanted:
                seen.append(unit["id"])
        expect(page["epoch"] >= since, f"the poll cursor went back from {since} to {page['epoch']}")
        if wanted <= set(seen) or (page["epoch"] == since and not page["record"]):
            since = page["epoch"]
            break
        since = page["epoch"]
    missing = wanted - set(seen)
    repeated = sorted({unit for unit in seen if seen.count(unit) > 1})
    expect(not repeated, f"units polled twice: {repeated}")
    expect(not missing, f"units never polled: {sorted(missing)}")
    final = expect_ok(await poller.attune(10, since_epoch=since), "ATTUNE since_epoch")
    expect(
        not {i["memory_unit"]["id"] for i in final["record"]} & wanted,
        "a unit came back after the poll caught up",
    )


@check("L1-persistence", level=1, section="9 Level 1 rule 1", restarts=True)
async def persistence(ctx: Context) -> None:
    """Agents, tokens and units survive a restart of the Field."""
    if ctx.restart is None:
        raise Skipped("the suite may not restart this Field (--restart-command)")
    if not ctx.capabilities.get("persistence"):
        raise Skipped("the Field reports persistence: false")
    recorder = await ctx.wire.register("keep-rec")
    reader = await ctx.wire.register("keep-read")
    unit = expect_ok(await recorder.record("Written before the restart."), "RECORD")
    await ctx.restart()
    unit_id = unit["memory_unit_id"]
    expect(unit_id in await reader.find({unit_id}), "the unit is gone after the restart")
    after = expect_ok(await recorder.record("Written after the restart."), "RECORD")
    expect(after["epoch"] > unit["epoch"], "the epoch went back across the restart")


@check("L1-agent-not-registered", level=1, section="8.2", strength=Strength.EXTENSION)
async def agent_not_registered(ctx: Context) -> None:
    """A deregistered agent's token gets 401 AGENT_NOT_REGISTERED, recoverable."""
    ctx.require("DEREGISTER")
    agent = await ctx.wire.register("gone")
    expect_ok(await agent.send("DEREGISTER", {"agent_id": agent.id}), "DEREGISTER")
    answer = await agent.attune()
    expect_error(answer, 401, "AGENT_NOT_REGISTERED", "ATTUNE after DEREGISTER")
    expect(answer["recoverable"] is True, "AGENT_NOT_REGISTERED is not recoverable")
