"""The operator CLI against the running test stack, as an operator in a second shell would use it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx

from conftest import Gateway, assert_error


def gw_cli(gateway: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    s = gateway.stack.s
    env = dict(os.environ, GATEWAY_PORT=str(s.gateway_port), GATEWAY_STATE_DIR=str(s.state),
               GATEWAY_CATALOG=s.catalog, GATEWAY_METRICS_PORT=str(s.metrics_http_port))
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    return subprocess.run([sys.executable, "-m", "control.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def j(gateway: Gateway, *args: str) -> object:
    r = gw_cli(gateway, "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_operator_flow(gateway: Gateway) -> None:
    org = j(gateway, "org", "create", "acme", "--balance", "2.5")["id"]  # type: ignore[index]
    created = j(gateway, "key", "create", org)
    kid, key = created["id"], created["key"]  # type: ignore[index]
    assert key.startswith("sk-service-") and len(key) == 51
    assert j(gateway, "balance", "show", org)["balance_micro_pln"] == 2_500_000  # type: ignore[index]

    h = {"Authorization": f"Bearer {key}"}
    r = httpx.post(gateway.v1 + "/chat/completions", headers=h,
                   json={"model": "polish-pro", "messages": [{"role": "user", "content": "Cześć"}]})
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    t0 = time.monotonic()
    while True:  # shown within 2 s of the response
        rows = j(gateway, "usage", org)
        if rows:
            break
        assert time.monotonic() - t0 < 2.0
    row = rows[0]  # type: ignore[index]
    assert row["request_id"] == rid and row["alias"] == "polish-pro" and row["estimated"] is False
    text = gw_cli(gateway, "usage", org).stdout
    assert rid in text and "polish-pro" in text and "Cześć" not in text

    first = j(gateway, "balance", "credit", org, "1.000001", "--ref", "wire-42")
    again = j(gateway, "balance", "credit", org, "1.000001", "--ref", "wire-42")
    assert first["credited"] is True and again["credited"] is False  # type: ignore[index]
    assert again["balance_micro_pln"] == 2_500_000 + 1_000_001 - row["cost_micro_pln"]  # type: ignore[index]

    j(gateway, "org", "suspend", org)
    assert_error(httpx.post(gateway.v1 + "/embeddings", headers=h, json={"model": "embed", "input": "x"}),
                 403, "org_suspended", "permission_error")
    j(gateway, "org", "reactivate", org)
    assert httpx.post(gateway.v1 + "/embeddings", headers=h, json={"model": "embed", "input": "x"}).status_code == 200
    j(gateway, "key", "revoke", kid)
    assert_error(httpx.get(gateway.v1 + "/models", headers=h), 401, "invalid_api_key", "authentication_error")


def test_credit_limit_set_and_shown(gateway: Gateway) -> None:
    """`org limits --credit-limit PLN|none|default` sets the organisation's own credit limit; `balance show`
    says the one in force (text and --json), with an environment default (GATEWAY_CREDIT_LIMIT_PLN)."""
    org = j(gateway, "org", "create", "acme", "--balance", "1")["id"]  # an operator's credit: paying
    shown = j(gateway, "org", "limits", org, "--credit-limit", "2.5")
    assert shown == {"id": org, "rpm_per_key": 600, "rpm_per_key_from": "GATEWAY_DEFAULT_RPM",
                     "concurrency_per_organisation": 32,
                     "concurrency_per_organisation_from": "GATEWAY_DEFAULT_CONCURRENCY", "paid": True,
                     "credit_limit_micro_pln": 2_500_000, "credit_limit_pln": "2.500000", "credit_limit_own": "2500000",
                     "held_micro_pln": 0}
    assert gw_cli(gateway, "org", "limits", org).stdout.splitlines()[-1] == "credit limit 2.500000 PLN (its own)"
    assert gw_cli(gateway, "balance", "show", org).stdout.strip() == "1.000000 PLN; credit limit 2.500000 PLN (its own)"
    assert j(gateway, "org", "limits", org, "--credit-limit", "none")["credit_limit_micro_pln"] is None  # type: ignore[index]
    assert gw_cli(gateway, "balance", "show", org).stdout.strip() == "1.000000 PLN; no credit limit (its own)"
    j(gateway, "org", "limits", org, "--credit-limit", "default")
    s = gateway.stack.s
    env = dict(os.environ, GATEWAY_PORT=str(s.gateway_port), GATEWAY_STATE_DIR=str(s.state),
               GATEWAY_CATALOG=s.catalog, GATEWAY_CREDIT_LIMIT_PLN="0.75")
    r = subprocess.run([sys.executable, "-m", "control.cli", "balance", "show", org], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == "1.000000 PLN; credit limit 0.750000 PLN (GATEWAY_CREDIT_LIMIT_PLN)", r.stderr
    doc = j(gateway, "balance", "show", org)
    assert (doc["credit_limit_micro_pln"], doc["credit_limit_own"], doc["paid"]) == (None, "default", True)  # type: ignore[index]
    trial = j(gateway, "org", "create", "empty")["id"]  # no money at all yet: 0, whatever is set
    j(gateway, "org", "limits", trial, "--credit-limit", "none")
    assert gw_cli(gateway, "balance", "show", trial).stdout.strip() == (
        "0.000000 PLN; credit limit 0.000000 PLN (until the organisation pays: trial credit only)")
    for bad, why in (("-1", "a credit limit is 0 or more PLN"), ("lots", "not an amount in PLN: 'lots'")):
        r = gw_cli(gateway, "org", "limits", org, "--credit-limit", bad)
        assert r.returncode == 2 and why in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "control.cli", "balance", "show", org], capture_output=True, text=True,
                       env={**env, "GATEWAY_CREDIT_LIMIT_PLN": "x"}, timeout=60)
    assert (r.returncode, r.stderr) == (2, "gateway: GATEWAY_CREDIT_LIMIT_PLN: not an amount in PLN: 'x'\n")


def test_errors_are_plain_and_exit_2(gateway: Gateway) -> None:
    r = gw_cli(gateway, "balance", "show", "org_missing")
    assert r.returncode == 2 and "no such organisation" in r.stderr
    r = gw_cli(gateway, "balance", "credit", "org_missing", "1.0000001")
    assert r.returncode == 2 and "6 decimal places" in r.stderr


def test_status_reports_every_component(gateway: Gateway) -> None:
    doc = j(gateway, "status")
    assert isinstance(doc, dict)
    for name in ("envoy", "extproc", "metrics", "usage-writer", "postgres", "redis", "console", "sim:sim-a",
                 "sim:sim-b"):
        assert doc[name]["ok"] is True, (name, doc[name])


def test_org_list_show_limits_and_key_list(gateway: Gateway) -> None:
    """What an operator has, with the limits in force and where each comes from: --rpm is per key (a key's
    own limit wins), --concurrency per organisation; the defaults are GATEWAY_DEFAULT_* (this shell's)."""
    org = j(gateway, "org", "create", "listed", "--balance", "3")["id"]  # type: ignore[index]
    k1 = j(gateway, "key", "create", org)
    k2 = j(gateway, "key", "create", org)
    j(gateway, "key", "revoke", k2["id"])  # type: ignore[index]
    defaults = {"rpm_per_key": 600, "rpm_per_key_from": "GATEWAY_DEFAULT_RPM", "concurrency_per_organisation": 32,
                "concurrency_per_organisation_from": "GATEWAY_DEFAULT_CONCURRENCY"}
    credit = {"paid": True, "credit_limit_micro_pln": None, "credit_limit_pln": None, "credit_limit_own": "default",
              "held_micro_pln": 0}  # --balance is an operator's credit: paying, GATEWAY_CREDIT_LIMIT_PLN unset
    assert j(gateway, "org", "limits", org) == {"id": org, **defaults, **credit}
    text = gw_cli(gateway, "org", "limits", org)
    assert text.returncode == 0 and "null" not in text.stdout and "None" not in text.stdout
    assert text.stdout.splitlines() == ["rpm           600 per key (default, GATEWAY_DEFAULT_RPM)",
                                        "concurrency   32 per organisation (default, GATEWAY_DEFAULT_CONCURRENCY)",
                                        "no credit limit"]
    after = j(gateway, "org", "limits", org, "--rpm", "7")
    assert after == {"id": org, **defaults, **credit, "rpm_per_key": 7, "rpm_per_key_from": "organisation"}
    shown = j(gateway, "org", "show", org)
    assert shown == {"id": org, "name": "listed", "status": "active", "balance_micro_pln": 3_000_000,
                     "balance_pln": "3.000000", **after, "active_keys": 1,
                     "created_at": shown["created_at"]}  # type: ignore[index]
    assert "7 per key (the organisation's limit)" in gw_cli(gateway, "org", "show", org).stdout
    listed = {o["id"]: o for o in j(gateway, "org", "list")}  # type: ignore[union-attr]
    assert listed[org] == {k: v for k, v in shown.items() if k not in credit}  # type: ignore[union-attr]
    j(gateway, "key", "limits", k1["id"], "--rpm", "3")  # type: ignore[index]
    keys = j(gateway, "key", "list", org)
    assert [(k["id"], k["rpm"], k["rpm_in_force"], k["revoked_at"] is None) for k in keys] == [  # type: ignore[union-attr]
        (k1["id"], 3, 3, True), (k2["id"], None, 7, False)]  # type: ignore[index]
    assert all(k["prefix"] == k1["key"][:15] or k["prefix"] == k2["key"][:15] for k in keys)  # type: ignore[union-attr,index]
    text = gw_cli(gateway, "key", "list", org).stdout
    assert k1["key"] not in text and k2["key"] not in text and "revoked" in text  # type: ignore[index]
    assert "WHOLE organisation" in gw_cli(gateway, "org", "limits", "--help").stdout
    assert "EACH key" in gw_cli(gateway, "org", "limits", "--help").stdout
    missing = gw_cli(gateway, "org", "show", "org_nope")
    assert (missing.returncode, missing.stdout, missing.stderr) == (2, "", "gateway: no such organisation: org_nope\n")
