"""Markdown pieces BENCHMARKS.md's sections share: a table, and a py-spy profile's top functions."""
from __future__ import annotations

from typing import Any


def md_table(head: list[str], body: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"]
    for r in body:
        out.append("| " + " | ".join(r) + " |")
    return "\n".join(out)


def profile_lines(prof: dict[str, Any] | None, timestamp: str, unit: str) -> list[str]:
    """``prof`` from bench/profiling.py (None: not recorded); ``unit``: what its rate counts (req/s)."""
    if prof is None:
        return ["Not recorded in the latest comparison; run `make bench PROFILE=1`."]
    if prof.get("error"):
        return [f"Profiling failed: {prof['error']}"]
    rate = prof.get("rps_while_profiled")
    return [f"`make bench PROFILE=1` at {timestamp}: py-spy, {prof['seconds']} s, {prof['samples']} samples "
            f"({'–' if rate is None else f'{rate:,.0f}'} {unit} while sampled); flame graph `{prof['svg']}` (not "
            "committed). Top functions by own time (Python frames only: time in C — system calls, the C parts "
            "of asyncio, json and protobuf — shows up as own time of the Python function that called it):", "",
            "| function | own samples | % |", "|---|---:|---:|",
            *(f"| `{t['function']}` | {t['samples']} | {t['pct']} |" for t in prof["top_own"])]
