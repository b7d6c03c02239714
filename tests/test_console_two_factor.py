"""Two-factor sign-in over HTTP: enrolment with a QR code and a code, the second step of logging in
with a TOTP code (never the same one twice) or a one-time recovery code, its attempt limit, turning
it off, and an owner requiring it of the whole organisation."""
from __future__ import annotations

import re
import time

import pyotp

from conftest import Gateway
from control.console import limits
from test_console_members import invite
from test_console_support import PASSWORD, ConsoleClient, clear_limit, mail_link, new_email, signed_up


def enrol(gw: Gateway, c: ConsoleClient, email: str) -> tuple[pyotp.TOTP, list[str], str]:
    """Two-factor sign-in turned on for the signed-in ``c``: its authenticator, recovery codes and the
    code that turned it on."""
    page = c.get("/account/security").text
    secret = re.search(r'<code id="totp-secret">([A-Z2-7]+)</code>', page)
    assert secret and 'src="data:image/svg+xml' in page and 'id="qr"' in page
    assert gw.sql("SELECT totp_pending, totp_secret FROM users WHERE email = $1", email) == [
        {"totp_pending": secret.group(1), "totp_secret": None}]
    assert secret.group(1) in c.get("/account/security").text  # a reload shows the same secret
    app = pyotp.TOTP(secret.group(1))
    r = c.post("/account/security/enable", {"code": "000000" if app.now() != "000000" else "111111"})
    assert r.status_code == 400 and "That code is not right" in r.text
    code = app.now()
    r = c.post("/account/security/enable", {"code": code})
    assert r.status_code == 200 and 'id="two-factor-on"' in r.text, r.text
    codes = re.findall(r"<li>([a-z2-9]{5}-[a-z2-9]{5})</li>", r.text)
    assert len(codes) == 10 == len(set(codes))
    assert "10 recovery codes left." in r.text
    return app, codes, code


def log_in(gw: Gateway, email: str) -> ConsoleClient:
    """A client past the password, at the second step."""
    c = ConsoleClient(gw.console)
    c.get("/login")
    r = c.post("/login", {"email": email, "password": PASSWORD, "next": "/usage"})
    assert r.status_code == 303 and r.headers["location"] == "/login/2fa"
    assert not c.logged_in and "gw_2fa" in c.jar
    assert "Two-factor sign-in" in c.get("/login/2fa").text
    return c


def test_enrol_then_log_in_with_a_code_or_a_recovery_code(gateway: Gateway) -> None:
    c, email, _ = signed_up(gateway, "Two factors")
    app, codes, used = enrol(gateway, c, email)
    row = gateway.sql("SELECT totp_secret, totp_pending, totp_enabled_at FROM users WHERE email = $1", email)[0]
    assert row["totp_secret"] == app.secret and row["totp_pending"] is None and row["totp_enabled_at"]
    stored = [r["code_hash"] for r in gateway.sql(
        "SELECT code_hash FROM recovery_codes WHERE user_id = (SELECT id FROM users WHERE email = $1)", email)]
    assert len(stored) == 10 and not any(code.replace("-", "") in h or code in h for code in codes for h in stored)

    # the password alone opens nothing
    s = log_in(gateway, email)
    assert s.get("/usage", follow=False).headers["location"].startswith("/login")
    r = s.post("/login/2fa", {"code": used})  # the code enrolment took: never twice
    assert r.status_code == 401 and "That code is not right (or was used already)." in r.text and not s.logged_in
    r = s.post("/login/2fa", {"code": app.at(time.time() + 30)})  # the next one (a step of drift allowed)
    assert r.status_code == 303 and r.headers["location"] == "/usage" and s.logged_in
    assert "gw_2fa" not in s.jar  # the proof of the password is spent
    assert s.get("/usage").status_code == 200

    # a recovery code, once
    s = log_in(gateway, email)
    assert s.post("/login/2fa", {"code": codes[3].upper().replace("-", " ")}).status_code == 303 and s.logged_in
    assert "9 recovery codes left." in s.get("/account/security").text
    s = log_in(gateway, email)
    r = s.post("/login/2fa", {"code": codes[3]})
    assert r.status_code == 401 and not s.logged_in

    # no second step without a password proved right: no cookie, or one not signed by the console
    anon = ConsoleClient(gateway.console)
    anon.get("/login")
    assert anon.get("/login/2fa", follow=False).headers["location"] == "/login"
    anon.jar["gw_2fa"] = "eyJ1c3IiXQ.00"
    assert anon.post("/login/2fa", {"code": app.now()}).headers["location"] == "/login" and not anon.logged_in


def test_second_step_attempts_are_limited(gateway: Gateway) -> None:
    c, email, _ = signed_up(gateway, "Guessers")
    app, _, _ = enrol(gateway, c, email)
    uid = gateway.sql("SELECT id FROM users WHERE email = $1", email)[0]["id"]
    s = log_in(gateway, email)
    try:
        for _ in range(limits.CODE_USER.max):
            assert s.post("/login/2fa", {"code": "12345x"}).status_code == 401
        r = s.post("/login/2fa", {"code": app.at(time.time() + 30)})  # right, but too late
        assert r.status_code == 429 and "Too many failed attempts; try again in 15 minutes." in r.text
        assert not s.logged_in
    finally:
        clear_limit(gateway, limits.CODE_USER, uid)
    assert s.post("/login/2fa", {"code": app.at(time.time() + 30)}).status_code == 303 and s.logged_in


def test_turning_it_off_needs_a_code(gateway: Gateway) -> None:
    c, email, _ = signed_up(gateway, "Off again")
    app, codes, _ = enrol(gateway, c, email)
    r = c.post("/account/security/disable", {"code": "nope"})
    assert r.status_code == 400 and "That code is not right" in r.text
    r = c.post("/account/security/disable", {"code": codes[0]}, follow=True)
    assert r.status_code == 200 and "Two-factor sign-in is off." in r.text
    assert gateway.sql("SELECT totp_secret, (SELECT count(*) FROM recovery_codes r WHERE r.user_id = u.id) AS n"
                       " FROM users u WHERE email = $1", email) == [{"totp_secret": None, "n": 0}]
    s = ConsoleClient(gateway.console)
    s.get("/login")
    assert s.post("/login", {"email": email, "password": PASSWORD}).status_code == 303 and s.logged_in


def test_an_owner_requires_it_of_everyone(gateway: Gateway) -> None:
    owner, owner_email, org = signed_up(gateway, "Strict org")
    owner.get("/members")
    r = owner.post("/members/2fa", {"require": "1"})
    assert r.status_code == 400 and "Set up your own two-factor sign-in first" in r.text
    enrol(gateway, owner, owner_email)
    owner.get("/members")
    r = owner.post("/members/2fa", {"require": "1"}, follow=True)
    assert "Everyone in the organisation now signs in with a second factor." in r.text
    assert gateway.sql("SELECT require_2fa FROM orgs WHERE id = $1", org) == [{"require_2fa": True}]

    # a member without it is sent to set it up, from every page, until they do
    email = new_email()
    link = invite(gateway, owner, email)
    m = ConsoleClient(gateway.console)
    m.get(link)
    r = m.post(link, {"password": PASSWORD}, follow=False)
    for path in ("/", "/keys", "/usage"):
        r = m.get(path, follow=False)
        assert r.status_code == 303 and r.headers["location"] == "/account/security?msg=2fa_required", path
    r = m.get("/keys")
    assert "Your organisation requires two-factor sign-in: set it up to go on." in r.text
    app, codes, _ = enrol(gateway, m, email)
    assert m.get("/keys", follow=False).status_code == 200
    assert "Your organisation requires two-factor sign-in." in m.get("/account/security").text
    r = m.post("/account/security/disable", {"code": codes[0]})
    assert r.status_code == 400 and "it stays on" in r.text
    assert gateway.sql("SELECT totp_secret IS NOT NULL AS on FROM users WHERE email = $1", email) == [{"on": True}]
    page = owner.get("/members").text
    assert page.count('data-label="Two-factor">on</td>') == 2 and 'name="require" value="1" checked' in page
    # lifted: nobody is sent anywhere
    owner.post("/members/2fa", {})
    assert gateway.sql("SELECT require_2fa FROM orgs WHERE id = $1", org) == [{"require_2fa": False}]


def test_no_turning_it_off_while_any_organisation_of_the_account_requires_it(gateway: Gateway) -> None:
    """The requirement follows the person, not the organisation shown: viewing another organisation of
    theirs does not let them turn it off."""
    strict, strict_email, _ = signed_up(gateway, "Strict elsewhere")
    enrol(gateway, strict, strict_email)
    strict.get("/members")
    assert strict.post("/members/2fa", {"require": "1"}).status_code == 303
    c, email, own_org = signed_up(gateway, "Own org")
    _, codes, _ = enrol(gateway, c, email)
    link = invite(gateway, strict, email)
    assert "You joined" in c.post(link, {}, follow=True).text
    assert c.post("/org/switch", {"org": own_org}).status_code == 303
    page = c.get("/account/security").text
    assert "Your organisation requires two-factor sign-in." in page and "/account/security/disable" not in page
    r = c.post("/account/security/disable", {"code": codes[0]})
    assert r.status_code == 400 and "Your organisation requires two-factor sign-in; it stays on." in r.text
    assert gateway.sql("SELECT totp_secret IS NOT NULL AS on, (SELECT count(*) FROM recovery_codes r WHERE"
                       " r.user_id = u.id AND r.used_at IS NULL) AS left FROM users u WHERE email = $1",
                       email) == [{"on": True, "left": 10}]


def test_turning_it_on_ends_the_accounts_other_sessions(gateway: Gateway) -> None:
    """A session opened with the password alone (elsewhere, or stolen) ends when a second factor arrives;
    the one that turned it on goes on."""
    c, email, _ = signed_up(gateway, "Fresh factor")
    other = ConsoleClient(gateway.console)
    other.get("/login")
    assert other.post("/login", {"email": email, "password": PASSWORD}).status_code == 303 and other.logged_in
    assert other.get("/keys", follow=False).status_code == 200
    enrol(gateway, c, email)
    r = other.get("/keys", follow=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/keys" and not other.logged_in
    assert c.get("/keys", follow=False).status_code == 200
    assert gateway.sql("SELECT count(*) AS n FROM console_sessions s JOIN users u ON u.id = s.user_id"
                       " WHERE u.email = $1", email) == [{"n": 1}]


def test_the_proof_of_the_password_is_spent_by_its_sign_in(gateway: Gateway) -> None:
    """The second step's cookie, copied before it was used, opens nothing after its sign-in (nor after
    the sign-out that followed), even with a good code."""
    c, email, _ = signed_up(gateway, "Spent proof")
    _, codes, _ = enrol(gateway, c, email)
    s = log_in(gateway, email)
    copied = s.jar["gw_2fa"]
    assert s.post("/login/2fa", {"code": codes[0]}).status_code == 303 and s.logged_in
    s.get("/")
    assert s.post("/logout").status_code == 303 and not s.logged_in
    thief = ConsoleClient(gateway.console)
    thief.get("/login")
    thief.jar["gw_2fa"] = copied
    assert thief.get("/login/2fa", follow=False).headers["location"] == "/login"
    r = thief.post("/login/2fa", {"code": codes[1]})
    assert r.status_code == 303 and r.headers["location"] == "/login" and not thief.logged_in
    assert gateway.sql("SELECT count(*) FILTER (WHERE used_at IS NULL) AS left FROM recovery_codes r"
                       " JOIN users u ON u.id = r.user_id WHERE u.email = $1", email) == [{"left": 9}]


def test_a_password_proved_before_the_password_was_reset_opens_nothing(gateway: Gateway) -> None:
    """Someone who had the old password, at the second step when the owner resets it: the proof of the old
    password opens nothing any more, even with a good code; the new password's sign-in works."""
    c, email, _ = signed_up(gateway, "Reset proof")
    _, codes, _ = enrol(gateway, c, email)
    thief = log_in(gateway, email)  # the old password, proved
    owner = ConsoleClient(gateway.console)
    owner.get("/reset")
    assert owner.post("/reset", {"email": email}).status_code == 303
    link = mail_link(gateway, email, "/reset/")
    owner.get(link)
    assert owner.post(link, {"password": "a brand new password"}).status_code == 303
    assert thief.get("/login/2fa", follow=False).headers["location"] == "/login"
    r = thief.post("/login/2fa", {"code": codes[0]})
    assert r.status_code == 303 and r.headers["location"] == "/login" and not thief.logged_in
    assert gateway.sql("SELECT count(*) FILTER (WHERE used_at IS NULL) AS left FROM recovery_codes r"
                       " JOIN users u ON u.id = r.user_id WHERE u.email = $1", email) == [{"left": 10}]  # none spent
    owner.get("/login")
    r = owner.post("/login", {"email": email, "password": "a brand new password", "next": "/usage"})
    assert r.status_code == 303 and r.headers["location"] == "/login/2fa"
    r = owner.post("/login/2fa", {"code": codes[1]})
    assert r.status_code == 303 and r.headers["location"] == "/usage" and owner.logged_in
