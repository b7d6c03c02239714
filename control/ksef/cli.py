"""``gateway invoices ksef ORG``: each of the organisation's invoices on its way to KSeF (README, "Invoices"):
sent with its KSeF number, waiting (offline mode: how many tries, when the next, why not yet), rejected
(KSeF's reason), or kept (KSeF not configured)."""
from __future__ import annotations

from typing import Any

import asyncpg

from . import store

WORDS = {"new": "FA(3) document not made yet", "kept": "not sent (KSeF not configured)"}


def add_command(group: Any) -> Any:
    """The ``ksef`` subcommand in the CLI's ``invoices`` group; returns its parser."""
    p = group.add_parser("ksef", help="the organisation's invoices in KSeF: KSeF numbers, the offline queue, rejections")
    p.add_argument("org")
    return p


def line(r: dict[str, Any]) -> str:
    state = r["state"]
    if state == "sent":
        said = r["ksef_number"] + ("  (issued offline)" if r["offline"] else "")
    elif state == "queued":
        said = (f"offline; {r['attempts']} tries, next {r['next_at']:%Y-%m-%d %H:%M:%S %Z}" if r["offline"]
                else "to be sent") + (f"; {r['problem']}" if r["problem"] else "")
    elif state == "rejected":
        said = r["problem"] or ""
    else:
        said = WORDS[state]
    return f"{r['number']}  {state:<8}  {said}"


async def run(pool: asyncpg.Pool, org_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await store.of_org(pool, org_id)]
