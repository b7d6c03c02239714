"""Every fenced block of README.md and docs/*.md runs, parses or is checked as written, so that a stale
claim fails the suite.  The line before each block says what it is:

- ``<!-- client-snippet: NAME -->``: a client's code, run against a test stack by tests/test_clients_e2e.py;
- ``<!-- run: sh -->``: commands, run here against the suite's stack (the `gateway` CLI on PATH);
- ``<!-- output of: COMMAND -->``: what COMMAND prints, run here and compared (``…`` stands for any text);
  ``make run``'s sample is compared by tests/test_places_e2e.py, which runs `make run`;
- ``<!-- run by: FILE … -->``: commands run by the files named;
- ``<!-- catalog: upstream_models -->``: a catalog fragment, loaded by the catalog's own parser;
- ``<!-- catalog: whole -->``: a whole catalog, loaded by the catalog's own parser;
- ``<!-- diagram -->``: a picture, nothing to run.

A block with no marker, or one this test does not know, fails."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import Gateway
from docs_blocks import ROOT, Block, all_blocks, marked, sample_matches
from core import catalog as catalog_mod

KINDS = ("client-snippet: ", "run: sh", "output of: ", "run by: ", "catalog: upstream_models", "catalog: whole",
         "diagram")
BIN = str(Path(sys.executable).parent)


def test_every_block_says_how_it_is_checked() -> None:
    found = all_blocks()
    assert len(found) >= 10
    unknown = [b.where for b in found if not b.marker.startswith(KINDS)]
    assert not unknown, f"fenced blocks without a known marker (see this test's docstring): {unknown}"


def test_every_client_snippet_is_run_by_the_clients_test() -> None:
    source = (ROOT / "tests" / "test_clients_e2e.py").read_text()
    for b in marked("client-snippet: "):
        name = b.marker.removeprefix("client-snippet: ")
        assert f'"{name}"' in source, f"{b.where}: snippet {name!r} is not run by tests/test_clients_e2e.py"


def test_files_named_as_running_blocks_run_them() -> None:
    """A test named as running a block reads it from the document (docs_blocks), so it runs what is written."""
    for b in marked("run by: "):
        named = re.findall(r"([\w./-]+\.py|\.ci/run)", b.marker)
        assert named, b.where
        for f in named:
            text = (ROOT / f).read_text()
            assert "docs_blocks" in text or (f == ".ci/run" and "make test" in text), f"{b.where}: {f} does not run it"
    assert '["make", "run"]' in (ROOT / "tests" / "test_places_e2e.py").read_text()


def test_catalog_fragments_load() -> None:
    frags = marked("catalog: upstream_models")
    assert frags
    for b in frags:
        doc = yaml.safe_load(b.text)
        cat = catalog_mod.parse({"aliases": {}, "upstream_models": doc["upstream_models"]}, b.where)
        assert cat.deployments and all(cat.deployments.values()), b.where


def test_whole_catalogs_load() -> None:
    frags = marked("catalog: whole")
    assert frags
    for b in frags:
        cat = catalog_mod.parse(yaml.safe_load(b.text), b.where)
        assert cat.aliases and all(a.upstream_steps[0].upstreams for a in cat.aliases.values()), b.where


def _sh(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-e", "-c", script], cwd=cwd, env={**env, "PATH": BIN + os.pathsep + env.get("PATH", "")},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("block", marked("run: sh"), ids=lambda b: b.where)
def test_command_block_runs(block: Block, gateway: Gateway, tmp_path: Path) -> None:
    r = _sh(block.text, gateway.stack.child_env(), tmp_path)
    assert r.returncode == 0, f"{block.where}:\n{block.text}\n--- stdout:\n{r.stdout[-2000:]}\n--- stderr:\n{r.stderr[-2000:]}"
    assert r.stdout.strip(), block.where


@pytest.mark.parametrize("block", [b for b in marked("output of: ") if not b.marker.startswith("output of: make run")],
                         ids=lambda b: b.where)
def test_output_sample_is_what_the_command_prints(block: Block, tmp_path: Path) -> None:
    command = block.marker.removeprefix("output of: ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") and k not in ("DATABASE_URL", "REDIS_URL")}
    r = _sh(f"cd {tmp_path} && {command}", {**env, "GATEWAY_STATE_DIR": str(tmp_path / "state")}, tmp_path)
    missing = sample_matches(block.text, r.stdout + r.stderr)
    assert not missing, f"{block.where}: not printed by {command!r}: {missing}\n--- it printed:\n{r.stdout}{r.stderr}"
