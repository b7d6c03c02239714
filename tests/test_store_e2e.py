"""The two request-path Redis scripts (``extproc.store``) against the stack's real Redis and PostgreSQL:
a finish counts once, a rejection consumes nothing."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

import httpx
import pytest
import redis.asyncio as aioredis

from conftest import Gateway, wait_for
from core.cost import Prices
from core.decisions import UsageRecord
from core.keys import key_hash
from core.resp import RespClient
from extproc.hold import WorstCase
from extproc.store import Late, Store

CHAT = {"model": "polish-fast", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


def _with_store(gateway: Gateway, fn: Callable[[Store, aioredis.Redis], Awaitable[Any]],
                credit_limit: int | None = None) -> Any:
    async def go() -> Any:
        r = aioredis.from_url(gateway.stack.redis_url)
        fast = RespClient.from_url(gateway.stack.redis_url)
        try:
            return await fn(Store(r, fast, default_rpm=100000, default_concurrency=1000, lease_s=600,
                                  key_ttl_s=60, credit_limit=credit_limit), r)
        finally:
            await fast.close()
            await r.aclose()
    return asyncio.run(go())


def _ready_org(gateway: Gateway) -> tuple[str, str, str]:
    """A fresh organisation whose key and organisation are in Redis (one request made)."""
    org, kid, key = gateway.new_org()
    r = httpx.post(gateway.v1 + "/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"},
                   timeout=30)
    assert r.status_code == 200, r.text
    return org, kid, key


def _record(rid: str, org: str, kid: str, cost: int) -> UsageRecord:
    now = time.time()
    return UsageRecord(request_id=rid, org_id=org, key_id=kid, alias="polish-fast", upstream_model="up-fast",
                       endpoint="chat", status=200, stream=False, prompt_tokens=3, completion_tokens=2,
                       estimated=False, cost_micro_pln=cost, input_price=1, output_price=1, started_at=now - 1,
                       ttfb_ms=5, ended_at=now)


def test_a_finish_debits_once_and_only_after_an_admission_and_records_once(gateway: Gateway) -> None:
    org, kid, key = _ready_org(gateway)
    h = key_hash(key)
    stamp = str(time.time_ns())
    once, never, last = f"store-once-{stamp}", f"store-never-{stamp}", f"store-last-{stamp}"

    async def go(store: Store, r: aioredis.Redis) -> tuple[int, int]:
        before = int(await r.hget("gw:o:" + org, "balance"))
        for rid in (once, last):
            adm = await store.admit(h, rid, limits=True, pending="test|{}")
            assert adm.error is None and adm.identity is not None and adm.identity.org_id == org
        assert await r.zscore("gw:c:" + org, once) is not None
        for _ in range(3):  # a retry, or the reaper after the owner: the same request finished again
            await store.finish(org, once, _record(once, org, kid, 1234))
        # no in-flight entry (as after Redis lost it): the record still goes to PostgreSQL, which bills
        # it once; Redis's balance is not debited (gateway reconcile mends that)
        await store.finish(org, never, _record(never, org, kid, 999))
        await store.finish(org, last, _record(last, org, kid, 1))
        assert await r.zscore("gw:c:" + org, once) is None  # the slot is free
        assert await r.hget("gw:if", once) is None  # and the journal entry gone
        return before, int(await r.hget("gw:o:" + org, "balance"))

    # the earlier request's debit is in (its record reached PostgreSQL): the balance read in go() is settled
    wait_for(lambda: gateway.sql("SELECT count(*) AS n FROM usage_records WHERE org_id = $1", org) == [{"n": 1}])
    before, after = _with_store(gateway, go)
    assert before - after == 1234 + 1
    wait_for(lambda: gateway.sql("SELECT count(*) AS n FROM usage_records WHERE request_id = $1", last)
             == [{"n": 1}])
    wait_for(lambda: gateway.sql("SELECT count(*) AS n FROM usage_records WHERE request_id = $1", never)
             == [{"n": 1}])
    rows = gateway.sql("SELECT request_id, cost_micro_pln FROM usage_records WHERE request_id = ANY($1)"
                       " ORDER BY request_id", [once, never, last])
    assert rows == [{"request_id": last, "cost_micro_pln": 1}, {"request_id": never, "cost_micro_pln": 999},
                    {"request_id": once, "cost_micro_pln": 1234}]
    debits = gateway.sql("SELECT ref, amount_micro_pln FROM ledger WHERE ref = ANY($1) ORDER BY ref",
                         ["usage:" + once, "usage:" + never, "usage:" + last])
    assert debits == [{"ref": "usage:" + last, "amount_micro_pln": -1}, {"ref": "usage:" + never, "amount_micro_pln": -999},
                      {"ref": "usage:" + once, "amount_micro_pln": -1234}]


def test_a_rejected_admission_takes_no_slot_and_counts_no_request(gateway: Gateway) -> None:
    org, kid, key = _ready_org(gateway)
    h = key_hash(key)
    gateway.admin(lambda a: a.set_limits(org, 3, 1))
    stamp = str(time.time_ns())

    async def go(store: Store, r: aioredis.Redis) -> None:
        minute = int((await r.time())[0]) // 60
        a = await store.admit(h, f"{stamp}-a", limits=True, pending="test|{}")
        assert a.error is None
        b = await store.admit(h, f"{stamp}-b", limits=True, pending="test|{}")  # the one slot is taken
        assert b.error is not None and b.error.code == "concurrency_limit_exceeded"
        assert await r.zcard("gw:c:" + org) == 1 and await r.hget("gw:if", f"{stamp}-b") is None
        if int((await r.time())[0]) // 60 != minute:
            return  # the minute turned over mid-test: the counter below belongs to another window
        assert int(await r.get(f"gw:rl:{kid}:{minute}")) in (1, 2)  # the HTTP request may share the minute
        await store.finish(org, f"{stamp}-a", None)  # released without a record
        assert await r.zcard("gw:c:" + org) == 0
        # a lease left by a process that died (expired) does not hold the slot
        await r.zadd("gw:c:" + org, {"dead": 1})
        c = await store.admit(h, f"{stamp}-c", limits=True, pending="test|{}")
        assert c.error is None and await r.zscore("gw:c:" + org, "dead") is None
        await store.finish(org, f"{stamp}-c", None)
        # the rate limit (3 a minute, the HTTP request included if in this minute) stops further ones
        codes = []
        for i in range(4):
            adm = await store.admit(h, f"{stamp}-r{i}", limits=True, pending="test|{}")
            codes.append(adm.error.code if adm.error is not None else "ok")
            if adm.error is None:
                await store.finish(org, f"{stamp}-r{i}", None)
        if int((await r.time())[0]) // 60 == minute:
            assert codes.count("rate_limit_exceeded") >= 2 and codes[-1] == "rate_limit_exceeded"
            assert int(await r.get(f"gw:rl:{kid}:{minute}")) == 3  # rejections are not counted

    _with_store(gateway, go)


def test_an_admission_run_after_its_deadline_or_cancel_takes_no_effect(gateway: Gateway) -> None:
    """A hung Redis runs queued admissions when it resumes: one whose caller's deadline passed, or whose
    caller cancelled it, takes no slot, counts no request and journals nothing; ``cancel`` also undoes
    an admission that ran but whose answer came too late."""
    org, kid, key = _ready_org(gateway)
    h = key_hash(key)
    stamp = str(time.time_ns())

    async def go(store: Store, r: aioredis.Redis) -> None:
        minute = int((await r.time())[0]) // 60
        counted = await r.get(f"gw:rl:{kid}:{minute}")
        store.margin_s = 0.0
        late, cancelled, undone = f"{stamp}-late", f"{stamp}-cancelled", f"{stamp}-undone"
        with pytest.raises(Late):
            await store.admit(h, late, limits=True, pending="test|{}", deadline=time.time() - 0.01)
        await store.cancel(cancelled)
        with pytest.raises(Late):
            await store.admit(h, cancelled, limits=True, pending="test|{}", deadline=time.time() + 60)
        assert await r.zcard("gw:c:" + org) == 0
        assert await r.hget("gw:if", late) is None and await r.hget("gw:if", cancelled) is None
        if int((await r.time())[0]) // 60 == minute:
            assert await r.get(f"gw:rl:{kid}:{minute}") == counted  # nothing counted
        adm = await store.admit(h, undone, limits=True, pending="test|{}", deadline=time.time() + 60)
        assert adm.admitted and await r.zscore("gw:c:" + org, undone) is not None
        await store.cancel(undone)
        assert await r.zcard("gw:c:" + org) == 0 and await r.hget("gw:if", undone) is None
        assert await r.ttl("gw:x:" + undone) > 0  # the refusal marker expires
        # deadlines are in Redis's time: a host whose clock is 30 s behind Redis's (as measured) still
        # gets an admission whose deadline, by its own clock 29 s ago, is a second away for Redis
        await store.sync_clock()
        assert abs(store.clock_offset_s) < 0.5  # the same machine
        store.clock_offset_s = 30.0
        skewed = f"{stamp}-skewed"
        adm = await store.admit(h, skewed, limits=True, pending="test|{}", deadline=time.time() - 29)
        assert adm.admitted
        await store.finish(org, skewed, None)

    _with_store(gateway, go)


def _hold(cost: int) -> WorstCase:
    """A worst case of exactly ``cost`` micro-PLN (1 input token at ``cost`` PLN per token)."""
    return WorstCase(1, 1, 0, Prices(cost * 1_000_000, 0))


def test_a_hold_is_released_once_by_the_finish_the_cancel_or_the_reaper(gateway: Gateway) -> None:
    """The held total (gw:o:<org> hold) grows by each admitted request's worst case and falls by exactly
    that at its first finish (a repeated one releases nothing), at a cancel, and when the reaper bills a
    request whose ext_proc died; a refused admission holds nothing."""
    org, kid, key = _ready_org(gateway)
    h = key_hash(key)
    stamp = str(time.time_ns())
    wait_for(lambda: gateway.usage_drained(org))

    async def held(r: aioredis.Redis) -> int:
        return int(await r.hget("gw:o:" + org, "hold") or 0)

    async def go(store: Store, r: aioredis.Redis) -> None:
        start = await held(r)
        a, b, c = f"{stamp}-a", f"{stamp}-b", f"{stamp}-c"
        for rid, cost in ((a, 700), (b, 50), (c, 3)):
            assert (await store.admit(h, rid, limits=True, pending="test|{}", hold=_hold(cost))).admitted
        assert await held(r) == start + 753
        # an admission sent again (its answer lost on the way: a timeout, a failover) stands as it was: it
        # holds nothing more, takes no second request of the minute, and one finish releases it
        async def counted() -> int:  # the key's requests counted, over its minutes' counters
            return sum([int(await r.get(k) or 0) for k in await r.keys(f"gw:rl:{kid}:*")])
        before = await counted()
        assert (await store.admit(h, a, limits=True, pending="test|{}", hold=_hold(700))).admitted
        assert await held(r) == start + 753 and await counted() == before
        assert (await r.hget("gw:if", a)).decode().startswith(f"{kid}|{org}|700|test|")
        for _ in range(2):  # a repeat (a retry, the reaper after the owner) releases nothing more
            await store.finish(org, a, _record(a, org, kid, 10))
        assert await held(r) == start + 53
        await store.cancel(b)
        assert await held(r) == start + 3
        await store.finish(org, c, None)  # released without a record
        assert await held(r) == start
        # a request whose ext_proc died: the usage writer's reaper bills its pending record and releases it
        dead = f"{stamp}-dead"
        pending = f"dead-owner-{stamp}|" + _record(dead, "", "", 5).to_json()
        assert (await store.admit(h, dead, limits=True, pending=pending, hold=_hold(40))).admitted
        assert await held(r) == start + 40

    _with_store(gateway, go)
    wait_for(lambda: gateway.redis(lambda r: r.hget("gw:if", f"{stamp}-dead")) is None, 15)
    assert int(gateway.redis(lambda r: r.hget("gw:o:" + org, "hold")) or 0) == 0
    row = wait_for(lambda: gateway.sql("SELECT cost_micro_pln FROM usage_records WHERE request_id = $1",
                                       f"{stamp}-dead"), 10)
    assert row == [{"cost_micro_pln": 5}]


def test_the_default_credit_limit_applies_to_a_paying_organisation_only(gateway: Gateway) -> None:
    """GATEWAY_CREDIT_LIMIT_PLN (the store's ``credit_limit``): a paying organisation may go that far below
    zero, less what its requests in flight hold; its own limit wins; trial credit alone: 0."""
    org, kid, key = _ready_org(gateway)
    h = key_hash(key)
    stamp = str(time.time_ns())
    wait_for(lambda: gateway.usage_drained(org))
    balance = gateway.admin(lambda a: a.balance(org))["balance_micro_pln"]

    async def go(store: Store, r: aioredis.Redis) -> None:
        first = await store.admit(h, f"{stamp}-1", limits=True, pending="test|{}", hold=_hold(balance + 600))
        assert first.admitted
        over = await store.admit(h, f"{stamp}-2", limits=True, pending="test|{}", hold=_hold(401))
        assert over.error is not None and over.error.code == "insufficient_quota"
        assert "available balance of 0.000400 PLN" in over.error.message  # balance - held + 1000
        fits = await store.admit(h, f"{stamp}-3", limits=True, pending="test|{}", hold=_hold(400))
        assert fits.admitted
        for rid in (f"{stamp}-1", f"{stamp}-3"):
            await store.finish(org, rid, None)
        await r.hset("gw:o:" + org, "climit", "0")  # its own limit (as Admin.set_credit_limit writes it)
        assert not (await store.admit(h, f"{stamp}-4", limits=True, pending="test|{}",
                                      hold=_hold(balance + 1))).admitted
        await r.hset("gw:o:" + org, mapping={"climit": "default", "paid": "0"})  # the trial credit alone
        assert not (await store.admit(h, f"{stamp}-5", limits=True, pending="test|{}",
                                      hold=_hold(balance + 1))).admitted
        await r.hset("gw:o:" + org, "paid", "1")
        last = await store.admit(h, f"{stamp}-6", limits=True, pending="test|{}", hold=_hold(balance + 1))
        assert last.admitted
        await store.finish(org, f"{stamp}-6", None)

    _with_store(gateway, go, credit_limit=1000)  # as open_store passes GATEWAY_CREDIT_LIMIT_PLN = 0.001
