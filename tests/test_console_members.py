"""Members and organisation isolation over HTTP: invitations by e-mail, roles (owner: billing and
members; member: keys and usage), removal; and one organisation's account trying every page and
action on another organisation's data."""
from __future__ import annotations

import re

import httpx

from conftest import Gateway, wait_for
from test_console_billing import billing_details
from test_console_keys_usage import create_key
from test_console_support import PASSWORD, ConsoleClient, mail_link, new_email, signed_up


def invite(gw: Gateway, owner: ConsoleClient, email: str, role: str = "member") -> str:
    owner.get("/members")
    r = owner.post("/members/invite", {"email": email, "role": role}, follow=True)
    assert "invitation is sent" in r.text and email in r.text
    return mail_link(gw, email, "/invite/")


def test_invite_accept_roles_and_removal(gateway: Gateway) -> None:
    owner, owner_email, org = signed_up(gateway, "Zespół")
    email = new_email()
    link = invite(gateway, owner, email)
    guest = ConsoleClient(gateway.console)
    page = guest.get(link).text
    assert "Join Zespół" in page and "Choose a password" in page
    assert guest.post(link, {"password": "short"}).status_code == 400
    r = guest.post(link, {"password": PASSWORD}, follow=True)
    assert r.status_code == 200 and guest.logged_in and "You joined" in r.text
    assert guest.post(link, {"password": PASSWORD}).status_code == 400  # used once
    member = gateway.sql("SELECT u.id, u.verified_at, m.role FROM users u JOIN memberships m ON m.user_id = u.id"
                         " WHERE u.email = $1 AND m.org_id = $2", email, org)[0]
    assert member["role"] == "member" and member["verified_at"] is not None
    # member: keys and usage, not billing nor members
    assert guest.get("/keys").status_code == 200 and guest.get("/usage").status_code == 200
    assert guest.get("/billing").status_code == 403 and guest.get("/members").status_code == 403
    assert guest.post("/billing/topup", {"amount": "10"}).status_code == 403
    assert guest.post("/members/invite", {"email": new_email(), "role": "owner"}).status_code == 403
    assert guest.post(f"/members/{member['id']}/remove").status_code == 403
    kid, _ = create_key(guest, "member's key")
    assert "member&#39;s key" in owner.get("/keys").text  # the same organisation's keys
    assert "Billing" not in guest.get("/").text
    # the owner sees and removes the member; the member's session loses the organisation at once
    assert email in owner.get("/members").text
    owner.get("/members")
    r = owner.post(f"/members/{member['id']}/remove", follow=True)
    assert "member is removed" in r.text and email not in r.text
    assert guest.get("/keys", follow=False).status_code == 303
    # the last owner cannot be removed
    owner_id = gateway.sql("SELECT id FROM users WHERE email = $1", owner_email)[0]["id"]
    owner.get("/members")
    assert owner.post(f"/members/{owner_id}/remove").status_code == 400


def test_existing_account_accepts_and_switches_organisation(gateway: Gateway) -> None:
    owner, _, org_a = signed_up(gateway, "Org A")
    other, other_email, org_b = signed_up(gateway, "Org B")
    link = invite(gateway, owner, other_email, "owner")
    outsider, _, _ = signed_up(gateway, "Org C")
    outsider.get(link)
    assert outsider.post(link).status_code == 403  # for another address
    anon = ConsoleClient(gateway.console)
    assert "Log in to accept" in anon.get(link).text
    other.get(link)
    r = other.post(link, follow=True)
    assert "You joined" in r.text and "Org A" in r.text
    assert gateway.sql("SELECT role FROM memberships WHERE org_id = $1 AND user_id ="
                       " (SELECT id FROM users WHERE email = $2)", org_a, other_email) == [{"role": "owner"}]
    assert other.get("/billing").status_code == 200
    r = other.post("/org/switch", {"org": org_b}, follow=True)
    assert "Org B" in r.text
    # withdrawn invitations cannot be used
    link2 = invite(gateway, owner, new_email())
    inv = re.search(r'/members/invites/(inv_[0-9a-f]+)/revoke', owner.get("/members").text)
    assert inv
    owner.post(f"/members/invites/{inv.group(1)}/revoke")
    assert ConsoleClient(gateway.console).get(link2).status_code == 400


def test_one_organisation_never_reads_or_changes_another(gateway: Gateway) -> None:
    """Account A tries every page and action with organisation B's identifiers."""
    a, a_email, org_a = signed_up(gateway, "Alpha")
    b, b_email, org_b = signed_up(gateway, "Beta")
    b_kid, b_key = create_key(b, "beta-secret-name")
    r = httpx.post(gateway.v1 + "/chat/completions", headers={"Authorization": f"Bearer {b_key}"},
                   json={"model": "polish-pro", "messages": [{"role": "user", "content": "x"}]}, timeout=30)
    b_rid = r.headers["x-request-id"]
    billing_details(b)
    b_pay = b.post("/billing/topup", {"amount": "10"}).headers["location"].rsplit("/", 1)[1]
    b.get("/members")
    b.post("/members/invite", {"email": new_email(), "role": "member"})
    b_inv = re.search(r'/members/invites/(inv_[0-9a-f]+)/revoke', b.get("/members").text)
    assert b_inv
    b_uid = gateway.sql("SELECT id FROM users WHERE email = $1", b_email)[0]["id"]
    wait_for(lambda: gateway.sql("SELECT 1 FROM usage_records WHERE request_id = $1", b_rid), timeout=10)

    secrets_of_b = [b_kid, "beta-secret-name", b_rid, b_pay, b_email, "Beta", b_inv.group(1)]
    for path in ("/", "/keys", "/usage", "/usage/live", "/usage.csv", f"/usage?key={b_kid}", "/billing",
                 f"/billing?payment={b_pay}", "/members", "/dev/mail.json?to=nobody@example.com"):
        text = a.get(path).text
        if "?key=" in path:  # the filter's own value is echoed back in the form: not B's data
            text = text.replace(b_kid, "")
        leaked = [s for s in secrets_of_b if s in text]
        assert not leaked, (path, leaked)
    assert a.get(f"/billing/return/{b_pay}").status_code == 404
    assert a.get(f"/billing/payment/{b_pay}").status_code == 404
    assert a.get(f"/sandbox/pay/{b_pay}").status_code == 404
    a.get("/keys")
    assert a.post(f"/sandbox/pay/{b_pay}", {"action": "pay"}).status_code == 404
    assert a.post(f"/keys/{b_kid}/revoke").status_code == 404
    assert a.post(f"/members/{b_uid}/remove").status_code == 404
    assert a.post(f"/members/invites/{b_inv.group(1)}/revoke").status_code == 404
    assert a.post("/org/switch", {"org": org_b}).status_code == 403
    # nothing of B changed
    assert gateway.sql("SELECT revoked_at FROM api_keys WHERE id = $1", b_kid) == [{"revoked_at": None}]
    assert gateway.sql("SELECT status FROM payments WHERE id = $1", b_pay) == [{"status": "pending"}]
    assert gateway.sql("SELECT count(*) AS n FROM memberships WHERE org_id = $1", org_b) == [{"n": 1}]
    assert gateway.sql("SELECT count(*) AS n FROM invites WHERE org_id = $1", org_b) == [{"n": 1}]
    assert gateway.sql("SELECT org_id FROM console_sessions s JOIN users u ON u.id = s.user_id WHERE u.email = $1",
                       a_email) == [{"org_id": org_a}]
