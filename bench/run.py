"""`make bench` [QUICK=1] [SOAK=seconds] [PROFILE=1]

    python -m bench.run [--quick] [--soak N] [--profile]

Comparison (default): the fixed-reply upstream, then direct / bare Envoy / minimal ext_proc / gateway /
LiteLLM, each checked functionally and then loaded by wrk with the same settings.  Soak: the gateway
alone under a mixed load for N seconds, the ext_proc's RSS and open descriptors sampled every 10 s.
The last line printed is one JSON object (see ``headline``)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from . import fixtures as fx
from . import cpu_split, grpc_servers, long_streams, profiling, report, resp_ab, rounds
from .redis_ceiling import ceiling
from . import redis_cluster_ceiling
from .load import SCENARIOS, check, write_bodies, wrk
from .procs import BUSY, Procs, cpu_busy, drain, settle
from .systems import (ROOT, System, direct, ensure_litellm, launch_litellm, litellm_ready, start_bare,
                      start_gateway, start_minimal, start_upstream)

RESULTS = ROOT / "bench" / "results"
ROUNDS_QUICK, ROUNDS_FULL = 5, 5  # rounds of the short cells, the headline's ratios (bench/rounds.py)
# QUICK's rounds of the long streams and of the cells beside the comparison (gRPC servers, RESP clients)
OTHER_ROUNDS_QUICK = 3
# Rounds of only what the headline's ratios compare, after the full rounds (``--rounds N`` leaves them out):
# a full round costs about 80 s, one of these about 20, and a median over more rounds moves less with
# the shared machine's speed.  The chat, burst and models cells on the systems those ratios name...
HEADLINE_CELLS = {"chat": ("bare_envoy", "minimal_extproc", "gateway", "litellm"),
                  "stream": ("minimal_extproc", "gateway"), "models": ("gateway",)}
HEADLINE_ROUNDS_QUICK, HEADLINE_ROUNDS_FULL = 6, 4
# ...and the long streams at the headline's C on bare Envoy and the gateway
LONG_HEADLINE_ROUNDS_QUICK, LONG_HEADLINE_ROUNDS_FULL = 3, 2
DRAIN_S = 60  # at most this long after a LiteLLM cell for it to work off what wrk left (procs.drain)
WORKERS = 2  # the "Throughput vs ext_proc processes" row: GATEWAY_EXTPROC_WORKERS of the second gateway stack

# (cell id, scenario, connections); "latency" is the one-connection run.
CELLS_FULL = [("latency", "chat", 1), ("chat", "chat", 64), ("chat_c256", "chat", 256),
              ("stream", "stream", 64), ("stream_c256", "stream", 256), ("embeddings", "embeddings", 64),
              ("models", "models", 64)]
CELLS_QUICK = [("latency", "chat", 1), ("chat", "chat", 64), ("chat_c256", "chat", 256),
               ("stream", "stream", 64), ("embeddings", "embeddings", 64), ("models", "models", 64)]


def log(msg: str) -> None:
    print(f"bench: {msg}", flush=True)


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        pass
    def ver(argv: list[str]) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (out.stdout + out.stderr).strip().splitlines()[0]
        except Exception:  # noqa: BLE001
            return "?"
    envoy = str(Path(sys.executable).parent / "envoy")
    return {"cores": os.cpu_count(), "cpu": cpu, "python": sys.version.split()[0],
            "envoy": ver([envoy, "--version"]).split("version:")[-1].strip(),
            "wrk": ver(["wrk", "-v"])}


# ---- comparison ---------------------------------------------------------------------------------
def run_cell(system: System, scenario: str, conns: int, secs: float, bodies: Path,
             longer: float, quick: bool) -> dict[str, Any]:
    """One wrk run; if it completed fewer than two requests per connection (a slow system at high
    concurrency), it is run once more ``longer`` times as long (not in QUICK mode, where the cell is only
    flagged), so the figure is not made of a handful."""
    limit = 0.5 if secs < 5 else 3.0
    # the 64-connection chat cell also says where each request's CPU went (bench/cpu_split.py)
    split = cpu_split.measured if (scenario, conns) == ("chat", 64) else lambda run: run()
    busy = settle(limit)
    r = split(lambda: wrk(system, SCENARIOS[scenario], conns, secs, bodies))
    if r["requests"] < 2 * conns and not quick:
        busy = settle(limit)
        r = split(lambda: wrk(system, SCENARIOS[scenario], conns, longer * secs, bodies))
        r["extended"] = True
    if "pgid" in system.extra:  # LiteLLM: its backlog worked off before anything else is measured
        r["drained_s"] = round(drain(system.extra["pgid"], DRAIN_S), 1)
    r["few"] = r["requests"] < 2 * conns
    r["busy_before"] = round(busy, 2)
    r["noisy"] = busy > BUSY
    return r


def prepare(system: System, warm: float, bodies: Path, out: dict[str, Any]) -> dict[str, Any]:
    """The system's functional checks (a scenario that fails is not measured) and, once, its warm-up."""
    res: dict[str, Any] = {"label": system.label, "note": system.note, "cells": {}, "invalid": {}, "rounds": []}
    out[system.name] = res
    for scenario in SCENARIOS:
        problem = check(system, scenario, bodies)
        if problem:
            res["invalid"][scenario] = problem
            log(f"{system.label}: {scenario} NOT measured, functional check failed: {problem}")
    if warm and "chat" not in res["invalid"] and system.name != "litellm":
        wrk(system, SCENARIOS["chat"], 64, warm, bodies)
    return res


def runs(system: System, cells: list[tuple[str, str, int]], res: dict[str, Any],
         quick: bool) -> list[tuple[str, str, int]]:
    """The cells this system is measured in."""
    out = []
    for cell, scenario, conns in cells:
        if scenario in res["invalid"]:
            continue
        if cell.endswith("_c256") and system.name == "direct" or quick and cell == "chat_c256" and system.name == "litellm":
            continue  # the upstream alone needs no 256-connection run; QUICK skips LiteLLM's too
        if quick and system.name == "direct" and scenario in ("embeddings", "models"):
            continue  # QUICK: the bare upstream only as a reference for chat, streaming and latency
        out.append((cell, scenario, conns))
    return out


def measure_cell(system: System, cell: tuple[str, str, int], secs: float, bodies: Path, quick: bool,
                 n: int) -> dict[str, Any]:
    """Round ``n``'s run of one cell on one system, logged."""
    name, scenario, conns = cell
    r = run_cell(system, scenario, conns, secs, bodies, 2.0, quick)
    log(f"r{n} {system.label:22s} {name:12s} c={conns:<3d} {r['rps']:9.1f} req/s  p50 {r['p50_us']/1000:7.2f} ms"
        f"  p99 {r['p99_us']/1000:8.2f} ms  errors {r['errors']}" + ("  (run again, longer)" if r.get("extended") else "")
        + ("  (few requests: figure is rough)" if r.get("few") else "")
        + (f"  [machine {100 * r['busy_before']:.0f}% busy before the cell]" if r["noisy"] else ""))
    return r


def measure(systems: list[System], cells: list[tuple[str, str, int]], secs: float, warm: float, bodies: Path,
            out: dict[str, Any], quick: bool, n_rounds: int, headline_rounds: int = 0) -> None:
    """Every system's cells, ``n_rounds`` times, then ``headline_rounds`` more of ``HEADLINE_CELLS``
    only.  A round goes cell by cell, each cell on every system in turn, the systems' order reversed
    every other round: the two cells a ratio compares are measured seconds apart, not a whole system's
    cells apart, so a drift of the shared machine's speed between them stays small.  Each system's
    ``rounds`` gets the round's cells, ``cells`` their medians so far."""
    for s in systems:
        prepare(s, warm, bodies, out)
    total = n_rounds + headline_rounds
    for i in range(total):
        only = i >= n_rounds  # a headline round
        named = [s for s in rounds.order(systems, i) if not only or any(s.name in v for v in HEADLINE_CELLS.values())]
        log(f"--- round {i + 1} of {total}{' (the headline cells)' if only else ''}: "
            f"{', '.join(s.label for s in named)} ---")
        got: dict[str, dict[str, Any]] = {s.name: {} for s in systems}
        for cell in cells:
            if only and cell[0] not in HEADLINE_CELLS:
                continue
            for s in rounds.order(systems, i):
                if only and s.name not in HEADLINE_CELLS[cell[0]]:
                    continue
                for c in runs(s, [cell], out[s.name], quick):
                    got[s.name][c[0]] = measure_cell(s, c, secs, bodies, quick, i + 1)
        for s in systems:
            res = out[s.name]
            res["rounds"].append(got[s.name])
            seen = dict.fromkeys(c for r in res["rounds"] for c in r)  # (a headline round has only some)
            res["cells"] = {c: rounds.cell([r[c] for r in res["rounds"] if c in r]) for c in seen}


def profile(system: System, secs: float, bodies: Path, stamp: str) -> dict[str, Any]:
    """py-spy on the gateway's ext_proc during the non-streaming chat load: an SVG flame graph, and a
    raw (collapsed stacks) recording of a second identical run for the own-time headline."""
    assert system.pid is not None
    return profiling.profile(system.pid, RESULTS / f"{stamp}-flame-gateway-extproc", max(3, round(secs)),
                             lambda d: wrk(system, SCENARIOS["chat"], 64, d, bodies)["rps"])


def gateway_errors(stack: Any) -> dict[str, Any]:
    """What the gateway's own logs say about failed requests: statuses other than 200 in Envoy's access
    log (0 = the client went away: wrk stops mid-request at the end of every cell) and the exception
    types in the ext_proc's log."""
    import re
    statuses: Counter[str] = Counter()
    details: Counter[str] = Counter()
    try:
        for line in open(stack.logs / "envoy-access.log"):
            rec = json.loads(line)
            if str(rec.get("status")) != "200":
                statuses[str(rec.get("status"))] += 1
                details[f"{rec.get('status')} {rec.get('details')}"] += 1
    except OSError:
        pass
    exc: Counter[str] = Counter()
    pat = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.*)$")
    lines = (ln for f in sorted(stack.logs.glob("extproc*.log")) for ln in open(f))  # every ext_proc process
    try:
        for line in lines:
            line = line.strip()
            if line.startswith("{"):  # JSON-lines logs: the exception's type and where it was raised
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("error"):
                    exc[f"{rec['error']} at {rec.get('at', '?')} ({str(rec.get('msg', ''))[:60]})"] += 1
                continue
            m = pat.match(line)
            if m:
                exc[f"{m.group(1)}: {m.group(2)[:120]}"] += 1
    except OSError:
        pass
    return {"statuses": dict(statuses), "details": dict(details.most_common(8)),
            "extproc_exceptions": dict(exc.most_common(5))}


def per_process(stack: Any) -> dict[str, int]:
    """Each ext_proc process's gateway_requests_total (its metrics endpoint): did Envoy balance?"""
    import urllib.request
    from control.ports import extproc_workers
    out: dict[str, int] = {}
    for name, _, port in extproc_workers(stack.s):
        try:
            with urllib.request.urlopen(f"http://{stack.s.metrics_host}:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            out[name] = int(sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                                if ln.startswith("gateway_requests_total{")))
        except OSError:
            out[name] = -1
    return out


def aside(what: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """A cell of its own beside the comparison: its failure is logged and leaves it out (None), not the run."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001
        log(f"{what} NOT measured: {type(e).__name__}: {e}")
        return None


def compare(args: argparse.Namespace, tmp: Path, procs: Procs, stamp: str) -> dict[str, Any]:
    quick = args.quick
    secs, warm = (2.0, 0.0) if quick else (5.0, 3.0)
    n_rounds = args.rounds or (ROUNDS_QUICK if quick else ROUNDS_FULL)
    other_rounds = args.rounds or (OTHER_ROUNDS_QUICK if quick else ROUNDS_FULL)
    headline_rounds = 0 if args.rounds else HEADLINE_ROUNDS_QUICK if quick else HEADLINE_ROUNDS_FULL
    long_headline_rounds = 0 if args.rounds else LONG_HEADLINE_ROUNDS_QUICK if quick else LONG_HEADLINE_ROUNDS_FULL
    cells = CELLS_QUICK if quick else CELLS_FULL
    t_start = time.monotonic()
    bodies = tmp / "bodies"
    bodies.mkdir()
    write_bodies(bodies)
    up = start_upstream(procs, tmp)
    long_up, long_client = long_streams.build(tmp)
    up = up._replace(long=long_streams.start_upstream(procs, tmp, long_up))
    log(f"fixed-reply upstream on :{up.json} (JSON) and :{up.sse} (SSE); cadenced long-stream upstream on :{up.long}")
    litellm: System | None = None
    litellm_note = ""
    if not args.no_litellm:
        binary = ensure_litellm(tmp / "litellm-install.log")
        if binary is None:
            litellm_note = "LiteLLM skipped: litellm[proxy] could not be installed (see the install log)"
            log(litellm_note)
        else:
            litellm = launch_litellm(procs, tmp, up, binary)  # starts while the others start
    systems = [direct(up), start_bare(procs, tmp, up), start_minimal(procs, tmp, up)]
    stack = None
    try:
        gw, stack = start_gateway(tmp, up)
        systems.append(gw)
        log(f"gateway stack up on :{gw.port} (ext_proc pid {gw.pid})")
        if litellm is not None:
            try:
                procs.wait_ready("litellm", lambda: litellm_ready(litellm.port), 180)  # type: ignore[union-attr]
                systems.append(litellm)
            except RuntimeError as e:
                litellm_note = f"LiteLLM skipped: {e}"
                log(litellm_note)
                procs.stop("litellm")
        log(f"all systems up after {time.monotonic() - t_start:.0f} s")
        results: dict[str, Any] = {}
        prof = None
        measure(systems, cells, secs, warm, bodies, results, quick, n_rounds, headline_rounds)
        if args.profile and "gateway" in results:
            prof = profile(gw, secs, bodies, stamp)
            log(f"profile: {prof.get('error') or prof['svg']}")
        log(f"--- long streams: {fx.LONG_TOKENS} tokens every {fx.LONG_CADENCE_MS} ms, {other_rounds} rounds ---")
        ls = long_streams.measure(systems, up.long, quick, long_client, tmp, log, other_rounds, long_headline_rounds)
        ls_prof = None
        if args.profile and "gateway" in results:
            ls_prof = long_streams.profile(gw, gw.port, long_client, tmp,
                                           RESULTS / f"{stamp}-flame-gateway-extproc-streams")
            log(f"profile of the {long_streams.PROFILED_C}-stream cell: {ls_prof.get('error') or ls_prof['svg']}")
        if "gateway" in results:
            results["gateway"]["error_detail"] = gateway_errors(stack)
        log(f"--- which gRPC server: the minimal ext_proc on each, {other_rounds} rounds ---")
        grpc = aside("gRPC servers", lambda: grpc_servers.measure(
            procs, tmp, up, bodies, secs, other_rounds, log,
            started={"grpcio": next(s for s in systems if s.name == "minimal_extproc")}))
        if "chat" in results.get("gateway", {}).get("cells", {}):
            # Throughput vs ext_proc processes: the same stack again with GATEWAY_EXTPROC_WORKERS=2,
            # non-streaming chat at 64 connections only, after the one-process stack has stopped.
            t_stop = time.monotonic()
            stack.stop()
            stack = None
            log(f"gateway stack stopped in {time.monotonic() - t_stop:.1f} s")
            gw2, stack = start_gateway(tmp, up, workers=WORKERS)
            log(f"gateway stack with {WORKERS} ext_proc processes up on :{gw2.port}")
            log(f"--- {gw2.label} ---")
            # warmed like the one-process stack, whose chat cell came after its latency cell
            measure([gw2], [c for c in cells if c[0] == "chat"], secs, max(warm, 1.0), bodies, results, quick,
                    n_rounds)
            results[gw2.name]["error_detail"] = gateway_errors(stack)
            results[gw2.name]["requests_per_process"] = per_process(stack)
            log(f"requests served per ext_proc process: {results[gw2.name]['requests_per_process']}")
        return {"mode": "quick" if quick else "full", "cell_seconds": secs, "rounds": n_rounds,
                "headline_rounds": headline_rounds, "other_rounds": other_rounds, "systems": results,
                "litellm_note": litellm_note, "profile": prof, "long_streams": ls, "long_profile": ls_prof,
                "redis": aside("Redis ceiling", ceiling), "grpc_servers": grpc,
                "redis_cluster": aside("Redis Cluster ceiling", redis_cluster_ceiling.shards),
                "resp_client": aside("RESP client A/B", lambda: resp_ab.measure(other_rounds, log)),
                "stream_chunks_per_reply": fx.STREAM_CHUNKS,
                "cells": [{"id": c, "scenario": s, "conns": n} for c, s, n in cells]}
    finally:
        if stack is not None:
            t_stop = time.monotonic()
            stack.stop()
            log(f"gateway stack stopped in {time.monotonic() - t_stop:.1f} s")


# ---- soak ------------------------------------------------------------------------------------
def _sample(pid: int) -> tuple[int, int]:
    rss = 0
    for ln in open(f"/proc/{pid}/status"):
        if ln.startswith("VmRSS:"):
            rss = int(ln.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def soak(args: argparse.Namespace, tmp: Path, procs: Procs) -> dict[str, Any]:
    bodies = tmp / "bodies"
    bodies.mkdir()
    write_bodies(bodies)
    up = start_upstream(procs, tmp)
    gw, stack = start_gateway(tmp, up)
    try:
        for scenario in SCENARIOS:
            problem = check(gw, scenario, bodies)
            if problem:
                raise RuntimeError(f"gateway {scenario} check failed: {problem}")
        assert gw.pid is not None
        samples: list[dict[str, Any]] = []
        stop = threading.Event()
        t0 = time.monotonic()

        writer = stack.procs["usage-writer"].popen.pid  # its own process: sampled beside the ext_proc

        def sample() -> dict[str, Any]:
            rss, fds = _sample(gw.pid)  # type: ignore[arg-type]
            wrss, wfds = _sample(writer)
            return {"t_s": round(time.monotonic() - t0, 1), "rss_kb": rss, "fds": fds,
                    "writer_rss_kb": wrss, "writer_fds": wfds}

        def sampler() -> None:
            while True:
                samples.append(sample())
                x = samples[-1]
                log(f"soak t={x['t_s']:6.1f}s  ext_proc RSS {x['rss_kb']/1024:7.1f} MiB  fds {x['fds']}"
                    f"  usage writer RSS {x['writer_rss_kb']/1024:6.1f} MiB  fds {x['writer_fds']}")
                if stop.wait(10):
                    return

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        env = {"BENCH_CHAT": str(bodies / "chat.json"), "BENCH_STREAM": str(bodies / "stream.json"),
               "BENCH_EMBED": str(bodies / "embed.json")}
        r = wrk(gw, SCENARIOS["chat"], 64, args.soak, bodies, script="mixed.lua", extra_env=env)
        stop.set()
        th.join()
        samples.append(sample())
        # Growth from the first sample after warm-up (>= 10 s in) to the end.
        ref = next((s for s in samples if s["t_s"] >= 10), samples[0])

        def growth(key: str) -> float | None:
            return round(100.0 * (samples[-1][key] - ref[key]) / ref[key], 2) if ref[key] else None

        g, wg = growth("rss_kb"), growth("writer_rss_kb")
        log(f"soak: {r['rps']:.1f} req/s mixed, errors {r['errors']}; ext_proc RSS growth {g}% (from "
            f"t={ref['t_s']}s), fds {ref['fds']} -> {samples[-1]['fds']}; usage writer RSS growth {wg}%, fds "
            f"{ref['writer_fds']} -> {samples[-1]['writer_fds']}")
        return {"seconds": args.soak, "conns": 64, "mix": "6 chat : 2 stream : 1 embeddings : 1 models",
                "wrk": r, "samples": samples, "rss_growth_pct": g, "writer_rss_growth_pct": wg,
                "rss_ref_t_s": ref["t_s"]}
    finally:
        stack.stop()


# ---- the end -------------------------------------------------------------------------------------
HEADLINE = ("rps_gateway", "rps_bare_envoy", "rps_minimal_extproc", "rps_litellm", "ratio_vs_envoy",
            "ratio_vs_minimal", "ratio_vs_litellm", "overhead_p50_ms", "overhead_p50_minimal_ms",
            "overhead_p99_ms", "stream_chunks_per_s", "stream_ratio_vs_minimal", "models_ratio_vs_minimal",
            "streams_c500_added_itl_p99_ms", "streams_c500_envoy_cpu_vs_bare", "streams_c2000_errors",
            "kb_per_stream")  # each round's figures; their medians and spreads make the headline


def round_headline(cmp: dict[str, Any], i: int) -> dict[str, Any]:
    """The headline's figures from round ``i`` alone: each ratio from cells of the same round."""
    sy = cmp["systems"]

    def cell(name: str, c: str, key: str = "rps") -> float | None:
        rs = sy.get(name, {}).get("rounds", [])
        v = rs[i].get(c) if i < len(rs) else None
        return None if v is None else float(v[key])

    def ratio(a: float | None, b: float | None, nd: int = 3) -> float | None:
        return None if a is None or not b else round(a / b, nd)

    def diff_ms(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round((a - b) / 1000, 3)

    h: dict[str, Any] = dict.fromkeys(HEADLINE)
    rg, rb, rm, rl = (cell(n, "chat") for n in ("gateway", "bare_envoy", "minimal_extproc", "litellm"))
    h.update({"rps_gateway": rg, "rps_bare_envoy": rb, "rps_minimal_extproc": rm, "rps_litellm": rl,
              "ratio_vs_envoy": ratio(rg, rb), "ratio_vs_minimal": ratio(rg, rm), "ratio_vs_litellm": ratio(rg, rl),
              "overhead_p50_ms": diff_ms(cell("gateway", "latency", "p50_us"), cell("bare_envoy", "latency", "p50_us")),
              "overhead_p50_minimal_ms": diff_ms(cell("minimal_extproc", "latency", "p50_us"),
                                                 cell("bare_envoy", "latency", "p50_us")),
              "overhead_p99_ms": diff_ms(cell("gateway", "latency", "p99_us"), cell("bare_envoy", "latency", "p99_us"))})
    sg = cell("gateway", "stream")
    h["stream_chunks_per_s"] = None if sg is None else sg * cmp["stream_chunks_per_reply"]
    h["stream_ratio_vs_minimal"] = ratio(sg, cell("minimal_extproc", "stream"))
    # as the target is worded: the gateway's GET /v1/models against the minimal ext_proc's chat
    h["models_ratio_vs_minimal"] = ratio(cell("gateway", "models"), rm)
    h.update(long_streams.headline(long_streams.round_view(cmp.get("long_streams"), i)))
    return h


def headline(cmp: dict[str, Any] | None, sk: dict[str, Any] | None) -> dict[str, Any]:
    """The last line printed: each figure the median over the rounds, with its ``_spread`` and the list of
    those spread wider than bench/rounds.py's limit; errors over every round; the Redis and RESP client
    figures from their own runs."""
    h: dict[str, Any] = dict.fromkeys(HEADLINE)
    if cmp:
        ls = cmp.get("long_streams") or {}
        n = max(cmp.get("rounds", 1) + cmp.get("headline_rounds", 0),
                ls.get("rounds", 0) + ls.get("headline_rounds", 0))
        per_round = [round_headline(cmp, i) for i in range(n)]
        h = rounds.combine(per_round, summed=("streams_c2000_errors",),
                           digits=lambda k: 1 if k.startswith("rps") or k == "stream_chunks_per_s" else 3)
    h.update(dict.fromkeys(("errors", "rss_growth_pct", "redis_us_per_request")))
    if cmp:
        h["redis_us_per_request"] = (cmp.get("redis") or {}).get("redis_us_per_request")
        h.update(resp_ab.headline(cmp.get("resp_client")))
        gw = cmp["systems"].get("gateway")
        if gw is not None:
            h["errors"] = sum(int(c["errors"]) for c in gw["cells"].values()) + len(gw["invalid"])
    if sk:
        h["errors"] = (h["errors"] or 0) + int(sk["wrk"]["errors"])
        h["rss_growth_pct"] = sk["rss_growth_pct"]
    return h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="2 s cells, 5 rounds (the long streams 3) and 6 more of the headline's cells: about 15 "
                         "minutes on 2 cores (full: 5 s, 5 rounds and 4 more, 4 stream counts)")
    ap.add_argument("--soak", type=int, default=0, help="soak the gateway for this many seconds instead")
    ap.add_argument("--profile", action="store_true", help="py-spy flame graph of the gateway's ext_proc")
    ap.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    ap.add_argument("--rounds", type=int, default=0,
                    help=f"rounds of every cell (default {ROUNDS_FULL}; with --quick {ROUNDS_QUICK} of the short cells, "
                         f"{OTHER_ROUNDS_QUICK} of the long streams and the cells beside them)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench: wrk not found (make bench installs Debian's wrk)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what was started on the way out
    started = time.monotonic()
    idle_busy = cpu_busy(1.0)
    if idle_busy > BUSY:
        log(f"WARNING: the machine is {100 * idle_busy:.0f}% busy before anything was started: other "
            "processes compete for the cores and the figures will be lower and noisier")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    procs = Procs(tmp / "logs")
    cmp = sk = None
    try:
        if args.soak:
            sk = soak(args, tmp, procs)
        else:
            cmp = compare(args, tmp, procs, stamp)
    except BaseException:
        log(f"failed; logs kept in {tmp}")
        raise
    finally:
        t_stop = time.monotonic()
        procs.stop_all()
        log(f"stopped everything in {time.monotonic() - t_stop:.1f} s")
    head = headline(cmp, sk)
    doc = {"timestamp": stamp, "machine": {**machine(), "busy_before_start": round(idle_busy, 2)},
           "comparison": cmp, "soak": sk, "headline": head, "wall_seconds": round(time.monotonic() - started, 1)}
    out = RESULTS / f"{stamp}.json"
    out.write_text(json.dumps(doc, indent=1))
    if cmp:
        print()
        print(report.terminal_table(cmp))
        print()
    report.update_markdown(doc)
    shutil.rmtree(tmp, ignore_errors=True)  # access logs and database files; kept when a run fails
    log(f"results: {out.relative_to(ROOT)}; BENCHMARKS.md and bench/chart.svg updated; "
        f"{doc['wall_seconds']:.0f} s in all")
    print(json.dumps(head), flush=True)


if __name__ == "__main__":
    main()
