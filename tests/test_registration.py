"""Who may REGISTER, how many, how fast, and what a deregistered agent leaves behind.

The policy and registration tokens are tried in the pure core first (every refusal
must log nothing), then end to end over HTTP and the WebSocket on real servers:
tokens issued, listed and revoked by the operator, used exactly as many times as
issued (under concurrency and across a restart), the agent cap, and REGISTER's
per-client rate limit on an injected clock. Last, memory: agents registered and
deregistered in bulk must leave only their retired id behind.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import tracemalloc
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from field.cli.main import main
from field.contract.clock import iso_timestamp
from field.contract.errors import Code, FieldError
from field.core.field import Field, Ids
from field.engine.liveness import Liveness
from field.server.config import Config

from .conftest import ThreadedServer
from .core_util import Harness
from .schema_util import assert_valid

OPERATOR_TOKEN = "operator-token-for-registration-0123"


# -- the core ----------------------------------------------------------------------


def harness(**kwargs: Any) -> Harness:
    return Harness(operator_token=OPERATOR_TOKEN, **kwargs)


def issue(h: Harness, **body: Any) -> dict[str, Any]:
    outcome = h.field.issue_registration_token(OPERATOR_TOKEN, body)
    h.entries.extend(outcome.entries)
    assert_valid("registration-token.response", outcome.response)
    return outcome.response["registration_token"]


def refused(h: Harness, code: str, agent_id: str, **payload: Any) -> FieldError:
    """REGISTER of ``agent_id`` fails with ``code`` and logs nothing."""
    before = len(h.entries), h.field.epoch, sorted(h.field.state.agents)
    with pytest.raises(FieldError) as caught:
        h.register(agent_id, **payload)
    error = caught.value
    assert error.code == code, error.message
    assert_valid("error", error.to_response())
    assert (len(h.entries), h.field.epoch, sorted(h.field.state.agents)) == before
    return error


def test_open_registration_is_the_default_and_ignores_a_registration_token() -> None:
    h = harness()
    assert h.field.registration == "open"
    h.register("alice", registration_token="anything at all")
    assert "alice" in h.field.state.agents


def test_closed_registration_lets_only_the_operator_register() -> None:
    h = harness(registration_policy="closed")
    error = refused(h, Code.REGISTRATION_CLOSED, "alice")
    assert error.http_status == 403 and not error.recoverable and error.suggested_action
    h.register("alice", via=OPERATOR_TOKEN)
    assert h.field.authenticate(h.tokens["alice"]).id == "alice"


def test_a_token_of_n_uses_registers_n_agents_and_the_log_keeps_no_secret() -> None:
    h = harness(registration_policy="token")
    refused(h, Code.REGISTRATION_TOKEN_INVALID, "nobody")  # no token at all
    refused(h, Code.REGISTRATION_TOKEN_INVALID, "guess", registration_token="fieldreg_guess")
    token = issue(h, uses=2, note="for the two analysts")
    assert (token["uses"], token["uses_left"], token["authority"]) == (2, 2, 4)
    for name in ("a1", "a2"):
        h.register(name, registration_token=token["token"])
    error = refused(h, Code.REGISTRATION_TOKEN_INVALID, "a3", registration_token=token["token"])
    assert error.http_status == 403 and not error.recoverable
    # each use is in the agent.registered entry; the secret is nowhere in the log
    uses = [e.data.get("registration_token") for e in h.entries if e.kind == "agent.registered"]
    assert uses == [token["id"], token["id"]]
    assert token["token"].encode() not in orjson.dumps([e.data for e in h.entries])
    assert h.field.registration_tokens(OPERATOR_TOKEN)["registration_tokens"] == []
    # the operator still registers without one
    h.register("lead", via=OPERATOR_TOKEN)


def test_uses_left_are_rebuilt_from_the_log() -> None:
    h = harness(registration_policy="token")
    token = issue(h, uses=3)
    h.register("a1", registration_token=token["token"])
    replayed = Field(registration_policy="token", operator_token=OPERATOR_TOKEN)
    replayed.replay(h.stored())
    (held,) = replayed.registration_tokens(OPERATOR_TOKEN)["registration_tokens"]
    assert (held["id"], held["uses_left"]) == (token["id"], 2)


def test_a_token_grants_authority_up_to_its_own() -> None:
    h = harness(registration_policy="token")
    standard = issue(h, uses=5)
    senior = issue(h, uses=5, authority=6)
    refused(h, Code.INSUFFICIENT_AUTHORITY, "s1", authority=6, registration_token=standard["token"])
    h.register("s1", authority=6, registration_token=senior["token"])
    refused(h, Code.INSUFFICIENT_AUTHORITY, "s2", authority=8, registration_token=senior["token"])
    assert h.field.state.agents["s1"].authority == 6


def test_expired_and_revoked_tokens_let_no_one_in() -> None:
    h = harness(registration_policy="token")
    soon = issue(h, uses=10, expires_at=iso_timestamp(h.time + 10))
    kept = issue(h, uses=10)
    h.register("early", registration_token=soon["token"])
    h.time += 3600
    refused(h, Code.REGISTRATION_TOKEN_INVALID, "late", registration_token=soon["token"])
    listed = h.field.registration_tokens(OPERATOR_TOKEN)
    assert_valid("registration-tokens.response", listed)
    assert [t["expired"] for t in listed["registration_tokens"]] == [True, False]
    outcome = h.field.revoke_registration_token(OPERATOR_TOKEN, kept["id"])
    h.entries.extend(outcome.entries)
    assert_valid("registration-token-revoke.response", outcome.response)
    refused(h, Code.REGISTRATION_TOKEN_INVALID, "after", registration_token=kept["token"])
    with pytest.raises(FieldError) as caught:
        h.field.revoke_registration_token(OPERATOR_TOKEN, kept["id"])
    assert caught.value.code == Code.NOT_FOUND
    # issuing the next token drops the expired one from the state (and from the list)
    issue(h)
    assert soon["id"] not in h.field.state.registration_tokens.by_id


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"uses": 0}, "uses"),
        ({"uses": True}, "uses"),
        ({"authority": 11}, "authority"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "future"),
        ({"expires_at": "2030-01-01T00:00:00"}, "offset"),
        ({"note": "x" * 300}, "note"),
        ({"secret": "mine"}, "unknown"),
    ],
)
def test_bad_token_requests_are_refused(body: dict[str, Any], needle: str) -> None:
    h = harness(registration_policy="token")
    with pytest.raises(FieldError) as caught:
        h.field.issue_registration_token(OPERATOR_TOKEN, body)
    assert caught.value.code == Code.INVALID_PAYLOAD and needle in caught.value.message


def test_only_the_operator_handles_registration_tokens() -> None:
    h = harness()
    h.register("alice")
    for token, code in (
        (None, Code.UNAUTHENTICATED),
        (h.tokens["alice"], "INSUFFICIENT_AUTHORITY"),
    ):
        with pytest.raises(FieldError) as caught:
            h.field.issue_registration_token(token, {})
        assert caught.value.code == code
        with pytest.raises(FieldError):
            h.field.registration_tokens(token)


def test_the_agent_cap_counts_registered_agents_and_binds_the_operator_too() -> None:
    h = harness(max_agents=2)
    h.register("a1")
    h.register("a2")
    error = refused(h, Code.AGENT_LIMIT, "a3")
    assert error.http_status == 409 and error.recoverable
    refused(h, Code.AGENT_LIMIT, "boss", via=OPERATOR_TOKEN)
    h.send("DEREGISTER", "a1", {"agent_id": "a1"})
    h.register("a3")  # a deregistered agent frees its place


# -- memory ------------------------------------------------------------------------

#: What a deregistered agent may leave in memory: its id (here 12 characters, 61 bytes),
#: its last token's SHA-256 in hex (113 bytes), and one slot in each of the two tables
#: that map them to each other (retired ids, revoked tokens): about 250 bytes.
KEPT_PER_AGENT = 300


def test_deregistered_agents_leave_only_their_retired_id_in_memory() -> None:
    count = itertools.count()
    field = Field(ids=Ids(token=lambda: f"token-{next(count):040d}"))
    field.genesis()
    liveness = Liveness(
        types.SimpleNamespace(field=field), failure_grace=30, heartbeat_timeout=300, clock=float
    )
    ids = itertools.count()

    def send(operation: str, agent: str, payload: dict[str, Any], token: str | None) -> Any:
        envelope = {"protocol": "akashik", "version": "0.1.0", "id": f"m{next(ids)}",
                    "operation": operation, "agent_id": agent, "session_id": None,
                    "epoch": 0, "payload": payload}  # fmt: skip
        return field.handle(envelope, token=token, operation=operation).response

    def come_and_go(prefix: str, n: int) -> None:
        tokens = {}
        for i in range(n):
            agent = f"{prefix}-{i:06d}"
            payload = {"id": agent, "role": f"role {i}", "interests": [f"topic {i}", "markets"]}
            tokens[agent] = send("REGISTER", agent, payload, None)["token"]
            liveness.connected(agent)
            liveness.disconnected(agent)
        for agent, token in tokens.items():
            send("DEREGISTER", agent, {"agent_id": agent}, token)
        liveness.forget_departed()

    n = 2000
    # traced from the start, so that a table reallocated later counts as the difference
    tracemalloc.start()
    try:
        come_and_go("warm", n)  # every table reaches its peak size once: not per agent
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        come_and_go("agent", n)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert not field.state.agents
    assert not liveness._heard and not liveness._dropped and not liveness._connections
    per_agent = (after - before) / n
    print(f"kept per deregistered agent: {per_agent:.0f} bytes")
    assert per_agent < KEPT_PER_AGENT


# -- over HTTP and the WebSocket ----------------------------------------------------


class Wire:
    """Raw HTTP requests against one server, with or without a bearer token."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.ids = itertools.count()

    async def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = OPERATOR_TOKEN
    ) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else orjson.dumps(body)
        async with self.http.request(method, self.url + path, data=data, headers=headers) as r:
            return r.status, await r.json(), r.headers

    def envelope(self, operation: str, agent: str, payload: dict[str, Any]) -> dict[str, Any]:
        return {"protocol": "akashik", "version": "0.1.0", "id": f"m{next(self.ids)}",
                "operation": operation, "agent_id": agent, "session_id": None, "epoch": 0,
                "payload": payload}  # fmt: skip

    async def register(
        self, agent: str, *, token: str | None = None, bearer: str | None = None
    ) -> tuple[int, dict[str, Any], Any]:
        payload: dict[str, Any] = {"id": agent, "role": "analyst"}
        if token is not None:
            payload["registration_token"] = token
        body = self.envelope("REGISTER", agent, payload)
        return await self.call("POST", "/v1/register", body, token=bearer)

    async def issue(self, **body: Any) -> dict[str, Any]:
        status, answer, _ = await self.call("POST", "/v1/registration-tokens", body)
        assert status == 200, answer
        assert_valid("registration-token.response", answer)
        return answer["registration_token"]

    async def held(self) -> list[dict[str, Any]]:
        status, answer, _ = await self.call("GET", "/v1/registration-tokens")
        assert status == 200, answer
        assert_valid("registration-tokens.response", answer)
        return answer["registration_tokens"]


async def test_tokens_over_http_issue_list_use_and_revoke(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession
) -> None:
    server = server_factory(operator_token=OPERATOR_TOKEN, registration="token")
    wire = Wire(http, server.url)
    status, body, _ = await wire.register("walk-in")
    assert (status, body["code"]) == (403, "REGISTRATION_TOKEN_INVALID"), body
    assert_valid("error", body)
    token = await wire.issue(uses=2, note="pilot")
    (listed,) = await wire.held()
    assert token["token"] not in str(listed)
    assert listed == {k: v for k, v in token.items() if k != "token"}
    status, body, _ = await wire.register("pilot-1", token=token["token"])
    assert status == 200, body
    assert_valid("register.response", body)
    (listed,) = await wire.held()
    assert listed["uses_left"] == 1
    status, body, _ = await wire.call("DELETE", f"/v1/registration-tokens/{token['id']}")
    assert status == 200 and body["id"] == token["id"]
    status, body, _ = await wire.register("pilot-2", token=token["token"])
    assert (status, body["code"]) == (403, "REGISTRATION_TOKEN_INVALID")
    assert await wire.held() == []
    # an agent's token is not the operator's
    agent_token = (await wire.register("lead", bearer=OPERATOR_TOKEN))[1]["token"]
    status, body, _ = await wire.call("POST", "/v1/registration-tokens", {}, token=agent_token)
    assert (status, body["code"]) == (403, "INSUFFICIENT_AUTHORITY")
    status, body, _ = await wire.call("GET", "/v1/registration-tokens", token=None)
    assert (status, body["code"]) == (401, "UNAUTHENTICATED")


async def test_a_token_is_used_exactly_n_times_under_concurrency(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession
) -> None:
    server = server_factory(operator_token=OPERATOR_TOKEN, registration="token")
    wire = Wire(http, server.url)
    token = await wire.issue(uses=5)
    answers = await asyncio.gather(
        *(wire.register(f"racer-{i:02d}", token=token["token"]) for i in range(40))
    )
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200] * 5 + [403] * 35
    status, body, _ = await wire.call("GET", "/v1/field/status", token=None)
    assert body["counts"]["agents"] == 5


async def test_tokens_and_their_uses_survive_a_restart(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    settings = {"operator_token": OPERATOR_TOKEN, "registration": "token", "sync": "normal"}
    first = server_factory(data_dir=tmp_path / "data", **settings)
    wire = Wire(http, first.url)
    token = await wire.issue(uses=3, expires_at="2999-01-01T00:00:00+00:00", authority=6)
    assert (await wire.register("before", token=token["token"]))[0] == 200
    first.stop()
    second = server_factory(data_dir=tmp_path / "data", **settings)
    wire = Wire(http, second.url)
    (listed,) = await wire.held()
    assert (listed["id"], listed["uses_left"], listed["authority"]) == (token["id"], 2, 6)
    assert listed["expires_at"] == "2999-01-01T00:00:00.000Z"
    assert [(await wire.register(f"after-{i}", token=token["token"]))[0] for i in range(3)] == [
        200,
        200,
        403,
    ]


async def test_closed_registration_over_http(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession
) -> None:
    server = server_factory(operator_token=OPERATOR_TOKEN, registration="closed")
    wire = Wire(http, server.url)
    status, body, _ = await wire.register("walk-in")
    assert (status, body["code"], body["recoverable"]) == (403, "REGISTRATION_CLOSED", False)
    assert_valid("error", body)
    status, body, _ = await wire.register("hired", bearer=OPERATOR_TOKEN)
    assert status == 200 and body["token"]


async def test_the_agent_cap_over_http(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession
) -> None:
    server = server_factory(max_agents=3)
    wire = Wire(http, server.url)
    assert [(await wire.register(f"a{i}"))[0] for i in range(3)] == [200] * 3
    status, body, _ = await wire.register("a3")
    assert (status, body["code"], body["recoverable"]) == (409, "AGENT_LIMIT", True)
    assert_valid("error", body)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_register_is_rate_limited_per_client_and_not_for_the_operator(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession
) -> None:
    server = server_factory(operator_token=OPERATOR_TOKEN, register_rate=0.5, register_burst=3)
    clock = FakeClock()
    server.app.state.register_limit.limiter.clock = clock
    wire = Wire(http, server.url)
    assert [(await wire.register(f"a{i}"))[0] for i in range(3)] == [200] * 3
    status, body, headers = await wire.register("a3")
    assert (status, body["code"], body["recoverable"]) == (429, "RATE_LIMITED", True)
    assert body["operation"] == "REGISTER" and body["details"]["retry_after"] == 2.0
    assert headers["Retry-After"] == "2"
    assert_valid("error", body)
    # the refusal happened before the writer: nothing was registered
    assert (await wire.call("GET", "/v1/field/status", token=None))[1]["counts"]["agents"] == 3
    # the operator goes past it
    for i in range(5):
        assert (await wire.register(f"op-{i}", bearer=OPERATOR_TOKEN))[0] == 200
    clock.now += 2.0  # one token back
    assert (await wire.register("a3"))[0] == 200
    assert (await wire.register("a4"))[0] == 429


async def test_register_on_a_websocket_counts_against_the_same_limit(
    server_factory: Callable[..., ThreadedServer], http: aiohttp.ClientSession
) -> None:
    server = server_factory(register_rate=1.0, register_burst=2)
    server.app.state.register_limit.limiter.clock = FakeClock()
    wire = Wire(http, server.url)
    _, first, _ = await wire.register("first")  # one of the two
    headers = {"Authorization": f"Bearer {first['token']}"}
    async with http.ws_connect(server.url + "/v1/ws", headers=headers) as ws:
        statuses = []
        for name in ("second", "third"):
            envelope = wire.envelope("REGISTER", name, {"id": name, "role": "analyst"})
            await ws.send_bytes(orjson.dumps(envelope))
            while True:
                frame = orjson.loads((await ws.receive()).data)
                if frame["type"] == "response":
                    break
            statuses.append((frame["status"], frame["body"].get("code")))
    assert statuses == [(200, None), (429, "RATE_LIMITED")]


# -- configuration -----------------------------------------------------------------


def test_token_and_closed_need_an_operator_token() -> None:
    for policy in ("token", "closed"):
        with pytest.raises(ValueError, match="operator token"):
            Config(registration=policy)
        Config(registration=policy, operator_token=OPERATOR_TOKEN)
    with pytest.raises(ValueError, match="registration must be one of"):
        Config(registration="invite-only")
    config = Config.from_env(
        {"FIELD_REGISTRATION": "closed", "FIELD_OPERATOR_TOKEN": OPERATOR_TOKEN,
         "FIELD_MAX_AGENTS": "7", "FIELD_REGISTER_RATE": "2.5", "FIELD_REGISTER_BURST": "9"}
    )  # fmt: skip
    assert (config.registration, config.max_agents) == ("closed", 7)
    assert (config.register_rate, config.register_burst) == (2.5, 9)


def test_field_serve_refuses_to_start_token_registration_without_an_operator(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FIELD_OPERATOR_TOKEN", raising=False)
    assert main(["serve", "--in-memory", "--registration", "token"]) == 2
    assert "needs an operator token" in capsys.readouterr().err
