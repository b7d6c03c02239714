"""FA(3) documents of invoices and corrections (control/ksef/fa3.py) read back and checked against the
official FA(3) schema (tests/fa3_schema.py): every field the invoice has, the correction's reference to
the original (number, issue date, KSeF number, the buyer before), a private person, and the schema's
refusal of what it must refuse."""
from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from ksef_client.documents.fa3 import FA3XmlValidationError

from control.ksef import fa3
from control.ksef.worker import correction_of, invoice_of
from core.catalog import WARSAW
from fa3_schema import assert_fa3, fa3_errors

SELLER = fa3.Party("Bramka Modeli sp. z o.o.", "5213017228", "ul. Marszałkowska 1, 00-624 Warszawa")
ISSUED = dt.datetime(2026, 11, 28, 23, 30, tzinfo=dt.timezone.utc)  # 29 November in Warsaw


def row(**over: Any) -> dict[str, Any]:
    """An ``invoices`` row as PostgreSQL gives it."""
    return {"id": "inv_1", "number": "FV/2026/000007", "issued_at": ISSUED, "buyer_name": "Piekarnia Kowalski sp. z o.o.",
            "buyer_nip": "5260250274", "buyer_address": "ul. Długa 1, 00-001 Warszawa", "buyer_person": False,
            "net_grosze": 10_037, "vat_grosze": 2_308, "gross_grosze": 12_345, "vat_pct": 23, **over}


def text(root: Any, path: str) -> str | None:
    found = root.find(_ns(path))
    return None if found is None else str(found.text)


def _ns(path: str) -> str:
    return "/".join("{*}" + p for p in path.split("/"))


def test_an_invoice_says_what_the_invoice_says() -> None:
    xml = fa3.invoice_xml(invoice_of(row(), SELLER))
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
    from control.console.invoices import split_gross
    net, vat = split_gross(gross)
    root = assert_fa3(fa3.invoice_xml(invoice_of(row(net_grosze=net, vat_grosze=vat, gross_grosze=gross), SELLER)))
    assert (text(root, "Fa/P_13_1"), text(root, "Fa/P_14_1"), text(root, "Fa/P_15")) == (
        f"{net / 100:.2f}", f"{vat / 100:.2f}", f"{gross / 100:.2f}")


def test_a_private_person_has_no_nip() -> None:
    root = assert_fa3(fa3.invoice_xml(invoice_of(row(buyer_name="Jan Kowalski", buyer_nip=None, buyer_person=True,
                                                     buyer_address=None), SELLER)))
    assert text(root, "Podmiot2/DaneIdentyfikacyjne/BrakID") == "1"
    assert root.find(_ns("Podmiot2/DaneIdentyfikacyjne/NIP")) is None and root.find(_ns("Podmiot2/Adres")) is None


def test_a_correction_is_kor_referencing_the_original_and_its_ksef_number() -> None:
    original = row(id="inv_1", buyer_name="Druga Firma Sp. j.", buyer_nip=None, buyer_address=None)
    corr = row(id="inv_2", number="FK/2026/000001", issued_at=ISSUED + dt.timedelta(days=3), corrects="inv_1",
               previous="inv_1", reason="Korekta danych nabywcy")
    ksef = "5213017228-20261129-0A1B2C3D4E5F-1C"
    root = assert_fa3(correction_of(corr, original, original, ksef, SELLER))
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
    corr = row(id="inv_2", number="FK/2026/000002", corrects="inv_1", previous=None, reason="Korekta danych nabywcy")
    root = assert_fa3(correction_of(corr, row(), row(), None, SELLER))
    assert text(root, "Fa/DaneFaKorygowanej/NrKSeFN") == "1"
    assert root.find(_ns("Fa/DaneFaKorygowanej/NrKSeFFaKorygowanej")) is None


def test_what_the_schema_refuses_is_never_made() -> None:
    good = fa3.invoice_xml(invoice_of(row(), SELLER))
    assert fa3_errors(good.replace(b"<P_15>123.45</P_15>", b"<P_15>123,45</P_15>"))  # the schema bites
    with pytest.raises(ValueError):  # NIP 0000000000 passes the checksum, not the schema's pattern
        fa3.invoice_xml(invoice_of(row(buyer_nip="0000000000"), SELLER))
    with pytest.raises((ValueError, FA3XmlValidationError)):
        fa3.invoice_xml(invoice_of(row(number=""), SELLER))
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
