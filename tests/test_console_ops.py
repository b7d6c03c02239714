"""The console as an operator runs it: outside development mode a start that would send e-mail without
TLS, build links on an http:// address or fail on its first payment stops at once with one line; and its
logs are JSON lines (core/logs.py's format) where every line of a request carries the request id the
console mints and returns as X-Request-Id."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from dataclasses import replace
from typing import Any

import httpx
import pytest

from conftest import Gateway, free_base, wait_for
from control.console.launch import refusal
from control.console.settings import ConsoleSettings

PRODUCTION = ConsoleSettings(dev=False, gateway_host="0.0.0.0", console_url="https://console.example.com",
                             smtp_host="smtp.example.com", smtp_tls="starttls", payment_provider="p24",
                             p24_merchant_id=1, p24_crc="crc", p24_api_key="key")


def test_a_complete_production_configuration_starts() -> None:
    assert refusal(PRODUCTION) is None
    assert refusal(replace(PRODUCTION, smtp_tls="tls")) is None
    # plain SMTP to a relay on this host's loopback: the mail leaves the host through the relay
    assert refusal(replace(PRODUCTION, smtp_tls="none", smtp_host="127.0.0.1")) is None


@pytest.mark.parametrize("change,line", [
    ({"console_url": "http://console.example.com"},
     "GATEWAY_CONSOLE_URL must be the console's public https:// address outside development mode "
     "(GATEWAY_DEV=1); not http://…"),
    ({"console_url": ""},
     "GATEWAY_CONSOLE_URL must be the console's public https:// address outside development mode "
     "(GATEWAY_DEV=1); it is not set"),
    ({"smtp_tls": "none"},
     "GATEWAY_SMTP_TLS=none sends mail to smtp.example.com without TLS: use starttls or tls (plain SMTP only to "
     "a relay on this host's loopback, or in development mode, GATEWAY_DEV=1)"),
    ({"smtp_tls": "ssl"}, "GATEWAY_SMTP_TLS must be starttls, tls or none, not 'ssl'"),
    ({"p24_crc": ""}, "GATEWAY_PAYMENT_PROVIDER=p24 needs GATEWAY_P24_CRC (Przelewy24's merchant id, CRC and API key)"),
    ({"p24_merchant_id": 0, "p24_api_key": ""},
     "GATEWAY_PAYMENT_PROVIDER=p24 needs GATEWAY_P24_MERCHANT_ID, GATEWAY_P24_API_KEY (Przelewy24's merchant id, "
     "CRC and API key)"),
])
def test_each_production_gap_is_one_line(change: dict[str, Any], line: str) -> None:
    assert refusal(replace(PRODUCTION, **change)) == line


def test_development_mode_still_needs_a_whole_p24_account_when_it_uses_p24() -> None:
    dev = replace(PRODUCTION, dev=True, console_url="http://127.0.0.1:8081", smtp_tls="none")
    assert refusal(dev) is None
    assert refusal(replace(dev, p24_api_key="")) == "GATEWAY_PAYMENT_PROVIDER=p24 needs GATEWAY_P24_API_KEY"


@pytest.mark.parametrize("env,says", [
    ({"GATEWAY_P24_API_KEY": ""}, "console: GATEWAY_PAYMENT_PROVIDER=p24 needs GATEWAY_P24_API_KEY"),
    ({"GATEWAY_CONSOLE_URL": "http://console.example.com"}, "console: GATEWAY_CONSOLE_URL must be"),
    ({"GATEWAY_SMTP_TLS": "none"}, "console: GATEWAY_SMTP_TLS=none sends mail to smtp.example.com"),
])
def test_the_console_process_refuses_in_one_line(env: dict[str, str], says: str, gateway: Gateway) -> None:
    """`python -m control.console` as a deployment runs it: exits non-zero at once, one line on stderr, no
    traceback (a missing P24 key used to end in one from the payment provider's constructor)."""
    port = str(free_base(span=1))
    full = {**gateway.stack.child_env(), "GATEWAY_DEV": "0", "GATEWAY_HOST": "0.0.0.0", "GATEWAY_CONSOLE_PORT": port,
            "GATEWAY_CONSOLE_URL": "https://console.example.com", "GATEWAY_SMTP_HOST": "smtp.example.com",
            "GATEWAY_SMTP_TLS": "starttls", "GATEWAY_PAYMENT_PROVIDER": "p24", "GATEWAY_P24_MERCHANT_ID": "1",
            "GATEWAY_P24_CRC": "crc", "GATEWAY_P24_API_KEY": "key", **env}
    r = subprocess.run([sys.executable, "-m", "control.console"], env=full, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith(says), r.stderr
    with contextlib.suppress(httpx.HTTPError):
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code != 200


def console_lines(gateway: Gateway) -> list[dict[str, Any]]:
    """Every line of the console's log so far, each parsed as JSON (a plain-text line fails here)."""
    text = (gateway.stack.logs / "console.log").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_console_logs_are_json_lines_with_the_request_id(gateway: Gateway) -> None:
    r = httpx.get(gateway.console + "/login", timeout=10)
    assert r.status_code == 200
    rid = r.headers["X-Request-Id"]
    assert str(uuid.UUID(rid)) == rid
    spoofed = httpx.get(gateway.console + "/login", headers={"X-Request-Id": "chosen-by-the-client"}, timeout=10)
    assert spoofed.headers["X-Request-Id"] not in (rid, "chosen-by-the-client")  # minted for each request
    # a request whose handler logs: a payment notification the sandbox provider refuses (a bad signature)
    bad = httpx.post(gateway.console + "/payments/notify/sandbox", content=b'{"payment_id": "p", "sign": "x"}',
                     headers={"Content-Type": "application/json"}, timeout=10)
    assert bad.status_code == 400
    bad_rid = bad.headers["X-Request-Id"]

    def mine() -> list[dict[str, Any]]:
        return [ln for ln in console_lines(gateway) if ln.get("request_id") in (rid, bad_rid)]

    wait_for(lambda: len(mine()) >= 3, timeout=10, describe=lambda: f"console log lines: {mine()}")
    by = {(ln["request_id"], ln["logger"]): ln for ln in mine()}
    access = by[(rid, "aiohttp.access")]
    assert access["msg"] == "GET /login" and access["status"] == 200 and access["level"] == "info"
    assert isinstance(access["duration_ms"], float) and access["time"].endswith("Z")
    assert by[(bad_rid, "aiohttp.access")]["msg"] == "POST /payments/notify/{provider}"
    assert by[(bad_rid, "aiohttp.access")]["status"] == 400
    refused = by[(bad_rid, "console.billing")]
    assert refused["level"] == "warning" and refused["msg"].startswith("notification refused")
    assert all("chosen-by-the-client" not in json.dumps(ln) for ln in console_lines(gateway))
