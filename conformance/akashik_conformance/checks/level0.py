"""Level 0 (spec section 9): the envelope, errors, REGISTER, RECORD and ATTUNE."""

from __future__ import annotations

from typing import Any

import orjson

from ..registry import (
    Context,
    Failed,
    Strength,
    check,
    expect,
    expect_error,
    expect_error_shape,
    expect_ok,
)
from ..wire import Agent, WireError, envelope, unique


def _refused(status: int) -> bool:
    return 400 <= status < 500


async def _pair(ctx: Context, name: str) -> tuple[Agent, Agent]:
    """A recorder and a reader with nothing in common but the Field."""
    recorder = await ctx.wire.register(f"{name}-rec", role="researcher")
    reader = await ctx.wire.register(f"{name}-read", role="strategist")
    return recorder, reader


def _payload(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "mode": "committed",
        "type": "finding",
        "content": "Churn fell to 2% in March.",
        "intent": {"purpose": "Track churn"},
        "confidence": {"score": 0.9, "reasoning": "From the billing export."},
    }
    payload.update(changes)
    return {key: value for key, value in payload.items() if value is not None}


async def _units_seen(reader: Agent, ids: set[str]) -> dict[str, dict[str, Any]]:
    try:
        return await reader.find(ids)
    except WireError as exc:
        raise Failed(str(exc)) from exc


@check("L0-envelope-valid", level=0, section="5.1, 6.1")
async def envelope_valid(ctx: Context) -> None:
    """A valid envelope is served: REGISTER answers `registered` with the agent `idle`."""
    agent_id = unique("env")
    payload = {"id": agent_id, "role": "researcher"}
    answer = await ctx.wire.post("/v1/register", envelope("REGISTER", agent_id, payload))
    body = expect_ok(answer, "REGISTER")
    expect(body.get("status") == "registered", f"status is {body.get('status')!r}")
    agent = body.get("agent") or {}
    expect(agent.get("id") == agent_id, "the agent record does not carry the id registered")
    expect(agent.get("role") == "researcher", "the agent record does not carry the role")
    expect(agent.get("status") == "idle", f"initial status is {agent.get('status')!r}, not idle")


@check("L0-envelope-protocol", level=0, section="5.1")
async def envelope_protocol(ctx: Context) -> None:
    """An envelope whose `protocol` is not "akashik", or `version` not "0.1.0", is refused."""
    for key, value in (("protocol", "akashic"), ("version", "0.2.0"), ("version", 1)):
        agent_id = unique("env")
        body = envelope("REGISTER", agent_id, {"id": agent_id, "role": "researcher"})
        body[key] = value
        answer = await ctx.wire.post("/v1/register", body)
        expect(_refused(answer.status), f"{key}={value!r} was served: {answer.describe()}")
        expect_error_shape(answer, f"{key}={value!r}")


@check("L0-envelope-fields", level=0, section="5.1")
async def envelope_fields(ctx: Context) -> None:
    """An envelope missing a required field (`id`, `epoch`, `payload`, `session_id`) is refused."""
    for missing in ("id", "epoch", "payload", "session_id", "operation"):
        agent_id = unique("env")
        body = envelope("REGISTER", agent_id, {"id": agent_id, "role": "researcher"})
        del body[missing]
        answer = await ctx.wire.post("/v1/register", body)
        expect(_refused(answer.status), f"no `{missing}`: served: {answer.describe()}")
        expect_error_shape(answer, f"no `{missing}`")


@check("L0-envelope-operation", level=0, section="10.3", strength=Strength.EXTENSION)
async def envelope_operation(ctx: Context) -> None:
    """An envelope whose operation is not the endpoint's is 400 INVALID_ENVELOPE."""
    agent = await ctx.wire.register("env-op")
    body = envelope("ATTUNE", agent.id, {"scope": {"role": agent.role, "max_units": 5}})
    answer = await ctx.wire.post("/v1/record", body, token=agent.token)
    expect_error(answer, 400, "INVALID_ENVELOPE", "ATTUNE envelope posted to /v1/record")


@check("L0-http-json", level=0, section="10.3")
async def http_json(ctx: Context) -> None:
    """Responses, answers and errors alike, are `application/json`."""
    agent = await ctx.wire.register("json")
    answers = [await agent.attune(), await agent.send("RECORD", {"type": "finding"})]
    for answer in answers:
        kind = answer.headers.get("Content-Type", "")
        expect(
            kind.startswith("application/json"), f"Content-Type {kind!r} for HTTP {answer.status}"
        )


@check("L0-http-bad-body", level=0, section="8.1", strength=Strength.EXTENSION)
async def http_bad_body(ctx: Context) -> None:
    """A body that is not JSON is 400 INVALID_JSON; one not sent as JSON is 415."""
    answer = await ctx.wire.post("/v1/register", None, raw=b"{not json")
    expect_error(answer, 400, "INVALID_JSON", "a body that is not JSON")
    agent_id = unique("media")
    raw = orjson.dumps(envelope("REGISTER", agent_id, {"id": agent_id, "role": "r"}))
    answer = await ctx.wire.request(
        "POST", "/v1/register", data=raw, headers={"Content-Type": "text/plain"}
    )
    expect_error(answer, 415, "UNSUPPORTED_MEDIA_TYPE", "a body sent as text/plain")


@check("L0-register-duplicate", level=0, section="6.1 rule 1, 8.2")
async def register_duplicate(ctx: Context) -> None:
    """REGISTER of an id already registered is AGENT_ID_TAKEN, recoverable."""
    agent = await ctx.wire.register("dup")
    payload = {"id": agent.id, "role": "other"}
    answer = await ctx.wire.post("/v1/register", envelope("REGISTER", agent.id, payload))
    expect(answer.code == "AGENT_ID_TAKEN", f"second REGISTER: {answer.describe()}")
    expect_error_shape(answer, "AGENT_ID_TAKEN")
    expect(answer["recoverable"] is True, "AGENT_ID_TAKEN is not recoverable")


@check("L0-record-modes", level=0, section="6.3 rules 6-7")
async def record_modes(ctx: Context) -> None:
    """A draft RECORD is stored as `draft`, a committed one as `active`."""
    recorder, reader = await _pair(ctx, "modes")
    draft = await recorder.send(
        "RECORD", _payload(mode="draft", confidence=None, content="A draft thought on churn.")
    )
    committed = await recorder.record("A committed finding on churn.")
    ids = {expect_ok(draft, "draft RECORD")["memory_unit_id"]}
    ids.add(expect_ok(committed, "committed RECORD")["memory_unit_id"])
    expect(draft["status"] == "accepted" and committed["status"] == "accepted", "not accepted")
    seen = await _units_seen(reader, ids)
    expect(len(seen) == 2, f"the reader's ATTUNE holds {len(seen)} of the 2 units")
    expect(seen[draft["memory_unit_id"]]["memory_unit"]["status"] == "draft", "draft not `draft`")
    unit = seen[committed["memory_unit_id"]]["memory_unit"]
    expect(unit["status"] == "active", f"a committed unit is {unit['status']!r}")


@check("L0-record-generated", level=0, section="5.2, 6.3 rule 5")
async def record_generated(ctx: Context) -> None:
    """The Field generates `id`, `epoch`, `source` and `status` of every unit."""
    recorder, reader = await _pair(ctx, "gen")
    answer = expect_ok(await recorder.record("Generated fields are the Field's."), "RECORD")
    unit_id, epoch = answer["memory_unit_id"], answer["epoch"]
    expect(isinstance(unit_id, str) and unit_id, "no memory_unit_id")
    expect(isinstance(epoch, int), "no integer epoch")
    seen = await _units_seen(reader, {unit_id})
    expect(unit_id in seen, "the unit is not in another agent's ATTUNE")
    unit = seen[unit_id]["memory_unit"]
    source = unit.get("source") or {}
    expect(unit.get("epoch") == epoch, f"unit epoch {unit.get('epoch')} != RECORD's {epoch}")
    expect(source.get("agent_id") == recorder.id, f"source.agent_id is {source.get('agent_id')!r}")
    expect(source.get("agent_role") == recorder.role, "source.agent_role is not the role")
    expect(isinstance(source.get("timestamp"), str), "no source.timestamp")
    for key in ("id", "status", "epoch"):
        rogue = await recorder.send("RECORD", _payload(**{key: "rogue" if key != "epoch" else 1}))
        if rogue.ok:  # accepted: the Field must still have generated the field itself
            stored = await _units_seen(reader, {rogue["memory_unit_id"]})
            expect(rogue["memory_unit_id"] != "rogue", "the client's unit id was kept")
            got = stored.get(rogue["memory_unit_id"], {}).get("memory_unit", {})
            expect(got.get(key) != "rogue", f"the client's `{key}` was kept")
        else:
            expect(_refused(rogue.status), f"`{key}` given: {rogue.describe()}")


@check("L0-record-missing-intent", level=0, section="6.3 rule 2, 8.2")
async def record_missing_intent(ctx: Context) -> None:
    """A RECORD without `intent.purpose`, or with an empty one, is MISSING_INTENT."""
    agent = await ctx.wire.register("intent")
    for intent in (None, {}, {"purpose": ""}):
        answer = await agent.send("RECORD", _payload(intent=intent))
        expect_error(answer, 422, "MISSING_INTENT", f"intent={intent!r}")
        expect(answer["recoverable"] is True, "MISSING_INTENT is not recoverable")
        expect(answer["operation"] == "RECORD", "the error names no RECORD operation")


@check("L0-record-invalid-type", level=0, section="5.3, 8.2")
async def record_invalid_type(ctx: Context) -> None:
    """An unknown MemoryType is INVALID_TYPE; the four required types are accepted."""
    agent = await ctx.wire.register("type")
    answer = await agent.send("RECORD", _payload(type="rumour"))
    expect_error(answer, 422, "INVALID_TYPE", "type rumour")
    for memory_type in ("finding", "decision", "observation", "question"):
        answer = await agent.record(f"A {memory_type} of the suite.", type=memory_type)
        expect_ok(answer, f"type {memory_type}")


@check("L0-record-invalid-confidence", level=0, section="6.3 rule 4, 8.2")
async def record_invalid_confidence(ctx: Context) -> None:
    """A confidence score outside 0.0-1.0 is INVALID_CONFIDENCE; 0 and 1 are accepted."""
    agent = await ctx.wire.register("conf")
    for score in (1.5, -0.1):
        answer = await agent.send("RECORD", _payload(confidence={"score": score, "reasoning": "r"}))
        expect_error(answer, 422, "INVALID_CONFIDENCE", f"score {score}")
    for score in (0, 1):
        answer = await agent.send("RECORD", _payload(confidence={"score": score, "reasoning": "r"}))
        expect_ok(answer, f"score {score}")


@check("L0-errors-recoverable", level=0, section="8.1, 8.2")
async def errors_recoverable(ctx: Context) -> None:
    """Every error a client can provoke carries the 8.1 fields with the spec's `recoverable`."""
    agent = await ctx.wire.register("errs")
    provoked = {
        "MISSING_INTENT": (await agent.send("RECORD", _payload(intent=None)), True),
        "MISSING_CONFIDENCE": (await agent.send("RECORD", _payload(confidence=None)), True),
        "INVALID_TYPE": (await agent.send("RECORD", _payload(type="gossip")), True),
        "INVALID_CONFIDENCE": (
            await agent.send("RECORD", _payload(confidence={"score": 7, "reasoning": "r"})),
            True,
        ),
    }
    if ctx.supports("MERGE"):
        merge = {
            "conflict_id": "conflict-none",
            "strategy": "last_write_wins",
            "resolution": {"rationale": "r"},
        }
        provoked["CONFLICT_NOT_FOUND"] = (await agent.send("MERGE", merge), False)
    if ctx.supports("DETECT"):
        detect = {"mode": "check", "target_id": "mem-none"}
        provoked["UNIT_NOT_FOUND"] = (await agent.send("DETECT", detect), False)
    for code, (answer, recoverable) in provoked.items():
        if code == "CONFLICT_NOT_FOUND" and answer.code == "INSUFFICIENT_AUTHORITY":
            continue  # authority is checked first here; the code is provoked at Level 2
        expect(answer.code == code, f"expected {code}, got {answer.describe()}")
        expect_error_shape(answer, code)
        expect(
            answer["recoverable"] is recoverable,
            f"{code}: recoverable is {answer['recoverable']!r}, the spec says {recoverable}",
        )


@check("L0-attune-shape", level=0, section="6.4 rule 9, 5.6")
async def attune_shape(ctx: Context) -> None:
    """ATTUNE with the Required Scope answers ranked units, each with a score and a reason."""
    recorder, reader = await _pair(ctx, "shape")
    for content in ("Revenue grew 4% in Q1.", "The office moved to the third floor."):
        expect_ok(await recorder.record(content), "RECORD")
    body = expect_ok(await reader.attune(20), "ATTUNE")
    expect(body.get("status") == "ok", "status is not ok")
    expect(isinstance(body.get("record"), list) and body["record"], "no units in `record`")
    expect(isinstance(body.get("conflicts"), list), "no `conflicts` list")
    budget = body.get("context_budget") or {}
    for key in ("units_returned", "units_available"):
        expect(isinstance(budget.get(key), int), f"context_budget.{key} is missing")
    expect(budget["units_returned"] == len(body["record"]), "units_returned != len(record)")
    expect(isinstance(body.get("epoch"), int), "no epoch")
    for item in body["record"]:
        score = item.get("relevance_score")
        expect(isinstance(score, int | float) and 0 <= score <= 1, f"relevance_score {score!r}")
        reason = item.get("relevance_reason")
        expect(isinstance(reason, str) and reason.strip(), "no relevance_reason")
        expect(isinstance(item.get("memory_unit"), dict), "no memory_unit")


@check("L0-attune-sorted", level=0, section="6.4 rule 4")
async def attune_sorted(ctx: Context) -> None:
    """ATTUNE results are sorted by relevance score, descending."""
    recorder = await ctx.wire.register("sort-rec", role="engineer")
    reader = await ctx.wire.register(
        "sort-read", role="engineer", interests=["database migration", "postgres"]
    )
    for content in (
        "Bananas are yellow when ripe.",
        "The postgres database migration finished; schema v12 is live.",
        "Lunch is soup on Fridays.",
        "The database migration to postgres 16 needs a maintenance window.",
    ):
        expect_ok(await recorder.record(content, type="decision"), "RECORD")
    body = expect_ok(await reader.attune(50), "ATTUNE")
    scores = [item["relevance_score"] for item in body["record"]]
    expect(len(scores) >= 2, "fewer than two units to rank")
    expect(scores == sorted(scores, reverse=True), f"scores not descending: {scores[:10]}")


@check("L0-attune-max-units", level=0, section="6.4 rule 5")
async def attune_max_units(ctx: Context) -> None:
    """ATTUNE returns at most `scope.max_units` units."""
    recorder, reader = await _pair(ctx, "maxu")
    for n in range(4):
        expect_ok(await recorder.record(f"Measurement {n} of the page size."), "RECORD")
    body = expect_ok(await reader.attune(2), "ATTUNE")
    expect(len(body["record"]) <= 2, f"{len(body['record'])} units for max_units 2")
    expect(len(body["record"]) == 2, "fewer units than max_units while more are available")


@check("L0-attune-excludes-own", level=0, section="6.4 rule 1")
async def attune_excludes_own(ctx: Context) -> None:
    """ATTUNE leaves out the requesting agent's own units by default."""
    recorder, reader = await _pair(ctx, "own")
    mine = expect_ok(await reader.record("The reader's own note."), "RECORD")["memory_unit_id"]
    theirs = expect_ok(await recorder.record("Someone else's note."), "RECORD")["memory_unit_id"]
    seen = await _units_seen(reader, {mine, theirs})
    expect(theirs in seen, "another agent's unit is missing")
    expect(mine not in seen, "the agent's own unit is in its ATTUNE")


@check("L0-attune-excludes-superseded", level=0, section="6.4 rule 2")
async def attune_excludes_superseded(ctx: Context) -> None:
    """A superseded unit leaves ATTUNE; the unit that supersedes it is there."""
    recorder, reader = await _pair(ctx, "sup")
    old = expect_ok(await recorder.record("The launch is on May 3."), "RECORD")["memory_unit_id"]
    new = expect_ok(
        await recorder.record(
            "The launch moved to May 10.",
            relations=[{"type": "supersedes", "target_id": old, "description": None}],
        ),
        "RECORD with supersedes",
    )["memory_unit_id"]
    seen = await _units_seen(reader, {old, new})
    expect(new in seen, "the superseding unit is missing")
    expect(old not in seen, "the superseded unit is still in ATTUNE")


@check("L0-auth-required", level=0, section="8.2, 11", strength=Strength.EXTENSION)
async def auth_required(ctx: Context) -> None:
    """Without a token an operation is 401; with another agent's id it is 403 FORBIDDEN."""
    agent = await ctx.wire.register("auth")
    other = await ctx.wire.register("auth-other")
    body = envelope("RECORD", agent.id, _payload())
    answer = await ctx.wire.post("/v1/record", body)
    expect_error(answer, 401, "UNAUTHENTICATED", "RECORD without a token")
    answer = await ctx.wire.post("/v1/record", body, token="not-a-token-of-this-field")
    expect_error(answer, 401, "UNAUTHENTICATED", "RECORD with a token never issued")
    answer = await ctx.wire.post("/v1/record", body, token=other.token)
    expect_error(answer, 403, "FORBIDDEN", "RECORD with another agent's token")
