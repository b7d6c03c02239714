"""``gateway catalog apply FILE [--force]``: put a new catalog in force under the alias change policy
(README, "Changing the model behind an alias"). The new catalog is checked against the one in force
(GATEWAY_CATALOG): a model change behind an alias effective less than 14 days ahead, or a smaller
context or output limit, is refused unless ``--force`` is given (then each is logged on stderr and
recorded as forced). The catalog and every model change it announces are recorded in PostgreSQL (the
console mails the owners once per change), then GATEWAY_CATALOG is replaced atomically: the running
processes pick it up."""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from core import catalog as catalog_mod
from core.alias_policy import ModelChange, breaches, describe, model_changes, too_soon


class Refused(Exception):
    """The new catalog breaks the policy and was not forced: one line per breach."""


@dataclass(frozen=True, slots=True)
class Plan:
    sha256: str
    text: bytes
    changes: list[ModelChange]
    soon: list[ModelChange]  # those effective less than 14 days ahead
    breaches: list[str]  # empty: nothing to force


def plan(new_path: str | Path, in_force: str | Path, now: int) -> Plan:
    """What applying ``new_path`` over ``in_force`` does (both load, or CatalogError names the problem)."""
    text = Path(new_path).read_bytes()
    new = catalog_mod.load(new_path, text)
    old = catalog_mod.load(in_force)
    changes = model_changes(old, new, now)
    return Plan(hashlib.sha256(text).hexdigest(), text, changes, too_soon(changes, now), breaches(old, new, now))


async def record(conn: asyncpg.Connection, p: Plan) -> None:
    """The catalog and its model changes, in one transaction (forced: those that break the policy)."""
    async with conn.transaction():
        await conn.execute("INSERT INTO catalog_applies (sha256, forced) VALUES ($1, $2) ON CONFLICT (sha256)"
                           " DO UPDATE SET forced = catalog_applies.forced OR EXCLUDED.forced, applied_at = now()",
                           p.sha256, bool(p.breaches))
        await conn.executemany(
            "INSERT INTO model_changes (alias, effective, before, after, forced, catalog_sha256)"
            " VALUES ($1, to_timestamp($2), $3, $4, $5, $6)",
            [(c.alias, c.effective, describe(c.before), describe(c.after), c in p.soon, p.sha256) for c in p.changes])


def replace(target: str | Path, text: bytes) -> None:
    """Write ``text`` over ``target`` atomically (a reader sees the old file or the new one, whole)."""
    t = Path(target)
    fd, tmp = tempfile.mkstemp(dir=t.parent, prefix=f".{t.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, t)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def apply(new_path: str, in_force: str, database_url: str, force: bool) -> list[ModelChange]:
    """Check, record and put in force; returns the model changes announced.  Raises Refused."""
    p = plan(new_path, in_force, int(time.time()))
    if p.breaches and not force:
        raise Refused("\n".join(p.breaches))
    for line in p.breaches:
        print(f"gateway: forced: {line}", file=sys.stderr)
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        await record(conn, p)
    finally:
        await conn.close()
    replace(in_force, p.text)
    return p.changes
