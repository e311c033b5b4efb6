"""The scripts in ``examples/`` run as a user runs them: subprocesses against ``field serve``.

Each test starts a real ``field serve`` (``server_process`` from conftest)
and runs the scripts with the Field's URL as their argument, twice where a
second run is the point (the agents and their subscriptions are the same, and
nothing is handled twice). Output lines are the scripts' promises, and so is
what they say when they stop: what is missing, or the Field's own words,
never a traceback.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from field.client import FieldClient, FieldClientError

from .conftest import ServerProcess

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
OPERATOR_TOKEN = "operator-token-0123456789"
#: Failure guard for a script's run or one line of its output (never a pacing delay).
TIMEOUT = 60.0

SpawnServer = Callable[..., ServerProcess]


@pytest.fixture
def field_process(server_process: SpawnServer, tmp_path: Path) -> ServerProcess:
    token_file = tmp_path / "operator.token"
    token_file.write_text(OPERATOR_TOKEN)
    return server_process(tmp_path / "data", "--operator-token-file", str(token_file))


@pytest.fixture
def plain_process(
    server_process: SpawnServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> ServerProcess:
    """``field serve`` as the README's "Run it" starts it: no operator token."""
    monkeypatch.delenv("FIELD_OPERATOR_TOKEN", raising=False)
    return server_process(tmp_path / "plain")


def _env(agent_dir: Path, operator_token: str | None = OPERATOR_TOKEN) -> dict[str, str]:
    env = {**os.environ, "FIELD_AGENT_DIR": str(agent_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("FIELD_OPERATOR_TOKEN", None)
    if operator_token is not None:
        env["FIELD_OPERATOR_TOKEN"] = operator_token
    return env


async def run(script: str, *args: str, agent_dir: Path) -> list[str]:
    """Run ``examples/<script>`` to its end; its stdout lines (it must exit 0)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / script),
        *args,
        env=_env(agent_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 0, err.decode()
    return out.decode().splitlines()


async def refused(
    script: str, *args: str, agent_dir: Path, operator_token: str | None
) -> tuple[str, str]:
    """Run ``examples/<script>``, which must stop with status 1; its stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / script),
        *args,
        env=_env(agent_dir, operator_token),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 1, (out, err)
    return out.decode(), err.decode()


async def _refusal(url: str, operator_token: str, why: str) -> str:
    """The Field's answer to a REGISTER at authority 6 with ``operator_token``, refused for
    ``why`` (its ``details.operator_token``), as the scripts print it: the error, then its
    suggested action."""
    async with FieldClient(url) as field:
        with pytest.raises(FieldClientError) as caught:
            await field.register(
                "probe", "research_lead", authority=6, operator_token=operator_token
            )
    body = caught.value.body
    assert body["details"]["operator_token"] == why, body
    return f"{caught.value.status} {body['code']}: {body['message']}\n{body['suggested_action']}\n"


def _one(lines: list[str], pattern: str) -> re.Match[str]:
    found = [m for m in map(re.compile(pattern).fullmatch, lines) if m]
    assert len(found) == 1, (pattern, lines)
    return found[0]


async def test_the_research_team_resolves_its_conflict_on_every_run(
    field_process: ServerProcess, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    first = await run("research_team.py", field_process.url, agent_dir=agents)
    assert first[:2] == ["agents: registered", "subscriptions: created"]
    made = _one(first, r"analyst: contradicted (mem-\w+): (conflict-\w+)")
    unit, conflict = made.groups()
    _one(first, rf"lead: resolved {conflict}: {unit} stands")  # the better-supported one
    _one(first, rf"researcher: told conflict.resolved for {conflict}")
    assert first[-1] == (
        "analyst: the Field now says: The EU market for SMB HR software grows 23% a year."
    )
    for name in ("researcher.token", "analyst.token", "lead.token", "lead.cursors"):
        assert stat.S_IMODE((agents / name).stat().st_mode) == 0o600, name

    second = await run("research_team.py", field_process.url, agent_dir=agents)
    assert second[:2] == ["agents: reused", "subscriptions: reused"]
    again = _one(second, r"analyst: contradicted (mem-\w+): (conflict-\w+)").group(2)
    assert again != conflict
    resolved = [line for line in second if line.startswith("lead: resolved")]
    assert len(resolved) == 1 and again in resolved[0]  # the first run's is not handled again
    _one(second, rf"researcher: told conflict.resolved for {again}")

    async with FieldClient(field_process.url) as field:  # one subscription each, not two
        lead = field.agent("lead", _token(agents / "lead.token"), role="research_lead")
        assert len((await lead.subscriptions())["subscriptions"]) == 1


async def test_the_listener_prints_each_notification_once_across_its_restarts(
    field_process: ServerProcess, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    async with FieldClient(field_process.url) as field:
        writer = await field.register("writer", "market_researcher", interests=["market size"])

        async def write(content: str) -> str:
            unit = await writer.record(
                "finding", content, purpose="size the market", confidence=0.8, reasoning="reports"
            )
            return str(unit["memory_unit_id"])

        # the first start: it subscribes, then what is recorded is printed
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLES / "listener.py"),
            field_process.url,
            "--count",
            "2",
            env=_env(agents),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), TIMEOUT)
        assert re.fullmatch(rb"listening: sub-\w+ \(new\)\n", ready), ready
        first = [await write("The market size is 4bn."), await write("The market size is 5bn.")]
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
        assert process.returncode == 0, err.decode()
        printed = out.decode().splitlines()
        assert [line.split()[:2] for line in printed] == [
            ["memory.recorded", first[0]],
            ["memory.recorded", first[1]],
        ]
        assert printed[0].endswith("finding from writer: The market size is 4bn.")

        # recorded while it is not running: printed when it starts again, and only that
        missed = [await write("The market size is 6bn."), await write("The market size is 7bn.")]
        lines = await run("listener.py", field_process.url, "--count", "2", agent_dir=agents)
        assert re.fullmatch(r"listening: sub-\w+ \(again\)", lines[0]), lines
        assert [line.split()[:2] for line in lines[1:]] == [
            ["memory.recorded", missed[0]],
            ["memory.recorded", missed[1]],
        ]


async def test_the_research_team_says_what_is_missing_when_the_field_has_no_operator_token(
    plain_process: ServerProcess, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    out, err = await refused(
        "research_team.py", plain_process.url, agent_dir=agents, operator_token=None
    )
    assert out == ""
    assert err.startswith("FIELD_OPERATOR_TOKEN is not set.\n"), err
    assert "    FIELD_OPERATOR_TOKEN=change-me-to-a-long-secret field serve\n" in err

    # the token given, to a Field started without one: the Field's own words, no traceback
    out, err = await refused(
        "research_team.py", plain_process.url, agent_dir=agents, operator_token=OPERATOR_TOKEN
    )
    assert out == ""
    assert err == await _refusal(plain_process.url, OPERATOR_TOKEN, "not_configured")
    assert err.startswith("403 INSUFFICIENT_AUTHORITY: "), err

    # nothing was registered or kept: every id is free
    assert not agents.exists() or not list(agents.iterdir())
    async with FieldClient(plain_process.url) as field:
        for agent_id in ("lead", "researcher", "analyst"):
            await field.register(agent_id, "market_researcher")


async def test_the_research_team_stops_with_the_fields_words_for_another_operator_token(
    field_process: ServerProcess, tmp_path: Path
) -> None:
    wrong = "not-the-operator-token-0123"
    out, err = await refused(
        "research_team.py", field_process.url, agent_dir=tmp_path / "agents", operator_token=wrong
    )
    assert out == ""
    assert err == await _refusal(field_process.url, wrong, "not_the_operators")
    assert err.startswith("403 INSUFFICIENT_AUTHORITY: "), err


async def test_the_listener_needs_no_operator_token_and_says_when_its_kept_token_is_refused(
    plain_process: ServerProcess, server_process: SpawnServer, tmp_path: Path
) -> None:
    agents = tmp_path / "agents"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / "listener.py"),
        plain_process.url,
        "--count",
        "1",
        env=_env(agents, operator_token=None),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    ready = await asyncio.wait_for(process.stdout.readline(), TIMEOUT)
    assert re.fullmatch(rb"listening: sub-\w+ \(new\)\n", ready), ready
    async with FieldClient(plain_process.url) as field:
        writer = await field.register("writer", "market_researcher", interests=["market size"])
        await writer.record(
            "finding", "The market size is 4bn.", purpose="size", confidence=0.8, reasoning="r"
        )
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 0, err.decode()
    assert out.decode().endswith("finding from writer: The market size is 4bn.\n"), out

    # started over: another Field (its data removed) does not know the kept token
    other = server_process(tmp_path / "other")
    out_text, err_text = await refused(
        "listener.py", other.url, agent_dir=agents, operator_token=None
    )
    assert out_text == ""
    kept = agents / "listener.token"
    assert err_text.startswith(
        f"the token kept for agent 'listener' in {kept} was refused: 401 UNAUTHENTICATED: "
    ), err_text
    assert err_text.count("\n") == 1 and "Traceback" not in err_text, err_text
    assert kept.exists()  # left where it was: it may be the only proof of the agent id


@pytest.mark.parametrize("script", ["research_team.py", "listener.py"])
async def test_the_examples_say_when_no_field_answers(
    plain_process: ServerProcess, tmp_path: Path, script: str
) -> None:
    assert plain_process.stop() == 0  # the Field was there; nothing listens on its port now
    out, err = await refused(
        script, plain_process.url, agent_dir=tmp_path / "agents", operator_token=OPERATOR_TOKEN
    )
    assert out == ""
    assert err.startswith(f"no Field at {plain_process.url}: connection refused"), err
    assert err.count("\n") == 1, err


def _token(path: Path) -> str:
    return str(orjson.loads(path.read_bytes())["token"])


def _readme_program(tmp_path: Path) -> Path:
    """The README's program (``team.py``), written to ``tmp_path``."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme[readme.index("## Writing an agent in Python") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no Python program in the section"
    script = tmp_path / "team.py"
    script.write_text(match.group(1))
    return script


async def test_the_readme_program_says_what_it_needs_without_an_operator_token(
    plain_process: ServerProcess, tmp_path: Path
) -> None:
    """Run as "Run it" starts the Field, without FIELD_OPERATOR_TOKEN: a sentence saying
    what to set and why, status 1, no traceback, and nothing registered."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(_readme_program(tmp_path)),
        env={**_env(tmp_path / "agents", None), "FIELD_URL": plain_process.url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 1 and out == b""
    assert err.decode().startswith("FIELD_OPERATOR_TOKEN is not set: the lead's MERGE needs")
    assert b"Traceback" not in err and not (tmp_path / "agents").exists()


async def test_the_readme_program_runs_as_often_as_you_like(
    field_process: ServerProcess, tmp_path: Path
) -> None:
    script = _readme_program(tmp_path)
    agents = tmp_path / "agents"
    for _ in range(2):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            env={**_env(agents), "FIELD_URL": field_process.url},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
        assert process.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        assert len(lines) == 2, lines  # one conflict resolved per run: its own
        assert re.fullmatch(r"conflict\.detected: resolved, mem-\w+ stands", lines[0]), lines
        assert lines[1] == "The EU market for SMB HR software grows 23% a year."
