"""Settings split per process: each process reads its own settings class, the launcher's
composed ``control.settings.Settings`` hands each of them every value it holds, every environment variable
belongs to one setting, and docs/configuration.md's table names exactly the variables the code reads."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest

from control.console.settings import ConsoleSettings
from control.settings import ENV_VARS, Settings
from extproc.settings import GatewaySettings
from extproc.settings_base import SettingsError, SharedSettings
from extproc.usage_writer_settings import WriterSettings

CONFIGURATION = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
# read outside the settings classes: the log level, by extproc.process before any settings are read
OUTSIDE = {"GATEWAY_LOG_LEVEL"}


def _documented_variables() -> set[str]:
    text = CONFIGURATION.read_text(encoding="utf-8")
    table = text.split("## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", cell)}


def test_the_configuration_table_names_exactly_the_variables_read() -> None:
    assert _documented_variables() == set(ENV_VARS.values()) | OUTSIDE


def test_each_variable_is_one_setting() -> None:
    names = [f.metadata["env"] for f in fields(Settings)]
    assert len(names) == len(set(names)) == len(ENV_VARS) == 63


def test_each_process_reads_only_its_own_and_the_shared_settings() -> None:
    shared = set(SharedSettings.env_vars().values())
    console = set(ConsoleSettings.env_vars().values()) - shared
    gateway = set(GatewaySettings.env_vars().values()) - shared
    writer = set(WriterSettings.env_vars().values()) - shared - gateway
    assert {"GATEWAY_SMTP_HOST", "GATEWAY_P24_CRC", "GATEWAY_SELLER_NIP", "GATEWAY_CONSOLE_SECRET"} <= console
    assert console.isdisjoint(gateway | writer)
    assert writer == {"GATEWAY_WRITER_METRICS_PORT"}
    assert {"GATEWAY_PG_PORT", "GATEWAY_REDIS_PORT", "GATEWAY_RUN_SIM", "GATEWAY_EXTPROC_WORKERS"}.isdisjoint(
        console | gateway | writer | shared)
    assert {"DATABASE_URL", "REDIS_URL", "GATEWAY_STATE_DIR", "GATEWAY_DEV"} <= shared


def test_from_env_parses_each_type_and_overrides_win(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"GATEWAY_PORT": "9100", "GATEWAY_DEV": "yes", "GATEWAY_P24_SANDBOX": "0",
                        "GATEWAY_TOTAL_TIMEOUT_S": "12.5", "GATEWAY_MAIL_FROM": "m@example.com",
                        "GATEWAY_TRIAL_BALANCE_PLN": "7"}.items():
        monkeypatch.setenv(name, value)
    s = Settings.from_env(smtp_port=2525)
    assert (s.gateway_port, s.dev, s.p24_sandbox, s.total_timeout_s) == (9100, True, False, 12.5)
    assert (s.mail_from, s.trial_balance_pln, s.smtp_port) == ("m@example.com", "7", 2525)
    assert (s.grpc_port, s.envoy_admin_port, s.console_http_port, s.writer_metrics_http_port,
            s.metrics_http_port, s.smtp_capture_port) == (9110, 9111, 9101, 9114, 10484, 9118)
    assert Settings.from_env() == replace(s, smtp_port=0)


def test_each_process_reads_back_what_the_launcher_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Stack.child_env`` is ``Settings.as_env``: each process's class, read from it, holds the same values."""
    composed = Settings(gateway_port=9200, dev=True, smtp_host="mail.example", p24_merchant_id=42, p24_sandbox=False,
                        max_connections=77, writer_metrics_port=9999, low_balance_check_s=1.5, run_sim=False)
    for name, value in composed.as_env().items():
        monkeypatch.setenv(name, value)
    assert Settings.from_env() == composed
    for cls in (GatewaySettings, WriterSettings, ConsoleSettings):
        read = cls.from_env()
        assert {f.name: getattr(read, f.name) for f in fields(cls)} == {
            f.name: getattr(composed, f.name) for f in fields(cls)}, cls.__name__


def test_the_credit_limit_is_read_in_micro_pln_and_an_invalid_one_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().credit_limit_micro is None  # unset: no limit
    for raw, micro in (("0", 0), ("2.5", 2_500_000), (" 0.000001 ", 1)):
        monkeypatch.setenv("GATEWAY_CREDIT_LIMIT_PLN", raw)
        assert GatewaySettings.from_env().credit_limit_micro == micro
        assert ConsoleSettings.from_env().credit_limit_micro == micro  # the console shows it on Billing
    for raw, why in (("abc", "not an amount in PLN: 'abc'"), ("-1", "must be 0 or more PLN, not '-1'"),
                     ("0.0000001", "at most 6 decimal places"), ("inf", "not an amount in PLN: 'inf'")):
        monkeypatch.setenv("GATEWAY_CREDIT_LIMIT_PLN", raw)
        with pytest.raises(SettingsError) as e:
            Settings.from_env()
        assert str(e.value).startswith("GATEWAY_CREDIT_LIMIT_PLN") and why in str(e.value), str(e.value)


def test_a_value_that_is_not_of_its_type_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_DEFAULT_RPM", "many")
    with pytest.raises(SettingsError, match="^GATEWAY_DEFAULT_RPM must be an integer, not 'many'$"):
        Settings.from_env()
    monkeypatch.setenv("GATEWAY_DEFAULT_RPM", "5")
    monkeypatch.setenv("GATEWAY_TOTAL_TIMEOUT_S", "soon")
    with pytest.raises(SettingsError, match="^GATEWAY_TOTAL_TIMEOUT_S must be a number, not 'soon'$"):
        Settings.from_env()


def test_the_ext_proc_does_not_start_with_an_invalid_credit_limit(tmp_path: Path) -> None:
    """Refused at start, in one line naming the variable, before anything is opened."""
    env = {**os.environ, "GATEWAY_CREDIT_LIMIT_PLN": "lots", "GATEWAY_STATE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "extproc"], env=env, capture_output=True, text=True, timeout=60,
                       cwd=CONFIGURATION.parent.parent)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = [json.loads(line) for line in (r.stdout + r.stderr).splitlines() if line.startswith("{")]
    assert [x["msg"] for x in lines if x.get("level") == "error"] == [
        "GATEWAY_CREDIT_LIMIT_PLN: not an amount in PLN: 'lots'"], r.stderr[-2000:]
