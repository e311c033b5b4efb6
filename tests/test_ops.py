"""``ops/``: the alerting rules and the dashboard, run against the real thing.

Debian's ``prometheus`` scrapes a live ``field serve`` process every second and
evaluates the rules of ``ops/prometheus/alerts.yml`` every second. Every rule's
expression, and every query of ``ops/grafana/field.json``, must evaluate on what
was scraped and name only metrics the scrape has (a renamed metric fails here);
and one alert is made to fire by causing its condition: an agent past its rate,
refused with 429. Without ``prometheus`` and ``promtool`` on the machine these
tests are skipped, saying so.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from field.client import FieldClient, FieldClientError

from .conftest import ServerProcess, spawn_server

OPS = Path(__file__).resolve().parent.parent / "ops"
RULES = OPS / "prometheus" / "alerts.yml"
DASHBOARD = OPS / "grafana" / "field.json"
RUNBOOK = OPS / "README.md"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
#: Failure guard for what Prometheus does on its own schedule (never a pacing delay).
TIMEOUT = 30.0
#: The alert made to fire, and the copy of the rules' ``for`` it is given.
FIRED = "FieldRateLimited"

needs_promtool = pytest.mark.skipif(
    not Path(PROMTOOL).exists(),
    reason=f"promtool is not installed ({PROMTOOL}): apt-get install prometheus",
)
needs_prometheus = pytest.mark.skipif(
    not (Path(PROMETHEUS).exists() and Path(PROMTOOL).exists()),
    reason=f"prometheus is not installed ({PROMETHEUS}): apt-get install prometheus",
)


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def panel_queries() -> list[str]:
    """Every query of the dashboard's panels, its variables given values Prometheus takes."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        target["expr"]
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]
    return [q.replace("$__rate_interval", "1m").replace("$instance", ".*") for q in queries]


# -- what a PromQL expression names -----------------------------------------------

#: Words of PromQL that are not metrics when no parenthesis follows them.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "on", "ignoring", "by", "without"}
    | {"group_left", "group_right", "inf", "nan"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: its identifiers that are neither functions,
    aggregations, keywords, label names nor numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)  # label matchers, ranges
    # grouping and matching with their label lists
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    # numbers and durations (offset 5m, 1h30m)
    text = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+|((ms|[smhdwy])\d*)+)?", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group()
        if word.lower() in _KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{x=~"y|z"}[5m])))'
        " / on (instance) group_left sum without (le) (b_total) > 1e9 or c offset 1h30m"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


# -- the files ------------------------------------------------------------------------


def _slugs(markdown: str) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub makes them."""
    headings = re.findall(r"^#+\s+(.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


@needs_promtool
def test_the_rules_pass_promtool_and_each_names_its_runbook() -> None:
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    anchors = _slugs(RUNBOOK.read_text())
    alerts = rules()
    assert len({rule["alert"] for rule in alerts}) == len(alerts)
    for rule in alerts:
        assert rule.get("for"), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        notes = rule["annotations"]
        assert notes["summary"] and "Runbook" in notes["description"], rule["alert"]
        page, _, anchor = notes["runbook"].partition("#")
        assert page == "ops/README.md" and anchor in anchors, rule["alert"]


def test_the_dashboard_is_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            refs = [target["refId"] for target in panel["targets"]]
            assert len(set(refs)) == len(refs), panel["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "instance"}


# -- Prometheus against a live server -----------------------------------------------


@dataclass
class Live:
    """A ``field serve`` process, and a Prometheus scraping it."""

    server: ServerProcess
    prometheus: str
    #: the server's metric names, as its scrape declares them
    scraped: set[str]

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.prometheus}{path}?{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> Any:
        return self.api("/api/v1/query", query=expr)

    def until(self, what: str, done: Any) -> Any:
        """Poll ``done()`` until it returns something true (Prometheus works on its own
        schedule: a scrape and an evaluation each second)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            found = done()
            if found:
                return found
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def alerts(self, state: str) -> set[str]:
        found = self.api("/api/v1/alerts")["alerts"]
        return {alert["labels"]["alertname"] for alert in found if alert["state"] == state}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _declared(text: str) -> set[str]:
    """The sample names a scrape declares, whether or not its families have samples yet
    (a counter nothing has counted yet is declared all the same)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type in ("histogram", "gaugehistogram"):
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


def _test_rules(directory: Path) -> Path:
    """The rules as they are, evaluated every second, :data:`FIRED` given a short ``for``."""
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if rule["alert"] == FIRED:
                rule["for"] = "1s"
    path = directory / "alerts.yml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    if not (Path(PROMETHEUS).exists() and Path(PROMTOOL).exists()):
        pytest.skip(f"prometheus is not installed ({PROMETHEUS}): apt-get install prometheus")
    directory = tmp_path_factory.mktemp("ops")
    # an agent may send one operation a second, two at once: a third in a row is refused
    server = spawn_server(directory / "data", "--agent-rate", "1", "--agent-burst", "2")
    target = server.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(_test_rules(directory))],
        "scrape_configs": [{"job_name": "field", "static_configs": [{"targets": [target]}]}],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = (directory / "prometheus.log").open("w")
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as answer:
            scraped = _declared(answer.read().decode())
        state = Live(server, f"http://127.0.0.1:{port}", scraped)

        def scraped_once() -> bool:
            try:
                up = state.query('up{job="field"} == 1')["result"]
            except OSError:
                assert prometheus.poll() is None, (directory / "prometheus.log").read_text()
                return False  # not listening yet
            return bool(up) and bool(state.query("field_build_info")["result"])

        state.until("Prometheus to scrape the server", scraped_once)
        yield state
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait()
        log.close()
        server.stop()


@needs_prometheus
def test_every_alert_evaluates_on_scraped_metrics(live: Live) -> None:
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= live.scraped, (rule["alert"], names - live.scraped)
        result = live.query(rule["expr"])
        assert result["resultType"] == "vector", rule["alert"]


@needs_prometheus
def test_every_dashboard_query_evaluates_on_scraped_metrics(live: Live) -> None:
    for expr in panel_queries():
        names = metric_names(expr)
        assert names, expr
        assert names <= live.scraped, (expr, names - live.scraped)
        assert live.query(expr)["resultType"] == "vector", expr


@needs_prometheus
async def test_an_agent_past_its_rate_fires_the_rate_limited_alert(live: Live) -> None:
    assert FIRED not in live.alerts("pending") | live.alerts("firing")
    refused = 0
    async with FieldClient(live.server.url, retries=0) as field:
        agent = await field.register("busy-agent", "analyst", interests=["load"])
        for _ in range(12):
            try:
                await agent.attune(max_units=1)
            except FieldClientError as error:
                assert error.code == "RATE_LIMITED"
                refused += 1
    assert refused >= 8
    live.until(f"{FIRED} to fire", lambda: FIRED in live.alerts("firing"))
    (alert,) = (
        a for a in live.api("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == FIRED
    )
    assert alert["labels"]["limit"] == "agent" and alert["labels"]["severity"] == "warning"
    assert live.alerts("firing") == {FIRED}  # nothing else is wrong with the server
