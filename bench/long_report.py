"""The long-stream section of BENCHMARKS.md and its chart, bench/chart-streams.svg: the gap each system
adds between tokens against concurrency (bench/long_streams.py measures them)."""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from . import rounds
from .markdown import md_table, profile_lines

CHART = Path(__file__).resolve().parent / "chart-streams.svg"
TARGET_MS = 10.0  # the gateway's added gap p99 at 500 streams
ORDER = ["direct", "bare_envoy", "minimal_extproc", "gateway", "litellm"]
COLORS = {"direct": "#9e9e9e", "bare_envoy": "#4c78a8", "minimal_extproc": "#72b7b2", "gateway": "#e45756",
          "litellm": "#b279a2"}

METHOD = """\
C concurrent chat streams (C = {cs}) of {tokens} tokens, one SSE event every {cadence} ms, all opened
evenly over {ramp} ms, {n_rounds} rounds at each C with every system once per round (the order
reversed every other round){more}: each figure is the median of the rounds, the added gap taken within each
round against bare Envoy's of the same round, errors and streams counted over all rounds.  The upstream (`bench/sse_upstream.c`) and the load generator (`bench/sse_client.c`)
are small C programs the bench compiles with gcc into its temporary directory: the upstream keeps each
stream's cadence on a 1 ms timer wheel (epoll + timerfd), the client holds all C connections in one
epoll loop and records when each token event arrives.  A *gap* is the time between two consecutive
token events of one stream at the client (199 per stream).  **Added** = the system's gap percentile
minus bare Envoy's at the same C; bare Envoy's own row is minus the direct run (client straight to the
upstream), which shows the upstream and the client are not the bottleneck.  A gap p50 of 0 means most
token events arrive in the same read as the one before: the proxy has fallen behind the cadence and
hands over several events at once (the added p50 is then negative, and the p99 and the stream length
tell how far behind it is).  chunks/s = token events
delivered over the time from the first to the last (C × 40/s when every stream keeps pace; the ramp
and the streams' ends lower it a little); stream s: from the request to the last token (a stream that
keeps pace takes {nominal:.2f} s).  Errors: streams that did not end with
`data: [DONE]` after all {tokens} tokens within {timeout} s, by kind: status (a reply other than 200),
closed (the connection ended mid-stream), short (the stream ended without all its tokens and
`[DONE]`), timeout, connect.  KB per stream: peak RSS
during the cell minus RSS before the system's first long-stream cell, over C (the systems have served
the short-request cells before, up to 256 connections, so their allocators may already hold some of
that memory); "per added": the peak's growth from the previous C's cell, over the streams added — the
marginal cost, which the earlier cells cannot hide.  The headline's `kb_per_stream` is the gateway
ext_proc's KB per stream at the largest C measured.  CPU per chunk: the
process's utime + stime (/proc) over the cell, over the token events delivered.  Targets: at 500 streams the gateway adds ≤ 10 ms p99 with 0 errors; at 2,000 it holds every stream; ext_proc
≤ 20 KB per open stream; at every C the gateway adds no more than the minimal ext_proc.  The bench's
own Envoys (bare, minimal) lift Envoy's default circuit breakers (1,024 connections, pending and active
requests per cluster); the gateway's configuration keeps them, so beyond 1,024 streams its ext_proc
cluster refuses the rest (HTTP 500, `overflow` in its access log).  Every Envoy here runs one worker
(`--concurrency 1`) on 2 shared cores: where bare Envoy's own added gap grows, the reference itself
is saturated and the added figures of the others are flattered by as much."""

HEAD = ["system", "C", "gap p50 ms", "gap p99 ms", "added p50 ms", "added p99 ms", "chunks/s", "stream s p50",
        "errors", "ext_proc KB/stream", "(per added)", "Envoy KB/stream", "(per added)", "ext_proc µs/chunk",
        "Envoy µs/chunk"]


def _ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def _opt(r: dict[str, Any], key: str, nd: int = 1) -> str:
    v = r.get(key)
    return "–" if v is None else f"{v:,.{nd}f}"


def _errors(r: dict[str, Any]) -> str:
    kinds = [f"{r[k]:,} {k[len('errors_'):]}" for k in r if k.startswith("errors_") and r[k]]
    return f"{r['errors']:,}" + (f" ({', '.join(kinds)})" if kinds else "")


def table(ls: dict[str, Any]) -> list[list[str]]:
    out = []
    for c in ls["concurrency"]:
        for name in ORDER:
            s = ls["systems"].get(name)
            r = s and s["cells"].get(str(c))
            if not s:
                continue
            if not r:
                out.append([s["label"], f"{c:,}", "not run (failed at a lower C)"] + [""] * (len(HEAD) - 3))
                continue
            ref = " (vs direct)" if r.get("added_ref") == "direct" else ""
            out.append([s["label"], f"{c:,}", _ms(r["gap_p50_us"]), _ms(r["gap_p99_us"]),
                        _opt(r, "added_p50_ms", 2) + ref, rounds.mark(_opt(r, "added_p99_ms", 2), r.get("added_p99_ms_spread")) + ref,
                        f"{r['tokens_per_s']:,.0f}", f"{r['duration_p50_us'] / 1e6:.2f}", _errors(r),
                        _opt(r, "extproc_kb_per_stream"), _opt(r, "extproc_kb_per_added_stream"),
                        _opt(r, "envoy_kb_per_stream"), _opt(r, "envoy_kb_per_added_stream"),
                        _opt(r, "extproc_cpu_us_per_chunk"), _opt(r, "envoy_cpu_us_per_chunk")])
    return out


def targets(ls: dict[str, Any]) -> list[str]:
    """The long-stream targets against the gateway's cells: one line each, met or missed."""
    sy = ls["systems"]
    gw, mini = sy.get("gateway", {}).get("cells", {}), sy.get("minimal_extproc", {}).get("cells", {})
    out = []

    def line(ok: bool | None, text: str) -> None:
        out.append(f"- {'not measured' if ok is None else 'met' if ok else '**missed**'}: {text}")

    c500, c2000 = gw.get("500"), gw.get("2000")
    line(None if not c500 or c500.get("added_p99_ms") is None else c500["added_p99_ms"] <= TARGET_MS
         and c500["errors"] == 0, "at 500 streams the gateway adds ≤ 10 ms p99 with 0 errors" +
         (f" (added {c500.get('added_p99_ms')} ms, {c500['errors']} errors)" if c500 else ""))
    line(None if not c2000 else c2000["errors"] == 0, "at 2,000 streams the gateway holds every stream" +
         (f" ({c2000['errors']:,} errors, added p99 {c2000.get('added_p99_ms')} ms)" if c2000 else ""))
    largest = gw[max(gw, key=int)] if gw else None
    kb = largest and largest.get("extproc_kb_per_stream")
    line(None if kb is None else kb <= 20, f"ext_proc ≤ 20 KB per open stream ({kb} KB at the largest C)")
    worse = [c for c in gw if c in mini and gw[c].get("added_p99_ms") is not None
             and mini[c].get("added_p99_ms") is not None and gw[c]["added_p99_ms"] > mini[c]["added_p99_ms"]]
    line(None if not gw or not mini else not worse, "at every C the gateway adds no more (p99) than the minimal "
         "ext_proc" + (f" (more at C = {', '.join(worse)})" if worse else ""))
    return out


def _y(v: float) -> float:
    """Symmetric log: 0 at 0, one unit per decade above 1 ms."""
    return math.copysign(math.log10(1 + abs(v)), v)


def chart(ls: dict[str, Any], when: str) -> str:
    """Added gap p99 (ms, symmetric log scale) against C, one line per system."""
    cs = ls["concurrency"]
    series = {n: [(i, s["cells"][str(c)]) for i, c in enumerate(cs) if str(c) in s["cells"]]
              for n, s in ls["systems"].items() if n in ORDER and n != "direct"}
    vals = [r["added_p99_ms"] for pts in series.values() for _, r in pts if r.get("added_p99_ms") is not None]
    decades = max(1, math.ceil(math.log10(max(vals + [10.0]))))
    ymax = _y(10.0 ** decades)
    bottom = min(0.0, min([_y(v) for v in vals] + [0.0]))
    left, width, top, height = 70, 520, 50, 300

    def x(i: int) -> float:
        return left + width * (i + 0.5) / len(cs)

    def y(v: float) -> float:
        return top + height * (ymax - _y(v)) / (ymax - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 190}" height="{top + height + 50}" '
           'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14" font-weight="bold">Added gap between tokens, p99 (ms, vs '
           f'bare Envoy; bare Envoy vs direct)</text>', f'<text x="{left}" y="36" fill="#555">{html.escape(when)}</text>']
    for v in [0.0] + [10.0 ** d for d in range(decades + 1)]:
        out.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + width}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#555">{v:g}</text>')
    out.append(f'<line x1="{left}" y1="{y(TARGET_MS):.1f}" x2="{left + width}" y2="{y(TARGET_MS):.1f}" '
               'stroke="#e45756" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{left + 4}" y="{y(TARGET_MS) - 4:.1f}" fill="#e45756">target at 500 streams: '
               f'≤ {TARGET_MS:g} ms</text>')
    for i, c in enumerate(cs):
        out.append(f'<text x="{x(i):.1f}" y="{top + height + 18}" text-anchor="middle">{c:,} streams</text>')
    for li, (n, pts) in enumerate(series.items()):
        pts = [(i, r) for i, r in pts if r.get("added_p99_ms") is not None]
        path = " ".join(f"{x(i):.1f},{y(r['added_p99_ms']):.1f}" for i, r in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{COLORS[n]}" stroke-width="2"/>')
        for i, r in pts:
            mark = f' ({r["errors"]} err)' if r["errors"] else ""
            out.append(f'<circle cx="{x(i):.1f}" cy="{y(r["added_p99_ms"]):.1f}" r="3" fill="{COLORS[n]}"/>')
            out.append(f'<text x="{x(i) + 5:.1f}" y="{y(r["added_p99_ms"]) - 5:.1f}" fill="{COLORS[n]}">'
                       f'{r["added_p99_ms"]:g}{mark}</text>')
        ly = top + 10 + li * 18
        out.append(f'<rect x="{left + width + 20}" y="{ly}" width="10" height="10" fill="{COLORS[n]}"/>')
        out.append(f'<text x="{left + width + 34}" y="{ly + 9}">{html.escape(ls["systems"][n]["label"])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def section(ls: dict[str, Any], prof: dict[str, Any] | None, timestamp: str, when: str,
            short_when: str) -> list[str]:
    """Markdown lines; writes the chart (its subtitle: ``short_when``)."""
    CHART.write_text(chart(ls, short_when))
    parts = ["## Long streams: the gap added between tokens", "",
             METHOD.format(cs=", ".join(f"{c:,}" for c in ls["concurrency"]), tokens=ls["tokens"],
                           n_rounds=ls.get("rounds", 1),
                           more=(f", then {ls['headline_rounds']} more of bare Envoy and the gateway at the headline's "
                                 f"C = 500" if ls.get("headline_rounds") else ""),
                           cadence=ls["cadence_ms"], ramp=ls["ramp_ms"], timeout=ls["timeout_s"],
                           nominal=(ls["tokens"] - 1) * ls["cadence_ms"] / 1000), "",
             md_table(HEAD, table(ls)), "", rounds.WIDE_NOTE, "",
             "![added gap p99 against concurrency](bench/chart-streams.svg)", "", "Targets:", "",
             *targets(ls), ""]
    gave = {s["label"]: s["gave_up_after"] for s in ls["systems"].values() if "gave_up_after" in s}
    parts += [f"{k} failed more than half its streams at C = {v:,} and was not run at a higher C." for k, v in gave.items()]
    parts += ["", f"### Profile of the gateway's ext_proc through the {ls['profiled_c']:,}-stream cell", "",
              *profile_lines(prof, timestamp, "chunks/s")]
    return parts + [""]
