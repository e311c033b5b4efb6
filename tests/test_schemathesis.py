"""Schemathesis against a live server: every answer is one that ``/openapi.json`` documents.

A real ``field serve`` app on uvicorn (the threaded server of ``conftest``) with
an operator token; an agent registered on it. Schemathesis reads the document
from the server and sends each operation a bounded number of generated
requests, valid and invalid, with the agent's token (the operator's on the
operator's endpoints). Every response must be no 5xx, a documented status with
a documented content type and a body valid against its schema, and an error
body's ``code`` one that the document lists for that status (``x-error-codes``).

Valid envelopes are sent as the registered agent at epoch 0 (a generated
``agent_id`` and epoch would make nearly every one a 403 or 422), so the
operations run for real, on whatever payloads the schemas allow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, CheckContext, GenerationMode, Response
from schemathesis.checks import negative_data_rejection, positive_data_acceptance

from field.server.config import Config
from field.transports.openapi import ENDPOINTS, Endpoint

from .conftest import ThreadedServer

OPERATOR_TOKEN = "operator-token-of-the-schemathesis-run"
AGENT = "schemathesis-agent"
#: Generated requests per operation and mode: the whole run stays well under a minute.
EXAMPLES = 25
#: Paths the operator's token is for.
OPERATOR_PATHS = ("/v1/sources", "/v1/registration-tokens", "/v1/events", "/v1/agents/")

#: Schema-valid requests the Field may still refuse, by rules the schemas cannot say
#: (protocol/README.md, Schemas): a REGISTER whose payload id is not its agent_id, a CEL
#: filter that does not compile, a webhook to a private address...
EXCLUDED = [positive_data_acceptance]

pytestmark = pytest.mark.slow


@dataclass
class Live:
    server: ThreadedServer
    token: str


_tokens: dict[str, str] = {}


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    config = Config(
        data_dir=None,
        log_level="warning",
        operator_token=OPERATOR_TOKEN,
        # shedding off: a 503 is documented, but the run is about every other answer
        overload_write_target=0,
        overload_read_target=0,
        overload_write_budget=0,
    )
    server = ThreadedServer(config).start()
    try:
        envelope = {
            "protocol": "akashik",
            "version": "0.1.0",
            "id": "register-1",
            "operation": "REGISTER",
            "agent_id": AGENT,
            "session_id": None,
            "epoch": 0,
            "payload": {"id": AGENT, "role": "tester"},
        }
        answer = requests.post(f"{server.url}/v1/register", json=envelope, timeout=10)
        answer.raise_for_status()
        _tokens.update(agent=answer.json()["token"], operator=OPERATOR_TOKEN)
        yield Live(server, _tokens["agent"])
    finally:
        _tokens.clear()
        server.stop()


@pytest.fixture(scope="module")
def api(live: Live) -> Any:
    schema = schemathesis.openapi.from_url(f"{live.server.url}/openapi.json")
    schema.auth.auth(refresh_interval=None)(Tokens)
    return schema


class Tokens:
    """The agent's token, or the operator's on the operator's endpoints."""

    def get(self, case: Case, ctx: Any) -> str:
        operator = case.operation.path.startswith(OPERATOR_PATHS)
        return _tokens["operator" if operator else "agent"]

    def set(self, case: Case, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


def _as_the_agent(case: Case) -> None:
    """A valid envelope, sent as the registered agent (REGISTER: as the agent it
    registers) at epoch 0."""
    body = case.body
    if case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE:
        return
    if not (isinstance(body, dict) and {"agent_id", "epoch", "payload"} <= body.keys()):
        return
    payload = body["payload"]
    if body.get("operation") == "REGISTER" and isinstance(payload, dict) and "id" in payload:
        body["agent_id"] = payload["id"]  # a new agent: the id its payload names
    else:
        body["agent_id"] = AGENT
    body["epoch"] = 0


@schemathesis.check
def documented_error_code(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """An error body's ``code`` is one the document lists for its status."""
    if response.status_code < 400:
        return None
    definition = case.operation.responses.find_by_status_code(response.status_code)
    listed = None if definition is None else definition.definition.get("x-error-codes")
    if listed is None:
        return None  # an undocumented status: status_code_conformance says so
    code = response.json().get("code")
    if code not in listed:
        raise AssertionError(
            f"{case.method} {case.path} answered {response.status_code} {code}, not one of {listed}"
        )
    return True


#: Checks that do not hold for one endpoint, and why.
EXCLUDED_FOR: dict[tuple[str, str], list[Any]] = {
    # RAP: a body that is no cancel request is answered 200 "ignored" (protocol/README.md)
    ("POST", "/cancel_tool_call"): [negative_data_rejection],
    ("POST", "/close_thread"): [negative_data_rejection],
}


#: Endpoints that answer a valid request with a stream that never ends: a request and its
#: whole answer is not a way to check them (their own tests read them).
ENDLESS = {("GET", "/v1/console/stream")}


def _runs() -> Iterator[Any]:
    """Each endpoint with valid requests; and with invalid ones where it has something a
    request can get wrong (parameters, a body)."""
    for endpoint in ENDPOINTS:
        label = f"{endpoint.method} {endpoint.path}"
        if (endpoint.method, endpoint.path) in ENDLESS:
            continue
        yield pytest.param(endpoint, GenerationMode.POSITIVE, id=f"{label} valid")
        if endpoint.params or endpoint.request is not None:
            yield pytest.param(endpoint, GenerationMode.NEGATIVE, id=f"{label} invalid")


@pytest.mark.parametrize(("endpoint", "mode"), list(_runs()))
def test_every_answer_is_documented(api: Any, endpoint: Endpoint, mode: GenerationMode) -> None:
    operation = api[endpoint.path][endpoint.method]
    strategy = operation.as_strategy(generation_mode=mode, auth_storage=api.auth)

    @given(strategy)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case: Case) -> None:
        _as_the_agent(case)
        case.call_and_validate(
            timeout=10,
            additional_checks=[documented_error_code],
            excluded_checks=EXCLUDED + EXCLUDED_FOR.get((endpoint.method, endpoint.path), []),
        )

    run()
