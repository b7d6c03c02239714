"""The terminal table, BENCHMARKS.md and bench/chart.svg (hand-written SVG, no plotting library).

The latest comparison and the latest soak are kept in bench/latest.json (without their rounds' raw
cells: those are in bench/results/), so a soak run does not erase the comparison and vice versa;
BENCHMARKS.md is written from it whole, up to ``KEPT``: text below that line is kept as it is."""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from . import cpu_split, grpc_servers, long_report, resp_ab, rounds
from .markdown import md_table, profile_lines

ROOT = Path(__file__).resolve().parent.parent
MD = ROOT / "BENCHMARKS.md"
CHART = ROOT / "bench" / "chart.svg"
ORDER = ["direct", "bare_envoy", "minimal_extproc", "gateway", "gateway_w2", "litellm"]
LATEST = ROOT / "bench" / "latest.json"
KEPT = "<!-- make bench writes everything above this line; what follows it is kept as it is -->"
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
                return (rounds.mark(_f(c[cell]["rps"]), c[cell].get("rps_spread")) + ("*" if c[cell].get("noisy") else "")
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


def ratio_rounds(sy: dict[str, Any], a: str, b: str, cell: str, cell_b: str | None = None) -> list[float]:
    """``a``'s requests/s in ``cell`` over ``b``'s in ``cell_b`` (the same cell unless given), round by round."""
    ra, rb = sy.get(a, {}).get("rounds", []), sy.get(b, {}).get("rounds", [])
    return [x[cell]["rps"] / y[cell_b or cell]["rps"] for x, y in zip(ra, rb)
            if cell in x and (cell_b or cell) in y and y[cell_b or cell]["rps"]]


def ratio_text(vals: list[float]) -> str:
    """The rounds' median ratio, its spread, marked when wide."""
    m, sp = rounds.median(vals), rounds.spread(vals)
    if m is None:
        return "–"
    return rounds.mark(f"{m:.2f}×", sp) + ("" if sp is None else f" (spread {sp:.0%})")


def ratios(cmp: dict[str, Any]) -> list[tuple[str, str]]:
    sy = cmp["systems"]
    out = []
    for cell in ("chat", "chat_c256", "stream", "embeddings", "models"):
        out.append((cell, f"vs bare Envoy {ratio_text(ratio_rounds(sy, 'gateway', 'bare_envoy', cell))}, "
                          f"vs minimal ext_proc {ratio_text(ratio_rounds(sy, 'gateway', 'minimal_extproc', cell))}, "
                          f"vs LiteLLM {ratio_text(ratio_rounds(sy, 'gateway', 'litellm', cell))}"))
    models = ratio_rounds(sy, "gateway", "minimal_extproc", "models", "chat")
    if models:
        out.append(("models vs minimal chat", f"{ratio_text(models)} (target: 2×; "
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
    lines.append(rounds.WIDE_NOTE)
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
- **Cells**: 5 s each (2 s with `QUICK=1`; no 256-connection run against the bare upstream; QUICK also
  leaves out LiteLLM's 256-connection run and the bare upstream's embeddings and models runs); before
  each, up to 3 s (0.5 s) of waiting for the machine to be quiet — a proxy may still
  be working off requests wrk dropped — and a cell that still starts on a machine more than 25% busy is
  marked `*`; a cell that completes fewer than two requests per connection is run again twice as long
  (QUICK mode only marks it `†`).
- **Rounds**: every cell is run in 5 rounds (`QUICK=1`: the short cells 5, the long streams and the cells
  beside the comparison 3). The cells the headline's ratios compare then get more rounds of their own:
  chat on bare Envoy, the minimal, the gateway and LiteLLM, the burst on the minimal and the gateway, the
  gateway's models (4 more, `QUICK=1` 6: 9 and 11 in all), and the 500 long streams on bare Envoy and
  the gateway (2 more, `QUICK=1` 3); a round of those costs a quarter of a full one. `--rounds N` runs
  every cell N rounds and no more. A round goes cell by cell, each cell on
  every system in turn, in the opposite order every other round, so a drift of the shared machine's
  speed falls on all systems alike and the two cells a ratio compares are measured seconds apart
  (`bench/rounds.py`, `bench/run.py`). A figure is the median over the rounds; a ratio is
  taken within each round and then its median. The
  *spread* is the rounds' range over the median, (max − min) / median, and every headline figure has
  one (`<figure>_spread` in the headline JSON); a figure whose spread is wider than 10% is marked `~`
  and listed in the headline's `wide_spread`. Errors are counted over every round. A `QUICK=1` run
  takes about 15 minutes on 2 cores (the run below says how long it took; LiteLLM's first install adds a
  few), a full run about four times as long (estimated from the cells' count and length).
- **Latency** is measured at one connection on non-streaming chat; "− bare" is the system's percentile
  minus bare Envoy's.
- wrk, the upstream Envoy, the proxy under test and (where there is one) its Python process share the
  machine's cores: absolute numbers are for comparison on this machine, within one run only; compare
  ratios, not requests/s, across runs.
"""


def _load_data() -> dict[str, Any]:
    try:
        return dict(json.loads(LATEST.read_text()))
    except (OSError, ValueError):
        return {}


def _slim(cmp: dict[str, Any]) -> dict[str, Any]:
    """The comparison as bench/latest.json keeps it: each round's cells only by their requests/s (what
    the per-round ratios need), the long streams' rounds left to bench/results/."""
    out = dict(cmp)
    out["systems"] = {n: {**s, "rounds": [{c: {"rps": round(r["rps"], 1)} for c, r in rd.items()}
                                          for rd in s.get("rounds", [])]} for n, s in cmp["systems"].items()}
    if cmp.get("long_streams"):
        ls = dict(cmp["long_streams"])
        ls["systems"] = {n: {k: v for k, v in s.items() if k != "rounds"} for n, s in ls["systems"].items()}
        out["long_streams"] = ls
    return out


def headline_table(h: dict[str, Any]) -> list[str]:
    """The headline's figures, their spread over the rounds, marked when wide."""
    body = []
    for k, v in h.items():
        if k.endswith("_spread") or k in ("wide_spread", "rounds"):
            continue
        sp = h.get(f"{k}_spread")
        text = "–" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:,.3f}".rstrip("0").rstrip(".")
        body.append([f"`{k}`", rounds.mark(text, sp), "–" if sp is None else f"{sp:.1%}"])
    return [md_table(["figure", "median", "spread"], body), "", rounds.WIDE_NOTE]


def update_markdown(doc: dict[str, Any]) -> None:
    data = _load_data()
    if doc.get("comparison"):
        data["comparison"] = {"timestamp": doc["timestamp"], "machine": doc["machine"],
                              "comparison": _slim(doc["comparison"]), "headline": doc["headline"],
                              "wall_seconds": doc.get("wall_seconds")}
    if doc.get("soak"):
        data["soak"] = {k: doc[k] for k in ("timestamp", "machine", "soak")}
    LATEST.write_text(json.dumps(data, indent=1) + "\n")
    parts = ["# Benchmarks", "", METHOD]
    c = data.get("comparison")
    if c:
        parts += comparison_sections(c)
    else:
        parts += ["## Latest comparison", "", "Not run yet: `make bench`.", ""]
    s = data.get("soak")
    parts += ["## Soak", ""]
    parts += soak_lines(s["soak"], s["timestamp"]) if s else ["Not run yet: `make bench SOAK=600`."]
    parts += ["", SCRIPTS, "", KEPT]
    old = MD.read_text() if MD.exists() else ""
    extra = old.split(KEPT, 1)[1].strip() if KEPT in old else ""
    MD.write_text("\n".join(parts) + "\n" + (extra + "\n" if extra else ""))


def comparison_sections(c: dict[str, Any]) -> list[str]:
    cmp = c["comparison"]
    m = c["machine"]
    wall = c.get("wall_seconds")
    other = cmp.get("other_rounds", cmp.get("rounds", 1))
    rounds_said = (f"{cmp.get('rounds', 1)} rounds" if other == cmp.get("rounds", 1)
                   else f"{cmp.get('rounds', 1)} rounds of the short cells, {other} of the long streams")
    ls_more = (cmp.get("long_streams") or {}).get("headline_rounds", 0)
    if cmp.get("headline_rounds") or ls_more:
        rounds_said += (f", and {cmp.get('headline_rounds', 0)} more of the headline's short cells and {ls_more} "
                        "of its long-stream cell")
    when = (f"{c['timestamp']}, {cmp['mode']} mode ({cmp['cell_seconds']:.0f} s per cell, {rounds_said}"
            f"{'' if wall is None else f', {wall / 60:.0f} minutes in all'}), {m['cores']} cores "
            f"{m['cpu']}, Envoy {m['envoy'].split('/')[1] if '/' in m['envoy'] else m['envoy']}, "
            f"Python {m['python']}, {m['wrk'].split(' Copyright')[0]}; machine "
            f"{100 * m.get('busy_before_start', 0):.0f}% busy before the run started")
    cmp["_when"] = f"{c['timestamp']} · {cmp['mode']} mode · {m['cores']} cores"
    CHART.write_text(chart(cmp))
    head, body = rows(cmp)
    cells = [x for s in cmp["systems"].values() for x in s["cells"].values()]
    parts = ["## Latest comparison", "", "Every figure from here to the soak is from this one run: " + when + ".", "",
             "### Headline", "", "The last line `make bench` prints, as a table (medians over the rounds):", "",
             *headline_table(c["headline"]), "",
             "### Requests per second (medians over the rounds)", "", md_table(head, body), "",
             *([NOISY, ""] if any(x.get("noisy") for x in cells) else []),
             *([FEW, ""] if any(x.get("few") for x in cells) else []),
             rounds.WIDE_NOTE, "", "Gateway throughput ratios (each round's, their median and spread):", ""]
    parts += [f"- {cell}: {text}" for cell, text in ratios(cmp)]
    parts += [f"- {note}" for note in _notes(cmp)]
    parts += ["", "![requests per second](bench/chart.svg)", ""]
    parts += cpu_split.section(cmp)
    parts += ["## Profile of the gateway's ext_proc (non-streaming chat, c64)", "",
              *profile_lines(cmp.get("profile"), c["timestamp"], "req/s"), ""]
    if cmp.get("long_streams"):
        parts += long_report.section(cmp["long_streams"], cmp.get("long_profile"), c["timestamp"], when,
                                     cmp["_when"])
    parts += ["## Throughput vs ext_proc processes", "",
              "The gateway stack with `GATEWAY_EXTPROC_WORKERS` ext_proc processes behind its one Envoy "
              "(`--concurrency 1`, least-request balancing of the requests' gRPC streams), non-streaming "
              f"chat at 64 connections, {m['cores']} cores; the 2-process stack is started after "
              "the 1-process one has stopped and measured the same way. Every process shares the cores with "
              "Envoy, Redis, PostgreSQL, wrk and the upstream: more processes than free cores buy nothing.", "",
              md_table(WORKERS_HEAD, workers_rows(cmp)), ""]
    per = cmp["systems"].get("gateway_w2", {}).get("requests_per_process")
    if per:
        parts += ["Requests served per process over the 2-process stack's check, warm-up and cells: "
                  + ", ".join(f"{k} {v:,}" for k, v in per.items()) + ".", ""]
    if cmp.get("grpc_servers"):
        parts += grpc_servers.section(cmp["grpc_servers"])
    if cmp.get("resp_client"):
        parts += resp_ab.section(cmp["resp_client"])
    if cmp.get("redis"):
        parts += redis_section(cmp["redis"])
    if cmp.get("redis_cluster"):
        parts += redis_cluster_section(cmp["redis_cluster"])
    return parts


def redis_cluster_section(c: dict[str, Any]) -> list[str]:
    one, three = c["one_shard"], c["three_shards"]
    return ["## The Redis Cluster ceiling", "",
            "`bench/redis_cluster_ceiling.py`: the same requests sent to a Redis Cluster as the ext_proc sends "
            "them there (the key record read first, then each script on its organisation's shard), "
            f"{one['requests']:,} requests of 48 organisations, {one['concurrency']} callers at once, primaries "
            "only (append-only, fsync every second):", "",
            md_table(["per served request", "one primary", "three primaries"], [
                ["Redis calls", f"{one['calls_per_request']}", f"{three['calls_per_request']}"],
                ["the primaries' CPU, summed", f"{one['redis_us_per_request']} µs", f"{three['redis_us_per_request']} µs"],
                ["the busiest primary's share of the calls", f"{one['busiest_primary_share']}",
                 f"{three['busiest_primary_share']}"],
                ["the cluster saturates at", f"**≈ {one['saturates_at_rps']:,} requests/s**",
                 f"**≈ {three['saturates_at_rps']:,} requests/s**"],
                ["requests/s through one client here", f"{one['client_rps_here']:,}", f"{three['client_rps_here']:,}"]]),
            ""]


def redis_section(r: dict[str, Any]) -> list[str]:
    return ["## The Redis ceiling", "",
            "`bench/redis_ceiling.py`: the admission and finish scripts exactly as the ext_proc sends them "
            "(`Store.admit` with limits and a journal entry, `Store.finish` with a usage record), "
            f"{r['requests']:,} requests, {r['concurrency']} callers at once, against a redis-server configured as "
            "the launcher configures it (append-only, fsync every second):", "",
            md_table(["per served request", ""], [
                ["Redis calls", f"{r['redis_calls_per_request']}"],
                ["the scripts' own time (`INFO commandstats`)", f"{r['redis_script_us_per_request']} µs"],
                ["the Redis process's CPU (parsing, replies, sockets, the append-only file)",
                 f"**{r['redis_us_per_request']} µs**"],
                ["one Redis core saturates at", f"**≈ {r['one_core_saturates_at_rps']:,} requests/s**"]]), ""]


def soak_lines(sk: dict[str, Any], timestamp: str) -> list[str]:
    w = sk["wrk"]
    last = sk["samples"][-1]
    ref = next((x for x in sk["samples"] if x["t_s"] >= sk["rss_ref_t_s"]), sk["samples"][0])
    parts = [f"`make bench SOAK={sk['seconds']}` at {timestamp}: {sk['mix']} at {sk['conns']} connections; "
             f"{_f(w['rps'], 1)} req/s, {w['requests']:,} requests, errors {w['errors']}. ext_proc RSS "
             f"{ref['rss_kb'] / 1024:.1f} MiB at t={ref['t_s']} s → {last['rss_kb'] / 1024:.1f} MiB at "
             f"t={last['t_s']} s (**{sk['rss_growth_pct']}%**), open descriptors {ref['fds']} → {last['fds']}. "
             f"Usage writer RSS {ref['writer_rss_kb'] / 1024:.1f} → {last['writer_rss_kb'] / 1024:.1f} MiB "
             f"({sk['writer_rss_growth_pct']}%), descriptors {ref['writer_fds']} → {last['writer_fds']}.", "",
             "| t (s) | ext_proc RSS (MiB) | fds | usage writer RSS (MiB) | fds |", "|---:|---:|---:|---:|---:|"]
    parts += [f"| {x['t_s']} | {x['rss_kb'] / 1024:.1f} | {x['fds']} | {x['writer_rss_kb'] / 1024:.1f} | "
              f"{x['writer_fds']} |" for x in sk["samples"]]
    return parts


SCRIPTS = """## Single-question scripts

Each starts what it needs, alternates its variants over `--rounds` and prints one JSON line; their
figures are not kept here (earlier ones are in git history): `python -m bench.event_loop` (the ext_proc
on asyncio or uvloop), `python -m bench.message_cost` (what each ext_proc message costs Envoy),
`python -m bench.refusal_cost` (logging a refused request), `python -m bench.sse_relay` (the Lua relay in
LuaJIT), `python -m bench.relay_ab` (two relays in Envoy beside the minimal ext_proc), `python -m bench.stream_parts`
(the streaming cells with the stream watch or the relay's body work taken out), and the four `make bench`
runs too: `python -m bench.grpc_servers`, `python -m bench.resp_ab`, `python -m bench.redis_ceiling`,
`python -m bench.redis_cluster_ceiling`."""
