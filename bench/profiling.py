"""py-spy on a Python process while a load runs (``make bench PROFILE=1``): an SVG flame graph of one
run and a raw (collapsed stacks) recording of a second identical run for the top functions by own time."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent


def _py_spy() -> str | None:
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        print("bench: installing py-spy into the venv for PROFILE=1 ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "py-spy"], check=False)
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    return spy


def profile(pid: int, stem: Path, seconds: int, load: Callable[[int], float]) -> dict[str, Any]:
    """``load(seconds)`` runs the load and returns its rate (per second); it is run twice, once per format.
    Writes ``stem``.svg and ``stem``.txt."""
    spy = _py_spy()
    if spy is None:
        return {"error": "py-spy could not be installed"}
    svg, raw = stem.with_suffix(".svg"), stem.with_suffix(".txt")
    result: dict[str, Any] = {"svg": str(svg.relative_to(ROOT)), "seconds": seconds}
    for fmt, path in (("flamegraph", svg), ("raw", raw)):
        p = subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "200",
                              "--nonblocking", "--format", fmt, "--output", str(path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)
        rate = load(seconds)
        _, err = p.communicate(timeout=60)
        if p.returncode != 0:
            return {"error": f"py-spy failed: {err.decode(errors='replace')[-300:]}"}
        if fmt == "raw":
            result["rps_while_profiled"] = rate
    own: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        own[stack.split(";")[-1]] += int(n)
        total += int(n)
    result["samples"] = total
    result["top_own"] = [{"function": f, "samples": n, "pct": round(100 * n / total, 1)}
                         for f, n in own.most_common(5)] if total else []
    return result
