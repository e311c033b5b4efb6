"""Level 3 (spec section 9): SESSION, COORDINATE, HANDOFF, authority and visibility."""

from __future__ import annotations

from typing import Any

from ..registry import Binding, Context, Strength, check, expect, expect_error, expect_ok
from ..wire import Agent, envelope, unique

ALL_STRATEGIES = {
    "last_write_wins",
    "confidence_weighted",
    "authority",
    "evidence_count",
    "synthesis",
    "human_escalation",
    "vote",
}


async def _session(ctx: Context, creator: Agent, invitees: list[str]) -> str:
    payload: dict[str, Any] = {"action": "create", "name": "conformance", "invitees": invitees}
    body = expect_ok(await creator.send("SESSION", payload), "SESSION create")
    session_id: str = body["session"]["id"]
    return session_id


async def _task(agent: Agent, title: str, assignee: str | None) -> dict[str, Any]:
    payload = {"action": "create", "title": title, "assignee": assignee}
    body = expect_ok(await agent.send("COORDINATE", payload), "COORDINATE create")
    task: dict[str, Any] = body["task"]
    return task


@check("L3-strategies", level=3, section="6.6, 9 Level 3 rule 3")
async def strategies(ctx: Context) -> None:
    """The Field lists all seven conflict resolution strategies."""
    listed = set(ctx.capabilities.get("conflict_strategies", []))
    expect(listed >= ALL_STRATEGIES, f"missing strategies: {sorted(ALL_STRATEGIES - listed)}")


@check("L3-session-visibility", level=3, section="11.3")
async def session_visibility(ctx: Context) -> None:
    """A unit recorded in a session is seen by its members only."""
    ctx.require("SESSION")
    creator = await ctx.wire.register("vis-owner")
    member = await ctx.wire.register("vis-member")
    outsider = await ctx.wire.register("vis-outsider")
    session_id = await _session(ctx, creator, [member.id])
    joined = await member.send("SESSION", {"action": "join", "session_id": session_id})
    expect_ok(joined, "SESSION join with an invitation")
    unit = expect_ok(
        await creator.record("Only the session may know this.", session_id=session_id),
        "RECORD in a session",
    )["memory_unit_id"]
    inside = await member.find({unit})
    expect(unit in inside, "a member does not see the session's unit")
    source = inside[unit]["memory_unit"]["source"]
    expect(source.get("session_id") == session_id, "source.session_id is not set")
    expect(unit not in await outsider.find({unit}), "a non-member sees a session unit")
    outside = expect_ok(await outsider.attune(1000), "outsider ATTUNE")
    expect(
        unit not in {i["memory_unit"]["id"] for i in outside["record"]},
        "a non-member's ranking holds a session unit",
    )
    if ctx.supports("DETECT"):
        answer = await outsider.send("DETECT", {"mode": "check", "target_id": unit})
        expect(answer.status == 404, f"DETECT check by a non-member: {answer.describe()}")


@check("L3-session-closed", level=3, section="11.3", strength=Strength.EXTENSION)
async def session_closed(ctx: Context) -> None:
    """Joining a session without an invitation is 403 FORBIDDEN; recording in it too."""
    ctx.require("SESSION")
    creator = await ctx.wire.register("closed-owner")
    stranger = await ctx.wire.register("closed-stranger")
    session_id = await _session(ctx, creator, [])
    answer = await stranger.send("SESSION", {"action": "join", "session_id": session_id})
    expect_error(answer, 403, "FORBIDDEN", "SESSION join without an invitation")
    answer = await stranger.record("Sneaking in.", session_id=session_id)
    expect_error(answer, 403, "FORBIDDEN", "RECORD in a session by a non-member")


@check("L3-session-lifecycle", level=3, section="6.0 (SESSION)", strength=Strength.EXTENSION)
async def session_lifecycle(ctx: Context) -> None:
    """A session pauses, resumes and ends; nothing moves an ended session."""
    ctx.require("SESSION")
    creator = await ctx.wire.register("life-owner")
    session_id = await _session(ctx, creator, [])
    for action, status in (("pause", "paused"), ("resume", "active"), ("end", "ended")):
        body = expect_ok(
            await creator.send("SESSION", {"action": action, "session_id": session_id}), action
        )
        expect(body["session"]["status"] == status, f"{action}: status {body['session']['status']}")
    answer = await creator.send("SESSION", {"action": "resume", "session_id": session_id})
    expect_error(answer, 409, "INVALID_TRANSITION", "resume of an ended session")


@check("L3-coordinate-lifecycle", level=3, section="9 Level 3 rule 2")
async def coordinate_lifecycle(ctx: Context) -> None:
    """A task moves assigned -> in_progress -> completed; a move the table lacks is refused."""
    ctx.require("COORDINATE")
    worker = await ctx.wire.register("worker")
    task = await _task(worker, "Write the report", worker.id)
    expect(task["status"] == "assigned", f"a task created with an assignee is {task['status']}")
    for action, status in (("start", "in_progress"), ("complete", "completed")):
        body = expect_ok(
            await worker.send("COORDINATE", {"action": action, "task_id": task["id"]}), action
        )
        expect(body["task"]["status"] == status, f"{action}: {body['task']['status']}")
    answer = await worker.send("COORDINATE", {"action": "start", "task_id": task["id"]})
    expect_error(answer, 409, "INVALID_TRANSITION", "start of a completed task")
    missing = await worker.send("COORDINATE", {"action": "start", "task_id": "task-none"})
    expect(missing.status == 404, f"an unknown task: {missing.describe()}")


@check("L3-handoff", level=3, section="6.0 (HANDOFF)", binding=Binding.WEBSOCKET)
async def handoff(ctx: Context) -> None:
    """HANDOFF reassigns the task with a context package and notifies the target."""
    ctx.require("HANDOFF", "COORDINATE", "SUBSCRIBE")
    sender = await ctx.wire.register("from")
    target = await ctx.wire.register("to")
    sub = expect_ok(await target.subscribe(["handoff.incoming"]), "SUBSCRIBE")
    task = await _task(sender, "Carry on the analysis", sender.id)
    expect_ok(await sender.record("Half of the analysis is done.", task_id=task["id"]), "RECORD")
    since = [f"{sub['subscription_id']}@{sub['cursor']}"] if "cursor" in sub else []
    stream = await ctx.wire.websocket(target.token, since=since)
    try:
        payload = {"task_id": task["id"], "to_agent_id": target.id, "notes": "over to you"}
        body = expect_ok(await sender.send("HANDOFF", payload), "HANDOFF")
        expect(body["task"]["assignee"] == target.id, "the task is not the target's")
        units = body["handoff"]["context"]["units"]
        expect(units, "the context package holds no unit")
        found = await stream.notifications(lambda d: d.get("event") == "handoff.incoming", 1)
        expect(found, "the target got no handoff.incoming notification")
        expect(found[0]["requires_action"] is True, "handoff.incoming does not require action")
    finally:
        await stream.close()


@check("L3-authority-register", level=3, section="11.2", strength=Strength.EXTENSION)
async def authority_register(ctx: Context) -> None:
    """An agent cannot register itself above authority 4 without the operator token."""
    agent_id = unique("grab")
    payload = {"id": agent_id, "role": "lead", "authority": 8}
    answer = await ctx.wire.post("/v1/register", envelope("REGISTER", agent_id, payload))
    expect_error(answer, 403, "INSUFFICIENT_AUTHORITY", "REGISTER at authority 8")
    expect(answer["recoverable"] is False, "INSUFFICIENT_AUTHORITY is recoverable")


@check("L3-authority-operations", level=3, section="11.2")
async def authority_operations(ctx: Context) -> None:
    """A standard agent may not COMPACT or MERGE; an observer may not RECORD."""
    ctx.require("COMPACT", "MERGE")
    agent = await ctx.wire.register("std")
    compact = {"strategy": "archive", "filter": {"types": ["finding"]}}
    answer = await agent.send("COMPACT", compact)
    expect_error(answer, 403, "INSUFFICIENT_AUTHORITY", "COMPACT by a standard agent")
    other = await ctx.wire.register("std-other")
    first = expect_ok(await agent.record("The build takes 4 minutes."), "RECORD")
    second = expect_ok(
        await other.record(
            "The build takes 9 minutes.",
            relations=[{"type": "contradicts", "target_id": first["memory_unit_id"]}],
        ),
        "RECORD",
    )
    expect(second.get("conflicts_detected"), "no conflict created")
    merge = {
        "conflict_id": second["conflicts_detected"][0],
        "strategy": "last_write_wins",
        "resolution": {"rationale": "r"},
    }
    answer = await agent.send("MERGE", merge)
    expect(
        answer.status == 403 and answer.code == "INSUFFICIENT_AUTHORITY",
        f"MERGE by a standard agent: {answer.describe()}",
    )
    observer = await ctx.wire.register("obs", authority=2)
    answer = await observer.record("An observer's opinion.")
    expect_error(answer, 403, "INSUFFICIENT_AUTHORITY", "RECORD by an observer")
