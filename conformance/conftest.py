"""``pytest conformance/ --field-url URL``: one test per check of the suite.

The suite runs once per session (its checks run at once, as ``field conformance`` runs them)
and each test reports its check: pass, skip with the reason, fail for a MUST (or a SHOULD or
extension run with ``--strict-should``), xfail for a SHOULD or extension requirement otherwise. So
pytest exits 0 when every applicable MUST passes, like the command.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the suite from this folder, installed or not

from akashik_conformance import REGISTRY, Report, run  # noqa: E402
from akashik_conformance.cli import restarter  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("akashik conformance")
    group.addoption(
        "--field-url",
        default=os.environ.get("AKASHIK_FIELD_URL"),
        help="the Field's base URL (or set AKASHIK_FIELD_URL)",
    )
    group.addoption(
        "--operator-token",
        default=os.environ.get("AKASHIK_OPERATOR_TOKEN"),
        help="the operator's token (or set AKASHIK_OPERATOR_TOKEN)",
    )
    group.addoption(
        "--restart-command",
        default=os.environ.get("AKASHIK_RESTART_COMMAND"),
        help="a shell command that restarts the Field (or set AKASHIK_RESTART_COMMAND)",
    )
    group.addoption(
        "--strict-should",
        action="store_true",
        help="fail on SHOULD and extension requirements too",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "check_id" in metafunc.fixturenames:
        ids = sorted(REGISTRY, key=lambda i: (REGISTRY[i].level, i))
        metafunc.parametrize("check_id", ids)


@pytest.fixture(scope="session")
def report(pytestconfig: pytest.Config) -> Report:
    url = pytestconfig.getoption("field_url")
    if not url:
        pytest.skip("no Field to check: give --field-url URL or set AKASHIK_FIELD_URL")
    command = pytestconfig.getoption("restart_command")
    return asyncio.run(
        run(
            url,
            operator_token=pytestconfig.getoption("operator_token"),
            restart=restarter(command, url) if command else None,
        )
    )


@pytest.fixture
def strict(pytestconfig: pytest.Config) -> Any:
    return pytestconfig.getoption("strict_should")
