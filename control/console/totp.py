"""Two-factor sign-in's arithmetic: TOTP secrets and codes (RFC 6238 through pyotp: 6 digits, 30 s,
one step of clock drift either way), the enrolment's QR code (segno), one-time recovery codes and
the signed, short-lived proof that a password was right while the second step is pending.  Pure."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

import pyotp
import segno

ISSUER = "LLM gateway"
DRIFT_STEPS = 1            # a code of the previous or the next 30 s is still taken
RECOVERY_CODES = 10
PENDING_S = 300            # the second step must follow the password within this


def new_secret() -> str:
    return pyotp.random_base32()


def uri(secret: str, email: str) -> str:
    """The otpauth:// address an authenticator app reads from the QR code."""
    return pyotp.TOTP(secret).provisioning_uri(name=email, issuer_name=ISSUER)


def qr_data_uri(secret: str, email: str) -> str:
    """The enrolment's QR code as an SVG data: URI (the console's CSP allows data: images)."""
    return str(segno.make(uri(secret, email), error="m").svg_data_uri(scale=5, border=2))


def matching_step(secret: str, code: str, after_step: int, now: float | None = None) -> int | None:
    """The 30-second step whose code ``code`` is, within the drift, if it is later than ``after_step``
    (a code once used is never taken again), else None."""
    code = "".join(code.split())
    if len(code) != 6 or not code.isdigit():
        return None
    totp = pyotp.TOTP(secret)
    current = int((time.time() if now is None else now) // totp.interval)
    for step in range(current - DRIFT_STEPS, current + DRIFT_STEPS + 1):
        if step > after_step and hmac.compare_digest(totp.generate_otp(step), code):
            return step
    return None


_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: read off paper


def new_recovery_codes() -> list[str]:
    """Ten codes of ten characters (about 50 bits each), shown once, stored only as ``recovery_hash``."""
    return ["".join(secrets.choice(_ALPHABET) for _ in range(5)) + "-" +
            "".join(secrets.choice(_ALPHABET) for _ in range(5)) for _ in range(RECOVERY_CODES)]


def looks_like_recovery(code: str) -> bool:
    return len(_normal(code)) == 10


def _normal(code: str) -> str:
    return "".join(ch for ch in code.lower() if ch.isalnum())


def recovery_hash(code: str) -> str:
    return hashlib.sha256(b"recovery:" + _normal(code).encode()).hexdigest()


@dataclass(frozen=True)
class Pending:
    """A password proved right; the second step is to come: whose, where to go after, until when, the
    proof's own id (its sign-in spends it: a copy of the cookie opens nothing afterwards), and which
    password it proved (``password_proof``: once the password changed, it opens nothing either)."""
    user_id: str
    next: str
    lang: str
    expires: int
    nonce: str
    proof: str

    def seal(self, key: bytes) -> str:
        body = base64.urlsafe_b64encode(json.dumps([self.user_id, self.next, self.lang, self.expires, self.nonce,
                                                    self.proof]).encode()).decode().rstrip("=")
        return body + "." + hmac.new(key, body.encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def start(user_id: str, nxt: str, lang: str, password_hash: str) -> Pending:
        return Pending(user_id, nxt, lang, int(time.time()) + PENDING_S, secrets.token_urlsafe(16),
                       password_proof(password_hash))

    def proves(self, password_hash: str | None) -> bool:
        """Whether the account's password is still the one this proof was made with."""
        return password_hash is not None and hmac.compare_digest(self.proof, password_proof(password_hash))

    @staticmethod
    def open(value: str, key: bytes) -> Pending | None:
        """The pending sign-in a cookie holds, if this console signed it and it has not expired."""
        body, _, mac = value.rpartition(".")
        if not body or not hmac.compare_digest(mac.encode(), hmac.new(key, body.encode(), hashlib.sha256)
                                               .hexdigest().encode()):
            return None
        try:
            uid, nxt, lang, expires, nonce, proof = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, TypeError):
            return None
        return Pending(str(uid), str(nxt), str(lang), int(expires), str(nonce), str(proof)) \
            if expires > time.time() else None


def password_proof(password_hash: str) -> str:
    """Which password a pending sign-in proved, without its hash in the cookie: a digest of the hash."""
    return hashlib.sha256(b"2fa-pending:" + password_hash.encode()).hexdigest()[:32]
