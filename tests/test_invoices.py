"""VAT invoices: the NIP checksum, net and VAT exact in grosze, a gap-free number per series and
year under concurrent payments, the billing details required before paying (the form keeping what was
typed), corrections, the PDF read back (pypdf) in Polish and with English labels, the download from
Billing, the payment e-mail with the PDF attached, and `gateway invoices`."""
from __future__ import annotations

import datetime as dt
import email
import io
import json
import re
import threading
from dataclasses import dataclass
from email import policy

import httpx
import pypdf
import pytest

from conftest import Gateway, wait_for
from core.catalog import WARSAW
from control.console.invoices import nip_valid, normal_nip, pln_text, split_gross
from fa3_schema import made_documents
from test_console_billing import sandbox, start_topup
from test_console_support import mails, signed_up


@pytest.mark.parametrize("nip,ok", [("5260250274", True), ("526-025-02-74", True), ("526 025 02 74", True),
                                    ("PL5260250274", True), ("pl 526-025-02-74", True), ("PL526025027", False),
                                    ("5260250275", False), ("526025027", False), ("52602502741", False),
                                    ("abcdefghij", False), ("0000000000", True), ("1234567890", False)])
def test_nip_checksum(nip: str, ok: bool) -> None:
    assert nip_valid(nip) is ok


def test_a_nip_is_kept_as_its_ten_digits() -> None:
    assert normal_nip("PL 526-025-02-74") == normal_nip("pl5260250274") == "5260250274"


def test_net_and_vat_are_exact_in_grosze() -> None:
    assert split_gross(12_300) == (10_000, 2_300)   # 123,00 zł = 100,00 + 23,00
    assert split_gross(1_000) == (813, 187)         # 10,00 zł: 8,13 (813.008…) + 1,87
    assert split_gross(1) == (1, 0)                 # 0,01 zł: 0.813 rounds to 1
    for gross in range(1, 5000):
        net, vat = split_gross(gross)
        assert net + vat == gross and abs(net * 123 - gross * 100) <= 62  # the nearest grosz, half up
    assert pln_text(123_456_78) == "123\u00a0456,78 zł" and pln_text(-5) == "-0,05 zł"


def pdf_text(pdf: bytes) -> str:
    """The PDF's text, every run of white space one space."""
    return " ".join(" ".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(pdf)).pages).split())


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
    text = pdf_text(r.content)
    day = gateway.sql("SELECT to_char(issued_at AT TIME ZONE 'Europe/Warsaw', 'DD.MM.YYYY') AS d FROM invoices"
                      " WHERE id = $1", inv["id"])[0]["d"]
    # the reader's language is English: the English labels beside the Polish ones
    for want in (f"Faktura VAT nr / VAT invoice No. {inv['number']}", "Piekarnia Kowalski sp. z o.o.", "ul. Długa 1",
                 "NIP: 5260250274", f"Data wystawienia / Issue date: {day}",
                 f"Data sprzedaży (otrzymania zapłaty) / Date of sale (payment received): {day}",
                 "Ilość /", "J.m. /", "Cena netto /", "Net unit price",
                 "Top-up of the service balance", "1 usł. 100,00 zł 100,00 zł 23% 23,00 zł 123,00 zł",
                 "23% 100,00 zł 23,00 zł 123,00 zł", "Razem / Total 100,00 zł 23,00 zł 123,00 zł",
                 "Sposób płatności / Payment method: płatność testowa (tryb deweloperski) / test payment (development mode)",
                 f"Zapłacono / Paid: 123,00 zł, dnia / on {day}", "Do zapłaty / Amount due: 0,00 zł",
                 "przedpłata na saldo", "documents a prepayment received in full before the service"):
        assert want in text, (want, text)
    assert re.search(r"\d{4}-\d{2}-\d{2}", text) is None  # no ISO dates
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
    attached = pdf_text(att.get_content())
    assert f"Faktura VAT nr / VAT invoice No. {inv['number']}" in attached and "123,00 zł" in attached


def test_numbers_are_gap_free_under_concurrent_payments(gateway: Gateway) -> None:
    """50 payment notifications at once through the sandbox provider's endpoint: 50 consecutive numbers,
    one invoice for each payment.  The organisation (the CLI's, with billing details) has no console
    owner, so no 50 PDFs are rendered and mailed after: Pay and the mail are the other tests'."""
    org = gateway.new_org(0)[0]
    gateway.sql("UPDATE orgs SET billing_name = 'Hurtownia sp. z o.o.', billing_nip = '5260250274',"
                " billing_address = 'ul. Szeroka 9, Poznań' WHERE id = $1", org)
    pids = [r["id"] for r in gateway.sql(
        "INSERT INTO payments (id, org_id, provider, amount_micro_pln) SELECT 'pay_' || md5(random()::text || g),"
        " $1, 'sandbox', 10000000 FROM generate_series(1, 50) g RETURNING id", org)]
    sb = sandbox(gateway)
    url = gateway.console + "/payments/notify/sandbox"
    replies: list[int] = []
    go = threading.Barrier(50)

    def notify(pid: str) -> None:
        go.wait()
        replies.append(httpx.post(url, json=sb.notification(pid, 10_000_000, True), timeout=60).status_code)

    threads = [threading.Thread(target=notify, args=(p,)) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert replies == [200] * 50
    assert gateway.admin(lambda a: a.balance(org))["balance_micro_pln"] == 500_000_000  # each credited once
    rows = gateway.sql("SELECT payment_id, series, year, seq, number FROM invoices WHERE payment_id = ANY($1)", pids)
    assert sorted(r["payment_id"] for r in rows) == sorted(pids)  # each payment's invoice exactly once
    assert {r["series"] for r in rows} == {"FV"}
    seqs = sorted(r["seq"] for r in rows)
    assert seqs == list(range(seqs[0], seqs[0] + 50))  # 50 consecutive numbers (other tests' come before)
    year = rows[0]["year"]
    every = sorted(r["seq"] for r in gateway.sql("SELECT seq FROM invoices WHERE series = 'FV' AND year = $1", year))
    assert every == list(range(1, len(every) + 1))  # the whole year's series: no gap, no repeat
    [counter] = gateway.sql("SELECT last FROM invoice_counters WHERE series = 'FV' AND year = $1", year)
    assert counter["last"] == len(every)
    assert len(made_documents(gateway, [r["number"] for r in rows])) == 50  # each also as FA(3)


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
    c.jar["lang"] = "pl"
    text = pdf_text(c.get(f"/billing/invoices/{inv['id']}.pdf").content)
    # in Polish: no English beside
    assert "osoba prywatna" in text and "Jan Kowalski" in text and "Faktura VAT nr FV/" in text
    assert "Issue date" not in text and "private person" not in text and "Do zapłaty: 0,00 zł" in text


def test_the_buyer_is_known_before_paying(gateway: Gateway) -> None:
    c, _, org = signed_up(gateway)
    page = c.get("/billing").text
    assert 'id="details-missing"' in page and "the name or company, the address, the NIP, or the choice of a" \
        " private person" in page and 'href="#details"' in page
    # Pay without billing details: Billing again, the amount kept, the message beside it, nothing registered
    r = c.post("/billing/topup", {"amount": "12,50"})
    assert r.status_code == 400 and 'name="amount"' in r.text and 'value="12,50"' in r.text
    assert re.search(r'aria-describedby="amount-error".*id="amount-error" role="alert">Before paying, fill in the'
                     r' billing details for the invoice: the name or company, the address, the NIP, or the choice'
                     r' of a private person\. <a href="#details">', r.text, re.S), r.text[-3000:]
    assert gateway.sql("SELECT count(*) AS n FROM payments WHERE org_id = $1", org) == [{"n": 0}]
    # nor does retrying a payment that failed (one started before the details were required)
    gateway.sql("INSERT INTO payments (id, org_id, provider, amount_micro_pln, status) VALUES"
                " ('pay_old_' || $1, $1, 'sandbox', 10000000, 'failed')", org)
    r = c.post(f"/billing/payment/pay_old_{org}/retry", {})
    assert r.status_code == 400 and 'id="amount-error"' in r.text and "Before paying, fill in" in r.text
    assert gateway.sql("SELECT count(*) AS n FROM payments WHERE org_id = $1", org) == [{"n": 1}]
    # a wrong NIP: every typed field back, the message beside the NIP, nothing saved
    typed = {"person": "", "name": "Druga Firma Sp. j.", "nip": "PL5260250275", "address": "ul. Polna 3\n00-950 Warszawa"}
    r = c.post("/billing/details", typed)
    assert r.status_code == 400
    assert 'name="name" maxlength="200"' in r.text and 'value="Druga Firma Sp. j."' in r.text
    assert 'value="PL5260250275"' in r.text and ">ul. Polna 3\n00-950 Warszawa</textarea>" in r.text
    assert re.search(r'name="nip"[^>]*aria-invalid="true" aria-describedby="nip-error"[^>]*>\s*</label>\s*'
                     r'<p class="error" id="nip-error" role="alert">The NIP is not valid', r.text), r.text[-3000:]
    assert "name-error" not in r.text and "address-error" not in r.text
    assert gateway.sql("SELECT billing_name FROM orgs WHERE id = $1", org) == [{"billing_name": None}]
    # a low-balance threshold out of range keeps what was typed too
    r = c.post("/billing/low-balance", {"threshold": "0,001"})
    assert r.status_code == 400 and 'value="0,001"' in r.text and 'id="threshold-error"' in r.text
    # "PL5260250274" (the EU form) passes, stored as its 10 digits; then Pay goes to the provider
    ok = c.post("/billing/details", {**typed, "nip": "PL5260250274"})
    assert ok.status_code == 303 and ok.headers["location"] == "/billing?msg=details_saved#details"
    assert gateway.sql("SELECT billing_nip, billing_person FROM orgs WHERE id = $1", org) == [
        {"billing_nip": "5260250274", "billing_person": False}]
    page = c.get("/billing").text
    assert 'id="details-missing"' not in page and 'value="5260250274"' in page
    assert c.post("/billing/topup", {"amount": "10001"}).status_code == 400  # the amount's own check follows
    assert start_topup(c, "10")


def test_changed_details_are_corrected_by_a_corrective_invoice(gateway: Gateway) -> None:
    c, owner, org = signed_up(gateway)
    c.get("/billing")
    assert c.post("/billing/details", {"person": "1", "name": "Druga Firma Sp. j.", "nip": "",
                                       "address": "ul. Polna 3, Warszawa"}).status_code == 303
    pid = _pay(gateway, "10", c)
    [orig] = gateway.sql("SELECT * FROM invoices WHERE payment_id = $1", pid)
    assert 'id="correct"' not in c.get("/billing").text  # nothing to correct yet
    assert c.post("/billing/details", {"person": "", "name": "Druga Firma Sp. j.", "nip": "526 025 02 74",
                                       "address": "ul. Polna 3, 00-950 Warszawa"}).status_code == 303
    page = c.get("/billing").text
    assert re.search(r'id="correct".*1 invoice carries billing details that have since changed: '
                     + re.escape(orig["number"]), page, re.S), page
    r = c.post("/billing/invoices/correct", {})
    assert r.status_code == 303 and r.headers["location"] == "/billing?msg=corrected#invoices-heading"
    [fix] = gateway.sql("SELECT * FROM invoices WHERE corrects = $1", orig["id"])
    assert re.fullmatch(r"FK/\d{4}/\d{6}", fix["number"]) and fix["series"] == "FK"
    assert (fix["payment_id"], fix["previous"], fix["reason"]) == (pid, orig["id"], "Korekta danych nabywcy")
    assert (fix["buyer_nip"], fix["buyer_person"], fix["buyer_address"]) == ("5260250274", False,
                                                                           "ul. Polna 3, 00-950 Warszawa")
    assert (fix["gross_grosze"], fix["net_grosze"], fix["vat_grosze"]) == (1_000, 813, 187)
    # its FA(3) document is KOR naming the original (KSeF not configured: kept, the original never in KSeF)
    [kor] = made_documents(gateway, [fix["number"]])
    for want in ("<RodzajFaktury>KOR</RodzajFaktury>", f"<NrFaKorygowanej>{orig['number']}</NrFaKorygowanej>",
                 "<NrKSeFN>1</NrKSeFN>", "<NIP>5260250274</NIP>", "<P_15>0.00</P_15>"):
        assert want.encode() in kor["xml"], (want, kor["xml"])
    # the original stays as issued; the correction is listed, and a second request issues nothing
    assert gateway.sql("SELECT buyer_person FROM invoices WHERE id = $1", orig["id"]) == [{"buyer_person": True}]
    page = c.get("/billing?msg=corrected").text
    assert "Corrective invoices issued" in page and f"corrects {orig['number']}" in page and 'id="correct"' not in page
    c.post("/billing/invoices/correct", {})
    assert len(gateway.sql("SELECT 1 FROM invoices WHERE corrects = $1", orig["id"])) == 1
    # its PDF: before and after, the original's number and date
    text = pdf_text(c.get(f"/billing/invoices/{fix['id']}.pdf").content)
    for want in (f"Faktura korygująca nr / Corrective invoice No. {fix['number']}",
                 f"Dotyczy faktury / Corrects invoice {orig['number']} z dnia / of",
                 "Przyczyna korekty / Reason for correction: Korekta danych nabywcy",
                 "Nabywca przed korektą / Buyer before correction Druga Firma Sp. j. ul. Polna 3, Warszawa"
                 " osoba prywatna / private person",
                 "Nabywca po korekcie / Buyer after correction Druga Firma Sp. j. ul. Polna 3, 00-950 Warszawa"
                 " NIP: 5260250274", "Pozycje przed korektą", "Pozycje po korekcie",
                 "Różnica (korekta wartości) / Difference (value corrected): 0,00 zł"):
        assert want in text, (want, text)
    # mailed to the owner with its PDF
    msg = wait_for(lambda: [m for m in mails(gateway, owner) if m["subject"] == f"Corrected invoice {fix['number']}"],
                   timeout=10)[0]
    assert orig["number"] in msg["body"] and msg["attachments"] == [fix["number"].replace("/", "-") + ".pdf"]
    # the corrections' own series is gapless too
    every = sorted(r["seq"] for r in gateway.sql("SELECT seq FROM invoices WHERE series = 'FK' AND year = $1",
                                                 fix["year"]))
    assert every == list(range(1, len(every) + 1))


def test_gateway_invoices_cli(gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    c, owner, org = signed_up(gateway)
    c.get("/billing")
    assert c.post("/billing/details", {"person": "1", "name": "Jan Nowak", "address": "ul. Lipowa 5, Gdańsk"}
                  ).status_code == 303
    pid = _pay(gateway, "24,60", c)
    [inv] = gateway.sql("SELECT * FROM invoices WHERE payment_id = $1", pid)

    def cli(*args: str) -> Ran:
        return _cli(gateway, monkeypatch, capsys, *args)

    r = cli("invoices", "list", org, "--json")
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)
    assert (row["number"], row["series"], row["gross_grosze"], row["due_grosze"], row["payment_method"]) == (
        inv["number"], "FV", 2_460, 0, "sandbox")
    assert row["buyer"] == {"name": "Jan Nowak", "nip": None, "address": "ul. Lipowa 5, Gdańsk", "person": True}
    assert row["lines"] == [{"name": "Doładowanie salda usługi (przedpłata)", "quantity": 1, "unit": "usł.",
                             "net_unit_grosze": 2_000, "vat_pct": 23, "net_grosze": 2_000, "vat_grosze": 460,
                             "gross_grosze": 2_460}]
    assert row["totals"] == [{"vat_pct": 23, "net_grosze": 2_000, "vat_grosze": 460, "gross_grosze": 2_460}]
    assert row["correction"] is None and row["prepayment"] is True
    assert row["issue_date"] == row["paid_on"] == row["sale_date"] == dt.datetime.fromisoformat(
        row["issued_at"]).astimezone(WARSAW).date().isoformat()  # ISO dates; paid and issued the same day
    r = cli("invoices", "show", org, inv["number"])
    assert r.returncode == 0 and "1 usł. Doładowanie salda usługi (przedpłata): net 20,00 zł each, 23% VAT" in \
        r.stdout.replace("\u00a0", " "), r.stdout
    # another organisation's invoice is not found through this one
    other = gateway.admin(lambda a: a.create_org("Other", 0))
    r = cli("invoices", "show", other, inv["number"])
    assert r.returncode == 2 and f"organisation {other} has no invoice {inv['number']}" in r.stderr
    # resend: the owner gets the invoice again
    def invoice_mails() -> list[dict[str, object]]:
        return [m for m in mails(gateway, owner) if m["attachments"] == [inv["number"].replace("/", "-") + ".pdf"]]

    wait_for(lambda: len(invoice_mails()) == 1, timeout=10)  # the payment's
    r = cli("--json", "invoices", "resend", org, inv["id"])
    assert r.returncode == 0 and json.loads(r.stdout) == {"number": inv["number"], "sent": 1}, r.stderr
    assert len(invoice_mails()) == 2  # sent before the command returned
    # correct: nothing while the details stand; after a change, one correction, listed first
    r = cli("invoices", "correct", org)
    assert r.returncode == 0 and r.stdout == "nothing to correct: every invoice carries the billing details in force\n"
    gateway.sql("UPDATE orgs SET billing_name = 'Jan Nowak-Kowalski' WHERE id = $1", org)
    r = cli("invoices", "correct", org, "--json")
    assert r.returncode == 0, r.stderr
    [fix] = json.loads(r.stdout)
    assert fix["series"] == "FK" and fix["buyer"]["name"] == "Jan Nowak-Kowalski"
    assert fix["correction"]["original_number"] == inv["number"] and fix["correction"]["buyer_before"]["name"] == "Jan Nowak"
    assert gateway.sql("SELECT corrects FROM invoices WHERE number = $1", fix["number"]) == [{"corrects": inv["id"]}]
    # ksef, in the same group: the original's document made and kept (KSeF not configured); the correction,
    # listed first, is queued for one, which the console's loop makes on its next round (the CLI cannot wake it)
    made_documents(gateway, [inv["number"]])
    r = cli("invoices", "ksef", org)
    assert r.returncode == 0 and re.fullmatch(
        re.escape(fix["number"]) + r"  (new       FA\(3\) document not made yet|kept      not sent \(KSeF not configured\))\n"
        + re.escape(f"{inv['number']}  kept      not sent (KSeF not configured)") + "\n", r.stdout), r.stdout


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def _cli(gateway: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """The CLI's entry point in this process, as the development stack's operator runs it: its mail goes
    to the stack's capture server."""
    from control import cli
    s = gateway.stack.s
    with monkeypatch.context() as m:
        m.delenv("DATABASE_URL", raising=False)
        m.delenv("REDIS_URL", raising=False)
        for k, v in {"GATEWAY_PORT": str(s.gateway_port), "GATEWAY_STATE_DIR": str(s.state), "GATEWAY_DEV": "1",
                     "GATEWAY_CATALOG": s.catalog, "GATEWAY_SMTP_PORT": str(s.smtp_capture_port)}.items():
            m.setenv(k, v)
        code = cli.main(list(args))
    out, err = capsys.readouterr()
    return Ran(code, out, err)
