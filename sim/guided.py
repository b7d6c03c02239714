"""A small, deterministic JSON-Schema-driven value generator (the simulator's "guided decoding").

``generate(schema, seed)`` returns a value valid against ``schema`` for the subset pydantic and
OpenAI clients emit: ``type`` (one or a list), ``properties``/``required`` (every property is
produced, required or not), ``additionalProperties``, ``items``/``minItems``/``maxItems``,
``enum``/``const``, ``anyOf``/``oneOf`` (the first non-null branch), ``allOf`` (merged),
``$ref`` to ``#/$defs/...`` or ``#/definitions/...``, string ``format`` (date, date-time, email,
uri, uuid), ``minLength``/``maxLength``, ``minimum``/``maximum`` (and exclusive forms). The same
schema and seed always give the same value.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

_WORDS = ("alfa", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
_FORMATS = {
    "date": "2026-01-02",
    "date-time": "2026-01-02T03:04:05Z",
    "time": "03:04:05",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def _pick(seed: str, n: int) -> int:
    return int.from_bytes(hashlib.sha256(seed.encode("utf-8")).digest()[:4], "big") % max(n, 1)


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    node: Any = root
    for part in ref.lstrip("#/").split("/"):
        if not part:
            continue
        node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def generate(schema: Any, seed: str = "", root: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A value valid against ``schema`` (see module docstring)."""
    if not isinstance(schema, dict):
        return {}
    root = root if root is not None else schema
    if depth > 12:
        return None
    if "$ref" in schema and isinstance(schema["$ref"], str):
        merged = dict(_resolve(schema["$ref"], root))
        merged.update({k: v for k, v in schema.items() if k != "$ref"})
        return generate(merged, seed, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][_pick(seed, len(schema["enum"]))]
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for sub in schema["allOf"]:
            if isinstance(sub, dict) and "$ref" in sub:
                sub = _resolve(sub["$ref"], root)
            if isinstance(sub, dict):
                for k, v in sub.items():
                    if k == "properties" and isinstance(v, dict):
                        merged["properties"] = {**merged.get("properties", {}), **v}
                    else:
                        merged.setdefault(k, v)
        return generate(merged, seed, root, depth + 1)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            non_null = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
            return generate((non_null or branches)[0], seed, root, depth + 1)
    typ = schema.get("type")
    if isinstance(typ, list):
        non_null = [t for t in typ if t != "null"]
        typ = non_null[0] if non_null else "null"
    if typ is None:
        if "properties" in schema:
            typ = "object"
        elif "items" in schema:
            typ = "array"
        else:
            typ = "string" if schema else "object"
    if typ == "object":
        props = schema.get("properties")
        if not isinstance(props, dict):
            return {}
        return {name: generate(sub, f"{seed}/{name}", root, depth + 1) for name, sub in props.items()}
    if typ == "array":
        lo = schema.get("minItems", 1)
        hi = schema.get("maxItems", max(lo, 2))
        count = max(lo, min(hi, 2)) if isinstance(lo, int) and isinstance(hi, int) else 1
        if isinstance(schema.get("prefixItems"), list):
            return [generate(s, f"{seed}[{i}]", root, depth + 1) for i, s in enumerate(schema["prefixItems"])]
        return [generate(schema.get("items", {}), f"{seed}[{i}]", root, depth + 1) for i in range(count)]
    if typ in ("integer", "number"):
        lo = schema.get("minimum")
        if lo is None and schema.get("exclusiveMinimum") is not None:
            lo = schema["exclusiveMinimum"] + 1
        hi = schema.get("maximum")
        if hi is None and schema.get("exclusiveMaximum") is not None:
            hi = schema["exclusiveMaximum"] - 1
        if typ == "integer":  # the integers within fractional bounds
            lo, hi = lo if lo is None else math.ceil(lo), hi if hi is None else math.floor(hi)
        base = 1 + _pick(seed, 42)
        if lo is not None and base < lo:
            base = lo
        if hi is not None and base > hi:
            base = hi
        return int(base) if typ == "integer" else float(base)
    if typ == "boolean":
        return _pick(seed, 2) == 1
    if typ == "null":
        return None
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt]
    text = _WORDS[_pick(seed, len(_WORDS))]
    lo = schema.get("minLength")
    hi = schema.get("maxLength")
    if isinstance(lo, int) and len(text) < lo:
        text = (text * (lo // len(text) + 1))[:lo]
    if isinstance(hi, int) and len(text) > hi:
        text = text[:hi]
    return text
