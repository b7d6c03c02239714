"""A key's own limits through the real stack (docs/limits.md, "Key limits"): a monthly spending cap held
with the worst cases of its requests in flight (402 naming the key's limit), allowed aliases (another is
404 as an unknown model is, and the model list shows only its own), an expiry date (401); the Warsaw
month boundary; and `gateway key create` / `key limits` with the same flags."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from conftest import Gateway, assert_error, wait_for
from core import key_limits
from core.directory import Directory
from core.key_limits import Change
from core.keys import key_hash
from core.resp import RespClient
from core.cost import Prices
from extproc.hold import WorstCase
from extproc.store import Miss, Store

TINY = {"model": "polish-fast", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


def _key(gateway: Gateway, limits: Change, balance: int = 10_000_000) -> tuple[str, str, str]:
    """(org id, key id, key) of a fresh organisation whose one key has ``limits``."""
    async def go(a: Any) -> tuple[str, str, str]:
        org = await a.create_org("limits", balance)
        kid, key = await a.create_key(org, limits=limits)
        return org, kid, key
    return tuple(gateway.admin(go))  # type: ignore[return-value]


def _post(gateway: Gateway, key: str, body: dict[str, Any] = TINY, path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(gateway.v1 + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _spent(gateway: Gateway, kid: str) -> int:
    return int(gateway.sql("SELECT COALESCE(SUM(cost_micro_pln), 0)::bigint AS s FROM usage_records"
                           " WHERE key_id = $1", kid)[0]["s"])


def test_a_key_at_its_monthly_limit_gets_402_naming_the_limit_and_its_organisation_is_untouched(
        gateway: Gateway) -> None:
    org, kid, key = _key(gateway, Change(monthly_limit=20))  # 0.00002 PLN: a few tiny requests
    served = 0
    while True:
        r = _post(gateway, key)
        if r.status_code != 200:
            break
        served += 1
        assert served < 20
    err = assert_error(r, 402, "insufficient_quota", "insufficient_quota")
    assert "this API key's monthly spending limit of 0.00002 PLN" in err["message"], err
    assert served >= 1
    wait_for(lambda: gateway.usage_drained(org))
    assert 0 < _spent(gateway, kid) <= 20
    # the refusal is in the usage log at cost 0, and another key of the organisation is not limited
    refused = gateway.sql("SELECT status, error_code, cost_micro_pln FROM usage_records WHERE request_id = $1",
                          r.headers["x-request-id"])
    assert refused == [{"status": 402, "error_code": "insufficient_quota", "cost_micro_pln": 0}]
    _, other = gateway.admin(lambda a: a.create_key(org))
    assert _post(gateway, other).status_code == 200
    # once the key's spend reached the limit, even the smallest request is refused with the short message
    spent = _spent(gateway, kid)
    gateway.admin(lambda a: a.set_key_limits(kid, limits=Change(monthly_limit=spent)))
    err = assert_error(_post(gateway, key, {"model": "embed", "input": "x"}, "/embeddings"), 402,
                       "insufficient_quota", "insufficient_quota")
    assert err["message"].startswith("This API key has reached its monthly spending limit of 0.0000"), err
    # lifting the limit lets it through at once
    gateway.admin(lambda a: a.set_key_limits(kid, limits=Change(monthly_limit="none")))
    assert _post(gateway, key).status_code == 200


def test_concurrent_requests_never_spend_past_the_cap(gateway: Gateway) -> None:
    """The worst case of every request in flight is held against the key's cap in the admission's one
    round trip: however many come at once, what they are billed stays within the cap."""
    org, kid, key = _key(gateway, Change(monthly_limit=40))
    body = {**TINY, "sim": {"ttft_ms": 150}}
    with ThreadPoolExecutor(12) as pool:
        codes = [r.status_code for r in pool.map(lambda _: _post(gateway, key, body), range(12))]
    assert codes.count(200) >= 1 and codes.count(402) >= 1 and set(codes) == {200, 402}, codes
    wait_for(lambda: gateway.usage_drained(org))
    assert 0 < _spent(gateway, kid) <= 40
    held = gateway.redis(lambda r: r.hget(f"gw:ks:{kid}:{key_limits.month(time.time())}", "hold"))
    assert int(held) == 0  # every hold given back


def test_an_alias_the_key_may_not_use_is_404_as_an_unknown_model_and_the_list_shows_its_own(
        gateway: Gateway) -> None:
    org, kid, key = _key(gateway, Change(models=("polish-fast", "embed")))
    h = {"Authorization": f"Bearer {key}"}
    assert _post(gateway, key).status_code == 200
    assert _post(gateway, key, {"model": "embed", "input": "x"}, "/embeddings").status_code == 200
    denied = assert_error(_post(gateway, key, {**TINY, "model": "polish-pro"}), 404, "model_not_found",
                          "invalid_request_error", "model")
    unknown = assert_error(_post(gateway, key, {**TINY, "model": "no-such-model"}), 404, "model_not_found",
                           "invalid_request_error", "model")
    assert denied["message"] == unknown["message"]  # nothing tells an alias that exists from one that does not
    listed = httpx.get(gateway.v1 + "/models", headers=h)
    assert listed.status_code == 200
    assert sorted(m["id"] for m in listed.json()["data"]) == ["embed", "polish-fast"]
    assert httpx.get(gateway.v1 + "/models/embed", headers=h).status_code == 200
    one = assert_error(httpx.get(gateway.v1 + "/models/polish-pro", headers=h), 404, "model_not_found",
                       "invalid_request_error", "model")
    assert one["message"] == unknown["message"]
    # the refusal is logged (at cost 0); lifting the list opens every alias again
    assert gateway.sql("SELECT status, error_code, cost_micro_pln FROM usage_records WHERE request_id = $1",
                       denied["request_id"]) == [{"status": 404, "error_code": "model_not_found", "cost_micro_pln": 0}]
    gateway.admin(lambda a: a.set_key_limits(kid, limits=Change(models="none")))
    assert _post(gateway, key, {**TINY, "model": "polish-pro"}).status_code == 200
    # (the model list's authentication is kept half a second in each ext_proc: docs/interface.md section 3)
    wait_for(lambda: len(httpx.get(gateway.v1 + "/models", headers=h).json()["data"]) > 2, timeout=3)


def test_an_alias_the_key_may_not_use_is_404_whatever_else_is_wrong_with_the_request(gateway: Gateway) -> None:
    """An alias outside the key's list answers as a model that does not exist would, even where the
    request has another fault an existing alias would be told of (the wrong capability, an empty
    messages, a bad max_tokens): nothing tells the key which other aliases exist."""
    org, kid, key = _key(gateway, Change(models=("polish-fast",)))
    unknown = assert_error(_post(gateway, key, {**TINY, "model": "no-such-model"}), 404, "model_not_found",
                           "invalid_request_error", "model")
    for body, path in (({**TINY, "model": "embed"}, "/chat/completions"),
                       ({"model": "polish-pro", "messages": []}, "/chat/completions"),
                       ({**TINY, "model": "advanced", "max_tokens": 0}, "/chat/completions"),
                       ({"model": "polish-pro", "input": "x"}, "/embeddings"),
                       ({"model": "embed", "input": [1, 2]}, "/embeddings")):
        denied = assert_error(_post(gateway, key, body, path), 404, "model_not_found", "invalid_request_error",
                              "model")
        assert denied["message"] == unknown["message"], (body, denied)
    # the key's own alias still has its faults told as they are
    assert_error(_post(gateway, key, {"model": "polish-fast", "input": "x"}, "/embeddings"), 400,
                 "invalid_request", "invalid_request_error", "model")
    assert_error(_post(gateway, key, {"model": "polish-fast", "messages": []}), 400, "invalid_request",
                 "invalid_request_error", "messages")


def test_an_expired_key_is_401_everywhere(gateway: Gateway) -> None:
    today = dt.datetime.now(key_limits.WARSAW).date()
    org, kid, key = _key(gateway, Change(expires=today))  # works through today
    assert _post(gateway, key).status_code == 200
    gateway.admin(lambda a: a.set_key_limits(kid, limits=Change(expires=today - dt.timedelta(days=1))))
    assert_error(_post(gateway, key), 401, "invalid_api_key", "authentication_error")
    assert_error(httpx.get(gateway.v1 + "/models", headers={"Authorization": f"Bearer {key}"}), 401,
                 "invalid_api_key", "authentication_error")
    gateway.admin(lambda a: a.set_key_limits(kid, limits=Change(expires="none")))
    assert _post(gateway, key).status_code == 200


def test_the_month_is_warsaws_and_a_new_month_starts_from_its_own_spend(gateway: Gateway) -> None:
    """Spend counts by the Warsaw calendar month the request started in: 23:30 UTC on 31 October 2025 is
    already November in Warsaw.  A key at its cap in one month is admitted in the next: Redis's counter of
    that month, missing, is filled from PostgreSQL's usage records (the store driven as the ext_proc drives
    it, at those moments)."""
    org, kid, key = _key(gateway, Change(monthly_limit=1000))
    oct_end = dt.datetime(2025, 10, 31, 22, 30, tzinfo=dt.timezone.utc).timestamp()  # 23:30 CET, October
    nov_start = dt.datetime(2025, 10, 31, 23, 30, tzinfo=dt.timezone.utc).timestamp()  # 00:30 CET, November
    assert (key_limits.month(oct_end), key_limits.month(nov_start)) == ("2025-10", "2025-11")
    for rid, at, cost in (("oct", oct_end, 700), ("nov", nov_start, 300)):
        gateway.sql("INSERT INTO usage_records (request_id, org_id, key_id, alias, upstream_model, endpoint, status,"
                    " stream, prompt_tokens, completion_tokens, estimated, cost_micro_pln, input_price, output_price,"
                    " started_at, ended_at) VALUES ($1, $2, $3, 'polish-fast', 'up-fast', 'chat', 200, false, 1, 1,"
                    " false, $4, 1, 1, to_timestamp($5), to_timestamp($5))", f"{kid}-{rid}", org, kid, cost, at)
    worst = WorstCase(1, 1, 400, Prices(0, 1_000_000))  # 400 micro-PLN at most

    async def go() -> list[Any]:
        import asyncpg
        pool = await asyncpg.create_pool(gateway.stack.database_url, min_size=1, max_size=1)
        r = aioredis.from_url(gateway.stack.redis_url)
        fast = RespClient.from_url(gateway.stack.redis_url)
        store = Store(r, fast, default_rpm=1000, default_concurrency=100, lease_s=60, key_ttl_s=60)
        d = Directory(pool)
        seen: list[Any] = []
        try:
            for at in (oct_end, nov_start):
                rid = f"{kid}-{at}"
                while True:
                    try:
                        adm = await store.admit(key_hash(key), rid, limits=True, alias="polish-fast", now=at,
                                                pending="test|{}", hold=worst)
                        break
                    except Miss as m:  # filled from PostgreSQL as the ext_proc fills it
                        if m.what == "key":
                            await store.fill_key(key_hash(key), await d.key(key_hash(key)))
                        elif m.what == "org":
                            await store.fill_org(org, await d.org(org))
                        else:
                            seen.append((m.what, m.month))
                            await store.fill_spend(org, kid, m.month, await d.key_spend(org, kid, at))
                seen.append(None if adm.error is None else adm.error.message)
                await store.cancel(rid)
            return seen
        finally:
            await fast.close()
            await r.aclose()
            await pool.close()

    seen = asyncio.run(go())
    # October: 700 spent, a worst case of 400 more than the 300 left; November: 300 spent, it fits
    assert seen[0] == ("spend", "2025-10")
    assert seen[1].startswith("This request could cost up to 0.000400 PLN, more than the 0.000300 PLN left"), seen
    assert "this API key's monthly spending limit of 0.001 PLN" in seen[1]
    assert seen[2:] == [("spend", "2025-11"), None]
    counters = gateway.redis(lambda r: [r.hgetall(f"gw:ks:{kid}:2025-{m}") for m in ("10", "11")])
    assert counters == [{b"spent": b"700"}, {b"spent": b"300", b"hold": b"0"}]  # the hold given back


def test_cli_create_and_limits_with_the_same_flags(gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from control import cli
    s = gateway.stack.s
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    for k, v in {"GATEWAY_PORT": str(s.gateway_port), "GATEWAY_STATE_DIR": str(s.state), "GATEWAY_CATALOG": s.catalog,
                 "GATEWAY_METRICS_PORT": str(s.metrics_http_port)}.items():
        monkeypatch.setenv(k, v)

    def run(*args: str) -> tuple[int, str, str]:
        """The `gateway` command's entry point, in this process (a traceback would fail the test)."""
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    def j(*args: str) -> Any:
        code, out, err = run("--json", *args)
        assert code == 0, err
        return json.loads(out)

    org = gateway.new_org()[0]
    made = j("key", "create", org, "--monthly-limit", "12.5", "--models", "polish-fast,embed", "--expires", "2099-12-31")
    assert made["key"].startswith("sk-service-")
    assert {k: made[k] for k in ("monthly_limit_micro_pln", "monthly_limit_pln", "models", "expires",
                                 "spent_this_month_micro_pln")} == {
        "monthly_limit_micro_pln": 12_500_000, "monthly_limit_pln": "12.500000", "models": ["polish-fast", "embed"],
        "expires": "2099-12-31", "spent_this_month_micro_pln": 0}
    kid = made["id"]
    row = gateway.sql("SELECT monthly_limit_micro_pln, models, expires_at FROM api_keys WHERE id = $1", kid)[0]
    # the last day it works is 31 December in Warsaw: it stops at midnight there (23:00 UTC in winter)
    assert row["expires_at"] == dt.datetime(2099, 12, 31, 23, 0, tzinfo=dt.timezone.utc)
    assert row["monthly_limit_micro_pln"] == 12_500_000 and row["models"] == ["polish-fast", "embed"]
    assert _post(gateway, made["key"]).status_code == 200

    code, text, err = run("key", "limits", kid, "--models", "none", "--monthly-limit", "3")
    assert code == 0, err
    assert "monthly limit 3.000000 PLN" in text and "models        none" in text
    assert "expires       2099-12-31" in text and "spent         0.0000" in text
    lifted = j("key", "limits", kid, "--monthly-limit", "none", "--expires", "none", "--rpm", "5")
    assert (lifted["monthly_limit_micro_pln"], lifted["models"], lifted["expires"], lifted["rpm"]) == (None, None, None, 5)
    assert lifted["spent_this_month_micro_pln"] > 0  # the request above
    assert j("key", "list", org)[0]["monthly_limit_micro_pln"] is None
    for args, says in ((["--monthly-limit", "0"], "more than 0 PLN"), (["--expires", "31.12.2099"], "YYYY-MM-DD"),
                       ([], "give at least one of --rpm"),
                       # a mistyped alias would leave the key no model: refused, with the catalog's aliases
                       (["--models", "polish-fast,polsh-pro"], "no such model alias: polsh-pro (the catalog has: "
                        "advanced, dead-alias, embed, empty-alias, polish-fast, polish-pro)")):
        code, out, err = run("key", "limits", kid, *args)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (args, err)
    keys = j("key", "list", org)
    assert [k["models"] for k in keys if k["id"] == kid] == [None]  # (nothing was changed by the refused ones)
    code, out, err = run("key", "create", org, "--models", "polsh-pro")
    assert code == 2 and "no such model alias: polsh-pro" in err, err
    assert len(j("key", "list", org)) == len(keys)  # no key made


def test_what_the_flags_and_the_console_take() -> None:
    """The values `gateway key create` / `key limits` take, and the words a wrong one gets (the CLI prints
    them and exits 2, as above)."""
    assert key_limits.parse("12.5", "a, b,a", "2099-12-31") == Change(12_500_000, ("a", "b"), dt.date(2099, 12, 31))
    assert key_limits.parse("NONE", "none", "none") == Change("none", "none", "none")
    assert key_limits.parse(None, None, None).empty
    assert key_limits.parse(None, "b, a", None, {"a", "b"}).models == ("b", "a")
    for args, says in ((("0", None, None), "more than 0 PLN"), (("x", None, None), "not an amount"),
                       ((None, " , ", None), "at least one model alias"), ((None, "a b", None), "a model alias is"),
                       ((None, None, "31.12.2099"), "YYYY-MM-DD"), ((None, "a,c", None, ("a", "b")),
                       "no such model alias: c (the catalog has: a, b)")):
        try:
            key_limits.parse(*args)
        except ValueError as e:
            assert says in str(e), (args, e)
        else:
            raise AssertionError(f"{args} taken")


def test_a_journal_entry_naming_its_keys_month_reads_as_any_other() -> None:
    """The reaper reads the journal entries of a key with a cap ("hold/YYYY-MM") as it reads the others."""
    from extproc.store import _journal_entry
    for hold in ("400/2026-11", "400", "0/2026-11"):
        assert _journal_entry(f"key_1|org_1|{hold}|owner|{{\"a\":1}}") == ("key_1", "org_1", "owner", '{"a":1}')
    assert _journal_entry('key_1|org_1|owner|{"a":1}') == ("key_1", "org_1", "owner", '{"a":1}')  # before holds
