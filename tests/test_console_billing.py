"""Billing over HTTP with the sandbox provider: a top-up is credited when the provider's signed
notification arrives — once, however often it arrives — and never on the browser's return alone."""
from __future__ import annotations

import re

import httpx

from conftest import Gateway, wait_for
from control.console.payments.sandbox import Sandbox
from test_console_support import ConsoleClient, signed_up

TRIAL = 5_000_000


def sandbox(gw: Gateway) -> Sandbox:
    return Sandbox((gw.stack.state / "console_secret").read_text().strip().encode(), gw.console)


def billing_details(c: ConsoleClient) -> None:
    """A private person's billing details, when the organisation has none yet (Pay needs them)."""
    if 'id="details-missing"' in c.get("/billing").text:
        r = c.post("/billing/details", {"person": "1", "name": "Jan Kowalski", "address": "ul. Krótka 2, 30-001 Kraków"})
        assert r.status_code == 303, r.text[-500:]


def start_topup(c: ConsoleClient, amount: str) -> str:
    billing_details(c)
    r = c.post("/billing/topup", {"amount": amount})
    assert r.status_code == 303
    m = re.fullmatch(r".*/sandbox/pay/(pay_[0-9a-f]+)", r.headers["location"])
    assert m, r.headers["location"]
    return m.group(1)


def balance(gw: Gateway, org: str) -> int:
    return int(gw.admin(lambda a: a.balance(org))["balance_micro_pln"])


def test_topup_through_the_sandbox_provider(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    page = c.get("/billing").text
    assert 'id="balance">PLN\xa05.00<' in page and "trial credit" in page and "polish-pro" in page
    # the trial credit alone: the credit limit is 0 (docs/billing.md)
    assert 'id="credit-limit">PLN\xa00.00<' in page and "largest possible cost fits the balance." in page
    assert "PLN\xa01.500000" in page  # a price per 1M tokens: to the micro-PLN
    pid = start_topup(c, "20")
    assert gateway.sql("SELECT status, amount_micro_pln, provider FROM payments WHERE id = $1", pid) == [
        {"status": "pending", "amount_micro_pln": 20_000_000, "provider": "sandbox"}]
    # the browser coming back alone credits nothing
    r = c.get(f"/billing/return/{pid}")
    assert "Waiting for the payment provider" in r.text and balance(gateway, org) == TRIAL
    c.get(f"/sandbox/pay/{pid}")
    r = c.post(f"/sandbox/pay/{pid}", {"action": "pay"})
    assert r.status_code == 303 and r.headers["location"] == f"/billing/return/{pid}"
    wait_for(lambda: balance(gateway, org) == TRIAL + 20_000_000, timeout=10)
    assert gateway.sql("SELECT status FROM payments WHERE id = $1", pid)[0]["status"] == "paid"
    ledger = gateway.sql("SELECT amount_micro_pln, kind, ref FROM ledger WHERE org_id = $1 AND kind = 'topup'", org)
    assert ledger == [{"amount_micro_pln": 20_000_000, "kind": "topup", "ref": f"sandbox:{pid}"}]
    page = c.get(f"/billing?payment={pid}").text
    assert "Payment of PLN\xa020.00 received" in page and 'id="balance">PLN\xa025.00<' in page
    # paid: the stack's default (none on the test stack), then the organisation's own
    assert 'id="credit-limit">none<' in page and "Requests are accepted while the balance is positive." in page
    gateway.admin(lambda a: a.set_credit_limit(org, 2_500_000))
    page = c.get("/billing").text
    assert 'id="credit-limit">PLN\xa02.50<' in page and "How far below zero the balance may go" in page


def test_notifications_are_verified_and_idempotent(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    pid = start_topup(c, "10")
    sb = sandbox(gateway)
    url = gateway.console + "/payments/notify/sandbox"
    good = sb.notification(pid, 10_000_000, True)
    forged = dict(good, sign="0" * 64)
    assert httpx.post(url, json=forged).status_code == 400
    wrong_amount = sb.notification(pid, 100_000_000, True)
    assert httpx.post(url, json=wrong_amount).status_code == 400
    assert httpx.post(url, json=sb.notification("pay_unknown", 10_000_000, True)).status_code == 400
    assert httpx.post(url, content=b"not json").status_code == 400
    assert httpx.post(gateway.console + "/payments/notify/p24", json=good).status_code == 404  # not configured
    assert balance(gateway, org) == TRIAL
    r1 = httpx.post(url, json=good)
    r2 = httpx.post(url, json=good)
    r3 = httpx.post(url, json=sb.notification(pid, 10_000_000, True))  # a second, differently signed delivery
    assert (r1.status_code, r2.status_code, r3.status_code) == (200, 200, 200)
    assert [r1.json()["credited"], r2.json()["credited"], r3.json()["credited"]] == [True, False, False]
    assert balance(gateway, org) == TRIAL + 10_000_000
    assert gateway.sql("SELECT count(*) AS n FROM ledger WHERE org_id = $1 AND kind = 'topup'", org)[0]["n"] == 1
    # a failure notification after payment changes nothing
    assert httpx.post(url, json=sb.notification(pid, 10_000_000, False)).json()["status"] == "paid"


def test_cancelled_payment_is_not_credited(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    pid = start_topup(c, "50")
    c.get(f"/sandbox/pay/{pid}")
    r = c.post(f"/sandbox/pay/{pid}", {"action": "cancel"}, follow=True)
    # one banner, neutral: not a green "cancelled" beside a red "did not go through"
    assert _banners(r.text) == [("unpaid", "The payment of PLN 50.00 was not completed: nothing was charged.")]
    assert 'id="retry"' in r.text and "refresh" not in r.text
    wait_for(lambda: gateway.sql("SELECT status FROM payments WHERE id = $1", pid)[0]["status"] == "failed", timeout=10)
    assert balance(gateway, org) == TRIAL
    assert _banners(c.get(f"/billing?payment={pid}").text)[0][0] == "unpaid"


def _banners(page: str) -> list[tuple[str, str]]:
    """(kind, text) of every banner on a page: the payment's and the generic message."""
    found = [(m.group(1), re.sub(r"\s+", " ", re.sub(r"<form.*?</form>", "", m.group(2), flags=re.S)).strip())  # \s: NBSP too
             for m in re.finditer(r'<div class="message ([a-z]+)" id="payment-state" role="status">(.*?)</div>', page, re.S)]
    found += [("message", m.group(1)) for m in re.finditer(r'<p class="message" role="status">(.*?)</p>', page)]
    return found


def test_a_pending_payment_can_be_cancelled_and_retried(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    pid = start_topup(c, "12,34")  # any amount in range, a decimal comma as Polish users write it
    page = c.get(f"/billing?payment={pid}").text
    assert [b[0] for b in _banners(page)] == ["pending"] and 'id="cancel-payment"' in page
    r = c.post(f"/billing/payment/{pid}/cancel", {})
    assert r.status_code == 303 and r.headers["location"] == f"/billing?payment={pid}"
    assert gateway.sql("SELECT status FROM payments WHERE id = $1", pid) == [{"status": "cancelled"}]
    assert _banners(c.get(r.headers["location"]).text) == [
        ("unpaid", "The payment of PLN 12.34 was not completed: nothing was charged.")]
    # retry: a new payment of the same amount, sent to the provider
    r = c.post(f"/billing/payment/{pid}/retry", {})
    assert r.status_code == 303
    new = re.fullmatch(r".*/sandbox/pay/(pay_[0-9a-f]+)", r.headers["location"])
    assert new and new.group(1) != pid
    assert gateway.sql("SELECT amount_micro_pln, status FROM payments WHERE id = $1", new.group(1)) == [
        {"amount_micro_pln": 12_340_000, "status": "pending"}]
    # a paid one is not retried, and a cancelled one the provider still reports paid is credited
    sb = sandbox(gateway)
    url = gateway.console + "/payments/notify/sandbox"
    assert httpx.post(url, json=sb.notification(pid, 12_340_000, True)).json() == {"status": "paid", "credited": True}
    assert balance(gateway, org) == TRIAL + 12_340_000
    assert c.post(f"/billing/payment/{pid}/retry", {}).headers["location"] == f"/billing?payment={pid}"
    other, _, _ = signed_up(gateway)
    other.get("/billing")
    assert other.post(f"/billing/payment/{pid}/cancel", {}).status_code == 404  # another organisation's


def test_topup_amount_is_validated(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    billing_details(c)
    for bad in ("0", "-5", "abc", "10000.01", "1.001"):
        assert c.post("/billing/topup", {"amount": bad}).status_code == 400, bad
    assert c.post("/billing/topup", {"amount": "12.50"}).status_code == 303
    assert gateway.sql("SELECT amount_micro_pln FROM payments WHERE org_id = $1", org) == [{"amount_micro_pln": 12_500_000}]


def test_balance_follows_usage(gateway: Gateway) -> None:
    """The console's balance is the gateway's live balance (trial, minus what requests cost)."""
    c, _, org = signed_up(gateway)
    c.get("/keys")
    key = re.search(r'id="new-key">([^<]+)<', c.post("/keys", {"name": "k"}).text)
    assert key
    r = httpx.post(gateway.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key.group(1)}"},
                   json={"model": "polish-pro", "messages": [{"role": "user", "content": "Dzień dobry"}]}, timeout=30)
    assert r.status_code == 200, r.text
    cost = wait_for(lambda: gateway.sql("SELECT cost_micro_pln FROM usage_records WHERE org_id = $1", org), timeout=10)
    left = TRIAL - cost[0]["cost_micro_pln"]
    page = c.get("/billing").text
    # the balance to the grosz, rounded down (never more than there is); the ledger's usage exact
    assert f'id="balance">PLN\xa0{left // 1_000_000}.{left % 1_000_000 // 10_000:02d}<' in page
    assert f"-PLN\xa00.{cost[0]['cost_micro_pln']:06d}" in page and "usage, 1 request that day" in page


def test_low_balance_email_once_per_fall_under_the_threshold(gateway: Gateway) -> None:
    """The owner sets a threshold; a fall under it mails the owners once (not again while it stays
    under); after a top-up lifts it back, the next fall mails again.  Bad thresholds are refused."""
    from test_console_support import mails
    c, email, org = signed_up(gateway)
    c.get("/billing")
    for bad in ("0", "-1", "abc", "100000.01", "1.001"):
        assert c.post("/billing/low-balance", {"threshold": bad}).status_code == 400, bad
    r = c.post("/billing/low-balance", {"threshold": "4,50"})  # under it? the trial is 5 PLN: not yet
    assert r.status_code == 303 and "low_balance_set" in r.headers["location"]
    assert gateway.sql("SELECT low_balance_micro_pln FROM orgs WHERE id = $1", org) == [
        {"low_balance_micro_pln": 4_500_000}]
    assert 'value="4.50"' in c.get("/billing").text
    low = lambda: [m for m in mails(gateway, email) if m["subject"].startswith("Low balance")]  # noqa: E731
    gateway.admin(lambda a: a.credit(org, -1_000_000, ref="test-spend-1", kind="correction"))  # 4 PLN left
    first = wait_for(low, timeout=10)
    assert len(first) == 1 and "is PLN\xa04.00, under the PLN\xa04.50 you set" in first[0]["body"]
    assert gateway.console + "/billing" in first[0]["body"]
    # still under: no second mail (the check runs every 0.3 s in the test stack; a later change of
    # state, here a top-up, is the positive event waited for)
    gateway.admin(lambda a: a.credit(org, -100_000, ref="test-spend-2", kind="correction"))
    wait_for(lambda: gateway.sql("SELECT low_balance_mailed_at FROM orgs WHERE id = $1", org)[0]["low_balance_mailed_at"])
    gateway.admin(lambda a: a.credit(org, 2_000_000, ref="test-topup", kind="topup"))  # 5.9 PLN: re-armed
    wait_for(lambda: gateway.sql("SELECT low_balance_mailed_at FROM orgs WHERE id = $1", org)[0]["low_balance_mailed_at"] is None)
    assert len(low()) == 1
    gateway.admin(lambda a: a.credit(org, -2_000_000, ref="test-spend-3", kind="correction"))  # 3.9 PLN
    wait_for(lambda: len(low()) == 2, timeout=10)
    assert c.post("/billing/low-balance", {"threshold": ""}).headers["location"].endswith("low_balance_off")
    assert gateway.sql("SELECT low_balance_micro_pln FROM orgs WHERE id = $1", org) == [{"low_balance_micro_pln": None}]


def test_low_balance_mail_is_limited_per_owner_a_day(gateway: Gateway) -> None:
    """Each save of the threshold re-arms the e-mail: saved five times under the balance, the owner
    gets three mails in the day, not five."""
    import redis

    from control.console.limits import LOW_BALANCE_MAIL
    from test_console_support import mails
    c, email, org = signed_up(gateway)
    low = lambda: [m for m in mails(gateway, email) if m["subject"].startswith("Low balance")]  # noqa: E731
    mailed_at = lambda: gateway.sql("SELECT low_balance_mailed_at FROM orgs WHERE id = $1", org)[0]["low_balance_mailed_at"]  # noqa: E731
    r = redis.Redis.from_url(gateway.stack.redis_url)
    try:
        for _ in range(5):
            c.get("/billing")
            assert c.post("/billing/low-balance", {"threshold": "10"}).status_code == 303  # over the 5 PLN trial
            wait_for(mailed_at, timeout=10)  # the check ran and decided
        wait_for(lambda: int(r.get(LOW_BALANCE_MAIL.key(email)) or 0) == 5, timeout=10)
    finally:
        r.close()
    wait_for(lambda: len(low()) == 3, timeout=10)
    assert len(low()) == 3
