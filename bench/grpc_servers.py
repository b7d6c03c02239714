"""Which gRPC server the ext_proc should run on (issue 21, part 2): the same pass-through processor
(bench/minimal_extproc.py) on grpcio's asyncio server, on the gateway's own HTTP/2 server
(extproc/grpc_server.py) and on grpclib, each behind an Envoy of its own with the gateway's ext_proc
filter settings, measured in turn with wrk (chat and streaming at 64 connections), alternated
``--rounds`` times.  Reports requests per second and the processor's CPU microseconds per request
(utime + stime from /proc).  ``python -m bench.grpc_servers [--seconds 5] [--rounds 2]``; the last line
printed is JSON."""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from .event_loop import cpu_s
from .load import SCENARIOS, write_bodies, wrk
from .procs import Procs
from .systems import start_minimal, start_upstream

SERVERS = ("grpcio", "own", "grpclib")
CELLS = (("chat", 64), ("stream", 64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SERVERS}
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as t:
        tmp = Path(t)
        procs = Procs(tmp / "logs")
        bodies = tmp / "bodies"
        bodies.mkdir()
        write_bodies(bodies)
        try:
            up = start_upstream(procs, tmp)
            systems = {s: start_minimal(procs, tmp, up, server=s) for s in SERVERS}
            for i in range(args.rounds):
                for name in (SERVERS if i % 2 == 0 else SERVERS[::-1]):
                    system = systems[name]
                    assert system.pid is not None
                    wrk(system, SCENARIOS["chat"], 64, 1, bodies)  # warm-up
                    res: dict[str, Any] = {}
                    for scenario, conns in CELLS:
                        before = cpu_s(system.pid)
                        r = wrk(system, SCENARIOS[scenario], conns, args.seconds, bodies)
                        res[scenario] = {"rps": round(r["rps"], 1), "errors": r["errors"],
                                         "cpu_us_per_request": round((cpu_s(system.pid) - before)
                                                                     / max(1, r["requests"]) * 1e6, 1)}
                    runs[name].append(res)
                    print(f"round {i + 1} {name}: {json.dumps(res)}", flush=True)
        finally:
            procs.stop_all()
    out: dict[str, Any] = {}
    for scenario, _ in CELLS:
        for name in SERVERS:
            out[f"{scenario}_rps_{name}"] = round(statistics.median(r[scenario]["rps"] for r in runs[name]), 1)
            out[f"{scenario}_cpu_us_{name}"] = round(
                statistics.median(r[scenario]["cpu_us_per_request"] for r in runs[name]), 1)
            out[f"{scenario}_errors_{name}"] = sum(r[scenario]["errors"] for r in runs[name])
        for name in ("own", "grpclib"):
            out[f"{scenario}_ratio_{name}_vs_grpcio"] = round(
                out[f"{scenario}_rps_{name}"] / max(out[f"{scenario}_rps_grpcio"], 1e-9), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
