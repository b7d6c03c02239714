"""Two gateway instances (two Envoy + ext_proc pairs) sharing one Redis and one PostgreSQL: one budget,
one revocation.  And what a request gets while Redis or PostgreSQL is down."""
from __future__ import annotations

import threading
import time
from typing import Iterator

import httpx
import pytest

from conftest import Gateway, assert_error, rate_window_with, free_base, wait_for
from control.launcher import Stack
from control.settings import Settings

CHAT = {"model": "polish-fast", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


SECOND: dict[str, Stack] = {}


@pytest.fixture(scope="module")
def second(gateway: Gateway) -> Iterator[str]:
    s = gateway.stack.s
    base = free_base()
    other = Stack(Settings.from_env(gateway_port=base, metrics_port=base + 19, state_dir=str(s.state) + "-second", catalog=s.catalog,
                                    database_url=gateway.stack.database_url, redis_url=gateway.stack.redis_url,
                                    run_sim=False, dev=True, default_rpm=s.default_rpm,
                                    default_concurrency=s.default_concurrency,
                                    # the second instance runs its ext_proc and usage writer on uvloop
                                    event_loop="uvloop"))
    try:
        other.start()
        SECOND["stack"] = other
        yield f"http://127.0.0.1:{base}/v1"
    finally:
        other.stop()


def _post(v1: str, key: str, body: dict = CHAT, timeout: float = 30) -> httpx.Response:
    return httpx.post(v1 + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=timeout)


def test_the_second_instance_runs_on_uvloop(gateway: Gateway, second: str) -> None:
    """GATEWAY_EVENT_LOOP=uvloop reaches the second instance's ext_proc: it serves (and the first,
    on asyncio, serves alike)."""
    org, _, key = gateway.new_org()
    assert _post(second, key).status_code == 200 and _post(gateway.v1, key).status_code == 200

    def uvloop_loaded(stack: Stack, name: str) -> bool:
        proc = stack.procs[name].popen
        assert proc is not None
        return "uvloop" in open(f"/proc/{proc.pid}/maps").read()
    assert uvloop_loaded(SECOND["stack"], "extproc") and uvloop_loaded(SECOND["stack"], "usage-writer")
    assert not uvloop_loaded(gateway.stack, "extproc")


def test_rate_limit_is_one_budget_across_instances(gateway: Gateway, second: str) -> None:
    org, kid, key = gateway.new_org()
    gateway.admin(lambda a: a.set_key_limits(kid, 4))
    rate_window_with()  # every request below counts against one window
    codes = [_post(v1, key).status_code for v1 in (gateway.v1, second, gateway.v1, second)]
    assert codes == [200, 200, 200, 200]
    for v1 in (gateway.v1, second):
        assert_error(_post(v1, key), 429, "rate_limit_exceeded", "rate_limit_error")


def test_concurrency_is_one_budget_across_instances(gateway: Gateway, second: str) -> None:
    org, kid, key = gateway.new_org()
    gateway.admin(lambda a: a.set_limits(org, None, 2))
    slow = {**CHAT, "sim": {"ttft_ms": 3000}}
    out: list[int] = []
    ts = [threading.Thread(target=lambda v=v1: out.append(_post(v, key, slow).status_code))
          for v1 in (gateway.v1, second)]
    for t in ts:
        t.start()
    wait_for(lambda: gateway.slots_held(org) == 2, timeout=2.5, interval=0.02)  # both slow ones hold theirs
    for v1 in (gateway.v1, second):
        r = _post(v1, key)
        assert_error(r, 429, "concurrency_limit_exceeded", "rate_limit_error")
        assert r.headers["retry-after"] == "1"
    for t in ts:
        t.join()
    assert out == [200, 200]


def test_revocation_reaches_both_instances_within_one_second(gateway: Gateway, second: str) -> None:
    org, kid, key = gateway.new_org()
    assert _post(gateway.v1, key).status_code == 200 and _post(second, key).status_code == 200
    gateway.admin(lambda a: a.revoke_key(kid))
    t0 = time.monotonic()
    for v1 in (gateway.v1, second):
        while (r := _post(v1, key)).status_code != 401:
            assert time.monotonic() - t0 < 1.0
        assert_error(r, 401, "invalid_api_key", "authentication_error")


def test_redis_down_gives_clear_500_and_recovers(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org()
    assert _post(gateway.v1, key).status_code == 200
    gateway.stack.stop_proc("redis")
    try:
        t0 = time.monotonic()
        r = _post(gateway.v1, key, timeout=10)
        assert time.monotonic() - t0 < 5
        assert_error(r, 500, "internal_error", "server_error")
        m = httpx.get(gateway.v1 + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert_error(m, 500, "internal_error", "server_error")
    finally:
        gateway.stack.restart("redis")
    # recovery without restarting anything else; the cached state survived (append-only file)
    wait_for(lambda: _post(gateway.v1, key).status_code == 200, timeout=10)


def test_postgres_down_cached_keys_keep_working(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org()
    _, new_key = gateway.admin(lambda a: a.create_key(org))
    r0 = _post(gateway.v1, key)
    assert r0.status_code == 200
    gateway.stack.stop_proc("postgres")
    try:
        r = _post(gateway.v1, key)
        assert r.status_code == 200, r.text  # served from the Redis cache
        rid = r.headers["x-request-id"]
        t0 = time.monotonic()
        unknown = _post(gateway.v1, new_key, timeout=15)  # a key never seen needs PostgreSQL
        assert time.monotonic() - t0 < 10
        assert_error(unknown, 500, "internal_error", "server_error")
    finally:
        gateway.stack.restart("postgres")
    # the usage written while PostgreSQL was down arrives once it is back, exactly once
    rows = wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE request_id = $1", rid), timeout=15)
    assert len(rows) == 1
    wait_for(lambda: _post(gateway.v1, new_key).status_code == 200, timeout=10)
