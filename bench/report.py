"""The terminal table, BENCHMARKS.md and bench/chart.svg (hand-written SVG, no plotting library).

BENCHMARKS.md keeps the latest comparison and the latest soak as a JSON comment at its end, so a soak
run does not erase the comparison table and vice versa."""
from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

from . import cpu_split, long_report
from .markdown import md_table, profile_lines

ROOT = Path(__file__).resolve().parent.parent
MD = ROOT / "BENCHMARKS.md"
CHART = ROOT / "bench" / "chart.svg"
ORDER = ["direct", "bare_envoy", "minimal_extproc", "gateway", "gateway_w2", "litellm"]
DATA_RE = re.compile(r"<!-- bench-data\n(.*?)\n-->", re.S)
WORKERS_ROW = "gateway, 2 ext_proc processes (GATEWAY_EXTPROC_WORKERS=2)"


def _f(v: float | None, nd: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{nd}f}"


def rows(cmp: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    sy = cmp["systems"]
    bare = sy.get("bare_envoy", {}).get("cells", {}).get("latency")
    chunks = cmp["stream_chunks_per_reply"]
    head = ["system", "chat req/s c64", "chat req/s c256", "stream req/s c64", "stream chunks/s",
            "embeddings req/s", "models req/s", "p50 ms c1", "p99 ms c1", "p50 − bare ms", "p99 − bare ms",
            "errors"]
    out = []
    for name in ORDER:
        s = sy.get(name)
        if s is None:
            continue
        c = s["cells"]

        def rps(cell: str) -> str:
            if cell in c:
                return (_f(c[cell]["rps"]) + ("*" if c[cell].get("noisy") else "")
                        + ("†" if c[cell].get("few") else ""))
            scen = cell.split("_")[0]
            return "invalid" if scen in s["invalid"] else "–"

        lat = c.get("latency")
        p50 = lat and lat["p50_us"] / 1000
        p99 = lat and lat["p99_us"] / 1000
        d50 = None if not lat or not bare else (lat["p50_us"] - bare["p50_us"]) / 1000
        d99 = None if not lat or not bare else (lat["p99_us"] - bare["p99_us"]) / 1000
        errs = sum(int(x["errors"]) for x in c.values())
        out.append([s["label"], rps("chat"), rps("chat_c256"), rps("stream"),
                    _f(c["stream"]["rps"] * chunks) if "stream" in c else "–",
                    rps("embeddings"), rps("models"), _f(p50, 2), _f(p99, 2),
                    "–" if name in ("bare_envoy",) else _f(d50, 2), "–" if name == "bare_envoy" else _f(d99, 2),
                    str(errs) + (f" (+{len(s['invalid'])} invalid)" if s["invalid"] else "")])
    if "gateway_w2" not in sy:  # an older comparison, or the one-process gateway failed its chat cell
        out.append([WORKERS_ROW] + ["not measured"] + [""] * (len(head) - 2))
    return head, out


def workers_rows(cmp: dict[str, Any]) -> list[list[str]]:
    """Throughput vs ext_proc processes: non-streaming chat at 64 connections, 1 and 2 processes."""
    sy = cmp["systems"]
    one = sy.get("gateway", {}).get("cells", {}).get("chat")
    out = [["1", _f(one["rps"]) if one else "not measured", "1.00×" if one else "–",
            str(one["errors"]) if one else "–"]]
    two = sy.get("gateway_w2", {}).get("cells", {}).get("chat")
    if two:
        out.append(["2 (GATEWAY_EXTPROC_WORKERS=2)", _f(two["rps"]) + ("*" if two.get("noisy") else ""),
                    f"{two['rps'] / one['rps']:.2f}×" if one and one["rps"] else "–", str(two["errors"])])
    else:
        out.append(["2 (GATEWAY_EXTPROC_WORKERS=2)", "not measured", "–", "–"])
    return out


WORKERS_HEAD = ["ext_proc processes", "chat req/s c64", "vs 1 process", "errors"]


def ratios(cmp: dict[str, Any]) -> list[tuple[str, str]]:
    sy = cmp["systems"]

    def r(a: str, b: str, cell: str) -> str:
        x = sy.get(a, {}).get("cells", {}).get(cell)
        y = sy.get(b, {}).get("cells", {}).get(cell)
        return "–" if not x or not y or not y["rps"] else f"{x['rps'] / y['rps']:.2f}×"

    out = []
    for cell in ("chat", "chat_c256", "stream", "embeddings", "models"):
        out.append((cell, f"vs bare Envoy {r('gateway', 'bare_envoy', cell)}, vs minimal ext_proc "
                          f"{r('gateway', 'minimal_extproc', cell)}, vs LiteLLM {r('gateway', 'litellm', cell)}"))
    g, m = sy.get("gateway", {}).get("cells", {}).get("models"), sy.get("minimal_extproc", {}).get("cells", {}).get("chat")
    if g and m and m["rps"]:
        out.append(("models vs minimal chat", f"{g['rps'] / m['rps']:.2f}× (target: 2×; "
                                              "`models_ratio_vs_minimal` in the headline)"))
    return out


NOISY = ("`*` the machine was more than 25% busy just before this cell (other processes, or a system still "
         "working off the previous cell): the figure is likely low")


FEW = ("`†` fewer than two requests completed per connection in the cell (QUICK mode does not run it "
       "again longer): a rough figure")


def terminal_table(cmp: dict[str, Any]) -> str:
    head, body = rows(cmp)
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    measured = [r for r in body if r[1] != "not measured"]
    widths[0] = max(len(r[0]) for r in [head] + measured)
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    lines.append("-" * len(lines[0]))
    for r in measured:
        lines.append("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
    lines += [f"{r[0]}: not measured" for r in body if r[1] == "not measured"]
    if any(x.get("noisy") for s in cmp["systems"].values() for x in s["cells"].values()):
        lines.append(NOISY)
    if any(x.get("few") for s in cmp["systems"].values() for x in s["cells"].values()):
        lines.append(FEW)
    lines.append("")
    lines.append("throughput vs ext_proc processes (gateway, chat c64): " + "; ".join(
        f"{r[0].split(' ')[0]} → " + (f"{r[1]} req/s ({r[2]})" if r[1] != "not measured" else r[1])
        for r in workers_rows(cmp)))
    lines.append("")
    lines.append("gateway throughput ratios:")
    for cell, text in ratios(cmp):
        lines.append(f"  {cell:11s} {text}")
    lines += [f"  {note}" for note in _notes(cmp)]
    return "\n".join(lines)


def _notes(cmp: dict[str, Any]) -> list[str]:
    """What the figures leave out: cells not measured, LiteLLM skipped, the gateway's own errors."""
    out = [f"not measured: {s['label']}, {scen}: functional check failed: {why}"
           for s in cmp["systems"].values() for scen, why in s["invalid"].items()]
    if cmp.get("litellm_note"):
        out.append(cmp["litellm_note"])
    ed = cmp["systems"].get("gateway", {}).get("error_detail")
    if ed and (ed["extproc_exceptions"] or set(ed["statuses"]) - {"0"}):
        out.append("gateway's own logs over all its cells (HTTP 0 = client gone at the end of a cell): "
                   + _error_text(ed))
    return out


def _error_text(ed: dict[str, Any]) -> str:
    parts = [f"{n} × HTTP {k}" for k, n in sorted(ed["details"].items(), key=lambda x: -x[1])]
    parts += [f"{n} × {k}" for k, n in ed["extproc_exceptions"].items()]
    return "; ".join(parts)


# ---- chart ---------------------------------------------------------------------------------------
COLORS = {"direct": "#9e9e9e", "bare_envoy": "#4c78a8", "minimal_extproc": "#72b7b2", "gateway": "#e45756",
          "gateway_w2": "#f58518", "litellm": "#b279a2"}


def chart(cmp: dict[str, Any]) -> str:
    """Grouped horizontal bars of requests/s per scenario, log scale."""
    sy = cmp["systems"]
    groups = [("chat", "chat c64"), ("chat_c256", "chat c256"), ("stream", "stream c64 (64 chunks)"),
              ("embeddings", "embeddings c64 (16×1024)"), ("models", "GET /v1/models c64")]
    names = [n for n in ORDER if n in sy]
    vals = [v["rps"] for n in names for v in sy[n]["cells"].values() if v["rps"] > 0]
    lo = 10 ** math.floor(math.log10(min(vals))) if vals else 1
    hi = 10 ** math.ceil(math.log10(max(vals))) if vals else 10
    left, width, bar, gap = 190, 560, 14, 16
    height_g = bar * len(names) + gap
    top = 50
    h = top + height_g * len(groups) + 60
    x = lambda v: left + width * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 110}" height="{h}" '
           f'font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14" font-weight="bold">Requests per second, same fixed-reply '
           f'upstream (log scale)</text>',
           f'<text x="{left}" y="36" fill="#555">{html.escape(cmp.get("_when", ""))}</text>']
    d = lo
    while d <= hi:
        for m in (1, 2, 5):
            v = d * m
            if lo <= v <= hi:
                xx = x(v)
                out.append(f'<line x1="{xx:.1f}" y1="{top - 4}" x2="{xx:.1f}" y2="{top + height_g * len(groups)}" '
                           f'stroke="#ddd"/>')
                out.append(f'<text x="{xx:.1f}" y="{top + height_g * len(groups) + 14}" text-anchor="middle" '
                           f'fill="#555">{v:,.0f}</text>')
        d *= 10
    for gi, (cell, title) in enumerate(groups):
        y0 = top + gi * height_g
        out.append(f'<text x="{left - 8}" y="{y0 + bar * len(names) / 2 + 4}" text-anchor="end" '
                   f'font-weight="bold">{html.escape(title)}</text>')
        for ni, n in enumerate(names):
            c = sy[n]["cells"].get(cell)
            y = y0 + ni * bar
            if c is None or c["rps"] <= 0:
                continue
            out.append(f'<rect x="{left}" y="{y}" width="{max(1.0, x(c["rps"]) - left):.1f}" height="{bar - 2}" '
                       f'fill="{COLORS[n]}"/>')
            out.append(f'<text x="{x(c["rps"]) + 4:.1f}" y="{y + bar - 4}" fill="#333">{c["rps"]:,.0f}'
                       f'{" (" + str(c["errors"]) + " err)" if c["errors"] else ""}</text>')
    ly = top + height_g * len(groups) + 34
    short = {"gateway_w2": "gateway, 2 ext_proc"}
    for ni, n in enumerate(names):
        lx = left - 150 + ni * 130 if len(names) > 5 else left + ni * 120
        out.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{COLORS.get(n, "#666")}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly + 9}">{html.escape(short.get(n, sy[n]["label"]))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---- BENCHMARKS.md ------------------------------------------------------------------------------
METHOD = """\
Regenerated by `make bench` (`bench/run.py`); edit the harness, not this file.

## How it is measured

- **One fixed-reply upstream** for every system: a separate Envoy (`--concurrency 1`) whose routes are
  `direct_response`s behind a buffer filter (it reads each request whole and keeps connections alive).
  Listener 1 answers `/v1/chat/completions` with a chat completion JSON (`usage` included),
  `/v1/embeddings` with 16 × 1024 floats (~130 KB), `/v1/models` with a list; listener 2 answers
  `/v1/chat/completions` with a vLLM-style SSE stream: 64 content chunks, a usage chunk, `data: [DONE]`
  (~14 KB, written at once: not paced).
- **Systems**, each Envoy with `--concurrency 1`: *direct* (wrk → upstream); *bare Envoy* (the gateway's
  listener/route/cluster shape — buffer filter, request-id generation, access log, timeouts, retry
  policy — no ext_proc; a request header picks the upstream listener since Envoy cannot read the body);
  *minimal ext_proc* (`bench/minimal_extproc.py`, grpc.aio, behind the gateway's ext_proc filter settings:
  `message_timeout` 5 s, BUFFERED bodies, mode override, graceful stream close; answers all four phases at once and only rewrites
  `model`: JSON parse + dump of the request and of JSON replies up to 64 KiB, a bytes replace in the
  ~130 KB embeddings reply — a JSON round trip of it would make the reference slower than the gateway —
  and in each streamed chunk);
  *gateway* (the full stack from `control.launcher.Stack`: Envoy, ext_proc, Redis, PostgreSQL, usage
  writer; a catalog pointing at the upstream, an organisation with a large balance and a key made with
  `control.admin.Admin`; rate and concurrency limits set high so nothing is rejected; the launcher's
  Envoy worker count set to 1 like the others — the only change); *LiteLLM* (`litellm[proxy]` in
  `bench/.venv-litellm`, one worker per core, no database, offline, models as `openai/<name>` with
  `api_base` at the upstream).
- **Load**: `wrk -t1` (one thread, same settings for every system, `--timeout 30s`) with the Lua scripts
  in `bench/lua/`; every system is first checked functionally (status, content, 64 chunks + `[DONE]`,
  embeddings shape, the alias in `model`); a failed check is reported and that cell is not measured.
  The streaming script checks every reply ends with `data: [DONE]`. Errors = socket errors (connect, read,
  write, timeout) + replies with status ≥ 400 (+ bad streams); requests/s count successful replies only.
- **Cells**: 8 s each (2 s with `QUICK=1`; no 256-connection run against the bare upstream; QUICK also
  leaves out LiteLLM's 256-connection run and the bare upstream's embeddings and models runs); before
  each, up to 3 s (0.5 s) of waiting for the machine to be quiet — a proxy may still
  be working off requests wrk dropped — and a cell that still starts on a machine more than 25% busy is
  marked `*`; a cell that completes fewer than two requests per connection is run again twice as long
  (QUICK mode only marks it `†`).
- **Latency** is measured at one connection on non-streaming chat; "− bare" is the system's percentile
  minus bare Envoy's.
- wrk, the upstream Envoy, the proxy under test and (where there is one) its Python process share the
  machine's cores: absolute numbers are for comparison on this machine only.
"""


def _load_data() -> dict[str, Any]:
    if MD.exists():
        m = DATA_RE.search(MD.read_text())
        if m:
            try:
                return dict(json.loads(m.group(1)))
            except ValueError:
                pass
    return {}


SOAK_NOTE = """History: with grpcio's asyncio server the ext_proc's memory grew 25–100 bytes per request, because
grpcio never frees a gRPC batch that fails and Envoy used to reset each ext_proc stream before the final
status had gone out (grpc/grpc#43360). Envoy's runtime flag
`envoy.reloadable_features.ext_proc_graceful_grpc_close` (set in envoy/envoy.yaml) makes Envoy half-close
the stream and wait for the status, which stopped it; the ext_proc now serves gRPC with its own HTTP/2
server (extproc/h2.py), which keeps nothing of a stream once it has ended or been reset, and ends each
stream itself after its last answer. The usage writer (a process of its own) is sampled too."""


def update_markdown(doc: dict[str, Any]) -> None:
    data = _load_data()
    if doc.get("comparison"):
        data["comparison"] = {k: doc[k] for k in ("timestamp", "machine", "comparison", "headline")}
    if doc.get("soak"):
        data["soak"] = {k: doc[k] for k in ("timestamp", "machine", "soak")}
    parts = ["# Benchmarks", "", METHOD]
    c = data.get("comparison")
    if c:
        cmp = c["comparison"]
        m = c["machine"]
        when = (f"{c['timestamp']}, {cmp['mode']} mode ({cmp['cell_seconds']:.0f} s per cell), {m['cores']} cores "
                f"{m['cpu']}, Envoy {m['envoy'].split('/')[1] if '/' in m['envoy'] else m['envoy']}, "
                f"Python {m['python']}, {m['wrk'].split(' Copyright')[0]}; machine "
                f"{100 * m.get('busy_before_start', 0):.0f}% busy before the run started")
        cmp["_when"] = f"{c['timestamp']} · {cmp['mode']} mode · {m['cores']} cores"
        CHART.write_text(chart(cmp))
        head, body = rows(cmp)
        noisy = any(x.get("noisy") for s in cmp["systems"].values() for x in s["cells"].values())
        parts += ["## Latest comparison", "", when, "", md_table(head, body), "",
                  *([NOISY, ""] if noisy else []),
                  *([FEW, ""] if any(x.get("few") for s in cmp["systems"].values() for x in s["cells"].values()) else []),
                  "Gateway throughput ratios:", ""]
        parts += [f"- {cell}: {text}" for cell, text in ratios(cmp)]
        parts += [f"- {note}" for note in _notes(cmp)]
        parts += ["", "![requests per second](bench/chart.svg)", "",
                  "Headline (the last line `make bench` prints):", "", "```json",
                  json.dumps(c["headline"]), "```", ""]
        parts += cpu_split.section(cmp)
        parts += ["## Profile of the gateway's ext_proc (non-streaming chat, c64)", "",
                  *profile_lines(cmp.get("profile"), c["timestamp"], "req/s")]
        parts.append("")
        if cmp.get("long_streams"):
            parts += long_report.section(cmp["long_streams"], cmp.get("long_profile"), c["timestamp"], when,
                                         cmp["_when"])
    else:
        parts += ["## Latest comparison", "", "Not run yet: `make bench`.", ""]
    parts += ["## Throughput vs ext_proc processes", ""]
    if c:
        parts += ["The gateway stack with `GATEWAY_EXTPROC_WORKERS` ext_proc processes behind its one Envoy "
                  "(`--concurrency 1`, least-request balancing of the requests' gRPC streams), non-streaming "
                  f"chat at 64 connections, {c['machine']['cores']} cores; the 2-process stack is started after "
                  "the 1-process one has stopped and measured the same way. Every process shares the cores with "
                  "Envoy, Redis, PostgreSQL, wrk and the upstream: more processes than free cores buy nothing.", "",
                  md_table(WORKERS_HEAD, workers_rows(c["comparison"])), ""]
        per = c["comparison"]["systems"].get("gateway_w2", {}).get("requests_per_process")
        if per:
            parts += ["Requests served per process over the 2-process stack's check, warm-up and cell: "
                      + ", ".join(f"{k} {v:,}" for k, v in per.items()) + ".", ""]
    else:
        parts += ["Not run yet: `make bench`.", ""]
    s = data.get("soak")
    parts += ["## Soak", ""]
    if s:
        sk = s["soak"]
        w = sk["wrk"]
        first, last = sk["samples"][0], sk["samples"][-1]
        ref = next((x for x in sk["samples"] if x["t_s"] >= sk["rss_ref_t_s"]), first)
        parts += [f"`make bench SOAK={sk['seconds']}` at {s['timestamp']}: {sk['mix']} at {sk['conns']} connections; "
                  f"{_f(w['rps'], 1)} req/s, {w['requests']:,} requests, errors {w['errors']}. ext_proc RSS "
                  f"{ref['rss_kb'] / 1024:.1f} MiB at t={ref['t_s']} s → {last['rss_kb'] / 1024:.1f} MiB at "
                  f"t={last['t_s']} s (**{sk['rss_growth_pct']}%**), open descriptors {ref['fds']} → {last['fds']}."]
        if "writer_rss_kb" in last:  # the usage writer, a process of its own since it left the ext_proc
            parts[-1] += (f" Usage writer RSS {ref['writer_rss_kb'] / 1024:.1f} → {last['writer_rss_kb'] / 1024:.1f} MiB "
                          f"({sk['writer_rss_growth_pct']}%), descriptors {ref['writer_fds']} → {last['writer_fds']}.")
            parts += ["", "| t (s) | ext_proc RSS (MiB) | fds | usage writer RSS (MiB) | fds |",
                      "|---:|---:|---:|---:|---:|"]
            parts += [f"| {x['t_s']} | {x['rss_kb'] / 1024:.1f} | {x['fds']} | {x['writer_rss_kb'] / 1024:.1f} | "
                      f"{x['writer_fds']} |" for x in sk["samples"]]
        else:
            parts += ["", "| t (s) | RSS (MiB) | fds |", "|---:|---:|---:|"]
            parts += [f"| {x['t_s']} | {x['rss_kb'] / 1024:.1f} | {x['fds']} |" for x in sk["samples"]]
    else:
        parts.append("Not run yet: `make bench SOAK=600`.")
    parts += ["", SOAK_NOTE]
    parts += ["", "<!-- bench-data", json.dumps(data, separators=(",", ":")), "-->", ""]
    # Sections written by hand or by the single-purpose scripts (bench/refusal_cost.py,
    # bench/event_loop.py) follow the data comment; they are kept as they are.
    old = MD.read_text() if MD.exists() else ""
    kept = DATA_RE.search(old)
    extra = old[kept.end():].strip() if kept else ""
    MD.write_text("\n".join(parts) + ("\n" + extra + "\n" if extra else ""))
