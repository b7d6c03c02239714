"""Rounds: every system is measured once per round, in the opposite order every other round, so a drift
of the shared machine's speed falls on all of them alike; a figure is the median over the rounds, and
its *spread* the rounds' range (max − min) over that median.  A ratio is taken within each round (the
two systems measured minutes apart at most) and then its median over the rounds.  A figure whose
spread is wider than ``SPREAD_LIMIT`` is marked (``wide_spread`` in the headline, ``~`` in the tables)."""
from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
SPREAD_LIMIT = 0.10
WIDE = "~"  # the tables' mark of a figure whose rounds spread wider than SPREAD_LIMIT
WIDE_NOTE = (f"`{WIDE}` the rounds of this figure spread over more than {SPREAD_LIMIT:.0%} of its median "
             "((max − min) / median): the machine's speed drifted during the run, or the figure is small")


def order(items: Sequence[T], i: int) -> list[T]:
    """Round ``i``'s order: as given in even rounds, reversed in odd ones."""
    return list(items) if i % 2 == 0 else list(items)[::-1]


def median(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def spread(values: Iterable[float | None]) -> float | None:
    """(max − min) / |median| over the rounds that have the figure; None for one round or a zero median."""
    vs = [v for v in values if v is not None]
    m = median(vs)
    if len(vs) < 2 or not m:
        return None
    return round((max(vs) - min(vs)) / abs(m), 3)


def wide(s: float | None) -> bool:
    return s is not None and s > SPREAD_LIMIT


def medians_vs_minimal(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """An A/B's rounds per system (``runs["minimal"]`` among them) as each figure's median, errors summed,
    and each system's req/s over the minimal's of the same round: ``vs_minimal`` (median), its range."""
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        row: dict[str, Any] = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "errors"}
        row["errors"] = sum(r["errors"] for r in rs)
        if name != "minimal":
            ratios = [r["rps"] / max(m["rps"], 1e-9) for r, m in zip(rs, runs["minimal"])]
            row["vs_minimal"] = round(statistics.median(ratios), 3)
            row["vs_minimal_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        out[name] = row
    return out


def cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One wrk cell over its rounds: median rps and latency percentiles, errors and requests summed,
    flags if any round had them, the CPU split (``cpu_us_per_request``) as the median per role."""
    out: dict[str, Any] = {"rounds": len(runs), "conns": runs[0]["conns"]}
    for k in ("rps", "p50_us", "p99_us"):
        out[k] = median(r[k] for r in runs)
    out["rps_spread"] = spread(r["rps"] for r in runs)
    out["rps_rounds"] = [round(r["rps"], 1) for r in runs]
    for k in ("requests", "errors", "socket_errors", "err_status"):
        out[k] = sum(int(r.get(k, 0)) for r in runs)
    for k in ("few", "noisy", "extended"):
        out[k] = any(r.get(k) for r in runs)
    out["busy_before"] = max(r.get("busy_before", 0.0) for r in runs)
    splits = [r["cpu_us_per_request"] for r in runs if "cpu_us_per_request" in r]
    if splits:
        out["cpu_us_per_request"] = {role: round(median(s.get(role, 0.0) for s in splits) or 0.0, 1)
                                     for role in splits[0]}
    return out


def combine(per_round: list[dict[str, Any]], summed: Iterable[str] = (),
            digits: Callable[[str], int] = lambda _: 3) -> dict[str, Any]:
    """Headlines of single rounds into one: each numeric key's median and ``<key>_spread``; the keys in
    ``summed`` added up over the rounds instead (counts); ``wide_spread``: the keys spread too wide."""
    out: dict[str, Any] = {}
    wide_keys: list[str] = []
    keys = list(per_round[0]) if per_round else []
    for k in keys:
        vals = [h.get(k) for h in per_round]
        if k in summed:
            nums = [int(v) for v in vals if v is not None]
            out[k] = sum(nums) if nums else None
            continue
        m = median(vals)
        out[k] = None if m is None else round(m, digits(k))
        out[f"{k}_spread"] = s = spread(vals)
        if wide(s):
            wide_keys.append(k)
    out["wide_spread"] = wide_keys
    out["rounds"] = len(per_round)
    return out


def mark(text: str, s: float | None) -> str:
    """``text`` with the wide-spread mark when ``s`` is wider than the limit."""
    return text + WIDE if wide(s) else text
