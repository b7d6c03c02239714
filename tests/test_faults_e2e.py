"""Exactly-once billing under faults: a bounded load runs through Envoy while the ext_proc or the usage
writer is killed, PostgreSQL restarts or Redis restarts; then every request is reconciled with what the simulator served."""
from __future__ import annotations

import threading
import time
from typing import Callable

import httpx
import pytest

from conftest import MIXED_BODIES as BODIES, Gateway, wait_for
from core.errors import TABLE



def _load(gateway: Gateway, key: str, fault: Callable[[], None], before: int = 12, after: int = 12,
          timeout: float = 60) -> tuple[dict[str, int], dict[str, float], float]:
    """rid -> HTTP status (0 when the connection broke) of every request sent, rid -> when its client
    had the reply (time.monotonic), and when the fault struck.  Six clients load the
    gateway; the fault strikes once ``before`` requests have come back, and the load goes on until
    ``after`` more have been served (200) since the fault was over: counted, not timed, so that a slow
    machine gets the same test, only later."""
    out: dict[str, int] = {}
    done_at: dict[str, float] = {}
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def worker(i: int) -> None:
        with httpx.Client(base_url=gateway.v1, headers={"Authorization": f"Bearer {key}"}, timeout=20) as c:
            n = i
            while not stop.is_set():
                path, body = BODIES[n % len(BODIES)]
                n += 1
                rid, status = "", 0
                try:
                    with c.stream("POST", path, json=body) as r:
                        rid = r.headers.get("x-request-id", "")
                        r.read()
                        status = r.status_code
                        if status != 200:
                            err = r.json()["error"]  # every refusal has the interface's JSON shape
                            assert TABLE[err["code"]][0] == status and err["request_id"] == rid
                except httpx.HTTPError:
                    status = 0
                except Exception as e:  # noqa: BLE001
                    errors.append(f"{type(e).__name__}: {e}")
                if rid:
                    with lock:
                        out[rid] = status
                        done_at[rid] = time.monotonic()

    def served() -> int:
        with lock:
            return sum(1 for st in out.values() if st == 200)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(out) >= before, timeout=timeout, interval=0.02)
        fault_at = time.monotonic()
        fault()
        served_before = served()
        wait_for(lambda: served() >= max(served_before + after, 21), timeout=timeout, interval=0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    return out, done_at, fault_at


def _reconcile(gateway: Gateway, org: str, sent: dict[str, int], late: frozenset[str] = frozenset()) -> None:
    """``late``: requests whose client had the whole reply but whose process may have died before the
    record reached Redis (see test_exactly_once_under_faults): estimated input is what they may get."""
    served = {}
    for sim in (gateway.sim_a, gateway.sim_b):
        for rec in httpx.get(sim + "/sim/requests").json()["data"]:
            if rec["request_id"] in sent and rec["status"] == 200:
                served[rec["request_id"]] = rec
    assert len(served) > 20

    def records() -> dict[str, dict]:
        rows = gateway.sql("SELECT * FROM usage_records WHERE org_id = $1", org)
        return {r["request_id"]: r for r in rows}

    wait_for(lambda: set(served) <= set(records()), timeout=30)
    # Nothing more can come: no request of the organisation in flight or left for the reaper, and the
    # usage stream written out (a dead writer's pending entries are claimed after 15 s).  Only then is
    # the absence of a record (and of an extra one) meaningful.
    wait_for(lambda: gateway.usage_drained(org), timeout=40, interval=0.2,
             describe=lambda: gateway.usage_backlog(org))
    recs = records()
    assert set(served) <= set(recs), f"lost: {sorted(set(served) - set(recs))[:5]}"
    extra = set(recs) - set(served)
    assert all(recs[rid]["estimated"] for rid in extra), "a request never served was billed as reported"
    whole_but_estimated = 0
    for rid, rec in served.items():
        row = recs[rid]
        if not row["estimated"]:
            want_completion = rec["completion_tokens"] if rec["endpoint"] == "chat" else 0
            assert (row["prompt_tokens"], row["completion_tokens"]) == (rec["prompt_tokens"], want_completion), rid
        else:  # only a request whose reply the client did not get whole may be estimated
            assert sent[rid] != 200 or not rec["completed"] or rid in late, rid
            whole_but_estimated += sent[rid] == 200 and rec["completed"]
    assert whole_but_estimated <= 6  # one in flight per client at the kill, at most
    debits = gateway.sql("SELECT COALESCE(SUM(-amount_micro_pln),0) AS s, COUNT(*) AS n FROM ledger"
                         " WHERE org_id = $1 AND kind = 'usage'", org)[0]
    assert int(debits["s"]) == sum(r["cost_micro_pln"] for r in recs.values())
    assert debits["n"] == sum(1 for r in recs.values() if r["cost_micro_pln"] > 0)
    bal = gateway.admin(lambda a: a.balance(org))
    assert bal["balance_micro_pln"] == bal["ledger_micro_pln"]


@pytest.mark.alone  # the kill's window is timed (2 s): no other worker's test meanwhile (tests/conftest.py)
@pytest.mark.parametrize("component", ["extproc", "usage-writer", "postgres", "redis"])
def test_exactly_once_under_faults(gateway: Gateway, component: str) -> None:
    org, kid, key = gateway.new_org(1_000_000_000)

    def fault() -> None:
        if component in ("extproc", "usage-writer"):  # killed (SIGKILL), in the middle of its work
            gateway.stack.kill(component)
            # not a wait for anything: the stimulus is an outage of this length, with the load going on
            time.sleep(0.3)
            gateway.stack.restart(component)
        else:
            gateway.stack.restart(component)

    sent, done_at, fault_at = _load(gateway, key, fault)
    assert sum(1 for s in sent.values() if s == 200) > 20
    # A known window of the product, not of this test: the ext_proc sends a reply first and hands its
    # usage record to Redis right after (extproc/server.py, send_finish), so a SIGKILL in between leaves the
    # in-flight journal's entry, which the reaper bills as estimated input.  Only requests that came back
    # in the last 2 s before the kill can be in it (at most one per client).
    late = frozenset() if component != "extproc" else frozenset(
        rid for rid, t in done_at.items() if fault_at - 2.0 <= t <= fault_at + 0.05)
    _reconcile(gateway, org, sent, late)
