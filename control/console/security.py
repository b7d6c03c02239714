"""Secrets, password hashing, single-use tokens and CSRF tokens. Pure apart from the secret file and
the hashing threads."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from .i18n import _

_HASHER = PasswordHasher()  # argon2id, 64 MiB, 3 passes (RFC 9106's second recommendation)
_DUMMY = _HASHER.hash("not a password of anyone")

MIN_PASSWORD = 10


def check_password(stored: str | None, password: str) -> bool:
    """Constant work whether or not the account exists (``stored`` None hashes a dummy)."""
    try:
        return _HASHER.verify(stored or _DUMMY, password) and stored is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


# Argon2 runs outside the event loop, at most one hash per core at a time: a burst of log-ins (100 at
# once in tests/test_console_security.py) queues here instead of starving the loop, whose Redis and
# PostgreSQL calls would otherwise wait past their pools' timeouts and fail (seen as 500s under load).
_HASHING = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="argon2")


async def hashed(password: str) -> str:
    return await asyncio.get_running_loop().run_in_executor(_HASHING, _HASHER.hash, password)


async def password_matches(stored: str | None, password: str) -> bool:
    return await asyncio.get_running_loop().run_in_executor(_HASHING, check_password, stored, password)


def password_problem(password: str) -> str | None:
    if len(password) < MIN_PASSWORD:
        return _("The password needs at least {n} characters.").format(n=MIN_PASSWORD)
    if len(password) > 1024:
        return _("The password is too long.")
    return None


def new_token() -> str:
    """A random URL-safe token (256 bits): e-mail links, sessions, invitations."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """Tokens are stored only as this hash."""
    return hashlib.sha256(token.encode()).hexdigest()


def load_secret(configured: str, state: Path) -> bytes:
    """GATEWAY_CONSOLE_SECRET, or a random secret kept in the state directory (mode 0600)."""
    if configured:
        return configured.encode()
    f = state / "console_secret"
    if not f.exists():
        state.mkdir(parents=True, exist_ok=True)
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    return f.read_text().strip().encode()


def csrf_token(secret: bytes, basis: str) -> str:
    """The form token bound to the visitor's session (or pre-login) cookie."""
    return hmac.new(secret, b"csrf:" + basis.encode(), hashlib.sha256).hexdigest()


def sub_key(secret: bytes, purpose: str) -> bytes:
    return hmac.new(secret, purpose.encode(), hashlib.sha256).digest()
