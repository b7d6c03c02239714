"""VAT invoices for top-ups, and their corrections: the typed record (``Invoice``) and the one place
that numbers and records one (``issue``).  One invoice per paid payment, in series ``FV``; a correction
(faktura korygująca) in series ``FK`` when the organisation's billing details change after an invoice
was issued, referencing the invoice it corrects.  Each series is numbered without gaps per calendar year
in Warsaw (``FV/2026/000123``, ``FK/2026/000001``).  23% VAT with the amount paid as the gross, net and
VAT exact in grosze; the buyer's details as the organisation's billing details stood when the invoice
was issued.  The PDF is ``invoice_pdf``'s.

Gap-free numbering: the series' counter row for the year is incremented in the same transaction that
inserts the invoice (``INSERT … ON CONFLICT DO UPDATE … RETURNING`` locks the row until commit), so
concurrent payments queue on it and a rolled-back issue gives its number back."""
from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import asdict, dataclass, replace
from typing import Literal

import asyncpg

from control.ksef import store as ksef_store
from core.catalog import WARSAW

from .settings import ConsoleSettings

VAT_PCT = 23
_NIP_WEIGHTS = (6, 5, 7, 2, 3, 4, 5, 6, 7)
Series = Literal["FV", "FK"]
TOPUP_LINE = "Doładowanie salda usługi (przedpłata)"  # a prepayment for the gateway's services
TOPUP_UNIT = "usł."
BUYER_CORRECTED = "Korekta danych nabywcy"  # the reason on a correction of the buyer's details


def nip_valid(nip: str) -> bool:
    """A Polish tax number: 10 digits (a "PL" prefix, dashes and spaces allowed) whose last is the
    checksum: the weighted sum of the first nine modulo 11 (never 10)."""
    digits = normal_nip(nip)
    if len(digits) != 10 or not digits.isdigit():
        return False
    check = sum(int(d) * w for d, w in zip(digits, _NIP_WEIGHTS)) % 11
    return check != 10 and check == int(digits[9])


def normal_nip(nip: str) -> str:
    """The 10 digits as invoices print them: without the "PL" (EU VAT) prefix, spaces or dashes."""
    digits = nip.replace("-", "").replace(" ", "").strip()
    return digits[2:] if digits[:2].upper() == "PL" else digits


def split_gross(gross_grosze: int) -> tuple[int, int]:
    """(net, VAT) in grosze of a gross amount at 23%: net = gross / 1.23 rounded half up, VAT = the rest,
    so net + VAT is the amount paid to the grosz."""
    net = (gross_grosze * 200 + (100 + VAT_PCT)) // (2 * (100 + VAT_PCT))
    return net, gross_grosze - net


def grosze(micro_pln: int) -> int:
    assert micro_pln % 10_000 == 0, "top-ups are whole grosze"
    return micro_pln // 10_000


def pln_text(g: int) -> str:
    """Grosze as Polish invoices write them: 1 234,56 zł."""
    sign, g = ("-", -g) if g < 0 else ("", g)
    whole = f"{g // 100:,}".replace(",", "\u00a0")
    return f"{sign}{whole},{g % 100:02d} zł"


@dataclass(frozen=True, slots=True)
class Seller:
    name: str
    nip: str
    address: str

    @classmethod
    def of(cls, s: ConsoleSettings) -> "Seller":
        """The operator's company as GATEWAY_SELLER_* give it (placeholders say what to set)."""
        return cls(s.seller_name or "(set GATEWAY_SELLER_NAME)", s.seller_nip or "(set GATEWAY_SELLER_NIP)",
                   s.seller_address or "(set GATEWAY_SELLER_ADDRESS)")


# ---- the record ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Buyer:
    """Who an invoice is made out to: a company (``nip``: its 10 digits) or a private person (no NIP)."""
    name: str
    nip: str | None
    address: str
    person: bool

    @property
    def complete(self) -> bool:
        """Enough to invoice: a name and an address, and a valid NIP unless a private person."""
        return bool(self.name and self.address and (self.person or (self.nip and nip_valid(self.nip))))


@dataclass(frozen=True, slots=True)
class Line:
    """One position: ``quantity`` ``unit`` at ``net_unit_grosze`` each, at ``vat_pct``."""
    name: str
    quantity: int
    unit: str
    net_unit_grosze: int
    vat_pct: int
    net_grosze: int
    vat_grosze: int
    gross_grosze: int


@dataclass(frozen=True, slots=True)
class RateTotal:
    """The sums at one VAT rate."""
    vat_pct: int
    net_grosze: int
    vat_grosze: int
    gross_grosze: int


@dataclass(frozen=True, slots=True)
class Correction:
    """What a correction corrects: the original invoice (the one it references) and the state it
    replaces (the original, or the latest correction of it before this one)."""
    original_id: str
    original_number: str
    original_issue_date: dt.date
    reason: str
    buyer_before: Buyer
    lines_before: tuple[Line, ...]
    totals_before: tuple[RateTotal, ...]


@dataclass(frozen=True, slots=True)
class Invoice:
    """An issued invoice (series FV) or correction (series FK), as recorded.  Amounts in grosze; dates
    in Warsaw.  A top-up is paid before any service: the invoice is for a prepayment, settled in full
    (``due_grosze`` 0) by ``payment_method`` on ``paid_on``, which is also its date of sale."""
    id: str
    number: str
    series: Series
    year: int
    seq: int
    org_id: str
    payment_id: str
    issued_at: dt.datetime
    issue_date: dt.date
    sale_date: dt.date
    paid_on: dt.date
    payment_method: str          # the payment provider: "p24" (Przelewy24) or "sandbox" (development)
    buyer: Buyer
    lines: tuple[Line, ...]
    totals: tuple[RateTotal, ...]
    gross_grosze: int            # the invoice's gross total (a correction: after the correction)
    paid_grosze: int
    due_grosze: int
    prepayment: bool
    correction: Correction | None

    @property
    def file_name(self) -> str:
        return self.number.replace("/", "-") + ".pdf"

    def as_dict(self) -> dict[str, object]:
        """JSON-ready (``gateway invoices … --json``): dates ISO, amounts in grosze."""
        return asdict(self)


def topup_lines(gross: int) -> tuple[tuple[Line, ...], tuple[RateTotal, ...]]:
    """A top-up's single position (one service, its net price) and its rate's totals."""
    net, vat = split_gross(gross)
    return ((Line(TOPUP_LINE, 1, TOPUP_UNIT, net, VAT_PCT, net, vat, gross),),
            (RateTotal(VAT_PCT, net, vat, gross),))


def _buyer(row: asyncpg.Record) -> Buyer:
    return Buyer(row["buyer_name"], row["buyer_nip"], row["buyer_address"] or "", bool(row["buyer_person"]))


def _day(t: dt.datetime) -> dt.date:
    return t.astimezone(WARSAW).date()


def _record(row: asyncpg.Record, refs: dict[str, asyncpg.Record]) -> Invoice:
    lines, totals = topup_lines(row["gross_grosze"])
    correction = None
    if row["corrects"] is not None:
        original, previous = refs[row["corrects"]], refs[row["previous"]]
        correction = Correction(original["id"], original["number"], _day(original["issued_at"]), row["reason"],
                                _buyer(previous), *topup_lines(previous["gross_grosze"]))
    return Invoice(row["id"], row["number"], row["series"], row["year"], row["seq"], row["org_id"],
                   row["payment_id"], row["issued_at"], _day(row["issued_at"]), _day(row["paid_at"]),
                   _day(row["paid_at"]), row["payment_method"], _buyer(row), lines, totals, row["gross_grosze"],
                   row["gross_grosze"], 0, True, correction)


async def _records(conn: asyncpg.Connection | asyncpg.Pool, rows: list[asyncpg.Record]) -> list[Invoice]:
    wanted = {r[k] for r in rows for k in ("corrects", "previous") if r[k] is not None}
    refs = {r["id"]: r for r in await conn.fetch("SELECT * FROM invoices WHERE id = ANY($1)", list(wanted))} \
        if wanted else {}
    return [_record(r, refs) for r in rows]


async def org_invoices(pool: asyncpg.Pool, org_id: str, limit: int = 200) -> list[Invoice]:
    """The organisation's invoices and corrections, the latest first."""
    rows = await pool.fetch("SELECT * FROM invoices WHERE org_id = $1 ORDER BY issued_at DESC, seq DESC LIMIT $2",
                            org_id, limit)
    return await _records(pool, rows)


async def find(pool: asyncpg.Pool, org_id: str, ref: str) -> Invoice | None:
    """The organisation's invoice by its id or number (None: not this organisation's)."""
    rows = await pool.fetch("SELECT * FROM invoices WHERE org_id = $1 AND (id = $2 OR number = $2)", org_id, ref)
    return (await _records(pool, rows))[0] if rows else None


async def org_buyer(conn: asyncpg.Connection | asyncpg.Pool, org_id: str, lock: bool = False) -> Buyer | None:
    """The organisation's billing details as they stand (None: no such organisation)."""
    org = await conn.fetchrow("SELECT name, billing_name, billing_nip, billing_address, billing_person"
                              " FROM orgs WHERE id = $1" + (" FOR UPDATE" if lock else ""), org_id)
    if org is None:
        return None
    return Buyer(org["billing_name"] or org["name"], org["billing_nip"], org["billing_address"] or "",
                 bool(org["billing_person"]))


def details_missing(org: asyncpg.Record) -> list[str]:
    """What an organisation's billing details (an ``orgs`` row's billing_*) still lack before it can pay:
    "name", "address", "nip" (a valid NIP, or the explicit choice of a private person)."""
    return [k for k, ok in (("name", org["billing_name"]), ("address", org["billing_address"]),
                            ("nip", org["billing_person"] or nip_valid(org["billing_nip"] or ""))) if not ok]


# ---- issuing --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Draft:
    """What ``issue`` numbers and records: the series, the payment it is for, the buyer, the gross, and
    for a correction the invoice it corrects and the state it replaces."""
    series: Series
    org_id: str
    payment_id: str
    buyer: Buyer
    gross_grosze: int
    payment_method: str
    paid_at: dt.datetime
    corrects: str | None = None
    previous: str | None = None
    reason: str | None = None


async def issue(conn: asyncpg.Connection, draft: Draft) -> Invoice:
    """Number and record one invoice or correction inside the caller's transaction: every invoice is
    issued here (a failure later in the transaction gives the number back)."""
    issued = dt.datetime.now(WARSAW)
    seq = await conn.fetchval(
        "INSERT INTO invoice_counters (series, year, last) VALUES ($1, $2, 1) ON CONFLICT (series, year)"
        " DO UPDATE SET last = invoice_counters.last + 1 RETURNING last", draft.series, issued.year)
    net, vat = split_gross(draft.gross_grosze)
    b = draft.buyer
    row = await conn.fetchrow(
        "INSERT INTO invoices (id, number, series, year, seq, org_id, payment_id, issued_at, gross_grosze, net_grosze,"
        " vat_grosze, vat_pct, buyer_name, buyer_nip, buyer_address, buyer_person, payment_method, paid_at,"
        " corrects, previous, reason)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)"
        " RETURNING *",
        "inv_" + secrets.token_hex(8), f"{draft.series}/{issued.year}/{seq:06d}", draft.series, issued.year, seq,
        draft.org_id, draft.payment_id, issued, draft.gross_grosze, net, vat, VAT_PCT, b.name,
        None if b.person else b.nip, b.address or None, b.person, draft.payment_method, draft.paid_at,
        draft.corrects, draft.previous, draft.reason)
    await ksef_store.enqueue(conn, row["number"], draft.org_id)  # its FA(3) document, made and sent by KSeF's loop
    return (await _records(conn, [row]))[0]


async def issue_for_payment(pool: asyncpg.Pool, payment_id: str) -> tuple[Invoice | None, bool]:
    """(the invoice of a paid payment, whether this call issued it): issued once (idempotent, the
    payment's row locked while deciding); (None, False) if the payment is not paid."""
    async with pool.acquire() as conn, conn.transaction():
        pay = await conn.fetchrow("SELECT * FROM payments WHERE id = $1 AND status = 'paid' FOR UPDATE", payment_id)
        if pay is None:
            return None, False
        existing = await conn.fetch("SELECT * FROM invoices WHERE payment_id = $1 AND corrects IS NULL", payment_id)
        if existing:
            return (await _records(conn, existing))[0], False
        buyer = await org_buyer(conn, pay["org_id"])
        assert buyer is not None, "a payment's organisation exists"
        return await issue(conn, Draft("FV", pay["org_id"], payment_id, buyer, grosze(pay["amount_micro_pln"]),
                                       pay["provider"], pay["paid_at"] or dt.datetime.now(WARSAW))), True


async def outdated(pool: asyncpg.Pool, org_id: str) -> list[Invoice]:
    """The organisation's invoices whose buyer (as last corrected) differs from its billing details now:
    those ``correct`` would correct, oldest first."""
    async with pool.acquire() as conn:
        return [inv for inv, _ in await _outdated(conn, org_id)]


async def _outdated(conn: asyncpg.Connection, org_id: str, lock: bool = False) -> list[tuple[Invoice, Buyer]]:
    """(each original invoice whose latest state's buyer differs from the details now, those details)."""
    now = await org_buyer(conn, org_id, lock)
    if now is None or not now.complete:
        return []
    rows = await conn.fetch(
        "SELECT DISTINCT ON (coalesce(corrects, id)) * FROM invoices WHERE org_id = $1"
        " ORDER BY coalesce(corrects, id), issued_at DESC, seq DESC", org_id)
    latest = [inv for inv in await _records(conn, rows) if inv.buyer != _comparable(now)]
    return sorted(((inv, now) for inv in latest), key=lambda p: (p[0].issued_at, p[0].seq))


def _comparable(b: Buyer) -> Buyer:
    """The details as an invoice records them (a private person's NIP is not kept)."""
    return replace(b, nip=None) if b.person else b


async def correct(pool: asyncpg.Pool, org_id: str, numbers: frozenset[str] = frozenset()) -> list[Invoice]:
    """Corrections (series FK) of the organisation's invoices whose buyer differs from its billing details
    now (only those numbered in ``numbers``, when given): each references the original, replaces the
    latest state of it, and keeps its amounts.  Idempotent: nothing left to correct issues nothing.  The
    organisation's row is locked meanwhile, so two calls at once correct each invoice once."""
    issued: list[Invoice] = []
    async with pool.acquire() as conn, conn.transaction():
        for state, now in await _outdated(conn, org_id, lock=True):
            original = state.correction.original_number if state.correction else state.number
            if numbers and original not in numbers and state.number not in numbers:
                continue
            issued.append(await issue(conn, Draft(
                "FK", org_id, state.payment_id, _comparable(now), state.gross_grosze, state.payment_method,
                await conn.fetchval("SELECT paid_at FROM invoices WHERE id = $1", state.id),
                corrects=state.correction.original_id if state.correction else state.id,
                previous=state.id, reason=BUYER_CORRECTED)))
    return issued
