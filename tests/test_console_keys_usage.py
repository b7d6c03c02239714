"""Keys and usage pages over HTTP against the real stack: a key created in the console works with
the openai SDK through Envoy, is stored only as a hash, is refused within a second of revocation; its
requests appear on the usage page (live part, filters, totals, CSV) within seconds."""
from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import re
import time

import httpx
import openai

from conftest import Gateway, wait_for
from core.catalog import WARSAW
from test_console_support import ConsoleClient, signed_up

KEY = re.compile(r'id="new-key">(sk-service-[A-Za-z0-9]{40})<')


def create_key(c: ConsoleClient, name: str) -> tuple[str, str]:
    c.get("/keys")
    r = c.post("/keys", {"name": name})
    assert r.status_code == 200
    m = KEY.search(r.text)
    assert m, r.text
    kid = re.search(r'data-key="(key_[0-9a-f]+)"', r.text)
    assert kid
    return kid.group(1), m.group(1)


def test_key_lifecycle(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    kid, key = create_key(c, "production")
    row = gateway.sql("SELECT * FROM api_keys WHERE id = $1", kid)[0]
    assert row["org_id"] == org and row["name"] == "production" and row["revoked_at"] is None
    assert row["key_hash"] == hashlib.sha256(key.encode()).hexdigest()
    page = c.get("/keys").text
    assert key not in page and "production" in page and key[:15] in page and "never" in page  # shown once only
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    reply = client.chat.completions.create(model="polish-pro", messages=[{"role": "user", "content": "Dzień dobry"}])
    assert reply.model == "polish-pro"
    wait_for(lambda: "never" not in c.get("/keys").text, timeout=10)  # last used
    r = c.post(f"/keys/{kid}/revoke", follow=True)
    assert "revoked" in r.text
    t0 = time.monotonic()
    with httpx.Client(timeout=10) as h:
        while True:
            r = h.post(gateway.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "polish-pro", "messages": [{"role": "user", "content": "x"}]})
            if r.status_code == 401:
                break
            assert time.monotonic() - t0 < 1.0, "the gateway still accepts a revoked key"
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert c.post("/keys", {"name": ""}).status_code == 400


def test_usage_page_filters_totals_and_csv(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    k1, key1 = create_key(c, "first")
    k2, key2 = create_key(c, "second")
    c1 = openai.OpenAI(base_url=gateway.v1, api_key=key1, max_retries=0)
    c2 = openai.OpenAI(base_url=gateway.v1, api_key=key2, max_retries=0)
    ids = [c1.chat.completions.with_raw_response.create(model="polish-pro", messages=[{"role": "user", "content": "a"}]),
           c1.chat.completions.with_raw_response.create(model="polish-fast", messages=[{"role": "user", "content": "b"}]),
           c2.chat.completions.with_raw_response.create(model="polish-pro", messages=[{"role": "user", "content": "c"}])]
    rids = [r.headers["x-request-id"] for r in ids]
    c.get("/usage")
    live = wait_for(lambda: (lambda t: t if all(i in t for i in rids) else None)(c.get("/usage/live").text), timeout=10)
    rows = gateway.sql("SELECT request_id, cost_micro_pln, prompt_tokens, started_at FROM usage_records"
                       " WHERE org_id = $1", org)
    assert sorted(r["request_id"] for r in rows) == sorted(rids)
    # Newest first, ties broken by request id: the page's order, which cannot tie.  Computed here from the
    # stored timestamps, not assumed from the order the requests were sent (back-to-back requests can
    # share a timestamp, or come within the clock's resolution).
    newest_first = [r["request_id"] for r in sorted(sorted(rows, key=lambda r: r["request_id"]),
                                                    key=lambda r: r["started_at"], reverse=True)]
    assert sorted(live.index(i) for i in rids) == [live.index(i) for i in newest_first]
    total = sum(r["cost_micro_pln"] for r in rows)
    assert f"PLN\xa0{total // 1_000_000}.{total % 1_000_000:06d}" in live  # usage: to the micro-PLN
    page = c.get("/usage?alias=polish-fast").text
    assert rids[1] in page and rids[0] not in page and rids[2] not in page
    page = c.get(f"/usage?key={k2}").text
    assert rids[2] in page and rids[0] not in page
    today = dt.datetime.now(WARSAW).date()  # the From and To dates are Warsaw days
    assert rids[0] in c.get(f"/usage?from={today}&to={today}").text
    assert rids[0] not in c.get(f"/usage?to={today - dt.timedelta(days=1)}").text
    assert "<svg class=\"chart\"" in c.get("/usage").text
    r = c.get(f"/usage.csv?key={k1}")
    assert r.headers["content-type"].startswith("text/csv")
    got = list(csv.DictReader(io.StringIO(r.text)))
    assert [g["request_id"] for g in got] == [i for i in newest_first if i in rids[:2]]
    assert {g["key_name"] for g in got} == {"first"}
    by_id = {g["request_id"]: g for g in got}
    assert by_id[rids[1]]["alias"] == "polish-fast" and by_id[rids[0]]["alias"] == "polish-pro"
    assert {g["estimated"] for g in got} == {"no"}
    costs = {r["request_id"]: r["cost_micro_pln"] for r in rows}
    assert all(int(g["cost_micro_pln"]) == costs[g["request_id"]] for g in got)


def test_estimated_requests_are_marked(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    kid, _ = create_key(c, "k")
    gateway.sql("INSERT INTO usage_records (request_id, org_id, key_id, alias, upstream_model, endpoint, status,"
                " stream, prompt_tokens, completion_tokens, estimated, cost_micro_pln, input_price, output_price,"
                " started_at, ended_at) VALUES ('req-est-' || $1, $1, $2, 'polish-pro', 'up-pro', 'chat', 200, true,"
                " 7, 3, true, 20, 1500000, 3000000, now(), now())", org, kid)
    page = c.get("/usage").text
    row = page[page.index("req-est-" + org):]
    assert "estimated" in row[:row.index("</tr>")]


def test_no_key_password_or_token_in_any_log(gateway: Gateway) -> None:
    from test_console_support import PASSWORD, mail_link
    c, email, _ = signed_up(gateway)
    kid, key = create_key(c, "logged?")
    rid = httpx.post(gateway.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                     json={"model": "polish-pro", "messages": [{"role": "user", "content": "x"}]},
                     timeout=30).headers["x-request-id"]
    c.get("/reset")
    c.post("/reset", {"email": email})
    reset = mail_link(gateway, email, "/reset/")
    c.get(reset)
    c.post(reset, {"password": "a new password 123"})
    confirm_tokens = [m.split("/confirm/")[1].split()[0] for m in
                      (x["body"] for x in httpx.get(gateway.console + "/dev/mail.json", params={"to": email}).json())
                      if "/confirm/" in m]
    secrets_ = [key, key[15:], PASSWORD, "a new password 123", reset.rsplit("/", 1)[1], *confirm_tokens,
                c.jar.get("gw_anon", "-")]
    # the logs have caught up: Envoy's access log (flushed about once a second) has the request, the
    # console's log the last action; only then is the absence of every secret worth asserting
    logs = gateway.stack.logs
    wait_for(lambda: rid in (logs / "envoy-access.log").read_text(errors="replace")
             and "POST /reset/{token}" in (logs / "console.log").read_text(), timeout=15)
    for f in logs.glob("*.log"):
        text = f.read_text(errors="replace")
        found = [s[:12] for s in secrets_ if s and s in text]
        assert not found, (f.name, found)


def test_a_reload_never_creates_a_second_key(gateway: Gateway) -> None:
    """The key form is sent again by a reload of the page that showed the new key: it is turned away
    (303 with a message), nothing is created; a fresh form creates a key.  The new key's page is not cached."""
    c, _, org = signed_up(gateway)
    c.get("/keys")
    form_id = c.form_id
    first = c.post("/keys", {"name": "once"})
    assert first.status_code == 200 and KEY.search(first.text) and first.headers["cache-control"] == "no-store"
    again = c.post("/keys", {"name": "once", "form_id": form_id})  # what a reload sends
    assert again.status_code == 303 and again.headers["location"] == "/keys?msg=key_form_used"
    assert "nothing new was created" in c.get(again.headers["location"]).text
    assert c.post("/keys", {"name": "forged", "form_id": ""}).status_code == 303  # no form, no key
    assert [r["name"] for r in gateway.sql("SELECT name FROM api_keys WHERE org_id = $1", org)] == ["once"]
    c.get("/keys")
    assert c.form_id != form_id and c.post("/keys", {"name": "second"}).status_code == 200
    assert sorted(r["name"] for r in gateway.sql("SELECT name FROM api_keys WHERE org_id = $1", org)) == [
        "once", "second"]


def test_the_new_key_page_shows_first_call_snippets(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    kid, key = create_key(c, "snippets")
    page = c.last.text
    for sid in ("snippet-curl", "snippet-python", "snippet-js"):
        block = re.search(rf'<pre id="{sid}">(.*?)</pre>', page, re.S)
        assert block and key in block.group(1) and "polish-pro" in block.group(1) and gateway.v1 in block.group(1), sid
    assert 'href="/docs/api"' in page and 'data-copy="new-key"' in page
    overview = c.get("/").text
    assert 'id="trial"' in overview and "trial credit of PLN\xa05.00" in overview
