"""The embedded databases run with generated credentials kept in the state directory, which is the
account's own (every file 0600, every directory 0700); nothing outside it is touched."""
from __future__ import annotations

import asyncio
import json
import os
import pwd
import socket
import stat
from pathlib import Path

import asyncpg
import pytest

from conftest import Gateway


def test_every_file_private(gateway: Gateway) -> None:
    state = gateway.stack.state
    seen = sockets = 0
    for root, dirs, files in os.walk(state):
        for name in dirs + files:
            p = Path(root) / name
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                continue
            want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
            assert stat.S_IMODE(st.st_mode) == want, (str(p), oct(st.st_mode))
            if stat.S_ISSOCK(st.st_mode):  # the gateway's own two kinds of Unix socket only (no PostgreSQL's)
                assert p == state / "redis" / "redis.sock" or (p.parent == state / "run" and p.suffix == ".sock"), p
                sockets += 1
            else:
                assert stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode), f"{p}: neither file nor directory"
            seen += 1
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert seen > 100  # PostgreSQL's data directory among them
    assert sockets == 2  # Redis's and the ext_proc's
    for name in ("credentials.json", "stack.json", "redis/redis.conf", "logs/envoy.log", "logs/redis.log"):
        assert (state / name).is_file(), name
    assert any((state / "redis").glob("appendonly*")), "Redis's append-only file"


def test_nothing_outside_the_state_dir_changed(gateway: Gateway) -> None:
    """The state directory's parent is tempfile.mkdtemp's (0700, the test's account): no other account
    was let in to reach the data directory."""
    parent = gateway.stack.state.parent
    st = parent.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    for p in parent.parents:
        assert stat.S_IMODE(p.stat().st_mode) in (0o755, 0o1777, 0o555), p


def test_envoy_keeps_no_shared_memory_outside_the_state_dir(gateway: Gateway) -> None:
    """Envoy runs without hot restart: no /dev/shm/envoy_shared_memory_* file of its own, which a killed
    Envoy would leave behind and a later one of another account could not open (it aborted)."""
    pid = gateway.stack.procs["envoy"].popen.pid  # type: ignore[union-attr]
    maps = open(f"/proc/{pid}/maps").read()
    assert "envoy_shared_memory" not in maps
    cmdline = open(f"/proc/{pid}/cmdline").read().split("\0")
    assert "--disable-hot-restart" in cmdline and "--base-id" not in cmdline


def test_postgres_runs_as_its_own_account(gateway: Gateway) -> None:
    pid = gateway.stack.procs["postgres"].popen.pid  # type: ignore[union-attr]
    uid = os.stat(f"/proc/{pid}").st_uid
    data_owner = (gateway.stack.state / "pg").stat().st_uid
    assert uid == data_owner == gateway.stack.state.stat().st_uid == os.geteuid()
    uid_map = Path(f"/proc/{pid}/uid_map").read_text().split()
    if os.geteuid() == 0:  # PostgreSQL refuses root: in a user namespace, root is nobody to it
        assert uid_map == [str(pwd.getpwnam("nobody").pw_uid), "0", "1"], uid_map
    else:
        assert uid_map == ["0", "0", "4294967295"], uid_map  # the account's own, no namespace


def _pg_error(url: str) -> str:
    async def go() -> str:
        try:
            conn = await asyncpg.connect(url, timeout=5)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        await conn.close()
        return "connected"
    return asyncio.run(go())


def test_postgres_refuses_a_client_without_the_password(gateway: Gateway) -> None:
    port = gateway.stack.pg_port
    creds = json.loads((gateway.stack.state / "credentials.json").read_text())
    assert f":{creds['postgres']}@" in gateway.stack.database_url
    no_password = _pg_error(f"postgresql://postgres@127.0.0.1:{port}/postgres?passfile=/nonexistent")
    assert no_password != "connected" and "password" in no_password.lower(), no_password
    wrong = _pg_error(f"postgresql://postgres:wrong@127.0.0.1:{port}/postgres")
    assert wrong.startswith("InvalidPasswordError"), wrong
    assert _pg_error(gateway.stack.database_url) == "connected"


def _redis(port: int, *commands: bytes) -> list[bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        out = []
        for c in commands:
            s.sendall(c)
            out.append(s.recv(4096))
        return out


@pytest.mark.parametrize("command", [b"PING\r\n", b"SET gw:k:0000 x\r\n", b"KEYS *\r\n"])
def test_redis_refuses_a_client_without_auth(gateway: Gateway, command: bytes) -> None:
    creds = json.loads((gateway.stack.state / "credentials.json").read_text())
    assert f":{creds['redis']}@" in gateway.stack.redis_url
    port = gateway.stack.redis_port
    assert _redis(port, command)[0].startswith(b"-NOAUTH")
    wrong, after = _redis(port, b"AUTH wrong\r\n", command)
    assert wrong.startswith(b"-WRONGPASS") or wrong.startswith(b"-ERR invalid password"), wrong
    assert after.startswith(b"-NOAUTH")
    ok, = _redis(port, b"AUTH " + creds["redis"].encode() + b"\r\n")
    assert ok == b"+OK\r\n"


def test_a_state_dir_from_before_gets_credentials() -> None:
    """A data directory made by an older version (initdb --auth=trust, no credentials kept; as root, owned
    by the system account older versions ran PostgreSQL as) is given the generated password and requires
    it from then on, and is the account's own again; its data stays."""
    import subprocess
    import tempfile

    from conftest import running_stack
    from control.embedded import pg_install, pg_runner
    state = Path(tempfile.mkdtemp(prefix="gw-olddir-")) / "state"
    (state / "pg").mkdir(parents=True, mode=0o700)
    subprocess.run([*pg_runner(), str(pg_install() / "bin" / "initdb"), "-D", str(state / "pg"), "--auth=trust",
                    "-U", "postgres"], check=True, capture_output=True, umask=0o022)
    os.chmod(state, 0o755)
    if os.geteuid() == 0:
        other = pwd.getpwnam("nobody")
        for p in [state / "pg", *(state / "pg").rglob("*")]:
            os.lchown(p, other.pw_uid, other.pw_gid)
    with running_stack("gw-olddir-", state_dir=str(state)) as gw:
        rules = [ln.split() for ln in (state / "pg" / "pg_hba.conf").read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        assert rules and all(r[-1] == "scram-sha-256" for r in rules), rules
        port = gw.stack.pg_port
        refused = _pg_error(f"postgresql://postgres@127.0.0.1:{port}/postgres?passfile=/nonexistent")
        assert refused != "connected" and "password" in refused.lower(), refused
        assert _pg_error(gw.stack.database_url) == "connected"
        for root, dirs, files in os.walk(state):
            for n in dirs + files:
                st = os.lstat(Path(root) / n)
                assert stat.S_IMODE(st.st_mode) == (0o700 if stat.S_ISDIR(st.st_mode) else 0o600), (root, n)
                assert st.st_uid == os.geteuid(), (root, n)
