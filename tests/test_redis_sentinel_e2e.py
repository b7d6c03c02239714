"""The gateway behind Sentinel (REDIS_URL redis+sentinel://sentinels/service, core/urls.py): a primary,
its replica and three sentinels (Debian's redis-server), three gateway instances on them and one
PostgreSQL.  Under a mixed load from all three the primary is SIGKILLed: the sentinels promote the replica,
both clients of every process (the request path's own, core/resp_sentinel.py, and redis-py's) follow it,
no request hangs (a client gets the interface's 500 or is served), and afterwards each request is reconciled by
its id (tests/test_reconciliation_e2e.py): nothing served lost, nothing billed twice, no slot or hold
left, the balance equal to the ledger."""
from __future__ import annotations

import time
from typing import Iterator

import pytest

from conftest import Gateway
from core import redis_keys as rk
from failover import instances, load_through
from redis_cluster import require_redis_server
from redis_sentinel import Sentinels, redis_sentinels
from test_reconciliation_e2e import _reconcile

require_redis_server()


@pytest.fixture(scope="module")
def sentinels() -> Iterator[Sentinels]:
    with redis_sentinels() as s:
        yield s


@pytest.fixture(scope="module")
def gws(sentinels: Sentinels) -> Iterator[list[Gateway]]:
    with instances("gw-sentinel-", sentinels.url) as gws:
        yield gws


def test_a_primary_killed_under_load_is_survived_and_every_request_reconciled(
        sentinels: Sentinels, gws: list[Gateway]) -> None:
    first = gws[0]
    org, _, key = first.new_org(1_000_000_000)
    before = first.admin(lambda a: a.balance(org))["ledger_micro_pln"]
    victim = sentinels.primary()
    t0 = time.monotonic()
    seen = load_through(gws, key, lambda: sentinels.kill(victim))
    took = time.monotonic() - t0
    assert sentinels.primary() == sentinels.redis_ports[1]  # the replica took over
    refused = [s for s in seen if s.status not in (200, 0)]
    assert all((s.status, s.code) == (500, "internal_error") for s in refused), refused[:3]
    counts = _reconcile(first, org, before, seen)
    assert int(first.redis(lambda r: r.hget(rk.ONE.org(org), "hold")) or 0) == 0  # no hold left
    assert counts["served"] >= 16
    print(f"primary killed: {counts}, {len(refused)} answered 500, {took:.1f} s")
