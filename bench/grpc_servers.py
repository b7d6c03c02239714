"""Which gRPC server the ext_proc should run on: the same pass-through processor
(bench/minimal_extproc.py) on grpcio's asyncio server, on the gateway's own HTTP/2 server
(extproc/grpc_server.py) and on grpclib, each behind an Envoy of its own with the gateway's ext_proc
filter settings, measured in turn with wrk (chat and streaming at 64 connections), alternated
``--rounds`` times.  Reports requests per second and the processor's CPU microseconds per request
(utime + stime from /proc).  ``python -m bench.grpc_servers [--seconds 5] [--rounds 2]``; the last line
printed is JSON."""
from __future__ import annotations

import json
import statistics
from typing import Any

from .event_loop import cpu_s
from .harness import harness, round_args
from .load import SCENARIOS, wrk
from .systems import start_minimal

SERVERS = ("grpcio", "own", "grpclib")
CELLS = (("chat", 64), ("stream", 64))


def main() -> None:
    args = round_args(__doc__)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SERVERS}
    with harness("bench-grpc-") as (tmp, procs, bodies, up):
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
