"""Przelewy24 (BLIK, card, bank transfer in PLN), REST API v1:

1. register: POST /api/v1/transaction/register (HTTP basic auth: pos id, API key) with
   ``sign`` = SHA-384 of ``{"sessionId","merchantId","amount","currency","crc"}``; the answer's token
   gives the buyer's address ``/trnRequest/{token}``;
2. notification to ``urlStatus``: JSON with merchantId, posId, sessionId, amount, originAmount, currency,
   orderId, methodId, statement and ``sign`` = SHA-384 of
   ``{"merchantId","posId","sessionId","amount","originAmount","currency","orderId","methodId","statement","crc"}``;
3. verify: PUT /api/v1/transaction/verify with ``sign`` = SHA-384 of
   ``{"sessionId","orderId","amount","currency","crc"}``; the transaction is paid only after it succeeds.

Each checksum is over the JSON text as PHP's ``json_encode(..., JSON_UNESCAPED_UNICODE |
JSON_UNESCAPED_SLASHES)`` writes it: no spaces, non-ASCII characters and slashes unescaped.
Amounts are in grosze (1 PLN = 100).
"""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..settings import ConsoleSettings

from .base import BadNotification, Notification, Payment, PaymentError, load_notification

LIVE = "https://secure.przelewy24.pl"
SANDBOX = "https://sandbox.przelewy24.pl"
MICRO_PER_GROSZ = 10_000

_NOTIFICATION_FIELDS: tuple[tuple[str, type], ...] = (
    ("merchantId", int), ("posId", int), ("sessionId", str), ("amount", int), ("originAmount", int),
    ("currency", str), ("orderId", int), ("methodId", int), ("statement", str))


def checksum(fields: dict[str, Any], crc: str) -> str:
    """SHA-384 hex of the JSON of ``fields`` (in the given order) followed by ``crc``."""
    text = json.dumps({**fields, "crc": crc}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha384(text.encode("utf-8")).hexdigest()


def register_sign(session_id: str, merchant_id: int, amount: int, currency: str, crc: str) -> str:
    return checksum({"sessionId": session_id, "merchantId": merchant_id, "amount": amount,
                     "currency": currency}, crc)


def verify_sign(session_id: str, order_id: int, amount: int, currency: str, crc: str) -> str:
    return checksum({"sessionId": session_id, "orderId": order_id, "amount": amount, "currency": currency}, crc)


def notification_sign(n: dict[str, Any], crc: str) -> str:
    return checksum({k: n[k] for k, _ in _NOTIFICATION_FIELDS}, crc)


@dataclass
class Przelewy24:
    merchant_id: int
    pos_id: int
    crc: str
    api_key: str
    base_url: str
    name: str = "p24"

    @classmethod
    def from_settings(cls, s: ConsoleSettings) -> "Przelewy24":
        if not (s.p24_merchant_id and s.p24_crc and s.p24_api_key):
            raise ValueError("GATEWAY_P24_MERCHANT_ID, GATEWAY_P24_CRC and GATEWAY_P24_API_KEY are required for p24")
        base = s.p24_api_url or (SANDBOX if s.p24_sandbox else LIVE)
        return cls(s.p24_merchant_id, s.p24_pos_id or s.p24_merchant_id, s.p24_crc, s.p24_api_key,
                   base.rstrip("/"))

    async def _call(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        auth = aiohttp.BasicAuth(str(self.pos_id), self.api_key)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
                async with http.request(method, self.base_url + path, json=body, auth=auth) as r:
                    doc = await r.json(content_type=None)
                    if r.status != 200 or not isinstance(doc, dict):
                        raise PaymentError(f"Przelewy24 {path}: HTTP {r.status}")
                    return doc
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise PaymentError(f"Przelewy24 {path}: {type(e).__name__}") from None

    async def start(self, p: Payment, return_url: str, notify_url: str) -> str:
        amount = p.amount_micro_pln // MICRO_PER_GROSZ
        body = {
            "merchantId": self.merchant_id, "posId": self.pos_id, "sessionId": p.id, "amount": amount,
            "currency": "PLN", "description": p.description, "email": p.email, "country": "PL",
            "language": "pl", "urlReturn": return_url, "urlStatus": notify_url,
            "sign": register_sign(p.id, self.merchant_id, amount, "PLN", self.crc),
        }
        doc = await self._call("POST", "/api/v1/transaction/register", body)
        token = (doc.get("data") or {}).get("token")
        if not isinstance(token, str) or not token:
            raise PaymentError("Przelewy24 register: no token in the answer")
        return f"{self.base_url}/trnRequest/{token}"

    def parse_notification(self, body: bytes, content_type: str) -> Notification:
        n = load_notification(body)
        if not isinstance(n, dict):
            raise BadNotification("not an object")
        for k, t in _NOTIFICATION_FIELDS:
            v = n.get(k)
            if not isinstance(v, t) or isinstance(v, bool):
                raise BadNotification(f"field {k} missing or not {t.__name__}")
        sign = n.get("sign")
        if not isinstance(sign, str) or not hmac.compare_digest(sign.lower().encode(),
                                                                notification_sign(n, self.crc).encode()):
            raise BadNotification("bad sign")
        if n["merchantId"] != self.merchant_id or n["posId"] != self.pos_id:
            raise BadNotification("not for this shop")
        if n["currency"] != "PLN":
            raise BadNotification("currency is not PLN")
        return Notification(payment_id=n["sessionId"], amount_micro_pln=n["amount"] * MICRO_PER_GROSZ, paid=True,
                            provider_ref=str(n["orderId"]),
                            extra={"orderId": n["orderId"], "amount": n["amount"], "currency": n["currency"],
                                   "originAmount": n["originAmount"]})

    async def confirm(self, n: Notification) -> None:
        e = n.extra
        body = {"merchantId": self.merchant_id, "posId": self.pos_id, "sessionId": n.payment_id,
                "amount": e["amount"], "currency": e["currency"], "orderId": e["orderId"],
                "sign": verify_sign(n.payment_id, e["orderId"], e["amount"], e["currency"], self.crc)}
        doc = await self._call("PUT", "/api/v1/transaction/verify", body)
        if (doc.get("data") or {}).get("status") != "success":
            raise PaymentError("Przelewy24 verify: not successful")
