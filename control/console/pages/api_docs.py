"""The public API's machine-readable description (``openapi.yaml`` at the repository root, shipped in the
console's package: control/console/openapi.yaml links to it) as
``/openapi.json``, and its reference page ``/docs/api`` rendered here, server-side, from that document:
operations, parameters, request bodies, statuses with headers, and every schema.  No JavaScript, no
external resources; no login needed (the document is public).  The gateway's ``/v1`` listener does not
serve either."""
from __future__ import annotations

import html
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from markupsafe import Markup

from ..web import HERE, console, render

routes = web.RouteTableDef()

OPENAPI = HERE / "openapi.yaml"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int) -> tuple[dict[str, Any], bytes]:
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not an OpenAPI document")
    return doc, json.dumps(doc, ensure_ascii=False, indent=1).encode()


def load_document(path: Path = OPENAPI) -> tuple[dict[str, Any], bytes]:
    """(the parsed document, its JSON); re-read when the file changes."""
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        raise web.HTTPNotFound() from None
    return _load(str(path), mtime)


@routes.get("/openapi.json")
async def openapi_json(request: web.Request) -> web.Response:
    _, body = load_document()
    return web.Response(body=body, content_type="application/json", charset="utf-8")


@routes.get("/docs/api")
async def api_reference(request: web.Request) -> web.Response:
    doc, _ = load_document()
    return render(request, "api_docs.html", api=reference(doc, console(request).settings.gateway_base_url))


# ---------------------------------------------------------------- the view model (pure)

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_ITEM = re.compile(r"^(\s*)(?:[-*]|\d+\.)\s+(.*)$")


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    out = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", out)
    return _BOLD.sub(lambda m: f"<strong>{m.group(1)}</strong>", out)


def markdown(text: str | None) -> Markup:
    """The small Markdown subset of the document's descriptions: paragraphs, lists, tables, `code`,
    **bold**.  Everything is escaped first."""
    if not text:
        return Markup("")
    parts: list[str] = []
    for i, chunk in enumerate(re.split(r"^```[a-z]*\n?", text.strip(), flags=re.M)):
        if i % 2:  # inside a fenced code block
            parts.append("<pre>" + html.escape(chunk.rstrip("\n"), quote=False) + "</pre>")
        else:
            parts.extend(_blocks(chunk))
    return Markup("".join(parts))


def _row(tag: str, cells: list[str]) -> str:
    return "<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>"


def _blocks(text: str) -> list[str]:
    parts: list[str] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        if not block.strip():
            continue
        lines = block.split("\n")
        if all(ln.strip().startswith("|") for ln in lines):
            rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines
                    if not re.fullmatch(r"\s*\|[\s|:-]+\|\s*", ln)]
            parts.append('<table class="compact"><thead>' + _row("th", rows[0]) + "</thead><tbody>"
                         + "".join(_row("td", r) for r in rows[1:]) + "</tbody></table>")
        elif _ITEM.match(lines[0]):
            items: list[str] = []
            for ln in lines:
                m = _ITEM.match(ln)
                if m and len(m.group(1)) < 2:
                    items.append(m.group(2).strip())
                elif items:
                    items[-1] += " " + ln.strip()
            tag = "ol" if lines[0].lstrip()[0].isdigit() else "ul"
            parts.append(f"<{tag}>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + f"</{tag}>")
        else:
            parts.append("<p>" + _inline(" ".join(ln.strip() for ln in lines)) + "</p>")
    return parts


def _resolve(doc: dict[str, Any], obj: Any) -> Any:
    seen = 0
    while isinstance(obj, dict) and "$ref" in obj and seen < 16:
        node: Any = doc
        for part in obj["$ref"].lstrip("#/").split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        obj, seen = node, seen + 1
    return obj


def type_of(schema: Any) -> Markup:
    """A one-line description of a schema's type, with links to named schemas."""
    if not isinstance(schema, dict):
        return Markup("any")
    if "$ref" in schema:
        name = html.escape(schema["$ref"].rsplit("/", 1)[-1])
        return Markup(f'<a href="#schema-{name}">{name}</a>')
    for key, sep in (("anyOf", " or "), ("oneOf", " or "), ("allOf", " and ")):
        if key in schema:
            return Markup(sep).join(type_of(s) for s in schema[key])
    if "const" in schema:
        return Markup("<code>{}</code>").format(json.dumps(schema["const"], ensure_ascii=False))
    t = schema.get("type")
    types = t if isinstance(t, list) else [t] if t else []
    out: list[Markup] = []
    for one in types:
        if one == "array":
            out.append(Markup("array of ") + type_of(schema.get("items")))
        elif one == "object" and not schema.get("properties") and schema.get("additionalProperties") is not False:
            out.append(Markup("object"))
        else:
            out.append(Markup("{}").format(one))
    text = Markup(" or ").join(out) if out else Markup("any")
    if "format" in schema:
        text += Markup(" ({})").format(schema["format"])
    return text


def constraints(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    out = []
    if "enum" in schema:
        out.append("one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"]))
    for key, label in (("minimum", ">="), ("maximum", "<="), ("minItems", "min items"), ("maxItems", "max items"),
                       ("minLength", "min length"), ("pattern", "pattern")):
        if key in schema:
            out.append(f"{label} {schema[key]}")
    if "default" in schema:
        out.append(f"default {json.dumps(schema['default'])}")
    if "examples" in schema:
        out.append("e.g. " + ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["examples"]))
    return out


def properties(schema: Any, depth: int = 0) -> list[dict[str, Any]]:
    """The schema's properties (inline nested objects and array items expanded one level per depth)."""
    schema = schema if isinstance(schema, dict) else {}
    required = set(schema.get("required", []))
    out: list[dict[str, Any]] = []
    for name, sub in (schema.get("properties") or {}).items():
        out.append({"name": name, "type": type_of(sub), "required": name in required, "constraints": constraints(sub),
                    "description": markdown(sub.get("description") if isinstance(sub, dict) else None),
                    "depth": depth})
        if isinstance(sub, dict) and "$ref" not in sub and depth < 3:
            inner = sub.get("items") if sub.get("type") == "array" else sub
            if isinstance(inner, dict) and "$ref" not in inner and inner.get("properties"):
                out.extend(properties(inner, depth + 1))
    return out


def _items(doc: dict[str, Any], mapping: Any) -> list[tuple[str, Any]]:
    """A mapping's members, each resolved if it is a ``$ref``."""
    return [(str(k), _resolve(doc, v)) for k, v in (mapping or {}).items()]


def _media(obj: dict[str, Any]) -> list[tuple[str, Markup]]:
    """(media type, its schema's type) of a request body's or a response's content."""
    return [(mt, type_of(m.get("schema"))) for mt, m in (obj.get("content") or {}).items()]


def _operation(doc: dict[str, Any], path: str, method: str, item: dict[str, Any],
               default_security: list[str]) -> dict[str, Any]:
    op = item[method]
    params = [_resolve(doc, p) for p in [*item.get("parameters", []), *op.get("parameters", [])]]
    body = _resolve(doc, op.get("requestBody") or {})
    responses = [{"status": status, "description": markdown(resp.get("description")), "content": _media(resp),
                  "headers": [(name, type_of(h.get("schema")), bool(h.get("required")), markdown(h.get("description")))
                              for name, h in _items(doc, resp.get("headers"))]}
                 for status, resp in _items(doc, op.get("responses"))]
    sec = op.get("security")
    return {
        "method": method.upper(), "path": path, "op_id": op.get("operationId", ""), "summary": op.get("summary", ""),
        "description": markdown(op.get("description")),
        "security": [n for req in sec for n in req] if sec is not None else default_security,
        "parameters": [(p["name"], p["in"], bool(p.get("required")), type_of(p.get("schema")),
                        markdown(p.get("description"))) for p in params],
        "body": _media(body), "body_required": bool(body.get("required")), "responses": responses,
        "examples": [(ex.get("summary") or name, json.dumps(ex.get("value"), ensure_ascii=False, indent=2))
                     for media in (body.get("content") or {}).values()
                     for name, ex in _items(doc, media.get("examples"))]}


def _schema(doc: dict[str, Any], name: str, s: dict[str, Any]) -> dict[str, Any]:
    extras = ""
    if s.get("additionalProperties") is True:
        extras = "further members allowed"
    elif s.get("additionalProperties") is False:
        extras = "no other members"
    props = properties(s)
    for branch in s.get("allOf", []):
        if isinstance(branch, dict) and "$ref" not in branch:
            props.extend(properties(branch))
    return {"name": name, "type": Markup("object") if "properties" in s else type_of(s),
            "description": markdown(s.get("description")), "props": props, "constraints": constraints(s),
            "extras": extras}


def server_url(server: dict[str, Any], base_url: str) -> str:
    """A server's address with its variables filled in: ``{base_url}`` with this gateway's own address,
    any other with its default."""
    values = {name: str(v.get("default", "")) for name, v in (server.get("variables") or {}).items()}
    values["base_url"] = base_url
    return re.sub(r"\{([A-Za-z0-9_]+)\}", lambda m: values.get(m.group(1), m.group(0)), str(server.get("url", "")))


def reference(doc: dict[str, Any], base_url: str) -> dict[str, Any]:
    """The page's view model, plain dicts and lists (the template's ``op.path`` reads ``op["path"]``);
    ``base_url``: the gateway's address, for the servers' ``{base_url}``."""
    info = doc.get("info", {})
    default_security = [n for req in doc.get("security", []) for n in req]
    ops = [_operation(doc, path, method, item, default_security)
           for path, item in (doc.get("paths") or {}).items() for method in METHODS
           if isinstance(item.get(method), dict)]
    statuses: dict[str, set[str]] = {}
    for op in ops:
        for r in op["responses"]:
            statuses.setdefault(r["status"], set()).add(f"{op['method']} {op['path']}")
    comps = doc.get("components", {})
    return {
        "title": info.get("title", "API"), "version": str(info.get("version", "")),
        "description": markdown(info.get("description")),
        "servers": [(server_url(s, base_url), s.get("description", "")) for s in doc.get("servers", [])],
        "security": [(name, f"{s.get('type', '')} {s.get('scheme', '')}".strip(), markdown(s.get("description")))
                     for name, s in (comps.get("securitySchemes") or {}).items()],
        "operations": ops, "schemas": [_schema(doc, name, s) for name, s in (comps.get("schemas") or {}).items()],
        "statuses": sorted((k, sorted(v)) for k, v in statuses.items())}
