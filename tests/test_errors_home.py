"""core/errors.py is the only home of the messages a client can see with an error: no other module
builds an ``ApiError``, and no message text appears in any other file of the product or its documentation
(Envoy's replies are rendered from errors.py, tests/test_envoy_config.py)."""
from __future__ import annotations

import ast
from pathlib import Path

from core import errors

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("extproc", "control", "envoy", "sim", "deploy", "docs")
SUFFIXES = {".py", ".yaml", ".yml", ".lua", ".html", ".js", ".json", ".txt", ".po", ".md"}
DOCS = ("README.md", "openapi.yaml", "BENCHMARKS.md")
HOME = ROOT / "extproc" / "errors.py"


def _files() -> list[Path]:
    out = [ROOT / d for d in DOCS]
    for top in PRODUCT:
        for f in (ROOT / top).rglob("*"):
            if f.is_file() and f.suffix in SUFFIXES and f != HOME and not any(
                    p.startswith(".") or p == "__pycache__" for p in f.relative_to(ROOT).parts):
                out.append(f)
    return out


def _messages() -> set[str]:
    """Every constant message, and the fixed words of those the functions build (their arguments:
    names and numbers, never request text)."""
    built = [errors.rate_limited(1), errors.over_balance("1.00", "0.50", None, 1), errors.over_balance("1", "0", 0, 1),
             errors.over_balance("1", "0", 5, 2), errors.too_deep(128), errors.not_a_positive_integer("max_tokens"),
             errors.wrong_capability("chat completions"), errors.wrong_capability("embeddings"),
             errors.context_length_exceeded("input"), errors.text_only("input"), errors.upstream_rejected(None)]
    consts = [e for e in vars(errors).values() if isinstance(e, errors.ApiError)]
    return {e.message for e in consts + built}


def test_no_module_but_errors_py_builds_an_api_error() -> None:
    found = []
    for f in _files():
        if f.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "ApiError":
                found.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_no_message_text_outside_errors_py() -> None:
    messages = _messages()
    assert len(messages) >= 40
    files = _files()
    assert any(f.name == "envoy.yaml" for f in files) and any(f.name == "sse_relay.lua" for f in files)
    found = [(str(f.relative_to(ROOT)), m) for f in files for m in messages if m in f.read_text(errors="replace")]
    assert found == []


def test_the_scan_finds_a_message_written_elsewhere(tmp_path: Path) -> None:
    """The check above can fail: a hand-written copy of a message is found."""
    copy = tmp_path / "copy.yaml"
    copy.write_text(f"inline_string: '{errors.NO_CAPACITY.message}'\n")
    assert [m for m in _messages() if m in copy.read_text()] == [errors.NO_CAPACITY.message]
