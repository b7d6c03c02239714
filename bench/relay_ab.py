"""Envoy's stream relay A/B in Envoy: the minimal ext_proc and two gateway stacks side by side, the
second stack's Envoy running the tree's envoy/sse_relay.lua and the first another copy of it (by
default main's, from git), wrk's stream cell (the 64-event burst, usage asked) at 64 connections on
each in turn, the three alternated over ``--rounds`` (reversed every other round).  Reports, as medians
over the rounds, each gateway's req/s over the minimal's of the same round, and the CPU µs per stream
(utime + stime from /proc over the cell) of each Envoy and of its processor (the ext_proc; the
minimal's grpcio processor), and of each gateway's Redis, usage writer and PostgreSQL (its backends
included): on a machine loaded by other work the CPU figures hold still where the req/s ratios swing.
``--template OTHER.yaml`` runs the first stack's Envoy on another envoy/envoy.yaml too (a filter taken
out, say), and ``--python-from main`` its ext_proc and usage writer on that commit's Python (a change
to them measured against it in the same run).  ``python -m bench.relay_ab [--relay OTHER.lua]
[--template OTHER.yaml] [--python-from REF] [--seconds 3] [--rounds 7]``; the last line printed is JSON."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import control.envoy_config as envoy_config

from .event_loop import cpu_s
from .harness import harness
from .load import SCENARIOS, wrk
from .rounds import medians_vs_minimal
from .systems import System, start_gateway, start_minimal

ROOT = Path(__file__).resolve().parent.parent


def tree_cpu_s(pid: int) -> float:
    """The CPU seconds of the process and of its living children (PostgreSQL's backends)."""
    total = cpu_s(pid)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                total += cpu_s(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass  # gone meanwhile
    return total


def burst(s: System, bodies: Path, seconds: float) -> dict[str, float]:
    """wrk's stream cell (the burst, usage asked, 64 connections) on a system with an Envoy and a processor,
    after a second's warm-up: req/s, errors, and the CPU µs per stream of its Envoy, its processor and the
    stack's parts whose pids ``s.extra`` holds (Redis, the usage writer, PostgreSQL with its backends)."""
    assert s.envoy_pid is not None and s.pid is not None
    wrk(s, SCENARIOS["stream"], 64, 1, bodies)  # warm-up
    pids = {"envoy_us": s.envoy_pid, "processor_us": s.pid,
            **{f"{part}_us": s.extra[part] for part in ("redis", "usage-writer", "postgres") if part in s.extra}}
    before = {k: tree_cpu_s(v) for k, v in pids.items()}
    r = wrk(s, SCENARIOS["stream"], 64, seconds, bodies)
    n = max(1, r["requests"])
    return {"rps": round(r["rps"], 1), "errors": r["errors"],
            **{k: round((tree_cpu_s(v) - before[k]) / n * 1e6, 1) for k, v in pids.items()}}


@contextlib.contextmanager
def python_of(ref: str | None, tmp: Path) -> Iterator[None]:
    """Processes started meanwhile run ``ref``'s Python (its tree, from git, as their working directory:
    ``python -m`` imports from there first); None: the tree's."""
    if ref is None:
        yield
        return
    where = tmp / "python-from"
    where.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    here = os.getcwd()
    os.chdir(where)
    try:
        yield
    finally:
        os.chdir(here)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--relay", type=Path, help="the other relay (default: main's envoy/sse_relay.lua)")
    ap.add_argument("--template", type=Path, help="the first stack's Envoy template (default: the tree's)")
    ap.add_argument("--python-from", metavar="REF", help="the first stack's ext_proc and usage writer from this "
                    "commit (default: the tree's)")
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
            tree = (envoy_config.SSE_RELAY, envoy_config.TEMPLATE)
            for name, relay, template in (("other relay", other, args.template or tree[1]),
                                          ("tree's relay", *tree)):
                d = tmp / name.replace(" ", "-").replace("'", "")
                d.mkdir()
                # read when the stack renders Envoy's configuration
                envoy_config.SSE_RELAY, envoy_config.TEMPLATE = relay, template
                with python_of(args.python_from if name == "other relay" else None, tmp):
                    systems[name], stack = start_gateway(d, up)
                stacks.append(stack)
                for part in ("redis", "usage-writer", "postgres"):
                    popen = stack.procs[part].popen
                    assert popen is not None
                    systems[name].extra[part] = popen.pid
            for i in range(args.rounds):
                for name in (list(systems) if i % 2 == 0 else list(systems)[::-1]):
                    res = burst(systems[name], bodies, args.seconds)
                    runs.setdefault(name, []).append(res)
                    print(f"round {i + 1} {name}: {json.dumps(res)}", flush=True)
        finally:
            for stack in stacks:
                stack.stop()
    print(json.dumps(medians_vs_minimal(runs)))


if __name__ == "__main__":
    main()
