"""The SDK installs alone: ``pip install akashik-field`` is aiohttp and orjson, and
``field.client`` imports nothing of the server's (``pip install 'akashik-field[server]'``).

The server's packages are read from ``pyproject.toml`` itself (the ``server`` extra), so a
dependency added there is covered here; a fresh interpreter imports the SDK and says which
modules it loaded. ``.ci/run`` also installs the SDK alone in an empty virtualenv.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import field
import field.client

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized (PEP 503)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def _project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        project: dict[str, object] = tomllib.load(file)["project"]
    return project


def test_the_sdk_depends_on_aiohttp_and_orjson_and_the_server_is_an_extra() -> None:
    project = _project()
    dependencies = project["dependencies"]
    assert isinstance(dependencies, list)
    assert sorted(map(_name, dependencies)) == ["aiohttp", "orjson"]
    extras = project["optional-dependencies"]
    assert isinstance(extras, dict)
    server = {_name(requirement) for requirement in extras["server"]}
    assert {"uvicorn", "starlette", "numpy", "google-re2"} <= server
    # the tests, and the server's own features, bring the server with them
    for extra in ("test", "postgres", "wordllama", "minilm", "embeddings"):
        assert "akashik-field[server]" in extras[extra], extra


def test_the_sdk_imports_nothing_of_the_server() -> None:
    extras = _project()["optional-dependencies"]
    assert isinstance(extras, dict)
    server = {_name(requirement) for requirement in extras["server"]}
    modules_of: dict[str, set[str]] = {}
    for module, distributions in importlib.metadata.packages_distributions().items():
        for distribution in distributions:
            modules_of.setdefault(_name(distribution), set()).add(module)
    forbidden = set().union(*(modules_of.get(name, set()) for name in server))
    assert {"uvicorn", "numpy", "re2", "cel"} <= forbidden  # installed here, so looked for
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, field.client; print('\\n'.join(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "aiohttp" in loaded and "orjson" in loaded
    assert sorted({m.partition(".")[0] for m in loaded} & forbidden) == []
    outside = [m for m in loaded if m.startswith("field.") and not m.startswith("field.client")]
    assert outside == []


def test_the_package_says_it_is_typed() -> None:
    """PEP 561: type checkers read the annotations of an installed ``field``."""
    for package in (field, field.client):
        assert (Path(package.__file__).parent / "py.typed").is_file(), package.__name__
