"""docs/runbook.md's restore and Redis-loss procedures, run as written on a stack of their own (they change
what the stack holds): a backup, money moved after it, the backup restored and Redis's working balance
brought back in line with the restored ledger; then Redis emptied under load and mended."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import Gateway, running_stack, wait_for
from docs_blocks import Block, marked

BLOCKS = [b for b in marked("run by: tests/test_runbook_e2e.py") if b.document == "docs/runbook.md"]


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_stack("gw-runbook-") as g:
        yield g


def _sh(gw: Gateway, block: Block, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The block's lines one by one, as an operator types them (each line's exit status kept)."""
    import os
    env = {**gw.stack.child_env(), "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    script = "\n".join(f"{line}; echo \"exit=$?\"" for line in block.text.splitlines() if line.strip())
    return subprocess.run(["sh", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _balance(gw: Gateway, org: str) -> tuple[int, int]:
    """(Redis's working balance, the ledger's)."""
    redis = int(gw.redis(lambda r: r.hget("gw:o:" + org, "balance")))
    ledger = int(gw.sql("SELECT COALESCE(sum(amount_micro_pln), 0)::bigint AS s FROM ledger WHERE org_id = $1", org)[0]["s"])
    return redis, ledger


def _request(gw: Gateway, key: str) -> None:
    r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "polish-pro", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200, r.text


def test_the_runbook_names_these_two_blocks() -> None:
    assert [b.text.splitlines()[0] for b in BLOCKS] == ["gateway restore gateway-20261128.dump", "gateway reconcile"]


def test_restore_a_backup_then_reconcile(gw: Gateway, tmp_path: Path) -> None:
    restore = BLOCKS[0]
    org, _, key = gw.new_org(5_000_000)
    _request(gw, key)
    wait_for(lambda: gw.usage_drained(org), timeout=10, interval=0.1)
    backup = subprocess.run([str(Path(sys.executable).parent / "gateway"), "backup", "saved.dump"], cwd=tmp_path,
                            env=gw.stack.child_env(), capture_output=True, text=True, timeout=120)
    assert backup.returncode == 0, backup.stderr
    at_backup = _balance(gw, org)
    assert at_backup[0] == at_backup[1]
    gw.admin(lambda a: a.credit(org, 7_000_000, ref="after-the-backup"))  # money that the restore takes back
    _request(gw, key)
    wait_for(lambda: gw.usage_drained(org), timeout=10, interval=0.1)
    assert _balance(gw, org)[0] > at_backup[0]
    shutil.copy(tmp_path / "saved.dump", tmp_path / "gateway-20261128.dump")
    r = _sh(gw, restore, tmp_path)
    assert r.stdout.count("exit=0") == 3, (r.stdout, r.stderr)
    assert "restored from" in r.stdout and "repaired" in r.stdout
    assert "every cached balance agrees with the ledger" in r.stdout
    assert _balance(gw, org) == (at_backup[1], at_backup[1])


def test_redis_lost_its_data_then_reconcile(gw: Gateway, tmp_path: Path) -> None:
    mend = BLOCKS[1]
    org, _, key = gw.new_org(5_000_000)
    _request(gw, key)
    wait_for(lambda: gw.usage_drained(org), timeout=10, interval=0.1)
    gw.redis(lambda r: r.flushall())
    _request(gw, key)  # the cache is filled again from the ledger
    wait_for(lambda: gw.usage_drained(org), timeout=10, interval=0.1)
    # a Redis that came back with an older copy of its data, say: the working balance is apart
    gw.redis(lambda r: r.hincrby("gw:o:" + org, "balance", 250_000))
    r = _sh(gw, mend, tmp_path)
    assert r.stdout.splitlines()[-1] == "exit=0" and "exit=1" in r.stdout.splitlines()[1:3], (r.stdout, r.stderr)
    assert org in r.stdout and "drift 0.250000 PLN" in r.stdout and "repaired" in r.stdout
    redis, ledger = _balance(gw, org)
    assert redis == ledger
