"""The long-stream cell: C concurrent chat streams of ``fx.LONG_TOKENS`` tokens, one
event every ``fx.LONG_CADENCE_MS`` ms, for every system of the comparison.

Both ends are small C programs compiled with gcc into the run's temporary directory (the sources are
``bench/sse_upstream.c`` and ``bench/sse_client.c``): the upstream sends each stream's frames on a 1 ms
timer wheel, the client opens the C streams evenly over ``RAMP_MS`` and records the arrival time of every
token event.  A *gap* is the time between two consecutive token events of one stream at the client;
"added" is a system's gap percentile minus bare Envoy's at the same C (bare Envoy's own: minus the
direct run's, which is the upstream and client alone).  Per system and C: gap p50/p99, token events
(chunks) per second, errors (a stream that did not end with ``[DONE]`` after all its tokens, by kind),
the RSS per open stream of the ext_proc and of the Envoy (peak RSS during the cell minus RSS just before
it, over C) and their CPU per chunk (utime + stime from /proc over the cell, over the chunks delivered)."""
from __future__ import annotations

import json
import resource
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable

from . import fixtures as fx
from . import rounds
from .event_loop import cpu_s
from .procs import Procs, drain, free_port, port_open, settle
from .systems import System

SRC = Path(__file__).resolve().parent
CONCURRENCY_FULL = (250, 500, 1000, 2000)
CONCURRENCY_QUICK = (250, 500)
RAMP_MS = 1000  # the C streams are opened evenly over this time
TIMEOUT_S = 20  # a stream still open this long after its start (4 times its length) is an error
PROFILED_C = 500  # the cell py-spy records (PROFILE=1)
HEADLINE_C = 500  # the C of the headline's long-stream figures, and the systems they compare
HEADLINE_SYSTEMS = ("bare_envoy", "gateway")
GIVE_UP = 0.5  # LiteLLM is not run at a higher C once it failed this share of the streams


def build(tmp: Path) -> tuple[Path, Path]:
    """gcc -O2 of the upstream and the client into ``tmp``: (upstream, client)."""
    out = []
    for name in ("sse_upstream", "sse_client"):
        exe = tmp / name
        subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), str(SRC / f"{name}.c")], check=True)
        out.append(exe)
    return out[0], out[1]


def start_upstream(procs: Procs, tmp: Path, exe: Path) -> int:
    frames = tmp / "long-frames.bin"
    frames.write_bytes(fx.long_stream_frames())
    port = free_port()
    procs.start("long-upstream", [str(exe), str(port), str(frames), str(fx.LONG_CADENCE_MS)])
    procs.wait_ready("long-upstream", lambda: port_open(port), 10)
    return port


def request(system: System) -> bytes:
    """The whole HTTP/1.1 request the client sends on each of its connections."""
    body = fx.stream_request(fx.LONG_ALIAS, 2 * fx.LONG_TOKENS)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {system.key}\r\n"
            f"x-bench-route: long\r\ncontent-type: application/json\r\naccept: text/event-stream\r\n"
            f"content-length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _rss_kb(pid: int) -> int:
    for ln in open(f"/proc/{pid}/status"):
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1])
    return 0


def _pids(system: System) -> dict[str, int]:
    return {n: p for n, p in (("extproc", system.pid), ("envoy", system.envoy_pid)) if p is not None}


def idle_rss(system: System) -> dict[str, int]:
    """RSS (KB) of the system's ext_proc and Envoy before its first long stream."""
    return {n: _rss_kb(p) for n, p in _pids(system).items()}


class _Watch:
    """Peak RSS while the cell runs and CPU seconds of the named processes.  The idle RSS is the one
    before the system's first long-stream cell: memory a process keeps after a cell is not idle memory
    in the next one (allocators seldom give it back)."""

    def __init__(self, pids: dict[str, int], idle: dict[str, int]) -> None:
        self.pids = pids
        self.idle = idle
        self.peak = {n: _rss_kb(p) for n, p in pids.items()}
        self.cpu0 = {n: cpu_s(p) for n, p in pids.items()}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.wait(0.1):
            for n, p in self.pids.items():
                self.peak[n] = max(self.peak[n], _rss_kb(p))

    def result(self, streams: int, chunks: int) -> dict[str, Any]:
        self.stop.set()
        self.thread.join()
        out: dict[str, Any] = {}
        for n, p in self.pids.items():
            out[f"{n}_rss_peak_kb"] = self.peak[n]
            out[f"{n}_kb_per_stream"] = round((self.peak[n] - self.idle[n]) / streams, 2)
            out[f"{n}_cpu_us_per_chunk"] = round((cpu_s(p) - self.cpu0[n]) * 1e6 / max(1, chunks), 2)
        return out


def run_cell(system: System, port: int, streams: int, client: Path, tmp: Path,
             idle: dict[str, int]) -> dict[str, Any]:
    req = tmp / f"long-request-{system.name}.http"
    req.write_bytes(request(system))
    busy = settle(2.0)
    watch = _Watch(_pids(system), idle)
    used0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([str(client), str(port), str(req), str(streams), str(RAMP_MS), str(TIMEOUT_S),
                          str(fx.LONG_TOKENS)], capture_output=True, text=True, timeout=TIMEOUT_S + 60)
    used1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if "pgid" in system.extra:  # LiteLLM: streams it still serves are not the next system's load
        drain(system.extra["pgid"], TIMEOUT_S)
    if out.returncode != 0:
        watch.result(streams, 1)
        raise RuntimeError(f"sse_client failed ({out.returncode}): {out.stderr[-500:]}")
    r: dict[str, Any] = json.loads(out.stdout)
    r.update(watch.result(streams, r["tokens"]))
    r["client_cpu_s"] = round(used1.ru_utime + used1.ru_stime - used0.ru_utime - used0.ru_stime, 2)
    r["busy_before"] = round(busy, 2)
    return r


def _port(system: System, long_port: int) -> int:
    return long_port if system.name == "direct" else system.port


def measure(systems: list[System], long_port: int, quick: bool, client: Path, tmp: Path,
            log: Callable[[str], None], n_rounds: int = 1, headline_rounds: int = 0) -> dict[str, Any]:
    """Every C (ascending), ``n_rounds`` rounds at each, every system once per round in the order
    bench/rounds.py gives, so the systems compared at one C are measured seconds apart; LiteLLM is left
    out of the rest once it failed ``GIVE_UP`` of the streams.  Then ``headline_rounds`` more at
    ``HEADLINE_C`` of the systems the headline compares there (``HEADLINE_SYSTEMS``).  Returns
    {"concurrency": [...], "systems": {name: {"label", "rounds": {C: [result per round]}, "cells": {C: the
    rounds' medians}}}}."""
    cs = CONCURRENCY_QUICK if quick else CONCURRENCY_FULL
    res: dict[str, Any] = {"concurrency": list(cs), "tokens": fx.LONG_TOKENS, "cadence_ms": fx.LONG_CADENCE_MS,
                           "ramp_ms": RAMP_MS, "timeout_s": TIMEOUT_S, "profiled_c": PROFILED_C,
                           "rounds": n_rounds, "headline_rounds": headline_rounds, "systems": {}}
    idle = {s.name: idle_rss(s) for s in systems}
    for s in systems:
        res["systems"][s.name] = {"label": s.label, "cells": {}, "rounds": {}, "rss_idle_kb": idle[s.name]}
    plan = [(c, i, systems) for c in cs for i in range(n_rounds)]
    if HEADLINE_C in cs:
        plan += [(HEADLINE_C, i, [s for s in systems if s.name in HEADLINE_SYSTEMS])
                 for i in range(n_rounds, n_rounds + headline_rounds)]
    for c, i, these in plan:
        for s in rounds.order(these, i):
            doc = res["systems"][s.name]
            if "gave_up_after" in doc:
                continue
            r = run_cell(s, _port(s, long_port), c, client, tmp, idle[s.name])
            doc["rounds"].setdefault(str(c), []).append(r)
            log(f"r{i + 1} {s.label:22s} streams c={c:<5d} gap p50 {r['gap_p50_us'] / 1000:6.2f} ms  p99 "
                f"{r['gap_p99_us'] / 1000:7.2f} ms  {r['tokens_per_s']:8.0f} chunks/s  errors {r['errors']}"
                + "".join(f"  {k} {r[k + '_kb_per_stream']:.1f} KB/stream {r[k + '_cpu_us_per_chunk']:.1f} us/chunk"
                          for k in _pids(s)))
            if s.name == "litellm" and r["errors"] > GIVE_UP * c:
                doc["gave_up_after"] = c
    _added(res)
    for doc in res["systems"].values():
        doc["cells"] = {c: cell(rs) for c, rs in doc["rounds"].items()}
        prev: str | None = None
        for c in map(str, cs):  # the marginal memory of the streams added since the previous C
            r = doc["cells"].get(c)
            if r is not None and prev is not None and prev in doc["cells"]:
                for k in ("extproc", "envoy"):
                    if f"{k}_rss_peak_kb" in r:
                        r[f"{k}_kb_per_added_stream"] = round(
                            (r[f"{k}_rss_peak_kb"] - doc["cells"][prev][f"{k}_rss_peak_kb"]) / (int(c) - int(prev)), 2)
            prev = c
    return res


SUMMED = ("streams", "good", "tokens", "gap_n", "ttft_n", "duration_n")


def cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One C's rounds: counts (streams, tokens, errors by kind) added up, every other figure their median,
    with the spread (bench/rounds.py) of the gap p99 and of the added gap p99."""
    out: dict[str, Any] = {"rounds": len(runs)}
    for k, v in runs[0].items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            out[k] = v
        elif k in SUMMED or k.startswith("errors"):
            out[k] = sum(r.get(k, 0) for r in runs)
        else:
            m = rounds.median(r.get(k) for r in runs)
            out[k] = None if m is None else round(m, 2)
    out["gap_p99_us_spread"] = rounds.spread(r["gap_p99_us"] for r in runs)
    if "added_p99_ms" in runs[0]:
        out["added_p99_ms_spread"] = rounds.spread(r.get("added_p99_ms") for r in runs)
        out["added_p99_ms_rounds"] = [r.get("added_p99_ms") for r in runs]
    return out


def _added(res: dict[str, Any]) -> None:
    """Each round's added gap p50/p99 in ms: against bare Envoy's of the same round at the same C; bare
    Envoy against direct."""
    sy = res["systems"]
    for name, s in sy.items():
        ref = "direct" if name == "bare_envoy" else "bare_envoy"
        if name == "direct" or ref not in sy:
            continue
        for c, rs in s["rounds"].items():
            for i, r in enumerate(rs):
                bs = sy[ref]["rounds"].get(c, [])
                if i >= len(bs):
                    continue
                r["added_ref"] = ref
                for q in ("p50", "p99"):
                    r[f"added_{q}_ms"] = round((r[f"gap_{q}_us"] - bs[i][f"gap_{q}_us"]) / 1000, 2)


def round_view(ls: dict[str, Any] | None, i: int) -> dict[str, Any] | None:
    """``ls`` as if only round ``i`` had been run (for that round's headline)."""
    if ls is None:
        return None
    return {"systems": {n: {"cells": {c: rs[i] for c, rs in s.get("rounds", {}).items() if i < len(rs)}}
                        for n, s in ls["systems"].items()}}


def profile(system: System, port: int, client: Path, tmp: Path, stem: Path) -> dict[str, Any]:
    """py-spy of the ext_proc through a ``PROFILED_C``-stream run (two: flame graph and raw)."""
    from . import profiling
    assert system.pid is not None
    seconds = round(RAMP_MS / 1000 + fx.LONG_TOKENS * fx.LONG_CADENCE_MS / 1000)
    idle = idle_rss(system)
    return profiling.profile(system.pid, stem, seconds, lambda _: float(
        run_cell(system, port, PROFILED_C, client, tmp, idle)["tokens_per_s"]))


def headline(ls: dict[str, Any] | None) -> dict[str, Any]:
    """The headline's long-stream keys from the gateway's cells (None where a cell was not run);
    ``kb_per_stream`` at the largest C measured, where the memory the earlier cells left behind weighs
    least; the gateway's Envoy CPU per chunk at 500 streams over bare Envoy's."""
    sy = (ls or {}).get("systems", {})
    cells = sy.get("gateway", {}).get("cells", {})
    c500, c2000 = cells.get("500", {}), cells.get("2000", {})
    largest = cells[max(cells, key=int)] if cells else {}
    gw_envoy = c500.get("envoy_cpu_us_per_chunk")
    bare_envoy = sy.get("bare_envoy", {}).get("cells", {}).get("500", {}).get("envoy_cpu_us_per_chunk")
    return {"streams_c500_added_itl_p99_ms": c500.get("added_p99_ms"),
            "streams_c500_envoy_cpu_vs_bare": round(gw_envoy / bare_envoy, 3) if gw_envoy and bare_envoy else None,
            "streams_c2000_errors": c2000.get("errors"),
            "kb_per_stream": largest.get("extproc_kb_per_stream")}
