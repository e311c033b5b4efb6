"""Every example in the SDK's docstrings runs, as a newcomer would run it, against a live Field.

The examples are the ``.. code-block:: python`` blocks of every docstring in
``field/client`` (module, class, function and method). Each is a complete
program: it names the Field at ``http://127.0.0.1:8765``, which the test
replaces with the URL of a real server it starts, and runs in a fresh
interpreter (a subprocess, in a directory of its own for the token and cursor
files it keeps). Each runs twice, as a user runs a program again: both runs
must end, exit 0 and print what the example promises (``PROMISES``). A literal
block that names no language (a bare ``::``) is refused, so an example cannot
slip past the runner by being written the other way.
"""

from __future__ import annotations

import ast
import asyncio
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import ThreadedServer

CLIENT = Path(__file__).resolve().parent.parent / "field" / "client"
#: The URL every example names (field serve's default).
URL = "http://127.0.0.1:8765"
#: Failure guard for one run of an example (never a pacing delay).
TIMEOUT = 60.0
_DIRECTIVE = re.compile(r"^(\s*)\.\. code-block::\s*(\S+)\s*$")


@dataclass(frozen=True)
class Block:
    """A literal block of a docstring: where it is, its language, its text."""

    owner: str  # e.g. field.client.agent.AgentClient.notifications
    language: str | None  # None: a bare ``::`` block
    text: str


def _docstrings(path: Path) -> Iterator[tuple[str, str]]:
    """(qualified name, docstring) of the module and each class and function in it."""
    module = "field.client" + ("" if path.stem == "__init__" else f".{path.stem}")
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}.{child.name}"
                doc = ast.get_docstring(child)
                if doc:
                    yield name, doc
                yield from walk(child, name)

    doc = ast.get_docstring(tree)
    if doc:
        yield module, doc
    yield from walk(tree, module)


def _indented_block(lines: list[str], start: int, indent: int) -> str:
    """The block of lines after ``start`` indented deeper than ``indent`` (blank lines
    inside it kept)."""
    body: list[str] = []
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    return textwrap.dedent("\n".join(body)).strip("\n") + "\n"


def _blocks(owner: str, doc: str) -> Iterator[Block]:
    lines = doc.splitlines()
    for number, line in enumerate(lines):
        directive = _DIRECTIVE.match(line)
        if directive:
            indent = len(directive.group(1))
            yield Block(owner, directive.group(2), _indented_block(lines, number, indent))
        elif line.rstrip().endswith("::"):
            indent = len(line) - len(line.lstrip())
            yield Block(owner, None, _indented_block(lines, number, indent))


def literal_blocks() -> list[Block]:
    return [
        block
        for path in sorted(CLIENT.glob("*.py"))
        for owner, doc in _docstrings(path)
        for block in _blocks(owner, doc)
    ]


# -- what each example promises to print, run after run -------------------------------------


def _recorded_then_notified(lines: list[str], run: int) -> None:
    """The unit it recorded (``recorded <id>``) is the one it is notified of: on the second
    run too, so the stream went on after the first run's notification."""
    recorded = [line.split()[1] for line in lines if line.startswith("recorded ")]
    assert len(recorded) == 1, lines
    assert lines[-1] == f"notified memory.recorded {recorded[0]}", lines


def _tour(lines: list[str], run: int) -> None:
    _recorded_then_notified(lines, run)
    attuned = [line for line in lines if line.startswith("attuned ")]
    # each run records one more unit, and the strategist is shown every one so far
    assert len(attuned) == run, lines
    assert all(line.endswith("The EU market size for HR SaaS grows 23% a year") for line in attuned)


def _census(lines: list[str], run: int) -> None:
    assert lines == ["registered: census-01"]


PROMISES: dict[str, Callable[[list[str], int], None]] = {
    "field.client": _tour,
    "field.client.agent.AgentClient.notifications": _recorded_then_notified,
    "field.client.agent.AgentClient.every": _census,
}


def test_every_literal_block_says_its_language_and_every_example_has_a_promise() -> None:
    blocks = literal_blocks()
    bare = [block.owner for block in blocks if block.language is None]
    assert bare == [], (
        "say the language of a literal block: .. code-block:: python (run by this test), "
        f"or text, json: {bare}"
    )
    examples = [block.owner for block in blocks if block.language == "python"]
    assert sorted(examples) == sorted(PROMISES)  # one example per owner, each checked


async def _run(code: str, directory: Path) -> list[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=directory,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"the example did not end within {TIMEOUT:g} s")
    assert process.returncode == 0, err.decode()
    return out.decode().splitlines()


@pytest.mark.parametrize(
    "example",
    [block for block in literal_blocks() if block.language == "python"],
    ids=lambda block: block.owner,
)
async def test_a_docstring_example_runs_against_a_live_field(
    example: Block, server_factory: Callable[..., ThreadedServer], tmp_path: Path
) -> None:
    assert "from field.client import" in example.text  # complete: its imports,
    assert example.text.count(URL) == 1  # and the Field it talks to
    server = server_factory()
    code = example.text.replace(URL, server.url)
    for run in (1, 2):
        PROMISES[example.owner](await _run(code, tmp_path), run)
