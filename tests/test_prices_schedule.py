"""Prices in Polish time: a date-only ``effective`` starts at 00:00 Europe/Warsaw (not
UTC); Billing shows the prices in force and every scheduled change with its Warsaw date and time; the
public changelog of prices and models is generated from the catalog."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import httpx
import yaml

from conftest import Gateway
from core import catalog
from test_console_support import signed_up

UTC = dt.timezone.utc


def _catalog(tmp_path: Path, steps: list[dict[str, object]]) -> catalog.Catalog:
    doc = {"aliases": {"a": {"capabilities": ["chat"], "context_length": 100, "max_output_tokens": 10,
                             "prices": steps, "upstreams": [{"model": "up"}]}},
           "upstream_models": {"up": {"deployments": [{"name": "d", "host": "127.0.0.1", "port": 1}]}}}
    f = tmp_path / "catalog.yaml"
    f.write_text(yaml.safe_dump(doc))
    return catalog.load(str(f))


def _utc(*a: int) -> int:
    return int(dt.datetime(*a, tzinfo=UTC).timestamp())


def test_a_date_alone_starts_at_midnight_in_warsaw(tmp_path: Path) -> None:
    cat = _catalog(tmp_path, [
        {"effective": "2026-01-01T00:00:00Z", "input_micro_pln_per_1m": 100, "output_micro_pln_per_1m": 200},
        {"effective": dt.date(2026, 12, 1), "input_micro_pln_per_1m": 110, "output_micro_pln_per_1m": 220},  # YAML date
        {"effective": "2027-07-01", "input_micro_pln_per_1m": 120, "output_micro_pln_per_1m": 240}])   # quoted
    a = cat.aliases["a"]
    assert [s.effective for s in a.price_steps] == [
        _utc(2026, 1, 1), _utc(2026, 11, 30, 23), _utc(2027, 6, 30, 22)]  # CET +1, CEST +2
    assert a.prices_at(_utc(2026, 11, 30, 22, 59, 59)).input == 100  # still 30 November in Warsaw
    assert a.prices_at(_utc(2026, 11, 30, 23)).input == 110          # 1 December, 00:00 in Warsaw
    assert [s.prices.input for s in a.scheduled(_utc(2026, 12, 5))] == [120]
    # a date-time names its zone; without one it is UTC, as before
    cat = _catalog(tmp_path, [{"effective": "2026-03-01T00:00:00", "input_micro_pln_per_1m": 1,
                               "output_micro_pln_per_1m": 1}])
    assert cat.aliases["a"].price_steps[0].effective == _utc(2026, 3, 1)


def test_billing_shows_scheduled_changes_in_warsaw_time(gateway: Gateway) -> None:
    c, _, _ = signed_up(gateway)
    page = c.get("/billing").text
    scheduled = page[page.index('id="scheduled"'):page.index("</table>", page.index('id="scheduled"'))]
    # the test catalog schedules polish-pro's new prices for 2099-01-01 (a date alone)
    assert "1 Jan 2099, 00:00 CET" in scheduled and "polish-pro" in scheduled  # the client reads English
    assert "1.400000" in scheduled and "2.900000" in scheduled
    in_force = page[page.index('id="prices"'):page.index("</table>", page.index('id="prices"'))]
    assert "1.500000" in in_force and "1.400000" not in in_force  # today's price is still the old one
    assert 'href="/changelog"' in page


def test_the_changelog_is_public_and_generated_from_the_catalog(gateway: Gateway) -> None:
    r = httpx.get(gateway.console + "/changelog")  # no language chosen: Polish
    assert r.status_code == 200
    rows = r.text[r.text.index('id="changelog"'):]
    assert rows.index("1 sty 2099, 00:00 CET") < rows.index("polish-fast")  # newest first
    assert "zaplanowane" in rows and "model dostępny" in rows
    for alias in ("polish-fast", "polish-pro", "advanced", "embed"):
        assert alias in rows
