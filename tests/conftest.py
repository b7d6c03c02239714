"""The suite's stack: real Envoy, PostgreSQL, Redis and ext_proc, started once on free ports with a
test catalog whose model servers are the simulator (two deployments)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

# Tests fork (stacks, subprocesses) from a process that also runs gRPC clients and servers: gRPC's own
# fork handlers are of no use here and a fork while its threads run once crashed the child; set before
# anything imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import httpx
import pytest
import yaml

from control.admin import Admin
from control.launcher import Stack, free_port_base
from control.settings import Settings
from core.settings_base import PORT_OFFSETS, SPAN
from core.redis_client import redis_client
from core.redis_keys import CLUSTER, ONE, Layout
from core.urls import parse_redis


free_base = free_port_base
SELLER = ("Bramka Modeli sp. z o.o.", "5213017228", "ul. Marszałkowska 1, 00-624 Warszawa")  # the suite's invoices' seller
SIM = PORT_OFFSETS["simulators"]  # the first simulator's port: base + SIM


# ---- skips: listed by -ra outside CI; in CI (CI=true) each one fails the run, with its reason -------------
def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


_SKIPS: list[str] = []


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:  # (path, line, "Skipped: reason")
        return str(lr[2]).removeprefix("Skipped: ")
    return str(lr)


# ---- one temporary directory per run ------------------------------------------------------------------
RUN_TMP = "GATEWAY_TESTS_TMP"  # its path, for the workers (they inherit the first process's environment)
SYSTEM_TMP = Path(tempfile.gettempdir())  # the machine's, for what several runs share (``accounts_lock``)
_OWN_RUN_TMP = pytest.StashKey[Path]()
_EXIT = pytest.StashKey[int]()


def _run_tmp(config: pytest.Config) -> None:
    """Everything the run makes through ``tempfile`` (the stacks' state directories, the test Redis and
    PostgreSQL servers' data, the workers' lock files) goes under one directory of the run's own, made by
    the process that starts the run: ``pytest_unconfigure`` removes it when the run passed and keeps it,
    named in the summary, when it failed."""
    here = os.environ.get(RUN_TMP)
    if here is None or not Path(here).is_dir():
        here = tempfile.mkdtemp(prefix="llm-gateway-tests-")
        os.chmod(here, 0o755)  # as /tmp lets them: other accounts (Debian's postgres) reach their own
        os.environ[RUN_TMP] = here
        config.stash[_OWN_RUN_TMP] = Path(here)
    tempfile.tempdir = here


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_RUN_TMP, None)
    if own is not None and config.stash.get(_EXIT, 1) == 0:
        import shutil
        shutil.rmtree(own, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    _run_tmp(config)
    # A run stopped by SIGTERM (`kill`, a job's timeout) ends as Ctrl-C does: pytest then tears the
    # fixtures down, so the stacks' processes stop with it instead of outliving the run.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    config.addinivalue_line("markers", "alone: a test that holds the gateway to a wall-clock bound runs while no "
                            "other worker runs a test (`make test`'s parallel workers)")


@pytest.fixture(autouse=True)
def _alone_or_together(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under parallel workers a test marked ``alone`` waits for the tests under way on the other workers to
    end, and none starts until it has: a readers-writer file lock of this run, every test a reader, an
    ``alone`` test the writer; the turnstile keeps the readers from starving the writer."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        yield
        return
    import fcntl
    base = Path(tempfile.gettempdir()) / f"llm-gateway-tests-{run_id}"
    with open(f"{base}.turnstile", "a") as gate, open(f"{base}.run", "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX)
        alone = request.node.get_closest_marker("alone") is not None
        if alone:
            fcntl.flock(run, fcntl.LOCK_EX)  # the tests under way end; new ones wait at the turnstile
        fcntl.flock(gate, fcntl.LOCK_UN)
        if not alone:
            fcntl.flock(run, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped itself (pytest.skip(allow_module_level=True), importorskip)
        _SKIPS.append(f"{report.nodeid}: {_skip_reason(report)}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append(f"{report.nodeid}: {_skip_reason(report)}")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    own = config.stash.get(_OWN_RUN_TMP, None)
    if own is not None and exitstatus != 0:
        terminalreporter.write_line(f"the run's temporary directories are kept for a look: {own}")
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and config.pluginmanager.has_plugin("randomly"):
        terminalreporter.write_line(f"tests in random order (pytest-randomly): --randomly-seed={seed} repeats this order")
    if _SKIPS and in_ci():
        terminalreporter.section("skipped under CI=true: each of these fails the run", sep="=", red=True)
        for line in _SKIPS:
            terminalreporter.line("SKIPPED (CI failure) " + line, red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SKIPS and in_ci() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    session.config.stash[_EXIT] = int(session.exitstatus)


def make_catalog(base: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    a, b = base + SIM, base + SIM + 1  # the demo catalog's simulators' ports
    price = lambda i, o: [{"effective": "2026-01-01T00:00:00Z",  # noqa: E731
                           "input_micro_pln_per_1m": i, "output_micro_pln_per_1m": o}]
    doc: dict[str, Any] = {
        "aliases": {
            "polish-fast": {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048,
                            "prices": price(800000, 1600000), "upstreams": [{"model": "up-fast"}]},
            "polish-pro": {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048,
                           # a change scheduled far ahead (a date alone: 00:00 in Warsaw), shown by the console
                           "prices": price(1500000, 3000000) + [{"effective": "2099-01-01", "input_micro_pln_per_1m":
                                                                 1400000, "output_micro_pln_per_1m": 2900000}],
                           "upstreams": [{"model": "up-pro"}]},
            "advanced": {"capabilities": ["chat"], "context_length": 32768, "max_output_tokens": 4096,
                         "prices": price(4000000, 8000000), "upstreams": [{"model": "up-adv"}]},
            "embed": {"capabilities": ["embeddings"], "context_length": 8192, "max_output_tokens": 0,
                      "prices": price(200000, 0), "upstreams": [{"model": "up-embed"}]},
            "dead-alias": {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048,
                           "prices": price(1500000, 3000000), "upstreams": [{"model": "up-dead"}]},
            "empty-alias": {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048,
                            "prices": price(1, 1), "upstreams": [{"model": "up-none"}]},
        },
        "upstream_models": {
            "up-fast": {"deployments": [{"name": "sim-a", "host": "127.0.0.1", "port": a}]},
            "up-pro": {"deployments": [{"name": "sim-a", "host": "127.0.0.1", "port": a},
                                       {"name": "sim-b", "host": "127.0.0.1", "port": b}]},
            "up-adv": {"deployments": [{"name": "sim-b", "host": "127.0.0.1", "port": b}]},
            "up-embed": {"deployments": [{"name": "sim-a", "host": "127.0.0.1", "port": a}]},
            "up-none": {"deployments": []},
            # nothing listens there (the launcher starts simulators on 127.0.0.1 only): a dead deployment
            "up-dead": {"deployments": [{"name": "dead", "host": "127.0.0.2", "port": base + SIM + 2}]},
        },
    }
    if extra:
        doc.update(extra)
    return doc


class Gateway:
    """Handles for tests: the base URL, the stack, and admin actions run synchronously."""

    def __init__(self, stack: Stack, base: int) -> None:
        self.stack = stack
        self.port = stack.s.gateway_port
        self.url = f"http://127.0.0.1:{self.port}"
        self.v1 = self.url + "/v1"
        self.sim_a = f"http://127.0.0.1:{base + SIM}"
        self.sim_b = f"http://127.0.0.1:{base + SIM + 1}"
        self.console = f"http://127.0.0.1:{stack.s.console_http_port}"  # the console web app

    def admin(self, fn: Callable[[Admin], Awaitable[Any]]) -> Any:
        async def go() -> Any:
            import asyncpg
            pool = await asyncpg.create_pool(self.stack.database_url, min_size=1, max_size=2)
            r = redis_client(self.stack.redis_url, 2)
            try:
                return await fn(Admin(pool, r))
            finally:
                await pool.close()
                await r.aclose()
        return asyncio.run(go())

    def sql(self, query: str, *args: Any) -> list[dict[str, Any]]:
        async def go() -> list[dict[str, Any]]:
            import asyncpg
            conn = await asyncpg.connect(self.stack.database_url)
            try:
                return [dict(r) for r in await conn.fetch(query, *args)]
            finally:
                await conn.close()
        return asyncio.run(go())

    def redis(self, fn: Callable[[Any], Any]) -> Any:
        """``fn`` run on a short-lived synchronous Redis client of the stack's Redis (to observe, never to
        stand in for it)."""
        import redis as sync_redis
        target = parse_redis(self.stack.redis_url)
        if target.cluster:
            tls = {} if target.tls is None else {"ssl": True, "ssl_ca_certs": target.tls.ca_certs}
            r: Any = sync_redis.RedisCluster(startup_nodes=[sync_redis.cluster.ClusterNode(h, p) for h, p in target.seeds],
                                             password=target.password, **tls)
        elif target.sentinel:
            ssl = {} if target.tls is None else {"ssl": True, "ssl_ca_certs": target.tls.ca_certs}
            r = sync_redis.sentinel.Sentinel(list(target.seeds), sentinel_kwargs=ssl).master_for(
                target.service, password=target.password,
                **({"connection_class": sync_redis.sentinel.SentinelManagedSSLConnection} | ssl if ssl else {}))
        else:
            r = sync_redis.Redis.from_url(self.stack.redis_url)
        try:
            return fn(r)
        finally:
            r.close()

    @property
    def layout(self) -> Layout:
        """Where the stack's Redis keeps an organisation's keys (core/redis_keys.py): one Redis or a cluster."""
        return CLUSTER if parse_redis(self.stack.redis_url).cluster else ONE

    def slots_held(self, org_id: str) -> int:
        """Requests of the organisation admitted and not finished (its concurrency slots, gw:c:<org>)."""
        return int(self.redis(lambda r: r.zcard(self.layout.in_flight(org_id))))

    def usage_backlog(self, org_id: str) -> dict[str, Any]:
        """What of the organisation can still come to PostgreSQL: its requests in flight or left for the
        reaper (gw:if: "key|org|hold|owner|pending record"), its records queued in the usage stream and
        not yet written (the writer deletes what it wrote), and its finishes an ext_proc kept on disk to
        send again (extproc/spool.py: a finish Redis did not confirm, during a failover say)."""
        def look(r: Any) -> dict[str, Any]:
            tag = f'"org_id":"{org_id}"'.encode()
            shard = self.layout.tag(org_id)
            in_flight = [v[:120] for v in r.hvals(self.layout.journal(shard)) if v.split(b"|", 2)[1] == org_id.encode()]
            queued = [i for i, f in r.xrange(self.layout.stream(shard)) if tag in f.get(b"r", b"")]
            return {"in_flight": in_flight, "queued": queued}
        return dict(self.redis(look)) | {"spooled": self._spooled(org_id)}

    def _spooled(self, org_id: str) -> list[str]:
        found = []
        for f in (self.stack.state / "spool").glob("*.json"):
            try:
                if f'"{org_id}"' in f.read_text():
                    found.append(f.name)
            except FileNotFoundError:  # sent meanwhile
                continue
        return found

    def usage_drained(self, org_id: str) -> bool:
        """Nothing of the organisation can still come to PostgreSQL (``usage_backlog`` is empty)."""
        return not any(self.usage_backlog(org_id).values())

    def new_org(self, balance_micro: int = 10_000_000) -> tuple[str, str, str]:
        """(org id, key id, key) of a fresh organisation."""
        async def go(a: Admin) -> tuple[str, str, str]:
            org = await a.create_org("test", balance_micro)
            kid, key = await a.create_key(org)
            return org, kid, key
        return self.admin(go)

    @contextlib.contextmanager
    def another_console(self, name: str, **changes: Any) -> Iterator[int]:
        """A second console process on this stack's stores, with ``changes`` to its settings, on a port of its
        own: that port; stopped on exit."""
        import dataclasses
        from control.console.launch import console_proc
        port = free_base(span=1)
        s = dataclasses.replace(self.stack.s, console_port=port, **changes)
        self.stack.start_proc(console_proc(self.stack.child_env(), s, name=name))
        try:
            yield port
        finally:
            self.stack.stop_proc(name)
            self.stack.procs.pop(name, None)

    def sim_record(self, request_id: str, sim: str | None = None) -> dict[str, Any] | None:
        for url in ([sim] if sim else [self.sim_a, self.sim_b]):
            r = httpx.get(f"{url}/sim/requests/{request_id}")
            if r.status_code == 200:
                return dict(r.json())
        return None


@contextlib.contextmanager
def running_stack(prefix: str, catalog: Callable[[int], dict[str, Any]] = make_catalog,
                  **overrides: Any) -> Iterator[Gateway]:
    """A whole stack of its own on free ports (base .. base + SPAN - 1), stopped (drained) on exit."""
    base = free_base()
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    cat = tmp / "catalog.yaml"
    cat.write_text(yaml.safe_dump(catalog(base)))
    env = dict(os.environ)
    # development mode: the console's tests read mail at /dev/mail and pay with the sandbox provider
    stack = Stack(Settings.from_env(**{"gateway_port": base, "metrics_port": base + SPAN - 1, "dev": True,
                                       "low_balance_check_s": 0.3,
                                       "state_dir": str(tmp / "state"), "catalog": str(cat), **overrides}))
    try:
        stack.start()
        yield Gateway(stack, base)
    finally:
        stack.stop()
        os.environ.clear()
        os.environ.update(env)


@pytest.fixture(scope="session")
def gateway() -> Iterator[Gateway]:
    # a seller whose details make valid FA(3) documents (tests/fa3_schema.py checks every one issued)
    with running_stack("gw-test-", default_rpm=100000, default_concurrency=1000, seller_name=SELLER[0],
                       seller_nip=SELLER[1], seller_address=SELLER[2]) as gw:
        yield gw
        from fa3_schema import made_documents
        made_documents(gw)  # every invoice the suite issued became a valid FA(3) document


@pytest.fixture(scope="session")
def org(gateway: Gateway) -> tuple[str, str, str]:
    return gateway.new_org(100_000_000)


@pytest.fixture
def client(gateway: Gateway, org: tuple[str, str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.v1, headers={"Authorization": f"Bearer {org[2]}"},
                      timeout=30) as c:
        yield c


def assert_error(r: httpx.Response, status: int, code: str, type_: str, param: str | None = None) -> dict[str, Any]:
    """Every member of docs/interface.md section 7's error shape, and the request id header."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "code", "param", "request_id"}
    assert err["code"] == code
    assert err["type"] == type_
    assert err["param"] == param
    assert isinstance(err["message"], str) and err["message"]
    assert err["request_id"] == r.headers["x-request-id"] and err["request_id"]
    return dict(err)


# a mixed load for the fault and hang tests: buffered chat, a stream, embeddings
MIXED_BODIES = [
    ("/chat/completions", {"model": "polish-pro", "messages": [{"role": "user", "content": "Ala ma kota"}],
                           "sim": {"ttft_ms": 40, "output_tokens": 6}}),
    ("/chat/completions", {"model": "polish-fast", "messages": [{"role": "user", "content": "Kot ma Alę"}],
                           "stream": True, "sim": {"itl_ms": 10, "output_tokens": 8}}),
    ("/embeddings", {"model": "embed", "input": ["jeden", "dwa trzy"], "sim": {"ttft_ms": 20}}),
]


def wait_for(pred: Callable[[], Any], timeout: float = 5.0, interval: float = 0.05,
             describe: Callable[[], Any] | None = None) -> Any:
    """``pred()``'s first true value, polled until the deadline; past it, an AssertionError (with
    ``describe()``, when given, to say what was seen).  The one place the suite sleeps: between polls."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout:g}s" + (f": {describe()!r}" if describe else ""))
        time.sleep(interval)


@contextlib.contextmanager
def process(argv: list[str], log: Path, ready: Callable[[], Any],
            user: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running (its output in ``log``) once ``ready()`` is true, terminated on exit; its death
    before it is ready fails with the end of its log."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, user=user, start_new_session=True)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{argv[0]} exited with {proc.returncode}: {log.read_text()[-2000:]}")
            return bool(ready())
        wait_for(up, timeout=30)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def accounts_lock() -> Iterator[None]:
    """Held while a test adds an account to this machine (tests/test_nonroot_e2e.py) or checks that none
    was added (tests/test_places_e2e.py): a file lock in the machine's temporary directory, so that no
    two workers, of one run or of two, run the two at once."""
    import fcntl
    with open(SYSTEM_TMP / "llm-gateway-tests-accounts.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def rate_window_with(seconds: float = 15.0) -> None:
    """Returns once the per-key requests-per-minute window (a calendar minute of the Redis clock, which is
    this machine's clock) has at least ``seconds`` left, so a test that counts requests against the limit
    never straddles two windows (each with a budget of its own)."""
    import time
    wait_for(lambda: 60 - time.time() % 60 >= seconds, timeout=seconds + 2, interval=0.1)


def usage_caught_up(gw: Gateway, key: str, timeout: float = 10.0) -> dict[str, Any]:
    """The positive event an absence check waits for: a later request with ``key`` whose usage record has
    landed in PostgreSQL.  The usage stream is written in order, so whatever an earlier request of the
    same key queued is in PostgreSQL by then too; returns the later request's row."""
    r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                   json={"model": "polish-fast", "messages": [{"role": "user", "content": "later"}]})
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    rows = wait_for(lambda: gw.sql("SELECT * FROM usage_records WHERE request_id = $1", rid), timeout)
    return rows[0]


__all__ = ["assert_error", "rate_window_with", "usage_caught_up", "wait_for", "json"]
