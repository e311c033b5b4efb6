"""The official MCP conformance suite, in server mode, against ``/mcp`` of ``field serve``.

The suite is the npm package ``@modelcontextprotocol/conformance`` at the version
``tests/mcp_conformance/package-lock.json`` pins (0.1.13: later ones need Node.js 22),
installed by ``.ci/run`` with ``npm ci --prefix tests/mcp_conformance``; where it is not
installed these tests say so and are skipped.

Its client sends no ``Authorization`` header and has no option for one, while ``/mcp``
serves registered agents only. So it reaches the Field through a pass-through proxy that
adds the bearer token of an agent registered for the run and changes nothing else: the
method, path, ``Host`` and every other header go up as sent, and the status, headers and
body (streams included) come back as the Field sends them.

Of the suite's server scenarios, those that test what any MCP server must do apply; the
others drive the fixtures of the suite's own reference server (tools, resources and
prompts it names, such as ``test_simple_text`` or ``test://watched-resource``) or
capabilities the Field does not declare, and are listed below with the reason. A
scenario the suite adds in a later version fails :func:`test_every_scenario_is_classified`
until it is placed in one list or the other.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from .conftest import ServerProcess, spawn_server
from .test_service import envelope

SUITE = Path(__file__).parent / "mcp_conformance"
CONFORMANCE = SUITE / "node_modules" / ".bin" / "conformance"
HANG_GUARD = 120  # seconds; only ever reached when something hangs

#: Scenarios that test what every MCP server must do, and what each holds the Field to.
APPLY = {
    "server-initialize": "the initialize handshake: server info, protocol version, capabilities",
    "ping": "ping answers an empty result",
    "tools-list": "every tool has a name, a description and a JSON Schema for its input",
    "resources-list": "every direct resource has a uri and a name",
    "server-sse-multiple-streams": "several SSE streams of one session at once",
    "dns-rebinding-protection": "a request with a foreign Host or Origin is refused",
}

_FIXTURE = "drives a fixture of the suite's reference server that the Field does not have"
#: Scenarios that do not apply to the Field, and why.
NOT_APPLY = {
    "logging-set-level": "the Field does not declare the logging capability "
    "(it answers logging/setLevel -32601, as MCP asks of a server without it)",
    "completion-complete": "the Field declares no completions capability (no prompts, "
    "no resource templates with arguments to complete)",
    "tools-call-simple-text": f"{_FIXTURE}: the tool test_simple_text",
    "tools-call-image": f"{_FIXTURE}: the tool test_image_content",
    "tools-call-audio": f"{_FIXTURE}: the tool test_audio_content",
    "tools-call-embedded-resource": f"{_FIXTURE}: the tool test_embedded_resource",
    "tools-call-mixed-content": f"{_FIXTURE}: the tool test_multiple_content_types",
    "tools-call-with-logging": f"{_FIXTURE}: the tool test_tool_with_logging",
    "tools-call-error": f"{_FIXTURE}: the tool test_error_handling",
    "tools-call-with-progress": f"{_FIXTURE}: the tool test_tool_with_progress",
    "tools-call-sampling": f"{_FIXTURE}: the tool test_sampling (the Field asks no "
    "client to sample)",
    "tools-call-elicitation": f"{_FIXTURE}: the tool test_elicitation (the Field elicits nothing)",
    "elicitation-sep1034-defaults": f"{_FIXTURE}: the tool test_elicitation_sep1034_defaults",
    "elicitation-sep1330-enums": f"{_FIXTURE}: the tool test_elicitation_sep1330_enums",
    "json-schema-2020-12": f"{_FIXTURE}: the tool json_schema_2020_12_tool",
    "server-sse-polling": f"{_FIXTURE}: the tool test_reconnection, which closes its "
    "stream mid-call",
    "resources-read-text": f"{_FIXTURE}: the resource test://static-text",
    "resources-read-binary": f"{_FIXTURE}: the resource test://static-binary",
    "resources-templates-read": f"{_FIXTURE}: the template test://template/{{id}}/data",
    "resources-subscribe": f"{_FIXTURE}: the resource test://watched-resource "
    "(tests/test_mcp_http.py subscribes to the Field's own resources with the SDK)",
    "resources-unsubscribe": f"{_FIXTURE}: the resource test://watched-resource",
    "prompts-list": "the Field offers no prompts (no prompts capability)",
    "prompts-get-simple": "the Field offers no prompts",
    "prompts-get-with-args": "the Field offers no prompts",
    "prompts-get-embedded-resource": "the Field offers no prompts",
    "prompts-get-with-image": "the Field offers no prompts",
}

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]


def needs_npm(installed: Path, what: str) -> None:
    """Skip, saying why, unless Node.js runs and ``installed`` (a file of the npm packages
    of :data:`SUITE`, which ``.ci/run`` installs) is there."""
    if shutil.which("node") is None:
        pytest.skip(f"{what}: Node.js (node) is not installed")
    if not installed.exists():
        pytest.skip(
            f"{what} not installed: run 'npm ci --prefix tests/mcp_conformance' (.ci/run does)"
        )


async def _run(*args: str) -> tuple[int, str]:
    """Run the suite's command line; its exit status and what it printed."""
    process = await asyncio.create_subprocess_exec(
        str(CONFORMANCE),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"},
    )
    out, _ = await asyncio.wait_for(process.communicate(), HANG_GUARD)
    return process.returncode or 0, out.decode(errors="replace")


@pytest.fixture(scope="module")
def field(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    needs_npm(CONFORMANCE, "MCP conformance suite")
    server = spawn_server(tmp_path_factory.mktemp("mcp-conformance"))
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxy(field: ServerProcess) -> AsyncIterator[str]:
    """The URL of ``/mcp`` through a proxy that adds one registered agent's token."""
    session = aiohttp.ClientSession(auto_decompress=False)
    register = envelope(
        "REGISTER", "conformance", {"id": "conformance", "role": "tester", "interests": ["mcp"]}
    )
    async with session.post(f"{field.url}/v1/register", json=register) as response:
        assert response.status == 200, await response.text()
        token = (await response.json())["token"]

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        headers["Authorization"] = f"Bearer {token}"
        async with session.request(
            request.method,
            f"{field.url}{request.path_qs}",
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as upstream:
            hop = {"content-length", "transfer-encoding", "connection"}
            answer = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in hop},
            )
            await answer.prepare(request)
            async for chunk in upstream.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            return answer

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", forward)
    runner = web.AppRunner(app, handler_cancellation=True)  # a client gone ends its relay
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        await runner.cleanup()
        await session.close()


async def test_every_scenario_is_classified(field: ServerProcess) -> None:
    status, listing = await _run("list")
    assert status == 0, listing
    server_part = listing.split("Server scenarios", 1)[1].split("Client scenarios", 1)[0]
    scenarios = set(re.findall(r"^\s*-\s*(\S+)", server_part, re.MULTILINE))
    assert scenarios, listing
    assert not set(APPLY) & set(NOT_APPLY)
    assert scenarios == set(APPLY) | set(NOT_APPLY), (
        f"not classified: {sorted(scenarios - set(APPLY) - set(NOT_APPLY))}; "
        f"no longer in the suite: {sorted(set(APPLY) | set(NOT_APPLY) - scenarios)}"
    )


@pytest.mark.parametrize("scenario", sorted(APPLY))
async def test_the_scenario_passes(scenario: str, proxy: str, tmp_path: Path) -> None:
    status, printed = await _run(
        "server", "--url", proxy, "--scenario", scenario, "--output-dir", str(tmp_path)
    )
    reports = list(tmp_path.glob("*/checks.json"))
    assert len(reports) == 1, printed
    checks = json.loads(reports[0].read_text())
    failed = [c for c in checks if c["status"] not in ("SUCCESS", "INFO", "WARNING")]
    assert not failed, json.dumps(failed, indent=1)
    assert any(c["status"] == "SUCCESS" for c in checks), printed
    assert status == 0, printed
