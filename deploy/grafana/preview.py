"""A previewer of deploy/grafana/gateway-dashboard.json without Grafana or Prometheus.

    .venv/bin/python -m deploy.grafana.preview [--seconds 60] [--window 30s] [--out docs/dashboard.png]

It starts a gateway stack of its own (free ports, the simulator as model server), runs a mixed load
(chat, streaming chat, embeddings, unknown-model 404s, rate-limit 429s, model-server 500s, a dead
deployment), scrapes the ext_proc's /metrics and Envoy's /stats/prometheus every 2 s, evaluates every
panel's PromQL with the small evaluator below, renders the panels by their gridPos as HTML with inline
SVG and screenshots the page with Debian's chromium (Playwright).  Nothing is invented: a panel whose
expression is outside the evaluator's subset is drawn as "not evaluated", a panel without samples says
"No data".

The PromQL subset (what the dashboard uses): number literals; vector selectors with `=`, `!=`, `=~`,
`!~` matchers; range selectors `[5m]`; rate / irate / increase (Prometheus's extrapolation rules);
`sum` with `by (...)`; histogram_quantile; clamp_min; binary `+ - * /` between scalars and vectors
(one-to-one matching on all labels).  Grafana's `$alias` variable is its "All" value (`.*`).

The dashboard's windows are `[5m]`; a 60-second load fills only a fifth of such a window, which makes
Prometheus's rate() read about a fifth of the real rate.  By default every range is therefore evaluated
over `--window` (30 s) instead, and the page says so; `--window asis` keeps the written ranges.
"""
from __future__ import annotations

import argparse
import gzip
import html
import json
import math
import random
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "gateway-dashboard.json"
LOOKBACK_S = 300.0          # Prometheus's instant-vector lookback delta
SCRAPE_S = 2.0


# ================================================================================================
# Sample storage and the text exposition format
# ================================================================================================

Labels = tuple[tuple[str, str], ...]            # sorted (name, value) pairs, "__name__" included


def labels_of(name: str, extra: dict[str, str] | None = None) -> Labels:
    d = dict(extra or {})
    d["__name__"] = name
    return tuple(sorted(d.items()))


class Store:
    """Samples by metric name, then by label set: lists of (seconds, value) in time order."""

    def __init__(self) -> None:
        self.by_name: dict[str, dict[Labels, list[tuple[float, float]]]] = {}

    def add(self, labels: Labels, t: float, v: float) -> None:
        name = dict(labels)["__name__"]
        self.by_name.setdefault(name, {}).setdefault(labels, []).append((t, v))

    def add_series(self, name: str, labels: dict[str, str], points: list[tuple[float, float]]) -> None:
        for t, v in points:
            self.add(labels_of(name, labels), t, v)

    def series(self, name: str) -> dict[Labels, list[tuple[float, float]]]:
        return self.by_name.get(name, {})


_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$')
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(s: str) -> str:
    return s.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line of the Prometheus text format."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, body, raw = m.groups()
        labels: dict[str, str] = {}
        if body:
            for lm in _LABEL.finditer(body[1:-1]):
                labels[lm.group(1)] = _unescape(lm.group(2))
        try:
            value = float(raw)
        except ValueError:
            continue
        out.append((name, labels, value))
    return out


# ================================================================================================
# The PromQL subset: parser
# ================================================================================================

class Unsupported(Exception):
    """The expression uses PromQL outside the previewer's subset."""


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]   # (label, op, value)
    range_s: float | None = None


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Agg:
    op: str
    by: tuple[str, ...] | None
    expr: Any


@dataclass(frozen=True)
class Bin:
    op: str
    left: Any
    right: Any


Node = Union[Num, Selector, Call, Agg, Bin]

_TOKEN = re.compile(r"""\s*(?:
    (?P<dur>(?:\d+(?:ms|s|m|h|d|w|y))+)(?![A-Za-z0-9_])
  | (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![A-Za-z0-9_.])
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/^%(){}\[\],=<>])
)""", re.X)

RANGE_FUNCS = {"rate", "irate", "increase"}
_DUR_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(s: str) -> float:
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+)(ms|s|m|h|d|w|y)", s):
        if m.start() != pos:
            raise ValueError(s)
        total += int(m.group(1)) * _DUR_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"bad duration {s!r}")
    return total


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise Unsupported(f"cannot read {expr[pos:pos + 20]!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, expr: str) -> None:
        self.toks = _tokens(expr)
        self.i = 0

    def peek(self, k: int = 0) -> tuple[str, str]:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("eof", "")

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise Unsupported(f"expected {value!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.additive()
        if self.peek()[0] != "eof":
            raise Unsupported(f"unexpected {self.peek()[1]!r}")
        return node

    def additive(self) -> Node:
        node = self.multiplicative()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            node = Bin(op, node, self.multiplicative())
        return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while self.peek()[0] == "op" and self.peek()[1] in "*/%^" and self.peek()[1]:
            op = self.take()[1]
            if op not in ("*", "/"):
                raise Unsupported(f"operator {op}")
            node = Bin(op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.peek() == ("op", "-"):
            self.take()
            return Bin("*", Num(-1.0), self.unary())
        return self.primary()

    def labels(self) -> tuple[str, ...]:
        self.take("(")
        names: list[str] = []
        while self.peek()[1] != ")":
            kind, name = self.take()
            if kind != "ident":
                raise Unsupported(f"label name expected, found {name!r}")
            names.append(name)
            if self.peek()[1] == ",":
                self.take()
        self.take(")")
        return tuple(names)

    def primary(self) -> Node:
        kind, value = self.peek()
        if kind == "num":
            self.take()
            return Num(float(value))
        if (kind, value) == ("op", "("):
            self.take()
            node = self.additive()
            self.take(")")
            return node
        if kind == "ident":
            nxt = self.peek(1)
            if value in ("sum", "avg", "min", "max", "count", "topk", "bottomk", "quantile", "stddev",
                         "stdvar", "count_values", "group") and (nxt[1] in ("(", "by", "without")):
                return self.aggregation()
            if nxt == ("op", "("):
                return self.call()
            return self.selector()
        if (kind, value) == ("op", "{"):
            raise Unsupported("selector without a metric name")
        raise Unsupported(f"unexpected {value!r}")

    def aggregation(self) -> Node:
        op = self.take()[1]
        if op != "sum":
            raise Unsupported(f"aggregation {op}")
        by: tuple[str, ...] | None = None
        if self.peek()[1] == "without":
            raise Unsupported("without (...)")
        if self.peek()[1] == "by":
            self.take()
            by = self.labels()
        self.take("(")
        expr = self.additive()
        self.take(")")
        if self.peek()[1] == "without":
            raise Unsupported("without (...)")
        if self.peek()[1] == "by":
            if by is not None:
                raise Unsupported("two by clauses")
            self.take()
            by = self.labels()
        return Agg(op, by, expr)

    def call(self) -> Node:
        func = self.take()[1]
        if func not in RANGE_FUNCS | {"histogram_quantile", "clamp_min"}:
            raise Unsupported(f"function {func}")
        self.take("(")
        args: list[Node] = []
        while self.peek()[1] != ")":
            args.append(self.additive())
            if self.peek()[1] == ",":
                self.take()
        self.take(")")
        if func in RANGE_FUNCS:
            if len(args) != 1 or not isinstance(args[0], Selector) or args[0].range_s is None:
                raise Unsupported(f"{func} needs one range selector")
        elif len(args) != 2:
            raise Unsupported(f"{func} takes two arguments")
        return Call(func, tuple(args))

    def selector(self) -> Node:
        name = self.take()[1]
        matchers: list[tuple[str, str, str]] = []
        if self.peek() == ("op", "{"):
            self.take()
            while self.peek()[1] != "}":
                kind, label = self.take()
                if kind != "ident":
                    raise Unsupported(f"label name expected, found {label!r}")
                op = self.take()[1]
                if op not in ("=", "!=", "=~", "!~"):
                    raise Unsupported(f"matcher {op}")
                kind, raw = self.take()
                if kind != "str":
                    raise Unsupported("matcher value must be a string")
                matchers.append((label, op, _unescape(raw[1:-1])))
                if self.peek()[1] == ",":
                    self.take()
            self.take("}")
        range_s = None
        if self.peek() == ("op", "["):
            self.take()
            kind, dur = self.take()
            if kind not in ("dur",):
                raise Unsupported(f"range {dur!r}")
            range_s = parse_duration(dur)
            self.take("]")
        if self.peek()[1] in ("offset", "@"):
            raise Unsupported("offset / @ modifiers")
        return Selector(name, tuple(matchers), range_s)


def parse(expr: str) -> Node:
    return _Parser(expr).parse()


# ================================================================================================
# The PromQL subset: evaluation at one instant
# ================================================================================================

Vector = list[tuple[Labels, float]]
Value = Union[float, Vector]


def _matches(labels: Labels, matchers: tuple[tuple[str, str, str], ...]) -> bool:
    d = dict(labels)
    for label, op, want in matchers:
        have = d.get(label, "")
        if op == "=" and have != want:
            return False
        if op == "!=" and have == want:
            return False
        if op in ("=~", "!~"):
            hit = re.fullmatch(f"(?:{want})", have) is not None
            if hit != (op == "=~"):
                return False
    return True


def _drop_name(labels: Labels) -> Labels:
    return tuple(p for p in labels if p[0] != "__name__")


def extrapolated_rate(points: list[tuple[float, float]], start: float, end: float, range_s: float,
                      is_rate: bool) -> float | None:
    """Prometheus's extrapolatedRate (promql/functions.go) for a counter; None with < 2 samples."""
    if len(points) < 2:
        return None
    result = points[-1][1] - points[0][1]
    prev = points[0][1]
    for _, v in points[1:]:
        if v < prev:                       # a counter reset
            result += prev
        prev = v
    first_t, last_t = points[0][0], points[-1][0]
    to_start, to_end = first_t - start, end - last_t
    sampled = last_t - first_t
    avg = sampled / (len(points) - 1)
    threshold = avg * 1.1
    if to_start >= threshold:
        to_start = avg / 2
    if result > 0 and points[0][1] >= 0:
        to_zero = sampled * (points[0][1] / result)
        if to_zero < to_start:
            to_start = to_zero
    if to_end >= threshold:
        to_end = avg / 2
    factor = (sampled + to_start + to_end) / sampled
    if is_rate:
        factor /= range_s
    return result * factor


def instant_rate(points: list[tuple[float, float]]) -> float | None:
    """Prometheus's irate: the last two samples of the range."""
    if len(points) < 2:
        return None
    (t0, v0), (t1, v1) = points[-2], points[-1]
    delta = v1 if v1 < v0 else v1 - v0
    return delta / (t1 - t0) if t1 > t0 else None


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's bucketQuantile over (upper bound, cumulative count) pairs."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets)
    if not buckets or not math.isinf(buckets[-1][0]):
        return math.nan
    merged: list[list[float]] = []                 # coalesce equal bounds
    for ub, c in buckets:
        if merged and merged[-1][0] == ub:
            merged[-1][1] += c
        else:
            merged.append([ub, c])
    for k in range(1, len(merged)):                # ensure monotonic counts
        merged[k][1] = max(merged[k][1], merged[k - 1][1])
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next(k for k, (_, c) in enumerate(merged) if c >= rank)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def _arith(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)
    return a / b


@dataclass
class Evaluator:
    store: Store
    window_s: float | None = None        # replaces every range when set
    lookback_s: float = LOOKBACK_S

    def eval(self, node: Node, t: float) -> Value:
        if isinstance(node, Num):
            return node.value
        if isinstance(node, Selector):
            if node.range_s is not None:
                raise Unsupported("a range vector outside rate/irate/increase")
            out: Vector = []
            for labels, pts in self.store.series(node.name).items():
                if not _matches(labels, node.matchers):
                    continue
                last = None
                for pt in pts:
                    if pt[0] > t:
                        break
                    last = pt
                if last is not None and last[0] > t - self.lookback_s:
                    out.append((labels, last[1]))
            return out
        if isinstance(node, Call):
            return self._call(node, t)
        if isinstance(node, Agg):
            inner = self.eval(node.expr, t)
            if not isinstance(inner, list):
                raise Unsupported("sum of a scalar")
            groups: dict[Labels, float] = {}
            for labels, v in inner:
                d = dict(labels)
                key = tuple(sorted((k, d[k]) for k in (node.by or ()) if d.get(k, "") != ""))
                groups[key] = groups.get(key, 0.0) + v
            return list(groups.items())
        if isinstance(node, Bin):
            return self._binary(node, t)
        raise Unsupported(repr(node))

    def _call(self, node: Call, t: float) -> Value:
        if node.func in RANGE_FUNCS:
            sel = node.args[0]
            rng = self.window_s if self.window_s is not None else sel.range_s
            start = t - rng
            out: Vector = []
            for labels, pts in self.store.series(sel.name).items():
                if not _matches(labels, sel.matchers):
                    continue
                window = [p for p in pts if start < p[0] <= t]
                if node.func == "irate":
                    v = instant_rate(window)
                else:
                    v = extrapolated_rate(window, start, t, rng, node.func == "rate")
                if v is not None:
                    out.append((_drop_name(labels), v))
            return out
        if node.func == "clamp_min":
            vec, lo = self.eval(node.args[0], t), self.eval(node.args[1], t)
            if not isinstance(vec, list) or isinstance(lo, list):
                raise Unsupported("clamp_min(vector, scalar)")
            return [(_drop_name(lb), v if math.isnan(v) else max(v, lo)) for lb, v in vec]
        if node.func == "histogram_quantile":
            q, vec = self.eval(node.args[0], t), self.eval(node.args[1], t)
            if isinstance(q, list) or not isinstance(vec, list):
                raise Unsupported("histogram_quantile(scalar, vector)")
            groups: dict[Labels, list[tuple[float, float]]] = {}
            for labels, v in vec:
                d = dict(labels)
                if "le" not in d:
                    continue
                key = tuple(p for p in labels if p[0] not in ("le", "__name__"))
                groups.setdefault(key, []).append((float(d["le"]), v))
            return [(key, bucket_quantile(q, b)) for key, b in groups.items()]
        raise Unsupported(f"function {node.func}")

    def _binary(self, node: Bin, t: float) -> Value:
        a, b = self.eval(node.left, t), self.eval(node.right, t)
        if not isinstance(a, list) and not isinstance(b, list):
            return _arith(node.op, a, b)
        if not isinstance(a, list):
            return [(_drop_name(lb), _arith(node.op, a, v)) for lb, v in b]  # type: ignore[union-attr]
        if not isinstance(b, list):
            return [(_drop_name(lb), _arith(node.op, v, b)) for lb, v in a]
        right = {_drop_name(lb): v for lb, v in b}
        return [(_drop_name(lb), _arith(node.op, v, right[_drop_name(lb)]))
                for lb, v in a if _drop_name(lb) in right]

    def range_query(self, expr: str, start: float, end: float, step: float) -> dict[Labels, list[tuple[float, float]]]:
        """What Grafana asks Prometheus for: the expression at every step; NaN points are kept out."""
        node = parse(expr)
        out: dict[Labels, list[tuple[float, float]]] = {}
        n = int(math.floor((end - start) / step + 1e-9))
        for k in range(n + 1):
            t = start + k * step
            v = self.eval(node, t)
            if not isinstance(v, list):
                v = [((), v)]
            for labels, x in v:
                out.setdefault(labels, [])
                if not math.isnan(x):
                    out[labels].append((t, x))
        return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    return expr


# ================================================================================================
# Rendering: Grafana-like panels as HTML + inline SVG
# ================================================================================================

PALETTE = ["#73BF69", "#F2CC0C", "#5794F2", "#FF9830", "#F2495C", "#B877D9", "#8AB8FF", "#FADE2A",
           "#96D98D", "#FFB357", "#CA95E5", "#FF7383", "#37872D", "#1F60C4", "#C4162A", "#8F3BB8"]
UNIT_H, MARGIN, PAGE_W, COLS = 30, 8, 1600, 24


def _scaled(v: float, base: float, suffixes: list[str], decimals: int | None) -> str:
    k = 0
    while abs(v) >= base and k < len(suffixes) - 1:
        v /= base
        k += 1
    return _num(v, decimals) + suffixes[k]


def _num(v: float, decimals: int | None = None) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if decimals is None:
        a = abs(v)
        decimals = 0 if a >= 100 or a == 0 else 1 if a >= 10 else 2 if a >= 1 else 3 if a >= 0.01 else 4
    s = f"{v:.{decimals}f}"
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def fmt(v: float, unit: str | None, decimals: int | None = None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "NaN"
    if unit == "percentunit":
        return _num(v * 100, decimals) + "%"
    if unit == "reqps":
        return _scaled(v, 1000, [" req/s", "K req/s", "M req/s"], decimals)
    if unit == "s":
        a = abs(v)
        if a == 0:
            return "0 s"
        if a < 1e-3:
            return _num(v * 1e6, decimals) + " µs"
        if a < 1:
            return _num(v * 1e3, decimals) + " ms"
        return _num(v, decimals) + " s"
    if unit == "currencyPLN":
        return _num(v, decimals if decimals is not None else (4 if abs(v) < 1 else 2)) + " PLN"
    return _scaled(v, 1000, ["", " K", " Mil", " Bil", " Tri"], decimals)


def nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        hi = lo + 1 if lo == 0 else lo + abs(lo)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, v = [], first
    while v <= hi + step * 0.5:
        ticks.append(round(v, 12))
        v += step
        if v > hi and ticks[-1] >= hi:
            break
    return ticks


def legend_name(fmt_: str | None, labels: Labels) -> str:
    d = dict(labels)
    if fmt_:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), fmt_).strip() or "{}"
    body = ", ".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
    return d.get("__name__", "") + "{" + body + "}"


@dataclass
class PanelData:
    series: list[tuple[str, list[tuple[float, float]]]] = field(default_factory=list)
    error: str | None = None


def evaluate_panel(panel: dict[str, Any], ev: Evaluator, start: float, end: float, step: float,
                   variables: dict[str, str]) -> PanelData:
    out = PanelData()
    for target in panel.get("targets", []):
        expr = substitute(target.get("expr", ""), variables)
        try:
            res = ev.range_query(expr, start, end, step)
        except Unsupported as e:
            out.error = f"not evaluated: {e} — in {target.get('expr')}"
            out.series = []
            return out
        for labels in sorted(res):
            out.series.append((legend_name(target.get("legendFormat"), labels), res[labels]))
    return out


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def svg_timeseries(panel: dict[str, Any], data: PanelData, w: int, h: int, start: float, end: float) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    fill = custom.get("fillOpacity", 10) / 100
    left, right, top, bottom = 62, 10, 8, 20
    pw, ph = w - left - right, h - top - bottom
    series = [(n, pts) for n, pts in data.series if pts]
    if stacked:                                   # cumulative sums per timestamp, in series order
        acc: dict[float, float] = {}
        drawn = []
        for n, pts in series:
            new = []
            for t, v in pts:
                base = acc.get(t, 0.0)
                acc[t] = base + v
                new.append((t, base, base + v))
            drawn.append((n, new))
    else:
        drawn = [(n, [(t, 0.0, v) for t, v in pts]) for n, pts in series]
    values = [p[2] for _, pts in drawn for p in pts if not math.isinf(p[2])] or [0.0]
    lo, hi = min(0.0, min(values)), max(values)
    ticks = nice_ticks(lo, hi if hi > lo else lo + 1)
    lo, hi = ticks[0], ticks[-1]
    x = lambda t: left + (t - start) / max(end - start, 1e-9) * pw  # noqa: E731
    y = lambda v: top + ph - (min(max(v, lo), hi) - lo) / (hi - lo) * ph  # noqa: E731
    parts = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" font-size="11" '
             f'font-family="Inter, Helvetica, Arial, sans-serif">']
    for tv in ticks:
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(tv):.1f}" y2="{y(tv):.1f}" stroke="#2c3235"/>')
        parts.append(f'<text x="{left - 6}" y="{y(tv) + 4:.1f}" text-anchor="end" fill="#ccccdc">'
                     f'{html.escape(fmt(tv, unit))}</text>')
    span = end - start
    xstep = next(s for s in (5, 10, 15, 20, 30, 60, 120, 300, 600, 1800, 3600) if span / s <= 6)
    tx = math.ceil(start / xstep) * xstep
    while tx <= end:
        parts.append(f'<line x1="{x(tx):.1f}" x2="{x(tx):.1f}" y1="{top}" y2="{top + ph}" stroke="#2c3235"/>')
        parts.append(f'<text x="{x(tx):.1f}" y="{h - 5}" text-anchor="middle" fill="#ccccdc">{_clock(tx)}</text>')
        tx += xstep
    for k, (_, pts) in enumerate(drawn):
        color = PALETTE[k % len(PALETTE)]
        # a gap (missing evaluation step) breaks the line, as in Grafana
        runs: list[list[tuple[float, float, float]]] = []
        for p in pts:
            if runs and p[0] - runs[-1][-1][0] <= SCRAPE_S * 1.5 + 1e-6:
                runs[-1].append(p)
            else:
                runs.append([p])
        for run in runs:
            line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, _, v in run)
            if fill > 0 and len(run) > 1:
                back = " ".join(f"{x(t):.1f},{y(b):.1f}" for t, b, _ in reversed(run))
                parts.append(f'<polygon points="{line} {back}" fill="{color}" fill-opacity="{fill:.2f}" stroke="none"/>')
            if len(run) == 1:
                t, _, v = run[0]
                parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2" fill="{color}"/>')
            else:
                parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    parts.append("</svg>")
    return "".join(parts)


def _calc(name: str, values: list[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return math.nan
    if name == "mean":
        return sum(vals) / len(vals)
    if name == "max":
        return max(vals)
    if name == "min":
        return min(vals)
    if name in ("last", "lastNotNull"):
        return vals[-1]
    raise Unsupported(f"legend calc {name}")


def legend_html(panel: dict[str, Any], data: PanelData, max_rows: int) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    opts = panel.get("options", {}).get("legend", {})
    calcs = opts.get("calcs", [])
    series = [(n, pts) for n, pts in data.series if pts]
    rows = []
    if calcs:
        rows.append("<tr><th></th>" + "".join(f"<th>{html.escape(c.capitalize())}</th>" for c in calcs) + "</tr>")
    shown = series if len(series) <= max_rows else series[:max_rows - 1]
    for k, (name, pts) in enumerate(shown):
        color = PALETTE[k % len(PALETTE)]
        cells = "".join(f"<td>{html.escape(fmt(_calc(c, [v for _, v in pts]), unit))}</td>" for c in calcs)
        rows.append(f'<tr><td class="n"><i style="background:{color}"></i>{html.escape(name)}</td>{cells}</tr>')
    if len(shown) < len(series):
        rows.append(f'<tr><td class="n more">+{len(series) - len(shown)} more series</td></tr>')
    return f'<table class="legend">{"".join(rows)}</table>'


def stat_html(panel: dict[str, Any], data: PanelData, w: int, h: int) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    calc = (panel.get("options", {}).get("reduceOptions", {}).get("calcs") or ["lastNotNull"])[0]
    steps = (panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps")
             or [{"color": "green", "value": None}, {"color": "red", "value": 80}])   # Grafana's default
    colors = {"green": "#73BF69", "red": "#F2495C", "yellow": "#FADE2A", "orange": "#FF9830", "blue": "#5794F2"}
    series = [(n, pts) for n, pts in data.series if pts]
    if not series:
        return '<div class="nodata">No data</div>'
    cells = []
    for name, pts in series:
        v = _calc(calc, [p[1] for p in pts])
        color = "green"
        for st in steps:
            if st.get("value") is None or (not math.isnan(v) and v >= st["value"]):
                color = st.get("color", color)
        c = colors.get(color, color)
        cw, ch = w // len(series), h
        vals = [p[1] for p in pts if not math.isinf(p[1])] or [0.0]
        lo, hi = min(0.0, min(vals)), max(vals) or 1.0
        t0, t1 = pts[0][0], max(pts[-1][0], pts[0][0] + 1e-9)
        spark = " ".join(f"{(t - t0) / (t1 - t0) * cw:.1f},{ch - (v_ - lo) / ((hi - lo) or 1) * ch * 0.45:.1f}"
                         for t, v_ in pts if not math.isinf(v_))
        svg = (f'<svg class="spark" width="{cw}" height="{ch}"><polygon points="0,{ch} {spark} {cw},{ch}" '
               f'fill="{c}" fill-opacity="0.18"/><polyline points="{spark}" fill="none" stroke="{c}" '
               f'stroke-width="1.5"/></svg>')
        label = f'<div class="slabel">{html.escape(name)}</div>' if len(series) > 1 else ""
        cells.append(f'<div class="stat" style="width:{cw}px;height:{ch}px">{svg}{label}'
                     f'<div class="sval" style="color:{c}">{html.escape(fmt(v, unit))}</div></div>')
    return "".join(cells)


def render_html(dashboard: dict[str, Any], results: dict[int, PanelData], start: float, end: float,
                header: str, subheader: str) -> str:
    colw = (PAGE_W - MARGIN) / COLS
    blocks, bottom = [], 0
    for idx, panel in enumerate(dashboard.get("panels", [])):
        gp = panel.get("gridPos", {})
        gx, gy, gw, gh = gp.get("x", 0), gp.get("y", 0), gp.get("w", 12), gp.get("h", 8)
        left = MARGIN + gx * colw
        top = gy * (UNIT_H + MARGIN)
        width = gw * colw - MARGIN
        height = gh * UNIT_H + (gh - 1) * MARGIN
        bottom = max(bottom, top + height)
        title = html.escape(panel.get("title", ""))
        style = f"left:{left:.0f}px;top:{top:.0f}px;width:{width:.0f}px;height:{height:.0f}px"
        if panel.get("type") == "row":
            blocks.append(f'<div class="row" style="{style}">▾ {title}</div>')
            continue
        data = results.get(idx, PanelData(error=f"panel type {panel.get('type')} is not rendered"))
        body_h = int(height) - 30
        inner_w = int(width) - 16
        if data.error:
            body = f'<div class="noteval">{html.escape(data.error)}</div>'
        elif panel.get("type") == "stat":
            body = stat_html(panel, data, inner_w, body_h - 6)
        elif panel.get("type") == "timeseries":
            n = len([s for s in data.series if s[1]])
            if n == 0:
                body = '<div class="nodata">No data</div>'
            else:
                has_calcs = bool(panel.get("options", {}).get("legend", {}).get("calcs"))
                max_rows = 5
                rows = min(n, max_rows) + (1 if has_calcs else 0)
                leg_h = 17 * rows + 6
                chart_h = body_h - leg_h
                body = (svg_timeseries(panel, data, inner_w, chart_h, start, end)
                        + legend_html(panel, data, max_rows))
        else:
            body = f'<div class="noteval">panel type {html.escape(str(panel.get("type")))} is not rendered</div>'
        blocks.append(f'<div class="panel" style="{style}"><div class="ptitle">{title}</div>'
                      f'<div class="pbody">{body}</div></div>')
    css = """
body{margin:0;background:#111217;color:#ccccdc;font:13px Inter,Helvetica,Arial,sans-serif}
header{padding:12px 16px 10px;border-bottom:1px solid #2c3235;background:#181b1f}
header h1{margin:0 0 6px;font-size:20px;font-weight:500;color:#fff}
header p{margin:2px 0;font-size:13px;color:#b4bac4}
.grid{position:relative;margin:10px 0 20px}
.panel{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:2px;overflow:hidden}
.ptitle{height:28px;line-height:28px;padding:0 8px;font-weight:500;color:#fff;font-size:13px;white-space:nowrap;
 overflow:hidden;text-overflow:ellipsis}
.pbody{padding:0 8px 6px;position:relative}
.row{position:absolute;font-size:15px;font-weight:500;color:#fff;line-height:30px}
.legend{font-size:11px;border-collapse:collapse;width:100%}
.legend th{text-align:right;color:#6e9fff;font-weight:500;padding:0 6px}
.legend td{text-align:right;padding:0 6px;white-space:nowrap;height:16px}
.legend td.n{text-align:left;max-width:1px;overflow:hidden;text-overflow:ellipsis;width:100%}
.legend td.more{color:#9fa7b3}
.legend i{display:inline-block;width:14px;height:4px;border-radius:2px;margin:0 6px 3px 0;vertical-align:middle}
.stat{position:relative;display:inline-block}
.spark{position:absolute;left:0;top:0}
.sval{position:absolute;left:0;right:0;top:38%;text-align:center;font-size:40px;font-weight:500}
.slabel{position:absolute;left:0;right:0;top:12%;text-align:center;font-size:12px}
.nodata{color:#9fa7b3;text-align:center;padding-top:90px;font-size:15px}
.noteval{color:#FF9830;padding:30px 10px;font-size:12px}
"""
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(header)}</title>'
            f'<style>{css}</style></head><body><header><h1>{html.escape(header)}</h1>{subheader}</header>'
            f'<div class="grid" style="height:{bottom + MARGIN:.0f}px;width:{PAGE_W}px">{"".join(blocks)}</div>'
            f'</body></html>')


def build_page(dashboard: dict[str, Any], store: Store, start: float, end: float, window_s: float | None,
               header: str, subheader: str) -> tuple[str, dict[int, PanelData]]:
    ev = Evaluator(store, window_s=window_s)
    variables = {"alias": ".*", "datasource": "prometheus", "__rate_interval": "1m", "__interval": "2s"}
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("name") not in variables:
            variables[v["name"]] = v.get("allValue") or ".*"
    results: dict[int, PanelData] = {}
    for idx, panel in enumerate(dashboard.get("panels", [])):
        if panel.get("type") in ("stat", "timeseries"):
            results[idx] = evaluate_panel(panel, ev, start, end, SCRAPE_S, variables)
    return render_html(dashboard, results, start, end, header, subheader), results


# ================================================================================================
# The load and the scrapes
# ================================================================================================

MSGS = [{"role": "user", "content": "Dzień dobry! Opowiedz krótko o Krakowie."}]


@dataclass
class LoadStats:
    sent: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, kind: str, status: int) -> None:
        with self.lock:
            self.sent[kind] = self.sent.get(kind, 0) + 1
            self.statuses[status] = self.statuses.get(status, 0) + 1


def _one_request(c: Any, kind: str, rng: random.Random) -> int:
    ttft = rng.choice([40, 80, 120, 200, 350, 600])
    out = rng.randint(8, 64)
    if kind == "chat":
        model = rng.choice(["polish-fast", "polish-fast", "polish-pro", "advanced"])
        r = c.post("/chat/completions", json={"model": model, "messages": MSGS,
                                              "sim": {"ttft_ms": ttft, "output_tokens": out}})
        return int(r.status_code)
    if kind == "stream":
        model = rng.choice(["polish-fast", "polish-pro", "advanced"])
        body = {"model": model, "messages": MSGS, "stream": True,
                "stream_options": {"include_usage": rng.random() < 0.5},
                "sim": {"ttft_ms": ttft, "itl_ms": rng.choice([5, 10, 20, 40]), "output_tokens": out}}
        with c.stream("POST", "/chat/completions", json=body) as r:
            for _ in r.iter_bytes():
                pass
            return int(r.status_code)
    if kind == "embed":
        r = c.post("/embeddings", json={"model": "embed", "input": ["Ala ma kota", "Kot ma Alę"],
                                        "sim": {"ttft_ms": rng.choice([10, 20, 40])}})
        return int(r.status_code)
    if kind == "unknown_model":
        return int(c.post("/chat/completions", json={"model": "no-such-model", "messages": MSGS}).status_code)
    if kind == "sim_500":
        return int(c.post("/chat/completions", json={"model": "polish-pro", "messages": MSGS,
                                                     "sim": {"status": 500}}).status_code)
    if kind == "dead_deployment":
        return int(c.post("/chat/completions", json={"model": "dead-alias", "messages": MSGS}).status_code)
    raise ValueError(kind)


MIX = [("chat", 40), ("stream", 30), ("embed", 15), ("unknown_model", 5), ("sim_500", 5), ("dead_deployment", 2)]


def run_load(v1: str, key: str, limited_key: str, seconds: float, stats: LoadStats, workers: int = 6) -> None:
    import httpx
    deadline = time.monotonic() + seconds

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        kinds, weights = zip(*MIX)
        with httpx.Client(base_url=v1, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            while time.monotonic() < deadline:
                kind = rng.choices(kinds, weights)[0]
                try:
                    stats.note(kind, _one_request(c, kind, rng))
                except httpx.HTTPError:
                    stats.note(kind, 0)
                time.sleep(rng.uniform(0.1, 0.5))

    def limited() -> None:                      # a key allowed 30 requests per minute, sent ~50
        with httpx.Client(base_url=v1, headers={"Authorization": f"Bearer {limited_key}"}, timeout=30) as c:
            while time.monotonic() < deadline:
                r = c.post("/chat/completions", json={"model": "polish-fast", "messages": MSGS})
                stats.note("low_rpm_key", int(r.status_code))
                time.sleep(1.2)

    threads = [threading.Thread(target=worker, args=(7 + k,)) for k in range(workers)]
    threads.append(threading.Thread(target=limited))
    for th in threads:
        th.start()
    for th in threads:
        th.join()


class Scraper(threading.Thread):
    """Every 2 s: the ext_proc's /metrics and Envoy's /stats/prometheus, kept as text with their time."""

    def __init__(self, targets: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.targets = targets
        self.scrapes: list[dict[str, Any]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        import httpx
        with httpx.Client(timeout=5) as c:
            nxt = time.time()
            while not self.stop_event.is_set():
                for job, url in self.targets.items():
                    t = time.time()
                    try:
                        r = c.get(url)
                        if r.status_code == 200:
                            self.scrapes.append({"job": job, "t": t, "text": r.text})
                    except httpx.HTTPError:
                        pass
                nxt += SCRAPE_S
                self.stop_event.wait(max(0.0, nxt - time.time()))


def store_from_scrapes(scrapes: list[dict[str, Any]]) -> Store:
    store = Store()
    for s in sorted(scrapes, key=lambda s: s["t"]):
        for name, labels, value in parse_exposition(s["text"]):
            labels = {**labels, "job": s["job"]}
            store.add(labels_of(name, labels), s["t"], value)
    return store


def collect(seconds: float, idle_before: float, idle_after: float) -> dict[str, Any]:
    """Start a stack, scrape it while the load runs; the raw scrapes and what the load did."""
    sys.path.insert(0, str(ROOT))
    from tests.conftest import running_stack   # the suite's stack: free ports, simulator upstreams

    stats = LoadStats()
    with running_stack("gw-dash-preview-", default_rpm=100000, default_concurrency=1000) as gw:
        _, _, key = gw.new_org(1_000_000_000)
        _, kid, limited_key = gw.new_org(1_000_000_000)
        gw.admin(lambda a: a.set_key_limits(kid, 30))
        s = gw.stack.s
        scraper = Scraper({"extproc": f"http://127.0.0.1:{s.metrics_port}/metrics",
                           "envoy": f"http://127.0.0.1:{s.envoy_admin_port}/stats/prometheus"})
        scraper.start()
        time.sleep(idle_before)
        t_load0 = time.time()
        run_load(gw.v1, key, limited_key, seconds, stats)
        t_load1 = time.time()
        time.sleep(idle_after)
        scraper.stop_event.set()
        scraper.join()
    return {"scrapes": scraper.scrapes, "seconds": seconds, "load_start": t_load0, "load_end": t_load1,
            "sent": stats.sent, "statuses": {str(k): v for k, v in sorted(stats.statuses.items())}}


def screenshot(html_text: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": PAGE_W, "height": 900})
            page.set_content(html_text)
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the load")
    ap.add_argument("--window", default="30s", help="range used for every [5m] window, or 'asis'")
    ap.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    ap.add_argument("--html", default=None, help="also write the page here (default: beside --out if under 100 KB)")
    ap.add_argument("--samples", default=None, help="save the raw scrapes here (gzip JSON)")
    ap.add_argument("--from-samples", default=None, help="render saved scrapes instead of running a stack")
    ap.add_argument("--dashboard", default=str(DASHBOARD))
    args = ap.parse_args(argv)

    window_s = None if args.window == "asis" else parse_duration(args.window)
    if args.from_samples:
        run = json.loads(gzip.decompress(Path(args.from_samples).read_bytes()))
    else:
        run = collect(args.seconds, idle_before=4.0, idle_after=6.0)
        samples = Path(args.samples) if args.samples else Path(tempfile.mkdtemp(prefix="dash-")) / "scrapes.json.gz"
        samples.write_bytes(gzip.compress(json.dumps(run).encode()))
        print(f"raw scrapes: {samples}", file=sys.stderr)

    dashboard = json.loads(Path(args.dashboard).read_text())
    store = store_from_scrapes(run["scrapes"])
    times = sorted({s["t"] for s in run["scrapes"]})
    start, end = math.ceil(times[0]), math.floor(times[-1])
    n_scrapes = len([s for s in run["scrapes"] if s["job"] == "extproc"])
    load_s = float(run.get("seconds", args.seconds))      # as configured; the exact times are printed below
    sent = ", ".join(f"{k} {v}" for k, v in sorted(run["sent"].items(), key=lambda kv: -kv[1]))
    statuses = ", ".join(f"{k}: {v}" for k, v in run["statuses"].items())
    header = (f"{dashboard.get('title', 'dashboard')} — {Path(args.dashboard).relative_to(ROOT) if Path(args.dashboard).is_relative_to(ROOT) else args.dashboard}"
              f" rendered by deploy/grafana/preview.py (not Grafana itself) from real metrics scraped during a {load_s:.0f}-second load")
    window_note = ("every range window is evaluated as written" if window_s is None else
                   f"every range window written in the dashboard (e.g. [5m]) is evaluated over [{args.window}] "
                   f"because the load lasts only {load_s:.0f} s")
    sub = (f"<p>Local stack (Envoy + ext_proc + Redis + PostgreSQL, simulator as model server); ext_proc /metrics and "
           f"Envoy /stats/prometheus scraped every {SCRAPE_S:.0f} s ({n_scrapes} scrapes, "
           f"{_clock(start)}–{_clock(end)} UTC, load {_clock(run['load_start'])}–{_clock(run['load_end'])}); "
           f"PromQL evaluated by the previewer's own subset evaluator at {SCRAPE_S:.0f} s steps; alias = All; "
           f"{html.escape(window_note)}.</p>"
           f"<p>Requests sent: {html.escape(sent)} — HTTP statuses seen by the client: {html.escape(statuses)}.</p>")
    page, results = build_page(dashboard, store, start, end, window_s, header, sub)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    screenshot(page, out)
    html_path = Path(args.html) if args.html else out.with_suffix(".html")
    if args.html or len(page.encode()) < 100_000:
        html_path.write_text(page)
        print(f"html: {html_path} ({len(page.encode())} bytes)", file=sys.stderr)
    for idx, data in sorted(results.items()):
        title = dashboard["panels"][idx].get("title")
        state = data.error or f"{len([s for s in data.series if s[1]])} series with data"
        print(f"  panel {title!r}: {state}", file=sys.stderr)
    print(f"screenshot: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
