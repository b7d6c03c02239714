"""Renders deploy/grafana/gateway-dashboard.json as docs/dashboard.png from a real Prometheus.

    .venv/bin/python -m deploy.grafana.preview [--seconds 60] [--window 30s] [--out docs/dashboard.png]

It starts a gateway stack of its own (tests/conftest.py: free ports, the simulator as model server) and
Debian's Prometheus scraping it every second (tests/prometheus_server.py), runs the mixed load of
tests/mixed_load.py, asks Prometheus' range-query API (/api/v1/query_range) for every panel's query over
the run, draws the panels by their gridPos as HTML with inline SVG (Grafana-like, not Grafana: Grafana is
not installable here) and screenshots the page with Debian's chromium (Playwright).  A panel whose
queries return nothing says "No data".

The dashboard's windows are `[5m]`; over a 60-second load such a window is mostly empty and rate() reads
about a fifth of the real rate, so every range is queried over `--window` (30 s) instead, and the page
says so; `--window asis` keeps the written ranges.
"""
from __future__ import annotations

import argparse
import html
import math
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import dashboard_queries  # noqa: E402
from prometheus_server import SCRAPE_S, Prometheus, running_prometheus  # noqa: E402

STEP_S = 2.0                # the range queries' resolution


# ================================================================================================
# Rendering: Grafana-like panels as HTML + inline SVG
# ================================================================================================

PALETTE = ["#73BF69", "#F2CC0C", "#5794F2", "#FF9830", "#F2495C", "#B877D9", "#8AB8FF", "#FADE2A",
           "#96D98D", "#FFB357", "#CA95E5", "#FF7383", "#37872D", "#1F60C4", "#C4162A", "#8F3BB8"]
UNIT_H, MARGIN, PAGE_W, COLS = 30, 8, 1600, 24


def _scaled(v: float, base: float, suffixes: list[str], decimals: int | None) -> str:
    k = 0
    while abs(v) >= base and k < len(suffixes) - 1:
        v /= base
        k += 1
    return _num(v, decimals) + suffixes[k]


def _num(v: float, decimals: int | None = None) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if decimals is None:
        a = abs(v)
        decimals = 0 if a >= 100 or a == 0 else 1 if a >= 10 else 2 if a >= 1 else 3 if a >= 0.01 else 4
    s = f"{v:.{decimals}f}"
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def fmt(v: float, unit: str | None, decimals: int | None = None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "NaN"
    if unit == "percentunit":
        return _num(v * 100, decimals) + "%"
    if unit == "reqps":
        return _scaled(v, 1000, [" req/s", "K req/s", "M req/s"], decimals)
    if unit == "s":
        a = abs(v)
        if a == 0:
            return "0 s"
        if a < 1e-3:
            return _num(v * 1e6, decimals) + " µs"
        if a < 1:
            return _num(v * 1e3, decimals) + " ms"
        return _num(v, decimals) + " s"
    if unit == "currencyPLN":
        return _num(v, decimals if decimals is not None else (4 if abs(v) < 1 else 2)) + " PLN"
    return _scaled(v, 1000, ["", " K", " Mil", " Bil", " Tri"], decimals)


def nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        hi = lo + 1 if lo == 0 else lo + abs(lo)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, v = [], first
    while v <= hi + step * 0.5:
        ticks.append(round(v, 12))
        v += step
        if v > hi and ticks[-1] >= hi:
            break
    return ticks


def legend_name(fmt_: str | None, labels: dict[str, str]) -> str:
    """Grafana's legend: the target's legendFormat with {{label}} filled in, else the series' labels."""
    if fmt_:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt_).strip() or "{}"
    body = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return labels.get("__name__", "") + "{" + body + "}"


@dataclass
class PanelData:
    series: list[tuple[str, list[tuple[float, float]]]] = field(default_factory=list)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def svg_timeseries(panel: dict[str, Any], data: PanelData, w: int, h: int, start: float, end: float) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    fill = custom.get("fillOpacity", 10) / 100
    left, right, top, bottom = 62, 10, 8, 20
    pw, ph = w - left - right, h - top - bottom
    series = [(n, pts) for n, pts in data.series if pts]
    if stacked:                                   # cumulative sums per timestamp, in series order
        acc: dict[float, float] = {}
        drawn = []
        for n, pts in series:
            new = []
            for t, v in pts:
                base = acc.get(t, 0.0)
                acc[t] = base + v
                new.append((t, base, base + v))
            drawn.append((n, new))
    else:
        drawn = [(n, [(t, 0.0, v) for t, v in pts]) for n, pts in series]
    values = [p[2] for _, pts in drawn for p in pts if not math.isinf(p[2])] or [0.0]
    lo, hi = min(0.0, min(values)), max(values)
    ticks = nice_ticks(lo, hi if hi > lo else lo + 1)
    lo, hi = ticks[0], ticks[-1]

    def x(t: float) -> float:
        return left + (t - start) / max(end - start, 1e-9) * pw

    def y(v: float) -> float:
        return top + ph - (min(max(v, lo), hi) - lo) / (hi - lo) * ph

    parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" font-size="11" '
             f'font-family="Inter, Helvetica, Arial, sans-serif">']
    for tv in ticks:
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(tv):.1f}" y2="{y(tv):.1f}" stroke="#2c3235"/>')
        parts.append(f'<text x="{left - 6}" y="{y(tv) + 4:.1f}" text-anchor="end" fill="#ccccdc">'
                     f'{html.escape(fmt(tv, unit))}</text>')
    span = end - start
    xstep = next(s for s in (5, 10, 15, 20, 30, 60, 120, 300, 600, 1800, 3600) if span / s <= 6)
    tx = math.ceil(start / xstep) * xstep
    while x(tx) <= w - 26:                         # a label must fit: half its width
        parts.append(f'<line x1="{x(tx):.1f}" x2="{x(tx):.1f}" y1="{top}" y2="{top + ph}" stroke="#2c3235"/>')
        parts.append(f'<text x="{x(tx):.1f}" y="{h - 5}" text-anchor="middle" fill="#ccccdc">{_clock(tx)}</text>')
        tx += xstep
    for k, (_, band) in enumerate(drawn):
        color = PALETTE[k % len(PALETTE)]
        # a gap (missing evaluation step) breaks the line, as in Grafana
        runs: list[list[tuple[float, float, float]]] = []
        for p in band:
            if runs and p[0] - runs[-1][-1][0] <= STEP_S * 1.5 + 1e-6:
                runs[-1].append(p)
            else:
                runs.append([p])
        for run in runs:
            line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, _, v in run)
            if fill > 0 and len(run) > 1:
                back = " ".join(f"{x(t):.1f},{y(b):.1f}" for t, b, _ in reversed(run))
                parts.append(f'<polygon points="{line} {back}" fill="{color}" fill-opacity="{fill:.2f}" stroke="none"/>')
            if len(run) == 1:
                t, _, v = run[0]
                parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2" fill="{color}"/>')
            else:
                parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    parts.append("</svg>")
    return "".join(parts)


def _calc(name: str, values: list[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return math.nan
    if name == "mean":
        return sum(vals) / len(vals)
    if name == "max":
        return max(vals)
    if name == "min":
        return min(vals)
    if name in ("last", "lastNotNull"):
        return vals[-1]
    raise ValueError(f"legend calc {name} is not drawn")


def legend_html(panel: dict[str, Any], data: PanelData, max_rows: int) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    opts = panel.get("options", {}).get("legend", {})
    calcs = opts.get("calcs", [])
    series = [(n, pts) for n, pts in data.series if pts]
    rows = []
    if calcs:
        rows.append("<tr><th></th>" + "".join(f"<th>{html.escape(c.capitalize())}</th>" for c in calcs) + "</tr>")
    shown = series if len(series) <= max_rows else series[:max_rows - 1]
    for k, (name, pts) in enumerate(shown):
        color = PALETTE[k % len(PALETTE)]
        cells = "".join(f"<td>{html.escape(fmt(_calc(c, [v for _, v in pts]), unit))}</td>" for c in calcs)
        rows.append(f'<tr><td class="n"><i style="background:{color}"></i>{html.escape(name)}</td>{cells}</tr>')
    if len(shown) < len(series):
        rows.append(f'<tr><td class="n more">+{len(series) - len(shown)} more series</td></tr>')
    return f'<table class="legend">{"".join(rows)}</table>'


def stat_html(panel: dict[str, Any], data: PanelData, w: int, h: int) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    calc = (panel.get("options", {}).get("reduceOptions", {}).get("calcs") or ["lastNotNull"])[0]
    steps = (panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps")
             or [{"color": "green", "value": None}, {"color": "red", "value": 80}])   # Grafana's default
    colors = {"green": "#73BF69", "red": "#F2495C", "yellow": "#FADE2A", "orange": "#FF9830", "blue": "#5794F2"}
    series = [(n, pts) for n, pts in data.series if pts]
    if not series:
        return '<div class="nodata">No data</div>'
    cells = []
    for name, pts in series:
        v = _calc(calc, [p[1] for p in pts])
        color = "green"
        for st in steps:
            if st.get("value") is None or (not math.isnan(v) and v >= st["value"]):
                color = st.get("color", color)
        c = colors.get(color, color)
        cw, ch = w // len(series), h
        vals = [p[1] for p in pts if not math.isinf(p[1])] or [0.0]
        lo, hi = min(0.0, min(vals)), max(vals) or 1.0
        t0, t1 = pts[0][0], max(pts[-1][0], pts[0][0] + 1e-9)
        spark = " ".join(f"{(t - t0) / (t1 - t0) * cw:.1f},{ch - (v_ - lo) / ((hi - lo) or 1) * ch * 0.45:.1f}"
                         for t, v_ in pts if not math.isinf(v_))
        svg = (f'<svg class="spark" width="{cw}" height="{ch}"><polygon points="0,{ch} {spark} {cw},{ch}" '
               f'fill="{c}" fill-opacity="0.18"/><polyline points="{spark}" fill="none" stroke="{c}" '
               f'stroke-width="1.5"/></svg>')
        label = f'<div class="slabel">{html.escape(name)}</div>' if len(series) > 1 else ""
        cells.append(f'<div class="stat" style="width:{cw}px;height:{ch}px">{svg}{label}'
                     f'<div class="sval" style="color:{c}">{html.escape(fmt(v, unit))}</div></div>')
    return "".join(cells)


def render_html(dashboard: dict[str, Any], results: dict[int, PanelData], start: float, end: float,
                header: str, subheader: str) -> str:
    colw = (PAGE_W - MARGIN) / COLS
    blocks, bottom = [], 0
    for idx, panel in enumerate(dashboard.get("panels", [])):
        gp = panel.get("gridPos", {})
        gx, gy, gw, gh = gp.get("x", 0), gp.get("y", 0), gp.get("w", 12), gp.get("h", 8)
        left = MARGIN + gx * colw
        top = gy * (UNIT_H + MARGIN)
        width = gw * colw - MARGIN
        height = gh * UNIT_H + (gh - 1) * MARGIN
        bottom = max(bottom, top + height)
        title = html.escape(panel.get("title", ""))
        style = f"left:{left:.0f}px;top:{top:.0f}px;width:{width:.0f}px;height:{height:.0f}px"
        if panel.get("type") == "row":
            blocks.append(f'<div class="row" style="{style}">▾ {title}</div>')
            continue
        data = results.get(idx, PanelData())
        body_h = int(height) - 30
        inner_w = int(width) - 16
        if panel.get("type") == "stat":
            body = stat_html(panel, data, inner_w, body_h - 6)
        elif panel.get("type") == "timeseries":
            n = len([s for s in data.series if s[1]])
            if n == 0:
                body = '<div class="nodata">No data</div>'
            else:
                has_calcs = bool(panel.get("options", {}).get("legend", {}).get("calcs"))
                max_rows = 5
                rows = min(n, max_rows) + (1 if has_calcs else 0)
                leg_h = 17 * rows + 6
                chart_h = body_h - leg_h
                body = (svg_timeseries(panel, data, inner_w, chart_h, start, end)
                        + legend_html(panel, data, max_rows))
        else:
            body = f'<div class="noteval">panel type {html.escape(str(panel.get("type")))} is not rendered</div>'
        blocks.append(f'<div class="panel" style="{style}"><div class="ptitle">{title}</div>'
                      f'<div class="pbody">{body}</div></div>')
    css = """
body{margin:0;background:#111217;color:#ccccdc;font:13px Inter,Helvetica,Arial,sans-serif}
header{padding:12px 16px 10px;border-bottom:1px solid #2c3235;background:#181b1f}
header h1{margin:0 0 6px;font-size:20px;font-weight:500;color:#fff}
header p{margin:2px 0;font-size:13px;color:#b4bac4}
.grid{position:relative;margin:10px 0 20px}
.panel{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:2px;overflow:hidden}
.ptitle{height:28px;line-height:28px;padding:0 8px;font-weight:500;color:#fff;font-size:13px;white-space:nowrap;
 overflow:hidden;text-overflow:ellipsis}
.pbody{padding:0 8px 6px;position:relative}
.row{position:absolute;font-size:15px;font-weight:500;color:#fff;line-height:30px}
.legend{font-size:11px;border-collapse:collapse;width:100%}
.legend th{text-align:right;color:#6e9fff;font-weight:500;padding:0 6px}
.legend td{text-align:right;padding:0 6px;white-space:nowrap;height:16px}
.legend td.n{text-align:left;max-width:1px;overflow:hidden;text-overflow:ellipsis;width:100%}
.legend td.more{color:#9fa7b3}
.legend i{display:inline-block;width:14px;height:4px;border-radius:2px;margin:0 6px 3px 0;vertical-align:middle}
.stat{position:relative;display:inline-block}
.spark{position:absolute;left:0;top:0}
.sval{position:absolute;left:0;right:0;top:38%;text-align:center;font-size:40px;font-weight:500}
.slabel{position:absolute;left:0;right:0;top:12%;text-align:center;font-size:12px}
.nodata{color:#9fa7b3;text-align:center;padding-top:90px;font-size:15px}
.noteval{color:#FF9830;padding:30px 10px;font-size:12px}
"""
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(header)}</title>'
            f'<style>{css}</style></head><body><header><h1>{html.escape(header)}</h1>{subheader}</header>'
            f'<div class="grid" style="height:{bottom + MARGIN:.0f}px;width:{PAGE_W}px">{"".join(blocks)}</div>'
            f'</body></html>')


# ================================================================================================
# The data: Prometheus' range queries, over a run of the mixed load
# ================================================================================================

def with_window(expr: str, window: str | None) -> str:
    """``expr`` with every range (``[5m]``) replaced by ``window``; as written when None."""
    return expr if window is None else re.sub(r"\[\d+[smhdwy]\]", f"[{window}]", expr)


def panel_data(prom: Prometheus, dashboard: dict[str, Any], start: float, end: float,
               window: str | None) -> dict[int, PanelData]:
    """Every stat and time-series panel's series (by the panel's index), from query_range at STEP_S;
    a NaN (a quantile of no observations) is a gap, as Grafana draws it."""
    values = dashboard_queries.variables(dashboard, step_s=STEP_S, scrape_s=SCRAPE_S, range_s=end - start)
    out: dict[int, PanelData] = {}
    for idx, panel in enumerate(dashboard["panels"]):
        if panel["type"] not in ("stat", "timeseries"):
            continue
        data = out[idx] = PanelData()
        for target in panel["targets"]:
            expr = with_window(dashboard_queries.substitute(target["expr"], values), window)
            for s in sorted(prom.query_range(expr, start, end, STEP_S), key=lambda s: sorted(s["metric"].items())):
                points = [(float(t), float(v)) for t, v in s["values"] if math.isfinite(float(v))]
                data.series.append((legend_name(target.get("legendFormat"), s["metric"]), points))
    return out


def screenshot(html_text: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": PAGE_W, "height": 900})
            page.set_content(html_text)
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the load")
    ap.add_argument("--window", default="30s", help="range used for every [5m] window, or 'asis'")
    ap.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    args = ap.parse_args(argv)
    window = None if args.window == "asis" else args.window

    from conftest import running_stack
    from mixed_load import make_keys, run_load

    dashboard = dashboard_queries.load()
    with running_stack("gw-dash-preview-", default_rpm=100000, default_concurrency=1000) as gw, \
            running_prometheus(gw.stack.s) as prom:
        keys = make_keys(gw)
        prom.wait_scrapes(2)
        start = time.time()
        seen = run_load(gw.v1, keys, args.seconds)
        load_end = time.time()
        prom.wait_scrapes(4)
        end = time.time()
        results = panel_data(prom, dashboard, math.floor(start) - 4, math.ceil(end), window)
    kinds: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    for (kind, status), n in seen.items():
        kinds[kind] += n
        statuses[status] += n
    header = (f"{dashboard['title']} — deploy/grafana/gateway-dashboard.json drawn by deploy/grafana/preview.py "
              f"(not Grafana) from Prometheus' range queries over a {args.seconds:.0f}-second load")
    window_note = ("every range window as written" if window is None else
                   f"every range window written in the dashboard (e.g. [5m]) queried as [{window}] because the "
                   f"load lasts only {args.seconds:.0f} s")
    sub = (f"<p>Local stack (Envoy + ext_proc + Redis + PostgreSQL, simulator as model server) scraped every "
           f"{SCRAPE_S:g} s by Debian's Prometheus; load {_clock(start)}–{_clock(load_end)} UTC; query_range at "
           f"{STEP_S:g} s steps; alias = All; {html.escape(window_note)}.</p>"
           f"<p>Requests sent: {html.escape(', '.join(f'{k} {n}' for k, n in kinds.most_common()))} — HTTP "
           f"statuses seen by the clients: {html.escape(', '.join(f'{s}: {n}' for s, n in sorted(statuses.items())))}.</p>")
    page = render_html(dashboard, results, math.floor(start) - 4, math.ceil(end), header, sub)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    screenshot(page, out)
    for idx, data in sorted(results.items()):
        print(f"  panel {dashboard['panels'][idx]['title']!r}: {len([s for s in data.series if s[1]])} series "
              "with data", file=sys.stderr)
    print(f"screenshot: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
