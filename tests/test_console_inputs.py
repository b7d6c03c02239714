"""No input makes the console answer 500: every form field, query parameter and path parameter of every
page, driven by hypothesis with far and impossible dates, non-finite and huge numbers, empty and long
values, any unicode (NUL included), formula and markup text and deep nesting, against the real stack.
Each answer is a success (2xx, a redirect) or a 4xx that says what was wrong: on an HTML page a
``class="error"`` message beside the form, in plain text a sentence.  Payment notifications are bounded
in size and nesting before they are parsed."""
from __future__ import annotations

import json
from typing import Any, Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Gateway
from control.admin import AdminError, pln_to_micro
from control.console.payments.base import BadNotification, load_notification
from test_console_support import ConsoleClient, signed_up

EDGES = ["", " ", "0", "-0", "-1", "0,00", "0.001", "Infinity", "-Infinity", "inf", "NaN", "sNaN", "-sNaN",
         "1e999999999", "1E-999999999", "9" * 400, "99999999999999999999.99", "12,50", "1_000",
         "31.12.9999", "9999-12-31", "0001-01-01", "01.01.0001", "00.00.0000", "29.02.2023", "32.01.2026",
         "99.99.99999999999999999999", "2026-13-01", "+2026-01-01", "\x00", "a\x00b", "\t\r\n", "ż" * 300,
         "<script>alert(1)</script>", "=HYPERLINK(\"x\")", "'; DROP TABLE users; --", "[" * 2000, "{" * 2000,
         "%00", "%", "../../etc/passwd", "\u202e", "\ufeff", "𝕏" * 50, "owner", "member", "ok", "errors", "500"]
VALUES = st.one_of(st.sampled_from(EDGES), st.text(max_size=80), st.integers().map(str),
                   st.floats().map(str), st.dates().map(lambda d: d.strftime("%d.%m.%Y")),
                   st.dates().map(lambda d: d.isoformat()), st.integers(1, 2500).map(lambda n: "[" * n))  # 3 bytes a bracket in a URL; httpx takes 64 KiB at most
EXAMPLES = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

FILTERS = ("from", "to", "key", "alias", "status", "request_id")
# (method, path, the fields the page reads: the query's for GET, the form's for POST)
FORMS: list[tuple[str, str, tuple[str, ...]]] = [
    ("GET", "/", ("msg",)),
    ("GET", "/usage", FILTERS),
    ("GET", "/usage/live", FILTERS),
    ("GET", "/usage.csv", FILTERS),
    ("GET", "/login", ("next", "msg")),
    ("GET", "/billing", ("payment", "cancelled")),
    ("GET", "/dev/mail", ("to",)),
    ("GET", "/dev/mail.json", ("to",)),
    ("POST", "/signup", ("email", "password", "org")),
    ("POST", "/login", ("email", "password", "next")),
    ("POST", "/reset", ("email",)),
    ("POST", "/keys", ("name", "form_id")),
    ("POST", "/billing/topup", ("amount",)),
    ("POST", "/billing/low-balance", ("threshold",)),
    ("POST", "/billing/details", ("name", "nip", "address", "person")),
    ("POST", "/members/invite", ("email", "role")),
    ("POST", "/members/2fa", ("require",)),
    ("POST", "/login/2fa", ("code",)),
    ("POST", "/account/security/enable", ("code",)),
    ("POST", "/account/security/disable", ("code",)),
    ("POST", "/org/switch", ("org",)),
    ("POST", "/lang", ("lang", "next")),
]
# pages named by a value in their path ({} stands for it), and the form fields they read
PATHS: list[tuple[str, str, tuple[str, ...]]] = [
    ("GET", "/confirm/{}", ()), ("POST", "/confirm/{}", ()),
    ("GET", "/reset/{}", ()), ("POST", "/reset/{}", ("password",)),
    ("GET", "/invite/{}", ()), ("POST", "/invite/{}", ("password",)),
    ("POST", "/keys/{}/revoke", ()), ("POST", "/members/{}/remove", ("keep_keys",)),
    ("POST", "/members/{}/role", ("role",)),
    ("POST", "/members/invites/{}/revoke", ()),
    ("GET", "/billing/payment/{}", ()), ("POST", "/billing/payment/{}/cancel", ()),
    ("POST", "/billing/payment/{}/retry", ()), ("GET", "/billing/return/{}", ("cancelled",)),
    ("GET", "/billing/invoices/{}.pdf", ()), ("GET", "/sandbox/pay/{}", ()), ("POST", "/sandbox/pay/{}", ("action",)),
]


@pytest.fixture(scope="module")
def owner(gateway: Gateway) -> Iterator[ConsoleClient]:
    c, _, _ = signed_up(gateway)
    try:
        yield c
    finally:
        c.close()


def answered_well(r: httpx.Response, what: str) -> None:
    """A success, or a 4xx that says what was wrong; never a 5xx."""
    assert r.status_code < 500, (what, r.status_code, r.text[:500])
    if 400 <= r.status_code < 500:
        if r.headers.get("content-type", "").startswith("text/html"):
            assert 'class="error"' in r.text, (what, r.status_code, r.text[:500])
        else:
            assert r.text.strip(), (what, r.status_code)


def send(c: ConsoleClient, method: str, path: str, fields: dict[str, str]) -> httpx.Response:
    if method == "GET":
        return c.get(path, follow=False, params=fields)
    c.get("/keys")  # a page of this session: its CSRF token (and the key form's id)
    return c.post(path, fields)


@pytest.mark.parametrize("method,path,names", FORMS, ids=[f"{m} {p}" for m, p, _ in FORMS])
@EXAMPLES
@given(data=st.data())
def test_every_field_of_every_form_and_filter(gateway: Gateway, owner: ConsoleClient, method: str, path: str,
                                              names: tuple[str, ...], data: st.DataObject) -> None:
    fields = {n: data.draw(VALUES, label=n) for n in names if data.draw(st.booleans(), label=f"send {n}")}
    answered_well(send(owner, method, path, fields), f"{method} {path} {fields!r}"[:300])


@pytest.mark.parametrize("method,path,names", PATHS, ids=[f"{m} {p}" for m, p, _ in PATHS])
@EXAMPLES
@given(value=VALUES.filter(bool), data=st.data())
def test_every_path_parameter(gateway: Gateway, owner: ConsoleClient, method: str, path: str,
                              names: tuple[str, ...], value: str, data: st.DataObject) -> None:
    fields = {n: data.draw(VALUES, label=n) for n in names}
    url = path.format(quote(value, safe=""))
    answered_well(send(owner, method, url, fields), f"{method} {url[:200]} {fields!r}"[:300])


@EXAMPLES
@given(token=VALUES)
def test_any_form_token_is_refused_with_403(gateway: Gateway, owner: ConsoleClient, token: str) -> None:
    """The form's CSRF token itself, any text (one with a letter beyond ASCII answered 500)."""
    r = owner.post("/keys", {"name": "k"}, csrf=token)
    if "\x00" in token:  # refused as a value that cannot be used, before its check
        assert r.status_code == 400 and "The field “csrf” holds a character that cannot be used" in r.text
    else:
        assert r.status_code == 403 and "The form expired or did not come from this site" in r.text, r.status_code


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                    max_leaves=20)
BODIES = st.one_of(
    JSON.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 60_000).map(lambda n: b"[" * n + b"]" * n),  # 30,000 brackets answered 500 before
    st.integers(1, 30_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.binary(max_size=200),
    st.fixed_dictionaries({"paymentId": st.text(max_size=30), "amountMicroPln": st.integers(),
                           "status": st.sampled_from(["paid", "failed", "x"]), "transactionId": st.text(max_size=10),
                           "sign": st.text(max_size=64)}).map(lambda d: json.dumps(d).encode()))


@EXAMPLES
@given(body=BODIES, content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded"]))
def test_payment_notifications_any_body(gateway: Gateway, body: bytes, content_type: str) -> None:
    r = httpx.post(gateway.console + "/payments/notify/sandbox", content=body, headers={"Content-Type": content_type})
    if len(body) > 64 * 1024:  # the console's body limit, before anything reads it
        assert r.status_code == 413 and "Maximum request body size" in r.text, (r.status_code, r.text[:200])
    else:
        assert r.status_code == 400 and r.text == "refused", (r.status_code, r.text[:200])


def test_notifications_are_bounded_before_they_are_parsed() -> None:
    for body, why in ((b"[" * 30_000, "too big"), (b"[" * 9 + b"]" * 9, "nested too deep"),
                      (b'{"a": ' * 9 + b"1" + b"}" * 9, "nested too deep"), (b"\xff", "not JSON")):
        with pytest.raises(BadNotification, match=why):
            load_notification(body)
    assert load_notification(b'{"s": "[[[[[[[[[[[[[[[[[[[[", "n": [[1]]}') == {"s": "[" * 20, "n": [[1]]}


@pytest.mark.parametrize("text", ["Infinity", "-Infinity", "NaN", "sNaN", "1e999999999", "1e-999999999", "1000000000001"])
def test_an_amount_is_finite_and_bounded(text: str) -> None:
    with pytest.raises(AdminError):
        pln_to_micro(text)
    assert pln_to_micro("1000000000000") == 10**18


def _field_error(c: ConsoleClient, path: str, query: dict[str, Any]) -> str:
    r = c.get(path, follow=False, params=query)
    assert r.status_code == 400, (path, query, r.status_code)
    return r.text


def test_far_dates_are_told_beside_the_filter(owner: ConsoleClient) -> None:
    """The dates that answered 500 (OverflowError, DataError) are a 400 with the filter's message."""
    for q in ({"to": "31.12.9999"}, {"to": "9999-12-31"}, {"from": "0001-01-01"}, {"from": "01.01.0001"}):
        for path in ("/usage", "/usage/live"):
            text = _field_error(owner, path, q)
            assert 'class="error"' in text and ">Dates from 1 Jan 1970 to 31 Dec 9998 only.<" in text, text[-2000:]
        r = owner.get("/usage.csv", follow=False, params=q)
        assert r.status_code == 400 and r.text == "Dates from 1 Jan 1970 to 31 Dec 9998 only."
    assert owner.get("/usage", follow=False, params={"from": "01.01.1970", "to": "31.12.9998"}).status_code == 200


def test_non_finite_amounts_are_told_beside_the_form(owner: ConsoleClient) -> None:
    for amount in ("Infinity", "sNaN", "NaN", "1e999999999"):
        owner.get("/billing")
        r = owner.post("/billing/topup", {"amount": amount})
        assert r.status_code == 400 and "Choose an amount from" in r.text, (amount, r.status_code)
        owner.get("/billing")
        r = owner.post("/billing/low-balance", {"threshold": amount})
        assert r.status_code == 400 and "Enter a threshold from" in r.text, (amount, r.status_code)


def test_a_nul_character_is_refused_naming_the_field(owner: ConsoleClient) -> None:
    owner.get("/billing")
    r = owner.post("/billing/details", {"name": "Firma", "address": "ul. Prosta 1\x00", "nip": "", "person": "1"})
    assert r.status_code == 400 and "The field “address” holds a character that cannot be used" in r.text
    r = owner.get("/usage", follow=False, params={"key": "k\x00"})
    assert r.status_code == 400 and "The field “key” holds a character that cannot be used" in r.text
