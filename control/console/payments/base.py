"""The payment providers' one interface and the values that cross it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class PaymentError(Exception):
    """The provider refused or could not be reached (registration or verification)."""


class BadNotification(Exception):
    """A notification that is malformed, wrongly signed or not for this shop."""


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
