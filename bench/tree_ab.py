"""Two source trees A/B on one cell: a gateway stack from each tree (``--other-tree DIR``, e.g. an
extracted ``git archive`` of an older commit, and this tree), and the minimal ext_proc, on the same
fixed-reply upstream, wrk's cell (``--cell chat``: the non-streaming chat at 64 connections) on each in
turn, alternated over ``--rounds`` (reversed every other round).  Reports, as medians over the rounds,
each gateway's req/s over the minimal's of the same round and the CPU µs per request of every process
of each stack (utime + stime from /proc over the cell, by role: Envoy, ext_proc, Redis, PostgreSQL,
usage writer): on a machine shared with other work the CPU figures hold still where req/s swings.
Each stack runs in a child process (bench/tree_stack.py) started in its tree, so every process of it
runs that tree's code on this environment's packages.
``python -m bench.tree_ab --other-tree DIR [--cell chat] [--seconds 3] [--rounds 5]``; the last line
printed is JSON."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from .cpu_split import _role
from .harness import harness
from .load import SCENARIOS, wrk
from .rounds import medians_vs_minimal, order
from .systems import System, start_minimal

ROOT = Path(__file__).resolve().parent.parent
ROLES = {"proxy": "envoy_us", "ext_proc / processor": "extproc_us", "Redis": "redis_us",
         "PostgreSQL": "postgres_us", "usage writer": "writer_us"}


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--other-tree", type=Path, required=True, help="the other source tree (its root directory)")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the tree to compare it with (default: this one)")
    ap.add_argument("--cell", choices=sorted(SCENARIOS), default="chat")
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    return ap.parse_args()


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds so far) of a process, None if it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(f[1]), (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds so far of every process below ``root`` (the stack's child), summed by role."""
    stats = {int(p): s for p in filter(str.isdigit, os.listdir("/proc")) if (s := _stat(p)) is not None}
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    out = {k: 0.0 for k in ROLES.values()}
    todo = list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        key = ROLES.get(_role(cmd))
        if key:
            out[key] += stats[pid][1]
    return out


def _cpu(s: System) -> dict[str, float]:
    """CPU seconds so far of a system's processes by role: a gateway's whole stack (below its child), the
    minimal's Envoy and processor."""
    assert s.pid is not None
    if s.envoy_pid is None:
        return tree_cpu(s.pid)
    return {"envoy_us": _seconds(s.envoy_pid), "extproc_us": _seconds(s.pid)}


def _seconds(pid: int) -> float:
    st = _stat(str(pid))
    return 0.0 if st is None else st[1]


def start_tree(tree: Path, tmp: Path, up: Any, logs: Path) -> tuple[System, subprocess.Popen[str]]:
    """A gateway stack of ``tree`` in a child process; the System to load it by (``pid``: that child)."""
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(tree))
    with open(logs / f"{tmp.name}.log", "ab") as log:
        p = subprocess.Popen([sys.executable, str(ROOT / "bench" / "tree_stack.py"), str(tmp), str(up.json),
                              str(up.sse)], cwd=str(tree), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=log, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        p.wait()
        raise RuntimeError(f"the stack of {tree} did not start; see {logs / (tmp.name + '.log')}")
    info = json.loads(line)
    return System(tmp.name, f"gateway of {tree}", info["port"], key=info["key"], pid=p.pid), p


def stop_tree(p: subprocess.Popen[str]) -> None:
    stdin: IO[str] | None = p.stdin
    if stdin is not None:
        stdin.close()
    p.wait(60)


def main() -> None:
    args = _args()
    sc = SCENARIOS[args.cell]
    runs: dict[str, list[dict[str, float]]] = {}
    with harness("bench-tree-ab-") as (tmp, procs, bodies, up):
        (tmp / "logs").mkdir(exist_ok=True)
        systems: dict[str, System] = {"minimal": start_minimal(procs, tmp, up)}
        children = []
        try:
            for name, tree in (("other", args.other_tree.resolve()), ("tree", args.tree.resolve())):
                systems[name], child = start_tree(tree, tmp / name, up, tmp / "logs")
                children.append(child)
            for i in range(args.rounds):
                for name in order(list(systems), i):
                    s = systems[name]
                    wrk(s, sc, args.conns, 1, bodies)  # warm-up
                    before = _cpu(s)
                    r = wrk(s, sc, args.conns, args.seconds, bodies)
                    after = _cpu(s)
                    n = max(1, r["requests"])
                    res = {"rps": round(r["rps"], 1), "errors": r["errors"],
                           **{k: round((after[k] - before[k]) / n * 1e6, 1) for k in after}}
                    res["total_us"] = round(sum(v for k, v in res.items() if k.endswith("_us")), 1)
                    runs.setdefault(name, []).append(res)
                    print(f"round {i + 1} {name}: {json.dumps(res)}", flush=True)
        finally:
            for child in children:
                stop_tree(child)
    out: dict[str, Any] = {"cell": args.cell, "conns": args.conns, "rounds": args.rounds,
                           "other_tree": str(args.other_tree)}
    out.update(medians_vs_minimal(runs))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
