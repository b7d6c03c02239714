"""The payment providers' one interface and the values that cross it."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

# A provider's notification is a small flat JSON object: bounded before it is parsed (30,000 nested
# brackets made the parser's recursion fail).
NOTIFICATION_MAX_BYTES = 16 * 1024
NOTIFICATION_MAX_DEPTH = 8
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


class PaymentError(Exception):
    """The provider refused or could not be reached (registration or verification)."""


class BadNotification(Exception):
    """A notification that is malformed, wrongly signed or not for this shop."""


def load_notification(body: bytes) -> Any:
    """The notification's JSON document; BadNotification if it is too big, too deep or not JSON."""
    if len(body) > NOTIFICATION_MAX_BYTES:
        raise BadNotification("too big")
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b'""', body)):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    if deepest > NOTIFICATION_MAX_DEPTH:
        raise BadNotification("nested too deep")
    try:
        return json.loads(body)
    except ValueError:  # UnicodeDecodeError and too long a number are ValueErrors too
        raise BadNotification("not JSON") from None


@dataclass(frozen=True)
class Payment:
    id: str
    org_id: str
    amount_micro_pln: int
    email: str
    description: str


@dataclass(frozen=True)
class Notification:
    payment_id: str
    amount_micro_pln: int
    paid: bool
    provider_ref: str
    extra: dict[str, Any] = field(default_factory=dict)


class Provider(Protocol):
    name: str

    async def start(self, p: Payment, return_url: str, notify_url: str) -> str:
        """Register the transaction; the address to send the buyer to."""

    def parse_notification(self, body: bytes, content_type: str) -> Notification:
        """Check the notification's signature and fields; BadNotification otherwise."""

    async def confirm(self, n: Notification) -> None:
        """The provider's own confirmation step (P24: the verify call); PaymentError on refusal."""
