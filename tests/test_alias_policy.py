"""The alias change policy as pure functions (docs/configuration.md, "Changing the model behind an alias"): dated
upstream steps in the catalog, routing by the step in force at a request's start, and the comparison of
the catalog in force with a new one (the model changes it brings, those under 14 days ahead, smaller
limits)."""
from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from control.console.pages.changelog import entries
from core.alias_policy import NOTICE_S, breaches, describe, model_changes, refusal, shrunk_limits, too_soon
from core.catalog import ALWAYS, Catalog, CatalogError, Upstream, parse

NOW = 1_800_000_000  # 2027-01-15T08:00:00Z
DAY = 86400


def doc(upstreams: list[dict[str, Any]] | None = None, changes: list[dict[str, Any]] | None = None,
        context: int = 8192, output: int = 2048) -> dict[str, Any]:
    """A catalog whose alias ``x`` has these upstreams, changes and limits; its alias ``other`` never changes."""
    prices = [{"effective": "2026-01-01T00:00:00Z", "input_micro_pln_per_1m": 1, "output_micro_pln_per_1m": 1}]
    alias: dict[str, Any] = {"capabilities": ["chat"], "context_length": context, "max_output_tokens": output,
                             "prices": prices, "upstreams": [{"model": "a"}] if upstreams is None else upstreams}
    if changes is not None:
        alias["upstream_changes"] = changes
    other = {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048, "prices": prices,
             "upstreams": [{"model": "c"}]}
    return {"aliases": {"x": alias, "other": other},
            "upstream_models": {m: {"deployments": []} for m in ("a", "b", "c")}}


def at(t: int) -> str:
    """An ``effective`` value: unix seconds as an ISO date-time in UTC."""
    import datetime as dt
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()


def cat(*a: Any, **k: Any) -> Catalog:
    return parse(doc(*a, **k))


def test_plain_upstreams_are_in_force_since_always_and_steps_take_over_at_their_time() -> None:
    c = cat(changes=[{"effective": at(NOW + 20 * DAY), "upstreams": [{"model": "a", "share": 80}, {"model": "b", "share": 20}]},
                     {"effective": at(NOW + 10 * DAY), "upstreams": [{"model": "c"}]}])
    x = c.aliases["x"]
    assert [s.effective for s in x.upstream_steps] == [ALWAYS, NOW + 10 * DAY, NOW + 20 * DAY]  # sorted
    assert x.upstreams_at(0) == x.upstreams_at(NOW + 10 * DAY - 1) == (Upstream("a", 100),)
    assert x.upstreams_at(NOW + 10 * DAY) == (Upstream("c", 100),)
    assert x.upstreams_at(NOW + 30 * DAY) == (Upstream("a", 80), Upstream("b", 20))
    # every model some step names: the clusters and simulators the alias needs
    assert [u.model for u in x.upstreams] == ["a", "c", "b"]
    assert {x.pick_upstream(NOW) for _ in range(50)} == {"a"}
    assert {x.pick_upstream(NOW + 10 * DAY) for _ in range(50)} == {"c"}
    picks = Counter(x.pick_upstream(NOW + 20 * DAY) for _ in range(4000))
    assert set(picks) == {"a", "b"} and 600 < picks["b"] < 1000  # 20 % of 4000 = 800
    # an alias with no upstream before its first step: none (the gateway answers 503 no_capacity)
    late = cat(upstreams=[], changes=[{"effective": at(NOW), "upstreams": [{"model": "b"}]}]).aliases["x"]
    assert late.pick_upstream(NOW - 1) is None and late.pick_upstream(NOW) == "b"


@pytest.mark.parametrize(("changes", "message"), [
    ([{"upstreams": [{"model": "a"}]}], r"aliases\.x\.upstream_changes\[0\]\.effective: missing or not a date-time"),
    ([{"effective": "soon", "upstreams": [{"model": "a"}]}], r"upstream_changes\[0\]\.effective: not an ISO date-time"),
    ([{"effective": "2027-01-01", "upstreams": [{"model": "zz"}]}],
     r"upstream_changes\[0\]\.upstreams\[0\]\.model: must name an entry of upstream_models"),
    ([{"effective": "2027-01-01", "upstreams": [{"model": "a", "share": 1.5}]}],
     r"upstream_changes\[0\]\.upstreams\[0\]\.share: must be an integer >= 0"),
    ([{"effective": "2027-01-01", "upstreams": [{"model": "a"}]}, {"effective": "2027-01-01", "upstreams": []}],
     r"upstream_changes\[1\]\.effective: another upstream change of this alias has the same time"),
    (["a"], r"upstream_changes\[0\]: must be a mapping"),
    ({"effective": "2027-01-01"}, r"aliases\.x\.upstream_changes: must be a list"),
])
def test_a_bad_upstream_change_is_refused_naming_its_field(changes: Any, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        cat(changes=changes)


def test_a_share_moved_at_once_is_a_change_effective_now_and_too_soon() -> None:
    """The silent 20 % move: the plain upstreams edited in place."""
    old, new = cat(), cat(upstreams=[{"model": "a", "share": 80}, {"model": "b", "share": 20}])
    changes = model_changes(old, new, NOW)
    assert [(c.alias, c.effective, describe(c.before), describe(c.after)) for c in changes] == [
        ("x", NOW, "a 100%", "a 80%, b 20%")]
    assert too_soon(changes, NOW) == changes
    assert refusal(changes[0], NOW) == (
        "alias x: model change effective 2027-01-15T09:00+01:00 (a 100% -> a 80%, b 20%) is announced less than"
        " 14 days ahead; the earliest allowed is 2027-01-29T09:00+01:00")


def test_a_change_14_days_ahead_is_allowed_and_one_second_less_is_not() -> None:
    old = cat()
    for ahead, soon in ((NOTICE_S, False), (NOTICE_S - 1, True), (3 * DAY, True), (90 * DAY, False)):
        new = cat(changes=[{"effective": at(NOW + ahead), "upstreams": [{"model": "b"}]}])
        changes = model_changes(old, new, NOW)
        assert [(c.alias, c.effective, c.before, c.after) for c in changes] == [
            ("x", NOW + ahead, (Upstream("a", 100),), (Upstream("b", 100),))]
        assert bool(too_soon(changes, NOW)) is soon, ahead
        assert bool(breaches(old, new, NOW)) is soon


def test_what_is_not_a_new_change() -> None:
    step = {"effective": at(NOW + 5 * DAY), "upstreams": [{"model": "b"}]}
    scheduled = cat(changes=[step])
    # the same catalog again, shares written differently (80/20 is 4/1), a new alias: nothing
    assert model_changes(scheduled, cat(changes=[step]), NOW) == []
    assert model_changes(cat(upstreams=[{"model": "a", "share": 80}, {"model": "b", "share": 20}]),
                         cat(upstreams=[{"model": "b", "share": 1}, {"model": "a", "share": 4}]), NOW) == []
    grown = doc()
    grown["aliases"]["new-alias"] = {**grown["aliases"]["x"], "upstreams": [{"model": "b"}]}
    assert model_changes(cat(), parse(grown), NOW) == []
    # a step already passed, whatever it was before, is history: only what routes from now on counts
    past = cat(changes=[{"effective": at(NOW - DAY), "upstreams": [{"model": "b"}]}])
    assert model_changes(past, cat(upstreams=[{"model": "b"}]), NOW) == []
    # a scheduled change cancelled or postponed is no model change (clients keep what they have)
    assert model_changes(scheduled, cat(), NOW) == []
    assert model_changes(scheduled, cat(changes=[{**step, "effective": at(NOW + 30 * DAY)}]), NOW) == []
    # brought forward: a change at the new time, too soon
    earlier = model_changes(cat(changes=[{**step, "effective": at(NOW + 20 * DAY)}]), scheduled, NOW)
    assert [(c.effective, describe(c.after)) for c in earlier] == [(NOW + 5 * DAY, "b 100%")]
    assert too_soon(earlier, NOW) == earlier


def test_several_steps_each_a_change_from_the_step_before() -> None:
    new = cat(changes=[{"effective": at(NOW + 20 * DAY), "upstreams": [{"model": "a", "share": 80}, {"model": "b", "share": 20}]},
                       {"effective": at(NOW + 40 * DAY), "upstreams": [{"model": "b"}]}])
    assert [(c.effective, describe(c.before), describe(c.after)) for c in model_changes(cat(), new, NOW)] == [
        (NOW + 20 * DAY, "a 100%", "a 80%, b 20%"), (NOW + 40 * DAY, "a 80%, b 20%", "b 100%")]


def test_limits_stay_the_same_or_grow() -> None:
    assert shrunk_limits(cat(), cat(context=16384, output=4096)) == []
    assert shrunk_limits(cat(), cat(context=4096, output=1024)) == [
        "alias x: context_length 4096 is smaller than the 8192 in force; an alias's limits stay the same or grow"
        " (a smaller model is a new alias)",
        "alias x: max_output_tokens 1024 is smaller than the 2048 in force; an alias's limits stay the same or grow"
        " (a smaller model is a new alias)"]
    assert breaches(cat(), cat(output=1024), NOW) == shrunk_limits(cat(), cat(output=1024))


def test_the_changelog_lists_model_changes_beside_prices() -> None:
    c = cat(changes=[{"effective": at(NOW - DAY), "upstreams": [{"model": "b"}]},
                     {"effective": at(NOW + 20 * DAY), "upstreams": [{"model": "b", "share": 3}, {"model": "c", "share": 1}]},
                     {"effective": at(NOW + 30 * DAY), "upstreams": [{"model": "b", "share": 6}, {"model": "c", "share": 2}]}])
    ups = [(e.at, e.alias, e.scheduled, e.before, e.after) for e in entries(c, NOW) if e.what == "upstream"]
    # newest first; the step that changes nothing (6:2 is 3:1) is no entry
    assert ups == [(NOW + 20 * DAY, "x", True, "b 100%", "b 75%, c 25%"), (NOW - DAY, "x", False, "a 100%", "b 100%")]
    assert {e.what for e in entries(c, NOW)} == {"model", "price", "upstream"}
