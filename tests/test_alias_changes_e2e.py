"""The alias change policy end to end on a stack of its own (docs/configuration.md, "Changing the model behind an
alias"): ``gateway catalog apply`` refuses a model change under 14 days ahead, forces it with --force (a
stderr line and a PostgreSQL record), accepts one 14 days ahead; requests go to the upstream model of
the step in force at their start, the reply's ``model`` always the alias; the ext_proc refuses a
too-soon hand edit; the changelog shows the changes and every owner gets one mail per change, in the
owner's language."""
from __future__ import annotations

import copy
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from conftest import Gateway, running_stack, wait_for
from core.alias_policy import NOTICE_S, when_text
from test_console_support import ConsoleClient, mails, signed_up


@pytest.fixture(scope="module")
def stack() -> Iterator[Gateway]:
    with running_stack("gw-alias-", default_rpm=100000, default_concurrency=1000) as gw:
        yield gw


def cli(gw: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    s = gw.stack.s
    env = dict(os.environ, GATEWAY_PORT=str(s.gateway_port), GATEWAY_STATE_DIR=str(s.state),
               GATEWAY_CATALOG=s.catalog)
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    return subprocess.run([sys.executable, "-m", "control.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()


def with_change(gw: Gateway, alias: str, effective: float, upstreams: list[dict[str, Any]]) -> Path:
    """The catalog in force with one more upstream change of ``alias``, as a file beside it."""
    doc = yaml.safe_load(Path(gw.stack.s.catalog).read_text())
    doc = copy.deepcopy(doc)
    doc["aliases"][alias].setdefault("upstream_changes", []).append({"effective": iso(effective), "upstreams": upstreams})
    out = Path(gw.stack.s.catalog).with_name(f"new-{alias}-{int(effective)}.yaml")
    out.write_text(yaml.safe_dump(doc))
    return out


def chat(gw: Gateway, key: str, alias: str) -> tuple[str, str]:
    """(the reply's model, the upstream model the simulator saw) of one request."""
    r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": alias, "messages": [{"role": "user", "content": "Dzień dobry"}]})
    assert r.status_code == 200, r.text
    seen = gw.sim_record(r.headers["x-request-id"])
    assert seen is not None
    return str(r.json()["model"]), str(seen["model"])


def changes_of(gw: Gateway, alias: str) -> list[dict[str, Any]]:
    return gw.sql("SELECT m.alias, extract(epoch FROM m.effective)::bigint AS effective, m.before, m.after,"
                  " m.forced, a.forced AS catalog_forced FROM model_changes m"
                  " JOIN catalog_applies a ON a.sha256 = m.catalog_sha256 WHERE m.alias = $1 ORDER BY m.id", alias)


def reloaded(gw: Gateway, since: int) -> bool:
    return "catalog reloaded" in (gw.stack.logs / "extproc.log").read_text()[since:]


def test_too_soon_refused_forced_logged_and_recorded_and_routed_by_the_step_in_force(stack: Gateway) -> None:
    _, _, key = stack.new_org(100_000_000)
    in_force = Path(stack.stack.s.catalog).read_text()
    assert chat(stack, key, "polish-fast") == ("polish-fast", "up-fast")

    # 5 days ahead: refused, one line naming the alias, the date and the earliest allowed; nothing applied
    t0 = time.time()
    soon = with_change(stack, "polish-fast", t0 + 5 * 86400, [{"model": "up-pro"}])
    r = cli(stack, "catalog", "apply", str(soon))
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith(f"gateway: refused: alias polish-fast: model change effective "
                               f"{when_text(int(t0 + 5 * 86400))} (up-fast 100% -> up-pro 100%) is announced less"
                               " than 14 days ahead; the earliest allowed is "), lines[0]
    earliest = dt.datetime.fromisoformat(lines[0].rsplit(" ", 1)[1]).timestamp()
    assert t0 + NOTICE_S - 60 <= earliest <= time.time() + NOTICE_S
    assert lines[1] == "gateway: nothing applied (--force applies it anyway, logged and recorded)"
    assert Path(stack.stack.s.catalog).read_text() == in_force
    assert changes_of(stack, "polish-fast") == []

    # forced, 6 s ahead: a stderr line, recorded as forced, the file replaced, the ext_proc takes it
    log_at = len((stack.stack.logs / "extproc.log").read_text())
    switch = time.time() + 6
    forced = with_change(stack, "polish-fast", switch, [{"model": "up-pro"}])
    r = cli(stack, "--json", "catalog", "apply", str(forced), "--force")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("gateway: forced: alias polish-fast: model change effective ") \
        and "(up-fast 100% -> up-pro 100%) is announced less than 14 days ahead" in r.stderr \
        and len(r.stderr.splitlines()) == 1, r.stderr
    assert json.loads(r.stdout) == {"applied": True, "model_changes": [
        {"alias": "polish-fast", "effective": int(switch), "before": "up-fast 100%", "after": "up-pro 100%"}]}
    assert Path(stack.stack.s.catalog).read_bytes() == forced.read_bytes()
    assert changes_of(stack, "polish-fast") == [
        {"alias": "polish-fast", "effective": int(switch), "before": "up-fast 100%", "after": "up-pro 100%",
         "forced": True, "catalog_forced": True}]
    wait_for(lambda: reloaded(stack, log_at), timeout=10)
    assert time.time() < switch, "the reload came after the step: the test proves nothing"
    assert chat(stack, key, "polish-fast") == ("polish-fast", "up-fast")  # before the step: the old model
    time.sleep(max(switch - time.time(), 0) + 0.1)
    for _ in range(3):  # from the step on: the new one, the reply's model still the alias
        assert chat(stack, key, "polish-fast") == ("polish-fast", "up-pro")


def test_the_ext_proc_refuses_a_too_soon_hand_edit_and_keeps_the_catalog_in_force(stack: Gateway) -> None:
    _, _, key = stack.new_org(100_000_000)
    path = Path(stack.stack.s.catalog)
    in_force = path.read_text()
    log = stack.stack.logs / "extproc.log"
    before = len(log.read_text())
    edited = yaml.safe_load(in_force)
    edited["aliases"]["advanced"]["upstreams"] = [{"model": "up-adv", "share": 80}, {"model": "up-pro", "share": 20}]
    try:
        path.write_text(yaml.safe_dump(edited))
        refusal = wait_for(lambda: [line for line in log.read_text()[before:].splitlines()
                                    if "catalog not reloaded" in line], timeout=10)
        assert len(refusal) == 1 and "alias advanced: model change effective " in refusal[0] \
            and "(up-adv 100% -> up-adv 80%, up-pro 20%) is announced less than 14 days ahead; the earliest" \
            " allowed is " in refusal[0] and "gateway catalog apply --force" in refusal[0], refusal
        assert {chat(stack, key, "advanced") for _ in range(20)} == {("advanced", "up-adv")}
    finally:
        path.write_text(in_force)


def test_14_days_ahead_accepted_shown_on_the_changelog_and_mailed_once_to_each_owner(stack: Gateway) -> None:
    c_en, en, _ = signed_up(stack, lang="en")
    c_pl, pl, _ = signed_up(stack, "Firma sp. z o.o.", lang="pl")
    c_en.close()
    c_pl.close()
    effective = time.time() + NOTICE_S + 120
    new = with_change(stack, "advanced", effective, [{"model": "up-adv", "share": 3}, {"model": "up-pro", "share": 1}])
    r = cli(stack, "catalog", "apply", str(new))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.splitlines() == [f"announced: advanced from {when_text(int(effective))}: up-adv 100% -> "
                                     "up-adv 75%, up-pro 25%", f"applied: {stack.stack.s.catalog}"]
    assert changes_of(stack, "advanced") == [
        {"alias": "advanced", "effective": int(effective), "before": "up-adv 100%", "after": "up-adv 75%, up-pro 25%",
         "forced": False, "catalog_forced": False}]

    page = ConsoleClient(stack.console, lang="en").get("/changelog")
    assert page.status_code == 200
    rows = [r for r in page.text.split("<tr")[1:] if '<td data-label="Model">advanced</td>' in r and "model behind" in r]
    assert len(rows) == 1 and ('<td data-label="Change">model behind the alias: up-adv 100% &rarr; up-adv 75%, '
                               'up-pro 25%</td>') in rows[0] \
        and 'class="tag">scheduled<' in rows[0], rows

    subject = {en: "Model change behind advanced from ", pl: "Zmiana modelu za advanced od "}
    got = {who: wait_for(lambda w=who: [m for m in mails(stack, w) if m["subject"].startswith(subject[w])], timeout=10)  # type: ignore[misc]
           for who in (en, pl)}
    assert "requests to the model \"advanced\" go to: up-adv 75%, up-pro 25% (until then: up-adv 100%)" \
        in got[en][0]["body"] and stack.console + "/changelog" in got[en][0]["body"]
    assert "zapytania do modelu „advanced” trafiają do: up-adv 75%, up-pro 25% (do tego czasu: up-adv 100%)" \
        in got[pl][0]["body"]
    # the next change is mailed too, and the first one never again
    later = with_change(stack, "polish-pro", time.time() + 30 * 86400, [{"model": "up-adv"}])
    assert cli(stack, "catalog", "apply", str(later)).returncode == 0
    for who in (en, pl):
        wait_for(lambda w=who: any("polish-pro" in m["subject"] for m in mails(stack, w)), timeout=10)  # type: ignore[misc]
        assert len([m for m in mails(stack, who) if m["subject"].startswith(subject[who])]) == 1
    # the same catalog applied again announces nothing
    r = cli(stack, "--json", "catalog", "apply", str(later))
    assert r.returncode == 0 and json.loads(r.stdout) == {"applied": True, "model_changes": []}
