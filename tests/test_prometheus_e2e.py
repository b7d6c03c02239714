"""The dashboard and the alert rules checked by a real Prometheus (Debian's package): it scrapes the
suite's stack every second while a mixed load runs (tests/mixed_load.py), and then every panel query of
deploy/grafana/gateway-dashboard.json must return data from its query API, its request counters must
match what the clients saw, and every alert rule of deploy/prometheus/alerts.yaml must load and evaluate.
promtool checks the rules and runs their unit tests (deploy/prometheus/alerts_test.yaml)."""
from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import yaml

import dashboard_queries
from conftest import Gateway, wait_for
from mixed_load import make_keys, run_load
from prometheus_server import ALERTS, MISSING, PROMTOOL, SCRAPE_S, Prometheus, finite, installed, running_prometheus

if not installed():
    pytest.skip(f"Prometheus tests did not run: {MISSING}", allow_module_level=True)

ALERTS_TEST = ALERTS.with_name("alerts_test.yaml")
LOAD_S = 8.0


def requests_by_status(prom: Prometheus) -> Counter[str]:
    return Counter({s["metric"]["status"]: int(float(s["value"][1]))
                    for s in prom.query("sum by (status) (gateway_requests_total)")})


@dataclass(frozen=True)
class Run:
    prom: Prometheus
    seen: Counter[tuple[str, int]]      # the replies the clients saw, by (kind, HTTP status)
    scraped: Counter[str]               # the increase of gateway_requests_total by status over the load


@pytest.fixture(scope="module")
def run(gateway: Gateway) -> Iterator[Run]:
    """Prometheus scraping the suite's stack, after LOAD_S seconds of mixed load."""
    keys = make_keys(gateway)
    with running_prometheus(gateway.stack.s) as prom:
        prom.wait_scrapes(1)
        before = requests_by_status(prom)
        seen = run_load(gateway.v1, keys, LOAD_S)
        prom.wait_scrapes(2)
        yield Run(prom, seen, requests_by_status(prom) - before)


def test_the_load_is_mixed(run: Run) -> None:
    seen = run.seen
    kinds: dict[str, set[int]] = {}
    for (kind, status), n in seen.items():
        kinds.setdefault(kind, set()).add(status)
    assert kinds == {"chat": {200}, "stream": {200}, "embed": {200}, "unknown_model": {404}, "sim_500": {502},
                     "dead_deployment": {502}, "no_capacity": {503}, "limited": {200, 429}, "broke": {402}}, seen
    assert seen[("limited", 429)] > seen[("limited", 200)]


def test_scraped_request_counters_match_the_replies(run: Run) -> None:
    seen, scraped = run.seen, run.scraped
    replied: Counter[str] = Counter()
    for (_, status), n in seen.items():
        replied[str(status)] += n
    assert scraped == replied


def test_every_panel_query_returns_data(run: Run) -> None:
    prom = run.prom
    dashboard = dashboard_queries.load()
    values = dashboard_queries.variables(dashboard, step_s=SCRAPE_S, scrape_s=SCRAPE_S, range_s=LOAD_S)
    targets = list(dashboard_queries.queries(dashboard, values))
    assert len(targets) >= 20

    def empty() -> list[str]:
        """The queries without a finite value yet (the usage writer's lag comes a moment after the load)."""
        return [f"panel {panel['title']!r}: {expr}" for panel, _, expr in targets if not finite(prom.query(expr))]

    wait_for(lambda: not empty(), timeout=15.0, interval=SCRAPE_S,
             describe=lambda: "no data from Prometheus for:\n" + "\n".join(empty()))


def test_alert_rules_load_and_evaluate(run: Run) -> None:
    prom = run.prom
    doc = yaml.safe_load(ALERTS.read_text())
    names = {r["alert"] for g in doc["groups"] for r in g["rules"]}
    rules = prom.rules()
    assert {r["name"] for r in rules} == names
    bad = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad
    # on the load's data: an alias without deployments and over 5% of 5xx, each pending its `for`
    state = {r["name"]: r for r in rules}
    assert state["AliasNoCapacity"]["state"] == "pending"
    assert state["GatewayErrorRatioHigh"]["state"] == "pending"
    assert state["GatewayInternalErrors"]["state"] == "inactive"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROMTOOL), *args], capture_output=True, text=True, timeout=60, cwd=ALERTS.parent)


def test_promtool_checks_the_rules() -> None:
    r = _promtool("check", "rules", ALERTS.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 10 rules found" in r.stdout


def test_promtool_unit_tests_cover_every_alert() -> None:
    doc: dict[str, Any] = yaml.safe_load(ALERTS_TEST.read_text())
    assert doc["rule_files"] == [ALERTS.name]
    names = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    tested = [t["alertname"] for case in doc["tests"] for t in case["alert_rule_test"]]
    fires = {t["alertname"] for case in doc["tests"] for t in case["alert_rule_test"] if t.get("exp_alerts")}
    quiet = {t["alertname"] for case in doc["tests"] for t in case["alert_rule_test"] if not t.get("exp_alerts")}
    assert set(tested) == fires == quiet == names
    r = _promtool("test", "rules", ALERTS_TEST.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
