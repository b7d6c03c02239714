"""Przelewy24: the checksums against JSON texts written out as its documentation shows them, the
notification checks, and the whole top-up over HTTP — a console configured for P24 registers the
transaction with a local stand-in of the P24 REST API (none is reachable from here), receives a
notification built as documented, calls verify, and credits once."""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import httpx
import pytest

from conftest import Gateway, wait_for
from control.console.payments import BadNotification
from control.console.payments.przelewy24 import Przelewy24, notification_sign, register_sign, verify_sign
from test_console_billing import billing_details
from test_console_support import PASSWORD, ConsoleClient, mails, signed_up

MERCHANT, POS, CRC, API_KEY = 11223, 11224, "a1b2c3d4e5f6a7b8", "api-key-0123456789abcdef"


def sha384(text: str) -> str:
    return hashlib.sha384(text.encode("utf-8")).hexdigest()


# ---- checksums, against the documented JSON layout ------------------------------------------------

def test_register_and_verify_checksums_match_the_documented_json() -> None:
    assert register_sign("pay_1", MERCHANT, 1000, "PLN", CRC) == sha384(
        '{"sessionId":"pay_1","merchantId":11223,"amount":1000,"currency":"PLN","crc":"a1b2c3d4e5f6a7b8"}')
    assert verify_sign("pay_1", 987654321, 1000, "PLN", CRC) == sha384(
        '{"sessionId":"pay_1","orderId":987654321,"amount":1000,"currency":"PLN","crc":"a1b2c3d4e5f6a7b8"}')


def documented_notification(session_id: str, amount: int, statement: str = "p24-K12-B34-M56",
                            order_id: int = 300123456) -> dict[str, Any]:
    """A notification as P24 posts it to urlStatus, its sign computed over the documented JSON text
    (json_encode with JSON_UNESCAPED_UNICODE | JSON_UNESCAPED_SLASHES), written out here by hand."""
    n = {"merchantId": MERCHANT, "posId": POS, "sessionId": session_id, "amount": amount, "originAmount": amount,
         "currency": "PLN", "orderId": order_id, "methodId": 154, "statement": statement}
    text = ('{"merchantId":%d,"posId":%d,"sessionId":"%s","amount":%d,"originAmount":%d,"currency":"PLN",'
            '"orderId":%d,"methodId":154,"statement":"%s","crc":"%s"}'
            % (MERCHANT, POS, session_id, amount, amount, order_id, statement, CRC))
    n["sign"] = sha384(text)
    return n


def provider(base: str = "http://127.0.0.1:9") -> Przelewy24:
    return Przelewy24(MERCHANT, POS, CRC, API_KEY, base)


def test_notification_checksum_and_checks() -> None:
    p = provider()
    n = documented_notification("pay_abc", 2500, statement="Płatność/zamówienie ąę")  # unescaped unicode and /
    assert notification_sign(n, CRC) == n["sign"]
    got = p.parse_notification(json.dumps(n).encode(), "application/json")
    assert (got.payment_id, got.amount_micro_pln, got.paid, got.provider_ref) == ("pay_abc", 25_000_000, True, "300123456")
    for change in ({"amount": 2501}, {"sessionId": "pay_other"}, {"sign": "0" * 96}, {"statement": "x"}):
        with pytest.raises(BadNotification):
            p.parse_notification(json.dumps(dict(n, **change)).encode(), "application/json")
    other_shop = dataclasses.replace(p, merchant_id=99999)
    with pytest.raises(BadNotification):
        other_shop.parse_notification(json.dumps(n).encode(), "application/json")
    for broken in (b"{}", b"[]", b"nope", json.dumps(dict(n, amount="2500")).encode()):
        with pytest.raises(BadNotification):
            p.parse_notification(broken, "application/json")


# ---- the whole top-up over HTTP with a stand-in of the P24 REST API ------------------------------

class FakeP24:
    """Checks what P24 checks (basic auth, the register and verify signs) and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self.verify_ok = True
        fake = self

        class H(BaseHTTPRequestHandler):
            def _answer(self, status: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization", "")
                fake.calls.append((self.command + " " + self.path, doc, auth))
                if auth != "Basic " + base64.b64encode(f"{POS}:{API_KEY}".encode()).decode():
                    return self._answer(401, {"error": "Incorrect authentication", "code": 401})
                if self.path == "/api/v1/transaction/register" and self.command == "POST":
                    if doc["sign"] != register_sign(doc["sessionId"], doc["merchantId"], doc["amount"], doc["currency"], CRC):
                        return self._answer(400, {"error": "Incorrect CRC value", "code": 400})
                    return self._answer(200, {"data": {"token": "TOKEN-" + doc["sessionId"]}, "responseCode": 0})
                if self.path == "/api/v1/transaction/verify" and self.command == "PUT":
                    if doc["sign"] != verify_sign(doc["sessionId"], doc["orderId"], doc["amount"], doc["currency"], CRC):
                        return self._answer(400, {"error": "Incorrect CRC value", "code": 400})
                    if not fake.verify_ok:
                        return self._answer(400, {"error": "Transaction not found", "code": 400})
                    return self._answer(200, {"data": {"status": "success"}, "responseCode": 0})
                return self._answer(404, {"error": "not found", "code": 404})

            do_POST = do_PUT = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def p24_console(gateway: Gateway) -> Iterator[tuple[str, FakeP24]]:
    fake = FakeP24()
    try:
        # a configured SMTP server: the capture server, as a plain SMTP server
        with gateway.another_console("console-p24", payment_provider="p24", p24_merchant_id=MERCHANT,
                                     p24_pos_id=POS, p24_crc=CRC, p24_api_key=API_KEY, p24_api_url=fake.url,
                                     smtp_host="127.0.0.1", smtp_port=gateway.stack.s.smtp_capture_port,
                                     smtp_tls="none") as port:
            yield f"http://127.0.0.1:{port}", fake
    finally:
        fake.close()


def test_p24_topup_is_credited_once_after_verify(gateway: Gateway, p24_console: tuple[str, FakeP24]) -> None:
    url, fake = p24_console
    _, email, org = signed_up(gateway)
    c = ConsoleClient(url)
    c.get("/login")
    assert c.post("/login", {"email": email, "password": PASSWORD}).status_code == 303
    assert "Przelewy24" in c.get("/billing").text
    billing_details(c)
    r = c.post("/billing/topup", {"amount": "25"})
    assert r.status_code == 303
    m = re.fullmatch(re.escape(fake.url) + r"/trnRequest/TOKEN-(pay_[0-9a-f]+)", r.headers["location"])
    assert m, r.headers["location"]
    pid = m.group(1)
    call, reg, _ = fake.calls[0]
    assert call == "POST /api/v1/transaction/register"
    assert (reg["merchantId"], reg["posId"], reg["sessionId"], reg["amount"], reg["currency"]) == (MERCHANT, POS, pid, 2500, "PLN")
    assert reg["urlStatus"] == f"{url}/payments/notify/p24" and reg["urlReturn"] == f"{url}/billing/return/{pid}"
    assert reg["email"] == email and reg["country"] == "PL"
    before = int(gateway.admin(lambda a: a.balance(org))["balance_micro_pln"])
    # the browser's return credits nothing
    assert "Waiting for the payment provider" in c.get(f"/billing/return/{pid}").text
    notify = url + "/payments/notify/p24"
    assert httpx.post(notify, json=dict(documented_notification(pid, 2500), amount=250000)).status_code == 400
    fake.verify_ok = False
    assert httpx.post(notify, json=documented_notification(pid, 2500)).status_code == 502  # P24 retries later
    assert int(gateway.admin(lambda a: a.balance(org))["balance_micro_pln"]) == before
    fake.verify_ok = True
    n = documented_notification(pid, 2500)
    assert httpx.post(notify, json=n).json() == {"status": "paid", "credited": True}
    verify = [d for call, d, _ in fake.calls if call == "PUT /api/v1/transaction/verify"][-1]
    assert verify == {"merchantId": MERCHANT, "posId": POS, "sessionId": pid, "amount": 2500, "currency": "PLN",
                      "orderId": 300123456, "sign": verify_sign(pid, 300123456, 2500, "PLN", CRC)}
    assert httpx.post(notify, json=n).json() == {"status": "paid", "credited": False}  # the same one again
    assert int(gateway.admin(lambda a: a.balance(org))["balance_micro_pln"]) == before + 25_000_000
    assert gateway.sql("SELECT status, provider_ref FROM payments WHERE id = $1", pid) == [
        {"status": "paid", "provider_ref": "300123456"}]
    assert gateway.sql("SELECT ref FROM ledger WHERE org_id = $1 AND kind = 'topup'", org) == [{"ref": f"p24:{pid}"}]


def test_configured_smtp_is_used_and_the_dev_mail_page_is_off(gateway: Gateway,
                                                             p24_console: tuple[str, FakeP24]) -> None:
    url, _ = p24_console
    _, email, _ = signed_up(gateway)
    assert httpx.get(url + "/dev/mail").status_code == 404
    assert httpx.get(url + "/dev/mail.json").status_code == 404
    c = ConsoleClient(url)
    c.get("/reset")
    assert c.post("/reset", {"email": email}).status_code == 303
    wait_for(lambda: [m for m in mails(gateway, email) if url + "/reset/" in m["body"]], timeout=10)
