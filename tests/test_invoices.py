"""VAT invoices: the NIP checksum, net and VAT exact in grosze, a gap-free number per
year under concurrent payments, the PDF read back (pypdf), the billing details form, the download from
Billing and the payment e-mail with the PDF attached."""
from __future__ import annotations

import email
import io
import re
import threading
from email import policy

import httpx
import pypdf
import pytest

from conftest import Gateway, wait_for
from fa3_schema import made_documents
from control.console.invoices import nip_valid, pln_text, split_gross
from test_console_billing import sandbox, start_topup
from test_console_support import mails, signed_up


@pytest.mark.parametrize("nip,ok", [("5260250274", True), ("526-025-02-74", True), ("526 025 02 74", True),
                                    ("5260250275", False), ("526025027", False), ("52602502741", False),
                                    ("abcdefghij", False), ("0000000000", True), ("1234567890", False)])
def test_nip_checksum(nip: str, ok: bool) -> None:
    assert nip_valid(nip) is ok


def test_net_and_vat_are_exact_in_grosze() -> None:
    assert split_gross(12_300) == (10_000, 2_300)   # 123,00 zł = 100,00 + 23,00
    assert split_gross(1_000) == (813, 187)         # 10,00 zł: 8,13 (813.008…) + 1,87
    assert split_gross(1) == (1, 0)                 # 0,01 zł: 0.813 rounds to 1
    for gross in range(1, 5000):
        net, vat = split_gross(gross)
        assert net + vat == gross and abs(net * 123 - gross * 100) <= 62  # the nearest grosz, half up
    assert pln_text(123_456_78) == "123\u00a0456,78 zł"


def _pay(gw: Gateway, amount: str, c: object) -> str:
    pid = start_topup(c, amount)  # type: ignore[arg-type]
    sb = sandbox(gw)
    r = httpx.post(gw.console + "/payments/notify/sandbox", json=sb.notification(pid, int(float(amount.replace(",", ".")) * 100) * 10_000, True))
    assert r.json() == {"status": "paid", "credited": True}, r.text
    return pid


def test_a_paid_top_up_gets_an_invoice_with_the_buyers_details(gateway: Gateway) -> None:
    c, owner, org = signed_up(gateway)
    c.get("/billing")
    bad = c.post("/billing/details", {"name": "Piekarnia Kowalski sp. z o.o.", "nip": "5260250275",
                                      "address": "ul. Długa 1, 00-001 Warszawa"})
    assert bad.status_code == 400 and "NIP is not valid" in bad.text
    ok = c.post("/billing/details", {"name": "Piekarnia Kowalski sp. z o.o.", "nip": "526-025-02-74",
                                     "address": "ul. Długa 1, 00-001 Warszawa"})
    assert ok.status_code == 303
    pid = _pay(gateway, "123", c)
    [inv] = gateway.sql("SELECT * FROM invoices WHERE payment_id = $1", pid)
    assert re.fullmatch(r"FV/\d{4}/\d{6}", inv["number"]) and inv["number"] == f"FV/{inv['year']}/{inv['seq']:06d}"
    assert (inv["gross_grosze"], inv["net_grosze"], inv["vat_grosze"], inv["vat_pct"]) == (12_300, 10_000, 2_300, 23)
    assert (inv["buyer_name"], inv["buyer_nip"], inv["buyer_person"]) == ("Piekarnia Kowalski sp. z o.o.",
                                                                         "5260250274", False)
    [doc] = made_documents(gateway, [inv["number"]])  # its FA(3) document, valid (KSeF not configured: kept)
    assert doc["state"] == "kept" and b"<NIP>5260250274</NIP>" in doc["xml"] and b"<P_15>123.00</P_15>" in doc["xml"]
    # a repeated notification issues nothing more
    sb = sandbox(gateway)
    httpx.post(gateway.console + "/payments/notify/sandbox", json=sb.notification(pid, 123_000_000, True))
    assert len(gateway.sql("SELECT 1 FROM invoices WHERE payment_id = $1", pid)) == 1
    # on Billing, and its PDF says what the row says
    page = c.get("/billing").text
    assert inv["number"] in page and f'/billing/invoices/{inv["id"]}.pdf' in page
    r = c.get(f"/billing/invoices/{inv['id']}.pdf")
    assert r.status_code == 200 and r.headers["content-type"] == "application/pdf"
    text = " ".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(r.content)).pages)
    text = text.replace("\u00a0", " ")
    for want in (f"Faktura VAT nr {inv['number']}", "Piekarnia Kowalski sp. z o.o.", "ul. Długa 1",
                 "NIP: 5260250274", "100,00 zł", "23,00 zł", "123,00 zł", "23%"):
        assert want in text, (want, text)
    # another organisation cannot fetch it
    other, _, _ = signed_up(gateway)
    assert other.get(f"/billing/invoices/{inv['id']}.pdf").status_code == 404
    # the payment e-mail carries the PDF
    msg = wait_for(lambda: [m for m in mails(gateway, owner) if m["subject"].startswith("Payment received")],
                   timeout=10)[0]
    name = inv["number"].replace("/", "-") + ".pdf"
    assert inv["number"] in msg["body"] and msg["attachments"] == [name]
    eml = email.message_from_bytes((gateway.stack.state / "mail" / f"{msg['id']}.eml").read_bytes(),
                                   policy=policy.default)
    [att] = list(eml.iter_attachments())
    assert att.get_content_type() == "application/pdf"
    attached = " ".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(att.get_content())).pages)
    assert inv["number"] in attached and "123,00" in attached


def test_numbers_are_gap_free_under_concurrent_payments(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    pids = [start_topup(c, "10") for _ in range(12)]
    sb = sandbox(gateway)
    url = gateway.console + "/payments/notify/sandbox"
    replies: list[int] = []
    threads = [threading.Thread(target=lambda p=p: replies.append(
        httpx.post(url, json=sb.notification(p, 10_000_000, True), timeout=30).status_code)) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert replies == [200] * 12
    rows = gateway.sql("SELECT year, seq, number FROM invoices WHERE payment_id = ANY($1)", pids)
    assert len(rows) == 12 and len({r["number"] for r in rows}) == 12
    year = rows[0]["year"]
    every = sorted(r["seq"] for r in gateway.sql("SELECT seq FROM invoices WHERE year = $1", year))
    assert every == list(range(1, len(every) + 1))  # the whole year's sequence: no gap, no repeat
    [counter] = gateway.sql("SELECT last FROM invoice_counters WHERE year = $1", year)
    assert counter["last"] == len(every)
    assert len(made_documents(gateway, [r["number"] for r in rows])) == 12


def test_a_private_person_needs_no_nip(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    c.get("/billing")
    assert c.post("/billing/details", {"person": "1", "name": "Jan Kowalski", "nip": "",
                                       "address": "ul. Krótka 2, Kraków"}).status_code == 303
    pid = _pay(gateway, "10,50", c)
    [inv] = gateway.sql("SELECT * FROM invoices WHERE payment_id = $1", pid)
    assert (inv["buyer_person"], inv["buyer_nip"], inv["gross_grosze"]) == (True, None, 1_050)
    [doc] = made_documents(gateway, [inv["number"]])
    assert b"<BrakID>1</BrakID>" in doc["xml"] and b"<P_15>10.50</P_15>" in doc["xml"]
    r = c.get(f"/billing/invoices/{inv['id']}.pdf")
    text = pypdf.PdfReader(io.BytesIO(r.content)).pages[0].extract_text()
    assert "osoba prywatna" in text and "Jan Kowalski" in text
