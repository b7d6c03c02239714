"""bench/rounds.py and its use by the harness: the systems' order alternates over the rounds, a figure is
the median of its rounds with their spread, a ratio is taken within each round before its median, and a
figure spread wider than the limit is marked, in the headline and in the tables."""
from __future__ import annotations

from typing import Any

from bench import long_streams, report, rounds, run


def test_every_other_round_runs_the_systems_backwards() -> None:
    assert [rounds.order("abc", i) for i in range(3)] == [list("abc"), list("cba"), list("abc")]


def test_median_and_spread_over_the_rounds() -> None:
    assert rounds.median([3.0, 1.0, None, 2.0]) == 2.0
    assert rounds.spread([90.0, 100.0, 110.0]) == 0.2  # (110 - 90) / 100
    assert rounds.spread([100.0]) is None and rounds.spread([0.0, 0.0]) is None
    assert not rounds.wide(0.1) and rounds.wide(0.101) and not rounds.wide(None)
    assert rounds.mark("1.22×", 0.2) == "1.22×~" and rounds.mark("1.22×", 0.05) == "1.22×"


def _wrk(rps: float, p50: float = 1000.0, errors: int = 0) -> dict[str, Any]:
    return {"rps": rps, "p50_us": p50, "p99_us": 3 * p50, "requests": int(rps * 2), "errors": errors, "conns": 64,
            "few": False, "noisy": False, "busy_before": 0.1, "cpu_us_per_request": {"proxy": rps / 10, "wrk": 1.0}}


def test_a_cell_is_its_rounds_medians_with_errors_counted_over_all() -> None:
    c = rounds.cell([_wrk(100.0, errors=1), _wrk(300.0), _wrk(200.0, p50=2000.0, errors=2)])
    assert (c["rps"], c["p50_us"], c["errors"], c["rounds"]) == (200.0, 1000.0, 3, 3)
    assert c["rps_spread"] == 1.0 and c["rps_rounds"] == [100.0, 300.0, 200.0]
    assert c["cpu_us_per_request"] == {"proxy": 20.0, "wrk": 1.0}


def _comparison() -> dict[str, Any]:
    """Two rounds in which the machine ran at half speed in the second: every system's requests/s halve,
    so their ratios hold still while each system's requests/s spread by 67%."""
    systems: dict[str, Any] = {}
    for name, rps in (("bare_envoy", 4000.0), ("minimal_extproc", 1000.0), ("gateway", 1250.0), ("litellm", 100.0)):
        rs = [{c: _wrk(rps * speed) for c in ("latency", "chat", "stream", "models")} for speed in (1.0, 0.5)]
        systems[name] = {"label": name, "invalid": {}, "rounds": rs,
                         "cells": {c: rounds.cell([r[c] for r in rs]) for c in rs[0]}}
    return {"rounds": 2, "systems": systems, "stream_chunks_per_reply": 64, "long_streams": None,
            "redis": {"redis_us_per_request": 30.0}, "resp_client": None}


def test_the_headline_takes_each_ratio_within_a_round() -> None:
    h = run.headline(_comparison(), None)
    assert (h["ratio_vs_minimal"], h["ratio_vs_minimal_spread"]) == (1.25, 0.0)
    assert (h["ratio_vs_envoy"], h["ratio_vs_litellm"]) == (0.312, 12.5)
    assert h["rps_gateway"] == 937.5 and h["rps_gateway_spread"] == 0.667
    assert "rps_gateway" in h["wide_spread"] and "ratio_vs_minimal" not in h["wide_spread"]
    assert h["rounds"] == 2 and h["errors"] == 0 and h["redis_us_per_request"] == 30.0


def test_the_tables_mark_a_wide_figure_and_give_each_ratios_spread() -> None:
    cmp = _comparison()
    text = report.terminal_table(cmp)
    assert "938~" in text  # the gateway's chat req/s: median of 1,250 and 625, spread 67%
    assert "vs minimal ext_proc 1.25× (spread 0%)" in text
    assert rounds.WIDE_NOTE in text
    table = "\n".join(report.headline_table(run.headline(cmp, None)))
    assert "| `rps_gateway` | 937.5~ | 66.7% |" in table and "| `ratio_vs_minimal` | 1.25 | 0.0% |" in table


def test_long_streams_added_gap_is_taken_against_the_same_rounds_bare_envoy() -> None:
    def r(p99_ms: float) -> dict[str, Any]:
        return {"streams": 500, "good": 500, "errors": 0, "tokens": 100_000, "gap_p50_us": 25_000,
                "gap_p99_us": p99_ms * 1000, "envoy_cpu_us_per_chunk": 20.0}
    ls: dict[str, Any] = {"systems": {
        "bare_envoy": {"rounds": {"500": [r(30), r(60)]}},
        "gateway": {"rounds": {"500": [r(35), r(70)]}}}}
    long_streams._added(ls)
    assert [x["added_p99_ms"] for x in ls["systems"]["gateway"]["rounds"]["500"]] == [5.0, 10.0]
    cell = long_streams.cell(ls["systems"]["gateway"]["rounds"]["500"])
    assert (cell["added_p99_ms"], cell["added_p99_ms_spread"], cell["streams"]) == (7.5, 0.667, 1000)
    first = long_streams.headline(long_streams.round_view(ls, 0))
    assert first["streams_c500_added_itl_p99_ms"] == 5.0 and first["streams_c500_envoy_cpu_vs_bare"] == 1.0


def test_the_headline_rounds_run_only_the_cells_its_ratios_compare(monkeypatch: Any) -> None:
    """After the full rounds, ``measure``'s headline rounds run chat, the burst and models on the systems
    the headline's ratios name, and nothing else (no latency, no embeddings, no direct upstream)."""
    ran: list[tuple[int, str, str]] = []
    monkeypatch.setattr(run, "prepare", lambda s, warm, bodies, out: out.setdefault(
        s.name, {"label": s.name, "cells": {}, "invalid": {}, "rounds": []}))
    monkeypatch.setattr(run, "measure_cell", lambda s, c, secs, bodies, quick, n: ran.append((n, s.name, c[0]))
                        or _wrk(100.0))
    monkeypatch.setattr(run, "log", lambda msg: None)

    class S:
        def __init__(self, name: str) -> None:
            self.name = self.label = name

    systems: Any = [S(n) for n in ("direct", "bare_envoy", "minimal_extproc", "gateway", "litellm")]
    out: dict[str, Any] = {}
    run.measure(systems, run.CELLS_QUICK, 2.0, 0.0, None, out, True, 1, 2)  # type: ignore[arg-type]
    full = {(name, cell) for n, name, cell in ran if n == 1}
    assert ("direct", "latency") in full and ("litellm", "embeddings") in full
    for n in (2, 3):
        assert {(name, cell) for m, name, cell in ran if m == n} == {
            ("bare_envoy", "chat"), ("minimal_extproc", "chat"), ("gateway", "chat"), ("litellm", "chat"),
            ("minimal_extproc", "stream"), ("gateway", "stream"), ("gateway", "models")}
    assert len(out["gateway"]["rounds"]) == 3 and out["gateway"]["cells"]["chat"]["rounds"] == 3
    assert out["gateway"]["cells"]["latency"]["rounds"] == 1


def test_the_headline_takes_its_ratios_over_the_headline_rounds_too() -> None:
    """A third round of the headline's cells only: its ratios count in the medians, the latency's figures
    come from the full rounds alone."""
    cmp = _comparison()
    cmp["headline_rounds"] = 1
    for name, rps in (("bare_envoy", 4000.0), ("minimal_extproc", 1000.0), ("gateway", 2000.0), ("litellm", 100.0)):
        cmp["systems"][name]["rounds"].append({c: _wrk(rps) for c in ("chat", "stream", "models")})
    h = run.headline(cmp, None)
    assert h["rounds"] == 3
    assert h["ratio_vs_minimal"] == 1.25 and h["ratio_vs_minimal_spread"] == 0.6  # 1.25, 1.25, 2.0
    assert h["overhead_p50_ms"] == 0.0 and h["stream_ratio_vs_minimal"] == 1.25
