"""Configuration from the environment: ``FIELD_IN_MEMORY``, and the ``FIELD_`` names nothing
reads (a misspelt setting is named at start-up instead of being ignored in silence)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from field.cli.main import _config, _parser
from field.server.config import (
    OTHER_VARIABLES,
    Config,
    known_variables,
    setting_names,
    unknown_variables,
)

ROOT = Path(__file__).resolve().parent.parent
#: How this project's code reads a variable: os.environ.get("X"), os.environ["X"],
#: monkeypatch.setenv("X", ...), {"X": ...} handed to a child's environment.
_READ = re.compile(
    r"""(?:environ(?:\.get)?[(\[]\s*|setenv\(\s*|delenv\(\s*|[{,]\s*)["'](FIELD_[A-Z0-9_]+)["']"""
)


# -- FIELD_IN_MEMORY ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_field_in_memory_keeps_the_log_in_memory(value: str) -> None:
    assert Config.from_env({"FIELD_IN_MEMORY": value}).data_dir is None


@pytest.mark.parametrize("value", ["0", "false", "no", "off"])
def test_field_in_memory_off_keeps_the_data_directory(value: str) -> None:
    assert Config.from_env({"FIELD_IN_MEMORY": value}).data_dir == Path("./field-data")


def test_field_in_memory_takes_only_yes_or_no() -> None:
    with pytest.raises(ValueError, match="FIELD_IN_MEMORY must be one of 1, true"):
        Config.from_env({"FIELD_IN_MEMORY": "maybe"})


def test_field_in_memory_wins_over_field_data_dir_and_loses_to_a_flag() -> None:
    both = {"FIELD_IN_MEMORY": "1", "FIELD_DATA_DIR": "elsewhere"}
    assert Config.from_env(both).data_dir is None
    # a flag wins over the environment: --data-dir given keeps the log there
    assert Config.from_env(both, data_dir=Path("given")).data_dir == Path("given")
    # --in-memory wins over FIELD_DATA_DIR and over --data-dir given with it
    elsewhere = {"FIELD_DATA_DIR": "elsewhere"}
    assert Config.from_env(elsewhere, in_memory=True, data_dir=Path("given")).data_dir is None


def test_field_in_memory_reaches_field_serve_as_the_flag_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FIELD_DATA_DIR", raising=False)
    monkeypatch.setenv("FIELD_IN_MEMORY", "1")
    assert _config(_parser().parse_args(["serve"])).data_dir is None
    assert _config(_parser().parse_args(["serve", "--data-dir", "d"])).data_dir == Path("d")
    monkeypatch.delenv("FIELD_IN_MEMORY")
    assert _config(_parser().parse_args(["serve"])).data_dir == Path("./field-data")
    assert _config(_parser().parse_args(["serve", "--in-memory"])).data_dir is None


# -- unknown FIELD_ variables ---------------------------------------------------------------


def test_no_setting_and_no_variable_read_elsewhere_is_unknown() -> None:
    names = [f"FIELD_{name.upper()}" for name in setting_names()] + sorted(OTHER_VARIABLES)
    assert unknown_variables(names) == []
    for name in ("FIELD_PORT", "FIELD_OPERATOR_TOKEN", "FIELD_IN_MEMORY", "FIELD_MAX_BODY_BYTES"):
        assert name in known_variables()


def test_unknown_names_come_sorted_with_the_nearest_known_one() -> None:
    environ = {
        "FIELD_PROT": "9000",
        "FIELD_INMEMORY": "1",
        "FIELD_OPERATOR_TOKEN_FILE": "/run/secrets/operator",
        "FIELD_LOGLEVEL": "debug",
        "FIELD_BANANA": "1",
        "FIELD_PORT": "9000",
        "PATH": "/usr/bin",
        "FIELDS": "x",
    }
    assert unknown_variables(environ) == [
        ("FIELD_BANANA", None),
        ("FIELD_INMEMORY", "FIELD_IN_MEMORY"),
        ("FIELD_LOGLEVEL", "FIELD_LOG_LEVEL"),
        ("FIELD_OPERATOR_TOKEN_FILE", "FIELD_OPERATOR_TOKEN"),
        ("FIELD_PROT", "FIELD_PORT"),
    ]


def test_the_shared_prefix_does_not_make_names_near() -> None:
    """FIELD_FOO and FIELD_LOG share six letters of nine; what follows FIELD_ is compared."""
    assert unknown_variables(["FIELD_FOO", "FIELD_X", "FIELD_"]) == [
        ("FIELD_", None),
        ("FIELD_FOO", None),
        ("FIELD_X", None),
    ]


def test_every_field_variable_this_project_reads_is_known() -> None:
    """The commands, the examples and the tests: none of their variables is warned about."""
    read: dict[str, str] = {}
    for folder in ("field", "examples", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue  # its names are unknown on purpose
            for name in _READ.findall(path.read_text()):
                read.setdefault(name, str(path.relative_to(ROOT)))
    assert {"FIELD_URL", "FIELD_TOKEN", "FIELD_AGENT_DIR", "FIELD_OPERATOR_TOKEN"} <= set(read)
    unknown = {name: where for name, where in read.items() if name not in known_variables()}
    assert unknown == {}


def test_every_flag_of_field_serve_has_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    """What the help's epilog says: --some-name is FIELD_SOME_NAME, but for the token files
    (the variables hold the tokens) and --no-metrics (FIELD_METRICS=0)."""
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--help"])
    flags = set(re.findall(r"^  (--[a-z-]+)", capsys.readouterr().out, re.MULTILINE))
    assert len(flags) > 70
    exceptions = {
        "--operator-token-file": "FIELD_OPERATOR_TOKEN",
        "--metrics-token-file": "FIELD_METRICS_TOKEN",
        "--no-metrics": "FIELD_METRICS",
    }
    for flag in sorted(flags):
        variable = exceptions.get(flag, "FIELD_" + flag[2:].replace("-", "_").upper())
        assert variable in known_variables(), flag
