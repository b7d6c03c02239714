"""A bounded cost per request through the real stack (docs/billing.md): each request's worst case is held
against the organisation's balance, less its requests in flight, plus its credit limit; one that does not
fit is 402 insufficient_quota at no cost, saying the largest max_tokens that would fit.  Without a credit
limit, the interface's rule alone: a positive balance admits."""
from __future__ import annotations

import threading
from typing import Any

import httpx

from conftest import Gateway, assert_error, wait_for
from core.cost import Prices, cost_micro_pln, estimate_chat_prompt

ADVANCED = Prices(4_000_000, 8_000_000)  # the test catalog's "advanced": 4 / 8 PLN per 1M tokens
MSGS = [{"role": "user", "content": "x" * 32}]  # estimated 14 tokens (7 + 4 + 3); the simulator counts 8
EST = estimate_chat_prompt(MSGS)


def _post(gateway: Gateway, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(gateway.v1 + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=60)


def _ledger(gateway: Gateway, org: str) -> int:
    return int(gateway.sql("SELECT COALESCE(SUM(amount_micro_pln), 0) AS s FROM ledger WHERE org_id = $1",
                           org)[0]["s"])


def _record(gateway: Gateway, rid: str) -> dict[str, Any]:
    return dict(wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE request_id = $1", rid), 10)[0])


def _held(gateway: Gateway, org: str) -> int:
    return int(gateway.redis(lambda r: r.hget("gw:o:" + org, "hold")) or 0)


def _billed(usage: dict[str, int], prices: Prices = ADVANCED) -> int:
    return cost_micro_pln(usage["prompt_tokens"], usage["completion_tokens"], prices)


def test_n_500_on_a_cent_of_trial_credit_is_402_and_costs_nothing(gateway: Gateway) -> None:
    """The trial credit alone: credit limit 0.  n = 500 x max_tokens 4096 could cost 16.38 PLN; refused
    before anything is generated, its message names the largest max_tokens that fits (2), which does."""
    async def make(a: Any) -> tuple[str, str]:
        org = await a.create_org("trial", 10_000, kind="trial")
        return org, (await a.create_key(org))[1]
    org, key = gateway.admin(make)
    body = {"model": "advanced", "messages": MSGS, "n": 500, "max_tokens": 4096,
            "sim": {"output_tokens": 100_000}}
    r = _post(gateway, key, body)
    err = assert_error(r, 402, "insufficient_quota", "insufficient_quota")
    worst = cost_micro_pln(EST, 500 * 4096, ADVANCED)
    assert worst == 16_384_056
    assert err["message"] == ("This request could cost up to 16.384056 PLN, more than the organisation's "
                              "available balance of 0.010000 PLN; the largest max_tokens it allows with n = 500 "
                              "is 2. Ask for fewer tokens, or top up to continue.")
    assert cost_micro_pln(EST, 500 * 2, ADVANCED) <= 10_000 < cost_micro_pln(EST, 500 * 3, ADVANCED)
    row = _record(gateway, r.headers["x-request-id"])  # in the usage log, at no cost
    assert (row["status"], row["error_code"], row["cost_micro_pln"]) == (402, "insufficient_quota", 0)
    assert _ledger(gateway, org) == 10_000 and gateway.admin(lambda a: a.balance(org))["balance_micro_pln"] == 10_000
    assert _held(gateway, org) == 0
    # one token more than the message says: still 402; what it says: 200, billed within the balance
    assert _post(gateway, key, {**body, "max_tokens": 3}).status_code == 402
    ok = _post(gateway, key, {**body, "max_tokens": 2})
    assert ok.status_code == 200, ok.text
    doc = ok.json()
    assert len(doc["choices"]) == 500 and doc["usage"]["completion_tokens"] == 1000
    cost = _billed(doc["usage"])
    assert _record(gateway, ok.headers["x-request-id"])["cost_micro_pln"] == cost
    assert _ledger(gateway, org) == 10_000 - cost >= 0
    assert _held(gateway, org) == 0  # released by the request's finish
    # the same on embeddings: the estimated input is the worst case
    emb = httpx.post(gateway.v1 + "/embeddings", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                     json={"model": "embed", "input": ["abcd " * 20_000]})
    e = assert_error(emb, 402, "insufficient_quota", "insufficient_quota")
    assert e["message"].endswith("; send less input, or top up to continue.") and "abcd" not in e["message"]


def test_concurrent_requests_never_take_the_balance_below_the_credit_limit(gateway: Gateway) -> None:
    """10 requests at once whose worst cases sum to 6x the balance: the holds admit two (2 x W fits the
    balance + the credit limit exactly, 3 x W does not); the others are 402 at no cost, every admitted
    one is billed exactly what its usage says, and the balance ends no lower than -(credit limit)."""
    m = 3745
    worst = cost_micro_pln(EST, 2 * m, ADVANCED)
    assert worst == 59_976
    balance = worst * 10 // 6
    assert balance * 6 == worst * 10 == 599_760
    limit = 2 * worst - balance  # 19,992 micro-PLN: two worst cases fit exactly, a third does not
    org, _, key = gateway.new_org(balance)  # an operator's credit: a paying organisation
    gateway.admin(lambda a: a.set_credit_limit(org, limit))
    body = {"model": "advanced", "messages": MSGS, "n": 2, "max_tokens": m,
            "sim": {"output_tokens": 100_000, "ttft_ms": 400}}
    results: list[httpx.Response] = []
    lock = threading.Lock()
    start = threading.Barrier(10)

    def one() -> None:
        start.wait()
        r = _post(gateway, key, body)
        with lock:
            results.append(r)
    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r.status_code for r in results) == [200] * 2 + [402] * 8, [r.text[:200] for r in results]
    costs = []
    for r in results:
        row = _record(gateway, r.headers["x-request-id"])
        if r.status_code == 402:
            err = assert_error(r, 402, "insufficient_quota", "insufficient_quota")
            assert "available balance" in err["message"] or "requests in flight" in err["message"], err
            assert (row["cost_micro_pln"], row["error_code"]) == (0, "insufficient_quota")
            continue
        usage = r.json()["usage"]
        assert usage["completion_tokens"] == 2 * m  # the worst case's output, in full
        costs.append(_billed(usage))
        assert (row["cost_micro_pln"], row["prompt_tokens"], row["completion_tokens"], row["estimated"]) == (
            costs[-1], usage["prompt_tokens"], usage["completion_tokens"], False)
        assert costs[-1] <= worst
    wait_for(lambda: gateway.usage_drained(org), 10)
    final = _ledger(gateway, org)
    assert final == balance - sum(costs) >= -limit
    assert gateway.admin(lambda a: a.balance(org))["balance_micro_pln"] == final
    assert _held(gateway, org) == 0 and gateway.slots_held(org) == 0
    # what is left does not cover another worst case: refused, the balance as it was
    assert _post(gateway, key, body).status_code == 402
    assert _ledger(gateway, org) == final


def test_without_a_credit_limit_a_positive_balance_admits_as_spec_says(gateway: Gateway) -> None:
    """No GATEWAY_CREDIT_LIMIT_PLN on the test stack: a paying organisation's positive balance admits a
    request whose worst case is far more, the balance may end below zero, and then it is 402."""
    org, _, key = gateway.new_org(10_000)
    body = {"model": "advanced", "messages": MSGS, "n": 2, "max_tokens": 4096, "sim": {"output_tokens": 1000}}
    assert cost_micro_pln(EST, 2 * 4096, ADVANCED) > 10_000
    r = _post(gateway, key, body)
    assert r.status_code == 200, r.text
    cost = _billed(r.json()["usage"])
    assert _record(gateway, r.headers["x-request-id"])["cost_micro_pln"] == cost
    assert _ledger(gateway, org) == 10_000 - cost < 0
    err = assert_error(_post(gateway, key, body), 402, "insufficient_quota", "insufficient_quota")
    assert err["message"] == "The organisation's prepaid balance is exhausted; top up to continue."


def test_an_organisations_own_credit_limit_and_payment_apply_within_a_second(gateway: Gateway) -> None:
    """`gateway org limits --credit-limit` and a credit reach the cache at once: a trial organisation is held
    to its balance until money other than the trial credit arrives; then its own limit (0: the balance),
    none (the interface's rule), or the default (none on this stack) applies."""
    async def make(a: Any) -> tuple[str, str]:
        org = await a.create_org("trial", 10_000, kind="trial")
        return org, (await a.create_key(org))[1]
    org, key = gateway.admin(make)
    big = {"model": "advanced", "messages": MSGS, "max_tokens": 4096, "sim": {"output_tokens": 1}}
    small = {**big, "max_tokens": 1}
    assert cost_micro_pln(EST, 4096, ADVANCED) > 10_000 + 1
    gateway.admin(lambda a: a.set_credit_limit(org, "none"))  # its own: not while trial credit is all it has
    assert _post(gateway, key, big).status_code == 402
    assert _post(gateway, key, small).status_code == 200
    assert gateway.admin(lambda a: a.credit(org, 1, ref=f"wire-{org}")) is True  # an operator's credit: paid

    def first(status: int, body: dict[str, Any]) -> None:
        wait_for(lambda: _post(gateway, key, body).status_code == status, 1.0)
    first(200, big)  # its own "none"
    gateway.admin(lambda a: a.set_credit_limit(org, 0))
    first(402, big)
    assert _post(gateway, key, small).status_code == 200
    gateway.admin(lambda a: a.set_credit_limit(org, "default"))  # the stack's: none
    first(200, big)
    b = gateway.admin(lambda a: a.balance(org))
    assert (b["paid"], b["credit_limit_micro_pln"], b["credit_limit_own"], b["held_micro_pln"]) == (
        True, None, "default", 0)
