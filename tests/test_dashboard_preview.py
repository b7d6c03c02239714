"""The dashboard previewer's PromQL subset (deploy/grafana/preview.py) against hand-made series: rate,
irate and increase with Prometheus's extrapolation rules, sum by, histogram_quantile, division and
clamp_min, matchers, and the exposition-format parser.  No stack, no browser."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("dashboard_preview", ROOT / "deploy" / "grafana" / "preview.py")
assert _spec is not None and _spec.loader is not None
pv = importlib.util.module_from_spec(_spec)
sys.modules["dashboard_preview"] = pv
_spec.loader.exec_module(pv)

EXACT = 1e-12     # relative tolerance: the same arithmetic as Prometheus, up to float rounding


def store(*series: tuple[str, dict[str, str], list[tuple[float, float]]]) -> "pv.Store":
    s = pv.Store()
    for name, labels, points in series:
        s.add_series(name, labels, points)
    return s


def linear(slope_per_10s: float, t0: int = 10, t1: int = 60) -> list[tuple[float, float]]:
    """A counter that was 0 at t=0 and grows by `slope_per_10s` every 10 s, sampled every 10 s."""
    return [(float(t), slope_per_10s * t / 10) for t in range(t0, t1 + 1, 10)]


def one(v: object) -> float:
    assert isinstance(v, list) and len(v) == 1, v
    return float(v[0][1])


def at(s: "pv.Store", expr: str, t: float = 60.0, window_s: float | None = None) -> object:
    return pv.Evaluator(s, window_s=window_s).eval(pv.parse(expr), t)


def test_rate_covering_the_whole_window() -> None:
    s = store(("c_total", {}, [(float(t), float(t)) for t in range(0, 61, 10)]))   # 1 per second
    # (0, 60] is left-open: samples 10..60, extrapolated to the window's start (10 s < 1.1 × 10 s)
    assert one(at(s, "rate(c_total[1m])")) == pytest.approx(1.0, rel=EXACT)
    assert one(at(s, "increase(c_total[1m])")) == pytest.approx(60.0, rel=EXACT)
    assert one(at(s, "irate(c_total[1m])")) == pytest.approx(1.0, rel=EXACT)


def test_rate_of_a_series_that_starts_inside_the_window() -> None:
    s = store(("c_total", {}, [(40.0, 4.0), (50.0, 5.0), (60.0, 6.0)]))
    # increase 2 over 20 s sampled; the start is 40 s away (> 1.1 × 10 s): extrapolated by 5 s only
    assert one(at(s, "increase(c_total[1m])")) == pytest.approx(2.5, rel=EXACT)
    assert one(at(s, "rate(c_total[1m])")) == pytest.approx(2.5 / 60, rel=EXACT)


def test_rate_handles_a_counter_reset_and_the_zero_point() -> None:
    reset = store(("c_total", {}, [(10.0, 10.0), (20.0, 20.0), (30.0, 30.0), (40.0, 5.0), (50.0, 15.0),
                                   (60.0, 25.0)]))
    # 15 + 30 (the reset) = 45 over 50 s, extrapolated to 60 s
    assert one(at(reset, "increase(c_total[1m])")) == pytest.approx(54.0, rel=EXACT)
    assert one(at(reset, "rate(c_total[1m])")) == pytest.approx(0.9, rel=EXACT)
    zero = store(("c_total", {}, [(float(t), 1.0 + (t - 10)) for t in range(10, 61, 10)]))
    # 1 → 51: extrapolating 10 s back would go below zero; the zero point is 1 s back
    assert one(at(zero, "increase(c_total[1m])")) == pytest.approx(51.0, rel=EXACT)


def test_window_override_and_too_few_samples() -> None:
    s = store(("c_total", {}, [(float(t), 2.0 * t) for t in range(0, 61, 2)]))     # 2 per second
    assert one(at(s, "rate(c_total[5m])", window_s=30.0)) == pytest.approx(2.0, rel=EXACT)
    # as written: 60 s of samples in a 5-minute window, extrapolated by half an interval at the start
    assert one(at(s, "rate(c_total[5m])")) == pytest.approx(120.0 / 300, rel=EXACT)
    single = store(("c_total", {}, [(60.0, 5.0)]))
    assert at(single, "rate(c_total[1m])") == []


def test_sum_by_and_matchers() -> None:
    s = store(("r_total", {"alias": "a", "endpoint": "chat", "status": "200", "code": ""}, linear(10)),
              ("r_total", {"alias": "a", "endpoint": "emb", "status": "200", "code": ""}, linear(20)),
              ("r_total", {"alias": "b", "endpoint": "chat", "status": "502", "code": "upstream_unavailable"},
               linear(30)),
              ("r_total", {"alias": "b", "endpoint": "chat", "status": "404", "code": "model_not_found"},
               linear(40)),
              ("other_total", {"alias": "a"}, linear(1000)))
    by_alias = dict(at(s, 'sum by (alias) (rate(r_total{alias=~".*"}[1m]))'))  # type: ignore[arg-type]
    assert by_alias[(("alias", "a"),)] == pytest.approx(3.0, rel=EXACT)
    assert by_alias[(("alias", "b"),)] == pytest.approx(7.0, rel=EXACT)
    assert set(by_alias) == {(("alias", "a"),), (("alias", "b"),)}
    assert one(at(s, "sum(rate(r_total[1m]))")) == pytest.approx(10.0, rel=EXACT)
    assert dict(at(s, "sum(rate(r_total[1m])) by (endpoint)")) == {  # type: ignore[arg-type]
        (("endpoint", "chat"),): pytest.approx(8.0, rel=EXACT), (("endpoint", "emb"),): pytest.approx(2.0, rel=EXACT)}
    # `!=""` keeps only errors; `=~` is anchored ("5.." is not "502" and "5021")
    by_code = dict(at(s, 'sum by (code) (rate(r_total{code!=""}[1m]))'))  # type: ignore[arg-type]
    assert by_code == {(("code", "upstream_unavailable"),): pytest.approx(3.0, rel=EXACT),
                       (("code", "model_not_found"),): pytest.approx(4.0, rel=EXACT)}
    assert one(at(s, 'sum(rate(r_total{status=~"5.."}[1m]))')) == pytest.approx(3.0, rel=EXACT)
    assert at(s, 'sum(rate(r_total{status=~"50"}[1m]))') == []
    assert one(at(s, 'sum(rate(r_total{alias!="a",status!~"4.."}[1m]))')) == pytest.approx(3.0, rel=EXACT)
    # a label that is empty on every series of a group is absent from the result
    assert at(s, 'sum by (code) (rate(r_total{code=""}[1m]))') == [((), pytest.approx(3.0, rel=EXACT))]


def test_division_clamp_min_and_scalars() -> None:
    s = store(("r_total", {"alias": "a", "status": "200"}, linear(30)),
              ("r_total", {"alias": "a", "status": "502"}, linear(10)),
              ("r_total", {"alias": "b", "status": "200"}, linear(10)),
              ("billed_total", {"alias": "a"}, linear(500)))
    ratio = ('sum(rate(r_total{status=~"5.."}[1m])) / clamp_min(sum(rate(r_total[1m])), 1e-9)')
    assert one(at(s, ratio)) == pytest.approx(0.2, rel=EXACT)
    per_alias = dict(at(s, 'sum by (alias) (rate(r_total{status=~"5.."}[1m])) / '   # type: ignore[arg-type]
                        'clamp_min(sum by (alias) (rate(r_total[1m])), 1e-9)'))
    # one-to-one matching: alias b has no 5xx series, so it has no ratio at all (as in Prometheus)
    assert per_alias == {(("alias", "a"),): pytest.approx(0.25, rel=EXACT)}
    # clamp_min keeps a zero denominator from dividing by zero
    assert one(at(s, 'sum(rate(r_total{alias="b"}[1m])) * 0 / '
                     'clamp_min(sum(rate(r_total{alias="b"}[1m])) * 0, 1e-9)')) == 0.0
    # an empty vector stays empty through sum and division (no series, not zero)
    assert at(s, 'sum(rate(r_total{alias="c"}[1m])) / clamp_min(sum(rate(r_total[1m])), 1e-9)') == []
    assert one(at(s, "sum(rate(billed_total[1m])) * 3600 / 1e6")) == pytest.approx(0.18, rel=EXACT)
    assert at(s, "1 / 0") == math.inf and at(s, "2 - 3 * 4") == -10.0


def _hist(model: str, slopes: dict[str, float]) -> list[tuple[str, dict[str, str], list[tuple[float, float]]]]:
    return [("d_seconds_bucket", {"le": le, "model": model}, linear(k)) for le, k in slopes.items()]


def test_histogram_quantile_over_rate_of_buckets() -> None:
    s = store(*_hist("m1", {"0.1": 1, "0.5": 3, "1": 4, "+Inf": 4}),        # rates .1 .3 .4 .4
              *_hist("m2", {"0.1": 0, "0.5": 0, "1": 1, "+Inf": 2}),        # rates 0 0 .1 .2
              ("d_seconds_count", {"model": "m1"}, linear(4)))
    q = lambda phi, by="le, model": dict(at(s, f"histogram_quantile({phi}, sum by ({by}) "  # noqa: E731
                                                f"(rate(d_seconds_bucket[1m])))"))
    m1, m2 = (("model", "m1"),), (("model", "m2"),)
    # m1: rank .2 falls in (0.1, 0.5] holding .2 of which .1 below: 0.1 + 0.4 × 0.5
    assert q(0.5)[m1] == pytest.approx(0.3, rel=EXACT)
    assert q(0.99)[m1] == pytest.approx(0.98, rel=EXACT)       # 0.5 + 0.5 × (.396 − .3) / .1
    assert q(1)[m1] == pytest.approx(1.0, rel=EXACT)
    # m2: half of the observations are above the last finite bound: its bound is the answer
    assert q(0.5)[m2] == pytest.approx(1.0, rel=EXACT)
    assert q(0.9)[m2] == pytest.approx(1.0, rel=EXACT)
    assert q(0.25)[m2] == pytest.approx(0.5 + 0.5 * 0.5, rel=EXACT)
    # summed over models: rates .1 .3 .5 .6
    both = q(0.5, "le")
    assert list(both) == [()] and both[()] == pytest.approx(0.5, rel=EXACT)
    assert q(-1)[m1] == -math.inf and q(2)[m1] == math.inf


def test_histogram_quantile_edge_cases() -> None:
    assert math.isnan(pv.bucket_quantile(0.5, [(1.0, 5.0), (2.0, 10.0)]))          # no +Inf bucket
    assert math.isnan(pv.bucket_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]))    # no observations
    # non-monotonic counts are made monotonic, equal bounds are merged
    assert pv.bucket_quantile(0.5, [(1.0, 4.0), (2.0, 3.0), (math.inf, 8.0)]) == pytest.approx(1.0, rel=EXACT)
    assert pv.bucket_quantile(0.75, [(1.0, 2.0), (1.0, 2.0), (2.0, 8.0), (math.inf, 8.0)]) == pytest.approx(1.5)


def test_range_query_steps_and_no_data_gaps() -> None:
    s = store(("c_total", {}, [(float(t), float(t)) for t in range(0, 61, 10)]),
              *_hist("m", {"1": 0, "+Inf": 0}))
    res = pv.Evaluator(s).range_query("sum(rate(c_total[20s]))", 20.0, 60.0, 20.0)
    assert res == {(): [(20.0, pytest.approx(1.0, rel=EXACT)), (40.0, pytest.approx(1.0, rel=EXACT)),
                        (60.0, pytest.approx(1.0, rel=EXACT))]}
    # quantiles of an empty histogram are NaN: no points (a gap, as Grafana draws it)
    empty = pv.Evaluator(s).range_query("histogram_quantile(0.5, sum by (le) (rate(d_seconds_bucket[1m])))",
                                        20.0, 60.0, 20.0)
    assert empty == {(): []}


def test_outside_the_subset_is_not_evaluated() -> None:
    for expr in ("avg(rate(c_total[1m]))", 'label_replace(c_total, "a", "$1", "b", "(.*)")',
                 "sum without (a) (c_total)", "c_total offset 5m", "c_total > 1", "rate(c_total)"):
        with pytest.raises(pv.Unsupported):
            pv.parse(expr)
    panel = {"type": "timeseries", "targets": [{"expr": "avg(rate(c_total[1m]))", "legendFormat": "x"}]}
    data = pv.evaluate_panel(panel, pv.Evaluator(pv.Store()), 0.0, 10.0, 2.0, {})
    assert data.error is not None and data.error.startswith("not evaluated") and data.series == []


def test_every_dashboard_expression_is_in_the_subset() -> None:
    doc = json.loads((ROOT / "deploy" / "grafana" / "gateway-dashboard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert exprs
    for expr in exprs:
        pv.parse(pv.substitute(expr, {"alias": ".*"}))


def test_exposition_parser_and_legends() -> None:
    text = ('# HELP x_total help\n# TYPE x_total counter\nx_total{alias="a\\"b",code=""} 3.0\n'
            'h_bucket{le="+Inf"} 7\nenvoy_cluster_upstream_rq_retry{envoy_cluster_name="up-pro"} 2\n'
            'plain 1e3 1700000000000\n')
    assert pv.parse_exposition(text) == [("x_total", {"alias": 'a"b', "code": ""}, 3.0),
                                         ("h_bucket", {"le": "+Inf"}, 7.0),
                                         ("envoy_cluster_upstream_rq_retry", {"envoy_cluster_name": "up-pro"}, 2.0),
                                         ("plain", {}, 1000.0)]
    assert pv.legend_name("{{alias}} {{endpoint}}", (("alias", "a"), ("endpoint", "chat"))) == "a chat"
    assert pv.fmt(0.0123, "percentunit") == "1.23%" and pv.fmt(0.25, "s") == "250 ms"
