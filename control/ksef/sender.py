"""FA(3) documents to KSeF API v2 through ksef-client (the SDK): authenticate the seller with its KSeF
token (challenge, the token encrypted with KSeF's public key) or its certificate (the challenge signed,
XAdES), then the operation's status and the access token;
open an online session for form FA (3), send each document encrypted with the session's key, ask for
each one's status until KSeF gives its KSeF number or refuses it, close the session.

Each document's outcome is a small value: ``Sent`` (the KSeF number), ``Taken`` (KSeF has it and is
still checking: ask again later, never send it twice), ``Rejected`` (KSeF's status code and
description) or ``Retry`` (KSeF not reached, or not usable now: the reason's kind, never a body)."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import httpx
from ksef_client import AsyncKsefClient, KsefClientOptions
from ksef_client import models as m
from ksef_client.exceptions import KsefHttpError
from ksef_client.services import AsyncAuthCoordinator, AsyncOnlineSessionWorkflow

from . import fa3
from .settings import KsefSettings
from .store import Due

log = logging.getLogger("console.ksef")
STATUS_POLLS = 10  # a document's status asked this many times in one round, POLL_S apart
POLL_S = 0.5
# KSeF's invoice status codes (SessionInvoiceStatusResponse): has its KSeF number; still processing; a
# number sent before (its extensions name the first one's KSeF number); KSeF's own failure, to try again
ACCEPTED, CHECKING, DUPLICATE, TRY_AGAIN = 200, (100, 150), 440, (500, 550)


@dataclass(frozen=True, slots=True)
class Sent:
    ksef_number: str


@dataclass(frozen=True, slots=True)
class Taken:
    ksef_ref: str


@dataclass(frozen=True, slots=True)
class Rejected:
    problem: str


@dataclass(frozen=True, slots=True)
class Retry:
    problem: str
    resend: bool = False  # KSeF dropped what it had taken: send it again


Outcome = Sent | Taken | Rejected | Retry


def sha256_b64(xml: bytes) -> str:
    """The document's SHA-256 as KSeF writes it (Base64): its verification QR code carries it."""
    return base64.b64encode(hashlib.sha256(xml).digest()).decode()


def why(e: BaseException) -> str:
    """A failure's kind for the operator: an HTTP status or the exception's type (no body, no token)."""
    if isinstance(e, KsefHttpError) and e.status_code:
        return f"KSeF answered HTTP {e.status_code}"
    if isinstance(e, KsefHttpError):  # the SDK's word for no answer at all
        return "KSeF not reached"
    if isinstance(e, httpx.TransportError):
        return f"KSeF not reached ({type(e).__name__})"
    return f"not sent ({type(e).__name__})"


async def send(s: KsefSettings, seller_nip: str, docs: list[Due]) -> dict[str, Outcome]:
    """Every document's outcome; KSeF unreachable or refusing the session: all ``Retry``."""
    try:
        async with AsyncKsefClient(KsefClientOptions(base_url=s.ksef_api_url, timeout_seconds=20.0)) as client:
            return await _round(client, s, seller_nip, docs)
    except (KsefHttpError, httpx.HTTPError, OSError, RuntimeError, TimeoutError) as e:
        return {d.number: Retry(why(e)) for d in docs}


async def _round(client: AsyncKsefClient, s: KsefSettings, nip: str, docs: list[Due]) -> dict[str, Outcome]:
    token_cert = await client.security.get_public_key_certificate_pem(m.PublicKeyCertificateUsage.KSEFTOKENENCRYPTION)
    key_cert = await client.security.get_public_key_certificate_pem(m.PublicKeyCertificateUsage.SYMMETRICKEYENCRYPTION)
    coordinator = AsyncAuthCoordinator(client.auth)
    if s.ksef_cert:  # the seller's certificate: the challenge signed (XAdES) with its key
        auth = await coordinator.authenticate_with_xades(
            context_identifier_type="nip", context_identifier_value=nip, subject_identifier_type="certificateSubject",
            certificate_pem=Path(s.ksef_cert).read_text(), private_key_pem=Path(s.ksef_key).read_text(),
            poll_interval_seconds=POLL_S, max_attempts=20)
    else:  # the KSeF token, encrypted with KSeF's public key
        auth = await coordinator.authenticate_with_ksef_token(
            token=s.ksef_token, public_certificate=token_cert, context_identifier_type="nip",
            context_identifier_value=nip, poll_interval_seconds=POLL_S, max_attempts=20)
    access = auth.access_token
    session = await AsyncOnlineSessionWorkflow(client.sessions).open_session(
        form_code=m.FormCode(system_code=fa3.FORM[0], schema_version=fa3.FORM[1], value=fa3.FORM[2]),
        public_certificate=key_cert, access_token=access)
    out: dict[str, Outcome] = {}
    refs: dict[str, str] = {}
    try:
        for d in docs:
            if d.ksef_ref is not None:
                refs[d.number] = d.ksef_ref
                continue
            try:
                r = await session.send_invoice(d.xml, offline_mode=d.offline, access_token=access)
            except KsefHttpError as e:
                out[d.number] = Rejected(f"HTTP {e.status_code}: {e.message}") if 400 <= e.status_code < 500 \
                    and e.status_code not in (401, 403, 408, 429) else Retry(why(e))
                continue
            refs[d.number] = f"{session.reference_number}/{r.reference_number}"
    finally:
        try:
            await session.close(access_token=access)
        except (KsefHttpError, httpx.HTTPError) as e:  # what KSeF took is asked about all the same
            log.warning("closing the KSeF session failed: %s", why(e))
    for number, ref in refs.items():
        try:
            out[number] = await _status(client, ref, access)
        except (KsefHttpError, httpx.HTTPError):
            out[number] = Taken(ref)  # KSeF has it: ask again next round, never send it twice
    return out


async def _status(client: AsyncKsefClient, ref: str, access: str) -> Outcome:
    """Ask KSeF about a document it took (``ref``: session/invoice reference) until it decides."""
    session_ref, invoice_ref = ref.split("/", 1)
    for _ in range(STATUS_POLLS):
        st = await client.sessions.get_session_invoice_status(session_ref, invoice_ref, access_token=access)
        code = int(st.status.code)
        if code == ACCEPTED and st.ksef_number:
            return Sent(st.ksef_number)
        if code == DUPLICATE and (first := (st.status.extensions or {}).get("originalKsefNumber")):
            return Sent(str(first))  # sent before, its answer lost (a restart): the same invoice
        if code in TRY_AGAIN:
            return Retry(f"{code} {st.status.description}", resend=True)
        if code not in CHECKING:
            details = "; ".join(st.status.details or [])
            return Rejected(f"{code} {st.status.description}" + (f" ({details})" if details else ""))
        await asyncio.sleep(POLL_S)
    return Taken(ref)
