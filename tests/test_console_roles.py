"""Roles over HTTP: every route of the console has an access rule here (a new route without one fails
``test_every_route_has_a_rule``), and each role is sent to every signed-in page and action: 403 with
its capability's refusal where the role must not reach, anything else where it may.  Owners change
roles; the last owner can be neither removed nor demoted."""
from __future__ import annotations

import re
from typing import Iterator

import pytest
from markupsafe import escape

from conftest import Gateway
from control.console.app import make_app
from control.console.roles import GRANTS, REFUSALS, ROLES
from control.console.settings import ConsoleSettings
from test_console_members import invite
from test_console_support import PASSWORD, ConsoleClient, new_email, signed_up

PUBLIC = "public"    # no sign-in needed (or the page does its own check: a link's token, a signature)
SIGNED = "signed"    # any role of the organisation

# (method, route) -> who may: PUBLIC, SIGNED, or the capability (control/console/roles.py) it needs
ACCESS: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/static"): PUBLIC,
    ("GET", "/"): SIGNED,
    ("GET", "/signup"): PUBLIC,
    ("POST", "/signup"): PUBLIC,
    ("GET", "/confirm/{token}"): PUBLIC,
    ("POST", "/confirm/{token}"): PUBLIC,
    ("GET", "/login"): PUBLIC,
    ("POST", "/login"): PUBLIC,
    ("POST", "/logout"): PUBLIC,
    ("GET", "/reset"): PUBLIC,
    ("POST", "/reset"): PUBLIC,
    ("GET", "/reset/{token}"): PUBLIC,
    ("POST", "/reset/{token}"): PUBLIC,
    ("POST", "/org/switch"): SIGNED,
    ("GET", "/login/2fa"): PUBLIC,
    ("POST", "/login/2fa"): PUBLIC,
    ("GET", "/account/security"): SIGNED,
    ("POST", "/account/security/enable"): SIGNED,
    ("POST", "/account/security/recovery"): SIGNED,
    ("POST", "/account/security/disable"): SIGNED,
    ("POST", "/members/2fa"): "members",
    ("GET", "/keys"): "keys",
    ("POST", "/keys"): "keys",
    ("POST", "/keys/{key_id}/revoke"): "keys",
    ("GET", "/keys/{key_id}/limits"): "key_limits",
    ("POST", "/keys/{key_id}/limits"): "key_limits",
    ("GET", "/usage"): "usage",
    ("GET", "/usage/live"): "usage",
    ("GET", "/usage.csv"): "usage",
    ("GET", "/billing"): "billing",
    ("POST", "/billing/topup"): "billing",
    ("POST", "/billing/details"): "billing",
    ("GET", "/billing/invoices/{invoice_id}.pdf"): "billing",
    ("GET", "/billing/invoices/{invoice_id}.xml"): "billing",
    ("POST", "/billing/low-balance"): "billing",
    ("POST", "/billing/payment/{payment_id}/cancel"): "billing",
    ("POST", "/billing/payment/{payment_id}/retry"): "billing",
    ("GET", "/billing/return/{payment_id}"): "billing",
    ("GET", "/billing/payment/{payment_id}"): "billing",
    ("POST", "/payments/notify/{provider}"): PUBLIC,
    ("GET", "/sandbox/pay/{payment_id}"): "billing",
    ("POST", "/sandbox/pay/{payment_id}"): "billing",
    ("GET", "/members"): "members",
    ("POST", "/members/invite"): "members",
    ("POST", "/members/invites/{invite_id}/revoke"): "members",
    ("POST", "/members/{user_id}/role"): "members",
    ("POST", "/members/{user_id}/remove"): "members",
    ("GET", "/invite/{token}"): PUBLIC,
    ("POST", "/invite/{token}"): PUBLIC,
    ("GET", "/dev/mail"): PUBLIC,
    ("GET", "/dev/mail.json"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs/api"): PUBLIC,
    ("GET", "/changelog"): PUBLIC,
    ("POST", "/lang"): PUBLIC,
}


def console_routes() -> set[tuple[str, str]]:
    app = make_app(ConsoleSettings())
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}


def test_every_route_has_a_rule() -> None:
    routes = console_routes()
    assert routes - ACCESS.keys() == set(), "a console route without an access rule in ACCESS"
    assert ACCESS.keys() - routes == set(), "a rule for a route the console no longer has"


def test_each_capability_is_some_roles() -> None:
    assert set(ROLES) == set(GRANTS)
    assert GRANTS["owner"] == frozenset(REFUSALS)  # the owner may everything
    assert GRANTS["member"] == {"keys", "usage"} and GRANTS["billing"] == {"billing", "usage"}


@pytest.fixture(scope="module")
def team(gateway: Gateway) -> Iterator[tuple[str, dict[str, ConsoleClient], dict[str, str]]]:
    """One organisation with a person in each role: (org id, role -> client, role -> user id)."""
    owner, owner_email, org = signed_up(gateway, "Role team")
    clients, ids = {"owner": owner}, {"owner": gateway.sql("SELECT id FROM users WHERE email = $1",
                                                            owner_email)[0]["id"]}
    for role in ("member", "billing"):
        email = new_email()
        link = invite(gateway, owner, email, role)
        guest = ConsoleClient(gateway.console)
        guest.get(link)
        r = guest.post(link, {"password": PASSWORD}, follow=True)
        assert r.status_code == 200 and "You joined" in r.text
        clients[role] = guest
        ids[role] = gateway.sql("SELECT id FROM users WHERE email = $1", email)[0]["id"]
    assert {r["role"] for r in gateway.sql("SELECT role FROM memberships WHERE org_id = $1", org)} == set(ROLES)
    yield org, clients, ids
    for c in clients.values():
        c.close()


def _path(route: str) -> str:
    return re.sub(r"\{[^}]+\}", "nope", route)


def test_each_role_against_every_signed_in_route(gateway: Gateway, team: tuple[str, dict[str, ConsoleClient],
                                                                                dict[str, str]]) -> None:
    org, clients, _ = team
    anon = ConsoleClient(gateway.console)
    checked = 0
    for (method, route), rule in sorted(ACCESS.items()):
        if rule == PUBLIC:
            continue
        path = _path(route)
        # not signed in: sent to log in
        r = anon.get(path, follow=False) if method == "GET" else anon.post(path, {"org": org})
        assert r.status_code in (303, 403), (method, route, r.status_code)  # 403: no form token
        if method == "GET":
            assert r.headers["location"].startswith("/login"), route
        for role, client in clients.items():
            r = client.get(path, follow=False) if method == "GET" else client.post(path, {"org": org})
            allowed = rule == SIGNED or rule in GRANTS[role]
            if allowed:
                assert r.status_code not in (401, 403, 500), (role, method, route, r.status_code)
                assert not r.headers.get("location", "").startswith("/login"), (role, method, route)
            else:
                assert r.status_code == 403, (role, method, route, r.status_code)
                assert str(escape(REFUSALS[rule])) in r.text, (role, method, route)  # type: ignore[index]
            checked += 1
    assert checked == 3 * sum(1 for rule in ACCESS.values() if rule != PUBLIC)
    # the navigation offers each role only its pages
    for role, client in clients.items():
        nav = client.get("/").text.split("</nav>")[0]
        for href, cap in (("/keys", "keys"), ("/billing", "billing"), ("/members", "members")):
            assert (f'href="{href}"' in nav) == (cap in GRANTS[role]), (role, href)
        assert 'href="/usage"' in nav


def test_owners_change_roles_and_an_organisation_keeps_an_owner(gateway: Gateway) -> None:
    owner, owner_email, org = signed_up(gateway, "Role changes")
    email = new_email()
    link = invite(gateway, owner, email, "billing")
    person = ConsoleClient(gateway.console)
    person.get(link)
    assert person.post(link, {"password": PASSWORD}, follow=True).status_code == 200
    uid = gateway.sql("SELECT id FROM users WHERE email = $1", email)[0]["id"]
    owner_id = gateway.sql("SELECT id FROM users WHERE email = $1", owner_email)[0]["id"]
    role = lambda u: gateway.sql("SELECT role FROM memberships WHERE org_id = $1 AND user_id = $2",  # noqa: E731
                                 org, u)[0]["role"]
    assert role(uid) == "billing"
    assert person.get("/billing").status_code == 200 and person.get("/keys").status_code == 403

    # the owner makes them a member: the next page already follows the new role
    page = owner.get("/members").text
    assert f'action="/members/{uid}/role"' in page
    r = owner.post(f"/members/{uid}/role", {"role": "member"}, follow=True)
    assert r.status_code == 200 and "The role is changed" in r.text
    assert role(uid) == "member"
    assert person.get("/keys").status_code == 200 and person.get("/billing").status_code == 403
    # an unknown role, a stranger, and a member changing roles
    owner.get("/members")
    r = owner.post(f"/members/{uid}/role", {"role": "admin"})
    assert r.status_code == 400 and "The role is owner, member or billing." in r.text and role(uid) == "member"
    assert owner.post("/members/usr_nope/role", {"role": "member"}).status_code == 404
    person.get("/usage")
    assert person.post(f"/members/{owner_id}/role", {"role": "member"}).status_code == 403
    assert role(owner_id) == "owner"

    # the last owner can be neither demoted nor removed
    owner.get("/members")
    for new in ("member", "billing"):
        r = owner.post(f"/members/{owner_id}/role", {"role": new})
        assert r.status_code == 400 and "last owner cannot become a member or billing" in r.text
        assert role(owner_id) == "owner"
    r = owner.post(f"/members/{owner_id}/remove")
    assert r.status_code == 400 and "last owner cannot be removed" in r.text and role(owner_id) == "owner"
    # with a second owner, the first may step down (and then reaches only a member's pages)
    assert owner.post(f"/members/{uid}/role", {"role": "owner"}).status_code == 303 and role(uid) == "owner"
    owner.get("/members")
    assert owner.post(f"/members/{owner_id}/role", {"role": "member"}).status_code == 303
    assert role(owner_id) == "member"
    assert owner.get("/members").status_code == 403 and person.get("/members").status_code == 200
    person.get("/members")
    r = person.post(f"/members/{uid}/role", {"role": "billing"})
    assert r.status_code == 400 and role(uid) == "owner"  # now they are the last owner


def test_an_invitation_to_the_billing_role(gateway: Gateway) -> None:
    owner, _, org = signed_up(gateway, "Accountants")
    page = owner.get("/members").text
    assert '<option value="billing">' in page
    email = new_email()
    invite(gateway, owner, email, "billing")
    assert gateway.sql("SELECT role FROM invites WHERE org_id = $1 AND email = $2", org, email) == [{"role": "billing"}]
    owner.get("/members")
    r = owner.post("/members/invite", {"email": new_email(), "role": "admin"})
    assert r.status_code == 400 and "The role is owner, member or billing." in r.text
