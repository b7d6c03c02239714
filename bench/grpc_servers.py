"""Which gRPC server the ext_proc should run on: the same pass-through processor
(bench/minimal_extproc.py) on grpcio's asyncio server, on the gateway's own HTTP/2 server
(extproc/grpc_server.py) and on grpclib, each behind an Envoy of its own with the gateway's ext_proc
filter settings, measured in turn with wrk (chat and streaming at 64 connections), alternated
``--rounds`` times.  Reports requests per second and the processor's CPU microseconds per request
(utime + stime from /proc).  ``python -m bench.grpc_servers [--seconds 5] [--rounds 2]``; the last line
printed is JSON."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import rounds
from .envoys import Upstream
from .event_loop import cpu_s
from .harness import harness, round_args
from .load import SCENARIOS, wrk
from .markdown import md_table
from .procs import Procs
from .systems import System, start_minimal

SERVERS = ("grpcio", "own", "grpclib")
CELLS = (("chat", 64), ("stream", 64))


def measure(procs: Procs, tmp: Path, up: Upstream, bodies: Path, seconds: float, n_rounds: int,
            log: Callable[[str], None] = print, started: dict[str, System] | None = None) -> dict[str, Any]:
    """Every server's cells, ``n_rounds`` rounds (bench/rounds.py's order): medians, spreads, ratios.
    ``started``: servers already running (``make bench``'s minimal ext_proc on grpcio); the others are
    started here and stopped at the end."""
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SERVERS}
    systems = dict(started or {})
    new = [s for s in SERVERS if s not in systems]
    try:
        for name in new:
            systems[name] = start_minimal(procs, tmp, up, server=name)
        for i in range(n_rounds):
            for name in rounds.order(SERVERS, i):
                system = systems[name]
                assert system.pid is not None
                wrk(system, SCENARIOS["chat"], 64, 1, bodies)  # warm-up
                res: dict[str, Any] = {}
                for scenario, conns in CELLS:
                    before = cpu_s(system.pid)
                    r = wrk(system, SCENARIOS[scenario], conns, seconds, bodies)
                    res[scenario] = {"rps": round(r["rps"], 1), "errors": r["errors"],
                                     "cpu_us_per_request": round((cpu_s(system.pid) - before)
                                                                 / max(1, r["requests"]) * 1e6, 1)}
                runs[name].append(res)
                log(f"r{i + 1} gRPC server {name}: {json.dumps(res)}")
    finally:
        for name in new:
            suffix = "" if name == "grpcio" else f"-{name}"
            procs.stop(f"minimal-envoy{suffix}")
            procs.stop(f"minimal-extproc{suffix}")
    out: dict[str, Any] = {"seconds": seconds, "rounds": n_rounds}
    for scenario, _ in CELLS:
        for name in SERVERS:
            out[f"{scenario}_rps_{name}"] = rounds.median(r[scenario]["rps"] for r in runs[name])
            out[f"{scenario}_cpu_us_{name}"] = rounds.median(r[scenario]["cpu_us_per_request"] for r in runs[name])
            out[f"{scenario}_cpu_us_{name}_spread"] = rounds.spread(r[scenario]["cpu_us_per_request"] for r in runs[name])
            out[f"{scenario}_errors_{name}"] = sum(r[scenario]["errors"] for r in runs[name])
        for name in ("own", "grpclib"):  # within each round, then the median
            out[f"{scenario}_ratio_{name}_vs_grpcio"] = round(rounds.median(
                a[scenario]["rps"] / max(b[scenario]["rps"], 1e-9) for a, b in zip(runs[name], runs["grpcio"])) or 0, 3)
    return out


LABELS = {"grpcio": "grpcio's asyncio server (`grpc.aio`)",
          "own": "the gateway's own HTTP/2 server (`extproc/h2.py` + `grpc_server.py`)",
          "grpclib": "grpclib (pure Python, on the `h2` library)"}


def section(g: dict[str, Any]) -> list[str]:
    """BENCHMARKS.md's section from ``measure``'s result."""
    body = []
    for name in SERVERS:
        vs = "1.00× / 1.00×" if name == "grpcio" else \
            f"{g[f'chat_ratio_{name}_vs_grpcio']:.2f}× / {g[f'stream_ratio_{name}_vs_grpcio']:.2f}×"
        body.append([LABELS[name], f"{g[f'chat_rps_{name}']:,.0f}",
                     rounds.mark(f"{g[f'chat_cpu_us_{name}']:,.0f}", g.get(f"chat_cpu_us_{name}_spread")),
                     f"{g[f'stream_rps_{name}']:,.0f}",
                     rounds.mark(f"{g[f'stream_cpu_us_{name}']:,.0f}", g.get(f"stream_cpu_us_{name}_spread")),
                     vs, str(g[f"chat_errors_{name}"] + g[f"stream_errors_{name}"])])
    return ["## Which gRPC server the ext_proc runs on", "",
            "`bench/grpc_servers.py`: the same pass-through processor (`bench/minimal_extproc.py`) on three "
            "servers, each behind an Envoy of its own with the gateway's ext_proc filter settings, wrk at 64 "
            f"connections, {g['seconds']:.0f} s cells, the servers alternated over {g['rounds']} rounds; medians, the "
            "processor's CPU per request from /proc (all its threads), the ratios taken within each round:", "",
            md_table(["server", "chat req/s", "CPU µs/request", "stream req/s", "CPU µs/request",
                      "vs grpcio (chat / stream)", "errors"], body), ""]


def main() -> None:
    args = round_args(__doc__)
    with harness("bench-grpc-") as (tmp, procs, bodies, up):
        print(json.dumps(measure(procs, tmp, up, bodies, args.seconds, args.rounds)))


if __name__ == "__main__":
    main()
