"""One owner for the Redis key layout: no module but ``core.redis_keys`` spells a
``gw:`` key, and the scripts get their prefixes filled in from it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core import redis_keys as rk
from extproc import store

ROOT = Path(__file__).resolve().parent.parent


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            out.add(id(body[0].value))
    return out


def spelled_keys(root: Path) -> list[str]:
    """Where code (not a docstring) outside the layout module holds a string with ``gw:``."""
    found = []
    for pkg in ("extproc", "control", "sim", "bench"):
        for f in sorted((root / pkg).rglob("*.py")):
            rel = f.relative_to(root)
            if any(p.startswith(".") for p in rel.parts) or rel == Path("core/redis_keys.py"):
                continue
            tree = ast.parse(f.read_text())
            docs = _docstrings(tree)
            found += [f"{rel}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Constant)
                      and isinstance(n.value, str) and "gw:" in n.value and id(n) not in docs]
    return found


def test_no_other_module_spells_a_key() -> None:
    assert spelled_keys(ROOT) == []


def test_scripts_carry_the_layouts_prefixes() -> None:
    assert "'gw:k:' .." in store._ADMIT and "'gw:if'" in store._FINISH and "'gw:x:' .." in store._CANCEL
    assert "@" not in store._ADMIT + store._FINISH + store._CANCEL
    with pytest.raises(AssertionError):
        rk.lua("redis.call('GET', '@NOPE@')")
    assert rk.key("abc") == "gw:k:abc" and rk.org("o1") == "gw:o:o1" and rk.heartbeat("h") == "gw:hb:h"


def test_one_redis_keeps_the_plain_layout() -> None:
    assert not rk.ONE.cluster and rk.ONE.tag("o1") == ""
    assert (rk.ONE.org("o1"), rk.ONE.in_flight("o1"), rk.ONE.journal(""), rk.ONE.streams()) == (
        "gw:o:o1", "gw:c:o1", "gw:if", ["gw:usage"])


def test_a_clusters_shards_spread_over_the_slots_and_hold_an_organisations_keys() -> None:
    """Shard i's tag hashes into the i-th sixteenth of the slots; every key of an organisation (and its
    shard's journal and stream) is in its shard's slot; the organisations spread over the shards."""
    from redis.crc import key_slot
    tags = rk.CLUSTER.tags
    assert len(set(tags)) == rk.SHARDS == 16
    for i, tag in enumerate(tags):
        assert i * 1024 <= key_slot(tag.encode()) < (i + 1) * 1024
    orgs = [f"org_{n:04x}" for n in range(400)]
    counts = {t: sum(1 for o in orgs if rk.CLUSTER.tag(o) == t) for t in tags}
    assert min(counts.values()) >= 10  # none empty, none hoarding
    for org in orgs[:50]:
        tag = rk.CLUSTER.tag(org)
        slot = key_slot(tag.encode())
        names = [rk.CLUSTER.org(org), rk.CLUSTER.in_flight(org), rk.CLUSTER.journal(tag), rk.CLUSTER.stream(tag),
                 rk.RATE + tag + "key_1:123", rk.CANCELLED + tag + "req"]
        assert {key_slot(n.encode()) for n in names} == {slot}
        assert rk.CLUSTER.org_of(rk.CLUSTER.org(org)) == org and rk.ONE.org_of(rk.ONE.org(org)) == org
