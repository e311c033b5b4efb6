"""The SDK as a new user meets it: typed methods, register-or-reuse, honest signatures.

Every test runs a real server (``server_factory``/``sqlite_server`` from
conftest) and talks to it over loopback HTTP. ``Counting`` is a FieldClient
that notes the requests it sends (the server is the real one), so a test can
say that a call made no round trip it should not need.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from field.client import (
    AgentClient,
    FieldClient,
    FieldClientError,
    Relation,
    StoredTokenRefused,
    Subscription,
    TokenFile,
)

from .conftest import ThreadedServer
from .schema_util import assert_valid

OPERATOR_TOKEN = "operator-token-0123456789"


class Counting(FieldClient):
    """A FieldClient that notes each request it sends: (method, path)."""

    def __init__(self, base_url: str, **options: Any) -> None:
        super().__init__(base_url, **options)
        self.sent: list[tuple[str, str]] = []

    async def request(
        self, method: str, path: str, *, body: Any = None, token: str | None = None
    ) -> dict[str, Any]:
        self.sent.append((method, path.partition("?")[0]))
        return await super().request(method, path, body=body, token=token)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- register or reuse --------------------------------------------------------------------


async def test_connect_registers_once_then_reuses_the_kept_token(
    sqlite_server: ThreadedServer, tmp_path: Path
) -> None:
    token_file = tmp_path / "keys" / "researcher.token"
    async with Counting(sqlite_server.url) as field:  # the first run
        first = await field.connect("researcher", role="analyst", token_file=token_file)
        assert field.sent == [("POST", "/v1/register")]
        assert not first.reused and first.role == "analyst"
        unit = await first.record(
            "finding", "Churn is 2%.", purpose="track churn", confidence=0.8, reasoning="billing"
        )
    assert _mode(token_file) == 0o600
    kept = orjson.loads(token_file.read_bytes())
    assert kept["agent_id"] == "researcher" and kept["token"] == first.token
    assert kept["field_id"] == first.registration["field_capabilities"]["field_id"]
    assert [p.name for p in token_file.parent.iterdir()] == ["researcher.token"]  # no temp file

    async with Counting(sqlite_server.url) as field:  # the second run: no 409, same agent
        again = await field.connect("researcher", role="analyst", token_file=token_file)
        assert again.reused and again.token == first.token and again.role == "analyst"
        assert ("POST", "/v1/register") not in field.sent
        assert again.info["id"] == "researcher" and again.info["authority"] == 4
        assert again.epoch > unit["epoch"]  # the check moved its clock past what it wrote
        # ATTUNE defaults its scope's role to the registered one: no lookup first
        field.sent.clear()
        context = await again.attune(max_units=5, include_own=True)
        assert field.sent == [("POST", "/v1/attune")]
        assert [r["memory_unit"]["id"] for r in context["record"]] == [unit["memory_unit_id"]]
    assert orjson.loads(token_file.read_bytes()) == kept  # untouched


async def test_a_registered_agent_attunes_with_its_role_without_a_lookup(
    field_server: ThreadedServer,
) -> None:
    async with Counting(field_server.url) as field:
        agent = await field.register("writer", "strategist")
        field.sent.clear()
        response = await agent.attune()
        assert field.sent == [("POST", "/v1/attune")] and response["status"] == "ok"
        known = field.agent("writer", agent.token)  # only the token: the role is looked up once
        field.sent.clear()
        await known.attune()
        await known.attune()
        assert field.sent == [("GET", "/v1/agents"), ("POST", "/v1/attune"), ("POST", "/v1/attune")]


async def test_connect_takes_back_an_id_its_agent_deregistered(
    sqlite_server: ThreadedServer, tmp_path: Path
) -> None:
    token_file = tmp_path / "bot.token"
    async with FieldClient(sqlite_server.url) as field:
        first = await field.connect("bot", role="helper", token_file=token_file)
        await first.deregister()
        with pytest.raises(FieldClientError) as taken:  # retired: nobody else gets it
            await field.register("bot", "helper")
        assert taken.value.code == "AGENT_ID_TAKEN"

        back = await field.connect("bot", role="helper", token_file=token_file)
        assert back.token != first.token and not back.reused
        assert orjson.loads(token_file.read_bytes())["token"] == back.token
        assert _mode(token_file) == 0o600
        assert (await back.attune())["status"] == "ok"


async def test_a_senior_agent_comes_back_at_its_authority(
    server_factory: Callable[..., ThreadedServer], tmp_path: Path
) -> None:
    server = server_factory(operator_token=OPERATOR_TOKEN)
    token_file = tmp_path / "lead.token"
    async with FieldClient(server.url) as field:
        options: dict[str, Any] = {"authority": 6, "operator_token": OPERATOR_TOKEN}
        lead = await field.connect("lead", role="lead", token_file=token_file, **options)
        await lead.deregister()
        back = await field.connect("lead", role="lead", token_file=token_file, **options)
        assert back.info["authority"] == 6 and back.token != lead.token


async def test_a_refused_kept_token_is_named_and_left_in_place(
    server_factory: Callable[..., ThreadedServer], tmp_path: Path
) -> None:
    here = server_factory()
    elsewhere = server_factory()
    async with FieldClient(here.url) as field, FieldClient(elsewhere.url) as other:
        # a token the Field never issued, kept by an older run against another Field
        issued = tmp_path / "issued-elsewhere.token"
        await other.connect("scout", role="scout", token_file=issued)
        before = issued.read_bytes()
        with pytest.raises(StoredTokenRefused) as refused:
            await field.connect("scout", role="scout", token_file=issued)
        error = refused.value
        assert error.status == 401 and error.code == "UNAUTHENTICATED"
        assert_valid("error", error.body)
        message = str(error)
        assert str(issued) in message and "scout" in message
        assert orjson.loads(before)["field_id"] in message  # "issued by Field ..."
        assert issued.read_bytes() == before

        # another agent's token: FORBIDDEN, said so
        alice = await field.register("alice", "analyst")
        theirs = tmp_path / "theirs.token"
        theirs.write_bytes(orjson.dumps({"agent_id": "bob", "token": alice.token}))
        await field.register("bob", "analyst")
        with pytest.raises(StoredTokenRefused) as forbidden:
            await field.connect("bob", role="analyst", token_file=theirs)
        assert forbidden.value.code == "FORBIDDEN" and "another agent" in str(forbidden.value)

        # a file kept for another id is not used at all
        with pytest.raises(ValueError, match="agent .bob., not .carol."):
            await field.connect("carol", role="analyst", token_file=theirs)


async def test_a_first_run_on_a_taken_id_raises_agent_id_taken(
    field_server: ThreadedServer, tmp_path: Path
) -> None:
    async with FieldClient(field_server.url) as field:
        await field.register("worker", "builder")  # whose token nobody kept
        with pytest.raises(FieldClientError) as taken:
            await field.connect("worker", role="builder", token_file=tmp_path / "w.token")
        assert taken.value.status == 409 and taken.value.code == "AGENT_ID_TAKEN"
    assert not (tmp_path / "w.token").exists()


async def test_a_different_role_on_reuse_keeps_the_registered_one(
    field_server: ThreadedServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "a.token"
    async with FieldClient(field_server.url) as field:
        await field.connect("a", role="analyst", token_file=token_file)
        with caplog.at_level(logging.WARNING, logger="field.client"):
            again = await field.connect("a", role="strategist", token_file=token_file)
    assert again.role == "analyst"
    assert any("registered with role 'analyst'" in r.getMessage() for r in caplog.records)


def test_a_token_file_is_private_and_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.token"
    path.write_text("{}")
    os.chmod(path, 0o644)  # an older, careless file
    from field.client import StoredToken

    store = TokenFile(path)
    with pytest.raises(ValueError, match="not a token file"):
        store.load()
    store.save(StoredToken("a", "secret-1", "field-x", "http://h"))
    assert _mode(path) == 0o600
    loaded = store.load()
    assert loaded == StoredToken("a", "secret-1", "field-x", "http://h")
    assert "secret-1" not in repr(loaded)
    path.write_bytes(b"x" * (70 * 1024))
    with pytest.raises(ValueError, match="over"):
        store.load()
    assert TokenFile(tmp_path / "absent").load() is None


# -- honest signatures ------------------------------------------------------------------


async def test_a_committed_record_needs_confidence_and_reasoning(
    field_server: ThreadedServer,
) -> None:
    async with Counting(field_server.url) as field:
        agent = await field.register("alice", "analyst")
        field.sent.clear()
        with pytest.raises(TypeError, match="reasoning"):
            await agent.record("finding", "x", purpose="p", confidence=0.7)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="confidence"):
            await agent.record("finding", "x", purpose="p", reasoning="r")  # type: ignore[call-overload]
        assert field.sent == []  # refused before anything was sent
        draft = await agent.record("assumption", "prices may rise", purpose="plan", mode="draft")
        assert draft["status"] == "accepted"
        rated = await agent.record(
            "finding",
            "prices rose 3%",
            purpose="plan",
            confidence=0.7,
            reasoning="two invoices",
            evidence=["invoice 1", "invoice 2"],
            assumptions=["no discount"],
            question="did prices rise?",
            task_id="task-pricing",
            relations=[Relation("answers", draft["memory_unit_id"], "it did")],
        )
        replayed = await agent.replay("memory_unit", rated["memory_unit_id"], depth="full_trace")
        assert_valid("replay.response", replayed)
        context = await agent.attune(max_units=5, include_own=True, since_epoch=draft["epoch"])
        (unit,) = [r["memory_unit"] for r in context["record"]]
        assert unit["confidence"] == {
            "score": 0.7,
            "reasoning": "two invoices",
            "evidence": ["invoice 1", "invoice 2"],
            "assumptions": ["no discount"],
        }
        assert unit["intent"] == {
            "purpose": "plan",
            "task_id": "task-pricing",
            "question": "did prices rise?",
        }
        assert unit["relations"] == [
            {"type": "answers", "target_id": draft["memory_unit_id"], "description": "it did"}
        ]


async def test_typed_operations_end_to_end(server_factory: Callable[..., ThreadedServer]) -> None:
    server = server_factory(operator_token=OPERATOR_TOKEN)
    async with FieldClient(server.url) as field:
        lead = await field.register("lead", "lead", authority=6, operator_token=OPERATOR_TOKEN)
        alice = await field.register("alice", "analyst", interests=["churn"])
        bob = await field.register("bob", "analyst")

        # a conflict, resolved by synthesis
        a = await alice.record(
            "finding", "Churn is 2% a month.", purpose="churn", confidence=0.9, reasoning="billing"
        )
        b = await bob.record(
            "finding",
            "Churn is 5% a month.",
            purpose="churn",
            confidence=0.6,
            reasoning="survey",
            relations=[Relation("contradicts", a["memory_unit_id"])],
        )
        (conflict_id,) = b["conflicts_detected"]
        listed = await alice.detect("list", status=["detected"], involving_agents=["bob"])
        assert [c["id"] for c in listed["conflicts"]] == [conflict_id]
        merged = await lead.merge(
            conflict_id, "synthesis", rationale="both measure", synthesis="Churn is 2-5%."
        )
        assert_valid("merge.response", merged)
        assert merged["status"] == "resolved" and merged["side_effects"]["new_unit_id"]

        # polling keeps its place (superseded units are out of ATTUNE: the synthesis is left)
        first = await bob.poll(include_own=True)
        synthesis = merged["side_effects"]["new_unit_id"]
        assert [r["memory_unit"]["id"] for r in first["record"]] == [synthesis]
        assert (await bob.poll())["record"] == []
        c = await alice.record(
            "decision", "Report 2-5%.", purpose="report", confidence=0.8, reasoning="synthesis"
        )
        assert [r["memory_unit"]["id"] for r in (await bob.poll())["record"]] == [
            c["memory_unit_id"]
        ]

        # tasks with dependencies, in a session
        session = await alice.session("create", name="Churn", invitees=["bob"], purpose="study")
        session_id = session["session"]["id"]
        await bob.session("join", session_id)
        alice.session_id = session_id
        first_task = await alice.coordinate("create", title="Measure", priority="high")
        second = await alice.coordinate(
            "create",
            title="Report",
            depends_on=[first_task["task"]["id"]],
            description="after measuring",
        )
        assert_valid("coordinate.response", second)
        assert second["task"]["session_id"] == session_id
        assert second["task"]["depends_on"] == [first_task["task"]["id"]]
        task_id = first_task["task"]["id"]
        await alice.coordinate("assign", task_id, assignee="alice")
        await alice.coordinate("start", task_id)
        done = await alice.coordinate("complete", task_id, result="2-5%")
        assert done["task"]["status"] == "completed" and done["task"]["result"] == "2-5%"
        tasks = await alice.every(alice.coordinate, "tasks", action="list", limit=1)
        assert len(tasks) == 2

        compacted = await lead.compact("archive", status=["superseded"])
        assert_valid("compact.response", compacted)
        assert compacted["units_affected"] == 2  # the two originals the synthesis replaced


async def test_subscribe_returns_a_subscription(field_server: ThreadedServer) -> None:
    async with FieldClient(field_server.url) as field:
        alice = await field.register("alice", "analyst")
        made = await alice.subscribe(
            ["memory.recorded", "conflict.detected"],
            min_relevance=0.2,
            debounce_ms=0,
            filter='event.agent_id != "spam"',
            timeout="72h",
        )
        assert isinstance(made, Subscription)
        assert_valid("subscribe.response", made.response)
        assert made.events == ("memory.recorded", "conflict.detected")
        assert made.cursor == made.response["cursor"] and made.stored["min_relevance"] == 0.2
        assert alice.fresh_subscriptions == {made.id: made.cursor}
        listed = await alice.subscriptions()
        assert [s["id"] for s in listed["subscriptions"]] == [made.id]
        cancelled = await alice.unsubscribe(made)
        assert cancelled["subscription"]["status"] == "cancelled"
        assert alice.fresh_subscriptions == {}


async def test_the_envelope_is_never_the_callers_business(field_server: ThreadedServer) -> None:
    async with FieldClient(field_server.url) as field:
        alice: AgentClient = await field.register("alice", "analyst")
        bob = await field.register("bob", "analyst")
        start = alice.epoch
        written = await bob.record("finding", "x", purpose="p", confidence=0.5, reasoning="r")
        assert alice.epoch == start  # alice has not heard of it yet
        polled = await alice.attune()  # its epoch: the newest unit it holds
        assert alice.epoch == polled["epoch"] == written["epoch"]
        detected = await alice.detect()
        assert alice.epoch == detected["epoch"] > written["epoch"]  # Lamport: max, then +1
