"""Console accounts over HTTP against the real stack: sign-up, confirmation and the trial credit
(once), log in and out, rate-limited login, password reset, CSRF on every form."""
from __future__ import annotations

from conftest import Gateway, wait_for
from control.console.limits import CONFIRM_MAIL, LOGIN_EMAIL
from test_console_support import PASSWORD, ConsoleClient, clear_limit, mail_link, mails, new_email, signed_up

TRIAL_MICRO = 5_000_000  # GATEWAY_TRIAL_BALANCE_PLN default: 5 PLN


def test_signup_confirm_gives_the_trial_balance_once(gateway: Gateway) -> None:
    c = ConsoleClient(gateway.console)
    email = new_email()
    c.get("/signup")
    r = c.post("/signup", {"email": email.upper(), "password": PASSWORD, "org": "Firma"})
    assert r.status_code == 303 and r.headers["location"].startswith("/login")
    user = gateway.sql("SELECT id, password_hash, verified_at FROM users WHERE email = $1", email)[0]
    assert user["verified_at"] is None
    assert user["password_hash"].startswith("$argon2id$") and PASSWORD not in user["password_hash"]
    org = gateway.sql("SELECT org_id, role FROM memberships WHERE user_id = $1", user["id"])[0]
    assert org["role"] == "owner"
    assert gateway.sql("SELECT * FROM ledger WHERE org_id = $1", org["org_id"]) == []
    # not verified yet: login refused; a fresh link is sent only once the 5 minutes since the last are over
    first = mail_link(gateway, email, "/confirm/")
    r = c.post("/login", {"email": email, "password": PASSWORD}, follow=True)
    assert "with the link we sent you lately" in r.text and not c.logged_in
    clear_limit(gateway, CONFIRM_MAIL, email)  # the 5 minutes are over
    r = c.post("/login", {"email": email, "password": PASSWORD}, follow=True)
    assert "we sent you a new link" in r.text and not c.logged_in
    link = mail_link(gateway, email, "/confirm/", count=2)  # the sign-up's and the refused login's
    assert link != first
    assert c.get(link).status_code == 200  # GET only shows the button: a mail scanner does not use the link
    assert gateway.sql("SELECT verified_at FROM users WHERE id = $1", user["id"])[0]["verified_at"] is None
    assert c.get(first).status_code == 400  # the newer link killed it
    r = c.post(link, follow=True)
    assert r.status_code == 200 and c.logged_in
    assert 'id="balance">PLN\xa05.00<' in r.text  # English (the client's cookie): PLN 5.00
    ledger = gateway.sql("SELECT amount_micro_pln, kind FROM ledger WHERE org_id = $1", org["org_id"])
    assert ledger == [{"amount_micro_pln": TRIAL_MICRO, "kind": "trial"}]
    # the link is single-use, and the first one is dead too: neither signs in nor credits again
    assert c.post(link).status_code == 400
    assert ConsoleClient(gateway.console).post(first, csrf="x").status_code == 403  # CSRF first
    c2 = ConsoleClient(gateway.console)
    c2.get("/login")
    r = c2.post(first)
    assert r.status_code == 400 and "confirmation link is invalid, used or expired" in r.text and not c2.logged_in
    assert gateway.sql("SELECT count(*) AS n FROM ledger WHERE org_id = $1", org["org_id"])[0]["n"] == 1
    assert gateway.admin(lambda a: a.balance(org["org_id"]))["balance_micro_pln"] == TRIAL_MICRO


def test_signup_validation_and_existing_address(gateway: Gateway) -> None:
    c, email, _ = signed_up(gateway)
    anon = ConsoleClient(gateway.console)
    anon.get("/signup")
    assert anon.post("/signup", {"email": "nope", "password": PASSWORD, "org": "x"}).status_code == 400
    assert anon.post("/signup", {"email": new_email(), "password": "short", "org": "x"}).status_code == 400
    assert anon.post("/signup", {"email": new_email(), "password": PASSWORD, "org": ""}).status_code == 400
    before = len(mails(gateway, email))
    r = anon.post("/signup", {"email": email, "password": "another password", "org": "Other"})
    assert r.status_code == 303  # the same answer as for a new address
    assert gateway.sql("SELECT count(*) AS n FROM users WHERE email = $1", email)[0]["n"] == 1
    wait_for(lambda: len(mails(gateway, email)) == before + 1, timeout=10)
    assert mails(gateway, email)[0]["subject"] == "Your account already exists"


def test_login_logout_and_session_cookie(gateway: Gateway) -> None:
    c, email, _ = signed_up(gateway)
    assert c.get("/keys").status_code == 200
    r = c.post("/logout", follow=True)
    assert "You are logged out" in r.text and not c.logged_in
    assert c.get("/keys", follow=False).status_code == 303
    # the old session token is dead in the database too
    assert gateway.sql("SELECT count(*) AS n FROM console_sessions s JOIN users u ON u.id = s.user_id"
                       " WHERE u.email = $1", email)[0]["n"] == 0
    c.get("/login")
    r = c.post("/login", {"email": email, "password": PASSWORD, "next": "/usage"})
    assert r.status_code == 303 and r.headers["location"] == "/usage" and c.logged_in
    c.post("/logout")
    c.get("/login")
    r = c.post("/login", {"email": email, "password": PASSWORD, "next": "//evil.example/"})
    assert r.headers["location"] == "/"  # no open redirect


def test_login_attempts_are_rate_limited(gateway: Gateway) -> None:
    _, email, _ = signed_up(gateway)
    c = ConsoleClient(gateway.console)
    c.get("/login")
    for _ in range(5):
        assert c.post("/login", {"email": email, "password": "wrong password!"}).status_code == 401
    r = c.post("/login", {"email": email, "password": PASSWORD})
    assert r.status_code == 429 and "Too many failed attempts" in r.text and not c.logged_in
    clear_limit(gateway, LOGIN_EMAIL, email)
    assert c.post("/login", {"email": email, "password": PASSWORD}).status_code == 303


def test_password_reset(gateway: Gateway) -> None:
    c, email, _ = signed_up(gateway)
    other = ConsoleClient(gateway.console)
    other.get("/reset")
    assert other.post("/reset", {"email": "nobody-" + email}).status_code == 303  # same answer, no mail
    assert other.post("/reset", {"email": email}).status_code == 303
    link = mail_link(gateway, email, "/reset/")
    assert other.get(link).status_code == 200
    assert other.post(link, {"password": "short"}).status_code == 400
    r = other.post(link, {"password": "a brand new password"}, follow=True)
    assert "password is changed" in r.text
    assert other.post(link, {"password": "yet another password"}).status_code == 400  # single use
    assert c.get("/keys", follow=False).status_code == 303  # every session of the account ended
    c.get("/login")
    assert c.post("/login", {"email": email, "password": PASSWORD}).status_code == 401
    assert c.post("/login", {"email": email, "password": "a brand new password"}).status_code == 303


def test_expired_links_are_refused(gateway: Gateway) -> None:
    c, email, _ = signed_up(gateway)
    c.get("/reset")
    c.post("/reset", {"email": email})
    link = mail_link(gateway, email, "/reset/")
    gateway.sql("UPDATE email_tokens SET expires_at = now() - interval '1 second' WHERE purpose = 'reset'"
                " AND user_id = (SELECT id FROM users WHERE email = $1)", email)
    assert c.get(link).status_code == 400
    assert c.post(link, {"password": "a brand new password"}).status_code == 400


def test_every_form_needs_its_csrf_token(gateway: Gateway) -> None:
    c, email, org = signed_up(gateway)
    other, _, _ = signed_up(gateway)
    other.get("/keys")
    for path, data in (("/keys", {"name": "x"}), ("/logout", {}), ("/billing/topup", {"amount": "10"}),
                       ("/members/invite", {"email": new_email(), "role": "member"}), ("/org/switch", {"org": org})):
        assert c.post(path, data, csrf="").status_code == 403, path
        assert c.post(path, data, csrf=other.csrf).status_code == 403, path  # another session's token
    assert gateway.sql("SELECT count(*) AS n FROM api_keys WHERE org_id = $1", org)[0]["n"] == 0
    assert gateway.sql("SELECT count(*) AS n FROM invites WHERE org_id = $1", org)[0]["n"] == 0
    anon = ConsoleClient(gateway.console)
    assert anon.post("/login", {"email": email, "password": PASSWORD}, csrf="").status_code == 403
    assert anon.post("/signup", {"email": new_email(), "password": PASSWORD, "org": "x"}, csrf="0" * 64).status_code == 403
