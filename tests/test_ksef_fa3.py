"""FA(3) documents of invoices and corrections (control/ksef/fa3.py, from the typed invoice record) read back and checked against the
official FA(3) schema (tests/fa3_schema.py): every field the invoice has, the correction's reference to
the original (number, issue date, KSeF number, the buyer before), a private person, and the schema's
refusal of what it must refuse; the QR codes of an invoice for KSeF (control/ksef/qr.py): KOD I, and KOD II
signed with the seller's offline certificate (a self-signed one made here) while the invoice is offline."""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import io
import logging
from pathlib import Path
from typing import Any, cast

import pypdf
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import NameOID
from ksef_client.documents.fa3 import FA3XmlValidationError

from control.console import invoice_pdf
from control.console.invoices import Buyer, Correction, Invoice, Seller, split_gross, topup_lines
from control.ksef import fa3, qr
from control.ksef.settings import KsefSettings
from control.ksef.worker import Worker
from core.catalog import WARSAW
from fa3_schema import assert_fa3, fa3_errors

SELLER = fa3.Party("Bramka Modeli sp. z o.o.", "5213017228", "ul. Marszałkowska 1, 00-624 Warszawa")
ISSUED = dt.datetime(2026, 11, 28, 23, 30, tzinfo=dt.timezone.utc)  # 29 November in Warsaw


BUYER = Buyer("Piekarnia Kowalski sp. z o.o.", "5260250274", "ul. Długa 1, 00-001 Warszawa", False)
DRUGA = Buyer("Druga Firma Sp. j.", None, "", False)  # issued before the details were filled in


def record(number: str = "FV/2026/000007", gross: int = 12_345, buyer: Buyer = BUYER, issued: dt.datetime = ISSUED,
           correction: Correction | None = None) -> Invoice:
    """An issued invoice as control/console/invoices.py records it (paid the day it is issued)."""
    day = ISSUED.astimezone(WARSAW).date()
    lines, totals = topup_lines(gross)
    return Invoice("inv_1", number, "FK" if correction else "FV", 2026, 7, "org_1", "pay_1", issued,
                   issued.astimezone(WARSAW).date(), day, day, "p24", buyer, lines, totals, gross, gross, 0, True,
                   correction)


def correction_of(number: str, before: Buyer) -> Invoice:
    """A correction of FV/2026/000007's buyer, issued three days later."""
    fix = Correction("inv_1", "FV/2026/000007", ISSUED.astimezone(WARSAW).date(), "Korekta danych nabywcy", before,
                     *topup_lines(12_345))
    return record(number, issued=ISSUED + dt.timedelta(days=3), correction=fix)


def text(root: Any, path: str) -> str | None:
    found = root.find(_ns(path))
    return None if found is None else str(found.text)


def _ns(path: str) -> str:
    return "/".join("{*}" + p for p in path.split("/"))


def test_an_invoice_says_what_the_invoice_says() -> None:
    xml = fa3.invoice_xml(record(), SELLER)
    root = assert_fa3(xml)
    assert root.find(_ns("Naglowek/KodFormularza")).attrib == {"kodSystemowy": "FA (3)", "wersjaSchemy": "1-0E"}
    expected = {"Podmiot1/DaneIdentyfikacyjne/NIP": "5213017228",
                "Podmiot1/DaneIdentyfikacyjne/Nazwa": "Bramka Modeli sp. z o.o.",
                "Podmiot1/Adres/AdresL1": "ul. Marszałkowska 1, 00-624 Warszawa",
                "Podmiot2/DaneIdentyfikacyjne/NIP": "5260250274",
                "Podmiot2/DaneIdentyfikacyjne/Nazwa": "Piekarnia Kowalski sp. z o.o.",
                "Podmiot2/Adres/AdresL1": "ul. Długa 1, 00-001 Warszawa",
                "Fa/KodWaluty": "PLN", "Fa/P_1": "2026-11-29", "Fa/P_2": "FV/2026/000007", "Fa/P_6": "2026-11-29",
                "Fa/P_13_1": "100.37", "Fa/P_14_1": "23.08", "Fa/P_15": "123.45", "Fa/RodzajFaktury": "VAT",
                "Fa/FaWiersz/P_7": "Doładowanie salda usługi (przedpłata)", "Fa/FaWiersz/P_8A": "usł.",
                "Fa/FaWiersz/P_8B": "1", "Fa/FaWiersz/P_9A": "100.37", "Fa/FaWiersz/P_11": "100.37",
                "Fa/FaWiersz/P_12": "23", "Fa/Platnosc/Zaplacono": "1", "Fa/Platnosc/DataZaplaty": "2026-11-29",
                "Fa/Platnosc/FormaPlatnosci": "6"}
    assert {p: text(root, p) for p in expected} == expected
    assert len(root.findall(_ns("Fa/FaWiersz"))) == 1


@pytest.mark.parametrize("gross", [1, 999, 1_000, 12_345, 100_000_00, 5_000_000_00])
def test_amounts_are_the_invoices_to_the_grosz(gross: int) -> None:
    net, vat = split_gross(gross)
    root = assert_fa3(fa3.invoice_xml(record(gross=gross), SELLER))
    assert (text(root, "Fa/P_13_1"), text(root, "Fa/P_14_1"), text(root, "Fa/P_15")) == (
        f"{net / 100:.2f}", f"{vat / 100:.2f}", f"{gross / 100:.2f}")


def test_a_private_person_has_no_nip() -> None:
    root = assert_fa3(fa3.invoice_xml(record(buyer=Buyer("Jan Kowalski", None, "", True)), SELLER))
    assert text(root, "Podmiot2/DaneIdentyfikacyjne/BrakID") == "1"
    assert root.find(_ns("Podmiot2/DaneIdentyfikacyjne/NIP")) is None and root.find(_ns("Podmiot2/Adres")) is None


def test_a_correction_is_kor_referencing_the_original_and_its_ksef_number() -> None:
    ksef = "5213017228-20261129-0A1B2C3D4E5F-1C"
    root = assert_fa3(fa3.correction_xml(correction_of("FK/2026/000001", DRUGA), SELLER, ksef))
    expected = {"Fa/RodzajFaktury": "KOR", "Fa/P_2": "FK/2026/000001", "Fa/P_1": "2026-12-02",
                "Fa/PrzyczynaKorekty": "Korekta danych nabywcy",
                "Fa/DaneFaKorygowanej/NrFaKorygowanej": "FV/2026/000007",
                "Fa/DaneFaKorygowanej/DataWystFaKorygowanej": "2026-11-29",
                "Fa/DaneFaKorygowanej/NrKSeF": "1", "Fa/DaneFaKorygowanej/NrKSeFFaKorygowanej": ksef,
                "Fa/Podmiot2K/DaneIdentyfikacyjne/Nazwa": "Druga Firma Sp. j.",
                "Fa/Podmiot2K/DaneIdentyfikacyjne/BrakID": "1",
                "Podmiot2/DaneIdentyfikacyjne/NIP": "5260250274",
                "Fa/P_13_1": "0.00", "Fa/P_14_1": "0.00", "Fa/P_15": "0.00"}
    assert {p: text(root, p) for p in expected} == expected
    before, after = root.findall(_ns("Fa/FaWiersz"))
    assert text(before, "StanPrzed") == "1" and text(after, "StanPrzed") is None
    assert [text(w, "P_11") for w in (before, after)] == ["100.37", "100.37"]


def test_a_correction_of_an_invoice_never_in_ksef_says_so() -> None:
    root = assert_fa3(fa3.correction_xml(correction_of("FK/2026/000002", BUYER), SELLER, None))
    assert text(root, "Fa/DaneFaKorygowanej/NrKSeFN") == "1"
    assert root.find(_ns("Fa/DaneFaKorygowanej/NrKSeFFaKorygowanej")) is None


def test_what_the_schema_refuses_is_never_made() -> None:
    good = fa3.invoice_xml(record(), SELLER)
    assert fa3_errors(good.replace(b"<P_15>123.45</P_15>", b"<P_15>123,45</P_15>"))  # the schema bites
    with pytest.raises(ValueError):  # NIP 0000000000 passes the checksum, not the schema's pattern
        fa3.invoice_xml(record(buyer=Buyer(BUYER.name, "0000000000", BUYER.address, False)), SELLER)
    with pytest.raises((ValueError, FA3XmlValidationError)):
        fa3.invoice_xml(record(number=""), SELLER)
    assert ISSUED.astimezone(WARSAW).date() == dt.date(2026, 11, 29)


def test_ksef_configured_needs_a_token_and_the_seller() -> None:
    from control.console.launch import refusal
    from control.console.settings import ConsoleSettings
    seller = {"seller_name": "Bramka Modeli sp. z o.o.", "seller_nip": "521-301-72-28",
              "seller_address": "ul. Marszałkowska 1, 00-624 Warszawa"}
    s = ConsoleSettings(dev=True, ksef_env="demo", **seller)
    one = ("GATEWAY_KSEF_ENV=demo needs GATEWAY_KSEF_TOKEN (a KSeF token of the seller's NIP) or GATEWAY_KSEF_CERT"
           " and GATEWAY_KSEF_KEY (its certificate and private key), one of the two")
    assert refusal(s) == one
    assert refusal(ConsoleSettings(dev=True, ksef_env="demo", ksef_token="t", ksef_cert=__file__, ksef_key=__file__, **seller)) == one
    assert refusal(ConsoleSettings(dev=True, ksef_env="demo", ksef_cert=__file__, **seller)) == one
    assert refusal(ConsoleSettings(dev=True, ksef_env="demo", ksef_cert=__file__, ksef_key="/nonexistent/k.pem",
                                   **seller)) == "GATEWAY_KSEF_KEY: cannot read /nonexistent/k.pem"
    assert refusal(ConsoleSettings(dev=True, ksef_env="demo", ksef_cert=__file__, ksef_key=__file__, **seller)) is None
    s = ConsoleSettings(dev=True, ksef_env="demo", ksef_token="t", **{**seller, "seller_nip": "5213017229"})
    assert refusal(s) == ("GATEWAY_KSEF_ENV=demo needs the seller: GATEWAY_SELLER_NAME, GATEWAY_SELLER_NIP"
                          " (a valid NIP) and GATEWAY_SELLER_ADDRESS")
    assert refusal(ConsoleSettings(dev=True, ksef_env="demo", ksef_token="t", **seller)) is None
    assert refusal(ConsoleSettings(dev=True)) is None  # not configured: as before (the console says so when it starts)
    on = ConsoleSettings(ksef_env="production")
    assert (on.ksef_api_url, on.ksef_qr_url) == ("https://api.ksef.mf.gov.pl", "https://qr.ksef.mf.gov.pl")
    assert ConsoleSettings(ksef_env="test", ksef_url="http://proxy:1").ksef_qr_url == "https://qr-test.ksef.mf.gov.pl"


def offline_certificate(where: Path, serial: int = 0x00F23456789ABCDE) -> tuple[x509.Certificate, dict[str, str]]:
    """A self-signed stand-in for the seller's KSeF offline certificate (EC P-256) and its key as PEM files in
    ``where``: (the certificate, the settings naming the files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SELLER.name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(serial).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30)).sign(key, hashes.SHA256()))
    (where / "offline.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (where / "offline.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    return cert, {"ksef_offline_cert": str(where / "offline.crt"), "ksef_offline_key": str(where / "offline.key")}


def pdf_of(mark: qr.Mark) -> tuple[str, int]:
    """The text of the invoice's PDF with ``mark`` without whitespace (a wrapped link's line breaks and a
    justified line's spaces vary) and how many images it has."""
    pdf = pypdf.PdfReader(io.BytesIO(invoice_pdf.render(record(), Seller(SELLER.name, SELLER.nip, SELLER.address), mark)))
    return "".join("".join(p.extract_text().split()) for p in pdf.pages), sum(len(p.images) for p in pdf.pages)


def test_an_offline_invoice_carries_kod_ii_signed_with_the_offline_certificate(tmp_path: Path) -> None:
    cert, files = offline_certificate(tmp_path)
    s = KsefSettings(ksef_env="test", ksef_token="t", **files)
    xml = fa3.invoice_xml(record(), SELLER)
    digest = base64.urlsafe_b64encode(hashlib.sha256(xml).digest()).decode().rstrip("=")
    kod_i = f"https://qr-test.ksef.mf.gov.pl/invoice/{SELLER.nip}/29-11-2026/{digest}"
    m = qr.mark(s, SELLER.nip, dt.date(2026, 11, 29), xml, None)
    assert (m.url, m.label, m.offline) == (kod_i, "OFFLINE", True) and m.certificate_url is not None
    # <qr address>/certificate/<context type>/<context id>/<seller NIP>/<certificate serial>/<invoice hash>/<signature>
    signed, signature = m.certificate_url.rsplit("/", 1)
    assert signed == f"https://qr-test.ksef.mf.gov.pl/certificate/Nip/{SELLER.nip}/{SELLER.nip}/00F23456789ABCDE/{digest}"
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    assert len(raw) == 64  # IEEE P1363: r || s, 32 bytes each
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")),
                  signed.removeprefix("https://").encode(), ec.ECDSA(hashes.SHA256()))  # raises if not the key's
    # the PDF: both codes, KOD I labelled OFFLINE, KOD II CERTYFIKAT, each with its link in words
    text, images = pdf_of(m)
    assert images == 2
    assert f"KODI(OFFLINE):{kod_i}" in text and f"KODII(CERTYFIKAT):{m.certificate_url}" in text, text
    assert "Fakturawystawionawtrybieoffline" in text
    # once sent: KOD I with the KSeF number only
    sent = qr.mark(s, SELLER.nip, dt.date(2026, 11, 29), xml, "5213017228-20261129-0123456789AB-CD")
    assert (sent.url, sent.label, sent.certificate_url) == (kod_i, "5213017228-20261129-0123456789AB-CD", None)
    text, images = pdf_of(sent)
    assert images == 1 and "NumerKSeF:5213017228-20261129-0123456789AB-CD" in text
    assert f"KODI(5213017228-20261129-0123456789AB-CD):{kod_i}" in text
    assert "OFFLINE" not in text and "CERTYFIKAT" not in text and "KODII" not in text
    # offline without an offline certificate: KOD I only
    bare = qr.mark(KsefSettings(ksef_env="test", ksef_token="t"), SELLER.nip, dt.date(2026, 11, 29), xml, None)
    assert (bare.url, bare.label, bare.certificate_url) == (kod_i, "OFFLINE", None)
    text, images = pdf_of(bare)
    assert images == 1 and f"KODI(OFFLINE):{kod_i}" in text and "CERTYFIKAT" not in text and "KODII" not in text


def test_the_offline_certificate_is_checked_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from control.console.launch import refusal
    from control.console.settings import ConsoleSettings
    seller = {"seller_name": SELLER.name, "seller_nip": SELLER.nip, "seller_address": SELLER.address}
    _, files = offline_certificate(tmp_path)
    on = {"dev": True, "ksef_env": "demo", "ksef_token": "t", **seller}
    assert refusal(ConsoleSettings(**on, **files)) is None
    pair = "GATEWAY_KSEF_OFFLINE_CERT and GATEWAY_KSEF_OFFLINE_KEY go together (the offline certificate and its key)"
    assert refusal(ConsoleSettings(**on, ksef_offline_cert=files["ksef_offline_cert"])) == pair
    assert refusal(ConsoleSettings(**on, ksef_offline_cert=files["ksef_offline_cert"],
                                   ksef_offline_key="/nonexistent/o.key")) == "GATEWAY_KSEF_OFFLINE_KEY: cannot read /nonexistent/o.key"
    other = tmp_path / "other"
    other.mkdir()
    _, others = offline_certificate(other)
    mixed = {**files, "ksef_offline_key": others["ksef_offline_key"]}
    assert refusal(ConsoleSettings(**on, **mixed)) == (
        f"GATEWAY_KSEF_OFFLINE_CERT/KEY: {mixed['ksef_offline_key']} is not the key of {mixed['ksef_offline_cert']}")
    _, big = offline_certificate(other, serial=2 ** 64)  # 17 hexadecimal digits: not one KSeF issued
    assert refusal(ConsoleSettings(**on, **big)) == (f"GATEWAY_KSEF_OFFLINE_CERT/KEY: {big['ksef_offline_cert']} is not"
                                                      " a KSeF certificate (its serial number is not 16 hexadecimal digits)")
    assert refusal(ConsoleSettings(**on, ksef_offline_cert=__file__, ksef_offline_key=__file__)) == (
        f"GATEWAY_KSEF_OFFLINE_CERT/KEY: {__file__} is not a PEM certificate")
    # KSeF configured without one: the start log says, in one line, that offline invoices carry no KOD II
    with caplog.at_level(logging.INFO, logger="console.ksef"):
        Worker(cast(Any, None), KsefSettings(ksef_env="demo", ksef_token="t"), SELLER, asyncio.Event()).announce()
        Worker(cast(Any, None), KsefSettings(ksef_env="demo", ksef_token="t", **files), SELLER, asyncio.Event()).announce()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", f"KSeF: invoices are sent to the demo environment for NIP {SELLER.nip}"),
        ("WARNING", "KSeF: no offline certificate (GATEWAY_KSEF_OFFLINE_CERT/KEY): invoices issued offline carry"
                    " KOD I only, no KOD II (docs/configuration.md, \"KSeF\")"),
        ("INFO", f"KSeF: invoices are sent to the demo environment for NIP {SELLER.nip}")]
