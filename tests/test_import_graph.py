"""No import cycles among the project's modules: every import counts, at the top of a
module, inside a function or under TYPE_CHECKING, so a cycle cannot hide behind a lazy import."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "extproc", "control", "sim", "bench")
# Which packages each may import: the request path and the control plane share core/ and never reach into
# each other; the simulator is a model server, as vLLM is, and knows nothing of the gateway (the control
# plane starts it for demos: `gateway sim`).
LAYERS = {"core": {"core"}, "extproc": {"core", "extproc"}, "control": {"core", "control", "sim"},
          "sim": {"sim"}}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            if any(p.startswith(".") for p in parts):
                continue  # bench/.venv-litellm and the like: installed packages, not ours
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (``from pkg import mod`` names the module, not the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            found.update(subs or ([target] if target in known else []))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
    found.discard(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    known = modules()
    assert "control.launcher" in known and "extproc.exchange" in known
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "control.procs" in graph["control.launcher"]  # the walk sees imports
    assert cycles(graph) == []


def crossings(known: dict[str, Path]) -> list[str]:
    return sorted(f"{name} -> {target}" for name, path in known.items() if name.split(".")[0] in LAYERS
                  for target in imports(name, path, known) if target.split(".")[0] not in LAYERS[name.split(".")[0]])


def test_the_layer_check_sees_a_crossing(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from extproc import exchange\n")
    assert crossings(modules() | {"core.a": tmp_path / "a.py"}) == ["core.a -> extproc.exchange"]


def test_layers() -> None:
    assert crossings(modules()) == []
