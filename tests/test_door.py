"""The front door: every transport admits, runs and observes an operation the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from field.client import FieldClient, FieldClientError
from field.contract.errors import Code, FieldError
from field.engine.ratelimits import AgentRateLimits, too_fast
from field.transports.door import FrontDoor

from .conftest import ThreadedServer
from .test_mcp_http import call, finding, mcp_session
from .test_metrics import scrape, value
from .test_push import open_ws


class Seen:
    """An observer that keeps what it is told (the metrics' ``Observer`` has this method)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str | None, Any, Any]] = []

    def operation(
        self,
        transport: str,
        operation: str | None,
        started: float,
        result: Any,
        body: Any = None,
        **where: Any,
    ) -> None:
        self.told.append((transport, operation, result, body))


class Stopped:
    """A runtime whose Field is not running."""

    def running(self) -> Any:
        raise FieldError("the Field is starting", code=Code.OVERLOADED, recoverable=True)


def door(observer: Seen | None) -> FrontDoor:
    return FrontDoor(Stopped(), rate_limits=AgentRateLimits(None), observer=observer)  # type: ignore[arg-type]


def test_a_visit_is_observed_once_with_its_result_and_lets_go_of_it() -> None:
    seen = Seen()
    with door(seen).visit("websocket") as visit:
        visit.operation, visit.body = "RECORD", {"id": "m-1"}
        visit.result = outcome = object()  # type: ignore[assignment]
    assert seen.told == [("websocket", "RECORD", outcome, {"id": "m-1"})]
    assert visit.result is None  # nothing holds an error's frames after the visit


def test_an_error_leaving_a_visit_is_observed_and_goes_on() -> None:
    seen = Seen()
    refused = too_fast(1.0, "slow down", suggested_action="Wait.", operation="RECORD")
    with pytest.raises(FieldError), door(seen).visit("http", "RECORD"):
        raise refused
    assert seen.told == [("http", "RECORD", refused, None)]


def test_a_visit_that_came_to_nothing_is_not_observed_nor_is_one_without_an_observer() -> None:
    seen = Seen()
    with door(seen).visit("http", "RECORD"):
        pass  # the client left before its body arrived
    with pytest.raises(FieldError), door(None).visit("mcp", "ATTUNE") as visit:
        visit.result = FieldError("x", code=Code.INTERNAL_ERROR)
        door(None).admit("token", "ATTUNE")  # a Field that is not running refuses
    assert seen.told == []


async def test_http_a_websocket_and_mcp_come_in_by_the_one_door(
    server_factory: Callable[..., ThreadedServer],
) -> None:
    """The same RECORD by each transport is admitted against the agent's one rate,
    refused alike past it, and counted once under its transport."""
    server = server_factory(agent_rate=1e-6, agent_burst=4)
    payload = finding("by every door")
    async with FieldClient(server.url, retries=0) as field:
        agent = await field.register("analyst-1", "analyst")
        async with open_ws(server, agent.token) as ws:
            await agent.send("RECORD", payload)  # 1: HTTP
            assert (await ws.request("RECORD", "analyst-1", payload))["status"] == 200  # 2
            async with mcp_session(server.url, agent.token) as session:  # 3: the session
                assert (await call(session, "akashik_record", **payload))[0] is False  # 4
                failed, error = await call(session, "akashik_record", **payload)
            refused = await ws.request("RECORD", "analyst-1", payload)
            with pytest.raises(FieldClientError) as http_refused:
                await agent.send("RECORD", payload)
    assert http_refused.value.code == "RATE_LIMITED"
    assert (refused["status"], refused["body"]["code"]) == (429, "RATE_LIMITED")
    assert failed and error["code"] == "RATE_LIMITED"
    samples = await scrape(server.url)
    for transport in ("http", "websocket", "mcp"):
        labels = {"transport": transport, "operation": "RECORD"}
        assert value(samples, "field_operations_total", **labels, outcome="ok") == 1, transport
        assert value(samples, "field_operations_total", **labels, outcome="RATE_LIMITED") == 1
