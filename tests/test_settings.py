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
from core.settings import GatewaySettings
from core.settings_base import SettingsError, SharedSettings
from core.usage_writer_settings import WriterSettings

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
    assert len(names) == len(set(names)) == len(ENV_VARS) == 73


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


@pytest.mark.parametrize("var,raw,line", [
    ("GATEWAY_DEV", "ture", "GATEWAY_DEV must be one of 1/0/true/false/yes/no, got 'ture'"),
    ("GATEWAY_RUN_SIM", "2", "GATEWAY_RUN_SIM must be one of 1/0/true/false/yes/no, got '2'"),
    ("GATEWAY_PORT", "abc", "GATEWAY_PORT must be an integer 1..65535, got 'abc'"),
    ("GATEWAY_PORT", "0", "GATEWAY_PORT must be an integer 1..65535, got '0'"),
    ("GATEWAY_PORT", "70000", "GATEWAY_PORT must be an integer 1..65535, got '70000'"),
    ("GATEWAY_CONSOLE_PORT", "-1", "GATEWAY_CONSOLE_PORT must be an integer 0..65535, got '-1'"),
    ("GATEWAY_PG_PORT", "5432.0", "GATEWAY_PG_PORT must be an integer 0..65535, got '5432.0'"),
    ("GATEWAY_DEFAULT_RPM", "many", "GATEWAY_DEFAULT_RPM must be an integer 0 or more, got 'many'"),
    ("GATEWAY_EXTPROC_WORKERS", "0", "GATEWAY_EXTPROC_WORKERS must be an integer 1..64, got '0'"),
    ("GATEWAY_TOTAL_TIMEOUT_S", "soon", "GATEWAY_TOTAL_TIMEOUT_S must be a number (such as 2.5) 0 or more, got 'soon'"),
    ("GATEWAY_IDLE_TIMEOUT_S", "nan", "GATEWAY_IDLE_TIMEOUT_S must be a number (such as 2.5) 0 or more, got 'nan'"),
    ("GATEWAY_IDLE_TIMEOUT_S", "inf", "GATEWAY_IDLE_TIMEOUT_S must be a number (such as 2.5) 0 or more, got 'inf'"),
    ("GATEWAY_DRAIN_GRACE_S", "-5", "GATEWAY_DRAIN_GRACE_S must be a number (such as 2.5) 0 or more, got '-5'"),
    ("GATEWAY_EVENT_LOOP", "trio", "GATEWAY_EVENT_LOOP must be one of asyncio/uvloop, got 'trio'"),
])
def test_a_bad_value_is_refused_in_one_line_naming_the_variable_and_its_form(
        monkeypatch: pytest.MonkeyPatch, var: str, raw: str, line: str) -> None:
    monkeypatch.setenv(var, raw)
    with pytest.raises(SettingsError) as e:
        Settings.from_env()
    assert str(e.value) == line


@pytest.mark.parametrize("raw,on", [("1", True), ("true", True), ("YES", True), ("on", True), (" True ", True),
                                    ("0", False), ("false", False), ("No", False), ("off", False), ("", False)])
def test_a_boolean_setting_takes_the_usual_words(monkeypatch: pytest.MonkeyPatch, raw: str, on: bool) -> None:
    monkeypatch.setenv("GATEWAY_DEV", raw)
    monkeypatch.setenv("GATEWAY_RUN_SIM", raw)
    s = Settings.from_env()
    assert (s.dev, s.run_sim) == (on, on)


def test_good_values_are_read_as_their_type(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, raw in (("GATEWAY_PORT", "65535"), ("GATEWAY_CONSOLE_PORT", "0"), ("GATEWAY_EXTPROC_WORKERS", "64"),
                     ("GATEWAY_TOTAL_TIMEOUT_S", "2.5"), ("GATEWAY_EVENT_LOOP", "uvloop")):
        monkeypatch.setenv(var, raw)
    s = Settings.from_env()
    assert (s.gateway_port, s.console_port, s.extproc_workers, s.total_timeout_s, s.event_loop) == (
        65535, 0, 64, 2.5, "uvloop")


def test_every_setting_says_its_form() -> None:
    """Each variable's refusal can say what it takes: no setting is of a type the validator does not know."""
    from core.settings_base import form
    forms = {f.metadata["env"]: form(f) for f in fields(Settings)}
    assert len(forms) == len(ENV_VARS)
    assert all(f.startswith(("one of ", "an integer ", "a number ", "a text")) for f in forms.values()), forms
    assert forms["GATEWAY_PORT"] == "an integer 1..65535" and forms["GATEWAY_SMTP_PORT"] == "an integer 0..65535"


@pytest.mark.parametrize("env", [{"GATEWAY_PORT": "abc"}, {"GATEWAY_DEV": "ture"}])
def test_gateway_up_stops_with_that_line(tmp_path: Path, env: dict[str, str]) -> None:
    """`gateway up` (and `make run`, which runs it): exit 2, the one line, no traceback, nothing started."""
    var, raw = next(iter(env.items()))
    full = {**os.environ, "GATEWAY_STATE_DIR": str(tmp_path / "state"), **env}
    r = subprocess.run([sys.executable, "-m", "control.cli", "up"], env=full, capture_output=True, text=True,
                       timeout=60, cwd=CONFIGURATION.parent.parent)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr.startswith(f"gateway: {var} must be ") and r.stderr.endswith(f", got {raw!r}\n")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "state").exists()


def test_the_ext_proc_does_not_start_with_an_invalid_credit_limit(tmp_path: Path) -> None:
    """Refused at start, in one line naming the variable, before anything is opened."""
    env = {**os.environ, "GATEWAY_CREDIT_LIMIT_PLN": "lots", "GATEWAY_STATE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "extproc"], env=env, capture_output=True, text=True, timeout=60,
                       cwd=CONFIGURATION.parent.parent)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = [json.loads(line) for line in (r.stdout + r.stderr).splitlines() if line.startswith("{")]
    assert [x["msg"] for x in lines if x.get("level") == "error"] == [
        "GATEWAY_CREDIT_LIMIT_PLN: not an amount in PLN: 'lots'"], r.stderr[-2000:]


def test_a_stacks_default_ports_come_from_the_one_table() -> None:
    """core.settings_base.PORT_OFFSETS gives every default port; no other file of the product writes an
    offset from GATEWAY_PORT as a number."""
    from control.ports import planned
    from core.settings_base import PORT_OFFSETS
    s = Settings(gateway_port=20000, dev=True)
    got = {u.what: u.port for u in planned(s, None)}
    assert got == {"Envoy's listener": 20000, "Envoy's admin": 20011, "the console": 20001,
                   "the usage writer's metrics": 20014, "extproc's gRPC": 20010, "extproc's metrics": 21384,
                   "the embedded PostgreSQL": 20012, "the embedded Redis": 20013, "the development mail capture": 20018}
    assert {n: s.port_of(n) - 20000 for n in PORT_OFFSETS} == PORT_OFFSETS
    moved = Settings(gateway_port=20000, console_port=30001, pg_port=30012)
    assert (moved.console_http_port, moved.port_of("pg_port"), moved.port_of("redis_port")) == (30001, 30012, 20013)
    root = CONFIGURATION.parent.parent
    written = re.compile(r"(gateway_port|GATEWAY_PORT) \+ \d")
    found = [f"{f.relative_to(root)}: {m.group(0)}" for top in ("extproc", "control", "sim")
             for f in (root / top).rglob("*.py") for m in written.finditer(f.read_text())]
    assert found == []


def test_the_configuration_page_gives_the_tables_default_ports() -> None:
    from core.settings_base import PORT_OFFSETS
    text = CONFIGURATION.read_text(encoding="utf-8")
    table = text.split("## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip().replace("`", ""): line.split("|")[2].strip() for line in table.splitlines()
            if line.startswith("| `")}
    checked = [var for name, var in ENV_VARS.items() if name in PORT_OFFSETS and var in rows]
    assert len(checked) == 5, checked  # the console's, the ext_proc's, the admin's and the two metrics ports
    for name, var in ENV_VARS.items():
        if var in checked:
            assert rows[var].startswith(f"port + {PORT_OFFSETS[name]}"), (var, rows[var])
    both = rows["GATEWAY_PG_PORT / GATEWAY_REDIS_PORT"]
    assert both == f"port + {PORT_OFFSETS['pg_port']} / + {PORT_OFFSETS['redis_port']}"
