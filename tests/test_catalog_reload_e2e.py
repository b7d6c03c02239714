"""The catalog hot reload never dies: an invalid catalog is refused with a log line naming the file, the
line and the field, the catalog in force stays, and the next valid edit is picked up (GET /v1/models,
answered by the ext_proc from the catalog it holds)."""
from __future__ import annotations

import copy
from pathlib import Path

import httpx
import yaml

from conftest import Gateway, wait_for


def _price(gateway: Gateway, key: str) -> int | None:
    r = httpx.get(gateway.v1 + "/models/empty-alias", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200, r.text
    return int(r.json()["pricing"]["output_micro_pln_per_1m"])


def test_an_invalid_catalog_is_refused_and_the_next_valid_edit_is_picked_up(gateway: Gateway) -> None:
    _, _, key = gateway.new_org(1_000_000)
    path = Path(gateway.stack.s.catalog)
    original = path.read_text()
    log = gateway.stack.logs / "extproc.log"
    doc = yaml.safe_load(original)
    start = in_force = _price(gateway, key)
    try:
        for n, bad in enumerate(["1.5e6", "abc", "1.5", "-3"]):
            before = log.read_text()
            # the price line of empty-alias, as text: YAML reads 1.5e6 as a string, 1.5 as a float
            text = yaml.safe_dump(doc).replace(
                "output_micro_pln_per_1m: 1\n", f"output_micro_pln_per_1m: {bad}\n", 1)
            assert text != yaml.safe_dump(doc)
            path.write_text(text)
            refusal = wait_for(lambda: [line for line in log.read_text()[len(before):].splitlines()
                                        if "catalog not reloaded" in line], timeout=10)
            line_no = next(i + 1 for i, t in enumerate(text.splitlines()) if f"output_micro_pln_per_1m: {bad}" in t)
            assert f"{path}: line {line_no}: aliases.empty-alias.prices[0].output_micro_pln_per_1m: must be an integer" \
                in refusal[0], refusal
            assert _price(gateway, key) == in_force  # the catalog in force stays
            # the next valid edit is picked up
            good = copy.deepcopy(doc)
            good["aliases"]["empty-alias"]["prices"][0]["output_micro_pln_per_1m"] = 1000 + n
            path.write_text(yaml.safe_dump(good))
            in_force = wait_for(lambda: _price(gateway, key) == 1000 + n and 1000 + n, timeout=10)
    finally:
        path.write_text(original)
        wait_for(lambda: _price(gateway, key) == start, timeout=10)
