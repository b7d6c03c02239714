"""The model catalog, loaded from YAML and checked: its values (``catalog_types``: aliases,
capabilities, limits, prices with effective times, upstream models with traffic shares, also with
effective times, and deployments) from a file whose errors name the file, the line and the field.
The capabilities an alias may list are the endpoints' (``endpoints``) and ``vision``.
"""
from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import yaml

from .catalog_types import (ALWAYS as ALWAYS, Alias as Alias, Catalog as Catalog, CatalogError as CatalogError,
                            Deployment as Deployment, PriceStep as PriceStep, Upstream as Upstream,
                            UpstreamStep as UpstreamStep)
from .cost import Prices
from .endpoints import REGISTRY, Registry


T = TypeVar("T")

# what an alias may list besides the endpoints' capabilities: images in chat messages (an input, not an
# endpoint)
_INPUT_CAPS = frozenset({"vision"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _deployment(d: Any, name: str, i: int, w: str) -> Deployment:
    if not isinstance(d, dict) or not isinstance(d.get("host"), str):
        raise CatalogError(f"{w}.host: must be a string")
    key_env = d.get("api_key_env")
    if key_env is not None and not (isinstance(key_env, str) and _ENV_NAME.fullmatch(key_env)):
        raise CatalogError(f"{w}.api_key_env: must be the name of an environment variable (the key itself "
                           "never goes in the catalog)")
    tls = d.get("tls", False)
    if not isinstance(tls, bool):
        raise CatalogError(f"{w}.tls: must be true or false")
    for opt in ("ca_file", "sni"):
        v = d.get(opt)
        if v is not None and (not isinstance(v, str) or not v):
            raise CatalogError(f"{w}.{opt}: must be a non-empty string")
        if v is not None and not tls:
            raise CatalogError(f"{w}.{opt}: applies to a TLS deployment only (tls: true)")
    if ("port" in d) == ("port_offset" in d):
        raise CatalogError(f"{w}: give either port or port_offset (a port relative to GATEWAY_PORT)")
    offset = _int(d, "port_offset", w, 1) if "port_offset" in d else None
    return Deployment(str(d.get("name", f"{name}-{i}")), d["host"], 0 if offset is not None else _int(d, "port", w, 1),
                      key_env, tls, d.get("ca_file"), d.get("sni"), offset)


WARSAW = ZoneInfo("Europe/Warsaw")


def _ts(value: Any, where: str) -> int:
    """An ``effective`` time as unix seconds.  A date alone (``2026-12-01``) is the start of that day in
    Poland (00:00 Europe/Warsaw, when a Polish customer expects a new price list to start); a date-time
    names its offset (``Z``, ``+01:00``), and one without an offset is read as UTC."""
    if isinstance(value, str):
        try:
            value = (dt.date.fromisoformat(value.strip()) if len(value.strip()) == 10
                     else dt.datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            raise CatalogError(f"{where}: not an ISO date-time: {value!r}") from None
    if isinstance(value, dt.datetime):
        d = value
    elif isinstance(value, dt.date):
        d = dt.datetime(value.year, value.month, value.day, tzinfo=WARSAW)
    else:
        raise CatalogError(f"{where}: missing or not a date-time")
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.timezone.utc)
    return int(d.timestamp())


def _int(d: dict[str, Any], key: str, where: str, minimum: int = 0, default: int | None = None) -> int:
    """An integer field: a float (1.5, 1.5e+6), a string ("abc", "1.5e6": YAML reads that as text), a
    boolean or a value below ``minimum`` is refused, never rounded or converted."""
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        shown = "missing" if v is None else f"got {v!r}" if isinstance(v, (int, float, str)) else "not a number"
        raise CatalogError(f"{where}.{key}: must be an integer >= {minimum} ({shown[:40]})")
    return v


def _of(kind: type[T], v: Any, where: str) -> T:
    """``v`` if it is a ``kind`` (dict or list), an empty one if it is absent (None)."""
    if v is None:
        return kind()
    if not isinstance(v, kind):
        raise CatalogError(f"{where}: must be {'a mapping' if kind is dict else 'a list'}")
    return v


def parse(doc: Any, source: str = "<catalog>", endpoints: Registry = REGISTRY) -> Catalog:
    """``endpoints``: the endpoints served, whose capabilities an alias may list."""
    known = endpoints.capabilities | _INPUT_CAPS
    if not isinstance(doc, dict):
        raise CatalogError(f"{source}: the catalog must be a mapping")
    models_doc = _of(dict, doc.get("upstream_models"), f"{source}: upstream_models")
    deployments: dict[str, tuple[Deployment, ...]] = {}
    for name, m in models_doc.items():
        where = f"{source}: upstream_models.{name}"
        deps: list[Deployment] = []
        for i, d in enumerate(_of(list, _of(dict, m, where).get("deployments"), where + ".deployments")):
            w = f"{where}.deployments[{i}]"
            deps.append(_deployment(d, str(name), i, w))
            # Envoy picks the deployment after the upstream model's headers are set: one key per model,
            # so that no deployment is ever sent another's key.
            if deps[-1].api_key_env != deps[0].api_key_env:
                raise CatalogError(f"{w}.api_key_env: every deployment of an upstream model must name the "
                                   "same api_key_env (or none)")
        deployments[str(name)] = tuple(deps)
    aliases: dict[str, Alias] = {}
    for name, a in _of(dict, doc.get("aliases"), f"{source}: aliases").items():
        where = f"{source}: aliases.{name}"
        if not isinstance(a, dict):
            raise CatalogError(f"{where}: must be a mapping")
        caps = tuple(_of(list, a.get("capabilities"), where + ".capabilities"))
        if not caps or not set(caps) <= known:
            raise CatalogError(f"{where}.capabilities: each must be one of {sorted(known)}")
        steps = []
        for i, p in enumerate(_of(list, a.get("prices"), where + ".prices")):
            w = f"{where}.prices[{i}]"
            if not isinstance(p, dict):
                raise CatalogError(f"{w}: must be a mapping")
            steps.append(PriceStep(_ts(p.get("effective"), w + ".effective"),
                                   Prices(_int(p, "input_micro_pln_per_1m", w),
                                          _int(p, "output_micro_pln_per_1m", w, default=0))))
        if not steps:
            raise CatalogError(f"{where}.prices: at least one price with an effective date is required")
        steps.sort(key=lambda s: s.effective)
        ups = [UpstreamStep(ALWAYS, _upstreams(a.get("upstreams"), where + ".upstreams", deployments))]
        for i, c in enumerate(_of(list, a.get("upstream_changes"), where + ".upstream_changes")):
            w = f"{where}.upstream_changes[{i}]"
            if not isinstance(c, dict):
                raise CatalogError(f"{w}: must be a mapping")
            ups.append(UpstreamStep(_ts(c.get("effective"), w + ".effective"),
                                    _upstreams(c.get("upstreams"), w + ".upstreams", deployments)))
            if ups[-1].effective in {u.effective for u in ups[1:-1]}:
                raise CatalogError(f"{w}.effective: another upstream change of this alias has the same time")
        ups.sort(key=lambda u: u.effective)
        aliases[str(name)] = Alias(
            id=str(name), capabilities=caps,
            context_length=_int(a, "context_length", where, 1),
            max_output_tokens=_int(a, "max_output_tokens", where, 0),
            created=_ts(a.get("created", "2026-01-01T00:00:00Z"), where + ".created"),
            price_steps=tuple(steps), upstream_steps=tuple(ups),
        )
    return Catalog(aliases, deployments)


def _upstreams(doc: Any, where: str, deployments: dict[str, tuple[Deployment, ...]]) -> tuple[Upstream, ...]:
    ups = []
    for i, u in enumerate(_of(list, doc, where)):
        w = f"{where}[{i}]"
        if not isinstance(u, dict) or u.get("model") not in deployments:
            raise CatalogError(f"{w}.model: must name an entry of upstream_models")
        ups.append(Upstream(u["model"], _int(u, "share", w, default=100)))
    return tuple(ups)


_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _line_of(root: yaml.Node | None, dotted: str) -> int | None:
    """The 1-based line of the node at a path like ``aliases.a.prices[0].effective`` (or its nearest
    existing parent)."""
    node, line = root, None
    for name, index in _STEP.findall(dotted):
        if node is None:
            break
        line = node.start_mark.line + 1
        if name and isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == name), None)
            if node is None:
                break
        elif index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
            node = node.value[int(index)]
        else:
            break
    return node.start_mark.line + 1 if node is not None else line


def load(path: str | Path, data: bytes | None = None) -> Catalog:
    """Load and check a catalog (``data``: the file's bytes, already read); every error names the file,
    the line and the field."""
    p = Path(path)
    try:
        text = (p.read_bytes() if data is None else data).decode()
    except UnicodeDecodeError:
        raise CatalogError(f"{p}: not UTF-8 text") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        raise CatalogError(f"{p}:{line} malformed YAML") from None
    try:
        return parse(doc, str(p))
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        if not isinstance(e, CatalogError):  # a shape parse() does not check for: still named, never raw
            raise CatalogError(f"{p}: not a valid catalog ({type(e).__name__})") from None
        msg = str(e)
        field = msg[len(str(p)) + 2:].split(":", 1)[0] if msg.startswith(f"{p}: ") else ""
        where = _line_of(yaml.compose(text), field) if field else None
        if where is None:
            raise
        raise CatalogError(f"{p}: line {where}: {msg[len(str(p)) + 2:]}") from None
