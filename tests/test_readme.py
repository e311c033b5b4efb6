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
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

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


def _quickstart() -> str:
    readme = README.read_text()
    start = readme.index("\n## Quickstart\n")
    return readme[start : readme.index("\n## ", start + 1)]


def _fenced(language: str) -> list[str]:
    """The Quickstart's fenced blocks in ``language`` ("" for plain ones), in order."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", _quickstart(), re.S | re.M)
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
