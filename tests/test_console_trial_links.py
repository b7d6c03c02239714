"""The trial credit once per person (normalised address), a few per client address a day, never to a
disposable-mail domain; e-mail links that do one thing once (a superseded confirmation link neither
confirms nor signs in; a password change kills every link; a newer invitation kills the older); and
confirmation mail limited per recipient, whoever asks (no mail bombing through log-ins)."""
from __future__ import annotations

import asyncio
import secrets
from typing import Any

import asyncpg

from conftest import Gateway, wait_for
from control.console import trial
from control.schema import MIGRATIONS, TRIAL_IDENTITY_SQL
from control.console.limits import CONFIRM_MAIL
from test_console_accounts import TRIAL_MICRO
from test_console_members import invite
from test_console_support import PASSWORD, ConsoleClient, clear_limit, loopback_address, mail_link, mails, new_email, signed_up


def sign_up(gw: Gateway, email: str, address: str | None = None) -> tuple[ConsoleClient, str]:
    """A new account (not confirmed yet) from ``address``: (client, organisation id)."""
    c = ConsoleClient(gw.console, address=address)
    c.get("/signup")
    r = c.post("/signup", {"email": email, "password": PASSWORD, "org": "Firma"})
    assert r.status_code == 303 and r.headers["location"] == "/login?msg=signed_up", r.text
    org = gw.sql("SELECT m.org_id FROM memberships m JOIN users u ON u.id = m.user_id WHERE u.email = $1",
                 email.lower())[0]["org_id"]
    return c, str(org)


def confirm(gw: Gateway, c: ConsoleClient, email: str) -> str:
    """Confirm with the mailed link; the page it leads to."""
    link = mail_link(gw, email.lower(), "/confirm/")
    assert c.get(link).status_code == 200
    r = c.post(link, follow=True)
    assert r.status_code == 200 and c.logged_in, r.text
    return r.text


def trials(gw: Gateway, org: str) -> list[int]:
    return [r["amount_micro_pln"] for r in gw.sql("SELECT amount_micro_pln FROM ledger WHERE org_id = $1"
                                                  " AND kind = 'trial'", org)]


def test_normalised_address_names_one_person() -> None:
    assert trial.identity("J.Doe+promo@GoogleMail.com") == trial.identity("jdoe@gmail.com") == "jdoe@gmail.com"
    assert trial.identity("Ann.Lee+x+y@Example.COM") == "ann.lee@example.com"  # dots count outside Gmail
    assert trial.identity("ann.lee@example.com") != trial.identity("annlee@example.com")
    assert trial.disposable("x@mailinator.com") and trial.disposable("x@eu.mailinator.com")
    assert not trial.disposable("x@gmail.com") and not trial.disposable("x@example.com")


def test_the_trials_granted_before_are_recorded_under_the_same_person(gateway: Gateway) -> None:
    """Migration 9 records the trials granted before it with SQL that must name a person as
    ``trial.identity_hash`` does."""
    for email in ("ann.lee+x@example.com", "j.doe+promo@googlemail.com", "jdoe@gmail.com", "żaneta@przykład.pl",
                  "a+b+c@sub.example.co.uk"):
        got = gateway.sql(f"SELECT {TRIAL_IDENTITY_SQL} AS h FROM lower($1) AS e", email)[0]["h"]
        assert got == trial.identity_hash(email), email


def test_migration_9_records_the_trials_granted_before_it(gateway: Gateway) -> None:
    """A database at version 8 with three trials (two of one person, one not given to an owner's
    address): after migration 9, one row per person, the earliest organisation's."""
    schema = "mig_" + secrets.token_hex(4)

    async def go() -> list[dict[str, Any]]:
        conn = await asyncpg.connect(gateway.stack.database_url)
        try:
            await conn.execute(f"CREATE SCHEMA {schema}; SET search_path TO {schema}")
            for sql in MIGRATIONS[:8]:
                await conn.execute(sql)
            await conn.execute("""
                INSERT INTO orgs (id, name) VALUES ('o1', 'a'), ('o2', 'b'), ('o3', 'c');
                INSERT INTO users (id, email, password_hash) VALUES ('u1', 'j.doe+1@gmail.com', 'x'),
                  ('u2', 'jdoe@googlemail.com', 'x'), ('u3', 'ann@example.com', 'x');
                INSERT INTO memberships (user_id, org_id, role) VALUES ('u1', 'o1', 'owner'), ('u2', 'o2', 'owner'),
                  ('u3', 'o3', 'owner');
                INSERT INTO ledger (org_id, amount_micro_pln, kind, ref, created_at) VALUES
                  ('o1', 5000000, 'trial', 'trial:o1', now() - interval '2 days'),
                  ('o2', 5000000, 'trial', 'trial:o2', now() - interval '1 day'),
                  ('o3', 5000000, 'topup', 'p:1', now())""")
            await conn.execute(MIGRATIONS[8])
            return [dict(r) for r in await conn.fetch("SELECT identity_hash, org_id FROM trial_grants")]
        finally:
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")
            await conn.close()

    assert asyncio.run(go()) == [{"identity_hash": trial.identity_hash("jdoe@gmail.com"), "org_id": "o1"}]


def test_trial_once_per_person_whatever_the_tag_case_or_gmail_dots(gateway: Gateway) -> None:
    base = "p" + secrets.token_hex(4)
    c, first_org = sign_up(gateway, f"{base}@example.com")
    assert "Your e-mail address is confirmed" in confirm(gateway, c, f"{base}@example.com")
    assert trials(gateway, first_org) == [TRIAL_MICRO]
    for again in (f"{base}+second@example.com", f"{base.upper()}+3@EXAMPLE.com"):
        c2, org = sign_up(gateway, again)
        page = confirm(gateway, c2, again)
        assert "Your e-mail address is confirmed" in page
        assert "No trial credit: this address (or the same mailbox under another spelling) already had one" in page
        assert trials(gateway, org) == [] and 'id="balance">PLN\xa00.00<' in page
    # Gmail ignores dots and answers to googlemail.com as well
    g = "g" + secrets.token_hex(4)
    c, org = sign_up(gateway, f"{g[:3]}.{g[3:]}@gmail.com")
    confirm(gateway, c, f"{g[:3]}.{g[3:]}@gmail.com")
    assert trials(gateway, org) == [TRIAL_MICRO]
    c, org = sign_up(gateway, f"{g}+x@googlemail.com")
    assert "already had one" in confirm(gateway, c, f"{g}+x@googlemail.com")
    assert trials(gateway, org) == []
    # the ledger of trials keeps a hash, never the address
    assert gateway.sql("SELECT count(*) AS n FROM trial_grants WHERE identity_hash = $1",
                       trial.identity_hash(f"{g}@gmail.com"))[0]["n"] == 1
    assert gateway.sql("SELECT count(*) AS n FROM trial_grants WHERE identity_hash LIKE '%@%'")[0]["n"] == 0


def test_no_trial_for_a_disposable_mail_domain(gateway: Gateway) -> None:
    email = f"d{secrets.token_hex(4)}@mailinator.com"
    c, org = sign_up(gateway, email)
    page = confirm(gateway, c, email)
    assert "No trial credit for addresses at disposable-mail services" in page
    assert trials(gateway, org) == []
    assert gateway.sql("SELECT count(*) AS n FROM trial_grants WHERE org_id = $1", org)[0]["n"] == 0


def test_trials_per_client_address_per_day(gateway: Gateway) -> None:
    address = loopback_address()
    orgs = []
    for _ in range(3):  # GATEWAY_TRIAL_PER_CLIENT_DAY default
        email = new_email()
        c, org = sign_up(gateway, email, address)
        assert "No trial credit" not in confirm(gateway, c, email)
        orgs.append(org)
    assert [trials(gateway, o) for o in orgs] == [[TRIAL_MICRO]] * 3
    email = new_email()
    c, org = sign_up(gateway, email, address)
    assert "too many trial credits went to your network today" in confirm(gateway, c, email)
    assert trials(gateway, org) == []
    email = new_email()  # another client address is not counted with it
    c, org = sign_up(gateway, email)
    assert "No trial credit" not in confirm(gateway, c, email) and trials(gateway, org) == [TRIAL_MICRO]


def test_a_superseded_confirmation_link_never_signs_in(gateway: Gateway) -> None:
    """The attack: log in before confirming (a second link is mailed), confirm with the second; the
    first then must not open the account, in a fresh browser, before or after a password reset."""
    email = new_email()
    c, org = sign_up(gateway, email)
    first = mail_link(gateway, email, "/confirm/")
    clear_limit(gateway, CONFIRM_MAIL, email)
    c.get("/login")
    assert c.post("/login", {"email": email, "password": PASSWORD}).headers["location"] == "/login?msg=unverified"
    second = mail_link(gateway, email, "/confirm/", count=2)
    assert second != first
    c.get(second)
    assert c.post(second, follow=True).status_code == 200 and c.logged_in
    for link in (first, second):
        fresh = ConsoleClient(gateway.console)
        assert fresh.get(link).status_code == 400
        r = fresh.post(link)
        assert r.status_code == 400 and not fresh.logged_in and "gw_session" not in r.headers.get("set-cookie", "")
    # a password reset kills whatever link is left; still nothing signs in
    c.get("/reset")
    c.post("/reset", {"email": email})
    reset = mail_link(gateway, email, "/reset/")
    c.get(reset)
    assert c.post(reset, {"password": "a brand new password"}).status_code == 303
    fresh = ConsoleClient(gateway.console)
    fresh.get("/login")
    assert fresh.post(first).status_code == 400 and not fresh.logged_in
    assert gateway.sql("SELECT count(*) AS n FROM email_tokens t JOIN users u ON u.id = t.user_id"
                       " WHERE u.email = $1 AND t.used_at IS NULL", email)[0]["n"] == 0
    assert trials(gateway, org) == [TRIAL_MICRO]


def test_an_older_confirmation_link_confirms_but_does_not_sign_in(gateway: Gateway) -> None:
    """A link that is not the account's newest (one from before links died on a newer one) confirms
    the address, once, and leads to the log-in page without a session."""
    email = new_email()
    c, org = sign_up(gateway, email)
    first = mail_link(gateway, email, "/confirm/")
    clear_limit(gateway, CONFIRM_MAIL, email)
    c.get("/login")
    c.post("/login", {"email": email, "password": PASSWORD})
    second = mail_link(gateway, email, "/confirm/", count=2)
    gateway.sql("UPDATE email_tokens SET used_at = NULL WHERE user_id = (SELECT id FROM users WHERE email = $1)",
                email)  # as if the first were still alive
    fresh = ConsoleClient(gateway.console)
    fresh.get(first)
    r = fresh.post(first, follow=True)
    assert r.status_code == 200 and not fresh.logged_in and "Your e-mail address is confirmed" in r.text
    assert gateway.sql("SELECT verified_at FROM users WHERE email = $1", email)[0]["verified_at"] is not None
    assert trials(gateway, org) == [TRIAL_MICRO]
    # the address is confirmed: the newest link died with it
    assert fresh.post(second).status_code == 400 and not fresh.logged_in


def test_confirmation_mail_is_limited_per_recipient_whoever_asks(gateway: Gateway) -> None:
    email = new_email()
    sign_up(gateway, email)
    mail_link(gateway, email, "/confirm/")
    # 20 log-ins with the right password, from 20 client addresses: no further mail within 5 minutes
    for _ in range(20):
        c = ConsoleClient(gateway.console)
        c.get("/login")
        r = c.post("/login", {"email": email, "password": PASSWORD})
        assert r.status_code == 303 and r.headers["location"] == "/login?msg=unverified_sent_lately"
    # five a day whoever asks: each time the 5 minutes are over, one more, up to five in all
    sent = []
    for _ in range(8):
        clear_limit(gateway, CONFIRM_MAIL, email)
        c = ConsoleClient(gateway.console)
        c.get("/login")
        sent.append(c.post("/login", {"email": email, "password": PASSWORD}).headers["location"])
    assert sent == ["/login?msg=unverified"] * 4 + ["/login?msg=unverified_sent_lately"] * 4, sent
    wait_for(lambda: len(mails(gateway, email)) == 5, timeout=10)
    assert len(mails(gateway, email)) == 5
    assert gateway.sql("SELECT count(*) AS n FROM email_tokens t JOIN users u ON u.id = t.user_id"
                       " WHERE u.email = $1 AND t.used_at IS NULL", email)[0]["n"] == 1  # only the newest lives


def test_a_newer_invitation_or_a_password_change_kills_the_invitation(gateway: Gateway) -> None:
    owner, _, org = signed_up(gateway)
    _, email, _ = signed_up(gateway)
    older = invite(gateway, owner, email)
    owner.get("/members")
    owner.post("/members/invite", {"email": email, "role": "member"})
    newer = mail_link(gateway, email, "/invite/", count=2)
    assert newer != older
    assert ConsoleClient(gateway.console).get(older).status_code == 400
    assert ConsoleClient(gateway.console).get(newer).status_code == 200
    # the invited account's password changes: its pending invitations die too
    c = ConsoleClient(gateway.console)
    c.get("/reset")
    c.post("/reset", {"email": email})
    reset = mail_link(gateway, email, "/reset/")
    c.get(reset)
    assert c.post(reset, {"password": "a brand new password"}).status_code == 303
    assert ConsoleClient(gateway.console).get(newer).status_code == 400
    assert gateway.sql("SELECT count(*) AS n FROM invites WHERE org_id = $1 AND email = $2", org, email)[0]["n"] == 0
