"""What the operator has: organisations with the limits in force, and their keys (read only; ``gateway org
list``, ``org show``, ``org limits`` without a flag, ``key list``).

Limits in force, as the ext_proc's admission applies them (extproc/store.py): a key's requests per minute
are its own limit, else its organisation's (a per-key limit for each of the organisation's keys), else
GATEWAY_DEFAULT_RPM; concurrency is per organisation, else GATEWAY_DEFAULT_CONCURRENCY.  The defaults are
the ones this command's environment sets: the same as the ext_proc's where they share their settings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from core.redis_client import AnyRedis, layout_of
from core import redis_keys as rk
from core.cost import micro_to_pln

from .admin import AdminError, key_limits_view


@dataclass(frozen=True)
class Defaults:
    rpm: int            # GATEWAY_DEFAULT_RPM: per key
    concurrency: int    # GATEWAY_DEFAULT_CONCURRENCY: per organisation


def limits_in_force(rpm: int | None, concurrency: int | None, d: Defaults) -> dict[str, Any]:
    """An organisation's limits in force and where each comes from ("organisation" or the default's
    setting)."""
    return {"rpm_per_key": rpm if rpm is not None else d.rpm,
            "rpm_per_key_from": "organisation" if rpm is not None else "GATEWAY_DEFAULT_RPM",
            "concurrency_per_organisation": concurrency if concurrency is not None else d.concurrency,
            "concurrency_per_organisation_from": "organisation" if concurrency is not None
            else "GATEWAY_DEFAULT_CONCURRENCY"}


async def _balances(pool: asyncpg.Pool, r: AnyRedis, org_ids: list[str]) -> dict[str, int]:
    """Each organisation's live balance (micro-PLN): Redis's where it is cached, else the ledger's sum."""
    rows = await pool.fetch("SELECT org_id, COALESCE(SUM(amount_micro_pln), 0) AS s FROM ledger"
                            " WHERE org_id = ANY($1::text[]) GROUP BY org_id", org_ids)
    ledger = {r_["org_id"]: int(r_["s"]) for r_ in rows}
    layout = layout_of(r)
    async with r.pipeline(transaction=False) as p:
        for o in org_ids:
            p.hget(layout.org(o), "balance")
        cached = await p.execute()
    return {o: int(c) if c is not None else ledger.get(o, 0) for o, c in zip(org_ids, cached)}


async def list_orgs(pool: asyncpg.Pool, r: AnyRedis, d: Defaults) -> list[dict[str, Any]]:
    """Every organisation, oldest first, with its balance, limits in force and number of active keys."""
    rows = await pool.fetch(
        "SELECT o.id, o.name, o.status, o.rpm, o.concurrency, o.created_at,"
        " (SELECT count(*) FROM api_keys k WHERE k.org_id = o.id AND k.revoked_at IS NULL) AS active_keys"
        " FROM orgs o ORDER BY o.created_at, o.id")
    balances = await _balances(pool, r, [row["id"] for row in rows])
    return [_org(row, balances[row["id"]], d) for row in rows]


async def show_org(pool: asyncpg.Pool, r: AnyRedis, org_id: str, d: Defaults) -> dict[str, Any]:
    row = await pool.fetchrow(
        "SELECT o.id, o.name, o.status, o.rpm, o.concurrency, o.created_at,"
        " (SELECT count(*) FROM api_keys k WHERE k.org_id = o.id AND k.revoked_at IS NULL) AS active_keys"
        " FROM orgs o WHERE o.id = $1", org_id)
    if row is None:
        raise AdminError(f"no such organisation: {org_id}")
    return _org(row, (await _balances(pool, r, [org_id]))[org_id], d)


def _org(row: asyncpg.Record, balance: int, d: Defaults) -> dict[str, Any]:
    return {"id": row["id"], "name": row["name"], "status": row["status"],
            "balance_micro_pln": balance, "balance_pln": micro_to_pln(balance),
            **limits_in_force(row["rpm"], row["concurrency"], d),
            "active_keys": int(row["active_keys"]), "created_at": row["created_at"].isoformat()}


async def list_keys(pool: asyncpg.Pool, org_id: str, d: Defaults) -> list[dict[str, Any]]:
    """The organisation's keys, oldest first (revoked ones too): id, the key's first characters, name,
    its own requests-per-minute limit (null: none) and the one in force, its own limits (monthly, models,
    expiry: null for none).  Never the key."""
    org = await pool.fetchrow("SELECT rpm FROM orgs WHERE id = $1", org_id)
    if org is None:
        raise AdminError(f"no such organisation: {org_id}")
    rows = await pool.fetch("SELECT id, prefix, name, rpm, created_at, revoked_at, monthly_limit_micro_pln, models,"
                            " expires_at FROM api_keys WHERE org_id = $1 ORDER BY created_at, id", org_id)
    fallback = org["rpm"] if org["rpm"] is not None else d.rpm
    return [{"id": k["id"], "prefix": k["prefix"], "name": k["name"], "rpm": k["rpm"],
             "rpm_in_force": k["rpm"] if k["rpm"] is not None else fallback,
             **key_limits_view(k["monthly_limit_micro_pln"], k["models"], k["expires_at"]),
             "created_at": k["created_at"].isoformat(),
             "revoked_at": k["revoked_at"].isoformat() if k["revoked_at"] else None} for k in rows]


def org_lines(o: dict[str, Any]) -> str:
    """``gateway org show``'s text."""
    return "\n".join([
        f"id            {o['id']}", f"name          {o['name']}", f"status        {o['status']}",
        f"balance       {o['balance_pln']} PLN", limit_lines(o),
        f"active keys   {o['active_keys']}", f"created       {o['created_at']}"])


def limit_lines(o: dict[str, Any]) -> str:
    """The limits in force, one line each (``gateway org limits``, ``org show``)."""
    return (f"rpm           {o['rpm_per_key']} per key ({_source(o['rpm_per_key_from'])})\n"
            f"concurrency   {o['concurrency_per_organisation']} per organisation "
            f"({_source(o['concurrency_per_organisation_from'])})")


def _source(where: str) -> str:
    return "the organisation's limit" if where == "organisation" else f"default, {where}"


def orgs_table(orgs: list[dict[str, Any]]) -> str:
    """``gateway org list``'s text: one line per organisation."""
    return "\n".join(f"{o['id']}  {o['status']:<9} {o['balance_pln']:>16} PLN  rpm/key {o['rpm_per_key']:<6}"
                     f" concurrency {o['concurrency_per_organisation']:<4} keys {o['active_keys']:<3} {o['name']}"
                     for o in orgs) or "no organisations yet (gateway org create NAME --balance PLN)"


def keys_table(keys: list[dict[str, Any]]) -> str:
    """``gateway key list``'s text: one line per key."""
    return "\n".join(f"{k['id']}  {k['prefix']}…  rpm {k['rpm_in_force']:<6}"
                     f"{' (own)' if k['rpm'] is not None else '      '}  "
                     f"{'revoked ' + k['revoked_at'] if k['revoked_at'] else 'active'}  {k['name'] or '-'}"
                     + (f"  monthly limit {k['monthly_limit_pln']} PLN" if k["monthly_limit_pln"] else "")
                     + (f"  models {','.join(k['models'])}" if k["models"] else "")
                     + (f"  expires {k['expires']}" if k["expires"] else "")
                     for k in keys) or "no keys yet (gateway key create ORG)"
