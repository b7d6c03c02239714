"""The event loop under the ext_proc: the gateway stack with GATEWAY_EVENT_LOOP=asyncio
and with uvloop, each in turn on the same fixed-reply upstream, measured with the same cells as
``make bench`` (wrk): non-streaming chat and streaming at 64 connections, alternated ``--rounds`` times
so a drift of the shared machine falls on both alike.  Reports requests per second, the ext_proc's CPU
microseconds per request (utime + stime from /proc over the cell) and the ratio uvloop / asyncio.
``python -m bench.event_loop [--seconds 5] [--rounds 2]``; prints one JSON line last."""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from .harness import harness, round_args
from .load import SCENARIOS, wrk
from .envoys import Upstream
from .systems import start_gateway

LOOPS = ("asyncio", "uvloop")
CELLS = (("chat", 64), ("stream", 64))


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_loop(tmp: Path, up: Upstream, loop: str, seconds: float, bodies: Path) -> dict[str, Any]:
    gw, stack = start_gateway(tmp, up, event_loop=loop)
    try:
        assert gw.pid is not None
        wrk(gw, SCENARIOS["chat"], 64, 2, bodies)  # warm-up
        out: dict[str, Any] = {}
        for scenario, conns in CELLS:
            before = cpu_s(gw.pid)
            r = wrk(gw, SCENARIOS[scenario], conns, seconds, bodies)
            spent = cpu_s(gw.pid) - before
            done = max(1, r["requests"])
            out[scenario] = {"rps": round(r["rps"], 1), "errors": r["errors"],
                             "extproc_cpu_us_per_request": round(spent / done * 1e6, 1)}
        return out
    finally:
        stack.stop()


def main() -> None:
    args = round_args(__doc__)
    runs: dict[str, list[dict[str, Any]]] = {loop: [] for loop in LOOPS}
    with harness("bench-loop-") as (tmp, _, bodies, up):
        for i in range(args.rounds):
            for loop in (LOOPS if i % 2 == 0 else LOOPS[::-1]):
                res = run_loop(tmp, up, loop, args.seconds, bodies)
                runs[loop].append(res)
                print(f"round {i + 1} {loop}: {json.dumps(res)}", flush=True)
    summary: dict[str, Any] = {}
    for scenario, _ in CELLS:
        for loop in LOOPS:
            rps = [r[scenario]["rps"] for r in runs[loop]]
            cpu = [r[scenario]["extproc_cpu_us_per_request"] for r in runs[loop]]
            summary[f"{scenario}_rps_{loop}"] = round(statistics.median(rps), 1)
            summary[f"{scenario}_cpu_us_{loop}"] = round(statistics.median(cpu), 1)
            summary[f"{scenario}_errors_{loop}"] = sum(r[scenario]["errors"] for r in runs[loop])
        summary[f"{scenario}_ratio_uvloop_vs_asyncio"] = round(
            summary[f"{scenario}_rps_uvloop"] / max(summary[f"{scenario}_rps_asyncio"], 1e-9), 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
