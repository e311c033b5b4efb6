"""Bounded reads: every read that can grow returns a page that fits max_response_bytes.

ATTUNE cuts its page at the byte bound and says so (``limited_by``), and a
poll continues across cut pages with nothing lost or repeated.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from field.contract.errors import FieldError
from field.contract.model import Limits
from field.core import visibility
from field.core.context import Outcome
from field.core.field import Field
from field.engine.service import FieldService
from field.store import MemoryEventLog

from .conftest import UNLOADED_POLICY
from .core_util import Harness
from .test_http import CheckedClient, expect, note

#: A response bound small enough that a few dozen units overflow it.
SMALL = 40_000
OPERATOR = "operator-secret-0123456789"


def size(body: Any) -> int:
    return len(orjson.dumps(body))


def text(rng: random.Random, chars: int) -> str:
    words = ["pricing", "churn", "market", "growth", "roadmap", "risk", "budget", "segment"]
    out = " ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(chars // 8))
    return out[:chars]


def harness(limit: int = SMALL, **limits: Any) -> Harness:
    h = Harness(limits=Limits(max_response_bytes=limit, **limits))
    h.register("writer", "analyst")
    h.register("reader", "strategist", interests=["pricing", "churn"])
    return h


def record_many(h: Harness, count: int, *, chars: int = 2000, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [
        h.record("writer", text(rng, rng.randrange(chars // 2, chars)), score=rng.random())[
            "memory_unit_id"
        ]
        for _ in range(count)
    ]


def page_ids(response: dict[str, Any]) -> list[str]:
    return [item.get("memory_unit_id") or item["memory_unit"]["id"] for item in response["record"]]


@pytest.mark.parametrize("fmt", ["full", "summary", "ids_only"])
def test_a_ranking_is_cut_to_the_response_bound_and_says_so(fmt: str) -> None:
    # two Fields given the same requests hold the same units with the same ids
    roomy, h = harness(limit=Limits().max_response_bytes), harness()
    made = record_many(roomy, 250, chars=400)  # 250 of the shortest items pass SMALL
    assert record_many(h, 250, chars=400) == made
    ranking = roomy.attune("reader", max_units=1000, format=fmt)
    assert ranking["context_budget"]["limited_by"] is None
    assert sorted(page_ids(ranking)) == sorted(made)

    cut = h.attune("reader", max_units=1000, format=fmt)
    budget = cut["context_budget"]
    assert size(cut) <= SMALL
    assert budget["units_available"] == 250
    assert budget["units_returned"] == len(cut["record"]) < 250
    assert budget["limited_by"] == "max_response_bytes"
    # the best units, as ranked without the bound: the page is the ranking's head
    assert cut["record"] == ranking["record"][: len(cut["record"])]
    # and it is full: the next unit of the ranking would not have fitted (the bound keeps room
    # for the largest values the other fields may take: about 500 bytes here)
    assert size(cut) + size(ranking["record"][len(cut["record"])]) > SMALL - 1024


def test_max_units_and_max_tokens_are_named_when_they_end_the_page() -> None:
    h = harness()
    record_many(h, 30, chars=400)
    few = h.attune("reader", max_units=5)
    assert few["context_budget"]["limited_by"] == "max_units"
    tight = h.attune("reader", max_units=30, max_tokens=200)
    assert tight["context_budget"]["limited_by"] == "max_tokens"
    assert tight["context_budget"]["tokens_used"] <= 200
    everything = h.attune("reader", max_units=30, format="ids_only")
    assert everything["context_budget"]["limited_by"] is None
    assert everything["context_budget"]["units_returned"] == 30


def test_a_unit_larger_than_the_bound_is_still_returned_alone() -> None:
    h = harness(limit=5_000)
    big = h.record("writer", text(random.Random(2), 20_000))["memory_unit_id"]
    small = h.record("writer", "pricing note")["memory_unit_id"]
    poll = h.attune("reader", max_units=10, since_epoch=0)
    assert page_ids(poll) == [big]
    assert poll["context_budget"]["limited_by"] == "max_response_bytes"
    nxt = h.attune("reader", max_units=10, since_epoch=poll["epoch"])
    assert page_ids(nxt) == [small]
    assert nxt["context_budget"]["limited_by"] is None
    ranking = h.attune("reader", max_units=10)
    assert len(ranking["record"]) >= 1


@pytest.mark.parametrize(("fmt", "tokens"), [("full", None), ("summary", None), ("full", 3000)])
def test_polling_continues_exactly_across_cut_pages(fmt: str, tokens: int | None) -> None:
    h = harness()
    rng = random.Random(7)
    expected = record_many(h, 150, seed=3)
    seen: list[str] = []
    since = 0
    cut_pages = 0
    for _ in range(200):
        scope: dict[str, Any] = {"since_epoch": since, "format": fmt}
        if tokens is not None:
            scope["max_tokens"] = tokens
        page = h.attune("reader", max_units=1000, **scope)
        assert size(page) <= SMALL
        budget = page["context_budget"]
        assert budget["units_returned"] >= 1 or budget["units_available"] == 0
        if budget["limited_by"] is not None:
            cut_pages += 1
            assert budget["units_returned"] < budget["units_available"]
        seen += page_ids(page)
        since = page["epoch"]
        if rng.random() < 0.3:  # others keep writing between polls
            expected += record_many(h, rng.randrange(1, 5), seed=rng.randrange(1000))
        elif budget["units_available"] == budget["units_returned"]:
            break
    assert cut_pages >= 2
    assert len(seen) == len(set(seen))  # nothing repeated
    assert sorted(seen) == sorted(expected)  # nothing lost


def test_conflicts_of_an_attune_fit_a_share_of_the_bound() -> None:
    h = harness(limit=20_000)
    rng = random.Random(5)
    for _ in range(40):
        a = h.record("writer", text(rng, 1000))["memory_unit_id"]
        h.record(
            "writer",
            text(rng, 1000),
            relations=[{"type": "contradicts", "target_id": a, "description": text(rng, 900)}],
        )
    response = h.attune("reader", max_units=1, format="ids_only")
    assert 0 < len(response["conflicts"]) < 40
    assert size(response["conflicts"]) <= 20_000 // 4


# -- list reads over HTTP: GET /v1/agents and GET /v1/conflicts ----------------------


@pytest.fixture
async def small_field(server_factory: Any) -> AsyncIterator[CheckedClient]:
    """A real server whose reads are bounded at SMALL bytes."""
    # 230 agents register at once from this one address: past REGISTER's default burst
    server = server_factory(limits=Limits(max_response_bytes=SMALL), register_burst=1000)
    async with CheckedClient(server.url) as client:
        yield client


async def test_agents_are_paged_by_id_with_nothing_lost_or_repeated(
    small_field: CheckedClient,
) -> None:
    names = [f"agent-{i:03d}" for i in random.Random(4).sample(range(1000), 230)]
    agents = [await small_field.register(name, "analyst") for name in names]
    reader = agents[0]

    first = await reader.agents()
    assert len(first["agents"]) == 100  # the default limit
    assert first["next"] == first["agents"][-1]["id"]
    listed = await reader.every(reader.agents, "agents", limit=7)
    assert [a["id"] for a in listed] == sorted(names)

    # a page may start after an agent that has since deregistered
    page = await reader.agents(limit=3)
    gone = next(a for a in agents if a.id == page["next"])
    await gone.deregister()
    after = await reader.agents(after=page["next"], limit=3)
    assert [a["id"] for a in after["agents"]] == sorted(names)[3:6]

    chosen = await reader.agents(ids=[names[5], names[9], "nobody"])
    assert sorted(a["id"] for a in chosen["agents"]) == sorted([names[5], names[9]])
    assert chosen["next"] is None


async def wire(
    field: CheckedClient, method: str, path: str, token: str, body: Any = None
) -> tuple[int, bytes]:
    """The status and the body bytes exactly as the server sent them."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    data = None if body is None else orjson.dumps(body)
    async with field.session.request(
        method, field.base_url + path, data=data, headers=headers
    ) as reply:
        return reply.status, await reply.read()


async def test_an_agents_page_fits_the_response_bound(small_field: CheckedClient) -> None:
    interests = [f"interest number {i} " + "x" * 200 for i in range(40)]
    for i in range(12):  # about 9 KB each
        await small_field.register(f"wide-{i:02d}", "analyst", interests=interests)
    reader = await small_field.register("reader", "analyst")
    seen: list[str] = []
    after = ""
    for _ in range(20):
        status, raw = await wire(small_field, "GET", f"/v1/agents?limit=1000{after}", reader.token)
        assert status == 200
        assert len(raw) <= SMALL
        page = orjson.loads(raw)
        assert 1 <= len(page["agents"]) < 13
        seen += [a["id"] for a in page["agents"]]
        if page["next"] is None:
            break
        after = f"&after={page['next']}"
    assert seen == sorted([*(f"wide-{i:02d}" for i in range(12)), "reader"])


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("limit=-1", "limit"),
        ("after=" + "a" * 300, "after"),
    ],
)
async def test_bad_page_parameters_are_refused(
    small_field: CheckedClient, query: str, message: str
) -> None:
    reader = await small_field.register("reader", "analyst")
    for path in ("/v1/agents", "/v1/conflicts"):
        reply = await small_field.raw("GET", f"{path}?{query}", token=reader.token)
        body = expect(reply, 422, "INVALID_PAYLOAD")
        assert message in body["message"]
        assert len(body["message"]) < 200  # never the client's whole value


async def test_conflicts_are_paged_in_detection_order(small_field: CheckedClient) -> None:
    writer = await small_field.register("writer", "analyst")
    other = await small_field.register("other", "analyst")
    made = []
    for i in range(25):
        author = writer if i % 5 else other
        base = await note(author, f"Churn was {i}% in March.")
        contra = await note(
            author,
            f"Churn was {i + 50}% in March.",
            relations=[{"type": "contradicts", "target_id": base["memory_unit_id"]}],
        )
        made += contra["conflicts_detected"]
    listed = await writer.every(writer.conflicts, "conflicts", limit=4)
    assert [c["id"] for c in listed] == made
    by_other = await writer.every(writer.conflicts, "conflicts", involving_agents=["other"])
    assert [c["id"] for c in by_other] == made[::5]
    # DETECT list pages the same list
    detected = await writer.every(writer.detect, "conflicts", mode="list", limit=6)
    assert [c["id"] for c in detected] == made
    unknown = await small_field.raw("GET", "/v1/conflicts?after=conflict-nope", token=writer.token)
    expect(unknown, 422, "INVALID_PAYLOAD")


async def test_attune_over_http_stays_within_the_bound(small_field: CheckedClient) -> None:
    writer = await small_field.register("writer", "analyst")
    reader = await small_field.register("reader", "strategist", interests=["pricing"])
    rng = random.Random(9)
    for _ in range(60):
        await note(writer, text(rng, 2000))
    for fmt in ("full", "summary", "ids_only"):
        payload = {"scope": {"role": "strategist", "max_units": 1000}, "format": fmt}
        envelope = small_field.envelope("ATTUNE", "reader", payload)
        status, raw = await wire(small_field, "POST", "/v1/attune", reader.token, envelope)
        assert status == 200
        assert len(raw) <= SMALL
        budget = orjson.loads(raw)["context_budget"]
        assert budget["units_available"] == 60
        if fmt == "full":
            assert budget["limited_by"] == "max_response_bytes"


# -- list operations: DETECT list, SESSION list, COORDINATE list ----------------------


def read_all(
    h: Harness, agent: str, operation: str, payload: dict[str, Any], key: str
) -> tuple[list[str], list[dict[str, Any]]]:
    """Every item of a paged list operation, following next; (ids, pages)."""
    ids: list[str] = []
    responses = []
    after = None
    for _ in range(1000):
        response = h.send(operation, agent, {**payload, "after": after})
        responses.append(response)
        ids += [item["id"] for item in response[key]]
        after = response["next"]
        if after is None:
            return ids, responses
    raise AssertionError("the list never ended")


def contradict(h: Harness, agent: str, content: str) -> str:
    base = h.record(agent, content)["memory_unit_id"]
    relation = {"type": "contradicts", "target_id": base, "description": content}
    return str(h.record(agent, content + " not", relations=[relation])["conflicts_detected"][0])


def test_detect_list_pages_look_at_a_bounded_number_of_conflicts() -> None:
    h = harness(max_page_items=5)  # so a page looks at no more than 50 conflicts
    h.register("other", "analyst")
    mine = [contradict(h, "writer", f"churn {i}") for i in range(60)]
    theirs = [contradict(h, "other", f"price {i}") for i in range(3)]

    ids, responses = read_all(h, "reader", "DETECT", {"mode": "list"}, "conflicts")
    assert ids == mine + theirs
    assert all(len(r["conflicts"]) <= 5 for r in responses)

    wanted = {"mode": "list", "filter": {"involving_agents": ["other"]}}
    ids, responses = read_all(h, "reader", "DETECT", wanted, "conflicts")
    assert ids == theirs
    # the first page looked at 50 of the writer's conflicts and found none of other's
    assert responses[0]["conflicts"] == [] and responses[0]["next"] == mine[49]


def test_detect_list_refuses_a_bad_page() -> None:
    h = harness()
    contradict(h, "writer", "churn 1")
    for payload, fragment in (
        ({"mode": "list", "after": "conflict-nope"}, "after"),
        ({"mode": "list", "limit": 0}, "limit"),
        ({"mode": "scan", "limit": "many"}, "limit"),
    ):
        with pytest.raises(FieldError) as info:
            h.send("DETECT", "reader", payload)
        assert info.value.code == "INVALID_PAYLOAD"
        assert fragment in info.value.message


def test_sessions_and_tasks_lists_are_paged_oldest_first() -> None:
    h = harness(max_page_items=4)
    sessions = [
        h.send("SESSION", "writer", {"action": "create", "name": f"s{i}"})["session"]["id"]
        for i in range(11)
    ]
    ids, responses = read_all(h, "writer", "SESSION", {"action": "list"}, "sessions")
    assert ids == sessions
    assert [len(r["sessions"]) for r in responses] == [4, 4, 3]
    tasks = [
        h.send("COORDINATE", "writer", {"action": "create", "title": f"t{i}"})["task"]["id"]
        for i in range(9)
    ]
    h.send("COORDINATE", "reader", {"action": "create", "title": "not the writer's"})
    ids, responses = read_all(h, "writer", "COORDINATE", {"action": "list", "limit": 2}, "tasks")
    assert ids == tasks
    assert responses[-1]["next"] is None


def test_list_pages_fit_the_response_bound_and_continue_exactly() -> None:
    h = harness(limit=12_000)
    rng = random.Random(11)
    tasks = [
        h.send(
            "COORDINATE",
            "writer",
            {"action": "create", "title": f"t{i}", "description": text(rng, 3000)},
        )["task"]["id"]
        for i in range(20)
    ]
    ids, responses = read_all(h, "writer", "COORDINATE", {"action": "list"}, "tasks")
    assert ids == tasks
    assert len(responses) > 3
    assert all(size(r) <= 12_000 for r in responses)


# -- REPLAY --------------------------------------------------------------------------


def test_a_replay_summary_names_twenty_agents_and_lists_a_timeline_s_worth() -> None:
    h = harness(max_replay_events=22)
    names = [f"agent-{i:02d}" for i in range(25)]
    for name in names:
        h.register(name, "analyst")
        h.record(name, f"{name} on pricing", task_id="task-big")
    replay = {"target_type": "task", "target_id": "task-big", "depth": "summary"}
    response = h.send("REPLAY", "reader", replay)
    assert response["agents_involved"] == names[:22]
    assert response["total_events"] == 25
    assert "agent-19" in response["summary"] and "agent-20" not in response["summary"]
    assert "and 5 more" in response["summary"]


def test_a_replay_past_the_response_bound_is_refused_and_a_summary_is_not() -> None:
    h = harness(limit=20_000)
    rng = random.Random(3)
    for _ in range(80):
        h.record("writer", text(rng, 1000), task_id="task-long")
    detailed = {"target_type": "task", "target_id": "task-long", "depth": "detailed"}
    with pytest.raises(FieldError) as info:
        h.send("REPLAY", "reader", detailed)
    assert info.value.code == "REPLAY_TOO_LARGE"
    assert info.value.recoverable
    assert info.value.details == {"max_response_bytes": 20_000}
    summary = h.send("REPLAY", "reader", {**detailed, "depth": "summary"})
    assert summary["total_events"] == 80
    assert size(summary) <= 20_000
    # within the bound, the whole timeline
    roomy = harness()
    for _ in range(80):
        roomy.record("writer", text(rng, 1000), task_id="task-long")
    assert len(roomy.send("REPLAY", "reader", detailed)["timeline"]) == 80


# -- a page built in steps -----------------------------------------------------------


def twins(count: int = 200) -> tuple[Harness, Harness]:
    """Two Fields given the same requests: the first builds its pages in steps."""
    roomy = Limits().max_response_bytes
    stepped, whole = harness(limit=roomy), harness(limit=roomy)
    stepped.field.sliced_reads = True
    for h in (stepped, whole):
        record_many(h, count, chars=600)
    return stepped, whole


def attune_outcome(h: Harness, **payload: Any) -> Outcome:
    """An ATTUNE's outcome, with its steps (if any) not run yet."""
    scope = {"role": "strategist", "max_units": 1000, **payload.pop("scope", {})}
    body = attune_body("reader", {"scope": scope, **payload})
    return h.field.handle(body, token=h.tokens["reader"], operation="ATTUNE")


@pytest.mark.parametrize(
    "payload",
    [
        {"format": "full"},
        {"format": "summary"},
        {"format": "ids_only", "context_hint": "pricing"},
        {"scope": {"since_epoch": 0}},
        {"scope": {"max_tokens": 40_000}, "format": "full"},
    ],
)
def test_a_page_built_in_steps_is_the_page_built_at_once(payload: dict[str, Any]) -> None:
    stepped, whole = twins()
    outcome = attune_outcome(stepped, **copy.deepcopy(payload))
    assert outcome.rest is not None and outcome.response["record"] == []
    pauses = sum(1 for _ in outcome.rest)
    assert pauses >= 1
    at_once = attune_outcome(whole, **copy.deepcopy(payload))
    assert at_once.rest is None
    assert outcome.response == at_once.response


def test_what_changes_between_steps_does_not_change_the_page() -> None:
    stepped, whole = twins()
    outcome = attune_outcome(stepped, format="full")
    expected = attune_outcome(whole, format="full").response
    assert outcome.rest is not None
    next(outcome.rest)  # the first step
    # the Field goes on: new units, a unit of the page contested, another superseded
    shown = [item["memory_unit"]["id"] for item in expected["record"]]
    record_many(stepped, 5, seed=99)
    relation = {"type": "contradicts", "target_id": shown[-1], "description": "no"}
    stepped.record("writer", "pricing is not that", relations=[relation])
    stepped.record(
        "writer", "pricing, revised", relations=[{"type": "supersedes", "target_id": shown[-2]}]
    )
    assert stepped.field.state.units[shown[-1]]["status"] == "contested"
    for _ in outcome.rest:
        pass
    assert outcome.response == expected


async def test_the_service_runs_other_work_between_the_steps_of_a_large_read() -> None:
    service = FieldService(MemoryEventLog(), Field, admission=UNLOADED_POLICY)
    await service.start()
    tokens: dict[str, str] = {}

    async def send(agent: str, operation: str, payload: dict[str, Any]) -> Any:
        body = {**attune_body(agent, {}), "operation": operation, "payload": payload}
        token = tokens.get(agent)
        return asyncio.ensure_future(
            service.execute(lambda field: field.handle(body, token=token, operation=operation))
        )

    try:
        for agent in ("writer", "reader"):
            registered = await (await send(agent, "REGISTER", {"id": agent, "role": "analyst"}))
            tokens[agent] = registered.response["token"]
        for i in range(600):
            await (await send("writer", "RECORD", unit_payload(f"pricing note {i}")))
        maximal = {"scope": {"role": "analyst", "max_units": 1000}, "format": "ids_only"}
        big = await send("reader", "ATTUNE", maximal)
        record = await send("writer", "RECORD", unit_payload("written meanwhile"))
        done, _ = await asyncio.wait({big, record}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {record}  # its response was out while the page was still being built
        later = await (await send("writer", "RECORD", unit_payload("written later")))
        assert not big.done()  # the writer ran a whole operation between two steps
        page = (await big).response
        assert page["context_budget"]["units_returned"] == 600
        assert page["epoch"] < record.result().response["epoch"] < later.response["epoch"]
    finally:
        await service.stop()


def attune_body(agent: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocol": "akashik",
        "version": "0.1.0",
        "id": "m",
        "operation": "ATTUNE",
        "agent_id": agent,
        "session_id": None,
        "epoch": 0,
        "payload": payload,
    }


def unit_payload(content: str) -> dict[str, Any]:
    return {
        "type": "finding",
        "content": content,
        "intent": {"purpose": "p"},
        "confidence": {"score": 0.5, "reasoning": "r"},
    }


# -- the conflicts of an ATTUNE ----------------------------------------------------


def reference_conflicts(h: Harness, agent_id: str) -> list[str]:
    """ATTUNE's conflicts as a plain sort of every conflict: unresolved ones the agent may
    see, those involving its units first, then newest first (ties in detection order)."""
    state = h.field.state
    agent = state.agents[agent_id]
    unresolved = [
        c
        for c in state.conflicts.values()
        if c["status"] in ("detected", "resolving", "escalated")
        and visibility.conflict_visible(state, agent, c)
    ]

    def involves(c: dict[str, Any]) -> bool:
        return agent_id in {
            state.known_units[c[k]]["source"]["agent_id"] for k in ("unit_a", "unit_b")
        }

    unresolved.sort(key=lambda c: (not involves(c), -c["epoch"]))
    return [c["id"] for c in unresolved[: h.field.limits.max_attune_conflicts]]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abr"), st.integers(1, 3), st.booleans()), max_size=40))
def test_attune_conflicts_are_the_agents_own_then_the_newest(
    steps: list[tuple[str, int, bool]],
) -> None:
    h = Harness(limits=Limits(max_attune_conflicts=7), operator_token=OPERATOR)
    for name in "abr":
        h.register(name, "analyst")
    h.register("lead", "lead", via=OPERATOR, authority=6)
    for author, fanout, resolve in steps:
        targets = [h.record(author, "pricing up")["memory_unit_id"] for _ in range(fanout)]
        relations = [{"type": "contradicts", "target_id": t} for t in targets]
        made = h.record(author, "pricing down", relations=relations)["conflicts_detected"]
        if resolve:  # one of them resolved at once
            payload = {
                "conflict_id": made[0],
                "strategy": "last_write_wins",
                "resolution": {"rationale": "newer"},
            }
            h.send("MERGE", "lead", payload)
    for reader in ("r", "a"):
        response = h.attune(reader, max_units=1, format="ids_only")
        assert [c["id"] for c in response["conflicts"]] == reference_conflicts(h, reader)
    # and the indexes survive a restart: the Field rebuilt from the log answers the same
    rebuilt = h.replayed()
    assert rebuilt.state.unresolved == h.field.state.unresolved
    assert rebuilt.state.unresolved_by_agent == h.field.state.unresolved_by_agent
