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
    assert shown == {"id": org, "rpm": None, "concurrency": None, "paid": True, "credit_limit_micro_pln": 2_500_000,
                     "credit_limit_pln": "2.500000", "credit_limit_own": "2500000", "held_micro_pln": 0}
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
