"""Production-shaped services: the whole stack on Debian's redis-server 7 and PostgreSQL 15
with authentication and TLS switched on, as a managed Redis and PostgreSQL have them, each given only
by REDIS_URL / DATABASE_URL:

- Redis: an ACL user with a password, TLS only (no plain port), the server's certificate from a CA this
  test generates, and a client certificate required (``rediss://user:pass@…?ssl_ca_certs=…&ssl_certfile=…``);
  and a password-only Redis (``requirepass``) on a unix socket with a database number.
- PostgreSQL: SCRAM-SHA-256 passwords, TLS only (``hostssl``), verified as ``sslmode=verify-full`` against
  the CA (``sslrootcert``).

Every process reads the URLs: migrations (the launcher), the ext_proc's request path and cache fills,
the usage writer, the console, the operator CLI.  Chat, streaming and billing traffic goes through
Envoy: statuses, the usage record in PostgreSQL and the balance debited exactly.

The Debian packages are installed by ``make services`` (``make test`` depends on it).  Without them
these tests are skipped and say why, except under CI=true, where that is a failure.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import asyncpg
import httpx
import pytest

from conftest import Gateway, process, running_stack, wait_for
from core.resp import RespClient, RespSetupError
from core.redis_client import redis_client
from core.urls import mask
from free_ports import free_port

REDIS_SERVER = Path("/usr/bin/redis-server")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"

REDIS_USER, REDIS_PASS = "gateway", "r3d:s/p@ss w%rd"
PG_USER, PG_PASS = "gateway", "pg:s/p@ss w%rd"
MSGS = [{"role": "user", "content": "Ile kosztuje bilet do Krakowa?"}]


def _missing() -> str:
    gone = [str(p) for p in (REDIS_SERVER, PG_BIN / "initdb", PG_BIN / "postgres", Path(OPENSSL))
            if not os.access(p, os.X_OK)]
    return ", ".join(gone)


if _missing():
    why = f"Debian's redis-server / postgresql-15 / openssl missing ({_missing()}): run 'make services'"
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(why)  # collection error: CI must not pass without these tests
    pytest.skip(why, allow_module_level=True)



def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by it."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=gateway test CA", cwd=d)
    for name, ext in [("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")]:
        (d / f"{name}.ext").write_text(ext)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    for f in d.iterdir():
        f.chmod(0o644 if f.suffix == ".crt" else 0o600)


@contextlib.contextmanager
def tls_redis(tmp: Path, certs: Path) -> Iterator[str]:
    """Debian's redis-server: TLS only, client certificates required, the default user off, one ACL user."""
    d = tmp / "redis-tls"
    d.mkdir()
    port = free_port()
    (d / "redis.conf").write_text(
        f"port 0\ntls-port {port}\nbind 127.0.0.1\ndir {d}\nsave \"\"\nappendonly no\ndaemonize no\n"
        f"tls-cert-file {certs}/server.crt\ntls-key-file {certs}/server.key\ntls-ca-cert-file {certs}/ca.crt\n"
        f"tls-auth-clients yes\nuser default off\n"
        f"user {REDIS_USER} on \">{REDIS_PASS}\" ~* &* +@all\n")
    with process([str(REDIS_SERVER), str(d / "redis.conf")], d / "log", lambda: _port_open(port)):
        yield (f"rediss://{REDIS_USER}:{quote(REDIS_PASS, safe='')}@127.0.0.1:{port}/1"
               f"?ssl_ca_certs={certs}/ca.crt&ssl_certfile={certs}/client.crt&ssl_keyfile={certs}/client.key")


@contextlib.contextmanager
def password_redis(tmp: Path) -> Iterator[str]:
    """Debian's redis-server: password only (requirepass), on a unix socket, no TCP."""
    d = tmp / "redis-unix"
    d.mkdir()
    sock = d / "redis.sock"
    (d / "redis.conf").write_text(
        f"port 0\nunixsocket {sock}\nunixsocketperm 700\ndir {d}\nsave \"\"\nappendonly no\ndaemonize no\n"
        f"requirepass \"{REDIS_PASS}\"\n")
    with process([str(REDIS_SERVER), str(d / "redis.conf")], d / "log", sock.exists):
        yield f"unix://{sock}?db=2&password={quote(REDIS_PASS, safe='')}"


@contextlib.contextmanager
def postgres(tmp: Path, certs: Path) -> Iterator[str]:
    """Debian's PostgreSQL 15: SCRAM-SHA-256 only, TLS only (hostssl), its certificate from the test CA.
    As root it runs as the package's ``postgres`` user, as PostgreSQL requires."""
    user = "postgres" if os.getuid() == 0 else None
    d = tmp / "pg"
    d.mkdir()
    data = d / "data"
    (d / "pw").write_text(PG_PASS + "\n")
    for name in ("server.crt", "server.key"):
        shutil.copy(certs / name, d / name)
    if user:
        pw = pwd.getpwnam(user)
        for p in (d, d / "pw", d / "server.crt", d / "server.key"):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    (d / "server.key").chmod(0o600)
    subprocess.run([str(PG_BIN / "initdb"), "-D", str(data), "-U", PG_USER, f"--pwfile={d / 'pw'}",
                    "--auth=scram-sha-256", "--encoding=utf8", "--locale=C"],
                   check=True, capture_output=True, user=user)
    port = free_port()
    (data / "pg_hba.conf").write_text("hostssl all all 127.0.0.1/32 scram-sha-256\n")
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{d}'\n"
                   f"password_encryption = 'scram-sha-256'\nssl = on\n"
                   f"ssl_cert_file = '{d}/server.crt'\nssl_key_file = '{d}/server.key'\n"
                   "log_min_messages = warning\nfsync = off\n")
    with process([str(PG_BIN / "postgres"), "-D", str(data)], d / "log", lambda: _port_open(port), user=user):
        yield (f"postgresql://{PG_USER}:{quote(PG_PASS, safe='')}@127.0.0.1:{port}/postgres"
               f"?sslmode=verify-full&sslrootcert={certs}/ca.crt")


@pytest.fixture(scope="module")
def services() -> Iterator[tuple[Path, str, str, str]]:
    tmp = Path(tempfile.mkdtemp(prefix="prod-services-"))
    tmp.chmod(0o755)  # PostgreSQL's own user goes through it
    certs = tmp / "certs"
    certs.mkdir()
    make_certificates(certs)
    if os.getuid() == 0:  # the postgres user reads the CA only; the server key is copied to it
        certs.chmod(0o755)
    with tls_redis(tmp, certs) as tls_url, password_redis(tmp) as unix_url, postgres(tmp, certs) as pg_url:
        yield certs, tls_url, unix_url, pg_url
    shutil.rmtree(tmp, ignore_errors=True)


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def cli(gw: Gateway, *args: str) -> Any:
    """The operator CLI in a shell of its own, given the services by URL only."""
    s = gw.stack.s
    env = dict(os.environ, GATEWAY_PORT=str(s.gateway_port), GATEWAY_STATE_DIR=str(s.state),
               GATEWAY_CATALOG=s.catalog, GATEWAY_METRICS_PORT=str(s.metrics_http_port),
               DATABASE_URL=gw.stack.database_url, REDIS_URL=gw.stack.redis_url)
    r = subprocess.run([sys.executable, "-m", "control.cli", "--json", *args], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 or args[0] == "status", r.stderr
    return json.loads(r.stdout)


def carry_traffic(gw: Gateway) -> None:
    """Chat, streaming and billing through Envoy, the ext_proc and the usage writer."""
    org = cli(gw, "org", "create", "prod-shaped", "--balance", "10")["id"]
    key = cli(gw, "key", "create", org)["key"]

    r = httpx.post(gw.v1 + "/chat/completions", headers=_h(key), timeout=30,
                   json={"model": "advanced", "messages": MSGS, "sim": {"output_tokens": 7}})
    assert r.status_code == 200, r.text
    chat_id = r.headers["x-request-id"]
    usage = r.json()["usage"]

    body = {"model": "advanced", "messages": MSGS, "stream": True, "stream_options": {"include_usage": True},
            "sim": {"output_tokens": 5}}
    got = b""
    with httpx.stream("POST", gw.v1 + "/chat/completions", json=body, headers=_h(key), timeout=30) as s:
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        stream_id = s.headers["x-request-id"]
        for chunk in s.iter_bytes():
            got += chunk
    assert got.rstrip().endswith(b"data: [DONE]")

    rows = {row["request_id"]: row for row in wait_for(lambda: (lambda rs: rs if len(rs) == 2 else None)(
        gw.sql("SELECT * FROM usage_records WHERE org_id = $1", org)), 10)}
    assert set(rows) == {chat_id, stream_id}
    chat = rows[chat_id]
    assert (chat["prompt_tokens"], chat["completion_tokens"]) == (usage["prompt_tokens"], 7)
    assert rows[stream_id]["completion_tokens"] == 5 and rows[stream_id]["estimated"] is False
    for row in rows.values():  # advanced: 4 / 8 PLN per 1M tokens
        assert row["cost_micro_pln"] == _ceil(row["prompt_tokens"] * 4_000_000, 10**6) + _ceil(
            row["completion_tokens"] * 8_000_000, 10**6)
    spent = sum(row["cost_micro_pln"] for row in rows.values())
    assert spent > 0
    # the balance debited exactly: the ledger in PostgreSQL, and the counter the request path reads in Redis
    shown = wait_for(lambda: (lambda b: b if b["balance_micro_pln"] == 10_000_000 - spent else None)(
        cli(gw, "balance", "show", org)), 10)
    assert shown["ledger_micro_pln"] == 10_000_000 - spent
    listed = cli(gw, "usage", org)
    assert {row["request_id"] for row in listed} == {chat_id, stream_id}

    # the console (its own PostgreSQL pool and Redis client) is up on the same services
    assert httpx.get(gw.console + "/healthz", timeout=10).status_code == 200
    status = cli(gw, "status")
    assert status["postgres"]["ok"] and status["redis"]["ok"], status


def _stack(pg_url: str, redis_url: str) -> Any:
    return running_stack("prod-stack-", database_url=pg_url, redis_url=redis_url,
                         default_rpm=100000, default_concurrency=1000)


def test_acl_user_over_tls_and_scram_over_tls(services: tuple[Path, str, str, str]) -> None:
    _, tls_url, _, pg_url = services
    with _stack(pg_url, tls_url) as gw:
        assert gw.stack.redis_url == tls_url and gw.stack.database_url == pg_url
        assert "redis" not in gw.stack.procs and "postgres" not in gw.stack.procs  # nothing embedded
        carry_traffic(gw)
        # what the request path wrote went to database 1 of the TLS Redis, as the URL says
        async def keys() -> int:
            fast = RespClient.from_url(tls_url)
            try:
                return int(await fast.call("DBSIZE"))
            finally:
                await fast.close()
        assert asyncio.run(keys()) > 0


def test_password_only_redis_on_a_unix_socket(services: tuple[Path, str, str, str]) -> None:
    _, _, unix_url, pg_url = services
    with _stack(pg_url, unix_url) as gw:
        carry_traffic(gw)


def test_the_services_refuse_what_the_urls_do_not_allow(services: tuple[Path, str, str, str]) -> None:
    """The servers really ask for what the URLs give: without it, each one refuses."""
    certs, tls_url, unix_url, pg_url = services

    async def go() -> None:
        base, _, query = tls_url.partition("?")
        wrong = base.replace(quote(REDIS_PASS, safe=""), "wrong") + "?" + query
        fast = RespClient.from_url(wrong)
        try:
            with pytest.raises(RespSetupError, match="refused the credentials") as e:
                await fast.call("PING")
            assert "wrong" not in str(e.value) and mask(wrong) in str(e.value)
        finally:
            await fast.close()
        # no client certificate: the TLS handshake fails
        bare = tls_url.split("&ssl_certfile")[0]
        fast = RespClient.from_url(bare)
        try:
            with pytest.raises(ConnectionError):
                await fast.call("PING")
        finally:
            await fast.close()
        # no CA: the server's certificate is not trusted, by either client ...
        no_ca = tls_url.replace(f"ssl_ca_certs={certs}/ca.crt&", "")
        fast, r = RespClient.from_url(no_ca), redis_client(no_ca, 1)
        try:
            with pytest.raises(ConnectionError, match="certificate verify failed"):
                await fast.call("PING")
            with pytest.raises(Exception, match="certificate verify failed"):
                await r.ping()
        finally:
            await fast.close()
            await r.aclose()
        # ... unless the URL says not to verify it (ssl_cert_reqs=none); and by name: localhost is in it
        for url in (no_ca + "&ssl_cert_reqs=none", tls_url.replace("@127.0.0.1:", "@localhost:")):
            fast, r = RespClient.from_url(url), redis_client(url, 1)
            try:
                assert await fast.call("PING") == b"PONG" and await r.ping() is True
            finally:
                await fast.close()
                await r.aclose()
        # no password on the unix socket
        fast = RespClient.from_url(unix_url.split("&password")[0])
        try:
            with pytest.raises(RespSetupError, match="needs a password"):
                await fast.call("PING")
        finally:
            await fast.close()
        # PostgreSQL: TLS is required (no hostssl line for a plain connection), and SCRAM checks the password
        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):
            await asyncpg.connect(pg_url.replace("sslmode=verify-full", "sslmode=disable"))
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(pg_url.replace(quote(PG_PASS, safe=""), "wrong"))
        conn = await asyncpg.connect(pg_url)
        try:
            assert await conn.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") is True
            assert await conn.fetchval("SHOW password_encryption") == "scram-sha-256"
        finally:
            await conn.close()
    asyncio.run(go())


def test_the_cli_says_which_server_refused_it(services: tuple[Path, str, str, str]) -> None:
    _, tls_url, _, pg_url = services
    bad_redis = tls_url.replace(quote(REDIS_PASS, safe=""), "not-it")
    bad_pg = pg_url.replace(quote(PG_PASS, safe=""), "not-it")

    async def an_org() -> str:
        from control.admin import Admin
        from control.schema import migrate
        conn = await asyncpg.connect(pg_url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        pool, r = await asyncpg.create_pool(pg_url, min_size=1, max_size=1), redis_client(tls_url, 1)
        try:
            return await Admin(pool, r).create_org("cli-refused")
        finally:
            await pool.close()
            await r.aclose()
    org = asyncio.run(an_org())
    for db, rd, expect in [(pg_url, bad_redis, "gateway: Redis refused REDIS_URL's credentials: "),
                           (bad_pg, tls_url, "gateway: PostgreSQL refused DATABASE_URL's credentials: "),
                           (pg_url, tls_url + "&socket_timeout=1", "unsupported parameter 'socket_timeout'")]:
        env = dict(os.environ, DATABASE_URL=db, REDIS_URL=rd)
        r = subprocess.run([sys.executable, "-m", "control.cli", "balance", "show", org], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and expect in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and "not-it" not in r.stderr and "p%40ss" not in r.stderr


def test_the_container_migration_job_takes_the_url(services: tuple[Path, str, str, str]) -> None:
    """The image's ``migrate`` command (the Kubernetes Job), on PostgreSQL over TLS with SCRAM."""
    _, _, _, pg_url = services
    env = dict(os.environ, DATABASE_URL=pg_url)
    entry = Path(__file__).resolve().parent.parent / "deploy" / "docker" / "entrypoint.py"
    r = subprocess.run([sys.executable, str(entry), "migrate"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("schema at version ")

    async def version() -> int:
        conn = await asyncpg.connect(pg_url)
        try:
            return int(await conn.fetchval("SELECT max(version) FROM schema_migrations"))
        finally:
            await conn.close()
    assert r.stdout.split()[-1] == str(asyncio.run(version()))
