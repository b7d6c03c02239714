"""Payment providers behind one interface.  A top-up is a ``payments`` row; the provider sends the
buyer somewhere to pay and later notifies us; only a verified notification credits the balance."""
from __future__ import annotations

from ..settings import ConsoleSettings

from .base import BadNotification, Notification, Payment, PaymentError, Provider


def make_provider(s: ConsoleSettings, secret: bytes) -> Provider:
    """Przelewy24, or the sandbox provider in development mode only (``launch.refusal`` keeps the
    console from starting otherwise; this refuses too, should anything call it directly)."""
    from ..launch import check, payment_provider
    check(s)
    if payment_provider(s) == "p24":
        from .przelewy24 import Przelewy24
        return Przelewy24.from_settings(s)
    from .sandbox import Sandbox
    return Sandbox(secret, s.console_base_url)


__all__ = ["BadNotification", "Notification", "Payment", "PaymentError", "Provider", "make_provider"]
