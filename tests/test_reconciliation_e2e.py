"""Components killed (SIGKILL, then started again) and paused (SIGSTOP for 5 s, and for 30 s: past Envoy's
ext_proc message timeout, then SIGCONT) under a mixed load of streams, buffered chat and embeddings, on one
stack of this module's: afterwards each request is reconciled by its id, what its client saw against its
usage record, the ledger and the balance.  Nothing served is lost, nothing is billed twice, a client that
got no response or no byte pays nothing, each record's status is the one its client received (but for the
reaper's record of a request whose ext_proc was killed in flight, which says only that: docs/billing.md),
no client is refused by a limit, and no concurrency slot is left.  Each cell (component, fault) is a test
of its own, a few seconds long (a 30 s pause, its length)."""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import httpx
import pytest

from conftest import MIXED_BODIES as BODIES, Gateway, running_stack, wait_for
from test_hang_e2e import _children

CLIENTS = 4


@dataclass
class Seen:
    """What one client saw of one request."""
    rid: str
    status: int  # 0: the connection broke before any response headers
    code: str  # the error's code ("" for 200)
    got_bytes: int  # of the body
    whole: bool  # a 200 that came whole (a stream to its [DONE], a JSON body that parses)


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_stack("gw-reconcile-", default_rpm=100000, default_concurrency=1000) as g:
        yield g


def _one(c: httpx.Client, n: int) -> Seen | None:
    path, body = BODIES[n % len(BODIES)]
    rid, status, code, got, whole = "", 0, "", 0, False
    try:
        with c.stream("POST", path, json=body) as r:
            rid, status = r.headers.get("x-request-id", ""), r.status_code
            data = b""
            try:
                for chunk in r.iter_raw():
                    data += chunk
            finally:
                got = len(data)
            if status == 200:
                whole = data.rstrip().endswith(b"data: [DONE]") if body.get("stream") else data.endswith(b"}")
            else:
                code = httpx.Response(status, content=data).json()["error"]["code"]
    except httpx.HTTPError:
        pass
    return Seen(rid, status, code, got, whole) if rid else None


def _load(gws: list[Gateway], key: str, fault: Callable[[], None], clients: int = CLIENTS,
          timeout: float = 60) -> list[Seen]:
    """``clients`` clients spread over the instances ``gws`` send back to back; ``fault`` strikes once 8
    requests came back, and the load goes on until 8 more were served whole after it (counted, not timed:
    a slow machine gets the same test).  No request waits longer than ``timeout``: a hang is a failure."""
    seen: list[Seen] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def worker(i: int) -> None:
        gw = gws[i % len(gws)]
        with httpx.Client(base_url=gw.v1, headers={"Authorization": f"Bearer {key}"}, timeout=timeout) as c:
            n = i
            while not stop.is_set():
                n += 1
                try:
                    s = _one(c, n)
                except Exception as e:  # noqa: BLE001 - a reply without the interface's error shape, say
                    errors.append(f"{type(e).__name__}: {e}")
                    continue
                if s is not None:
                    with lock:
                        seen.append(s)

    def whole() -> int:
        with lock:
            return sum(1 for s in seen if s.whole)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(seen) >= 8, timeout=30, interval=0.02)
        fault()
        after = whole()
        wait_for(lambda: whole() >= after + 8, timeout=timeout, interval=0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    return seen


def _pids(gw: Gateway, component: str) -> list[int]:
    p = gw.stack.procs[component].popen
    assert p is not None
    return [p.pid, *_children(p.pid)] if component == "postgres" else [p.pid]


def _fault(gw: Gateway, component: str, how: str) -> Callable[[], None]:
    def kill() -> None:
        gw.stack.kill(component)
        gw.stack.restart(component)

    def pause() -> None:
        pids = _pids(gw, component)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(float(how.removeprefix("stop")))  # the stimulus: a pause of this length, load going on
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
    return kill if how == "kill" else pause


def _reaped(row: dict[str, object], s: Seen) -> bool:
    """The reaper's record of a request whose ext_proc died in flight: the estimated input, no output,
    status 500 without a code (docs/billing.md).  The gateway cannot know what the client got: Envoy's 500,
    a 200 that broke off, or even a whole 200 (the process answered Envoy, then died before its finish
    reached Redis), so the record stands for any of them, billing no more than the input."""
    return ((row["status"], row["error_code"], row["estimated"], row["completion_tokens"]) == (500, None, True, 0)
            and (s.status == 200 or (s.status, s.code) == (500, "internal_error")))


def _reconcile(gw: Gateway, org: str, before: int, seen: list[Seen], reaped: bool = False) -> dict[str, int]:
    """``reaped``: an ext_proc died in flight, its requests' records are the reaper's (``_reaped``)."""
    by_id = {s.rid: s for s in seen}
    assert len(by_id) == len(seen), "a request id seen twice"
    served = {rid for rid, s in by_id.items() if s.whole}
    # nothing more can come: no request in flight or left for the reaper, the usage stream written out
    wait_for(lambda: gw.usage_drained(org), timeout=40, interval=0.2, describe=lambda: gw.usage_backlog(org))
    rows = {r["request_id"]: r for r in gw.sql(
        "SELECT u.request_id, u.status, u.error_code, u.cost_micro_pln, u.estimated, u.completion_tokens,"
        " (SELECT count(*) FROM ledger l"
        " WHERE l.ref = 'usage:' || u.request_id) AS debits FROM usage_records u WHERE u.org_id = $1", org)}
    lost = sorted(served - set(rows))
    doubled = sorted(rid for rid, r in rows.items() if r["debits"] > 1 or (r["cost_micro_pln"] > 0) != (r["debits"] == 1))
    # a client whose connection broke before the response headers never learnt its request's id: its
    # record (if the gateway made one) is among these, and must cost nothing
    unseen = sorted(rid for rid in set(rows) - set(by_id) if rows[rid]["cost_micro_pln"] > 0)
    for_nothing = sorted(rid for rid, s in by_id.items() if s.got_bytes == 0 and rid in rows
                         and rows[rid]["cost_micro_pln"] > 0)
    wrong = sorted((rid, by_id[rid].status, by_id[rid].code, by_id[rid].whole, r["status"], r["error_code"],
                    r["cost_micro_pln"]) for rid, r in rows.items()
                   if rid in by_id and by_id[rid].status and r["status"] != by_id[rid].status
                   and not (reaped and _reaped(r, by_id[rid])))
    by_reaper = sum(1 for rid, r in rows.items() if reaped and rid in by_id and _reaped(r, by_id[rid]))
    limited = sorted(rid for rid, s in by_id.items() if s.status == 429)  # no limit is near: a 429 is wrong
    print({"lost": len(lost), "doubled": len(doubled), "billed_unanswered": [(rid, rows[rid]) for rid in unseen],
           "billed_for_nothing": [(rid, rows[rid]) for rid in for_nothing], "wrong_status": wrong, "429": len(limited)})
    assert not limited, f"refused by a limit: {limited[:3]}"
    assert not lost, f"served, not logged: {lost[:3]}"
    assert not doubled, f"debited twice (or a cost without its debit): {doubled[:3]}"
    assert not unseen, f"billed, no response received: {[(rid, rows[rid]) for rid in unseen[:3]]}"
    assert not for_nothing, f"billed, no byte received: {[(rid, rows[rid]) for rid in for_nothing[:3]]}"
    assert not wrong, f"logged other than the client saw (id, seen, code, whole, logged, code, cost): {wrong[:5]}"
    assert gw.slots_held(org) == 0
    bal = gw.admin(lambda a: a.balance(org))
    billed = sum(int(r["cost_micro_pln"]) for r in rows.values())
    assert bal["ledger_micro_pln"] == before - billed and bal["balance_micro_pln"] == bal["ledger_micro_pln"]
    return {"requests": len(seen), "served": len(served), "records": len(rows), "billed_micro_pln": billed,
            "not_whole": sum(1 for s in seen if not s.whole), "reaped": by_reaper}


FAULTS = ["kill", "stop5", "stop30"]


def cell(gw: Gateway, component: str, how: str) -> None:
    """One cell: ``component`` struck by ``how`` under the load, then every request reconciled."""
    org, _, key = gw.new_org(1_000_000_000)
    before = gw.admin(lambda a: a.balance(org))["ledger_micro_pln"]
    t0 = time.monotonic()
    seen = _load([gw], key, _fault(gw, component, how))
    counts = _reconcile(gw, org, before, seen, reaped=(component, how) == ("extproc", "kill"))
    print(f"{component} {how}: {counts}, {time.monotonic() - t0:.1f} s")


# The cells of Envoy and the ext_proc; the usage writer's and PostgreSQL's are in
# test_reconciliation_usage_e2e.py, Redis's and a model server's in test_reconciliation_redis_sim_e2e.py:
# files that `make test`'s parallel workers can run side by side, each on a stack of its own.
@pytest.mark.parametrize("how", FAULTS)
@pytest.mark.parametrize("component", ["envoy", "extproc"])
def test_each_request_is_billed_and_logged_as_its_client_saw_it(gw: Gateway, component: str, how: str) -> None:
    cell(gw, component, how)
