"""Invoices to KSeF end to end: the suite's stack with its console restarted with KSeF configured (the
real ksef-client SDK against tests/ksef_standin.py, the project's only stand-in: KSeF cannot be reached
from here).  A paid top-up's invoice is sent and gets its KSeF number (Billing, the PDF's QR code, the
CLI); with KSeF unreachable it is in the offline mode (OFFLINE QR code, the queue in the CLI) and is sent
after the console restarts (authenticating with the seller's certificate then, not the token); one KSeF
refuses is recorded as rejected.  Every FA(3) document is checked
against the official schema."""
from __future__ import annotations

import base64
import datetime as dt
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
from unittest import mock
from pathlib import Path
from typing import Any, Iterator

import httpx
import pypdf
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from ksef_client.utils.ksef_number import validate_ksef_number

from conftest import SELLER, Gateway, free_base, wait_for
from control.cli import main
from control.console.launch import console_proc
from fa3_schema import assert_fa3
from ksef_standin import KsefStandIn
from test_console_billing import sandbox, start_topup
from test_console_support import ConsoleClient, signed_up

TOKEN = "20261128-EC-0123456789-ABCDEF0123-45|nip-5213017228|" + "ab" * 32  # a KSeF token's form
BUYER = {"name": "Piekarnia Kowalski sp. z o.o.", "nip": "526-025-02-74", "address": "ul. Długa 1, 00-001 Warszawa"}


@dataclasses.dataclass
class Ksef:
    gw: Gateway
    standin: KsefStandIn

    def console(self, **changes: Any) -> None:
        """The stack's console (re)started with KSeF configured (and ``changes``)."""
        st = self.gw.stack
        st.stop_proc("console")
        s = dataclasses.replace(st.s, **{"ksef_env": "test", "ksef_token": TOKEN, "ksef_url": self.standin.url,
                                         "ksef_retry_s": 0.3, **changes})
        st.start_proc(console_proc(st.child_env(), s))


@pytest.fixture(scope="module")
def ksef(gateway: Gateway) -> Iterator[Ksef]:
    standin = KsefStandIn(token=TOKEN, nip=SELLER[1], port=free_base(span=1)).start()
    k = Ksef(gateway, standin)
    k.console()
    try:
        yield k
    finally:
        st = gateway.stack
        st.stop_proc("console")
        st.start_proc(console_proc(st.child_env(), st.s))  # the suite's own console back
        standin.stop()


def paid_invoice(gw: Gateway, amount: str = "123,45") -> tuple[ConsoleClient, str, dict[str, Any]]:
    """A new company that filled in its billing details and paid: (its client, org id, its invoice row)."""
    c, _, org = signed_up(gw)
    c.get("/billing")
    assert c.post("/billing/details", BUYER).status_code == 303
    pid = start_topup(c, amount)
    gross = int(amount.replace(",", "")) * 10_000
    r = httpx.post(gw.console + "/payments/notify/sandbox", json=sandbox(gw).notification(pid, gross, True))
    assert r.json() == {"status": "paid", "credited": True}, r.text
    [inv] = gw.sql("SELECT * FROM invoices WHERE payment_id = $1", pid)
    return c, org, inv


def document(gw: Gateway, number: str, *states: str) -> dict[str, Any]:
    """The invoice's ksef_documents row once it is in one of ``states``."""
    def find() -> dict[str, Any] | None:
        rows = gw.sql("SELECT * FROM ksef_documents WHERE number = $1 AND state = ANY($2)", number, list(states))
        return rows[0] if rows else None
    return dict(wait_for(find, timeout=30, interval=0.2))


def pdf_text(c: ConsoleClient, inv: dict[str, Any]) -> str:
    r = c.get(f"/billing/invoices/{inv['id']}.pdf")
    assert r.status_code == 200 and r.headers["content-type"] == "application/pdf"
    return " ".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(r.content)).pages).replace("\u00a0", " ")


def qr_link(doc: dict[str, Any]) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(doc["xml"]).digest()).decode().rstrip("=")
    return f"https://qr-test.ksef.mf.gov.pl/invoice/{SELLER[1]}/{doc['issued_on']:%d-%m-%Y}/{digest}"


def cli(gw: Gateway, *args: str) -> Any:
    """``gateway ARGS`` run as the operator runs it (its main(), this stack's state dir), in this process: a
    new interpreter per call would cost seconds."""
    s = gw.stack.s
    env = {"GATEWAY_PORT": str(s.gateway_port), "GATEWAY_STATE_DIR": str(s.state), "GATEWAY_CATALOG": s.catalog}
    out = io.StringIO()
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(out):
        for name in ("DATABASE_URL", "REDIS_URL"):
            os.environ.pop(name, None)
        assert main(list(args)) == 0
    return json.loads(out.getvalue()) if "--json" in args else out.getvalue()


def test_an_invoice_is_sent_and_gets_its_ksef_number(ksef: Ksef) -> None:
    gw = ksef.gw
    first_call = len(ksef.standin.calls)
    c, org, inv = paid_invoice(gw)
    doc = document(gw, inv["number"], "sent")
    number = doc["ksef_number"]
    assert validate_ksef_number(number).is_valid and number.startswith(SELLER[1] + "-")
    assert (doc["offline"], doc["attempts"], doc["problem"]) == (False, 0, None)
    # KSeF got exactly the stored document, decrypted, valid, online; what it says is the invoice
    [got] = [r for r in ksef.standin.received if r.number == inv["number"]]
    assert got.xml == doc["xml"] and got.offline is False and got.ksef_number == number
    root = assert_fa3(got.xml)
    ns = "{http://crd.gov.pl/wzor/2025/06/25/13775/}"
    assert [root.findtext(f"{ns}Fa/{ns}{f}") for f in ("P_2", "P_15", "P_13_1", "P_14_1", "RodzajFaktury")] == [
        inv["number"], "123.45", "100.37", "23.08", "VAT"]
    assert root.findtext(f"{ns}Podmiot2/{ns}DaneIdentyfikacyjne/{ns}NIP") == "5260250274"
    assert root.findtext(f"{ns}Podmiot1/{ns}DaneIdentyfikacyjne/{ns}NIP") == SELLER[1]
    # Billing shows the KSeF number and offers the XML; the PDF carries the number and the QR code's link
    page = c.get("/billing").text
    assert number in page and f"/billing/invoices/{inv['id']}.xml" in page
    xml = c.get(f"/billing/invoices/{inv['id']}.xml")
    assert xml.status_code == 200 and xml.headers["content-type"] == "application/xml; charset=utf-8"
    assert xml.content == doc["xml"]
    text = pdf_text(c, inv)
    assert f"Numer KSeF: {number}" in text and qr_link(doc) in text.replace("\n", ""), text
    assert "OFFLINE" not in text
    # another organisation gets neither
    other, _, _ = signed_up(gw)
    assert other.get(f"/billing/invoices/{inv['id']}.xml").status_code == 404
    # the CLI
    [row] = cli(gw, "invoices", "ksef", org, "--json")
    assert (row["number"], row["state"], row["ksef_number"], row["offline"]) == (inv["number"], "sent", number, False)
    assert cli(gw, "invoices", "ksef", org).strip() == f"{inv['number']}  sent      {number}"
    # what went to KSeF: exactly the stand-in's endpoints, the SDK's way through KSeF API v2
    auth = "POST /v2/auth/xades-signature" if ksef.standin.cert_pem else "POST /v2/auth/ksef-token"
    assert {re.sub(r"\d{8}-[A-Z]{2}-[0-9A-F-]+", "{ref}", call) for call in ksef.standin.calls[first_call:]} == {
        "GET /v2/security/public-key-certificates", "POST /v2/auth/challenge", auth,
        "GET /v2/auth/{ref}", "POST /v2/auth/token/redeem", "POST /v2/sessions/online",
        "POST /v2/sessions/online/{ref}/invoices", "POST /v2/sessions/online/{ref}/close",
        "GET /v2/sessions/{ref}/invoices/{ref}"}


def seller_certificate(standin: KsefStandIn, where: Path) -> dict[str, str]:
    """A certificate of the seller (its NIP in the subject) and its key as PEM files in ``where``, trusted by
    the stand-in: the settings that authenticate with it instead of the token."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SELLER[0]),
                      x509.NameAttribute(NameOID.SERIAL_NUMBER, f"VATPL-{SELLER[1]}")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30)).sign(key, hashes.SHA256()))
    standin.cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    (where / "ksef.crt").write_text(standin.cert_pem)
    (where / "ksef.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return {"ksef_token": "", "ksef_cert": str(where / "ksef.crt"), "ksef_key": str(where / "ksef.key")}


def test_unreachable_then_offline_then_sent_after_a_restart(ksef: Ksef, tmp_path: Path) -> None:
    """... and the console comes back authenticating with the seller's certificate (GATEWAY_KSEF_CERT/KEY,
    the challenge signed XAdES) instead of the token."""
    gw, standin = ksef.gw, ksef.standin
    standin.stop()  # KSeF cannot be reached
    try:
        c, org, inv = paid_invoice(gw, "10,00")
        doc = wait_for(lambda: (d := document(gw, inv["number"], "queued")) and d["attempts"] >= 2 and d, timeout=30)
        assert doc["offline"] is True and doc["ksef_number"] is None and doc["problem"] == "KSeF not reached"
        assert_fa3(doc["xml"])
        # the PDF is the offline mode's: the QR code labelled OFFLINE, with the document's link
        text = pdf_text(c, inv)
        assert "OFFLINE" in text and qr_link(doc) in text.replace("\n", "") and "Numer KSeF:" not in text
        assert "offline: to be sent" in c.get("/billing").text
        [row] = cli(gw, "invoices", "ksef", org, "--json")
        assert (row["state"], row["offline"], row["problem"]) == ("queued", True, "KSeF not reached")
        assert row["attempts"] >= 2
        line = cli(gw, "invoices", "ksef", org)
        assert line.startswith(f"{inv['number']}  queued    offline; ") and "KSeF not reached" in line
        gw.stack.stop_proc("console")  # the console goes down with the invoice still queued
        standin.start()  # KSeF is back on the same address
        assert document(gw, inv["number"], "queued")["ksef_number"] is None
        first_call = len(standin.calls)
    finally:
        if standin._server is None:
            standin.start()
        ksef.console(**seller_certificate(standin, tmp_path))  # ...and the console comes back: the queue is PostgreSQL's
    doc = document(gw, inv["number"], "sent")
    calls = standin.calls[first_call:]
    assert "POST /v2/auth/xades-signature" in calls and "POST /v2/auth/ksef-token" not in calls
    [got] = [r for r in standin.received if r.number == inv["number"]]
    assert got.offline is True and got.xml == doc["xml"] and doc["ksef_number"] == got.ksef_number
    assert doc["offline"] is True and doc["problem"] is None
    text = pdf_text(c, inv)
    assert f"Numer KSeF: {doc['ksef_number']}" in text and "OFFLINE" not in text
    assert cli(gw, "invoices", "ksef", org).strip() == f"{inv['number']}  sent      {doc['ksef_number']}  (issued offline)"


def test_an_invoice_ksef_refuses_is_recorded_as_rejected(ksef: Ksef) -> None:
    gw = ksef.gw
    ksef.standin.reject = True
    c, org, inv = paid_invoice(gw, "50,00")
    doc = document(gw, inv["number"], "rejected")
    assert doc["ksef_number"] is None
    assert doc["problem"] == "450 Błąd weryfikacji semantyki dokumentu faktury (Stand-in told to refuse this document.)"
    assert_fa3(doc["xml"])
    assert "rejected by KSeF" in c.get("/billing").text
    text = pdf_text(c, inv)
    assert "KSeF" not in text and "OFFLINE" not in text  # no QR code: the invoice is not in KSeF
    [row] = cli(gw, "invoices", "ksef", org, "--json")
    assert (row["state"], row["problem"]) == ("rejected", doc["problem"])
    # never sent again: the next invoice's round leaves it alone
    _, _, after = paid_invoice(gw, "11,00")
    document(gw, after["number"], "sent")
    assert [r.number for r in ksef.standin.received].count(inv["number"]) == 1
    assert gw.sql("SELECT state FROM ksef_documents WHERE number = $1", inv["number"]) == [{"state": "rejected"}]
