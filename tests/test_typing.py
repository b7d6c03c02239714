"""The request path (extproc/), the control plane (control/) and the simulator (sim/) type-check under
``mypy --strict`` (configured in pyproject.toml)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_code_is_mypy_strict_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "core", "extproc", "control", "sim"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
