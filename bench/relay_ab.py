"""Envoy's stream relay A/B in Envoy: the minimal ext_proc and two gateway stacks side by side, the
second stack's Envoy running the tree's envoy/sse_relay.lua and the first another copy of it (by
default main's, from git), wrk's stream cell (the 64-event burst, usage asked) at 64 connections on
each in turn, the three alternated over ``--rounds`` (reversed every other round).  Reports, as medians
over the rounds, each gateway's req/s over the minimal's of the same round, and the CPU µs per stream
(utime + stime from /proc over the cell) of each Envoy and of its processor (the ext_proc; the
minimal's grpcio processor): on a machine loaded by other work the CPU figures hold still where the
req/s ratios swing.  ``python -m bench.relay_ab [--relay OTHER.lua] [--seconds 3] [--rounds 7]``; the last
line printed is JSON."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

import control.envoy_config as envoy_config

from .event_loop import cpu_s
from .harness import harness
from .load import SCENARIOS, wrk
from .systems import System, start_gateway, start_minimal

ROOT = Path(__file__).resolve().parent.parent


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--relay", type=Path, help="the other relay (default: main's envoy/sse_relay.lua)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=7)
    return ap.parse_args()


def main() -> None:
    args = _args()
    runs: dict[str, list[dict[str, float]]] = {}
    with harness("bench-relay-") as (tmp, procs, bodies, up):
        other = args.relay
        if other is None:
            other = tmp / "main-sse_relay.lua"
            other.write_bytes(subprocess.run(["git", "show", "main:envoy/sse_relay.lua"], cwd=ROOT,
                                             check=True, capture_output=True).stdout)
        systems: dict[str, System] = {"minimal": start_minimal(procs, tmp, up)}
        stacks = []
        try:
            for name, relay in (("other relay", other), ("tree's relay", envoy_config.SSE_RELAY)):
                d = tmp / name.replace(" ", "-").replace("'", "")
                d.mkdir()
                envoy_config.SSE_RELAY = relay  # read when the stack renders Envoy's configuration
                systems[name], stack = start_gateway(d, up)
                stacks.append(stack)
            for i in range(args.rounds):
                for name in (list(systems) if i % 2 == 0 else list(systems)[::-1]):
                    s = systems[name]
                    assert s.envoy_pid is not None and s.pid is not None
                    wrk(s, SCENARIOS["stream"], 64, 1, bodies)  # warm-up
                    pids = {"envoy_us": s.envoy_pid, "processor_us": s.pid}
                    before = {k: cpu_s(v) for k, v in pids.items()}
                    r = wrk(s, SCENARIOS["stream"], 64, args.seconds, bodies)
                    n = max(1, r["requests"])
                    res = {"rps": round(r["rps"], 1), "errors": r["errors"],
                           **{k: round((cpu_s(v) - before[k]) / n * 1e6, 1) for k, v in pids.items()}}
                    runs.setdefault(name, []).append(res)
                    print(f"round {i + 1} {name}: {json.dumps(res)}", flush=True)
        finally:
            for stack in stacks:
                stack.stop()
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        row: dict[str, Any] = {k: statistics.median(r[k] for r in rs) for k in ("rps", "envoy_us", "processor_us")}
        row["errors"] = sum(r["errors"] for r in rs)
        if name != "minimal":
            ratios = [r["rps"] / max(m["rps"], 1e-9) for r, m in zip(rs, runs["minimal"])]
            row["vs_minimal"] = round(statistics.median(ratios), 3)
            row["vs_minimal_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        out[name] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
