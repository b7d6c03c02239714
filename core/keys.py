"""API key format, generation and hashing (docs/interface.md section 5). Pure."""
from __future__ import annotations

import hashlib
import re
import secrets
import string

PREFIX = "sk-service-"
_BODY_LEN = 40
_ALPHABET = string.ascii_letters + string.digits
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +(sk-service-[A-Za-z0-9]{40}) *")


def bearer_key(authorization: str | None) -> str | None:
    """The well-formed key in an Authorization header, or None (missing or malformed)."""
    m = _BEARER.fullmatch(authorization or "")
    return m.group(1) if m else None


def key_hash(key: str) -> str:
    """SHA-256 of a key: keys are high-entropy, so an unsalted fast hash is safe to store."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(_BODY_LEN))
