"""One definition of the usage record (core/decisions.py): its JSON keeps the bytes records already
queued in Redis or spooled on disk have, and the usage writer's SQL, ``gateway usage``'s columns and the
console's CSV columns derived from its fields agree with control/schema.py's ``usage_records`` table in a
real PostgreSQL (the stack's)."""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from typing import Any

import asyncpg

from control.admin import USAGE_COLUMNS
from control.console.pages.usage import CSV_COLUMNS, RECORD_TYPES, WORKED_OUT
from core.decisions import UsageRecord
from extproc.usage_writer import WRITE
from conftest import Gateway

# what the record's JSON was when it was written by hand: what a queue or a spool may still hold
QUEUED = [
    '{"request_id":"rid-1","org_id":"org_1","key_id":"key_1","alias":"polish-fast","upstream_model":"up/m",'
    '"endpoint":"chat","status":200,"stream":true,"prompt_tokens":12,"completion_tokens":34,"estimated":false,'
    '"cost_micro_pln":1234,"input_price":100,"output_price":2000000,"started_at":1767225600.123456,'
    '"ttfb_ms":null,"ended_at":1767225600.5,"error_code":""}',
    '{"request_id":"rid-1","org_id":"org_1","key_id":"key_1","alias":"\\u0105\\u0119\\"\\\\","upstream_model":"up/m",'
    '"endpoint":"chat","status":502,"stream":false,"prompt_tokens":12,"completion_tokens":34,"estimated":true,'
    '"cost_micro_pln":1234,"input_price":100,"output_price":2000000,"started_at":1767225600.123456,'
    '"ttfb_ms":7,"ended_at":1767225600.5,"error_code":"upstream_timeout"}',
]

# information_schema's name of each PostgreSQL type a field declares
PG_NAMES = {"text": "text", "integer": "integer", "bigint": "bigint", "boolean": "boolean",
            "timestamptz": "timestamp with time zone"}


def test_queued_records_keep_their_bytes() -> None:
    for line in QUEUED:
        r = UsageRecord(**json.loads(line))
        assert r.to_json() == line
    assert UsageRecord(**json.loads(QUEUED[1])).alias == 'ąę"\\'


def test_the_table_is_the_records_fields(gateway: Gateway) -> None:
    cols = gateway.sql("SELECT column_name, data_type, is_nullable FROM information_schema.columns"
                       " WHERE table_name = 'usage_records' ORDER BY ordinal_position")
    want = [{"column_name": f.name, "data_type": PG_NAMES[f.metadata["pg_type"]],
             "is_nullable": "YES" if f.type == "int | None" or f.default == "" else "NO"}
            for f in dataclasses.fields(UsageRecord)]
    assert cols == want


def test_the_writers_sql_writes_a_record_as_it_is(gateway: Gateway) -> None:
    """The writer's statement on a real PostgreSQL (in a transaction rolled back): every field lands in its
    column, a time as that instant, "" as NULL; its cost is debited."""
    org = gateway.new_org()[0]
    recs = [UsageRecord(**{**json.loads(q), "org_id": org, "request_id": f"rid-{i}-{org}"})
            for i, q in enumerate(QUEUED)]

    async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        conn = await asyncpg.connect(gateway.stack.database_url)
        try:
            tr = conn.transaction()
            await tr.start()
            await conn.execute(WRITE, "[" + ",".join(r.to_json() for r in recs) + "]")
            rows = [dict(r) for r in await conn.fetch(
                "SELECT * FROM usage_records WHERE org_id = $1 ORDER BY request_id", org)]
            debits = [dict(r) for r in await conn.fetch(
                "SELECT amount_micro_pln, kind, ref FROM ledger WHERE org_id = $1 AND kind = 'usage' ORDER BY ref",
                org)]
            await tr.rollback()
            return rows, debits
        finally:
            await conn.close()

    rows, debits = asyncio.run(go())
    assert len(rows) == 2
    for row, rec in zip(rows, recs):
        want = dataclasses.asdict(rec)
        for t in ("started_at", "ended_at"):
            assert row[t] == dt.datetime.fromtimestamp(want.pop(t), dt.timezone.utc)
            row.pop(t)
        want["error_code"] = want["error_code"] or None
        assert row == want
    assert debits == [{"amount_micro_pln": -1234, "kind": "usage", "ref": f"usage:{r.request_id}"} for r in recs]
    assert gateway.sql("SELECT count(*) AS n FROM usage_records WHERE org_id = $1", org) == [{"n": 0}]


def test_operator_and_console_columns_are_the_records() -> None:
    names = [f.name for f in dataclasses.fields(UsageRecord)]
    assert USAGE_COLUMNS.split(", ") == [n for n in names if n != "org_id"]
    assert RECORD_TYPES == {f.name: f.metadata["pg_type"] for f in dataclasses.fields(UsageRecord)}
    assert [c for c in CSV_COLUMNS if c not in WORKED_OUT and c not in RECORD_TYPES] == []
    assert set(CSV_COLUMNS) & set(WORKED_OUT) == {"key_name", "latency_ms", "cost_pln"}
