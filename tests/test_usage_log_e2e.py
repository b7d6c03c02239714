"""The usage log lists every authenticated chat and embeddings request: refusals and
failures too, each with the status and error code the client got, at no cost, within 2 s; the
balance and the ledger are untouched by them.  Checked in PostgreSQL, on the console's usage page
(status filter, request-id search, date checks), in its CSV and through ``gateway usage``."""
from __future__ import annotations

import csv
import datetime as dt
import io
import json
from typing import Any

import httpx

from conftest import Gateway, assert_error, rate_window_with, wait_for
from test_cli_e2e import gw_cli
from test_console_keys_usage import create_key
from test_console_support import signed_up

MSGS = [{"role": "user", "content": "Dzień dobry"}]


def _post(gw: Gateway, key: str, body: Any, path: str = "/chat/completions", **kw: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(gw.v1 + path, content=content, timeout=kw.pop("timeout", 30),
                      headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}, **kw)


def _logged(gw: Gateway, rids: list[str]) -> dict[str, dict[str, Any]]:
    """The rows of these requests, waited for up to 2 s (the interface: within seconds; here: 2 s)."""
    rows = wait_for(lambda: (lambda got: got if len(got) == len(rids) else None)(
        gw.sql("SELECT *, (extract(epoch FROM ended_at - started_at) * 1000)::int AS latency_ms"
               " FROM usage_records WHERE request_id = ANY($1)", rids)), timeout=2.0, interval=0.02,
        describe=lambda: gw.sql("SELECT request_id, status FROM usage_records WHERE request_id = ANY($1)", rids))
    return {r["request_id"]: r for r in rows}


def _ledger(gw: Gateway, org: str) -> list[dict[str, Any]]:
    return gw.sql("SELECT kind, amount_micro_pln FROM ledger WHERE org_id = $1 ORDER BY created_at", org)


def test_every_refusal_and_failure_is_listed_at_no_cost(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org()
    ledger_before = _ledger(gateway, org)
    rate_window_with()
    gateway.admin(lambda a: a.set_key_limits(kid, 6))
    sent: list[tuple[httpx.Response, int, str, str]] = []  # (reply, status, code, endpoint)

    def expect(r: httpx.Response, status: int, code: str, type_: str, param: str | None = None,
               endpoint: str = "chat") -> None:
        assert_error(r, status, code, type_, param)
        sent.append((r, status, code, endpoint))

    expect(_post(gateway, key, b'{"model": "polish-pro", "messages": ['), 400, "invalid_json", "invalid_request_error")
    expect(_post(gateway, key, {"model": "gpt-4o", "messages": MSGS}), 404, "model_not_found",
           "invalid_request_error", "model")
    expect(_post(gateway, key, {"model": "embed", "input": []}, "/embeddings"), 400, "invalid_request",
           "invalid_request_error", "input", endpoint="embeddings")
    expect(_post(gateway, key, {"model": "polish-pro", "messages": MSGS, "sim": {"status": 503}}), 502,
           "upstream_unavailable", "upstream_error")
    # 6 per minute for this key; refusals on the way in do not count, the model server's failure does
    served = [_post(gateway, key, {"model": "polish-pro", "messages": MSGS}) for _ in range(5)]
    assert [x.status_code for x in served] == [200] * 5
    expect(_post(gateway, key, {"model": "polish-pro", "messages": MSGS}), 429, "rate_limit_exceeded",
           "rate_limit_error")

    rows = _logged(gateway, [x[0].headers["x-request-id"] for x in sent] + [x.headers["x-request-id"] for x in served])
    for reply, status, code, endpoint in sent:
        row = rows[reply.headers["x-request-id"]]
        assert (row["org_id"], row["key_id"], row["endpoint"], row["status"], row["error_code"]) == (
            org, kid, endpoint, status, code), row
        assert (row["prompt_tokens"], row["completion_tokens"], row["cost_micro_pln"], row["estimated"]) == (
            0, 0, 0, False), row
        assert row["latency_ms"] >= 0
    assert rows[sent[3][0].headers["x-request-id"]]["alias"] == "polish-pro"  # the alias was known
    assert rows[sent[0][0].headers["x-request-id"]]["alias"] == ""  # no alias: the body was not JSON
    good = [rows[x.headers["x-request-id"]] for x in served]
    assert all(g["status"] == 200 and g["error_code"] is None and g["cost_micro_pln"] > 0 for g in good)
    # only the served requests touched the ledger (and, through it, the balance)
    assert sorted(x["amount_micro_pln"] for x in _ledger(gateway, org)[len(ledger_before):]) == sorted(
        -g["cost_micro_pln"] for g in good)
    assert gateway.admin(lambda a: a.balance(org))["ledger_micro_pln"] == 10_000_000 - sum(
        g["cost_micro_pln"] for g in good)


def test_suspended_and_unfunded_organisations_see_their_refusals(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org(0)
    r402 = _post(gateway, key, {"model": "polish-pro", "messages": MSGS})
    assert_error(r402, 402, "insufficient_quota", "insufficient_quota")
    gateway.admin(lambda a: a.set_status(org, "suspended"))
    r403 = wait_for(lambda: (lambda r: r if r.status_code == 403 else None)(
        _post(gateway, key, {"model": "embed", "input": "x"}, "/embeddings")))
    assert_error(r403, 403, "org_suspended", "permission_error")
    rows = _logged(gateway, [r402.headers["x-request-id"], r403.headers["x-request-id"]])
    assert [(rows[r.headers["x-request-id"]]["status"], rows[r.headers["x-request-id"]]["error_code"],
             rows[r.headers["x-request-id"]]["cost_micro_pln"]) for r in (r402, r403)] == [
        (402, "insufficient_quota", 0), (403, "org_suspended", 0)]
    assert _ledger(gateway, org) == [] or all(x["kind"] != "usage" for x in _ledger(gateway, org))


def test_a_client_that_leaves_is_listed_as_499(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org()
    rid = "client-leaves"
    try:
        _post(gateway, key, {"model": "polish-pro", "messages": MSGS, "sim": {"ttft_ms": 2000}}, timeout=0.5)
    except httpx.TimeoutException:
        pass
    else:
        raise AssertionError("the slow reply came within the client's timeout")
    row = wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE org_id = $1", org), timeout=10)[0]
    assert row["status"] == 499 and row["estimated"] is True and row["error_code"] is None, (rid, row)


def test_an_unknown_key_is_not_listed(gateway: Gateway) -> None:
    """A 401 has no organisation to list it under."""
    r = _post(gateway, "sk-service-" + "0" * 40, {"model": "polish-pro", "messages": MSGS})
    assert_error(r, 401, "invalid_api_key", "authentication_error")
    org, _, key = gateway.new_org()
    later = _post(gateway, key, {"model": "polish-pro", "messages": MSGS})
    _logged(gateway, [later.headers["x-request-id"]])  # the writer is past the 401
    assert gateway.sql("SELECT 1 FROM usage_records WHERE request_id = $1", r.headers["x-request-id"]) == []


def test_console_csv_and_cli_filter_by_status_and_find_a_request(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    kid, key = create_key(c, "logs")
    ok = _post(gateway, key, {"model": "polish-fast", "messages": MSGS})
    bad = _post(gateway, key, {"model": "nope", "messages": MSGS})
    assert ok.status_code == 200 and bad.status_code == 404
    ok_id, bad_id = ok.headers["x-request-id"], bad.headers["x-request-id"]
    _logged(gateway, [ok_id, bad_id])

    page = c.get("/usage").text
    assert ok_id in page and bad_id in page and "model_not_found" in page and "Latency" in page
    errors = c.get("/usage?status=errors").text
    assert bad_id in errors and ok_id not in errors
    only_ok = c.get("/usage?status=ok").text
    assert ok_id in only_ok and bad_id not in only_ok
    assert bad_id in c.get("/usage?status=404").text and bad_id not in c.get("/usage?status=429").text
    found = c.get(f"/usage?request_id={bad_id}").text  # the request_id of an error reply finds its row
    assert bad_id in found and ok_id not in found
    live = c.get(f"/usage/live?request_id={ok_id}").text
    assert ok_id in live and bad_id not in live

    # dates and filters that cannot be read get a clear message, not an empty page
    today = dt.datetime.now(dt.timezone.utc).date()
    r = c.get(f"/usage?from={today}&to={today - dt.timedelta(days=3)}")
    assert r.status_code == 400 and "The From date is after the To date." in r.text
    r = c.get("/usage?from=2026-02-31")
    assert r.status_code == 400 and "The From date is not a date" in r.text
    r = c.get("/usage?status=abc")
    assert r.status_code == 400 and "Unknown status filter." in r.text
    assert c.get(f"/usage.csv?from={today}&to={today - dt.timedelta(days=1)}").status_code == 400

    got = list(csv.DictReader(io.StringIO(c.get("/usage.csv?status=errors").text)))
    assert [(g["request_id"], g["status"], g["error_code"], g["cost_micro_pln"]) for g in got] == [
        (bad_id, "404", "model_not_found", "0")]
    assert int(got[0]["latency_ms"]) >= 0
    both = {g["request_id"]: g for g in csv.DictReader(io.StringIO(c.get("/usage.csv").text))}
    assert set(both) == {ok_id, bad_id} and both[ok_id]["error_code"] == ""

    r = gw_cli(gateway, "--json", "usage", org, "--status", "errors")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["request_id"], x["status"], x["error_code"], x["cost_micro_pln"]) for x in rows] == [
        (bad_id, 404, "model_not_found", 0)]
    r = gw_cli(gateway, "--json", "usage", org, "--request-id", ok_id)
    assert [x["request_id"] for x in json.loads(r.stdout)] == [ok_id]
    text = gw_cli(gateway, "usage", org).stdout
    assert bad_id in text and "model_not_found" in text and "Dzień" not in text
    r = gw_cli(gateway, "usage", org, "--status", "weird")
    assert r.returncode != 0 and "status must be ok, errors or a status code" in r.stderr
