"""End-to-end tests of the HTTP binding: a real server, a real client, the wire contract.

Every test talks to a real uvicorn server (``field_server`` / ``sqlite_server`` /
``server_factory`` from conftest) over TCP. Every response goes through
:func:`exchange`, which checks that it is JSON (never a 500, never an HTML or
plain-text page) and validates it against its schema in ``protocol/schemas``:
a success body against the endpoint's ``*.response`` schema, an error body
against ``error`` (with the HTTP status :data:`field.contract.errors.HTTP_STATUS` gives
its code). :class:`CheckedClient` is the SDK with that check on every call.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from field.client import AgentClient, FieldClient, FieldClientError
from field.contract.errors import HTTP_STATUS
from field.contract.model import MAX_EPOCH, Limits

from .schema_util import errors as schema_errors

RESPONSE_SCHEMAS = {
    "/v1/register": "register.response",
    "/v1/deregister": "deregister.response",
    "/v1/record": "record.response",
    "/v1/attune": "attune.response",
    "/v1/detect": "detect.response",
    "/v1/field/status": "field-status.response",
    "/v1/agents": "agents.response",
    "/v1/conflicts": "conflicts.response",
    "/v1/session": "session.response",
    "/v1/coordinate": "coordinate.response",
    "/v1/handoff": "handoff.response",
}
OPERATIONS = ["REGISTER", "DEREGISTER", "RECORD", "ATTUNE", "DETECT"]
ENVELOPE_KEYS = [
    "protocol",
    "version",
    "id",
    "operation",
    "agent_id",
    "session_id",
    "epoch",
    "payload",
]
_NOTHING = object()  # "no JSON body" for exchange()
_DELETE = object()  # "remove this key" for envelope and payload changes


# -- the checked exchange ------------------------------------------------------


@dataclass
class Reply:
    status: int
    body: Any
    headers: Any


def check_reply(path: str, status: int, headers: Any, raw: bytes) -> Any:
    """Assert the response obeys the wire contract; returns the decoded body."""
    assert status != 500, f"500 from {path}: {raw[:500]!r}"
    media = headers.get("Content-Type", "").split(";")[0].strip()
    assert media == "application/json", f"{status} from {path} is {media!r}: {raw[:200]!r}"
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:  # pragma: no cover - the assertion is the point
        pytest.fail(f"{status} from {path} is not JSON: {raw[:200]!r}")
    if status >= 400:
        problems = schema_errors("error", body)
        assert not problems, f"{status} error body from {path} breaks 'error': {problems}\n{body}"
        assert HTTP_STATUS.get(body["code"]) == status, f"{body['code']} sent with {status}"
        if status == 401:
            assert headers.get("WWW-Authenticate", "").startswith("Bearer"), dict(headers)
    else:
        assert status == 200, (status, body)
        schema = RESPONSE_SCHEMAS[path.split("?", 1)[0]]
        problems = schema_errors(schema, body)
        assert not problems, f"{path} response breaks {schema!r}: {problems}\n{body}"
    return body


async def exchange(
    session: aiohttp.ClientSession,
    url: str,
    method: str,
    path: str,
    *,
    body: Any = _NOTHING,
    data: Any = None,
    headers: dict[str, str] | None = None,
    token: str | None = None,
    skip_auto_headers: tuple[str, ...] = (),
) -> Reply:
    """One HTTP request; the reply is checked by :func:`check_reply`."""
    sent_headers = {"Content-Type": "application/json"} if body is not _NOTHING else {}
    if headers:
        sent_headers.update(headers)
    if token is not None:
        sent_headers["Authorization"] = f"Bearer {token}"
    if body is not _NOTHING:
        data = orjson.dumps(body)
    async with session.request(
        method,
        url + path,
        data=data,
        headers=sent_headers,
        skip_auto_headers=skip_auto_headers,
    ) as response:
        raw = await response.read()
        decoded = check_reply(path, response.status, response.headers, raw)
        return Reply(response.status, decoded, response.headers)


class CheckedClient(FieldClient):
    """The SDK, with every response checked against the wire contract."""

    async def request(
        self, method: str, path: str, *, body: Any = None, token: str | None = None
    ) -> dict[str, Any]:
        reply = await exchange(
            self.session,
            self.base_url,
            method,
            path,
            body=_NOTHING if body is None else body,
            token=token,
        )
        if reply.status >= 400:
            raise FieldClientError(reply.status, reply.body)
        result: dict[str, Any] = reply.body
        return result

    async def raw(self, method: str, path: str, **kwargs: Any) -> Reply:
        return await exchange(self.session, self.base_url, method, path, **kwargs)

    async def post(
        self,
        path: str,
        operation: str,
        agent_id: str,
        payload: Any,
        *,
        token: str | None = None,
        epoch: int = 0,
        changes: dict[str, Any] | None = None,
    ) -> Reply:
        """POST an envelope (with ``changes`` applied to it) without raising on errors."""
        envelope = self.envelope(operation, agent_id, payload, epoch=epoch)
        for key, value in (changes or {}).items():
            if value is _DELETE:
                del envelope[key]
            else:
                envelope[key] = value
        return await self.raw("POST", path, body=envelope, token=token)


async def fails(awaitable: Any, status: int, code: str) -> dict[str, Any]:
    """Await an SDK call that must fail with ``status`` and ``code``; returns the error body."""
    with pytest.raises(FieldClientError) as info:
        await awaitable
    error = info.value
    assert (error.status, error.code) == (status, code), error.body
    body: dict[str, Any] = error.body
    return body


def expect(reply: Reply, status: int, code: str) -> dict[str, Any]:
    assert (reply.status, reply.body.get("code")) == (status, code), reply.body
    body: dict[str, Any] = reply.body
    return body


async def snapshot(field: CheckedClient) -> tuple[Any, ...]:
    """What a failed request must not change: epoch, counts, log position, identity."""
    status = await field.status()
    return status["epoch"], status["counts"], status["log"]["last_position"], status["field_id"]


def ids(context: dict[str, Any]) -> list[str]:
    return [
        item["memory_unit"]["id"] if "memory_unit" in item else item["memory_unit_id"]
        for item in context["record"]
    ]


def unit_epochs(context: dict[str, Any]) -> list[int]:
    return [
        item["memory_unit"]["epoch"] if "memory_unit" in item else item["epoch"]
        for item in context["record"]
    ]


def scores(context: dict[str, Any]) -> list[float]:
    return [item["relevance_score"] for item in context["record"]]


def tokens(obj: Any) -> int:
    """The server's documented estimate: four bytes of JSON per token."""
    return math.ceil(len(orjson.dumps(obj)) / 4)


async def note(
    agent: AgentClient, content: str, memory_type: str = "finding", **kwargs: Any
) -> dict[str, Any]:
    kwargs.setdefault("purpose", "Share what was found")
    kwargs.setdefault("confidence", 0.7)
    kwargs.setdefault("reasoning", "checked against two sources")
    return await agent.record(memory_type, content, **kwargs)


# -- fixtures ------------------------------------------------------------------


@pytest.fixture
async def field(field_server: Any) -> AsyncIterator[CheckedClient]:
    async with CheckedClient(field_server.url) as client:
        yield client


@pytest.fixture
async def alice(field: CheckedClient) -> AgentClient:
    return await field.register("alice", "market_researcher", interests=["market size"])


@pytest.fixture
async def bob(field: CheckedClient, alice: AgentClient) -> AgentClient:
    return await field.register("bob", "strategist", interests=["pricing"])


# -- quickstart ----------------------------------------------------------------


async def test_quickstart_flow(field: CheckedClient) -> None:
    researcher = await field.register(
        "researcher-01", "market_researcher", interests=["market size"]
    )
    strategist = await field.register("strategist-01", "strategist", interests=["market"])
    created = await researcher.send(
        "SESSION", {"action": "create", "name": "Market sizing", "invitees": ["strategist-01"]}
    )
    researcher.session_id = created["session"]["id"]
    # units recorded in a session are seen by its members only (spec 11.3), who join it
    # by invitation
    await strategist.send("SESSION", {"action": "join", "session_id": researcher.session_id})
    recorded = await researcher.record(
        "finding",
        "EU HR SaaS market grows 23% a year.",
        purpose="Validate market size",
        confidence=0.8,
        reasoning="three analyst reports agree",
    )
    assert recorded["status"] == "accepted"
    assert recorded["conflicts_detected"] == []
    assert recorded["rejection_reason"] is None
    assert recorded["epoch"] > strategist.registration["epoch"]

    context = await strategist.attune(max_units=10)
    assert ids(context) == [recorded["memory_unit_id"]]
    item = context["record"][0]
    assert 0.0 <= item["relevance_score"] <= 1.0
    assert item["relevance_reason"].strip()
    assert item["format"] == "full"
    unit = item["memory_unit"]
    assert unit["content"] == "EU HR SaaS market grows 23% a year."
    assert unit["type"] == "finding"
    assert unit["mode"] == "committed"
    assert unit["status"] == "active"
    assert unit["epoch"] == recorded["epoch"]
    assert unit["intent"]["purpose"] == "Validate market size"
    assert unit["confidence"] == {"score": 0.8, "reasoning": "three analyst reports agree"}
    assert unit["source"]["agent_id"] == "researcher-01"
    assert unit["source"]["agent_role"] == "market_researcher"
    assert unit["source"]["session_id"] == researcher.session_id  # copied from the envelope
    assert unit["relations"] == []
    assert context["context_budget"]["units_returned"] == 1
    assert context["context_budget"]["units_available"] == 1
    assert context["conflicts"] == []

    own = await researcher.attune(max_units=10)
    assert own["record"] == []
    assert own["context_budget"]["units_available"] == 0
    own = await researcher.attune(max_units=10, include_own=False)
    assert own["record"] == []
    own = await researcher.attune(max_units=10, include_own=True)
    assert ids(own) == [recorded["memory_unit_id"]]


# -- REGISTER ------------------------------------------------------------------


async def test_register_exchanges_capabilities(field: CheckedClient) -> None:
    status = await field.status()
    agent = await field.register(
        "alice",
        "market_researcher",
        interests=["market size", "pricing"],
        current_task_id="task-7",
        required_operations=["RECORD", "ATTUNE"],
    )
    response = agent.registration
    assert response["status"] == "registered"
    assert response["rejection_reason"] is None
    assert response["epoch"] > status["epoch"]
    assert response["agent"] == {
        "id": "alice",
        "role": "market_researcher",
        "status": "idle",
        "interests": ["market size", "pricing"],
        "current_task_id": "task-7",
        "registered_epoch": response["epoch"],
        "authority": 4,
    }
    caps = response["field_capabilities"]
    assert caps["conformance_level"] >= 1
    assert caps["protocol_version"] == "0.1.0"
    assert set(OPERATIONS) <= set(caps["supported_operations"])
    assert caps["persistence"] is False  # the in-memory log
    assert caps["field_id"] == status["field_id"]
    assert "list" in caps["detect_modes"]
    assert caps["limits"] == Limits().as_dict() == status["limits"]

    other = await field.register("bob", "strategist")
    assert other.token != agent.token
    assert other.registration["agent"]["interests"] == []
    assert other.registration["agent"]["current_task_id"] is None
    assert other.registration["agent"]["status"] == "idle"

    listed = await agent.get("/v1/agents")
    assert {a["id"]: a["status"] for a in listed["agents"]} == {"alice": "idle", "bob": "idle"}
    assert listed["epoch"] == other.registration["epoch"]


async def test_register_errors(field: CheckedClient, alice: AgentClient) -> None:
    before = await snapshot(field)

    body = await fails(field.register("alice", "someone_else"), 409, "AGENT_ID_TAKEN")
    assert body["operation"] == "REGISTER"
    assert body["recoverable"] is True

    body = await fails(
        field.register("carol", "planner", required_operations=["RECORD", "TELEPORT"]),
        422,
        "UNSUPPORTED_OPERATION",
    )
    assert body["operation"] == "REGISTER"
    assert body["recoverable"] is False
    details = body["details"]
    assert details["status"] == "rejected"
    assert details["missing_operations"] == ["TELEPORT"]
    assert details["rejection_reason"]
    assert details["field_capabilities"] == alice.registration["field_capabilities"]

    reply = await field.post("/v1/register", "REGISTER", "carol", {"id": "mallory", "role": "x"})
    body = expect(reply, 403, "FORBIDDEN")
    assert body["operation"] == "REGISTER"

    for payload in (
        {"id": "carol"},
        {"role": "x"},
        {"id": "carol", "role": "   "},
        {"id": "carol", "role": "x", "extra": 1},
        {"id": "carol", "role": "x", "interests": "pricing"},
    ):
        reply = await field.post("/v1/register", "REGISTER", "carol", payload)
        expect(reply, 422, "INVALID_PAYLOAD")

    assert await snapshot(field) == before
    listed = await alice.get("/v1/agents")
    assert [a["id"] for a in listed["agents"]] == ["alice"]
    # a rejected REGISTER leaves the id free
    carol = await field.register("carol", "planner", required_operations=["RECORD"])
    assert carol.registration["agent"]["id"] == "carol"


async def test_reregister_after_deregister(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    recorded = await note(alice, "Competitor X raised prices.")
    gone = await alice.deregister()
    assert gone["status"] == "ok"
    assert gone["cleanup"] == {"units_orphaned": 1, "tasks_reassigned": 0}
    old_token = alice.token
    # the units of an agent that left stay in the Field, visible to others
    assert ids(await bob.attune(max_units=5)) == [recorded["memory_unit_id"]]
    listed = await bob.get("/v1/agents")
    assert [a["id"] for a in listed["agents"]] == ["bob"]

    # the id is retired: no one else may take it, and with it alice's units
    taken = await fails(field.register("alice", "impostor"), 409, "AGENT_ID_TAKEN")
    assert "last token" in taken["suggested_action"]
    await fails(
        field.register("alice", "impostor", previous_token=bob.token), 409, "AGENT_ID_TAKEN"
    )
    assert [a["id"] for a in (await bob.get("/v1/agents"))["agents"]] == ["bob"]
    # alice herself comes back with the token DEREGISTER revoked
    again = await field.register("alice", "market_researcher", previous_token=old_token)
    assert again.token != old_token
    assert again.registration["agent"]["status"] == "idle"
    assert again.registration["epoch"] > gone["epoch"]
    await fails(alice.attune(max_units=5), 401, "AGENT_NOT_REGISTERED")
    context = await again.attune(max_units=5, include_own=True)
    assert ids(context) == [recorded["memory_unit_id"]]


# -- authentication --------------------------------------------------------------


async def test_authentication(field: CheckedClient, alice: AgentClient, bob: AgentClient) -> None:
    before = await snapshot(field)
    record = {
        "mode": "committed",
        "type": "finding",
        "content": "x",
        "intent": {"purpose": "p"},
        "confidence": {"score": 0.5, "reasoning": "r"},
    }
    for token in (None, "", "garbage-token-that-was-never-issued"):
        reply = await field.post("/v1/record", "RECORD", "alice", record, token=token)
        body = expect(reply, 401, "UNAUTHENTICATED")
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
        assert body["operation"] == "RECORD"
    for header in ("Basic YWxpY2U6cHc=", "Bearer", "Bearer   ", alice.token):
        reply = await field.raw(
            "POST",
            "/v1/record",
            body=field.envelope("RECORD", "alice", record),
            headers={"Authorization": header},
        )
        expect(reply, 401, "UNAUTHENTICATED")

    reply = await field.post("/v1/record", "RECORD", "alice", record, token=bob.token)
    body = expect(reply, 403, "FORBIDDEN")
    assert body["operation"] == "RECORD"
    reply = await field.post(
        "/v1/deregister", "DEREGISTER", "alice", {"agent_id": "alice"}, token=bob.token
    )
    expect(reply, 403, "FORBIDDEN")
    reply = await field.post(
        "/v1/deregister", "DEREGISTER", "bob", {"agent_id": "alice"}, token=bob.token
    )
    expect(reply, 403, "FORBIDDEN")
    assert await snapshot(field) == before

    for path in ("/v1/agents", "/v1/conflicts"):
        for token in (None, "garbage-token-that-was-never-issued"):
            expect(await field.raw("GET", path, token=token), 401, "UNAUTHENTICATED")
        assert (await field.raw("GET", path, token=bob.token)).status == 200
    status = await field.raw("GET", "/v1/field/status")
    assert status.status == 200

    await bob.deregister()
    for operation, payload in (
        ("ATTUNE", {"scope": {"role": "r", "max_units": 1}}),
        ("RECORD", record),
        ("DETECT", {"mode": "list"}),
        ("DEREGISTER", {"agent_id": "bob"}),
    ):
        reply = await field.post(
            f"/v1/{operation.lower()}", operation, "bob", payload, token=bob.token
        )
        body = expect(reply, 401, "AGENT_NOT_REGISTERED")
        assert body["recoverable"] is True
    for path in ("/v1/agents", "/v1/conflicts"):
        expect(await field.raw("GET", path, token=bob.token), 401, "AGENT_NOT_REGISTERED")
    listed = await alice.get("/v1/agents")
    assert [a["id"] for a in listed["agents"]] == ["alice"]


# -- RECORD ----------------------------------------------------------------------


def _record_payload(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "mode": "committed",
        "type": "finding",
        "content": "Churn in the SMB segment is 4% a month.",
        "intent": {"purpose": "Estimate retention", "task_id": None},
        "confidence": {"score": 0.6, "reasoning": "cohort analysis of 2025 data"},
    }
    for key, value in changes.items():
        if value is _DELETE:
            del payload[key]
        else:
            payload[key] = value
    return payload


RECORD_ERRORS: list[tuple[str, dict[str, Any], int, str]] = [
    ("no intent", _record_payload(intent=_DELETE), 422, "MISSING_INTENT"),
    ("null intent", _record_payload(intent=None), 422, "MISSING_INTENT"),
    ("intent without purpose", _record_payload(intent={"task_id": "t"}), 422, "MISSING_INTENT"),
    ("empty purpose", _record_payload(intent={"purpose": ""}), 422, "MISSING_INTENT"),
    ("blank purpose", _record_payload(intent={"purpose": " \t\n "}), 422, "MISSING_INTENT"),
    ("draft, no purpose", _record_payload(mode="draft", intent=_DELETE), 422, "MISSING_INTENT"),
    ("committed, no confidence", _record_payload(confidence=_DELETE), 422, "MISSING_CONFIDENCE"),
    (
        "mode absent (committed), no confidence",
        _record_payload(mode=_DELETE, confidence=_DELETE),
        422,
        "MISSING_CONFIDENCE",
    ),
    # null is not an object: a structural problem, not a missing confidence
    ("committed, null confidence", _record_payload(confidence=None), 422, "INVALID_PAYLOAD"),
    (
        "draft, null confidence",
        _record_payload(mode="draft", confidence=None),
        422,
        "INVALID_PAYLOAD",
    ),
    (
        "committed, no reasoning",
        _record_payload(confidence={"score": 0.5}),
        422,
        "MISSING_CONFIDENCE",
    ),
    (
        "committed, blank reasoning",
        _record_payload(confidence={"score": 0.5, "reasoning": "  "}),
        422,
        "MISSING_CONFIDENCE",
    ),
    (
        "committed, no score",
        _record_payload(confidence={"reasoning": "r"}),
        422,
        "MISSING_CONFIDENCE",
    ),
    (
        "score 1.5",
        _record_payload(confidence={"score": 1.5, "reasoning": "r"}),
        422,
        "INVALID_CONFIDENCE",
    ),
    (
        "score -0.1",
        _record_payload(confidence={"score": -0.1, "reasoning": "r"}),
        422,
        "INVALID_CONFIDENCE",
    ),
    (
        "score 'high'",
        _record_payload(confidence={"score": "high", "reasoning": "r"}),
        422,
        "INVALID_CONFIDENCE",
    ),
    (
        "score true",
        _record_payload(confidence={"score": True, "reasoning": "r"}),
        422,
        "INVALID_CONFIDENCE",
    ),
    (
        "draft score 2",
        _record_payload(mode="draft", confidence={"score": 2}),
        422,
        "INVALID_CONFIDENCE",
    ),
    ("unknown type", _record_payload(type="opinion"), 422, "INVALID_TYPE"),
    ("missing type", _record_payload(type=_DELETE), 422, "INVALID_TYPE"),
    ("agent-set id", _record_payload(id="mem-mine"), 422, "INVALID_PAYLOAD"),
    ("agent-set epoch", _record_payload(epoch=7), 422, "INVALID_PAYLOAD"),
    ("agent-set source", _record_payload(source={"agent_id": "alice"}), 422, "INVALID_PAYLOAD"),
    ("agent-set status", _record_payload(status="active"), 422, "INVALID_PAYLOAD"),
    ("unknown field", _record_payload(colour="red"), 422, "INVALID_PAYLOAD"),
    ("bad mode", _record_payload(mode="final"), 422, "INVALID_PAYLOAD"),
    ("no content", _record_payload(content=_DELETE), 422, "INVALID_PAYLOAD"),
    ("blank content", _record_payload(content="   "), 422, "INVALID_PAYLOAD"),
    (
        "bad relation type",
        _record_payload(relations=[{"type": "likes", "target_id": "mem-x"}]),
        422,
        "INVALID_PAYLOAD",
    ),
    (
        "relation to unknown unit",
        _record_payload(relations=[{"type": "supports", "target_id": "mem-nope"}]),
        404,
        "UNIT_NOT_FOUND",
    ),
    (
        "contradicts unknown unit",
        _record_payload(relations=[{"type": "contradicts", "target_id": "mem-nope"}]),
        404,
        "UNIT_NOT_FOUND",
    ),
]


async def test_record_errors(field: CheckedClient, alice: AgentClient, bob: AgentClient) -> None:
    await note(alice, "A unit that exists.")
    before = await snapshot(field)
    for name, payload, status, code in RECORD_ERRORS:
        reply = await field.post("/v1/record", "RECORD", "alice", payload, token=alice.token)
        assert (reply.status, reply.body["code"]) == (status, code), (name, reply.body)
        assert reply.body["operation"] == "RECORD", name
        assert reply.body["recoverable"] is (status != 404), name
        assert reply.body["message"], name
    assert await snapshot(field) == before
    context = await bob.attune(max_units=100)
    assert context["context_budget"]["units_available"] == 1


async def test_record_draft_without_confidence(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    recorded = await alice.record(
        "assumption", "Prices might rise.", purpose="Plan pricing", mode="draft"
    )
    assert recorded["status"] == "accepted"
    context = await bob.attune(max_units=10)
    assert ids(context) == [recorded["memory_unit_id"]]
    unit = context["record"][0]["memory_unit"]
    assert unit["status"] == "draft"
    assert unit["mode"] == "draft"
    assert "confidence" not in unit
    status = await field.status()
    assert status["counts"]["memory_units"] == {"draft": 1}

    committed = await note(alice, "Prices rose 5%.")
    # a draft's confidence is optional, and so are its score and reasoning one by one
    only_reasoning = await alice.send(
        "RECORD", _record_payload(mode="draft", confidence={"reasoning": "a hunch"})
    )
    draft = _record_payload(mode="draft", confidence={"score": 0.3})
    only_score = await alice.send("RECORD", draft)
    context = await bob.attune(max_units=10)
    units = {item["memory_unit"]["id"]: item["memory_unit"] for item in context["record"]}
    assert {k: u["status"] for k, u in units.items()} == {
        recorded["memory_unit_id"]: "draft",
        committed["memory_unit_id"]: "active",
        only_reasoning["memory_unit_id"]: "draft",
        only_score["memory_unit_id"]: "draft",
    }
    assert units[only_reasoning["memory_unit_id"]]["confidence"] == {"reasoning": "a hunch"}
    assert units[only_score["memory_unit_id"]]["confidence"] == {"score": 0.3}
    assert (await field.status())["counts"]["memory_units"] == {"draft": 3, "active": 1}


async def test_record_contradicts_creates_conflict(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    first = await note(alice, "The EU market grows 23% a year.")
    second = await note(
        bob,
        "The EU market grows 9% a year.",
        relations=[
            {
                "type": "contradicts",
                "target_id": first["memory_unit_id"],
                "description": "growth rates disagree",
            }
        ],
    )
    assert len(second["conflicts_detected"]) == 1
    conflict_id = second["conflicts_detected"][0]

    context = await alice.attune(max_units=10)
    assert [c["id"] for c in context["conflicts"]] == [conflict_id]
    conflict = context["conflicts"][0]
    assert {conflict["unit_a"], conflict["unit_b"]} == {
        first["memory_unit_id"],
        second["memory_unit_id"],
    }
    assert conflict["status"] == "detected"
    assert conflict["detected_by"] == "explicit"
    assert conflict["description"] == "growth rates disagree"
    assert conflict["epoch"] == second["epoch"]
    assert "resolution" not in conflict
    assert ids(context) == [second["memory_unit_id"]]
    assert context["record"][0]["memory_unit"]["status"] == "contested"

    mine = await bob.attune(max_units=10, include_own=True)
    assert {
        item["memory_unit"]["id"]: item["memory_unit"]["status"] for item in mine["record"]
    } == {first["memory_unit_id"]: "contested", second["memory_unit_id"]: "contested"}
    assert [c["id"] for c in mine["conflicts"]] == [conflict_id]

    detected = await alice.detect("list")
    assert detected["conflicts"] == [conflict]
    assert detected["scan_coverage"] == {"units_scanned": 0, "new_conflicts_found": 0}
    listed = await bob.get("/v1/conflicts")
    assert listed["conflicts"] == [conflict]

    status = await field.status()
    assert status["counts"]["conflicts"] == {"total": 1, "unresolved": 1}
    assert status["counts"]["memory_units"] == {"contested": 2}

    # Without a description the Field writes one.
    third = await note(
        alice,
        "Growth is flat.",
        relations=[{"type": "contradicts", "target_id": second["memory_unit_id"]}],
    )
    listed = await bob.get("/v1/conflicts")
    made = [c for c in listed["conflicts"] if c["id"] == third["conflicts_detected"][0]]
    assert made and made[0]["description"].strip()


async def test_record_supersedes_hides_target(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    old = await note(alice, "Launch in Q3.", "decision")
    other = await note(alice, "Hire two engineers.", "decision")
    new = await note(
        alice,
        "Launch in Q4 instead.",
        "decision",
        relations=[{"type": "supersedes", "target_id": old["memory_unit_id"]}],
    )
    context = await bob.attune(max_units=10)
    assert set(ids(context)) == {other["memory_unit_id"], new["memory_unit_id"]}
    assert context["context_budget"]["units_available"] == 2
    own = await alice.attune(max_units=10, include_own=True)
    assert old["memory_unit_id"] not in ids(own)
    polled = await bob.attune(max_units=10, since_epoch=0)
    assert old["memory_unit_id"] not in ids(polled)
    status = await field.status()
    assert status["counts"]["memory_units"] == {"active": 2, "superseded": 1}
    relations = next(
        item["memory_unit"]["relations"]
        for item in context["record"]
        if item["memory_unit"]["id"] == new["memory_unit_id"]
    )
    assert relations == [
        {"type": "supersedes", "target_id": old["memory_unit_id"], "description": None}
    ]


# -- failed requests change nothing ----------------------------------------------


async def test_failed_requests_leave_the_field_unchanged(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    await note(alice, "Something true.")
    before = await snapshot(field)
    status_before = await field.status()
    cur = status_before["epoch"]

    bad_bodies = [b"{", b"", b"[]", b"null", b'"envelope"', b"\xff\xfe", b"[" * 5000]
    for data in bad_bodies:
        for path in ("/v1/register", "/v1/record", "/v1/attune"):
            reply = await field.raw(
                "POST",
                path,
                data=data,
                headers={"Content-Type": "application/json"},
                token=alice.token,
            )
            assert reply.status == 400, (data[:10], reply.body)
    for name, payload, status, code in RECORD_ERRORS:
        reply = await field.post("/v1/record", "RECORD", "alice", payload, token=alice.token)
        assert (reply.status, reply.body["code"]) == (status, code), name
    ok_record = _record_payload()
    attempts = [
        ("/v1/record", "RECORD", "alice", ok_record, None, 0),
        ("/v1/record", "RECORD", "alice", ok_record, bob.token, 0),
        ("/v1/record", "RECORD", "alice", ok_record, alice.token, cur + 2**32 + 1),
        ("/v1/attune", "ATTUNE", "alice", {"scope": {"role": "r"}}, alice.token, 0),
        (
            "/v1/attune",
            "ATTUNE",
            "alice",
            {"scope": {"role": "r", "max_units": 1, "since_epoch": 1}, "since_epoch": 2},
            alice.token,
            0,
        ),
        ("/v1/detect", "DETECT", "alice", {"mode": "check"}, alice.token, 0),
        ("/v1/detect", "DETECT", "alice", {"mode": "check", "target_id": "mem-no"}, alice.token, 0),
        ("/v1/register", "REGISTER", "alice", {"id": "alice", "role": "r"}, None, 0),
        (
            "/v1/register",
            "REGISTER",
            "carol",
            {"id": "carol", "role": "r", "required_operations": ["TELEPORT"]},
            None,
            0,
        ),
        ("/v1/register", "REGISTER", "carol", {"id": "dave", "role": "r"}, None, 0),
        ("/v1/deregister", "DEREGISTER", "alice", {"agent_id": "bob"}, alice.token, 0),
        ("/v1/attune", "RECORD", "alice", ok_record, alice.token, 0),
    ]
    for path, operation, agent_id, payload, token, epoch in attempts:
        reply = await field.post(path, operation, agent_id, payload, token=token, epoch=epoch)
        assert reply.status >= 400, (path, operation, payload)
    for path in ("/v1/agents", "/v1/conflicts?status=bogus", "/v1/nowhere"):
        assert (await field.raw("GET", path)).status >= 400
    assert (await field.raw("GET", "/v1/record")).status == 405
    reply = await field.raw(
        "POST", "/v1/record", data=b"{}", token=alice.token, headers={"Content-Type": "text/plain"}
    )
    assert reply.status == 415

    assert await snapshot(field) == before
    # The next successful operation takes the very next epoch: nothing was consumed.
    recorded = await note(alice, "Still working.")
    assert recorded["epoch"] == cur + 1


# -- ATTUNE ----------------------------------------------------------------------


async def _populate(alice: AgentClient, carol: AgentClient) -> list[dict[str, Any]]:
    made = []
    for i, (author, kind, conf) in enumerate(
        [
            (alice, "observation", 0.2),
            (alice, "decision", 0.9),
            (carol, "finding", 0.5),
            (carol, "constraint", 0.8),
            (alice, "question", 0.4),
            (carol, "observation", 0.99),
        ]
    ):
        made.append(
            await note(
                author,
                f"Unit {i} about the roadmap. More detail follows here.",
                kind,
                confidence=conf,
            )
        )
    return made


async def test_attune_ranking_truncation_and_threshold(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    carol = await field.register("carol", "engineer")
    made = await _populate(alice, carol)
    context = await bob.attune(max_units=100)
    assert sorted(ids(context)) == sorted(r["memory_unit_id"] for r in made)
    ranked = scores(context)
    assert ranked == sorted(ranked, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in ranked)
    assert len(set(ranked)) > 1
    assert context["context_budget"] == {
        "units_returned": 6,
        "units_available": 6,
        "tokens_used": None,
        "tokens_budget": None,
        "limited_by": None,
    }

    top = await bob.attune(max_units=2)
    assert top["context_budget"]["units_returned"] == 2
    assert top["context_budget"]["units_available"] == 6
    assert top["context_budget"]["limited_by"] == "max_units"
    assert ids(top) == ids(context)[:2]
    assert scores(top) == ranked[:2]

    threshold = (ranked[2] + ranked[3]) / 2
    above = await bob.attune(max_units=100, relevance_threshold=threshold)
    assert ids(above) == ids(context)[:3]
    assert above["context_budget"]["units_available"] == 3
    assert all(s >= threshold for s in scores(above))
    nothing = await bob.attune(max_units=100, relevance_threshold=1.0)
    assert nothing["record"] == [] or all(s >= 1.0 for s in scores(nothing))

    for scope in (
        {"max_units": 0},
        {"max_units": 1001},
        {"max_units": "5"},
        {"relevance_threshold": 1.5},
        {"include_own": "yes"},
        {"max_tokens": 0},
        {"temporal_layers": ["someday"]},
        {"colour": "red"},
    ):
        await fails(bob.attune(**{"max_units": 5, **scope}), 422, "INVALID_PAYLOAD")
    await fails(bob.send("ATTUNE", {"scope": {"role": "strategist"}}), 422, "INVALID_PAYLOAD")
    await fails(bob.send("ATTUNE", {}), 422, "INVALID_PAYLOAD")
    await fails(bob.attune(max_units=5, format="xml"), 422, "INVALID_PAYLOAD")


async def test_attune_formats(field: CheckedClient, alice: AgentClient, bob: AgentClient) -> None:
    long_tail = " ".join(["More supporting detail."] * 40)
    recorded = await alice.send(
        "RECORD",
        {
            "mode": "committed",
            "type": "finding",
            "content": f"Competitor X cut prices by 10%. {long_tail}",
            "intent": {"purpose": "Track competitors"},
            "confidence": {
                "score": 0.9,
                "reasoning": "public price list",
                "evidence": ["price list 2026-01"],
                "assumptions": ["list prices are real prices"],
            },
        },
    )
    unit_id = recorded["memory_unit_id"]

    full = await bob.attune(max_units=5, format="full")
    unit = full["record"][0]["memory_unit"]
    assert full["record"][0]["format"] == "full"
    assert unit["content"].startswith("Competitor X cut prices by 10%. More")
    assert len(unit["content"]) > 240
    assert unit["confidence"]["evidence"] == ["price list 2026-01"]

    summary = await bob.attune(max_units=5, format="summary")
    item = summary["record"][0]
    assert item["format"] == "summary"
    assert item["memory_unit"]["id"] == unit_id
    assert item["memory_unit"]["content"] == "Competitor X cut prices by 10%."
    assert len(item["memory_unit"]["content"]) <= 240
    assert item["memory_unit"]["confidence"] == {"score": 0.9, "reasoning": "public price list"}
    assert item["relevance_score"] == full["record"][0]["relevance_score"]

    only = await bob.attune(max_units=5, format="ids_only")
    assert only["record"] == [
        {
            "memory_unit_id": unit_id,
            "epoch": recorded["epoch"],
            "relevance_score": full["record"][0]["relevance_score"],
            "relevance_reason": only["record"][0]["relevance_reason"],
            "format": "ids_only",
        }
    ]
    assert only["record"][0]["relevance_reason"].strip()

    # A single long sentence is cut to 240 characters in a summary.
    await note(alice, "word " * 200)
    summary = await bob.attune(max_units=5, format="summary")
    assert all(len(i["memory_unit"]["content"]) <= 240 for i in summary["record"])


async def test_attune_since_epoch_polling(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    await note(alice, "Old news.")
    start = await bob.attune(max_units=10)
    assert len(start["record"]) == 1
    polled = await bob.attune(max_units=10, since_epoch=start["epoch"])
    assert polled["record"] == []
    assert polled["context_budget"]["units_available"] == 0

    batch = [await note(alice, f"New fact {i}.") for i in range(3)]
    polled = await bob.attune(max_units=10, since_epoch=start["epoch"])
    assert sorted(ids(polled)) == sorted(r["memory_unit_id"] for r in batch)
    # the page names what it holds: the newest unit (a poll from it misses nothing)
    assert polled["epoch"] == max(r["epoch"] for r in batch)
    # strictly after: a unit whose epoch equals since_epoch is not returned again
    after_first = await bob.attune(max_units=10, since_epoch=batch[0]["epoch"])
    assert sorted(ids(after_first)) == sorted(r["memory_unit_id"] for r in batch[1:])
    again = await bob.attune(max_units=10, since_epoch=polled["epoch"])
    assert again["record"] == []

    # top-level since_epoch and scope.since_epoch mean the same
    scope = {"role": "strategist", "max_units": 10}
    top = await bob.send("ATTUNE", {"scope": scope, "since_epoch": batch[0]["epoch"]})
    inner = await bob.send("ATTUNE", {"scope": {**scope, "since_epoch": batch[0]["epoch"]}})
    both = await bob.send(
        "ATTUNE",
        {"scope": {**scope, "since_epoch": batch[0]["epoch"]}, "since_epoch": batch[0]["epoch"]},
    )
    assert ids(top) == ids(inner) == ids(both) == ids(after_first)
    body = await fails(
        bob.send("ATTUNE", {"scope": {**scope, "since_epoch": 1}, "since_epoch": 2}),
        422,
        "INVALID_PAYLOAD",
    )
    assert body["operation"] == "ATTUNE"
    for bad in (-1, "3", 1.5, MAX_EPOCH + 1):
        await fails(
            bob.send("ATTUNE", {"scope": scope, "since_epoch": bad}), 422, "INVALID_PAYLOAD"
        )
        await fails(
            bob.send("ATTUNE", {"scope": {**scope, "since_epoch": bad}}), 422, "INVALID_PAYLOAD"
        )
    # null means "no filter"
    unfiltered = await bob.send(
        "ATTUNE", {"scope": {**scope, "since_epoch": None}, "since_epoch": None}
    )
    assert len(unfiltered["record"]) == 4


async def test_attune_since_epoch_paging(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    carol = await field.register("carol", "engineer")
    start = await bob.attune(max_units=10)
    kinds = [
        "observation",
        "decision",
        "observation",
        "human_directive",
        "finding",
        "question",
        "decision",
    ]
    made = []
    for i, kind in enumerate(kinds):
        author = alice if i % 2 else carol
        made.append(await note(author, f"Paged unit {i}.", kind, confidence=0.1 + i / 10))
    by_epoch = sorted(made, key=lambda r: r["epoch"])
    all_ids = [r["memory_unit_id"] for r in by_epoch]

    seen: list[str] = []
    since = start["epoch"]
    pages = []
    while True:
        clock = (await field.status())["epoch"]
        page = await bob.attune(max_units=3, since_epoch=since)
        pages.append(page)
        # a page consumes an epoch like any ATTUNE, even when it reports an older one
        assert (await field.status())["epoch"] == clock + 1
        remaining = len(all_ids) - len(seen)
        assert page["context_budget"]["units_available"] == remaining
        assert page["context_budget"]["units_returned"] == min(3, remaining)
        assert scores(page) == sorted(scores(page), reverse=True)
        got = ids(page)
        # each page holds the oldest units not yet seen, whatever their relevance
        assert sorted(got) == sorted(all_ids[len(seen) : len(seen) + len(got)])
        if remaining > 3:
            assert page["epoch"] == max(unit_epochs(page))
        else:
            assert page["epoch"] == by_epoch[-1]["epoch"]  # the newest unit
        seen.extend(sorted(got, key=all_ids.index))
        if not got:
            break
        since = page["epoch"]
    assert seen == all_ids  # no repeat, no gap
    assert [len(p["record"]) for p in pages] == [3, 3, 1, 0]

    late = await note(carol, "Arrived after the pages.")
    page = await bob.attune(max_units=3, since_epoch=pages[-1]["epoch"])
    assert ids(page) == [late["memory_unit_id"]]


async def test_attune_interests_and_task_raise_relevance(
    field: CheckedClient, alice: AgentClient
) -> None:
    reader = await field.register("reader", "analyst")
    # the matching units are recorded first, so recency works against them
    match = await note(alice, "Kubernetes autoscaling doubles cloud costs.", "observation")
    other = await note(alice, "The office coffee machine broke again.", "observation")
    context = await reader.attune(max_units=10, interests=["kubernetes autoscaling"])
    by_id = {i["memory_unit"]["id"]: i["relevance_score"] for i in context["record"]}
    assert by_id[match["memory_unit_id"]] > by_id[other["memory_unit_id"]]
    assert ids(context)[0] == match["memory_unit_id"]
    plain = await reader.attune(max_units=10)
    assert ids(plain)[0] == other["memory_unit_id"]
    hinted = await reader.attune(max_units=10, context_hint="I am about to review autoscaling")
    assert ids(hinted)[0] == match["memory_unit_id"]

    task = await note(alice, "Vendor A quote is 40k.", "observation", task_id="task-42")
    free = await note(alice, "Vendor B quote is 45k.", "observation")
    context = await reader.attune(max_units=10, active_task_id="task-42")
    by_id = {i["memory_unit"]["id"]: i["relevance_score"] for i in context["record"]}
    assert by_id[task["memory_unit_id"]] > by_id[free["memory_unit_id"]]
    assert ids(context)[0] == task["memory_unit_id"]

    # the agent's registered task and interests count too
    tasked = await field.register(
        "tasked", "analyst", current_task_id="task-42", interests=["coffee machine"]
    )
    context = await tasked.attune(max_units=10)
    by_id = {i["memory_unit"]["id"]: i["relevance_score"] for i in context["record"]}
    assert by_id[task["memory_unit_id"]] > by_id[free["memory_unit_id"]]
    assert by_id[other["memory_unit_id"]] > by_id[match["memory_unit_id"]]


async def test_attune_max_tokens(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    for i in range(8):
        await note(alice, f"Fact {i} about pricing. " + "Supporting detail. " * 20)
    unlimited = await bob.attune(max_units=8)
    full_cost = sum(tokens(i["memory_unit"]) for i in unlimited["record"])
    for budget in (1, 60, 150, 400, full_cost // 2, full_cost + 100):
        for fmt in ("full", "summary"):
            context = await bob.attune(max_units=8, max_tokens=budget, format=fmt)
            cb = context["context_budget"]
            assert cb["tokens_budget"] == budget
            assert cb["tokens_used"] is not None
            assert cb["tokens_used"] <= budget, (fmt, cb)
            assert cb["units_returned"] == len(context["record"])
            assert cb["tokens_used"] == sum(tokens(i["memory_unit"]) for i in context["record"])
    roomy = await bob.attune(max_units=8, max_tokens=full_cost + 100)
    assert roomy["context_budget"]["units_returned"] == 8
    assert all(i["format"] == "full" for i in roomy["record"])
    tight = await bob.attune(max_units=8, max_tokens=full_cost // 2)
    assert tight["context_budget"]["units_returned"] > 0
    assert any(i["format"] == "summary" for i in tight["record"]) or (
        tight["context_budget"]["units_returned"] < 8
    )


async def test_attune_max_tokens_polling(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    """A poll stays within max_tokens, except that it always returns one unit to progress."""
    # a unit whose summary is much smaller than its full form, ranked first ...
    await note(alice, "Short. " + "word " * 150, "decision", confidence=1.0)
    # ... and one whose summary is as big as its full form
    await note(alice, "x" * 250, "observation", confidence=0.1)
    whole = await bob.attune(max_units=10, since_epoch=0)
    big, small = (i["memory_unit"] for i in whole["record"])
    budget = 300
    # Both fit only as summary + full-or-summary; taking the big one in full (it fits
    # alone) must not push the total over the budget.
    assert tokens(big) < budget < tokens(big) + tokens(small)
    context = await bob.attune(max_units=10, since_epoch=0, max_tokens=budget)
    cb = context["context_budget"]
    assert cb["tokens_budget"] == budget
    assert cb["tokens_used"] <= budget, (cb, [i["format"] for i in context["record"]])
    assert cb["tokens_used"] == sum(tokens(i["memory_unit"]) for i in context["record"])

    for i in range(6):
        await note(alice, f"Polled fact {i}. " + "Detail. " * (5 + 10 * i))
    for budget in (1, 50, 120, 300, 700, 5000):
        since, seen = 0, []
        while True:
            page = await bob.attune(max_units=4, since_epoch=since, max_tokens=budget)
            cb = page["context_budget"]
            if cb["units_available"]:
                assert cb["units_returned"] >= 1, (budget, cb)  # polling never stalls
            if cb["units_returned"] > 1:
                assert cb["tokens_used"] <= budget, (budget, cb)
            seen.extend(ids(page))
            if not page["record"]:
                break
            since = page["epoch"]
        assert len(seen) == len(set(seen)) == 8, budget


# -- DETECT ----------------------------------------------------------------------


async def test_detect_list_filters(
    field: CheckedClient, alice: AgentClient, bob: AgentClient
) -> None:
    carol = await field.register("carol", "engineer")
    empty = await alice.detect("list")
    assert empty["conflicts"] == []
    a1 = await note(alice, "The API is stable.")
    b1 = await note(
        bob,
        "The API is unstable.",
        relations=[{"type": "contradicts", "target_id": a1["memory_unit_id"]}],
    )
    c1 = await note(carol, "Deploys take 5 minutes.")
    c2 = await note(
        carol,
        "Deploys take an hour.",
        relations=[{"type": "contradicts", "target_id": c1["memory_unit_id"]}],
    )
    ab, cc = b1["conflicts_detected"][0], c2["conflicts_detected"][0]

    async def listed(**flt: Any) -> list[str]:
        response = await alice.detect("list", **flt)
        return [c["id"] for c in response["conflicts"]]

    assert await listed() == [ab, cc]
    assert await listed(status=["detected"]) == [ab, cc]
    assert await listed(status=["resolved"]) == []
    assert await listed(status=["resolved", "detected"]) == [ab, cc]
    assert await listed(types=["factual"]) == [ab, cc]
    assert await listed(types=["strategic", "priority"]) == []
    assert await listed(involving_agents=["carol"]) == [cc]
    assert await listed(involving_agents=["alice"]) == [ab]
    assert await listed(involving_agents=["bob"]) == [ab]
    assert await listed(involving_agents=["bob", "carol"]) == [ab, cc]
    assert await listed(involving_agents=["nobody"]) == []
    assert await listed(involving_agents=["carol"], types=["factual"], status=["detected"]) == [cc]
    assert await listed(involving_agents=["carol"], status=["resolved"]) == []

    async def get(query: str) -> list[str]:
        response = await carol.get("/v1/conflicts" + query)
        return [c["id"] for c in response["conflicts"]]

    assert await get("") == [ab, cc]
    assert await get("?involving_agent=carol") == [cc]
    assert await get("?involving_agent=alice,carol") == [ab, cc]
    assert await get("?involving_agent=bob&involving_agent=carol") == [ab, cc]
    assert await get("?status=resolved&status=detected") == [ab, cc]
    assert await get("?status=resolved") == []
    assert await get("?status=detected&type=factual") == [ab, cc]
    assert await get("?type=interpretive") == []
    for query in ("?status=bogus", "?type=bogus", "?involving_agent=-x", "?involving_agent=%C3%91"):
        expect(
            await field.raw("GET", "/v1/conflicts" + query, token=carol.token),
            422,
            "INVALID_PAYLOAD",
        )
    # agent ids are validated as the document's schema for them says
    expect(
        await field.raw("GET", "/v1/agents?id=%C3%91", token=carol.token), 422, "INVALID_PAYLOAD"
    )

    before = await snapshot(field)
    body = await fails(alice.detect("check"), 422, "INVALID_PAYLOAD")  # no target_id
    assert body["operation"] == "DETECT"
    body = await fails(
        alice.send("DETECT", {"mode": "check", "target_id": "mem-nope"}), 404, "UNIT_NOT_FOUND"
    )
    for payload in (
        {},
        {"mode": "everything"},
        {"mode": "list", "filter": {"status": ["x"]}},
        {"mode": "list", "filter": {"types": ["x"]}},
        {"mode": "list", "filter": {"colour": []}},
        {"mode": "list", "filter": []},
    ):
        await fails(alice.send("DETECT", payload), 422, "INVALID_PAYLOAD")
    assert await snapshot(field) == before


# -- Lamport clock ---------------------------------------------------------------


async def test_lamport_clock(field: CheckedClient, alice: AgentClient, bob: AgentClient) -> None:
    seen = [alice.registration["epoch"], bob.registration["epoch"]]

    def advance(epoch: int) -> None:
        assert epoch > max(seen), (epoch, seen)
        seen.append(epoch)

    first = await note(alice, "One.")
    advance(first["epoch"])
    # ATTUNE takes an epoch of its own and answers with that of the newest unit it holds
    assert (await bob.attune(max_units=5))["epoch"] == first["epoch"]
    advance((await bob.detect())["epoch"])
    assert max(seen) > first["epoch"] + 1
    two = await note(bob, "Two.")
    advance(two["epoch"])
    assert (await alice.attune(max_units=5, since_epoch=first["epoch"]))["epoch"] == two["epoch"]
    carol = await field.register("carol", "engineer")
    advance(carol.registration["epoch"])
    # reads outside the protocol do not move the clock
    status = await field.status()
    assert status["epoch"] == max(seen)
    assert (await field.status())["epoch"] == max(seen)
    assert (await carol.get("/v1/agents"))["epoch"] == max(seen)
    assert (await carol.get("/v1/conflicts"))["epoch"] == max(seen)
    advance((await carol.deregister())["epoch"])

    # an envelope from the future moves the clock to max(local, received) + 1
    local = max(seen)
    alice.epoch = local + 1000
    response = await alice.detect()
    assert response["epoch"] == local + 1001
    advance(response["epoch"])
    # an envelope from the past does not move it back
    bob.epoch = 0
    response = await note(bob, "Three.")
    assert response["epoch"] == local + 1002
    advance(response["epoch"])
    assert (await field.status())["epoch"] == local + 1002

    # more than max_epoch_skew (2**20) ahead is refused and the clock stays put (the
    # boundary, and the bound that grows with the Field's age, are in test_clock.py)
    local = max(seen)
    before = await snapshot(field)
    for ahead in (local + 2**20 + 1, MAX_EPOCH):
        alice.epoch = ahead
        body = await fails(alice.detect(), 422, "INVALID_EPOCH")
        assert body["operation"] == "DETECT"
        assert body["recoverable"] is True
        body = await fails(note(alice, "Too far ahead."), 422, "INVALID_EPOCH")
        reply = await field.post(
            "/v1/register", "REGISTER", "dave", {"id": "dave", "role": "x"}, epoch=ahead
        )
        expect(reply, 422, "INVALID_EPOCH")
    assert await snapshot(field) == before
    alice.epoch = 0
    advance((await note(alice, "Four."))["epoch"])
    assert (await field.status())["epoch"] == max(seen) == local + 1

    # concurrent operations each get their own epoch, all above the earlier ones
    results = await asyncio.gather(
        *(note(agent, f"Concurrent {i}.") for i in range(10) for agent in (alice, bob)),
        *(agent.detect() for agent in (alice, bob)),
        bob.detect(),
    )
    epochs = [r["epoch"] for r in results]
    assert len(set(epochs)) == len(epochs)
    assert min(epochs) > max(seen)
    assert (await field.status())["epoch"] == max(epochs) == max(seen) + len(epochs)


async def test_epoch_overflow(server_factory: Any) -> None:
    """With the bounds on jumps lifted, the clock can be driven to 2**53-1: then writes
    stop with EPOCH_OVERFLOW and change nothing, and reads go on at the last epoch."""
    server = server_factory(limits=Limits(max_epoch_skew=2**53))
    async with CheckedClient(server.url) as field:
        alice = await field.register("alice", "market_researcher")
        bob = await field.register("bob", "strategist")
        alice.epoch = MAX_EPOCH - 1
        last = await note(alice, "The last epoch.")
        assert last["epoch"] == MAX_EPOCH
        before = await snapshot(field)
        body = await fails(note(alice, "One too many."), 503, "EPOCH_OVERFLOW")
        assert body["recoverable"] is False
        assert body["operation"] == "RECORD"
        await fails(field.register("carol", "strategist"), 503, "EPOCH_OVERFLOW")
        read = await bob.attune(max_units=5)
        assert read["epoch"] == MAX_EPOCH
        assert [r["memory_unit"]["id"] for r in read["record"]] == [last["memory_unit_id"]]
        assert (await alice.detect())["epoch"] == MAX_EPOCH
        assert await snapshot(field) == before
        assert (await alice.get("/v1/agents"))["epoch"] == MAX_EPOCH


# -- malformed requests ----------------------------------------------------------


async def test_bad_json_and_envelopes(field: CheckedClient, alice: AgentClient) -> None:
    before = await snapshot(field)
    json_headers = {"Content-Type": "application/json"}
    for data in (
        b'{"protocol": ',
        b"",
        b"not json",
        b"{'a': 1}",
        b"\xff\xfe\x00",
        b'{"epoch": NaN}',
        b"[" * 2000,
    ):
        reply = await field.raw(
            "POST", "/v1/record", data=data, headers=json_headers, token=alice.token
        )
        body = expect(reply, 400, "INVALID_JSON")
        assert body["recoverable"] is True
    for data in (b"[]", b"[1, 2]", b"null", b"42", b'"text"', b"true"):
        reply = await field.raw(
            "POST", "/v1/record", data=data, headers=json_headers, token=alice.token
        )
        expect(reply, 400, "INVALID_ENVELOPE")

    payload = {"scope": {"role": "market_researcher", "max_units": 5}}
    bad: list[tuple[str, dict[str, Any]]] = [
        ("wrong protocol", {"protocol": "akasha"}),
        ("protocol null", {"protocol": None}),
        ("wrong version", {"version": "0.2.0"}),
        ("version as number", {"version": 0.1}),
        ("unknown operation", {"operation": "FROBNICATE"}),
        ("lower-case operation", {"operation": "attune"}),
        ("extra field", {"priority": "high"}),
        ("epoch as string", {"epoch": "5"}),
        ("negative epoch", {"epoch": -1}),
        ("fractional epoch", {"epoch": 1.5}),
        ("boolean epoch", {"epoch": True}),
        ("epoch above 2**53-1", {"epoch": MAX_EPOCH + 1}),
        ("payload as list", {"payload": [payload]}),
        ("payload null", {"payload": None}),
        ("empty id", {"id": ""}),
        ("id as number", {"id": 7}),
        ("bad agent_id", {"agent_id": "no spaces allowed"}),
        ("agent_id with a trailing newline", {"agent_id": "alice\n"}),
        ("agent_id of 129 characters", {"agent_id": "a" * 129}),
        ("empty session_id", {"session_id": ""}),
        ("session_id as number", {"session_id": 3}),
    ]
    bad += [(f"missing {key}", {key: _DELETE}) for key in ENVELOPE_KEYS]
    for name, changes in bad:
        reply = await field.post(
            "/v1/attune", "ATTUNE", "alice", payload, token=alice.token, changes=changes
        )
        body = expect(reply, 400, "INVALID_ENVELOPE")
        assert body["recoverable"] is True, name
    # an operation the endpoint does not take
    record = _record_payload()
    for path, operation in (
        ("/v1/attune", "RECORD"),
        ("/v1/record", "ATTUNE"),
        ("/v1/register", "DEREGISTER"),
        ("/v1/detect", "MERGE"),
    ):
        reply = await field.post(path, operation, "alice", record, token=alice.token)
        expect(reply, 400, "INVALID_ENVELOPE")
    assert await snapshot(field) == before
    # a valid envelope with a session id is fine
    reply = await field.post(
        "/v1/attune",
        "ATTUNE",
        "alice",
        payload,
        token=alice.token,
        changes={"session_id": "session-1"},
    )
    assert reply.status == 200


async def test_content_type(field: CheckedClient, alice: AgentClient) -> None:
    before = await snapshot(field)
    envelope = orjson.dumps(field.envelope("DETECT", "alice", {"mode": "list"}))
    reply = await field.raw(
        "POST", "/v1/detect", data=envelope, token=alice.token, skip_auto_headers=("Content-Type",)
    )
    body = expect(reply, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert body["recoverable"] is True
    for media in ("text/plain", "application/x-www-form-urlencoded", "application/octet-stream"):
        reply = await field.raw(
            "POST", "/v1/detect", data=envelope, token=alice.token, headers={"Content-Type": media}
        )
        expect(reply, 415, "UNSUPPORTED_MEDIA_TYPE")
    reply = await field.raw(
        "POST",
        "/v1/register",
        data=b"id=x&role=y",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    expect(reply, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await snapshot(field) == before
    for media in ("application/json; charset=utf-8", "Application/JSON"):
        reply = await field.raw(
            "POST", "/v1/detect", data=envelope, token=alice.token, headers={"Content-Type": media}
        )
        assert reply.status == 200, (media, reply.body)


async def test_body_size_limit(server_factory: Any) -> None:
    server = server_factory(limits=Limits(max_body_bytes=4096))
    async with CheckedClient(server.url) as field:
        agent = await field.register("alice", "market_researcher")
        before = await snapshot(field)
        assert (await field.status())["limits"]["max_body_bytes"] == 4096

        def sized(total: int) -> bytes:
            envelope = field.envelope("RECORD", "alice", _record_payload(content="c"), epoch=0)
            base = len(orjson.dumps(envelope))
            envelope["payload"]["content"] = "c" * (total - base + 1)
            data = orjson.dumps(envelope)
            assert len(data) == total
            return data

        headers = {"Content-Type": "application/json"}

        async def chunked(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
            for start in range(0, len(data), size):
                yield data[start : start + size]

        # Async generators are sent with Transfer-Encoding: chunked (no Content-Length).
        # (On a "Connection: close" request uvicorn closes the socket with the body
        # unread, and the client's write can fail before it reads the 413; the SDK's
        # session keeps connections alive, as clients normally do.)
        for path, data, token in [
            ("/v1/record", sized(4097), agent.token),
            ("/v1/register", b" " * 100_000, None),
            ("/v1/record", chunked(sized(4097)), agent.token),
            ("/v1/record", chunked(b" " * 50_000), agent.token),
            ("/v1/attune", chunked(b"{" * 20_000, 4096), agent.token),
        ]:
            reply = await field.raw("POST", path, data=data, headers=headers, token=token)
            body = expect(reply, 413, "PAYLOAD_TOO_LARGE")
            assert body["recoverable"] is True
        assert await snapshot(field) == before

        # at the limit, plain or chunked, the request is served
        reply = await field.raw(
            "POST", "/v1/record", data=sized(4096), headers=headers, token=agent.token
        )
        assert reply.status == 200, reply.body
        reply = await field.raw(
            "POST", "/v1/record", data=chunked(sized(4096)), headers=headers, token=agent.token
        )
        assert reply.status == 200, reply.body
        assert (await field.status())["counts"]["memory_units"] == {"active": 2}


async def test_unknown_routes_and_methods(field: CheckedClient, alice: AgentClient) -> None:
    for method, path in (  # GET / leads to the console (tests/test_index.py)
        ("GET", "/v1"),
        ("GET", "/v1/nope"),
        ("POST", "/v1/merges"),
        ("POST", "/v2/record"),
        ("GET", "/v1/field/status/extra"),
        ("DELETE", "/v1/agents/alice"),
    ):
        reply = await field.raw(method, path, token=alice.token)
        body = expect(reply, 404, "NOT_FOUND")
        assert body["operation"] is None
    for method, path in (
        ("GET", "/v1/record"),
        ("PUT", "/v1/attune"),
        ("DELETE", "/v1/detect"),
        ("POST", "/v1/field/status"),
        ("POST", "/v1/agents"),
        ("PATCH", "/v1/conflicts"),
        ("OPTIONS", "/v1/register"),
    ):
        reply = await field.raw(method, path, token=alice.token)
        expect(reply, 405, "METHOD_NOT_ALLOWED")


async def test_an_unknown_path_is_never_echoed_at_length(field: CheckedClient) -> None:
    long_path = "/v1/" + "x" * 20_000
    body = expect(await field.raw("GET", long_path), 404, "NOT_FOUND")
    assert len(body["message"]) < 300 and body["message"].endswith("…")
    body = expect(await field.raw("PUT", "/v1/record"), 405, "METHOD_NOT_ALLOWED")
    assert body["message"] == "PUT is not allowed on /v1/record"


async def test_method_not_allowed_has_allow_header(field: CheckedClient) -> None:
    for method, path, allowed in (
        ("GET", "/v1/record", "POST"),
        ("PUT", "/v1/attune", "POST"),
        ("POST", "/v1/field/status", "GET"),
        ("DELETE", "/v1/conflicts", "GET"),
    ):
        reply = await field.raw(method, path)
        expect(reply, 405, "METHOD_NOT_ALLOWED")
        methods = {m.strip() for m in reply.headers.get("Allow", "").split(",")}
        assert allowed in methods, (path, reply.headers.get("Allow"))
        assert method not in methods


async def test_unparseable_request_names_the_endpoint_operation(
    field: CheckedClient, alice: AgentClient
) -> None:
    reply = await field.raw(
        "POST",
        "/v1/record",
        data=b'{"protocol": ',
        headers={"Content-Type": "application/json"},
        token=alice.token,
    )
    body = expect(reply, 400, "INVALID_JSON")
    assert body["operation"] == "RECORD"


async def test_trailing_slash_is_not_found_json(field: CheckedClient, alice: AgentClient) -> None:
    async with aiohttp.ClientSession() as session:
        for method, path in (("POST", "/v1/record/"), ("GET", "/v1/field/status/")):
            async with session.request(
                method,
                field.base_url + path,
                data=b"{}",
                allow_redirects=False,
                headers={
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {alice.token}",
                },
            ) as response:
                raw = await response.read()
                body = check_reply(path, response.status, response.headers, raw)
                assert (response.status, body["code"]) == (404, "NOT_FOUND")


async def test_field_status_is_public(field: CheckedClient, alice: AgentClient) -> None:
    first = await field.status()
    assert first["status"] == "ok"
    assert first["protocol_version"] == "0.1.0"
    assert first["persistence"] is False
    assert first["log"]["backend"]
    assert first["counts"]["agents"] == 1
    assert first["counts"]["memory_units"] == {}
    second = await field.status()
    assert second["epoch"] == first["epoch"]
    assert second["log"]["last_position"] == first["log"]["last_position"]
    recorded = await note(alice, "Fact.")
    third = await field.status()
    assert third["epoch"] == recorded["epoch"]
    assert third["log"]["last_position"] > first["log"]["last_position"]
    assert third["counts"]["memory_units"] == {"active": 1}
    # a token is ignored, valid or not
    reply = await field.raw("GET", "/v1/field/status", token="garbage")
    assert reply.status == 200


# -- SQLite ----------------------------------------------------------------------


async def test_sqlite_basic_flow(sqlite_server: Any) -> None:
    async with CheckedClient(sqlite_server.url) as field:
        status = await field.status()
        assert status["persistence"] is True
        assert status["log"]["backend"] == "sqlite"
        alice = await field.register("alice", "market_researcher")
        bob = await field.register("bob", "strategist")
        assert alice.registration["field_capabilities"]["persistence"] is True
        await fails(field.register("alice", "x"), 409, "AGENT_ID_TAKEN")
        first = await note(alice, "EU market grows 23%.")
        second = await note(
            bob,
            "EU market grows 9%.",
            relations=[{"type": "contradicts", "target_id": first["memory_unit_id"]}],
        )
        context = await bob.attune(max_units=10)
        assert ids(context) == [first["memory_unit_id"]]
        assert context["record"][0]["memory_unit"]["status"] == "contested"
        assert [c["id"] for c in context["conflicts"]] == second["conflicts_detected"]
        polled = await bob.attune(max_units=10, since_epoch=first["epoch"])
        assert polled["record"] == []
        detected = await alice.detect()
        assert [c["id"] for c in detected["conflicts"]] == second["conflicts_detected"]
        before = await snapshot(field)
        await fails(note(alice, "bad", confidence=2.0), 422, "INVALID_CONFIDENCE")
        await fails(bob.attune(max_units=0), 422, "INVALID_PAYLOAD")
        assert await snapshot(field) == before
        await bob.deregister()
        await fails(bob.attune(max_units=1), 401, "AGENT_NOT_REGISTERED")
        final = await field.status()
        assert final["counts"]["agents"] == 1
        assert final["counts"]["memory_units"] == {"contested": 2}
        assert final["log"]["last_position"] > status["log"]["last_position"]


# -- transport ---------------------------------------------------------------------


async def test_accepted_connections_get_tcp_nodelay() -> None:
    """``field serve``'s socket must be IPPROTO_TCP: asyncio sets TCP_NODELAY only then.

    Without it every response on a kept-alive connection waits ~40 ms for a
    delayed ACK (uvicorn writes headers and body separately).
    """
    from field.cli.main import _bind

    sock = _bind("127.0.0.1", 0)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = writer.get_extra_info("socket")
        accepted.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=sock)
    try:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        nodelay = await asyncio.wait_for(accepted, 10)
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
    assert nodelay, "TCP_NODELAY is off on the accepted connection"
