"""The README's Quickstart, pasted as a reader pastes it: into bash, against ``field serve``.

The ```sh blocks of the Quickstart section run as they are written, with
``FIELD`` from the environment (the blocks default it to the port "Run it"
serves on) and the webhook example's placeholder URL swapped for a local
receiver. The Quickstart, the bad request, the webhook and the subscription
are pasted into one shell (the webhook before the subscription, whose
``curl -N`` holds the shell), the "third shell" command into another in the
same directory, which has nothing but the file the first one wrote; and all
of it twice in a row against the same Field. What each prints is checked
against what the README shows: the same fields in the documented responses,
the same frames in the same order on the stream, the same error response.

The other shell examples run the same way, each against a ``field serve`` of
its own, with only the Field's address (``127.0.0.1:8765``, ``localhost:8765``)
and what the reader fills in replaced: the registration tokens' curl commands
(the revoke's ``regtok-…`` is the issued token's id), then REGISTER with the
token, before and after the revoke; the inbound event source's ``field source``
commands (``export FIELD_OPERATOR_TOKEN=...`` the real token, ``gh.secret`` a
file), with a signed GitHub event posted before the source is removed; and the
MCP agents' examples: the REGISTER of "Over HTTP", whose ``mcpServers`` entry
then connects to ``/mcp`` with the token, and the ``field mcp`` entry started as
a host starts it (the ``pip install`` is left out). Where a block shows its
answer in a ``# {...}`` comment, the answer has what it shows.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import re
import shlex
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx2
import orjson
import pytest
from aiohttp import web
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from field.client import FieldClient, FieldClientError

from .conftest import ServerProcess

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parent.parent / "README.md"
#: Failure guard for a shell's run or one line of its output (never a pacing delay).
TIMEOUT = 60.0
#: The webhook example's URL, which the reader replaces with their receiver's.
PLACEHOLDER = "https://hooks.example.com/field"
FINDING = "The European SaaS market for SMB HR tools grows at 23% CAGR."
ANOTHER = "The SMB HR tools market in Germany alone is worth 1.2 billion euros."

SpawnServer = Callable[..., ServerProcess]


def _section(heading: str) -> str:
    """The README's section under ``heading`` ("## Quickstart"), its subsections included: up
    to the next heading of its level or a higher one (a ``#`` line in a fenced block is none)."""
    lines = README.read_text().splitlines(keepends=True)
    start = lines.index(heading + "\n")
    level = heading.index(" ")
    fenced = False
    for end in range(start + 1, len(lines)):
        fenced ^= lines[end].startswith("```")
        found = re.match(r"(#+) ", lines[end])
        if not fenced and found and len(found[1]) <= level:
            break
    else:
        end = len(lines)
    return "".join(lines[start:end])


def _fenced(language: str, heading: str = "## Quickstart") -> list[str]:
    """The fenced blocks in ``language`` ("" for plain ones) of a section, in order."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", _section(heading), re.S | re.M)
    return [text for lang, text in blocks if lang == language]


def _one(blocks: list[str], marker: str) -> str:
    found = [block for block in blocks if marker in block]
    assert len(found) == 1, (marker, found)
    return found[0]


SH = _fenced("sh")
PASTE = _one(SH, '"operation": "REGISTER"')
BAD_REQUEST = _one(SH, '"intent": {"purpose": ""}')
SUBSCRIBE = _one(SH, "curl -sSN")
THIRD_SHELL = _one(SH, ". ./.field-quickstart.env")
WEBHOOK = _one(SH, PLACEHOLDER)
RESPONSES = _one(_fenced("json"), '"status":"registered"')
ERROR = _one(_fenced("json"), "MISSING_INTENT")
FRAMES = _one(_fenced(""), "event: resume")
TOKENS = _one(_fenced("", "### Registration tokens"), "/v1/registration-tokens")
SOURCES = _one(_fenced("", "### Inbound event sources"), "field source add")
MCP_REGISTER = _one(_fenced("sh", "### Over HTTP"), '"operation": "REGISTER"')
MCP_ENTRY = _one(_fenced("json", "### Over HTTP"), '"url"')
MCP_STDIO = _one(_fenced("sh", "## MCP agents"), "field mcp --url")
MCP_STDIO_ENTRY = _one(_fenced("json", "## MCP agents"), '"command": "field"')
#: The operator token of the Fields the Details' examples run against (shell-safe as it is).
OPERATOR_TOKEN = "operator-token-for-the-readme-0123456789"


def _documented(text: str) -> Any:
    """A documented JSON document; ``, ...}`` (fields left out) becomes a ``"..."`` field."""
    return orjson.loads(text.replace(", ...}", ', "...": null}'))


def same_fields(documented: Any, actual: Any, where: str = "$") -> None:
    """``actual`` has the fields ``documented`` shows and no others (at least them where it
    shows ``...``), all the way down; a list is compared by its first item."""
    if isinstance(documented, dict):
        assert isinstance(actual, dict), (where, actual)
        shown = set(documented) - {"..."}
        if "..." in documented:
            assert shown <= set(actual), (where, shown - set(actual))
        else:
            assert shown == set(actual), (where, sorted(shown ^ set(actual)))
        for key in shown:
            same_fields(documented[key], actual[key], f"{where}.{key}")
    elif isinstance(documented, list) and documented:
        assert isinstance(actual, list) and actual, (where, actual)
        same_fields(documented[0], actual[0], f"{where}[0]")


@dataclass
class Frame:
    event: str
    data: dict[str, Any]
    id: str | None


def frames(lines: list[str]) -> list[Frame]:
    """Server-Sent Events from their lines (comments, such as pings, left out)."""
    found: list[Frame] = []
    fields: dict[str, str] = {}
    for line in [*lines, ""]:
        if not line:
            if fields:
                data = orjson.loads(fields["data"])
                found.append(Frame(fields["event"], data, fields.get("id")))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value
    return found


def _marker(name: str) -> str:
    return f"echo '--- {name}'; echo '--- {name}' >&2\n"


def _sections(text: str) -> dict[str, list[str]]:
    """A shell's output split at the markers between the pasted blocks."""
    sections: dict[str, list[str]] = {"paste": []}
    current = sections["paste"]
    for line in text.splitlines():
        if line.startswith("--- "):
            current = sections.setdefault(line[4:], [])
        else:
            current.append(line)
    return sections


class Receiver:
    """A webhook receiver on loopback: each POST's path and JSON body, as they come."""

    def __init__(self) -> None:
        self.posts: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/{hook}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        await self.posts.put((request.path, orjson.loads(await request.read())))
        return web.Response()

    async def notification_of(self, path: str, unit_id: str) -> dict[str, Any]:
        while True:
            at, body = await asyncio.wait_for(self.posts.get(), TIMEOUT)
            if at == path and body.get("memory_unit_id") == unit_id:
                return body


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    started = await Receiver().start()
    yield started
    await started.stop()


class Shell:
    """``bash`` reading what is pasted into it, in its own process group."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        assert process.stdout is not None and process.stderr is not None
        self.stdout = process.stdout
        self.stderr = asyncio.ensure_future(process.stderr.read())

    @classmethod
    async def paste(cls, text: str, *, home: Path, env: dict[str, str]) -> Shell:
        process = await asyncio.create_subprocess_exec(
            "bash",
            cwd=home,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert process.stdin is not None
        process.stdin.write(text.encode())
        await process.stdin.drain()
        process.stdin.close()
        return cls(process)

    async def line(self) -> str:
        raw = await asyncio.wait_for(self.stdout.readline(), TIMEOUT)
        if not raw:
            err = await asyncio.wait_for(self.stderr, TIMEOUT)
            pytest.fail(f"the shell ended; it said:\n{err.decode()}")
        return raw.decode().rstrip("\r\n")  # the stream's lines end in CRLF

    async def lines_until(self, done: Callable[[list[str]], bool]) -> list[str]:
        lines: list[str] = []
        while not done(lines):
            lines.append(await self.line())
        return lines

    async def stop(self) -> tuple[str, str]:
        """End the shell and what it runs (the ``curl -N``); the rest of its output."""
        if self.process.returncode is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        out = await asyncio.wait_for(self.stdout.read(), TIMEOUT)
        err = await asyncio.wait_for(self.stderr, TIMEOUT)
        await self.process.wait()
        return out.decode(), err.decode()


def _ends_with_frame(event: str) -> Callable[[list[str]], bool]:
    """Whether the lines so far end with a whole frame of ``event`` (and its blank line)."""
    return lambda lines: len(lines) >= 3 and lines[-1] == "" and f"event: {event}" in lines[-3:-1]


async def third_shell(home: Path) -> dict[str, Any]:
    """The README's "third shell": a new bash in the same directory, with none of the first
    shell's variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("FIELD", "RUN", "R_TOKEN")}
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        THIRD_SHELL,
        cwd=home,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 0 and err == b"", (out, err)
    (line,) = out.decode().splitlines()
    recorded: dict[str, Any] = orjson.loads(line)
    return recorded


async def paste_everything(url: str, receiver: Receiver, home: Path, hook: str) -> dict[str, Any]:
    """One reader's pastes: the Quickstart, the bad request, a webhook, then the
    subscription, whose stream gets the finding recorded from a third shell. Returns what
    was registered and recorded."""
    script = "".join(
        [
            PASTE,
            _marker("bad request"),
            BAD_REQUEST,
            _marker("webhook"),
            WEBHOOK.replace(PLACEHOLDER, f"{receiver.url}/{hook}"),
            _marker("subscribe"),
            SUBSCRIBE,
        ]
    )
    shell = await Shell.paste(script, home=home, env={**os.environ, "FIELD": url})
    try:
        before = await shell.lines_until(lambda lines: lines[-1:] == ["--- subscribe"])
        opened = await shell.lines_until(_ends_with_frame("live"))
        recorded = await third_shell(home)
        arrived = await shell.lines_until(_ends_with_frame("memory.recorded"))
        pushed = await receiver.notification_of(f"/{hook}", recorded["memory_unit_id"])
    finally:
        rest, err = await shell.stop()
    assert "Traceback" not in err, err
    out = _sections("\n".join(before))
    said = _sections(err)
    assert set(said) == {"paste", "bad request", "webhook", "subscribe"}, err
    assert said["bad request"] == said["webhook"] == [], err

    # the Quickstart: two registrations (shown), the finding accepted, the strategist attuned
    registered = [orjson.loads(line) for line in said["paste"]]
    assert [r["status"] for r in registered] == ["registered", "registered"], said["paste"]
    researcher, strategist = (r["agent"]["id"] for r in registered)
    run = researcher.removeprefix("researcher-")
    assert run.isdigit() and strategist == f"strategist-{run}", (researcher, strategist)
    accepted, attuned = (orjson.loads(line) for line in out["paste"])
    assert accepted["status"] == "accepted" and accepted["conflicts_detected"] == []
    assert attuned["status"] == "ok"
    units = {s["memory_unit"]["id"]: s["memory_unit"] for s in attuned["record"]}
    assert units[accepted["memory_unit_id"]]["content"] == FINDING
    assert units[accepted["memory_unit_id"]]["source"]["agent_id"] == researcher
    documented = [_documented(text) for text in RESPONSES.strip().split("\n\n")]
    for shown, actual in zip(documented, [registered[0], accepted, attuned], strict=True):
        same_fields(shown, actual)

    # the bad request: the error response the README shows, and its status
    error_text, status = ERROR.strip().rsplit("\n", 1)
    assert [orjson.loads(out["bad request"][0]), out["bad request"][1]] == [
        orjson.loads(error_text),
        status,
    ]
    assert status == "HTTP 422" and len(out["bad request"]) == 2

    # the webhook: created, with its secret, and POSTed the third shell's finding
    (line,) = out["webhook"]
    hooked = orjson.loads(line)
    assert hooked["status"] == "ok", hooked
    assert hooked["subscription"]["delivery"]["secret"].startswith("whsec_"), hooked
    assert pushed["subscription_id"] == hooked["subscription_id"]

    # the stream: the frames the README shows, in its order, with the third shell's finding
    (subscribed,) = (orjson.loads(line) for line in said["subscribe"])
    assert out["subscribe"] == [] and rest == "", (out["subscribe"], rest)
    assert recorded["status"] == "accepted"
    seen = frames(opened + arrived)
    shown_frames = frames(FRAMES.splitlines())
    assert [(f.event, f.id is None) for f in seen] == [
        (f.event, f.id is None) for f in shown_frames
    ]
    for shown_frame, frame in zip(shown_frames, seen, strict=True):
        same_fields(shown_frame.data, frame.data, frame.event)
    resume, live, notification = seen
    sub = subscribed["subscription_id"]
    assert resume.data["recovered"] is True and resume.data["subscription_id"] == sub
    assert live.data == {"subscription_id": sub, "replayed": 0, "cursor": resume.data["from"]}
    assert notification.data["memory_unit_id"] == recorded["memory_unit_id"]
    assert notification.data["agent_id"] == researcher
    assert notification.data["summary"] == f"finding from {researcher}: {ANOTHER}"
    assert notification.id == notification.data["cursor"]

    kept = (home / ".field-quickstart.env").read_text()
    assert kept == f"FIELD={url} RUN={run} R_TOKEN={registered[0]['token']}\n"
    return {"run": run, "finding": accepted["memory_unit_id"], "attuned": set(units)}


async def test_the_quickstart_pasted_twice_registers_records_attunes_and_pushes(
    server_process: SpawnServer, receiver: Receiver, tmp_path: Path
) -> None:
    field = server_process(tmp_path / "field-data", "--webhook-allow-net", "127.0.0.0/8")
    home = tmp_path / "shell"
    home.mkdir()
    first = await paste_everything(field.url, receiver, home, "first")
    second = await paste_everything(field.url, receiver, home, "second")
    assert first["run"] != second["run"]
    # a later paste's strategist attunes to the earlier paste's finding too
    assert {first["finding"], second["finding"]} <= second["attuned"]


async def test_a_paste_the_field_refuses_shows_its_error_and_stops(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    operator = tmp_path / "operator.token"
    operator.write_text("operator-token-0123456789")
    field = server_process(
        tmp_path / "field-data", "--registration", "closed", "--operator-token-file", str(operator)
    )
    shell = await Shell.paste(PASTE, home=tmp_path, env={**os.environ, "FIELD": field.url})
    status = await asyncio.wait_for(shell.process.wait(), TIMEOUT)
    out, err = await shell.stop()
    assert status != 0
    assert out == ""  # nothing after the refused registration ran
    (line,) = err.splitlines()  # the Field's error response, and nothing else
    error = orjson.loads(line)
    assert error["code"] == "REGISTRATION_CLOSED" and error["operation"] == "REGISTER", error
    assert error["message"] and error["suggested_action"], error


# The Details' examples and the MCP agents', run as written against field serve: only the
# Field's address (127.0.0.1:8765, localhost:8765) and the placeholders the reader fills in
# are replaced.


def _served_at(text: str, url: str) -> str:
    """``text`` with the README's address of the Field, ``http://127.0.0.1:8765`` or
    ``localhost:8765``, made ``url``'s (``localhost`` stays, with ``url``'s port)."""
    moved = text.replace("http://127.0.0.1:8765", url)
    moved = moved.replace("localhost:8765", f"localhost:{urlsplit(url).port}")
    assert moved != text, text
    return moved


def _shell_env(**values: str) -> dict[str, str]:
    """A reader's environment: the virtualenv's commands (``field``) on ``PATH``, and no
    ``FIELD_`` variable but ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIELD_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **values}


async def pasted(text: str, *, home: Path, env: dict[str, str]) -> str:
    """What ``text``, pasted into a new bash in ``home``, prints; it must end well and say
    nothing on stderr."""
    shell = await Shell.paste(text, home=home, env=env)
    out = await asyncio.wait_for(shell.stdout.read(), TIMEOUT)
    err = await asyncio.wait_for(shell.stderr, TIMEOUT)
    status = await asyncio.wait_for(shell.process.wait(), TIMEOUT)
    assert (status, err) == (0, b""), (status, out, err)
    return out.decode()


def _documents(text: str) -> list[Any]:
    """The JSON documents printed one after another (``curl -s`` ends none with a newline)."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    at, text = 0, text.strip()
    while at < len(text):
        document, at = decoder.raw_decode(text, at)
        found.append(document)
        while text[at : at + 1].isspace():
            at += 1
    return found


def _shown_output(block: str) -> Any:
    """The answer a block shows in its ``# {...}`` comment line; a ``…`` in place of fields
    becomes a ``"…"`` field."""
    (line,) = [line for line in block.splitlines() if line.startswith("# {")]
    return orjson.loads(re.sub(r",…(?=[,}])", ',"…":null', line.removeprefix("# ")))


def shown_as(shown: Any, actual: Any, where: str = "$") -> None:
    """``actual`` is what ``shown`` shows: the same fields (at least them where it has a
    ``"…"`` field), where a string ends in ``…`` a longer one starting the same, and else the
    same values, all the way down."""
    if isinstance(shown, dict):
        assert isinstance(actual, dict), (where, actual)
        fields = set(shown) - {"…"}
        if "…" in shown:
            assert fields <= set(actual), (where, sorted(fields - set(actual)))
        else:
            assert fields == set(actual), (where, sorted(fields ^ set(actual)))
        for key in fields:
            shown_as(shown[key], actual[key], f"{where}.{key}")
    elif isinstance(shown, str) and shown.endswith("…"):
        start = shown.removesuffix("…")
        assert isinstance(actual, str) and actual.startswith(start), (where, actual)
        assert len(actual) > len(start), (where, actual)
    else:
        assert actual == shown, (where, actual)


def _operator_token(tmp_path: Path) -> str:
    """A file holding the operator token, for field serve's --operator-token-file."""
    path = tmp_path / "operator.token"
    path.write_text(OPERATOR_TOKEN)
    return str(path)


async def test_registration_tokens_are_issued_listed_and_revoked_as_the_readme_shows(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    field = server_process(
        tmp_path / "field-data",
        "--registration",
        "token",
        "--operator-token-file",
        _operator_token(tmp_path),
    )
    home = tmp_path / "shell"
    home.mkdir()
    env = _shell_env(FIELD_OPERATOR_TOKEN=OPERATOR_TOKEN)
    # the issue, the answer it shows (a comment to bash) and the list; the revoke comes later,
    # with the id the issue answered in place of the README's regtok-…
    head, revoke = _served_at(TOKENS, field.url).rstrip("\n").rsplit("\n", 1)
    assert revoke.startswith("curl -s -X DELETE ") and revoke.count("regtok-…") == 1, revoke
    issued, listed = _documents(await pasted(head + "\n", home=home, env=env))
    shown_as(_shown_output(TOKENS), issued)
    token = issued["registration_token"]
    assert token["note"] == "pilot" and token["expires_at"] == "2030-01-01T00:00:00.000Z"
    assert listed["status"] == "ok" and listed["registration"] == "token", listed
    # listed as issued, but for the secret, which is shown once
    assert listed["registration_tokens"] == [{k: v for k, v in token.items() if k != "token"}]

    async with FieldClient(field.url) as client:
        pilot = await client.register("pilot-1", "analyst", registration_token=token["token"])
        assert pilot.registration is not None and pilot.registration["status"] == "registered"
        revoked = await pasted(revoke.replace("regtok-…", token["id"]) + "\n", home=home, env=env)
        (answer,) = _documents(revoked)
        assert (answer["status"], answer["id"]) == ("ok", token["id"]), answer
        with pytest.raises(FieldClientError) as refused:
            await client.register("pilot-2", "analyst", registration_token=token["token"])
    assert refused.value.code == "REGISTRATION_TOKEN_INVALID", refused.value.body


#: A pull request opened, as GitHub posts it (the fields the source's template reads).
PULL_REQUEST = {
    "action": "opened",
    "number": 7,
    "pull_request": {"title": "Retry a failed webhook once"},
    "repository": {"full_name": "acme/widgets"},
}


async def github_posts(
    http: aiohttp.ClientSession, url: str, event: dict[str, Any], secret: str
) -> tuple[int, dict[str, Any]]:
    """GitHub's POST of a ``pull_request`` event, its body signed with ``secret``: the status
    and the Field's answer."""
    body = orjson.dumps(event)
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "pull_request",
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": f"sha256={signature}",
    }
    async with http.post(url, data=body, headers=headers) as response:
        return response.status, await response.json()


async def test_a_github_source_is_added_listed_fed_and_removed_as_the_readme_shows(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    field = server_process(
        tmp_path / "field-data", "--operator-token-file", _operator_token(tmp_path)
    )
    home = tmp_path / "shell"
    home.mkdir()
    secret = "a secret shared with GitHub"
    (home / "gh.secret").write_text(secret + "\n")
    placeholder = "export FIELD_OPERATOR_TOKEN=..."
    assert SOURCES.count(placeholder) == 1, SOURCES
    block = SOURCES.replace(placeholder, f"export FIELD_OPERATOR_TOKEN={OPERATOR_TOKEN}")
    block = _served_at(block, field.url)
    export, add, listing, remove = block.replace("\\\n", "").splitlines()
    assert add.startswith("field source add github ") and listing.startswith("field source list")
    assert remove.startswith("field source remove github "), remove
    env = _shell_env()  # the operator token is the block's export, and nothing else

    # the block but its last line: the source added, then listed
    head = block.rstrip("\n").rsplit("\n", 1)[0] + "\n"
    added, listed = _documents(await pasted(head, home=home, env=env))
    events = f"{field.url}/v1/sources/github/events"  # where the README says GitHub posts
    source = added["source"]
    assert added["status"] == "ok" and source["events_url"] == events, added
    assert (source["name"], source["scheme"]) == ("github", "github") and "secret" not in source
    assert source["filter"] == "payload.action == 'opened'"
    assert source["unit"]["type"] == "observation"
    (shown,) = listed["sources"]
    assert shown["name"] == "github", listed
    assert shown["counts"] == {"accepted": 0, "filtered": 0, "refused": 0}

    async with aiohttp.ClientSession() as http, FieldClient(field.url) as client:
        status, accepted = await github_posts(http, events, PULL_REQUEST, secret)
        assert (status, accepted["status"]) == (200, "accepted"), accepted
        closed = {**PULL_REQUEST, "action": "closed"}
        assert await github_posts(http, events, closed, secret) == (200, {"status": "filtered"})
        reviewer = await client.register("reviewer", "code_reviewer", interests=["pull requests"])
        attuned = await reviewer.attune(max_units=10)
        (unit,) = (r["memory_unit"] for r in attuned["record"])
        assert unit["id"] == accepted["memory_unit_id"]
        assert unit["content"] == "PR #7 Retry a failed webhook once in acme/widgets"
        assert (unit["type"], unit["source"]["agent_id"]) == ("observation", "source:github")

        (recounted,) = _documents(await pasted(f"{export}\n{listing}\n", home=home, env=env))
        (counted,) = recounted["sources"]
        assert counted["counts"] == {"accepted": 1, "filtered": 1, "refused": 0}, counted
        (removed,) = _documents(await pasted(f"{export}\n{remove}\n", home=home, env=env))
        assert (removed["status"], removed["name"]) == ("ok", "github"), removed
        status, gone = await github_posts(http, events, PULL_REQUEST, secret)
        assert (status, gone["code"]) == (404, "SOURCE_NOT_FOUND"), gone


def _tools_of_field_mcp() -> set[str]:
    """The tools the README names for ``field mcp``."""
    named = re.search(r"Its tools are (.*?)\. ", _section("## MCP agents"), re.S)
    assert named is not None
    return set(re.findall(r"`(akashik_\w+)`", named[1]))


async def test_an_mcp_host_connects_over_http_as_the_readme_shows(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    field = server_process(tmp_path / "field-data")
    out = await pasted(_served_at(MCP_REGISTER, field.url), home=tmp_path, env=_shell_env())
    (registered,) = _documents(out)
    shown_as(_shown_output(MCP_REGISTER), registered)

    # the mcpServers entry, as a host reads it: /mcp, the agent's token in a header
    (entry,) = orjson.loads(MCP_ENTRY)["mcpServers"].values()
    assert entry["type"] == "http" and entry["url"] == "http://127.0.0.1:8765/mcp", entry
    assert entry["headers"] == {"Authorization": "Bearer <the agent's token>"}, entry
    headers = {
        name: value.replace("<the agent's token>", registered["token"])
        for name, value in entry["headers"].items()
    }
    async with (
        httpx2.AsyncClient(headers=headers, timeout=TIMEOUT) as http,
        streamable_http_client(_served_at(entry["url"], field.url), http_client=http) as (
            read,
            write,
        ),
        ClientSession(read, write) as session,
    ):
        await asyncio.wait_for(session.initialize(), TIMEOUT)
        tools = await asyncio.wait_for(session.list_tools(), TIMEOUT)
        agent = await asyncio.wait_for(session.read_resource("field://agent"), TIMEOUT)
    # those of field mcp but akashik_register, plus akashik_subscribe
    expected = _tools_of_field_mcp() - {"akashik_register"} | {"akashik_subscribe"}
    assert {tool.name for tool in tools.tools} == expected
    (contents,) = agent.contents  # the session is the agent the token names
    assert isinstance(contents, types.TextResourceContents), contents
    assert orjson.loads(contents.text)["agent"]["id"] == registered["agent"]["id"] == "claude"


async def test_an_mcp_host_starts_field_mcp_as_the_readme_shows(
    server_process: SpawnServer, tmp_path: Path
) -> None:
    field = server_process(tmp_path / "field-data")
    (launch,) = (line for line in MCP_STDIO.splitlines() if line.startswith("field mcp"))
    (entry,) = orjson.loads(MCP_STDIO_ENTRY)["mcpServers"].values()
    assert [entry["command"], *entry["args"]] == shlex.split(launch), (entry, launch)
    params = StdioServerParameters(
        command=entry["command"],
        args=[_served_at(arg, field.url) if "8765" in arg else arg for arg in entry["args"]],
        env=_shell_env(),
    )
    with (tmp_path / "field-mcp.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await asyncio.wait_for(session.initialize(), TIMEOUT)
            tools = await asyncio.wait_for(session.list_tools(), TIMEOUT)
    assert {tool.name for tool in tools.tools} == _tools_of_field_mcp()
