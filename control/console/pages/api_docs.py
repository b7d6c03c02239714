"""The public API's machine-readable description (``openapi.yaml`` at the repository root) as
``/openapi.json``, and its reference page ``/docs/api`` rendered here, server-side, from that document:
operations, parameters, request bodies, statuses with headers, and every schema.  No JavaScript, no
external resources; no login needed (the document is public).  The gateway's ``/v1`` listener does not
serve either."""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from markupsafe import Markup

from ..web import HERE, render

routes = web.RouteTableDef()

OPENAPI = HERE.parent.parent / "openapi.yaml"
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
    return render(request, "api_docs.html", api=reference(doc))


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


def _blocks(text: str) -> list[str]:
    parts: list[str] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        if not block.strip():
            continue
        lines = block.split("\n")
        if all(ln.strip().startswith("|") for ln in lines):
            rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines
                    if not re.fullmatch(r"\s*\|[\s|:-]+\|\s*", ln)]
            head, body = rows[0], rows[1:]
            parts.append("<table class=\"compact\"><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head)
                         + "</tr></thead><tbody>"
                         + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
                         + "</tbody></table>")
        elif _ITEM.match(lines[0]):
            ordered = lines[0].lstrip()[0].isdigit()
            items: list[str] = []
            for ln in lines:
                m = _ITEM.match(ln)
                if m and len(m.group(1)) < 2:
                    items.append(m.group(2).strip())
                elif items:
                    items[-1] += " " + ln.strip()
            tag = "ol" if ordered else "ul"
            parts.append(f"<{tag}>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + f"</{tag}>")
        else:
            parts.append("<p>" + _inline(" ".join(ln.strip() for ln in lines)) + "</p>")
    return parts


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


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
        name = _ref_name(schema["$ref"])
        return Markup(f'<a href="#schema-{html.escape(name)}">{html.escape(name)}</a>')
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


@dataclass
class Prop:
    name: str
    type: Markup
    required: bool
    constraints: list[str]
    description: Markup
    depth: int = 0


def properties(doc: dict[str, Any], schema: Any, depth: int = 0) -> list[Prop]:
    """The schema's properties (inline nested objects and array items expanded one level per depth)."""
    schema = schema if isinstance(schema, dict) else {}
    required = set(schema.get("required", []))
    out: list[Prop] = []
    for name, sub in (schema.get("properties") or {}).items():
        out.append(Prop(name, type_of(sub), name in required, constraints(sub),
                        markdown(sub.get("description") if isinstance(sub, dict) else None), depth))
        if isinstance(sub, dict) and "$ref" not in sub and depth < 3:
            inner = sub.get("items") if sub.get("type") == "array" else sub
            if isinstance(inner, dict) and "$ref" not in inner and inner.get("properties"):
                out.extend(properties(doc, inner, depth + 1))
    return out


@dataclass
class Response:
    status: str
    description: Markup
    headers: list[tuple[str, Markup, bool, Markup]]
    content: list[tuple[str, Markup]]


@dataclass
class Operation:
    method: str
    path: str
    op_id: str
    summary: str
    description: Markup
    security: list[str]
    parameters: list[tuple[str, str, bool, Markup, Markup]]
    body: list[tuple[str, Markup]]
    body_required: bool
    responses: list[Response]
    examples: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Schema:
    name: str
    type: Markup
    description: Markup
    props: list[Prop]
    constraints: list[str]
    extras: str


@dataclass
class Reference:
    title: str
    version: str
    description: Markup
    servers: list[tuple[str, str]]
    security: list[tuple[str, str, Markup]]
    operations: list[Operation]
    schemas: list[Schema]
    statuses: list[tuple[str, list[str]]]


def reference(doc: dict[str, Any]) -> Reference:
    info = doc.get("info", {})
    default_security = [n for req in doc.get("security", []) for n in req]
    ops: list[Operation] = []
    statuses: dict[str, set[str]] = {}
    for path, item in (doc.get("paths") or {}).items():
        shared = item.get("parameters", [])
        for method in METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            params = []
            for p in [*shared, *op.get("parameters", [])]:
                p = _resolve(doc, p)
                params.append((p["name"], p["in"], bool(p.get("required")), type_of(p.get("schema")),
                               markdown(p.get("description"))))
            body = _resolve(doc, op.get("requestBody") or {})
            examples = []
            for media in (body.get("content") or {}).values():
                for name, ex in (media.get("examples") or {}).items():
                    ex = _resolve(doc, ex)
                    examples.append((ex.get("summary") or name,
                                     json.dumps(ex.get("value"), ensure_ascii=False, indent=2)))
            responses = []
            for status, resp in (op.get("responses") or {}).items():
                resp = _resolve(doc, resp)
                headers = []
                for hname, h in (resp.get("headers") or {}).items():
                    h = _resolve(doc, h)
                    headers.append((hname, type_of(h.get("schema")), bool(h.get("required")),
                                    markdown(h.get("description"))))
                content = [(mt, type_of(m.get("schema"))) for mt, m in (resp.get("content") or {}).items()]
                responses.append(Response(str(status), markdown(resp.get("description")), headers, content))
                statuses.setdefault(str(status), set()).add(f"{method.upper()} {path}")
            sec = op.get("security")
            ops.append(Operation(
                method.upper(), path, op.get("operationId", ""), op.get("summary", ""),
                markdown(op.get("description")),
                [n for req in sec for n in req] if sec is not None else default_security,
                params,
                [(mt, type_of(m.get("schema"))) for mt, m in (body.get("content") or {}).items()],
                bool(body.get("required")), responses, examples))
    comps = doc.get("components", {})
    schemas = []
    for name, s in (comps.get("schemas") or {}).items():
        extras = []
        if s.get("additionalProperties") is True:
            extras.append("further members allowed")
        elif s.get("additionalProperties") is False:
            extras.append("no other members")
        props = properties(doc, s)
        for branch in s.get("allOf", []):
            if isinstance(branch, dict) and "$ref" not in branch:
                props.extend(properties(doc, branch))
        schemas.append(Schema(name, type_of({k: v for k, v in s.items() if k != "properties"}) if "properties" not in s
                              else Markup("object"), markdown(s.get("description")), props,
                              constraints(s), "; ".join(extras)))
    security = [(name, f"{s.get('type', '')} {s.get('scheme', '')}".strip(), markdown(s.get("description")))
                for name, s in (comps.get("securitySchemes") or {}).items()]
    servers = [(s.get("url", ""), s.get("description", "")) for s in doc.get("servers", [])]
    return Reference(info.get("title", "API"), str(info.get("version", "")), markdown(info.get("description")),
                     servers, security, ops, schemas,
                     sorted((k, sorted(v)) for k, v in statuses.items()))
