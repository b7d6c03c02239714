"""CPU per request by process over one cell: where a request's CPU goes on the machine.

Every process's utime + stime is read from /proc before and after the wrk run, and the differences are
put to roles by command line; wrk is this process's child, read from ``os.times()``.  Divided by the
requests served, each system's row says what one request costs each part of it, all sharing the same
cores: a system's throughput on saturated cores is about (cores × 1 s) over its row's total, so
``ratio_vs_envoy`` is about bare Envoy's total over the gateway's."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from .event_loop import cpu_s

# (role, a command-line fragment), the first match wins
ROLES = (("usage writer", "extproc.usage_writer"), ("ext_proc / processor", "-m extproc"),
         ("ext_proc / processor", "bench.minimal_extproc"), ("Redis", "redis-server"),
         ("PostgreSQL", "postgres"), ("upstream", "upstream.yaml"), ("proxy", "envoy"),
         ("proxy", "litellm"))
COLUMNS = ("proxy", "ext_proc / processor", "Redis", "PostgreSQL", "usage writer", "upstream", "wrk", "other")


def _cpu() -> dict[int, tuple[str, float]]:
    """Every process's command line and CPU seconds so far."""
    out: dict[int, tuple[str, float]] = {}
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out[pid] = (cmd, cpu_s(pid))
        except OSError:  # it ended meanwhile
            continue
    return out


def _role(cmd: str) -> str:
    return next((role for role, frag in ROLES if frag in cmd), "other")


def measured(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()`` (one wrk cell) with ``cpu_us_per_request`` added: {role: µs of CPU per request}."""
    me = os.getpid()
    before, children = _cpu(), os.times()
    r = run()
    after, children_after = _cpu(), os.times()
    us: dict[str, float] = {c: 0.0 for c in COLUMNS}
    for pid, (cmd, t) in after.items():
        if pid == me:
            continue
        t0 = before.get(pid, (cmd, 0.0))[1]  # a process started during the cell: all its CPU
        us[_role(cmd)] += (t - t0) * 1e6
    us["wrk"] += (children_after.children_user + children_after.children_system
                  - children.children_user - children.children_system) * 1e6
    n = max(1, r["requests"])
    r["cpu_us_per_request"] = {k: round(v / n, 1) for k, v in us.items()}
    return r


def rows(systems: dict[str, Any], cell: str = "chat") -> tuple[list[str], list[list[str]]]:
    """The table: one row per system that has ``cell`` measured with its CPU split."""
    head = ["system", *COLUMNS, "total", "× bare Envoy's total"]
    split = {name: s["cells"][cell]["cpu_us_per_request"] for name, s in systems.items()
             if "cpu_us_per_request" in s.get("cells", {}).get(cell, {})}
    bare = sum(split["bare_envoy"].values()) if "bare_envoy" in split else None
    body = []
    for name, us in split.items():
        total = sum(us.values())
        body.append([systems[name]["label"], *(f"{us.get(c, 0):,.0f}" for c in COLUMNS), f"**{total:,.0f}**",
                     f"{total / bare:.2f}×" if bare else "–"])
    return head, body


def section(cmp: dict[str, Any]) -> list[str]:
    """BENCHMARKS.md's "CPU per request" section from a comparison's results."""
    from .markdown import md_table
    head, body = rows(cmp["systems"])
    if not body:
        return []
    return ["## CPU per request, by process (non-streaming chat, c64)", "",
            "The chat cell at 64 connections of the comparison above, with every process's CPU (utime + stime "
            "from /proc) over the cell divided by the requests served, in µs; *proxy* is the system's own "
            "Envoy (or LiteLLM), *upstream* the fixed-reply Envoy, *other* the rest of the machine. All of "
            "them share the same cores, so on saturated cores a system's requests/s is about (cores × 10⁶) "
            "over its total, and the gateway's `ratio_vs_envoy` about the inverse of its last column: "
            "0.25 asks for a total within 4× bare Envoy's.", "", md_table(head, body), ""]
