"""Keys, organisations and limits through the real stack (docs/interface.md sections 3, 5, 7, 8)."""
from __future__ import annotations

import threading
import time

import httpx

from conftest import Gateway, assert_error, rate_window_with, wait_for

CHAT = {"model": "polish-fast", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


def _post(gateway: Gateway, key: str, body: dict = CHAT, path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(gateway.v1 + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _first_change(gateway: Gateway, key: str, status: int, limit: float = 1.0) -> float:
    """Seconds from now until a request with the key first gets ``status``."""
    t0 = time.monotonic()
    while True:
        r = _post(gateway, key)
        if r.status_code == status:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < limit + 1, (r.status_code, r.text)


def test_revocation_within_one_second(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org()
    assert _post(gateway, key).status_code == 200  # the key is cached now
    done = threading.Event()
    threading.Thread(target=lambda: (gateway.admin(lambda a: a.revoke_key(kid)), done.set())).start()
    done.wait(5)
    t0 = time.monotonic()
    r = _post(gateway, key)
    while r.status_code != 401:
        assert time.monotonic() - t0 < 1.0, "revoked key still accepted after 1 s"
        r = _post(gateway, key)
    assert_error(r, 401, "invalid_api_key", "authentication_error")
    # and it stays revoked, also for the models endpoint
    assert_error(httpx.get(gateway.v1 + "/models", headers={"Authorization": f"Bearer {key}"}),
                 401, "invalid_api_key", "authentication_error")


def test_suspension_and_reactivation_within_one_second(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org()
    assert _post(gateway, key).status_code == 200
    gateway.admin(lambda a: a.set_status(org, "suspended"))
    assert _first_change(gateway, key, 403) < 1.0
    r = _post(gateway, key)
    assert_error(r, 403, "org_suspended", "permission_error")
    m = httpx.get(gateway.v1 + "/models", headers={"Authorization": f"Bearer {key}"})
    assert_error(m, 403, "org_suspended", "permission_error")
    gateway.admin(lambda a: a.set_status(org, "active"))
    assert _first_change(gateway, key, 200) < 1.0


def test_zero_balance_is_402_but_models_still_listed(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org(0)
    assert_error(_post(gateway, key), 402, "insufficient_quota", "insufficient_quota")
    assert_error(_post(gateway, key, {"model": "embed", "input": "x"}, "/embeddings"),
                 402, "insufficient_quota", "insufficient_quota")
    assert httpx.get(gateway.v1 + "/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    # a credit is seen at once
    assert gateway.admin(lambda a: a.credit(org, 1_000_000, ref="topup-test-1")) is True
    assert _first_change(gateway, key, 200) < 1.0
    # the same reference credits once
    assert gateway.admin(lambda a: a.credit(org, 1_000_000, ref="topup-test-1")) is False
    bal = gateway.admin(lambda a: a.balance(org))
    assert bal["ledger_micro_pln"] <= 1_000_000


def test_balance_check_comes_before_rate_limit(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org(0)
    gateway.admin(lambda a: a.set_key_limits(kid, 1))
    for _ in range(3):
        assert_error(_post(gateway, key), 402, "insufficient_quota", "insufficient_quota")


def test_rate_limit_per_key_with_retry_after(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org()
    gateway.admin(lambda a: a.set_key_limits(kid, 3))
    rate_window_with()  # every request below counts against one window
    codes = [_post(gateway, key).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    r = _post(gateway, key)
    err = assert_error(r, 429, "rate_limit_exceeded", "rate_limit_error")
    assert err["param"] is None
    wait = int(r.headers["retry-after"])
    assert 1 <= wait <= 60
    assert wait == 60 - int(time.time()) % 60 or wait == 60 - (int(time.time()) - 1) % 60
    assert not any(h.lower().startswith("x-ratelimit") for h in r.headers)
    # embeddings share the budget; the models endpoint is not limited
    assert _post(gateway, key, {"model": "embed", "input": "x"}, "/embeddings").status_code == 429
    assert httpx.get(gateway.v1 + "/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    # another key of the same organisation has its own budget
    _, key2 = gateway.admin(lambda a: a.create_key(org))
    assert _post(gateway, key2).status_code == 200


def test_concurrency_per_org_released_on_every_ending(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org()
    gateway.admin(lambda a: a.set_limits(org, None, 2))
    slow = {**CHAT, "sim": {"ttft_ms": 3000}}
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(_post(gateway, key, slow).status_code))
               for _ in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: gateway.slots_held(org) == 2, timeout=2.5, interval=0.02)  # both slow ones hold theirs
    r = _post(gateway, key)
    assert_error(r, 429, "concurrency_limit_exceeded", "rate_limit_error")
    assert r.headers["retry-after"] == "1"
    for t in threads:
        t.join()
    assert results == [200, 200]
    # released after success, upstream error, broken stream and client disconnect
    assert _post(gateway, key, {**CHAT, "sim": {"status": 500}}).status_code == 502
    broken = {**CHAT, "stream": True, "sim": {"fail_after_chunks": 2, "itl_ms": 20}}
    with httpx.stream("POST", gateway.v1 + "/chat/completions", json=broken,
                      headers={"Authorization": f"Bearer {key}"}) as s:
        try:
            for _ in s.iter_bytes():
                pass
        except httpx.HTTPError:
            pass
    try:
        httpx.post(gateway.v1 + "/chat/completions", json={**CHAT, "sim": {"ttft_ms": 3000}},
                   headers={"Authorization": f"Bearer {key}"}, timeout=0.3)
    except httpx.TimeoutException:
        pass
    # both slots come back (the disconnect is noticed as soon as Envoy sees the client gone)
    wait_for(lambda: all(_post(gateway, key).status_code == 200 for _ in range(2)), timeout=5)
    codes = []
    threads = [threading.Thread(target=lambda: codes.append(_post(gateway, key, slow).status_code))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200, 200]


def test_a_finished_request_frees_its_slot_before_the_next_one_arrives(gateway: Gateway) -> None:
    """The slot is released and the usage recorded just after the final answer goes to Envoy (off the
    client's wait); the same Redis connection carries it ahead of any later request's admission, so a
    client that sends its requests one after another never meets its own finished request."""
    org, kid, key = gateway.new_org()
    gateway.admin(lambda a: a.set_limits(org, None, 1))
    stream = {**CHAT, "stream": True}
    emb = {"model": "embed", "input": ["a", "b"]}
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
        for i in range(60):
            kind = i % 3
            if kind == 0:
                r = c.post(gateway.v1 + "/chat/completions", json=CHAT)
            elif kind == 1:
                r = c.post(gateway.v1 + "/chat/completions", json=stream)
                assert r.text.endswith("data: [DONE]\n\n")
            else:
                r = c.post(gateway.v1 + "/embeddings", json=emb)
            assert r.status_code == 200, (i, r.status_code, r.text)
    # every one of them was recorded once
    wait_for(lambda: gateway.sql("SELECT count(*) AS n, count(DISTINCT request_id) AS d FROM usage_records"
                               " WHERE org_id = $1", org) == [{"n": 60, "d": 60}], timeout=5)
