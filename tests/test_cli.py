"""The first hour of ``field serve``: its help, what it says once it listens, the notes and
warnings it gives, its errors for a database it cannot open, and the commands that run
without the server's dependencies installed.

The process tests start ``python -m field`` and read its stderr line by line until the
line they wait for (a watchdog kills a process that never prints it).
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from field.cli.main import _parser, ready_lines
from field.server.config import Config

#: Longest a process may take to print what a test waits for.
WATCHDOG_SECONDS = 60.0
#: The server's dependencies that a client-only install lacks (import names).
SERVER_PACKAGES = (
    "uvicorn",
    "starlette",
    "sse_starlette",
    "websockets",
    "numpy",
    "cryptography",
    "cel",
    "re2",
    "prometheus_client",
    "psycopg",
)
#: A variable no setting reads (FIELD_PORT misspelt).
MISSPELT = "FIELD_PROT"
_STAMP = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<logger>\S+): (?P<message>.*)$")


# -- the help ---------------------------------------------------------------------------------


def _serve_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        _parser().parse_args(["serve", "--help"])
    assert stopped.value.code == 0
    return capsys.readouterr().out


def _sections(text: str) -> dict[str, str]:
    """The help's sections by title (``network:`` ...), each with its text."""
    parts = re.split(r"^(\S[^\n]*):\n", text, flags=re.MULTILINE)
    return {title: body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


GROUPS = {
    "network": ["--host", "--port", "--allowed-host", "--cors-origin", "--max-connections",
                "--header-timeout", "--idle-timeout", "--ws-deflate", "--ws-ping-interval"],
    "storage and cluster": ["--data-dir", "--in-memory", "--sync", "--log",
                            "--cluster-interval", "--node-id", "--snapshot-entries",
                            "--webhook-key-file"],
    "the Field": ["--operator-token-file", "--embedder", "--source-tolerance"],
    "logging and metrics": ["--log-level", "--log-format", "--access-log", "--no-metrics",
                            "--metrics-token-file"],
    "limits": ["--max-body-bytes", "--max-queue", "--overload-write-target", "--agent-rate",
               "--agent-burst", "--notify-rate"],
    "registration": ["--registration", "--max-agents", "--register-rate"],
    "push and delivery": ["--outbox-frames", "--outbox-bytes", "--max-push-per-agent",
                          "--failure-grace", "--heartbeat-timeout", "--max-subscription-timeout",
                          "--filter-share", "--filter-burst", "--mcp-max-sessions"],
    "webhook and RAP delivery": ["--webhook-allow-net", "--webhook-timeout", "--delivery-rate",
                                 "--rap-max-invocations"],
}  # fmt: skip


def test_serve_help_groups_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    text = _serve_help(capsys)
    sections = _sections(text)
    assert list(sections) == ["options", *GROUPS, "environment"], list(sections)
    flags_in = {
        title: set(re.findall(r"^  (--[a-z-]+)", body, re.MULTILINE))
        for title, body in sections.items()
    }
    for title, flags in GROUPS.items():
        assert set(flags) <= flags_in[title], (title, set(flags) - flags_in[title])
    assert flags_in["options"] == set()  # only -h: every flag is in a group
    assert text.startswith("usage: field serve [options]\n")
    assert "--idle-timeout SECONDS" in text and "--max-queue N" in text


def test_serve_help_states_the_environment_rule(capsys: pytest.CaptureFixture[str]) -> None:
    epilog = " ".join(_sections(_serve_help(capsys))["environment"].split())
    for said in (
        "Every flag --some-name can be set as the variable FIELD_SOME_NAME",
        "A flag wins over the environment, the environment over the default.",
        "1, true, yes or on, and 0, false, no or off",
        "separated by commas or spaces",
        "FIELD_OPERATOR_TOKEN and FIELD_METRICS_TOKEN hold the tokens themselves",
    ):
        assert said in epilog


# -- what it says once it listens -------------------------------------------------------------


def test_the_ready_lines_of_a_default_server(tmp_path: Path) -> None:
    lines = ready_lines(Config(data_dir=tmp_path / "data", port=8765))
    assert lines[0] == "Field ready at http://127.0.0.1:8765"
    assert "  console:  http://127.0.0.1:8765/console (GET / leads there)" in lines
    assert "  API:      http://127.0.0.1:8765/openapi.json (OpenAPI 3.1)" in lines
    assert f"  log:      SQLite, in {(tmp_path / 'data').resolve()}" in lines
    (metrics,) = (line for line in lines if line.startswith("  metrics:"))
    assert "http://127.0.0.1:8765/metrics, open to whoever reaches the port" in metrics
    (operator,) = (line for line in lines if line.startswith("  operator:"))
    assert "none:" in operator and "MERGE" in operator
    assert "--operator-token-file FILE or FIELD_OPERATOR_TOKEN" in operator
    assert not any("MCP" in line for line in lines)


def test_the_ready_lines_name_a_database_without_its_credentials() -> None:
    config = Config(log="postgresql://alice:s3cret@db.example.com:6432/field", port=9000)
    text = "\n".join(ready_lines(config))
    assert "  log:      PostgreSQL, postgresql://db.example.com:6432/field" in text
    assert "alice" not in text and "s3cret" not in text


def test_the_ready_lines_of_a_configured_server() -> None:
    config = Config(
        host="0.0.0.0",
        port=9000,
        data_dir=None,
        operator_token="o" * 16,
        metrics_token="m" * 16,
    )
    lines = ready_lines(config, mcp=True)
    assert lines[0] == "Field ready at http://127.0.0.1:9000 (bound to 0.0.0.0: every interface)"
    assert "  MCP:      http://127.0.0.1:9000/mcp (Streamable HTTP)" in lines
    assert "  metrics:  http://127.0.0.1:9000/metrics, with the metrics token (bearer)" in lines
    assert "  log:      in memory: nothing survives a restart (--data-dir DIR keeps it)" in lines
    assert "  operator: token set: the operator acts at authority 10" in lines
    assert "o" * 16 not in "".join(lines) and "m" * 16 not in "".join(lines)
    off = ready_lines(Config(host="::", port=9000, metrics=False))
    assert off[0] == "Field ready at http://[::1]:9000 (bound to ::: every interface)"
    assert "  metrics:  off (--no-metrics)" in off


@dataclass
class Running:
    """A ``field`` process and the stderr lines read so far."""

    process: subprocess.Popen[str]
    lines: list[str]

    def read_until(self, wanted: str) -> str:
        """The next line holding ``wanted``; AssertionError if the process ends first."""
        assert self.process.stderr is not None
        watchdog = threading.Timer(WATCHDOG_SECONDS, self.process.kill)
        watchdog.start()
        try:
            for line in self.process.stderr:
                self.lines.append(line.rstrip("\n"))
                if wanted in line:
                    return self.lines[-1]
        finally:
            watchdog.cancel()
        raise AssertionError(f"no line with {wanted!r}:\n" + "\n".join(self.lines))

    def stop(self) -> int:
        """SIGINT, then the rest of stderr and the exit status."""
        self.process.send_signal(signal.SIGINT)
        _, rest = self.process.communicate(timeout=30)
        self.lines.extend(rest.splitlines())
        return self.process.returncode


@pytest.fixture
def field_command(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    """Start ``python -m field <args>`` in ``tmp_path``; killed after the test if still up."""
    started: list[Running] = []

    def start(
        *args: str,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> Running:
        environ = {
            **{k: v for k, v in os.environ.items() if not k.startswith("FIELD_")},
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "field", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=environ,
            cwd=tmp_path,
            preexec_fn=preexec_fn,
        )
        started.append(Running(process, []))
        return started[-1]

    yield start
    for running in started:
        if running.process.poll() is None:
            running.process.kill()
        running.process.communicate(timeout=30)  # and its pipe closed


def _record(line: str) -> tuple[str, str, str]:
    match = _STAMP.match(line)
    assert match, line
    return match["level"], match["logger"], match["message"]


@pytest.mark.slow
def test_serve_says_where_everything_is_once_it_listens(
    field_command: Callable[..., Running], tmp_path: Path
) -> None:
    running = field_command("serve", "--port", "0", "--data-dir", "data", env={MISSPELT: "9000"})
    first = running.read_until("ready at")
    running.read_until("  operator:")
    url = re.search(r"ready at (http://127\.0\.0\.1:\d+)$", first)
    assert url, first
    base = url.group(1)
    records = [_record(line) for line in running.lines]
    # the first line is the warning about the variable nothing reads, no note before it
    assert records[0] == (
        "WARNING",
        "field",
        "FIELD_PROT is set but no setting reads it: ignored (did you mean FIELD_PORT?)",
    )
    listening = next(i for i, r in enumerate(records) if "listening on" in r[2])
    ready = next(i for i, r in enumerate(records) if r[2].startswith("Field ready at"))
    assert listening == 1 and ready == 2  # no note before them: uvicorn's, the deliveries'
    block = [message for level, logger, message in records[ready:] if logger == "field"]
    assert all(level == "INFO" for level, logger, _ in records[ready:] if logger == "field")
    assert block[1] == f"  console:  {base}/console (GET / leads there)"
    assert f"  API:      {base}/openapi.json (OpenAPI 3.1)" in block
    assert f"  log:      SQLite, in {(tmp_path / 'data').resolve()}" in block
    assert any(line.startswith(f"  metrics:  {base}/metrics, open") for line in block)
    assert block[-1].startswith("  operator: none: ")
    # the server already takes connections when it says so: the console it names answers
    with urllib.request.urlopen(f"{base}/console", timeout=10) as console:
        assert console.status == 200
    with urllib.request.urlopen(f"{base}/", timeout=10) as root:  # redirected
        assert root.url == f"{base}/console"
    assert running.stop() == 0
    assert not any("Traceback" in line for line in running.lines)
    assert not any(logger == "uvicorn.error" for _, logger, _ in map(_record, running.lines))


@pytest.mark.slow
def test_field_in_memory_serves_from_memory(
    field_command: Callable[..., Running], tmp_path: Path
) -> None:
    running = field_command("serve", "--port", "0", env={"FIELD_IN_MEMORY": "1"})
    running.read_until("  operator:")
    said = "\n".join(running.lines)
    assert "  log:      in memory: nothing survives a restart (--data-dir DIR keeps it)" in said
    base = re.search(r"Field ready at (http://\S+)", said)
    assert base
    status_url = base.group(1) + "/v1/field/status"
    with urllib.request.urlopen(status_url, timeout=10) as answer:
        assert b'"backend":"memory"' in answer.read()
    assert running.stop() == 0
    assert list(tmp_path.iterdir()) == []  # no ./field-data
    assert not any("WARNING" in line for line in running.lines)  # FIELD_IN_MEMORY is known


def _fewer_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))


@pytest.mark.slow
def test_the_open_file_limit_is_a_note_below_the_default_and_a_warning_below_a_request(
    field_command: Callable[..., Running],
) -> None:
    quiet = field_command("serve", "--port", "0", "--in-memory", preexec_fn=_fewer_open_files)
    quiet.read_until("  operator:")
    assert quiet.stop() == 0
    assert not any("open-file limit" in line for line in quiet.lines)
    debug = field_command(
        "serve", "--port", "0", "--in-memory", "--log-level", "debug", preexec_fn=_fewer_open_files
    )
    note = debug.read_until("open-file limit is 4096")
    assert _record(note) == (
        "DEBUG",
        "field",
        "at most 2048 connections, not 50000: the open-file limit is 4096",
    )
    debug.process.kill()
    asked = field_command(
        "serve", "--port", "0", "--in-memory", "--max-connections", "3000",
        preexec_fn=_fewer_open_files,
    )  # fmt: skip
    warning = asked.read_until("open-file limit")
    assert _record(warning) == (
        "WARNING",
        "field",
        "at most 2048 connections, not 3000: the open-file limit is 4096",
    )
    assert asked.lines[0] == warning  # nothing before it


# -- a database it cannot open ------------------------------------------------------------------

SECRET_URL = "postgresql://alice:s3cret@db.example.com:6432/field"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FIELD_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env=environ,
    )


@pytest.mark.slow
def test_without_the_driver_the_error_names_the_database_and_the_install(tmp_path: Path) -> None:
    done = _python(
        "import sys; sys.modules['psycopg'] = None\n"
        "from field.cli.main import main\n"
        f"sys.exit(main(['serve', '--port', '0', '--log', {SECRET_URL!r}]))",
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if " ERROR " in line]
    level, logger, message = _record(error)
    assert message == (
        "Cannot open the event log postgresql://db.example.com:6432/field: a PostgreSQL log "
        "needs the psycopg driver, which is not installed. Install the postgres extra: "
        "pip install 'akashik-field[postgres]'"
    )
    assert "alice" not in done.stderr and "s3cret" not in done.stderr
    assert "None" not in done.stderr


@pytest.mark.slow
def test_a_refused_connection_names_the_host_without_credentials(
    field_command: Callable[..., Running],
) -> None:
    pytest.importorskip("psycopg", reason="SKIPPED: psycopg missing")
    running = field_command(
        "serve", "--port", "0", "--log", "postgresql://alice:s3cret@127.0.0.1:1/field"
    )
    error = running.read_until(" ERROR ")
    assert running.process.wait(timeout=30) == 2
    message = _record(error)[2]
    assert message.startswith("Cannot open the event log postgresql://127.0.0.1:1/field: ")
    assert re.search(r"refused\. Check that the database server runs", message, re.IGNORECASE)
    assert message.endswith("may create tables in it.")
    assert "alice" not in message and "s3cret" not in message


# -- without the server's dependencies ------------------------------------------------------


def _blocked(*names: str) -> str:
    """Code that makes importing ``names`` fail, as in an install without them."""
    return f"import sys\nfor name in {names!r}:\n    sys.modules[name] = None\n"


def _run_field(code_before: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _python(
        f"{code_before}from field.cli.main import main\nsys.exit(main({argv!r}))",
        cwd,
    )


@pytest.mark.slow
@pytest.mark.parametrize(("missing", "command"), [("uvicorn", "serve"), ("numpy", "snapshot")])
def test_a_server_command_without_the_server_says_what_to_install(
    tmp_path: Path, missing: str, command: str
) -> None:
    argv = [command, "--port", "0"] if command == "serve" else [command]
    done = _run_field(_blocked(missing), argv, tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        f"field {command} needs the server's dependencies: pip install 'akashik-field[server]' "
        f"(missing: {missing})\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing was started, nothing made


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"], ["mcp", "--help"], ["source", "list", "--help"]]
)
def test_the_client_side_commands_need_none_of_the_server(tmp_path: Path, argv: list[str]) -> None:
    check = (
        "import atexit\n"
        "atexit.register(lambda: print(sorted(m for m in sys.modules if m.startswith("
        "('field.transports', 'field.engine', 'field.core', 'field.server', 'field.store'))),"
        " file=sys.stderr))\n"
    )
    done = _run_field(_blocked(*SERVER_PACKAGES) + check, argv, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(("usage: field", "field "))
    assert done.stderr == "[]\n"  # none of the server's own modules was imported


@pytest.mark.slow
def test_field_mcp_and_its_bridge_load_without_the_server(tmp_path: Path) -> None:
    """``field mcp`` gets as far as checking its arguments, and its bridge module imports."""
    done = _python(
        _blocked(*SERVER_PACKAGES)
        + "import field.cli.mcp_bridge, field.cli.redaction, field.cli.logs\n"
        + "from field.cli.main import main\n"
        + "sys.exit(main(['mcp', '--agent-id', 'a']))",
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == "field mcp: --agent-id and --token (or FIELD_TOKEN) go together\n"


@pytest.mark.parametrize("inherited", [None, "30"])
def test_the_command_lets_blas_threads_sleep_before_numpy_is_loaded(
    inherited: str | None,
) -> None:
    """The ``field`` command's package sets OpenBLAS's thread timeout before NumPy is
    loaded (OpenBLAS reads it once, as NumPy loads it); a timeout the environment gives
    is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if inherited is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = inherited
    probe = (
        "import sys, os, field.cli\n"
        "print('numpy' in sys.modules, os.environ['OPENBLAS_THREAD_TIMEOUT'])\n"
    )
    answer = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert answer.stdout.split() == ["False", inherited or "4"]
