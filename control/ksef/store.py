"""The FA(3) documents and their way to KSeF, in PostgreSQL (table ``ksef_documents``): the queue the
console's background loop works, so that what is not sent yet survives restarts.

A document's ``state``: ``new`` (its invoice is issued, in the same transaction: ``enqueue``; the FA(3)
XML is made next), ``kept`` (made; KSeF not configured, so never sent), ``queued`` (made, to be sent
at ``next_at``; ``ksef_ref`` once KSeF took it and is still checking it), ``sent`` (``ksef_number``)
or ``rejected`` (KSeF refused it: ``problem`` has its status code and description; or the FA(3)
schema refused the invoice's data, and there is no XML; the operator decides).  ``offline``: KSeF could not be reached when the document was first due, so the invoice is
in the offline mode (its QR code says OFFLINE until it has a KSeF number) and is declared so when
sent.  ``attempts`` and ``problem``: the failed tries so far and the last one's reason."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import asyncpg

MAX_WAIT_S = 3600.0  # the longest wait between two tries
LEASE_S = 300  # a claimed document is not claimed again for this long (another console instance)


@dataclass(frozen=True, slots=True)
class Due:
    """A document to send (``ksef_ref`` None) or to ask about (sent, KSeF still checking it)."""
    number: str
    xml: bytes
    offline: bool
    attempts: int
    ksef_ref: str | None


async def enqueue(conn: Any, number: str, org_id: str) -> None:
    """Record that invoice ``number`` is issued: in the issuing transaction, so none is missed."""
    await conn.execute("INSERT INTO ksef_documents (number, org_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                       number, org_id)


async def to_make(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    """The issued invoices whose FA(3) document is not made yet (their rows, oldest first)."""
    return list(await pool.fetch("SELECT i.* FROM ksef_documents d JOIN invoices i ON i.number = d.number"
                                 " WHERE d.state = 'new' ORDER BY i.issued_at LIMIT 100"))


async def corrected(pool: asyncpg.Pool, row: Any) -> tuple[Any, Any, str | None, str] | None:
    """For a correction's row (``corrects``: the original's id, ``previous``: the state it replaces): the
    original's row, the previous one's, the original's KSeF number and its document's state; None when
    the original has no document yet."""
    found = await pool.fetchrow("SELECT d.state, d.ksef_number FROM invoices i JOIN ksef_documents d"
                                " ON d.number = i.number WHERE i.id = $1", row["corrects"])
    if found is None:
        return None
    original = await pool.fetchrow("SELECT * FROM invoices WHERE id = $1", row["corrects"])
    previous = await pool.fetchrow("SELECT * FROM invoices WHERE id = $1", row["previous"] or row["corrects"])
    return original, previous, found["ksef_number"], found["state"]


async def made(pool: asyncpg.Pool, number: str, xml: bytes, issued_on: dt.date, seller_nip: str, send: bool) -> None:
    await pool.execute("UPDATE ksef_documents SET xml = $2, issued_on = $3, seller_nip = $4, state = $5,"
                       " next_at = now() WHERE number = $1 AND state = 'new'",
                       number, xml, issued_on, seller_nip, "queued" if send else "kept")


async def unmade(pool: asyncpg.Pool, number: str, problem: str) -> None:
    """The invoice's data cannot make a valid FA(3) document (the schema's reason): never sent."""
    await pool.execute("UPDATE ksef_documents SET state = 'rejected', problem = $2 WHERE number = $1 AND state = 'new'",
                       number, problem)


async def claim(pool: asyncpg.Pool, limit: int = 20) -> list[Due]:
    """Documents due now, leased to this instance for ``LEASE_S``."""
    rows = await pool.fetch(
        "UPDATE ksef_documents SET next_at = now() + make_interval(secs => $2) WHERE number IN"
        " (SELECT number FROM ksef_documents WHERE state = 'queued' AND next_at <= now()"
        "  ORDER BY next_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
        " RETURNING number, xml, offline, attempts, ksef_ref", limit, LEASE_S)
    return sorted((Due(r["number"], bytes(r["xml"]), r["offline"], r["attempts"], r["ksef_ref"]) for r in rows),
                  key=lambda d: d.number)


async def taken(pool: asyncpg.Pool, number: str, ksef_ref: str, wait_s: float) -> None:
    """KSeF took the document (``ksef_ref``: its session and invoice reference) and is still checking it:
    asked about again after ``wait_s``, never sent again."""
    await pool.execute("UPDATE ksef_documents SET ksef_ref = $2, problem = 'KSeF is still checking it',"
                       " next_at = now() + make_interval(secs => $3) WHERE number = $1", number, ksef_ref, wait_s)


async def sent(pool: asyncpg.Pool, number: str, ksef_number: str) -> None:
    await pool.execute("UPDATE ksef_documents SET state = 'sent', ksef_number = $2, sent_at = now(), problem = NULL,"
                       " next_at = NULL WHERE number = $1", number, ksef_number)


async def rejected(pool: asyncpg.Pool, number: str, problem: str) -> None:
    await pool.execute("UPDATE ksef_documents SET state = 'rejected', problem = $2, next_at = NULL WHERE number = $1",
                       number, problem)


async def retry(pool: asyncpg.Pool, due: Due, problem: str, first_wait_s: float, resend: bool = False) -> None:
    """Not sent this time: the next try after ``first_wait_s`` doubled per try so far (at most
    ``MAX_WAIT_S``); the invoice is in the offline mode from now on.  ``resend``: KSeF dropped what it
    had taken (its reference is forgotten, the document sent again)."""
    wait = min(first_wait_s * 2 ** min(due.attempts, 30), MAX_WAIT_S)
    await pool.execute("UPDATE ksef_documents SET attempts = attempts + 1, offline = true, problem = $2,"
                       " next_at = now() + make_interval(secs => $3),"
                       " ksef_ref = CASE WHEN $4 THEN NULL ELSE ksef_ref END WHERE number = $1",
                       due.number, problem, wait, resend)


async def of_org(pool: asyncpg.Pool, org_id: str) -> list[asyncpg.Record]:
    """An organisation's documents, newest first, without their XML (the CLI's listing)."""
    return list(await pool.fetch(
        "SELECT number, state, offline, ksef_number, attempts, next_at, problem, sent_at FROM ksef_documents"
        " WHERE org_id = $1 ORDER BY created_at DESC, number DESC", org_id))


async def document(pool: asyncpg.Pool, number: str) -> asyncpg.Record | None:
    """One document (XML included), or None."""
    return await pool.fetchrow("SELECT * FROM ksef_documents WHERE number = $1", number)
