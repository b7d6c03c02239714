"""The alias change policy (README, "Changing the model behind an alias"): a change of the upstream
models behind an alias, or of their traffic shares, is announced at least 14 days before it takes
effect, and an alias's context and output limits never shrink. Pure functions comparing the catalog in
force with the one replacing it; ``gateway catalog apply`` and the ext_proc's catalog reload both ask
them."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from fractions import Fraction

from .catalog import WARSAW, Alias, Catalog, Upstream

NOTICE_S = 14 * 86400  # how far ahead a model change behind an alias is announced


def mix(ups: tuple[Upstream, ...]) -> frozenset[tuple[str, Fraction]]:
    """What a step routes: each model's fraction of the traffic (so shares 80/20 and 4/1 are the same)."""
    total = sum(u.share for u in ups)
    per: dict[str, int] = {}
    for u in ups:
        per[u.model] = per.get(u.model, 0) + u.share
    return frozenset((m, Fraction(s, total)) for m, s in per.items() if s > 0) if total > 0 else frozenset()


def describe(ups: tuple[Upstream, ...]) -> str:
    """``bielik-11b-instruct 80%, qwen3-32b-instruct 20%`` (``-`` for none)."""
    parts = sorted(mix(ups), key=lambda p: (-p[1], p[0]))
    return ", ".join(f"{m} {round(float(f) * 100)}%" for m, f in parts) or "-"


@dataclass(frozen=True, slots=True)
class ModelChange:
    alias: str
    effective: int  # unix seconds
    before: tuple[Upstream, ...]
    after: tuple[Upstream, ...]


def timeline(a: Alias) -> list[ModelChange]:
    """The alias's own model changes: each step whose routing differs from the one before it."""
    out = []
    for prev, step in zip(a.upstream_steps, a.upstream_steps[1:]):
        if mix(step.upstreams) != mix(prev.upstreams):
            out.append(ModelChange(a.id, step.effective, prev.upstreams, step.upstreams))
    return out


def model_changes(old: Catalog, new: Catalog, now: int) -> list[ModelChange]:
    """The model changes ``new`` brings to the aliases of ``old`` (the catalog in force) from ``now`` on,
    soonest first: each moment at which ``new`` routes an alias differently from ``old`` and from what
    it routed just before (a change taking effect at once has ``effective`` ``now``).  A new alias is
    not a change; a change ``old`` already holds is not one again."""
    out = []
    for name, a in new.aliases.items():
        o = old.aliases.get(name)
        if o is None:
            continue
        points = sorted({now} | {s.effective for s in (*o.upstream_steps, *a.upstream_steps) if s.effective > now})
        before = o.upstreams_at(now)
        for t in points:
            after = a.upstreams_at(t)
            if mix(after) != mix(o.upstreams_at(t)) and mix(after) != mix(before):
                out.append(ModelChange(name, t, before, after))
            before = after
    return sorted(out, key=lambda c: (c.effective, c.alias))


def earliest(now: int) -> int:
    """The earliest time a model change announced at ``now`` may take effect."""
    return now + NOTICE_S


def too_soon(changes: list[ModelChange], now: int) -> list[ModelChange]:
    return [c for c in changes if c.effective < earliest(now)]


def when_text(t: int) -> str:
    """``2026-12-14T00:00+01:00``: a time as the catalog writes it, in Warsaw time."""
    return dt.datetime.fromtimestamp(t, WARSAW).isoformat(timespec="minutes")


def refusal(c: ModelChange, now: int) -> str:
    """One line: the alias, when the change would take effect, and the earliest it may."""
    return (f"alias {c.alias}: model change effective {when_text(max(c.effective, now))} ({describe(c.before)}"
            f" -> {describe(c.after)}) is announced less than 14 days ahead; the earliest allowed is"
            f" {when_text(earliest(now))}")


def shrunk_limits(old: Catalog, new: Catalog) -> list[str]:
    """One line per alias whose context or output limit ``new`` makes smaller than ``old``'s."""
    out = []
    for name, a in new.aliases.items():
        o = old.aliases.get(name)
        if o is None:
            continue
        for what, was, now in (("context_length", o.context_length, a.context_length),
                               ("max_output_tokens", o.max_output_tokens, a.max_output_tokens)):
            if now < was:
                out.append(f"alias {name}: {what} {now} is smaller than the {was} in force; an alias's limits"
                           " stay the same or grow (a smaller model is a new alias)")
    return out


def breaches(old: Catalog, new: Catalog, now: int) -> list[str]:
    """Every way ``new`` breaks the policy against ``old`` (in force), one line each: empty when none."""
    return [refusal(c, now) for c in too_soon(model_changes(old, new, now), now)] + shrunk_limits(old, new)
