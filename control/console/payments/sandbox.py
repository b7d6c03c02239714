"""The local sandbox provider of development and tests: its "payment page" is a console page
(``/sandbox/pay/{id}``) that, when the buyer pays, sends a notification signed with HMAC-SHA-256 to
the notification address — the same path a real provider's notification takes."""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from ..security import sub_key
from .base import BadNotification, Notification, Payment, load_notification


@dataclass
class Sandbox:
    secret: bytes
    console_url: str
    name: str = "sandbox"

    def sign(self, doc: dict[str, Any]) -> str:
        text = json.dumps({k: doc[k] for k in sorted(doc) if k != "sign"}, separators=(",", ":"))
        return hmac.new(sub_key(self.secret, "sandbox-payment-provider"), text.encode(), hashlib.sha256).hexdigest()

    async def start(self, p: Payment, return_url: str, notify_url: str) -> str:
        return f"{self.console_url}/sandbox/pay/{p.id}"

    def notification(self, payment_id: str, amount_micro: int, paid: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {"paymentId": payment_id, "amountMicroPln": amount_micro,
                               "status": "paid" if paid else "failed", "transactionId": "sbx_" + secrets.token_hex(6)}
        doc["sign"] = self.sign(doc)
        return doc

    def parse_notification(self, body: bytes, content_type: str) -> Notification:
        n = load_notification(body)
        ok = (isinstance(n, dict) and isinstance(n.get("paymentId"), str)
              and type(n.get("amountMicroPln")) is int and n.get("status") in ("paid", "failed")
              and isinstance(n.get("transactionId"), str) and isinstance(n.get("sign"), str))
        if not ok:
            raise BadNotification("malformed")
        if not hmac.compare_digest(n["sign"].encode(), self.sign(n).encode()):  # bytes: any letter
            raise BadNotification("bad sign")
        return Notification(n["paymentId"], n["amountMicroPln"], n["status"] == "paid", n["transactionId"])

    async def confirm(self, n: Notification) -> None:
        return None
