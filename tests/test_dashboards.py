"""deploy/grafana/gateway-dashboard.json and deploy/prometheus/alerts.yaml: they parse, and every
PromQL expression names only the gateway's metrics (or Envoy's own `envoy_*` stats)."""
from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

import dashboard_queries
from dashboard_queries import all_panels
from prometheus_server import ALERTS

HISTOGRAMS = {"gen_ai_client_token_usage", "gen_ai_server_time_to_first_token_seconds",
              "gen_ai_server_time_per_output_token_seconds", "gen_ai_server_request_duration_seconds",
              "gateway_extproc_phase_seconds", "gateway_usage_write_lag_seconds"}
COUNTERS = {"gateway_requests_total", "gateway_billed_micro_pln_total", "gateway_limiter_rejections_total",
            "gateway_key_cache_lookups_total", "gateway_upstream_failures_total",
            "gateway_finished_without_journal_total"}
# the ext_proc's finished requests Redis has not taken yet, the usage writer's records queued in Redis, and
# the ext_proc's view of its dependencies (1 = usable; extproc/health.py); and Prometheus's own `up`
GAUGES = {"gateway_usage_records_waiting", "gateway_usage_records_queued", "gateway_dependency_up"}
ALLOWED = COUNTERS | GAUGES | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")} | {"up"}
LABELS = {"gen_ai_token_type", "gen_ai_request_model", "gen_ai_response_model", "endpoint", "alias", "status",
          "code", "kind", "phase", "result", "le", "envoy_cluster_name", "instance", "job", "pod", "dependency"}

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label matchers, strings, grouping clauses,
    functions and keywords taken out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # strings
    e = re.sub(r"\{[^}]*\}", "", e)                       # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                      # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        after = e[m.end():].lstrip()
        if after.startswith("("):                          # a function
            continue
        if word.lower() in _KEYWORDS or re.fullmatch(r"\d+[smhdwy]?|e\d+", word):
            continue
        if m.start() and re.match(r"[0-9.]", e[m.start() - 1]):   # exponent of a number (1e-9)
            continue
        names.add(word)
    return names


def label_names(expr: str) -> set[str]:
    out = set()
    for matcher in re.findall(r"\{([^}]*)\}", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
        out |= {m.split("=")[0].split("!")[0].strip() for m in matcher.split(",") if m.strip()}
    for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        out |= {x.strip() for x in clause.split(",") if x.strip()}
    return out


def check_expr(expr: str, where: str) -> set[str]:
    names = metric_names(expr)
    assert names, f"{where}: no metric in {expr!r}"
    unknown = {n for n in names if n not in ALLOWED and not n.startswith("envoy_")}
    assert not unknown, f"{where}: unknown metrics {unknown} in {expr!r}"
    bad_labels = label_names(expr) - LABELS
    assert not bad_labels, f"{where}: unknown labels {bad_labels} in {expr!r}"
    for h in HISTOGRAMS:
        assert not re.search(rf"\b{h}\b(?!_)", expr), f"{where}: histogram {h} without _bucket/_sum/_count"
    assert not re.search(r"rate\(\s*gateway_[a-z_]+(?<!_total)(?<!_bucket)(?<!_sum)(?<!_count)\b", expr), where
    return names


def test_metric_names_parser() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, phase) (rate(x_bucket{a="b c"}[5m])))') == {"x_bucket"}
    assert metric_names("sum(rate(a_total[5m])) / clamp_min(sum(rate(b_total[5m])), 1e-9) > 0.05") == \
        {"a_total", "b_total"}
    assert metric_names("a and on (x) b offset 5m") == {"a", "b"}
    with pytest.raises(AssertionError):
        check_expr("rate(gateway_unknown_total[5m])", "self-test")
    with pytest.raises(AssertionError):
        check_expr("rate(gen_ai_client_token_usage[5m])", "self-test")


# ---- the dashboard ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dashboard_queries.load()


def test_dashboard_parses_and_queries_known_metrics(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] and dashboard["uid"]
    seen: set[str] = set()
    ids = set()
    for p in all_panels(dashboard["panels"]):
        assert p["id"] not in ids, f"panel id {p['id']} twice"
        ids.add(p["id"])
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        for t in p["targets"]:
            seen |= check_expr(t["expr"], f"panel {p['title']!r}")
    for var in dashboard["templating"]["list"]:
        q = var.get("query")
        if var["type"] == "query":
            text = q["query"] if isinstance(q, dict) else q
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", text)
            assert m and m.group(1) in ALLOWED and m.group(2) in LABELS, text
    # every metric of the list is on the dashboard
    bases = {n for n in seen if n in COUNTERS} | {h for h in HISTOGRAMS for n in seen if n.startswith(h + "_")}
    assert bases == COUNTERS | HISTOGRAMS, f"not on the dashboard: {(COUNTERS | HISTOGRAMS) - bases}"
    assert {"envoy_cluster_upstream_rq_retry_total", "envoy_cluster_outlier_detection_ejections_enforced_total"} <= seen


# ---- the alert rules --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def alerts() -> dict[str, Any]:
    return dict(yaml.safe_load(ALERTS.read_text()))


def test_alert_rules_parse_with_expected_groups(alerts: dict[str, Any]) -> None:
    groups = {g["name"]: g for g in alerts["groups"]}
    assert set(groups) == {"gateway-errors", "gateway-usage", "gateway-limits", "gateway-upstream",
                           "gateway-availability"}
    names = set()
    for g in alerts["groups"]:
        assert set(g) <= {"name", "rules", "interval", "limit"}
        assert g["rules"], g["name"]
        for r in g["rules"]:
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, r
            assert r["alert"] not in names, r["alert"]
            names.add(r["alert"])
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", r["alert"])
            assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
            assert r["labels"]["severity"] in ("page", "ticket", "info")
            assert r["annotations"]["summary"]
            check_expr(r["expr"], f"alert {r['alert']}")
    used = {n for g in alerts["groups"] for r in g["rules"] for n in metric_names(r["expr"])}
    assert "gateway_requests_total" in used                      # error ratio
    assert "gateway_usage_write_lag_seconds_bucket" in used      # usage-write lag
    assert "gateway_limiter_rejections_total" in used            # limiter rejections
    assert "gateway_upstream_failures_total" in used             # upstream failures
    assert {"up", "envoy_cluster_membership_healthy", "gateway_usage_records_waiting",
            "gateway_usage_records_queued"} <= used  # availability
    avail = {r["alert"]: r["expr"] for r in groups["gateway-availability"]["rules"]}
    assert 'dependency="redis"' in avail["RedisUnreachable"] and 'dependency="postgres"' in avail["PostgresUnreachable"]


def test_metric_list_matches_the_code() -> None:
    """The names above are those extproc/metrics.py registers (counters are exposed with `_total`)."""
    metrics = pytest.importorskip("extproc.metrics")
    from prometheus_client.metrics import MetricWrapperBase

    found: dict[str, str] = {}
    for obj in vars(metrics).values():
        if isinstance(obj, MetricWrapperBase):
            for fam in obj.collect():
                found[fam.name] = fam.type
    assert {n + "_total" for n, t in found.items() if t == "counter"} == COUNTERS
    assert {n for n, t in found.items() if t == "histogram"} == HISTOGRAMS
    assert {n for n, t in found.items() if t == "gauge"} == GAUGES


def test_every_input_and_variable_is_used(dashboard: dict[str, Any]) -> None:
    """An import input (``__inputs``) or a template variable nobody references is a question Grafana asks
    for nothing: each is used as ``${name}`` (the panels pick the data source through ``${datasource}``)."""
    text = dashboard_queries.DASHBOARD.read_text()
    names = [i["name"] for i in dashboard.get("__inputs", [])] + [v["name"] for v in dashboard["templating"]["list"]]
    assert "datasource" in names
    unused = [n for n in names if f"${{{n}}}" not in text and f"${n}" not in text]
    assert not unused, f"declared and never used: {unused}"


def test_grafana_variables_are_substituted(dashboard: dict[str, Any]) -> None:
    values = dashboard_queries.variables(dashboard, step_s=2, scrape_s=1, range_s=60)
    assert values["alias"] == ".*"
    assert dashboard_queries.substitute('rate(x{a=~"$alias"}[$__rate_interval]) [[alias]] ${alias:regex}',
                                        values) == 'rate(x{a=~".*"}[4s]) .* .*'
    assert dashboard_queries.substitute("$__interval $__range", values) == "2s 60s"
    assert dashboard_queries.variables(dashboard, step_s=10, scrape_s=1, range_s=60)["__rate_interval"] == "11s"
    with pytest.raises(KeyError, match=r"\$nope"):
        dashboard_queries.substitute("x{a=~\"$nope\"}", values)
    exprs = [expr for _, _, expr in dashboard_queries.queries(dashboard, values)]
    assert len(exprs) >= 20 and not any("$" in e for e in exprs)
