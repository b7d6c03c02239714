"""A key's own limits in the console against the real stack: an owner sets and lifts them on a labelled
form (both languages), the Keys page shows them with the key's spend this month, the gateway applies
them at once, a member cannot reach the form, and a key near its limit mails the owners once a month."""
from __future__ import annotations

import datetime as dt
import re

import httpx

from conftest import Gateway, assert_error, wait_for
from core.catalog import WARSAW
from test_console_keys_usage import create_key
from test_console_support import mails, signed_up

TINY = {"model": "polish-fast", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


def _chat(gateway: Gateway, key: str, model: str = "polish-fast") -> httpx.Response:
    return httpx.post(gateway.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={**TINY, "model": model}, timeout=30)


def test_an_owner_sets_and_lifts_a_keys_limits_and_the_gateway_applies_them(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    kid, key = create_key(c, "limited")
    form = c.get(f"/keys/{kid}/limits").text
    for field in ("limit", "expires"):  # every field has a visible label tied to it
        assert re.search(f'<label for="{field}">[^<]+</label>', form) and f'id="{field}"' in form, field
    assert "<legend>Models it may use (none ticked: every model)</legend>" in form
    assert '<input type="checkbox" name="models" value="polish-fast" >' in form

    bad = c.post(f"/keys/{kid}/limits", {"limit": "0", "expires": ""})
    assert bad.status_code == 400 and "Enter a monthly limit from" in bad.text
    bad = c.post(f"/keys/{kid}/limits", {"limit": "", "expires": "soon"})
    assert bad.status_code == 400 and "Enter the expiry date as DD/MM/YYYY" in bad.text
    bad = c.post(f"/keys/{kid}/limits", {"limit": "", "models": ["polish-fast", "no-such-model"], "expires": ""})
    assert bad.status_code == 400 and "Choose models from the list." in bad.text  # only the aliases it lists
    assert gateway.sql("SELECT monthly_limit_micro_pln, models, expires_at FROM api_keys WHERE id = $1", kid) == [
        {"monthly_limit_micro_pln": None, "models": None, "expires_at": None}]

    r = c.post(f"/keys/{kid}/limits", {"limit": "12.50", "models": "polish-fast", "expires": "31/12/2099"})
    assert r.status_code == 303 and r.headers["location"] == "/keys?msg=key_limits_saved"
    row = gateway.sql("SELECT monthly_limit_micro_pln, models, expires_at FROM api_keys WHERE id = $1", kid)
    # it works through 31 December in Warsaw: it stops at midnight there
    assert row == [{"monthly_limit_micro_pln": 12_500_000, "models": ["polish-fast"],
                    "expires_at": dt.datetime(2100, 1, 1, tzinfo=WARSAW)}]
    assert _chat(gateway, key).status_code == 200
    assert_error(_chat(gateway, key, "polish-pro"), 404, "model_not_found", "invalid_request_error", "model")

    def shown() -> str:
        page = c.get("/keys").text
        return page[page.index(f'data-key="{kid}"'):].split("</tr>")[0]
    row_html = wait_for(lambda: (lambda h: h if "0.00" in h and "(0%)" in h else None)(shown()))
    assert "PLN\xa012.50 a month" in row_html and "models: polish-fast" in row_html
    assert "until 31 Dec 2099" in row_html and f'href="/keys/{kid}/limits"' in row_html
    assert 'value="12.50"' in c.get(f"/keys/{kid}/limits").text

    r = c.post(f"/keys/{kid}/limits", {"limit": "", "expires": ""})  # nothing ticked, nothing typed: no limits
    assert r.status_code == 303
    assert gateway.sql("SELECT monthly_limit_micro_pln, models, expires_at FROM api_keys WHERE id = $1", kid) == [
        {"monthly_limit_micro_pln": None, "models": None, "expires_at": None}]
    assert _chat(gateway, key, "polish-pro").status_code == 200
    assert "none" in shown()

    # Polish: the same form in the page's language
    pl, _, _ = signed_up(gateway, lang="pl")
    pl_kid, _ = create_key(pl, "pl")
    assert '<label for="limit">Limit miesięczny w złotych</label>' in pl.get(f"/keys/{pl_kid}/limits").text


def test_a_member_cannot_reach_the_limits_and_another_organisations_key_is_not_there(gateway: Gateway) -> None:
    owner, _, _ = signed_up(gateway)
    kid, _ = create_key(owner, "theirs")
    c, email, org = signed_up(gateway)
    mine, _ = create_key(c, "mine")
    assert c.get(f"/keys/{kid}/limits").status_code == 404  # not of this organisation
    assert c.post(f"/keys/{kid}/limits", {"limit": "1"}).status_code == 404
    gateway.sql("UPDATE memberships SET role = 'member' WHERE org_id = $1", org)
    assert c.get(f"/keys/{mine}/limits").status_code == 403
    assert c.post(f"/keys/{mine}/limits", {"limit": "1"}).status_code == 403
    assert "/limits" not in c.get("/keys").text  # a member sees the limits, not the link to change them
    assert gateway.sql("SELECT monthly_limit_micro_pln FROM api_keys WHERE id = ANY($1::text[])", [kid, mine]) == [
        {"monthly_limit_micro_pln": None}, {"monthly_limit_micro_pln": None}]


def test_a_key_near_its_monthly_limit_mails_the_owners_once(gateway: Gateway) -> None:
    c, email, org = signed_up(gateway)
    kid, key = create_key(c, "busy")
    assert c.post(f"/keys/{kid}/limits", {"limit": "0.01", "expires": ""}).status_code == 303  # 10 000 micro-PLN
    near = lambda: [m for m in mails(gateway, email) if m["subject"].startswith("API key near")]  # noqa: E731
    assert _chat(gateway, key).status_code == 200
    # a limit of 1 micro-PLN, under what the key spent (the gateway's cache of the key is not the watcher's)
    gateway.sql("UPDATE api_keys SET monthly_limit_micro_pln = 1 WHERE id = $1", kid)
    first = wait_for(near, timeout=10)
    assert len(first) == 1 and "busy" in first[0]["subject"]
    assert f"{gateway.console}/keys/{kid}/limits" in first[0]["body"] and "once a month" in first[0]["body"]
    month = gateway.sql("SELECT limit_mailed_month FROM api_keys WHERE id = $1", kid)[0]["limit_mailed_month"]
    assert re.fullmatch(r"\d{4}-\d{2}", month)
    # later passes (every 0.3 s in the test stack) send nothing more this month; a second key's mail is the
    # positive event waited for
    other, other_key = create_key(c, "other")
    assert c.post(f"/keys/{other}/limits", {"limit": "0.01", "expires": ""}).status_code == 303
    assert _chat(gateway, other_key).status_code == 200
    gateway.sql("UPDATE api_keys SET monthly_limit_micro_pln = 1 WHERE id = $1", other)
    wait_for(lambda: len(near()) == 2, timeout=10)
    assert sorted(m["subject"] for m in near()) == ["API key near its monthly limit: busy",
                                                   "API key near its monthly limit: other"]
