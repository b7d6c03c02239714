"""The gateway on a Redis Cluster (REDIS_URL redis+cluster://, core/urls.py): three primaries with a replica
each, Debian's redis-server on loopback, and three gateway instances (each its own Envoy, ext_proc and
usage writer) on it and on one PostgreSQL.

The request path's own client (core/resp_cluster.py) against the real cluster: a command goes to its
key's slot, follows MOVED and ASK.  Every key a request's scripts touch is in its organisation's shard
slot (core/redis_keys.py); the shards' journals and usage streams are spread over the primaries, and the
usage writers drain every one.  Then, under a mixed load from the three instances, the primary of the
organisation's shard is SIGKILLed: its replica takes over, no request hangs (a client gets the interface's 500 or
is served), and afterwards each request is reconciled by its id (tests/test_reconciliation_e2e.py):
nothing served lost, nothing billed twice, no slot or hold left, the balance equal to the ledger.  On a
cluster of its own, a primary frozen (SIGSTOP) until its replica took over, then resumed, is survived
the same way; and a cluster that speaks only TLS serves and bills as this one does."""
from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Iterator

import httpx
import pytest
import redis
from redis.crc import key_slot

from conftest import Gateway, assert_error, wait_for
from core import key_limits, redis_keys as rk
from core.key_limits import Change
from core.cost import Prices
from core.keys import key_hash
from core.redis_client import redis_client
from core.resp import RespError
from core.resp_cluster import ClusterClient, client_from_url
from extproc.hold import WorstCase
from extproc.store import Late, Store
from redis_cluster import Cluster, redis_cluster, require_redis_server
from failover import instances, load_through, reconciled_after_a_failover, served_and_billed_once
from test_reconciliation_e2e import _reconcile

require_redis_server()

@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with redis_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def gws(cluster: Cluster) -> Iterator[list[Gateway]]:
    with instances("gw-cluster-", cluster.url) as gws:
        yield gws


def test_the_own_client_routes_by_slot_and_follows_moved_and_ask(cluster: Cluster) -> None:
    """Keys of every primary set and read back through one client; a slot moved to another primary
    (MOVED) and a slot being migrated (ASK) are followed, the command run once where the key is."""
    async def go() -> None:
        c = client_from_url(cluster.url)
        assert isinstance(c, ClusterClient)
        try:
            keys = [f"gw:test:{i}" for i in range(30)]
            owners = {cluster.primary_of(key_slot(k.encode())) for k in keys}
            assert len(owners) == 3  # the keys span every primary
            for k in keys:
                assert await c.call("SET", k, k) == b"OK"
            assert [await c.call("GET", k) for k in keys] == [k.encode() for k in keys]

            # MOVED: the slot of a key handed to another primary behind the client's back
            key = "gw:test:moved"
            slot = key_slot(key.encode())
            await c.call("SET", key, "1")
            source = cluster.primary_of(slot)
            target = next(p for p in {cluster.primary_of(s) for s in (0, 8000, 16000)} if p != source)
            _move_slot(cluster, slot, source, target, [key])
            assert await c.call("INCR", key) == 2  # MOVED followed: run once, on the new owner
            with cluster.client(target) as r:
                assert r.get(key) == b"2"

            # ASK: a slot half migrated: its key already on the target, the slot still the source's
            key = "gw:test:ask"
            slot = key_slot(key.encode())
            await c.call("SET", key, "10")
            source = cluster.primary_of(slot)
            target = next(p for p in {cluster.primary_of(s) for s in (0, 8000, 16000)} if p != source)
            ids = {p: _node_id(cluster, p) for p in (source, target)}
            with cluster.client(target) as t, cluster.client(source) as s:
                t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
                s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
                s.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "AUTH", "cl:u/st@r", "KEYS", key)
                assert await c.call("INCR", key) == 11  # ASK followed (ASKING, then the command, on the target)
                assert s.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
                for p in ids:
                    with cluster.client(p) as r:
                        r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
                assert t.get(key) == b"11"
            with pytest.raises(RespError, match="WRONGTYPE"):  # an error reply is the caller's, not retried
                await c.call("LPUSH", key, "x")
        finally:
            await c.close()
    asyncio.run(go())


def _node_id(cluster: Cluster, port: int) -> str:
    with cluster.client(port) as r:
        return str(r.execute_command("CLUSTER", "MYID").decode())


def _move_slot(cluster: Cluster, slot: int, source: int, target: int, keys: list[str]) -> None:
    """``slot`` (holding ``keys``) migrated from ``source`` to ``target`` whole, as redis-cli's reshard does."""
    ids = {p: _node_id(cluster, p) for p in (source, target)}
    with cluster.client(target) as t, cluster.client(source) as s:
        t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        s.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "AUTH", "cl:u/st@r", "KEYS", *keys)
    for p in cluster.ports:
        if cluster.procs[p].poll() is None and p in ids:
            with cluster.client(p) as r:
                r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    wait_for(lambda: cluster.primary_of(slot) == target, timeout=10)


def test_a_requests_keys_are_in_its_organisations_shard_and_every_shard_is_drained(gws: list[Gateway]) -> None:
    """Requests of organisations on every primary, through every instance: each is served, billed once
    in PostgreSQL, and each key its scripts wrote carries its organisation's shard tag."""
    first = gws[0]
    orgs = [first.new_org(1_000_000_000) for _ in range(8)]
    tags = {rk.CLUSTER.tag(org) for org, _, _ in orgs}
    primaries = {_primary(first, tag) for tag in tags}
    assert len(primaries) >= 2, "the organisations' shards should span primaries"
    rids = []
    for i, (org, _, key) in enumerate(orgs):
        gw = gws[i % 3]
        r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                       json={"model": "polish-fast", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        rids.append((org, r.headers["x-request-id"]))
    for org, rid in rids:
        wait_for(lambda: first.sql("SELECT 1 FROM usage_records WHERE request_id = $1", rid), timeout=15)
        debits = first.sql("SELECT amount_micro_pln FROM ledger WHERE ref = $1", "usage:" + rid)
        assert len(debits) == 1 and debits[0]["amount_micro_pln"] < 0
        bal = first.admin(lambda a: a.balance(org))
        assert bal["balance_micro_pln"] == bal["ledger_micro_pln"]
        shard = rk.CLUSTER.tag(org)
        slot = key_slot(shard.encode())
        written = [k.decode() for k in first.redis(lambda r: list(r.scan_iter(match=f"gw:*{org}*", count=1000)))]
        assert rk.CLUSTER.org(org) in written
        assert all(key_slot(k.encode()) == slot for k in written), written
        assert first.slots_held(org) == 0


def _primary(gw: Gateway, tag: str) -> int:
    return int(gw.redis(lambda r: r.get_node_from_key(tag).port))


def test_a_primary_killed_under_load_from_three_instances_loses_and_doubles_nothing(
        cluster: Cluster, gws: list[Gateway]) -> None:
    first = gws[0]
    org, _, key = first.new_org(1_000_000_000)
    before = first.admin(lambda a: a.balance(org))["ledger_micro_pln"]
    victim = cluster.primary_of(key_slot(rk.CLUSTER.tag(org).encode()))
    t0 = time.monotonic()
    seen = load_through(gws, key, lambda: cluster.kill(victim))
    took = time.monotonic() - t0
    assert cluster.primary_of(key_slot(rk.CLUSTER.tag(org).encode())) != victim  # its replica took over
    refused = [s for s in seen if s.status not in (200, 0)]
    assert all((s.status, s.code) == (500, "internal_error") for s in refused), refused[:3]
    counts = _reconcile(first, org, before, seen)
    assert int(first.redis(lambda r: r.hget(rk.CLUSTER.org(org), "hold")) or 0) == 0  # no hold left
    assert counts["served"] >= 16
    print(f"primary killed: {counts}, {len(refused)} answered 500, {took:.1f} s")


def test_a_primary_paused_past_its_failover_and_resumed_as_a_replica_is_survived() -> None:
    """The primary of the organisation's shard frozen (SIGSTOP) under load until the cluster promoted its
    replica, then resumed: it comes back as the new primary's replica.  The request path's client follows
    the slot's move (MOVED), no request hangs, an admission sent again after its answer was lost holds
    nothing twice, and afterwards, once `gateway reconcile` mended the cached balance of an admission the
    failover lost (docs/operations.md), each request is reconciled by its id.  A cluster of its own and
    one gateway instance: the module's kill test leaves a shard without a replica."""
    with redis_cluster() as c, instances("gw-cluster-pause-", c.url, n=1) as gws:
        gw = gws[0]
        org, _, key = gw.new_org(1_000_000_000)
        before = gw.admin(lambda a: a.balance(org))["ledger_micro_pln"]
        slot = key_slot(rk.CLUSTER.tag(org).encode())
        victim = c.primary_of(slot)
        others = [p for p in c.ports if p != victim]

        def primary_now() -> int:  # asked of a node that answers: the frozen one would not
            with c.client(others[0]) as r:
                for start, end, primary, *_ in r.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        return int(primary[1])
            raise AssertionError(f"no node serves slot {slot}")

        def replica_of(heir: int) -> bool:
            try:
                with c.client(victim) as r:
                    info = r.info("replication")
                return bool(info["role"] == "slave" and int(info["master_port"]) == heir
                            and info.get("master_link_status") == "up")
            except redis.exceptions.RedisError:
                return False

        heirs: list[int] = []

        def pause() -> None:
            os.kill(c.procs[victim].pid, signal.SIGSTOP)
            try:
                wait_for(lambda: primary_now() != victim, timeout=30, interval=0.1)  # the failover, meanwhile
                heirs.append(primary_now())
            finally:
                os.kill(c.procs[victim].pid, signal.SIGCONT)
            wait_for(lambda: replica_of(heirs[0]), timeout=30, interval=0.1)  # demoted once it answers again

        t0 = time.monotonic()
        seen = load_through(gws, key, pause)
        took = time.monotonic() - t0
        assert heirs and primary_now() == heirs[0] != victim and replica_of(heirs[0])
        counts = reconciled_after_a_failover(gw, org, rk.CLUSTER.org(org), before, seen)
        assert counts["served"] >= 8
        print(f"primary paused and resumed: {counts}, {took:.1f} s")


def test_a_cluster_that_speaks_only_tls_serves_and_bills_on_every_shard() -> None:
    """A cluster as a managed one with encryption in transit has it (rediss+cluster://, TLS only for
    clients, the bus and replication, its certificate checked against ``ssl_ca_certs``): every process of
    an instance reaches every primary over TLS, and chat and a stream of organisations on several shards
    are each served and billed once, the balance equal to the ledger."""
    with redis_cluster(tls=True) as c, instances("gw-cluster-tls-", c.url, n=1) as gws:
        gw = gws[0]
        assert c.url.startswith("rediss+cluster://") and "ssl_ca_certs=" in c.url
        orgs = [gw.new_org(1_000_000_000) for _ in range(6)]
        assert len({c.primary_of(key_slot(rk.CLUSTER.tag(org).encode())) for org, _, _ in orgs}) >= 2
        for i, (org, _, key) in enumerate(orgs):
            served_and_billed_once(gw, org, key, stream=i % 2 == 1)


def test_a_cancelled_admission_gives_its_slot_and_hold_back_on_its_shard(gws: list[Gateway]) -> None:
    """An admission given up on (``Store.cancel``) is undone on its organisation's shard: slot, hold and
    journal entry; the same request id is refused (Late) should it still come."""
    first = gws[0]
    org, _, key = first.new_org(1_000_000_000)
    r = httpx.post(first.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "polish-fast", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    assert r.status_code == 200  # the key and the organisation cached in the cluster
    url = first.stack.redis_url
    tag = rk.CLUSTER.tag(org)

    def held() -> tuple[int, int, bool]:
        return (first.slots_held(org), int(first.redis(lambda c: c.hget(rk.CLUSTER.org(org), "hold")) or 0),
                bool(first.redis(lambda c: c.hexists(rk.CLUSTER.journal(tag), "rid-cancelled"))))

    async def go() -> None:
        store = Store(redis_client(url, 2), client_from_url(url), default_rpm=10**6, default_concurrency=1000,
                      lease_s=600, key_ttl_s=3600)
        hold = WorstCase(12, 1, 2048, Prices(1_500_000, 3_000_000))
        try:
            adm = await store.admit(key_hash(key), "rid-cancelled", limits=True, pending="test|{}",
                                    deadline=time.time() + 5, hold=hold)
            assert adm.admitted and adm.identity is not None and adm.identity.org_id == org
            assert held() == (1, hold.cost, True)
            await store.cancel("rid-cancelled")
            assert held() == (0, 0, False)
            with pytest.raises(Late):
                await store.admit(key_hash(key), "rid-cancelled", limits=True, pending="test|{}",
                                  deadline=time.time() + 5, hold=hold)
            assert held() == (0, 0, False)
        finally:
            await store.fast.close()
            await store.r.aclose()
    asyncio.run(go())


def test_a_capped_keys_spend_is_counted_on_its_organisations_shard(gws: list[Gateway]) -> None:
    """A key with a monthly cap: its spend counter (gw:ks:) is in its organisation's shard slot, the
    admission reads it there and the finish adds the request's cost to it; a model the key may not use
    is refused as on one Redis."""
    first = gws[0]
    org, kid, key = first.new_org(1_000_000_000)
    first.admin(lambda a: a.set_key_limits(kid, limits=Change(monthly_limit=5_000_000, models=("polish-fast",))))
    r = httpx.post(gws[1].v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "polish-fast", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    wait_for(lambda: first.sql("SELECT 1 FROM usage_records WHERE request_id = $1", rid), timeout=15)
    cost = first.sql("SELECT cost_micro_pln FROM usage_records WHERE request_id = $1", rid)[0]["cost_micro_pln"]
    spend = rk.CLUSTER.key_spend(org, kid, key_limits.month(time.time()))
    assert key_slot(spend.encode()) == key_slot(rk.CLUSTER.tag(org).encode())
    assert cost > 0 and int(first.redis(lambda c: c.hget(spend, "spent"))) == cost
    assert int(first.redis(lambda c: c.hget(spend, "hold")) or 0) == 0
    no = httpx.post(gws[2].v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                    json={"model": "polish-pro", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4})
    assert_error(no, 404, "model_not_found", "invalid_request_error", "model")
