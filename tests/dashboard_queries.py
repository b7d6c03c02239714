"""The PromQL of deploy/grafana/gateway-dashboard.json as Grafana sends it to Prometheus: every panel's
targets with the dashboard's template variables and Grafana's built-in interval variables filled in."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "gateway-dashboard.json"


def load() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def variables(dashboard: dict[str, Any], step_s: float, scrape_s: float, range_s: float) -> dict[str, str]:
    """Grafana's values: a multi-value variable is its "All" (its allValue); ``$__interval`` is the step,
    ``$__rate_interval`` max(step + scrape interval, 4 × scrape interval), ``$__range`` the time range."""
    out = {"__interval": f"{step_s:g}s", "__interval_ms": f"{step_s * 1000:g}",
           "__rate_interval": f"{max(step_s + scrape_s, 4 * scrape_s):g}s",
           "__range": f"{range_s:g}s", "__range_s": f"{range_s:g}", "__range_ms": f"{range_s * 1000:g}"}
    for var in dashboard["templating"]["list"]:
        if var["type"] != "datasource":
            out[var["name"]] = var["allValue"]
    return out


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with ``$name``, ``${name}`` and ``[[name]]`` replaced; an unknown variable is an error."""
    def one(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        if name not in values:
            raise KeyError(f"dashboard variable ${name} has no value")
        return values[name]
    return _VARIABLE.sub(one, expr)


def queries(dashboard: dict[str, Any], values: dict[str, str]) -> Iterator[tuple[dict[str, Any], dict[str, Any], str]]:
    """(panel, target, PromQL) of every query of the dashboard."""
    for panel in all_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel, target, substitute(target["expr"], values)
