"""A Redis failover under load from several gateway instances: the load, and the instances' start."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import httpx

from conftest import Gateway, free_base, running_stack, wait_for
from control.launcher import Stack
from control.reconcile import reconcile
from control.settings import Settings
from test_reconciliation_e2e import Seen, _load, _reconcile

CLIENTS = 6  # two per instance of three


def start_all(stacks: list[Stack]) -> None:
    """The stacks started side by side (each its own Envoy, ext_proc, usage writer): a failure is raised."""
    failed: list[BaseException] = []

    def start(stack: Stack) -> None:
        try:
            stack.start()
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            failed.append(e)
    threads = [threading.Thread(target=start, args=(s,)) for s in stacks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


@contextlib.contextmanager
def instances(prefix: str, redis_url: str, n: int = 3) -> Iterator[list[Gateway]]:
    """``n`` gateway instances on ``redis_url`` (each its own Envoy, ext_proc and usage writer): the first
    with PostgreSQL and the simulators, the others on them, started side by side."""
    with running_stack(prefix, redis_url=redis_url, default_rpm=100000, default_concurrency=1000) as first:
        s = first.stack.s
        others: list[Stack] = []
        try:
            for k in range(2, n + 1):
                base = free_base()
                others.append(Stack(Settings.from_env(
                    gateway_port=base, metrics_port=base + 19, state_dir=f"{s.state}-{k}", catalog=s.catalog,
                    database_url=first.stack.database_url, redis_url=redis_url, run_sim=False, dev=True,
                    default_rpm=s.default_rpm, default_concurrency=s.default_concurrency)))
            start_all(others)
            yield [first, *(Gateway(o, 0) for o in others)]
        finally:
            for o in others:
                o.stop()


def load_through(gws: list[Gateway], key: str, fault: Callable[[], None]) -> list[Seen]:
    """``CLIENTS`` clients spread over the instances send back to back (test_reconciliation_e2e's load);
    no request waits longer than its client's 30 s: a hang is a failure."""
    return _load(gws, key, fault, CLIENTS, timeout=30)


def reconciled_after_a_failover(gw: Gateway, org: str, org_key: str, before: int, seen: list[Seen]) -> dict[str, int]:
    """After a failover under ``load_through``: every refusal the interface's 500; once the usage is written,
    `gateway reconcile --apply` mends the cached balance of an admission the failover lost
    (docs/operations.md); then each request is reconciled by its id and no hold is left on the
    organisation (``org_key``: its Redis hash).  The counts of ``_reconcile``, with the refusals'."""
    refused = [x for x in seen if x.status not in (200, 0)]
    assert all((x.status, x.code) == (500, "internal_error") for x in refused), refused[:3]
    wait_for(lambda: gw.usage_drained(org), timeout=40, interval=0.2, describe=lambda: gw.usage_backlog(org))
    gw.admin(lambda a: reconcile(a.pool, a.r, apply=True))
    counts = _reconcile(gw, org, before, seen)
    assert int(gw.redis(lambda r: r.hget(org_key, "hold")) or 0) == 0  # no hold left
    return counts | {"refused": len(refused)}


def served_and_billed_once(gw: Gateway, org: str, key: str, stream: bool) -> None:
    """A chat request (``stream``: streamed) served whole and billed once: its usage record, its one debit,
    no slot left, the organisation's cached balance equal to its ledger."""
    r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "polish-fast", "messages": [{"role": "user", "content": "x"}],
                         "max_tokens": 4, "stream": stream})
    assert r.status_code == 200, r.text
    assert r.text.rstrip().endswith("data: [DONE]") if stream else r.json()["usage"]["completion_tokens"] > 0
    rid = r.headers["x-request-id"]
    wait_for(lambda: gw.sql("SELECT 1 FROM usage_records WHERE request_id = $1", rid), timeout=15)
    rec = gw.sql("SELECT status, stream, cost_micro_pln FROM usage_records WHERE request_id = $1", rid)[0]
    assert (rec["status"], rec["stream"]) == (200, stream) and rec["cost_micro_pln"] > 0
    debits = gw.sql("SELECT amount_micro_pln FROM ledger WHERE ref = $1", "usage:" + rid)
    assert [d["amount_micro_pln"] for d in debits] == [-rec["cost_micro_pln"]]
    wait_for(lambda: gw.slots_held(org) == 0, timeout=10)
    bal = gw.admin(lambda a: a.balance(org))
    assert bal["balance_micro_pln"] == bal["ledger_micro_pln"]
