"""Under CI=true a skipped test fails the run (tests/conftest.py), also when `make test` runs the suite on
parallel workers (pytest-xdist): a module that skips itself at collection and a test that skips are both
listed with their reasons, and the run exits as failed while its one test passes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SKIPS_A_MODULE = '''import pytest
pytest.skip("the module's reason", allow_module_level=True)
'''

SKIPS_A_TEST = '''import pytest


def test_skips() -> None:
    pytest.skip("the test's reason")


def test_passes() -> None:
    assert True
'''


def test_a_skip_on_a_worker_fails_the_run_under_ci(tmp_path: Path) -> None:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_module_skip.py").write_text(SKIPS_A_MODULE)
    (tmp_path / "test_test_skip.py").write_text(SKIPS_A_TEST)
    # only the plugins the rule needs (xdist; the suite's other plugins cost seconds to import per process)
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(TESTS.parent), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "xdist", "-p", "no:cacheprovider", "-n", "2",
                        "--dist", "loadfile", "--rootdir", str(tmp_path), str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 passed, 2 skipped" in out, out
    listed = sorted(line for line in out.splitlines() if line.startswith("SKIPPED (CI failure)"))
    assert listed == ["SKIPPED (CI failure) test_module_skip.py: the module's reason",
                      "SKIPPED (CI failure) test_test_skip.py::test_skips: the test's reason"], out
