"""Every `gateway` command with the stack stopped, with no stack at all, with a URL it cannot use and
with credentials a server refuses prints one line (what failed, what to do) and exits non-zero: no
traceback, no password."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import yaml

from conftest import Gateway, free_base, make_catalog, running_stack

COMMANDS = [
    ["org", "create", "acme", "--balance", "1"], ["org", "suspend", "org_x"], ["org", "reactivate", "org_x"],
    ["org", "limits", "org_x", "--rpm", "5"], ["key", "create", "org_x"], ["key", "revoke", "key_x"],
    ["key", "limits", "key_x", "--rpm", "5"], ["balance", "credit", "org_x", "1"], ["balance", "show", "org_x"],
    ["usage", "org_x"], ["status"], ["--json", "usage", "org_x"],
    ["org", "list"], ["org", "show", "org_x"], ["org", "limits", "org_x"], ["key", "list", "org_x"],
    ["invoices", "list", "org_x"],
]
SECRET = "s3cret-Wrong"


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_stack("gw-clierr-") as g:
        yield g


Result = tuple[list[str], int, str, str]


def run_all(gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            **env_over: str) -> list[Result]:
    """Every command through the CLI's entry point, in this process (a traceback would fail the test)."""
    from control import cli
    s = gw.stack.s
    env = {"GATEWAY_PORT": str(s.gateway_port), "GATEWAY_STATE_DIR": str(s.state), "GATEWAY_CATALOG": s.catalog,
           "GATEWAY_METRICS_PORT": str(s.metrics_http_port), **env_over}
    out = []
    with monkeypatch.context() as m:
        m.delenv("DATABASE_URL", raising=False)
        m.delenv("REDIS_URL", raising=False)
        for k, v in env.items():
            m.setenv(k, v)
        for c in COMMANDS:
            code = cli.main(c)
            o, e = capsys.readouterr()
            out.append((c, code, o, e))
    return out


def check(results: list[Result], *says: str | tuple[str, ...]) -> None:
    """Each command: non-zero, one line on stderr holding one of ``says`` (a tuple: all of its parts)."""
    for c, code, out, err in results:
        assert code != 0, (c, out)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gateway: "), (c, err)
        assert any(all(part in lines[0] for part in ((w,) if isinstance(w, str) else w)) for w in says), \
            (c, lines[0])
        assert SECRET not in err + out, c
        assert out == "" or c == ["status"], (c, out)  # status's table says which component is down


def test_wrong_postgres_credentials(gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    port = gw.stack.pg_port
    check(run_all(gw, monkeypatch, capsys, DATABASE_URL=f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/postgres",
                  REDIS_URL=gw.stack.redis_url),
          ("PostgreSQL refused DATABASE_URL's credentials: ", f"(at postgresql://postgres:***@127.0.0.1:{port}/postgres)"),
          )


def test_wrong_redis_credentials(gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    port = gw.stack.redis_port
    check(run_all(gw, monkeypatch, capsys, DATABASE_URL=gw.stack.database_url, REDIS_URL=f"redis://:{SECRET}@127.0.0.1:{port}/0"),
          ("Redis refused REDIS_URL's credentials: ", f"(at redis://:***@127.0.0.1:{port}/0)"))


def test_urls_that_cannot_be_used(gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    check(run_all(gw, monkeypatch, capsys, DATABASE_URL=f"mysql://root:{SECRET}@127.0.0.1:3306/x", REDIS_URL=gw.stack.redis_url),
          "DATABASE_URL mysql://root:***@127.0.0.1:3306/x cannot be used")
    check(run_all(gw, monkeypatch, capsys, DATABASE_URL=gw.stack.database_url, REDIS_URL=f"http://:{SECRET}@127.0.0.1:1/0"),
          "REDIS_URL http://:***@127.0.0.1:1/0 must start with redis://")


@pytest.mark.parametrize("url,says", [
    # a password with an unescaped "#": asyncpg reads "s3cr" as the port and int() quotes it
    (f"postgresql://postgres:{SECRET[:4]}#{SECRET[4:]}@127.0.0.1:5432/postgres",
     "DATABASE_URL postgresql://postgres:***@127.0.0.1:5432/postgres cannot be used: ValueError; a reserved "
     "character in the password (@ : / ? # % or a space) must be percent-encoded"),
    (f"postgres//postgres:{SECRET}@127.0.0.1/postgres",  # the scheme's colon forgotten
     "DATABASE_URL postgres//postgres:***@127.0.0.1/postgres cannot be used: invalid DSN"),
    (f"postgresql://postgres:{SECRET}@127.0.0.1:5432/postgres?sslmode=bogus",
     "DATABASE_URL postgresql://postgres:***@127.0.0.1:5432/postgres?sslmode=bogus cannot be used: `sslmode`"),
])
def test_malformed_database_urls_never_print_the_password(url: str, says: str, gw: Gateway,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """No piece of the password either (SECRET[:4] is the one int() would have quoted); `gateway
    migrate` and `gateway up` say the same in one line."""
    check(run_all(gw, monkeypatch, capsys, DATABASE_URL=url, REDIS_URL=gw.stack.redis_url), says)
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": gw.stack.redis_url, "GATEWAY_DEV": "1",
           "GATEWAY_PORT": str(free_base()), "GATEWAY_STATE_DIR": tempfile.mkdtemp(prefix="gw-badurl-")}
    env["GATEWAY_METRICS_PORT"] = str(int(env["GATEWAY_PORT"]) + 19)
    for argv in (["migrate", "--wait", "1"], ["up"]):
        r = subprocess.run([sys.executable, "-m", "control.cli", *argv], env=env, capture_output=True, text=True,
                           timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and says in lines[0], (argv, r.stderr)
        assert SECRET[:4] not in r.stderr + r.stdout and "Traceback" not in r.stderr, argv


def test_no_stack_ever_started(gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    empty = Path(tempfile.mkdtemp(prefix="gw-nostack-"))
    base = free_base()
    (empty / "catalog.yaml").write_text(yaml.safe_dump(make_catalog(base)))
    check(run_all(gw, monkeypatch, capsys, GATEWAY_STATE_DIR=str(empty / "state"), GATEWAY_PORT=str(base),
                  GATEWAY_METRICS_PORT=str(base + 19), GATEWAY_CATALOG=str(empty / "catalog.yaml")),
          f"no running stack found in {empty / 'state'} (start it with 'gateway up')", "is not running")


def test_stack_stopped(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A stack of its own (the order of the tests is shuffled), stopped as Ctrl-C on `gateway up` does;
    its stack.json stays."""
    with running_stack("gw-clistop-") as gw:
        _stopped(gw, monkeypatch, capsys)


def _stopped(gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    gw.stack.stop()
    assert (gw.stack.state / "stack.json").exists()
    check(run_all(gw, monkeypatch, capsys), "cannot reach PostgreSQL at postgresql://postgres:***@",
          "is not running (no component answers); start it with 'gateway up'")
    # and as the operator runs it: the process exits non-zero with that one line
    s = gw.stack.s
    env = dict(os.environ, GATEWAY_PORT=str(s.gateway_port), GATEWAY_STATE_DIR=str(s.state),
               GATEWAY_CATALOG=s.catalog, GATEWAY_METRICS_PORT=str(s.metrics_http_port))
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    r = subprocess.run([sys.executable, "-m", "control.cli", "usage", "org_x"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.startswith("gateway: cannot reach PostgreSQL at postgresql://postgres:***@127.0.0.1:")
    assert r.stderr.count("\n") == 1 and gw.stack.credentials.postgres not in r.stderr


def test_sim_on_a_port_taken(capsys: pytest.CaptureFixture[str]) -> None:
    import socket
    from control import cli
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        code = cli.main(["sim", "--port", str(s.getsockname()[1]), "--chat-model", "m"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("gateway: sim failed: "), err
    assert "address already in use" in lines[0].lower()
