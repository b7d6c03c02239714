"""The gateway behind Sentinel (REDIS_URL redis+sentinel://sentinels/service, core/urls.py): a primary,
its replica and three sentinels (Debian's redis-server), three gateway instances on them and one
PostgreSQL.  Under a mixed load from all three the primary is SIGKILLed: the sentinels promote the replica,
both clients of every process (the request path's own, core/resp_sentinel.py, and redis-py's) follow it,
no request hangs (a client gets the interface's 500 or is served), and afterwards each request is reconciled by
its id (tests/test_reconciliation_e2e.py): nothing served lost, nothing billed twice, no slot or hold
left, the balance equal to the ledger.  On servers of their own: the primary frozen (SIGSTOP) past its
failover and resumed; and every server, the sentinels too, speaking only TLS."""
from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Iterator

import pytest
import redis

from conftest import Gateway, wait_for
from core import redis_keys as rk
from core.redis_client import redis_client
from core.resp_cluster import client_from_url
from failover import instances, load_through, reconciled_after_a_failover, served_and_billed_once
from redis_cluster import PASSWORD, require_redis_server
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


def killed_until_replaced(s: Sentinels, victim: int, heir: int) -> None:
    """The fault of a load: the primary killed, and the load kept on until the sentinels name its
    replica (a busy machine may take them some seconds)."""
    s.kill(victim)
    wait_for(lambda: s.primary() == heir, timeout=30, interval=0.1)


def test_a_primary_killed_under_load_is_survived_and_every_request_reconciled(
        sentinels: Sentinels, gws: list[Gateway]) -> None:
    first = gws[0]
    org, _, key = first.new_org(1_000_000_000)
    before = first.admin(lambda a: a.balance(org))["ledger_micro_pln"]
    victim = sentinels.primary()
    t0 = time.monotonic()
    seen = load_through(gws, key, lambda: killed_until_replaced(sentinels, victim, sentinels.redis_ports[1]))
    took = time.monotonic() - t0
    assert sentinels.primary() == sentinels.redis_ports[1]  # the replica took over
    refused = [s for s in seen if s.status not in (200, 0)]
    assert all((s.status, s.code) == (500, "internal_error") for s in refused), refused[:3]
    counts = _reconcile(first, org, before, seen)
    assert int(first.redis(lambda r: r.hget(rk.ONE.org(org), "hold")) or 0) == 0  # no hold left
    assert counts["served"] >= 16
    print(f"primary killed: {counts}, {len(refused)} answered 500, {took:.1f} s")


def test_a_primary_paused_past_its_failover_and_resumed_as_a_replica_is_survived() -> None:
    """The primary frozen (SIGSTOP) under load until the sentinels promoted its replica, then resumed: it
    comes back a replica of the new primary (what it ran of the commands queued meanwhile is dropped at
    its resynchronisation).  Both clients of every process follow the new primary (core/resp_sentinel.py
    follows the sentinels' newest answer, once a second and on READONLY, and never sends again on a
    primary it left: the frozen one takes writes for seconds after it wakes, then drops them; its reaper
    reads where it finishes), no request hangs, an admission sent again after its answer
    was lost holds nothing twice, and afterwards, once `gateway reconcile` mended the cached balance of
    an admission the failover lost (docs/operations.md), each request is reconciled by its id.  Its own
    servers and one gateway instance: the module's other test kills its primary for good."""
    with redis_sentinels() as s, instances("gw-sentinel-pause-", s.url, n=1) as gws:
        gw = gws[0]
        org, _, key = gw.new_org(1_000_000_000)
        before = gw.admin(lambda a: a.balance(org))["ledger_micro_pln"]
        victim, heir = s.redis_ports
        assert s.primary() == victim

        def replica_of_the_heir() -> bool:
            try:
                with redis.Redis(host="127.0.0.1", port=victim, password=PASSWORD, socket_timeout=2) as r:
                    info = r.info("replication")
                    return bool(info["role"] == "slave" and int(info["master_port"]) == heir)
            except redis.exceptions.RedisError:
                return False

        def pause() -> None:
            os.kill(s.procs[victim].pid, signal.SIGSTOP)
            try:
                wait_for(lambda: s.primary() == heir, timeout=30, interval=0.1)  # the failover, meanwhile
            finally:
                os.kill(s.procs[victim].pid, signal.SIGCONT)
            wait_for(replica_of_the_heir, timeout=30, interval=0.1)  # demoted once it answers again

        t0 = time.monotonic()
        seen = load_through(gws, key, pause)
        took = time.monotonic() - t0
        assert s.primary() == heir and replica_of_the_heir()
        counts = reconciled_after_a_failover(gw, org, rk.ONE.org(org), before, seen)
        assert counts["served"] >= 8
        print(f"primary paused and resumed: {counts}, {took:.1f} s")


def test_sentinels_and_redis_that_speak_only_tls_serve_bill_and_fail_over() -> None:
    """Every server TLS only, the sentinels too (rediss+sentinel://...?ssl_ca_certs=...), as a managed
    deployment with encryption in transit has it: chat and a stream are served and billed once (the
    request path's client and redis-py both ask the sentinels over TLS), then the primary is killed under
    load, the sentinels name its replica, and each request is reconciled by its id."""
    with redis_sentinels(tls=True) as s, instances("gw-sentinel-tls-", s.url, n=1) as gws:
        gw = gws[0]
        assert s.url.startswith("rediss+sentinel://") and "ssl_ca_certs=" in s.url
        org, _, key = gw.new_org(1_000_000_000)
        for stream in (False, True):
            served_and_billed_once(gw, org, key, stream)
        org, _, key = gw.new_org(1_000_000_000)  # the load's own: every request of it is in ``seen``
        before = gw.admin(lambda a: a.balance(org))["ledger_micro_pln"]
        victim, heir = s.redis_ports
        seen = load_through(gws, key, lambda: killed_until_replaced(s, victim, heir))
        assert s.primary() == heir
        assert reconciled_after_a_failover(gw, org, rk.ONE.org(org), before, seen)["served"] >= 8


def test_both_clients_leave_a_primary_back_from_a_freeze_before_it_is_demoted() -> None:
    """The request path's client and redis-py's (core/redis_client.py), each connected to the primary,
    which is frozen past its failover and resumed.  It takes commands as a primary until the sentinels
    demote it, some 8 s after it answers again (their wait before converting it); each client, asking
    the sentinels once a second, moves to the new primary meanwhile without an error: a write made 2.5 s
    after the wake, while the old primary still says it is one, lands on the new primary.  (Before, both
    stayed on the old one, and what they wrote there was dropped at its demotion.)"""
    with redis_sentinels() as s:
        victim, heir = s.redis_ports

        def role(port: int) -> str:
            with s.client(port) as r:
                return str(r.info("replication")["role"])

        async def go() -> None:
            fast, r = client_from_url(s.url), redis_client(s.url, 2)
            try:
                await fast.call("SET", "follow:fast", "0")
                await r.set("follow:py", "0")
                os.kill(s.procs[victim].pid, signal.SIGSTOP)
                try:
                    await asyncio.to_thread(wait_for, lambda: s.primary() == heir, 30, 0.1)
                finally:
                    os.kill(s.procs[victim].pid, signal.SIGCONT)
                await asyncio.sleep(2.5)
                assert role(victim) == "master"  # not demoted yet: the window this test is about
                await fast.call("SET", "follow:fast", "1")
                await r.set("follow:py", "1")
            finally:
                await fast.close()
                await r.aclose()
        asyncio.run(go())
        with s.client(heir) as on_heir:
            assert (on_heir.get("follow:fast"), on_heir.get("follow:py")) == (b"1", b"1")
