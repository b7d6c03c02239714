"""Money survives Redis: a request served while Redis is away is billed once Redis is back, even when the
ext_proc that served it was restarted meanwhile (its finish kept on local disk); a Redis that lost its
data (emptied, or failed over without it) still gets the usage records of the requests in flight, and
PostgreSQL bills each once; `gateway reconcile` finds Redis's working balances apart from the ledger and
mends them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import fields
from typing import Any, Iterator

import httpx
import pytest

from conftest import Gateway, assert_error, running_stack, wait_for
from control.admin import Admin
from core.decisions import UsageRecord
from core.key_limits import Change
from test_drain_e2e import _streams


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_stack("gw-redisloss-") as g:
        yield g


def _billed(gw: Gateway, org: str) -> list[dict[str, object]]:
    return gw.sql("SELECT u.request_id, u.status, u.completion_tokens, u.estimated, u.cost_micro_pln,"
                  " (SELECT count(*) FROM ledger l WHERE l.ref = 'usage:' || u.request_id) AS debits"
                  " FROM usage_records u WHERE u.org_id = $1", org)


def test_a_redis_that_lost_its_data_still_gets_the_bills_in_flight(gw: Gateway) -> None:
    org, _, key = gw.new_org()
    results, threads = _streams(gw.v1, key, tokens=15)
    wait_for(lambda: gw.slots_held(org) == 3, timeout=5, interval=0.02)
    gw.redis(lambda r: r.flushall())  # a Redis emptied (or failed over to a replica without the writes)
    for t in threads:
        t.join()
    assert len(results) == 3 and all(b.rstrip().endswith(b"data: [DONE]") for _, b in results)
    wait_for(lambda: len(_billed(gw, org)) == 3, timeout=15, interval=0.2)
    rows = _billed(gw, org)
    assert sorted(r["request_id"] for r in rows) == sorted(rid for rid, _ in results)
    assert all(r["status"] == 200 and r["completion_tokens"] == 15 and not r["estimated"] and r["debits"] == 1
               for r in rows), rows
    m = httpx.get(f"http://127.0.0.1:{gw.stack.s.metrics_http_port}/metrics").text
    assert "gateway_finished_without_journal_total 3.0" in m


def test_a_finish_redis_did_not_take_survives_a_restart_of_the_ext_proc(gw: Gateway) -> None:
    org, _, key = gw.new_org()
    results, threads = _streams(gw.v1, key, tokens=20, n=1)
    wait_for(lambda: gw.slots_held(org) == 1, timeout=5, interval=0.02)
    gw.stack.stop_proc("redis")  # away while the stream ends
    for t in threads:
        t.join()
    (rid, body), = results
    assert body.rstrip().endswith(b"data: [DONE]")
    spool = gw.stack.state / "spool"
    wait_for(lambda: any(spool.glob("*.json")), timeout=5, interval=0.05)
    kept = json.loads(next(spool.glob("*.json")).read_text())
    assert kept["request_id"] == rid and kept["record"]["completion_tokens"] == 20
    gw.stack.kill("extproc")  # the process that served it is gone; its finish is on disk
    gw.stack.restart("extproc")
    gw.stack.restart("redis")
    wait_for(lambda: len(_billed(gw, org)) == 1, timeout=20, interval=0.2)
    (row,) = _billed(gw, org)
    assert (row["request_id"], row["status"], row["completion_tokens"], row["estimated"], row["debits"]) == (rid, 200, 20, False, 1)
    wait_for(lambda: not any(spool.glob("*.json")), timeout=5, interval=0.05)
    assert gw.slots_held(org) == 0


def _reconcile(gw: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "control.cli", "--json", "reconcile", *args],
                          env=gw.stack.child_env(), capture_output=True, text=True, timeout=60)


def test_reconcile_finds_and_mends_a_balance_apart_from_the_ledger(gw: Gateway) -> None:
    org, _, key = gw.new_org(5_000_000)
    r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "polish-pro", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    wait_for(lambda: gw.usage_drained(org), timeout=10, interval=0.1)
    gw.redis(lambda r: r.hincrby("gw:o:" + org, "balance", 12_345))  # an old backup restored under Redis, say
    dry = _reconcile(gw)
    assert dry.returncode == 1, dry.stderr
    (mine,) = [d for d in json.loads(dry.stdout) if d["org"] == org]
    assert mine["drift_micro_pln"] == 12_345 and not mine["repaired"]
    ledger = gw.sql("SELECT sum(amount_micro_pln) AS s FROM ledger WHERE org_id = $1", org)[0]["s"]
    assert mine["ledger_micro_pln"] == ledger and mine["redis_micro_pln"] == ledger + 12_345
    fixed = _reconcile(gw, "--apply")
    assert fixed.returncode == 0 and [d for d in json.loads(fixed.stdout) if d["org"] == org][0]["repaired"]
    assert int(gw.redis(lambda r: r.hget("gw:o:" + org, "balance"))) == ledger
    again = _reconcile(gw)
    assert again.returncode == 0 and not [d for d in json.loads(again.stdout) if d["org"] == org], again.stdout


def _as_queued(row: dict[str, Any]) -> str:
    """A usage_records row as the ext_proc queued it (UsageRecord's JSON: times as epoch seconds, NULL text "")."""
    def value(name: str, pg_type: str) -> Any:
        v = row[name]
        return v.timestamp() if pg_type == "timestamptz" else "" if v is None and pg_type == "text" else v
    return UsageRecord(**{f.name: value(f.name, f.metadata["pg_type"]) for f in fields(UsageRecord)}).to_json()


@pytest.mark.parametrize("other", [0, 7], ids=["the same record", "another cost"])
def test_reconcile_counts_a_queued_record_the_ledger_already_has_once(gw: Gateway, other: int) -> None:
    """A usage record still in the stream whose request the ledger already has was debited in Redis once:
    the usage writer had committed it and not yet taken it off the stream, or it is a repeated finish's
    copy (queued without a debit; PostgreSQL keeps the first record of a request id), whose cost may
    differ (``other``: the ext_proc's own record queued after the reaper's estimate).  Reconcile counts
    the request as the ledger has it: nothing to mend.  The writer is frozen meanwhile, so the copy stays
    queued."""
    org, _, key = gw.new_org(5_000_000)
    r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "polish-pro", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    wait_for(lambda: gw.usage_drained(org), timeout=10, interval=0.1)
    row = gw.sql("SELECT * FROM usage_records WHERE request_id = $1", rid)[0]
    assert row["cost_micro_pln"] > 0
    record = _as_queued(row | {"cost_micro_pln": row["cost_micro_pln"] + other})
    writer = gw.stack.procs["usage-writer"].popen
    assert writer is not None
    os.kill(writer.pid, signal.SIGSTOP)
    try:
        gw.redis(lambda r: r.xadd("gw:usage", {"r": record}))
        dry = _reconcile(gw)
        assert dry.returncode == 0 and not [d for d in json.loads(dry.stdout) if d["org"] == org], dry.stdout
    finally:
        os.kill(writer.pid, signal.SIGCONT)
    wait_for(lambda: gw.usage_drained(org), timeout=10, interval=0.1, describe=lambda: gw.usage_backlog(org))
    assert gw.sql("SELECT count(*) AS n FROM ledger WHERE ref = $1", "usage:" + rid)[0]["n"] == 1
    ledger = gw.sql("SELECT sum(amount_micro_pln) AS s FROM ledger WHERE org_id = $1", org)[0]["s"]
    assert int(gw.redis(lambda r: r.hget("gw:o:" + org, "balance"))) == ledger


def test_a_key_at_its_monthly_limit_stays_there_when_redis_loses_its_data(gw: Gateway) -> None:
    """A key's spend this month is counted in Redis; a Redis emptied refills it from PostgreSQL's usage
    records, so the cap holds (docs/limits.md, "Key limits")."""
    async def make(a: Admin) -> tuple[str, str, str]:
        org = await a.create_org("capped", 10_000_000)
        kid, key = await a.create_key(org, limits=Change(monthly_limit=15))
        return org, kid, key
    org, kid, key = gw.admin(make)
    h = {"Authorization": f"Bearer {key}"}
    tiny = {"model": "polish-fast", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    codes = [httpx.post(gw.v1 + "/chat/completions", headers=h, json=tiny, timeout=30).status_code for _ in range(8)]
    assert codes[0] == 200 and codes[-1] == 402, codes
    wait_for(lambda: gw.usage_drained(org), timeout=10, interval=0.1)
    gw.redis(lambda r: r.flushall())
    r = httpx.post(gw.v1 + "/chat/completions", headers=h, json=tiny, timeout=30)
    err = assert_error(r, 402, "insufficient_quota", "insufficient_quota")
    assert "monthly spending limit of 0.000015 PLN" in err["message"]
    spent = gw.sql("SELECT sum(cost_micro_pln)::bigint AS s FROM usage_records WHERE key_id = $1", kid)[0]["s"]
    assert 0 < spent <= 15
    month = gw.redis(lambda r: r.keys(f"gw:ks:{kid}:*"))
    assert len(month) == 1 and int(gw.redis(lambda r: r.hget(month[0], "spent"))) == spent  # from PostgreSQL
