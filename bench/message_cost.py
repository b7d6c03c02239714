"""What an ext_proc costs Envoy per request, and per message: the pass-through
processor (bench/minimal_extproc.py on the gateway's own HTTP/2 server) behind Envoys that differ only
in which phases their ext_proc filter sends — 4 messages (request headers and body, response headers
and body), 3 (no response headers), 2 (request only), 1 (request headers only) — and bare Envoy (no
ext_proc) in the same run, alternated ``--rounds`` times, wrk at 64 connections on non-streaming chat.
Reports req/s against bare Envoy's and, from /proc, the CPU µs per request of the proxy's Envoy, of the
processor and of the fixed-reply upstream; Envoy's over the upstream's is the figure that holds still
while the machine's speed moves.  ``python -m bench.message_cost [--seconds 5] [--rounds 3]``; the last
line printed is JSON."""
from __future__ import annotations

import json
import statistics
from typing import Any

from . import envoys
from .event_loop import cpu_s
from .harness import harness, round_args
from .load import SCENARIOS, wrk
from .procs import free_port
from .systems import System, start_bare, start_envoy, start_minimal

# variant -> the ext_proc filter's processing-mode changes from the gateway's settings (all four sent)
VARIANTS: dict[str, dict[str, str]] = {
    "4 messages": {},
    "3 (no response headers)": {"response_header_mode": "SKIP"},
    "2 (request headers and body)": {"response_header_mode": "SKIP", "response_body_mode": "NONE"},
    "1 (request headers)": {"response_header_mode": "SKIP", "response_body_mode": "NONE", "request_body_mode": "NONE"},
}


def main() -> None:
    args = round_args(__doc__)
    runs: dict[str, list[dict[str, float]]] = {}
    with harness("bench-messages-") as (tmp, procs, bodies, up):
        upstream = procs.running["upstream"].pid
        four = start_minimal(procs, tmp, up, server="own")  # the processor, and its Envoy sending all four
        systems = {"bare Envoy": start_bare(procs, tmp, up), "4 messages": four}
        for i, (name, mode) in enumerate(VARIANTS.items()):
            if mode:  # the same processor behind an Envoy of its own
                p, a = free_port(), free_port()
                doc = envoys.proxy(p, a, up, tmp / f"access-{i}.log", four.extra["grpc_port"], mode)
                systems[name] = System(f"messages_{i}", name, p, pid=four.pid, expect_alias=False,
                                       envoy_pid=start_envoy(procs, f"envoy-{i}", doc, tmp, p, a))
        for i in range(args.rounds):
            for name in (list(systems) if i % 2 == 0 else list(systems)[::-1]):
                system = systems[name]
                assert system.envoy_pid is not None
                wrk(system, SCENARIOS["chat"], 64, 1, bodies)  # warm-up
                # bare Envoy has no processor in its path
                pids = {"envoy": system.envoy_pid, "upstream": upstream,
                        **({"processor": system.pid} if system.pid is not None else {})}
                before = {k: cpu_s(v) for k, v in pids.items()}
                r = wrk(system, SCENARIOS["chat"], 64, args.seconds, bodies)
                n = max(1, r["requests"])
                res = {f"{k}_us": round((cpu_s(v) - before[k]) / n * 1e6, 1) for k, v in pids.items()}
                res.update(rps=round(r["rps"], 1), errors=r["errors"],
                           envoy_vs_upstream=round(res["envoy_us"] / max(res["upstream_us"], 1e-9), 2))
                runs.setdefault(name, []).append(res)
                print(f"round {i + 1} {name}: {json.dumps(res)}", flush=True)
    out: dict[str, Any] = {}
    bare = statistics.median(r["rps"] for r in runs["bare Envoy"])
    for name, rs in runs.items():
        row = {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0] if k != "errors"}
        row["errors"] = sum(r["errors"] for r in rs)
        row["rps_vs_bare_envoy"] = round(row["rps"] / max(bare, 1e-9), 3)
        out[name] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
