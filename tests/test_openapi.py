"""``GET /openapi.json``: a valid OpenAPI 3.1 document of every route, over protocol/schemas.

The document is built from the schema files and the table of endpoints in
``field/transports/openapi.py``. These tests fail when a route the app serves
is missing from the table (naming it), when the table documents a route the app
does not serve, and when the document's schemas differ from the files.
"""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
import pytest
from openapi_spec_validator import validate
from starlette.routing import Mount, Route, WebSocketRoute

from field.contract.errors import HTTP_STATUS, Code
from field.contract.model import OPERATIONS
from field.server.app import create_app
from field.server.config import Config
from field.transports.openapi import (
    COMPONENTS,
    ENDPOINTS,
    URN_PREFIX,
    build_document,
    component_ref,
)

from .conftest import ThreadedServer
from .schema_util import SCHEMA_DIR

#: Paths ``field serve`` answers outside its router (``asgi._FieldApp`` routes them itself).
UNROUTED = {("GET", "/v1/ws")}
#: A method that any method of a mounted app stands for.
ANY = "*"


def served_routes() -> set[tuple[str, str]]:
    """(method, path) of every route of the app, in the document's spelling of paths."""
    app = create_app(Config(data_dir=None))
    served = set(UNROUTED)
    for route in app.router.routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # {name:path} -> {name}
        if isinstance(route, Route):
            methods = set(route.methods or ())
            if "GET" in methods:
                methods.discard("HEAD")  # HEAD of a GET goes without saying
            served |= {(method, path) for method in methods}
        elif isinstance(route, WebSocketRoute):
            served.add(("GET", path))
        elif isinstance(route, Mount):
            served.add((ANY, path))
        else:
            raise AssertionError(f"a route of a kind this test does not know: {route!r}")
    return served


def documented_routes(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_document()


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    validate(document)  # the OpenAPI 3.1 schema, and every $ref resolves
    assert document["openapi"].startswith("3.1.")


def test_every_route_of_the_app_is_documented(document: dict[str, Any]) -> None:
    documented = documented_routes(document)
    paths = set(document["paths"])
    missing = sorted(
        f"{method} {path}"
        for method, path in served_routes()
        if (method, path) not in documented and not (method == ANY and path in paths)
    )
    assert not missing, (
        "served by field serve but missing from ENDPOINTS in field/transports/openapi.py: "
        + ", ".join(missing)
    )


def test_every_documented_route_is_served(document: dict[str, Any]) -> None:
    served = served_routes()
    mounted = {path for method, path in served if method == ANY}
    stale = sorted(
        f"{method} {path}"
        for method, path in documented_routes(document)
        if (method, path) not in served and path not in mounted
    )
    assert not stale, "documented in ENDPOINTS but not served: " + ", ".join(stale)


def test_each_route_is_in_the_table_once() -> None:
    keys = [(endpoint.method, endpoint.path) for endpoint in ENDPOINTS]
    assert len(keys) == len(set(keys))
    names = [endpoint.name for endpoint in ENDPOINTS]
    assert len(names) == len(set(names))


def test_the_schemas_are_the_files_with_their_references_rewritten(
    document: dict[str, Any],
) -> None:
    """Read the components back into files: they must be the files, less ``$id`` and
    ``$schema``, every reference pointing where the file's own reference points."""
    files = {
        path.name.removesuffix(".json"): json.loads(path.read_text(encoding="utf-8"))
        for path in SCHEMA_DIR.glob("*.json")
    }
    schemas = document["components"]["schemas"]
    assert set(schemas) == set(files), "every schema file, and nothing else"
    for stem, schema in files.items():
        expected = {k: v for k, v in schema.items() if k not in ("$id", "$schema")}
        assert _as_file(schemas[stem], stem) == _absolute(expected, stem), stem


def test_no_reference_leaves_the_document(document: dict[str, Any]) -> None:
    refs = list(_refs(document))
    assert refs, "the document refers to its schemas"
    headers = "#/components/headers/"
    outside = [ref for ref in refs if not ref.startswith((COMPONENTS, headers))]
    assert not outside
    for ref in {ref for ref in refs if ref.startswith(headers)}:
        assert ref.removeprefix(headers) in document["components"]["headers"], ref
    assert URN_PREFIX not in json.dumps(document)


def test_every_answer_declares_its_request_id(document: dict[str, Any]) -> None:
    """Every response of every endpoint, errors and refusals included, carries X-Request-Id
    (the access log's id: protocol/README.md, HTTP binding)."""
    responses = [
        (path, method, status, response)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        for status, response in operation["responses"].items()
    ]
    assert len(responses) > 100
    for path, method, status, response in responses:
        header = response.get("headers", {}).get("X-Request-Id")
        assert header == {"$ref": "#/components/headers/RequestId"}, (path, method, status)
    request_id = document["components"]["headers"]["RequestId"]
    assert request_id["schema"] == {"type": "string", "minLength": 1, "maxLength": 128}


def test_each_operation_takes_its_envelope_and_answers_its_response(
    document: dict[str, Any],
) -> None:
    for operation in OPERATIONS:
        name = operation.lower()
        post = document["paths"][f"/v1/{name}"]["post"]
        body = post["requestBody"]["content"]["application/json"]["schema"]
        envelope, this = body["allOf"]
        assert envelope == {"$ref": COMPONENTS + "envelope"}
        assert this["properties"]["operation"] == {"const": operation}
        assert this["properties"]["payload"] == {"$ref": f"{COMPONENTS}{name}.request"}
        answer = post["responses"]["200"]["content"]["application/json"]["schema"]
        assert answer == {"$ref": f"{COMPONENTS}{name}.response"}


def test_every_error_response_is_the_error_schema_with_its_codes(
    document: dict[str, Any],
) -> None:
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            errors = {s: r for s, r in operation["responses"].items() if int(s) >= 400}
            assert {"500", "503"} <= errors.keys(), where
            for status, response in errors.items():
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": COMPONENTS + "error"}, where
                codes = response["x-error-codes"]
                assert codes and all(HTTP_STATUS[code] == int(status) for code in codes), where
                if status in ("429", "503", "507"):
                    assert "Retry-After" in response["headers"], where
            needed = operation["security"] and {} not in operation["security"]
            if needed and "101" not in operation["responses"]:  # a WebSocket closes with 4401
                assert Code.UNAUTHENTICATED in errors["401"]["x-error-codes"], where


def test_tokens_are_bearer_tokens(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    assert schemes["agentToken"] == schemes["agentToken"] | {"type": "http", "scheme": "bearer"}
    assert schemes["operatorToken"]["scheme"] == "bearer"
    operator_paths = {"/v1/sources", "/v1/sources/{name}", "/v1/registration-tokens"}
    for path in operator_paths:
        for operation in document["paths"][path].values():
            assert operation["security"] == [{"operatorToken": []}], path
    record = document["paths"]["/v1/record"]["post"]
    assert record["security"] == [{"agentToken": []}]
    assert document["paths"]["/v1/field/status"]["get"]["security"] == []
    push = document["paths"]["/v1/subscriptions/{subscription_id}/events"]["get"]
    assert {"queryToken": []} in push["security"]


async def test_the_server_serves_the_document(field_server: ThreadedServer) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{field_server.url}/openapi.json") as answer,
    ):
        assert answer.status == 200
        assert answer.content_type == "application/json"
        served = await answer.json()
    assert served == build_document()


# -- helpers -------------------------------------------------------------------------------


def _refs(node: Any) -> Any:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _as_file(node: Any, stem: str) -> Any:
    """A component with its references as absolute URNs."""
    if isinstance(node, list):
        return [_as_file(item, stem) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref":
            assert value.startswith(COMPONENTS), value
            target, _, pointer = value[len(COMPONENTS) :].partition("/")
            out[key] = URN_PREFIX + target + ("#/" + pointer if pointer else "")
        else:
            out[key] = _as_file(value, stem)
    return out


def _absolute(node: Any, stem: str) -> Any:
    """A file's schema with its references as absolute URNs (``#/$defs/x`` in file
    ``envelope`` is ``urn:...:envelope#/$defs/x``)."""
    if isinstance(node, list):
        return [_absolute(item, stem) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref":
            location, _, pointer = value.partition("#")
            target = location or URN_PREFIX + stem
            out[key] = target + ("#" + pointer if pointer else "")
        else:
            out[key] = _absolute(value, stem)
    return out


def test_references_are_rewritten_into_the_components() -> None:
    assert component_ref("#/$defs/epoch", "envelope") == COMPONENTS + "envelope/$defs/epoch"
    assert component_ref(URN_PREFIX + "memory-unit#/$defs/content") == (
        COMPONENTS + "memory-unit/$defs/content"
    )
    assert component_ref(URN_PREFIX + "agent", "record.request") == COMPONENTS + "agent"
    with pytest.raises(ValueError, match="outside"):
        component_ref("https://example.com/schema.json", "agent")
