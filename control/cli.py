"""The operator CLI, ``gateway``.  Every command that prints data takes ``--json``.

Environment: GATEWAY_PORT, GATEWAY_STATE_DIR, GATEWAY_CATALOG, DATABASE_URL, REDIS_URL (see README).
Without DATABASE_URL / REDIS_URL the commands find the stack that ``gateway up`` started through
``$GATEWAY_STATE_DIR/stack.json``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable

from core import key_limits
from core.catalog import CatalogError
from core.cost import micro_to_pln
from core.settings_base import PORT_OFFSETS, SettingsError
from core.urls import RedisUrlError

from .admin import Admin, AdminError, CreditLimit, pln_to_micro
from .console.launch import ConfigError
from . import invoices_cli
from .embedded import StartError, write_private
from .settings import Settings


def _urls(s: Settings) -> tuple[str, str]:
    db, rd = s.database_url, s.redis_url
    f = s.state / "stack.json"
    if (not db or not rd) and f.exists():
        try:
            doc = json.loads(f.read_text())
            db, rd = db or doc["database_url"], rd or doc["redis_url"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise AdminError(f"cannot read {f} ({type(e).__name__}); restart the stack with 'gateway up', "
                             "or set DATABASE_URL and REDIS_URL") from None
    if not db or not rd:
        raise AdminError(f"no running stack found in {s.state} (start it with 'gateway up'),"
                         " or set DATABASE_URL and REDIS_URL")
    return db, rd


def db_problem(url: str, e: BaseException) -> str:
    """What went wrong reaching PostgreSQL, and what to do, in one line (the password masked)."""
    import asyncpg
    from core.urls import mask
    m = mask(url)
    if isinstance(e, (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
        return f"PostgreSQL refused DATABASE_URL's credentials: {e} (at {m}); fix DATABASE_URL"
    if isinstance(e, (OSError, asyncio.TimeoutError, asyncpg.CannotConnectNowError)):
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return (f"cannot reach PostgreSQL at {m} ({why}); start the stack with 'gateway up', "
                "or check DATABASE_URL")
    if isinstance(e, ValueError):
        from .launcher import dsn_problem
        return dsn_problem(url, e)
    if isinstance(e, asyncpg.InterfaceError):
        return f"DATABASE_URL {m} cannot be used: {e}"
    return f"PostgreSQL at {m}: {type(e).__name__}: {e}"


def redis_problem(url: str, e: BaseException) -> str:
    """What went wrong reaching Redis, and what to do, in one line (the password masked)."""
    import redis.exceptions as rx
    from core.urls import mask
    m = mask(url)
    if isinstance(e, RedisUrlError):
        return str(e)
    text = str(e)
    if isinstance(e, rx.AuthenticationError) or any(
            w in text for w in ("NOAUTH", "WRONGPASS", "invalid password", "invalid username-password")):
        return f"Redis refused REDIS_URL's credentials: {text} (at {m}); fix REDIS_URL"
    if isinstance(e, (OSError, asyncio.TimeoutError, rx.ConnectionError, rx.TimeoutError)):
        why = f"{type(e).__name__}: {text}" if text else type(e).__name__
        return f"cannot reach Redis at {m} ({why}); start the stack with 'gateway up', or check REDIS_URL"
    return f"Redis at {m}: {type(e).__name__}: {text}"


async def _with_admin(s: Settings, fn: Callable[[Admin], Awaitable[Any]]) -> Any:
    """``fn`` with an Admin on the stack's PostgreSQL and Redis; either one refusing or not there is an
    AdminError saying which, at which URL (password masked), and what to do."""
    import asyncpg
    import redis.exceptions as rx
    from core.redis_client import redis_client
    db, rd = _urls(s)
    async with contextlib.AsyncExitStack() as opened:
        try:
            pool = await asyncpg.create_pool(db, min_size=1, max_size=2, timeout=5)
        except (OSError, asyncio.TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            raise AdminError(db_problem(db, e)) from None
        opened.push_async_callback(pool.close)
        try:
            r = redis_client(rd, 2)
            await r.ping()
        except (OSError, asyncio.TimeoutError, RedisUrlError, rx.RedisError) as e:
            raise AdminError(redis_problem(rd, e)) from None
        opened.push_async_callback(r.aclose)
        return await fn(Admin(pool, r, s.credit_limit_micro))


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, default=str) if args.json else text)


async def ensure_demo(admin: Admin, s: Settings) -> dict[str, str]:
    """Development mode's first start: a demo organisation with the trial balance and a key, remembered in
    the state dir (a production start makes none: the operator's first key comes from `gateway key create`)."""
    f = s.state / "demo.json"
    if f.exists():
        return dict(json.loads(f.read_text()))
    org = await admin.create_org("demo", pln_to_micro(s.trial_balance_pln), kind="trial")
    kid, key = await admin.create_key(org, "demo")
    demo = {"org": org, "key_id": kid, "key": key}
    write_private(f, json.dumps(demo))
    return demo


READY_TIMEOUT_S = 60.0  # for every alias's first request (a model server still loading gets this long)


async def _start_keys(admin: Admin, s: Settings) -> tuple[str, dict[str, str] | None]:
    """The readiness probes' key and, in development mode only, the demo organisation."""
    from .readiness import probe_key
    return await probe_key(admin, s.state), (await ensure_demo(admin, s) if s.dev else None)


def _banner(s: Settings, heading: str, demo: dict[str, str] | None) -> str:
    base = f"http://{s.gateway_host}:{s.gateway_port}/v1"
    console = f"  console:           http://{s.gateway_host}:{s.console_http_port}/"
    if demo is None:
        return f"""
{heading}
{console}
  No key is printed outside development mode. The first organisation and key:
    gateway org create NAME --balance PLN
    gateway key create ORG

Ctrl-C stops every process."""
    return f"""
{heading}
{console}
  DEVELOPMENT MODE (GATEWAY_DEV=1): e-mails captured at /dev/mail, sandbox payments; both on loopback only. Never in a deployment.
  demo organisation: {demo['org']}
  API key:           {demo['key']}

Try it:
  curl -s {base}/chat/completions -H "Authorization: Bearer {demo['key']}" \\
    -H "Content-Type: application/json" \\
    -d '{{"model": "polish-pro", "messages": [{{"role": "user", "content": "Dzień dobry!"}}]}}'

Ctrl-C stops every process."""


def cmd_up(args: argparse.Namespace, s: Settings) -> int:
    from core import catalog as catalog_mod

    from .launcher import GaveUp, Stack
    from .procs import stop_requested
    from .readiness import wait_ready
    if args.port:
        s = Settings.from_env(gateway_port=args.port)
    stack = Stack(s)
    stopping = stop_requested()
    try:
        stack.start()
        s2 = Settings.from_env(gateway_port=s.gateway_port, database_url=stack.database_url,
                               redis_url=stack.redis_url)
        key, demo = asyncio.run(_with_admin(s2, lambda a: _start_keys(a, s2)))
        host = "127.0.0.1" if s.gateway_host in ("", "0.0.0.0", "::") else s.gateway_host
        outcomes = wait_ready(f"http://{host}:{s.gateway_port}/v1", key, catalog_mod.load(s.catalog),
                              s.gateway_port, s.run_sim, READY_TIMEOUT_S, stopping)
        if not stopping():
            failed = [f"{a}: {o.detail}" for a, o in sorted(outcomes.items()) if not o.ok]
            base = f"http://{s.gateway_host}:{s.gateway_port}/v1"
            heading = (f"Gateway ready on {base}" if not failed else
                       f"Gateway up on {base} but NOT READY: " + "; ".join(failed) + f" (see {stack.logs})")
            print(_banner(s, heading, demo), flush=True)
        stack.supervise(stopping)
    except GaveUp as e:
        print(f"gateway: stopping: {e}", file=sys.stderr)
        return 1
    except (StartError, RuntimeError, OSError, CatalogError) as e:
        print(f"gateway: not started: {e}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    return 0


STATUS_TIMEOUT_S = 0.75  # each component's own: they are asked at once, so the whole answer comes within it


async def status(s: Settings) -> dict[str, dict[str, Any]]:
    """Every component's health: Envoy's readiness, each ext_proc process's gRPC health (and what it sees
    of Redis and PostgreSQL) and metrics endpoint, the usage writer's metrics endpoint, PostgreSQL,
    Redis, the simulators and the console.  All are asked at once, each with ``STATUS_TIMEOUT_S``: a
    component that is stopped or frozen (it accepts a connection and never answers) is DOWN within it,
    and does not hold up the others."""
    import concurrent.futures
    import dataclasses
    import urllib.error
    import urllib.request
    import asyncpg
    import grpc
    from core.redis_client import redis_client
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from core import catalog as catalog_mod
    from .ports import extproc_workers

    timeout = STATUS_TIMEOUT_S

    def get(url: str) -> dict[str, Any]:
        # a frozen server accepts the connection (the kernel does) and never answers: the timeout is the
        # read's, so this thread ends within it
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return {"ok": 200 <= r.status < 300, "detail": f"HTTP {r.status}"}
        except Exception as e:  # noqa: BLE001
            if isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
                return {"ok": False, "detail": f"no answer within {timeout:g} s"}
            return {"ok": False, "detail": type(e).__name__}

    threads = concurrent.futures.ThreadPoolExecutor(max_workers=16)  # one each: none waits for another

    async def http(url: str) -> dict[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(threads, get, url)

    def serving(status: int) -> str:
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status))

    async def extproc(port: int) -> dict[str, Any]:
        """The process's own health ("" service), and the dependencies it cannot reach."""
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                own, *deps = await asyncio.gather(*(
                    stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=timeout)
                    for name in ("", "redis", "postgres")), return_exceptions=True)
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "detail": type(e).__name__}
        if isinstance(own, grpc.aio.AioRpcError) and own.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return {"ok": False, "detail": f"no answer within {timeout:g} s"}
        if isinstance(own, BaseException):
            return {"ok": False, "detail": type(own).__name__}
        cannot = [name for name, d in zip(("redis", "postgres"), deps)
                  if not isinstance(d, BaseException) and d.status != health_pb2.HealthCheckResponse.SERVING]
        detail = serving(own.status) + (f" ({', '.join(cannot)} not answering it)" if cannot else "")
        return {"ok": own.status == health_pb2.HealthCheckResponse.SERVING, "detail": detail}

    async def postgres(db: str) -> dict[str, Any]:
        try:
            conn = await asyncio.wait_for(asyncpg.connect(db, timeout=timeout), timeout)
            try:
                await conn.fetchval("SELECT 1", timeout=timeout)
            finally:
                conn.terminate()
            return {"ok": True, "detail": "accepting connections"}
        except asyncio.TimeoutError:
            return {"ok": False, "detail": f"no answer within {timeout:g} s"}
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "detail": db_problem(db, e)}

    async def redis(rd: str) -> dict[str, Any]:
        r = None
        try:
            r = redis_client(rd, 1)
            await asyncio.wait_for(r.ping(), timeout)
            return {"ok": True, "detail": "PONG"}
        except asyncio.TimeoutError:
            return {"ok": False, "detail": f"no answer within {timeout:g} s"}
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "detail": redis_problem(rd, e)}
        finally:
            if r is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(r.aclose(), 0.1)

    sims: list[tuple[str, int]] = []
    if s.run_sim:
        from .ports import simulators
        sims = sorted(simulators(catalog_mod.load(s.catalog), s))
    out: dict[str, dict[str, Any]] = {}
    try:
        db, rd = _urls(s)
    except AdminError as e:
        db, rd = "", ""
        out["stack"] = {"ok": False, "detail": str(e)}
    checks: dict[str, Awaitable[dict[str, Any]]] = {}
    checks["envoy"] = http(f"http://127.0.0.1:{s.envoy_admin_port}/ready")
    n = s.extproc_workers  # the running stack's count when it recorded one (stack.json), else the setting
    with contextlib.suppress(OSError, ValueError, AttributeError):
        rec = json.loads((s.state / "stack.json").read_text())
        if rec.get("gateway_port") == s.gateway_port:
            n = int(rec.get("extproc_workers", n))
    workers = extproc_workers(dataclasses.replace(s, extproc_workers=n))  # "extproc", "extproc-2", ...
    for name, grpc_port, _ in workers:
        checks[name] = extproc(grpc_port)
    for name, _, metrics_port in workers:
        checks["metrics" + name[len("extproc"):]] = http(f"http://{s.metrics_host}:{metrics_port}/metrics")
    checks["usage-writer"] = http(f"http://{s.metrics_host}:{s.writer_metrics_http_port}/metrics")
    checks["console"] = http(f"http://127.0.0.1:{s.console_http_port}/login")
    if db:
        checks["postgres"] = postgres(db)
    if rd:
        checks["redis"] = redis(rd)
    for name, port in sims:
        checks[f"sim:{name}"] = http(f"http://127.0.0.1:{port}/health")
    try:
        done = await asyncio.gather(*checks.values())
    finally:
        threads.shutdown(wait=False)
    return out | dict(zip(checks, done))


def cmd_status(args: argparse.Namespace, s: Settings) -> int:
    doc = asyncio.run(status(s))
    if not any(v["ok"] for v in doc.values()):  # nothing answers: one line, not a table of DOWNs
        raise AdminError(f"the stack on port {s.gateway_port} is not running (no component answers); "
                         "start it with 'gateway up'")
    lines = [f"{name:<12} {'ok  ' if v['ok'] else 'DOWN'}  {v['detail']}" for name, v in doc.items()]
    _print(args, doc, "\n".join(lines))
    down = [name for name, v in doc.items() if not v["ok"]]
    if down:  # the table says which; this line says what to do about the first
        print(f"gateway: {', '.join(down)} down: {doc[down[0]]['detail']}", file=sys.stderr)
    return 1 if down else 0


def cmd_backup(args: argparse.Namespace, s: Settings) -> int:
    from .backup import backup, restore
    db, _ = _urls(s)
    file = Path(args.file).resolve()
    (backup if args.cmd == "backup" else restore)(db, file)
    said = {"backup": f"saved to {file}",
            "restore": f"restored from {file}; now run: gateway reconcile --apply"}[args.cmd]
    _print(args, {"file": str(file), "done": args.cmd}, said)
    return 0


def cmd_sim(args: argparse.Namespace, s: Settings) -> int:
    import sim
    given = any(a == "--port" or a.startswith("--port=") for a in args.rest)
    port = [] if given else ["--port", str(args.port or s.port_of("simulators"))]
    sim.main(port + args.rest)
    return 0


def cmd_catalog(args: argparse.Namespace, s: Settings) -> int:
    """``gateway catalog apply FILE [--force]`` (control/catalog_apply.py)."""
    import asyncpg
    from core.alias_policy import describe, when_text
    from .catalog_apply import Refused, apply
    db = _urls(s)[0]
    try:
        changes = asyncio.run(apply(args.file, s.catalog, db, args.force))
    except Refused as e:
        print("\n".join(f"gateway: refused: {line}" for line in str(e).splitlines())
              + "\ngateway: nothing applied (--force applies it anyway, logged and recorded)", file=sys.stderr)
        return 2
    except (asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError, asyncio.TimeoutError) as e:
        raise AdminError(db_problem(db, e)) from None
    rows = [{"alias": c.alias, "effective": c.effective, "before": describe(c.before), "after": describe(c.after)}
            for c in changes]
    lines = [f"announced: {r['alias']} from {when_text(c.effective)}: {r['before']} -> {r['after']}"
             for r, c in zip(rows, changes)]
    _print(args, {"applied": True, "model_changes": rows}, "\n".join([*lines, f"applied: {s.catalog}"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print JSON")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the whole stack in the foreground")
    up.add_argument("--port", type=int)
    sm = sub.add_parser("sim", help="run the model-server simulator")
    sm.add_argument("--port", type=int, help=f"default: GATEWAY_PORT + {PORT_OFFSETS['simulators']}, the demo catalog's sim-a")
    sm.add_argument("rest", nargs=argparse.REMAINDER)
    org = sub.add_parser("org").add_subparsers(dest="sub", required=True)
    oc = org.add_parser("create"); oc.add_argument("name"); oc.add_argument("--balance", default="0")
    for n in ("suspend", "reactivate"):
        org.add_parser(n).add_argument("org")
    ol = org.add_parser("limits", help="set the organisation's limits; without a flag, print those in force")
    ol.add_argument("org")
    ol.add_argument("--rpm", type=int, help="requests per minute for EACH key of the organisation (a key's own "
                    "limit, 'gateway key limits', wins); default GATEWAY_DEFAULT_RPM")
    ol.add_argument("--concurrency", type=int, help="requests in flight at once for the WHOLE organisation "
                    "(all its keys together); default GATEWAY_DEFAULT_CONCURRENCY")
    ol.add_argument("--credit-limit", metavar="PLN", help="how far below zero the balance may go once the"
                    " organisation has paid: an amount in PLN, none (no limit) or default"
                    " (GATEWAY_CREDIT_LIMIT_PLN's)")
    add_inventory_commands(org, "org")
    key = sub.add_parser("key").add_subparsers(dest="sub", required=True)
    kc = key.add_parser("create"); kc.add_argument("org")
    key.add_parser("revoke").add_argument("key_id")
    kl = key.add_parser("limits", help="set the key's own limits (at least one flag; none lifts a limit)")
    kl.add_argument("key_id")
    kl.add_argument("--rpm", type=int, help="requests per minute for this key alone")
    for kp in (kc, kl):
        kp.add_argument("--monthly-limit", metavar="PLN", help="the most the key may spend in a calendar month"
                        " (Europe/Warsaw), in PLN; none: no limit")
        kp.add_argument("--models", metavar="A,B", help="the only aliases the key may use, comma-separated;"
                        " none: every alias")
        kp.add_argument("--expires", metavar="YYYY-MM-DD", help="the last day the key works (Europe/Warsaw);"
                        " none: never")
    add_inventory_commands(key, "key")
    bal = sub.add_parser("balance").add_subparsers(dest="sub", required=True)
    bc = bal.add_parser("credit"); bc.add_argument("org"); bc.add_argument("pln")
    bc.add_argument("--ref", help="idempotency reference: the same reference credits once")
    bal.add_parser("show").add_argument("org")
    sub.add_parser("status", help="health of every component")
    mg = sub.add_parser("migrate", help="apply the PostgreSQL migrations to DATABASE_URL, then exit")
    mg.add_argument("--wait", type=float, default=60.0, help="seconds to wait for PostgreSQL to accept (60)")
    sub.add_parser("backup", help="save PostgreSQL (the record) to FILE (pg_dump's custom format)").add_argument("file")
    sub.add_parser("restore", help="put a backup FILE back in place of what PostgreSQL holds; then run"
                   " gateway reconcile --apply").add_argument("file")
    sub.add_parser("reconcile", help="compare Redis's working balances with the ledger (a dry run); --apply"
                   " mends them").add_argument("--apply", action="store_true", help="move each balance by its drift")
    ca = sub.add_parser("catalog").add_subparsers(dest="sub", required=True).add_parser(
        "apply", help="put a new catalog in force (GATEWAY_CATALOG) under the alias change policy")
    ca.add_argument("file"); ca.add_argument("--force", action="store_true",
                                             help="apply a model change announced under 14 days ahead or a"
                                             " smaller limit (logged and recorded as forced)")
    us = sub.add_parser("usage"); us.add_argument("org"); us.add_argument("--limit", type=int, default=50)
    us.add_argument("--status", default="", help="ok, errors, or a status code (e.g. 429)")
    us.add_argument("--request-id", default="", help="the request id of a reply or an error")
    invoices = sub.add_parser("invoices", help="an organisation's VAT invoices and corrections, and their way"
                              " to KSeF").add_subparsers(dest="sub", required=True)
    invoices_cli.add_commands(invoices)
    for sp in [*sub.choices.values(), *org.choices.values(), *key.choices.values(), *bal.choices.values(), ca,
               *invoices.choices.values()]:
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:  # every option after "sim" is the simulator's own (python -m sim --help)
        args = argparse.Namespace(cmd="sim", rest=argv[1:])
    else:
        args = p.parse_args(argv)
    try:
        s = Settings.from_env()
        commands = {"up": cmd_up, "sim": cmd_sim, "status": cmd_status, "catalog": cmd_catalog,
                    "backup": cmd_backup, "restore": cmd_backup, "migrate": cmd_migrate}
        if (cmd := commands.get(args.cmd)) is not None:
            return cmd(args, s)
        return int(asyncio.run(_with_admin(s, lambda a: _inventory_cmd(args, a, s))))
    except (AdminError, CatalogError, RedisUrlError, ConfigError, SettingsError) as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 2
    except (OSError, asyncio.TimeoutError) as e:  # a server gone in the middle of a command, a port taken
        print(f"gateway: {args.cmd} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def add_inventory_commands(group: Any, noun: str) -> None:
    """``gateway org list``, ``org show ORG`` / ``key list ORG`` (control/inventory.py)."""
    if noun == "org":
        group.add_parser("list", help="every organisation: balance, limits in force, active keys")
        group.add_parser("show", help="one organisation: balance, limits in force, keys").add_argument("org")
    else:
        group.add_parser("list", help="the organisation's keys (never the keys themselves)").add_argument("org")


async def _inventory_cmd(args: argparse.Namespace, a: Admin, s: Settings) -> int:
    """The read-only commands, and the limits in force after (or without) ``org limits``' flags; every other
    command is ``_admin_cmd``'s."""
    from . import inventory as inv
    d = inv.Defaults(rpm=s.default_rpm, concurrency=s.default_concurrency)
    c, sc = args.cmd, getattr(args, "sub", None)
    if c == "org" and sc == "limits":
        flags = {k: v for k, v in vars(args).items() if k not in ("cmd", "sub", "org", "json") and v is not None}
        if flags:
            await _admin_cmd(args, a, s)
        o = await inv.show_org(a.pool, a.r, args.org, d)
        b = await a.balance(args.org)
        limits = {k: v for k, v in o.items() if k.startswith(("rpm", "concurrency"))}
        _print(args, {"id": o["id"], **limits, **{k: b[k] for k in _CREDIT_FIELDS}},
               f"{inv.limit_lines(o)}\n{_credit_text(b)}")
    elif c == "org" and sc == "list":
        orgs = await inv.list_orgs(a.pool, a.r, d)
        _print(args, orgs, inv.orgs_table(orgs))
    elif c == "org" and sc == "show":
        o = await inv.show_org(a.pool, a.r, args.org, d)
        b = await a.balance(args.org)
        _print(args, {**o, **{k: b[k] for k in _CREDIT_FIELDS}}, f"{inv.org_lines(o)}\n{_credit_text(b)}")
    elif c == "key" and sc == "list":
        keys = await inv.list_keys(a.pool, args.org, d)
        _print(args, keys, inv.keys_table(keys))
    elif c == "invoices" and sc in invoices_cli.COMMANDS:
        return await invoices_cli.run(args, a, s)
    else:
        return await _admin_cmd(args, a, s)
    return 0


def cmd_migrate(args: argparse.Namespace, s: Settings) -> int:
    """``gateway migrate``: the schema brought up to date on DATABASE_URL (or the running stack's)."""
    import asyncpg

    from .launcher import migrate
    db = s.database_url or _urls(s)[0]
    try:
        version = asyncio.run(migrate(db, timeout=args.wait))
    except StartError as e:
        raise AdminError(str(e)) from None
    except (ValueError, asyncpg.InterfaceError, asyncpg.PostgresError) as e:
        raise AdminError(db_problem(db, e)) from None
    _print(args, {"schema_version": version}, f"schema at version {version}")
    return 0


async def _admin_cmd(args: argparse.Namespace, a: Admin, s: Settings) -> int:
    c, sc = args.cmd, getattr(args, "sub", None)
    if c == "org" and sc == "create":
        oid = await a.create_org(args.name, pln_to_micro(args.balance))
        _print(args, {"id": oid}, oid)
    elif c == "org" and sc in ("suspend", "reactivate"):
        await a.set_status(args.org, "suspended" if sc == "suspend" else "active")
        _print(args, {"id": args.org, "status": "suspended" if sc == "suspend" else "active"}, "ok")
    elif c == "org" and sc == "limits":
        limit = None if args.credit_limit is None else _credit_limit(args.credit_limit)
        await a.set_limits(args.org, args.rpm, args.concurrency)
        if limit is not None:
            await a.set_credit_limit(args.org, limit)  # the limits in force printed by _inventory_cmd
    elif c == "key" and sc == "create":
        kid, k = await a.create_key(args.org, limits=_key_limits(args, s))
        shown = await a.key_limits(kid)
        _print(args, {**shown, "key": k}, f"{kid}\n{k}\n(the key is shown once; store it now)"
               + "".join(f"\n{line}" for line in key_limit_lines(shown, only_set=True)))
    elif c == "key" and sc == "revoke":
        await a.revoke_key(args.key_id)
        _print(args, {"id": args.key_id, "revoked": True}, "revoked")
    elif c == "key" and sc == "limits":
        change = _key_limits(args, s)
        if args.rpm is None and change.empty:
            raise AdminError("give at least one of --rpm, --monthly-limit, --models, --expires")
        await a.set_key_limits(args.key_id, args.rpm, change)
        shown = await a.key_limits(args.key_id)
        _print(args, shown, "\n".join(key_limit_lines(shown)))
    elif c == "balance" and sc == "credit":
        new = await a.credit(args.org, pln_to_micro(args.pln), ref=args.ref)
        b = await a.balance(args.org)
        _print(args, {**b, "credited": new}, f"{'credited' if new else 'already credited'}; balance {b['balance_pln']} PLN")
    elif c == "balance" and sc == "show":
        b = await a.balance(args.org)
        apart = ("" if b["balance_micro_pln"] == b["ledger_micro_pln"] else
                 f" (ledger {micro_to_pln(b['ledger_micro_pln'])} PLN: records in flight, or apart - gateway reconcile)")
        _print(args, b, f"{b['balance_pln']} PLN{apart}; {_credit_text(b)}")
    elif c == "reconcile":
        return await _reconcile(args, a)
    elif c == "usage":
        rows = await a.usage(args.org, args.limit, status=args.status, request_id=args.request_id)
        lines = [f"{r['started_at']}  {r['request_id']}  {r['alias'] or '-':<12} {r['status']}"
                 f"{' ' + r['error_code'] if r['error_code'] else ''}  {r['latency_ms']} ms  "
                 f"in={r['prompt_tokens']} out={r['completion_tokens']}  "
                 f"{micro_to_pln(r['cost_micro_pln'])} PLN{'  (estimated)' if r['estimated'] else ''}"
                 for r in rows]
        _print(args, rows, "\n".join(lines) or "no requests yet")
    return 0


async def _reconcile(args: argparse.Namespace, a: Admin) -> int:
    """Exit 1 when a dry run found balances apart (as diff does), else 0."""
    from .reconcile import reconcile
    found = await reconcile(a.pool, a.r, apply=args.apply)
    lines = [f"{d.org}  Redis {micro_to_pln(d.redis_micro_pln)}  ledger {micro_to_pln(d.ledger_micro_pln)}"
             f"  queued {micro_to_pln(d.queued_micro_pln)}  drift {micro_to_pln(d.drift_micro_pln)} PLN"
             f"{'  repaired' if d.repaired else ''}" for d in found]
    _print(args, [d.as_dict() for d in found], "\n".join(lines) or "every cached balance agrees with the ledger")
    return 1 if found and not args.apply else 0


_CREDIT_FIELDS = ("paid", "credit_limit_micro_pln", "credit_limit_pln", "credit_limit_own", "held_micro_pln")


def _key_limits(args: argparse.Namespace, s: Settings) -> key_limits.Change:
    """--monthly-limit, --models and --expires as a change of the key's limits (AdminError: malformed, or
    an alias the catalog does not have)."""
    from core import catalog as catalog_mod
    known = None if args.models is None else catalog_mod.load(s.catalog).aliases
    try:
        return key_limits.parse(args.monthly_limit, args.models, args.expires, known)
    except ValueError as e:
        raise AdminError(str(e)) from None


def key_limit_lines(k: dict[str, Any], only_set: bool = False) -> list[str]:
    """A key's own limits and spend this month, one line each (``only_set``: only the limits it has)."""
    lines = [("monthly limit", None if k["monthly_limit_pln"] is None else f"{k['monthly_limit_pln']} PLN"),
             ("models", None if k["models"] is None else ",".join(k["models"])),
             ("expires", None if k["expires"] is None else f"{k['expires']} (the last day it works, Europe/Warsaw)")]
    if only_set:
        return [f"{name:<14}{value}" for name, value in lines if value is not None]
    rpm = "the organisation's" if k["rpm"] is None else str(k["rpm"])
    return [f"{'rpm':<14}{rpm}",
            *(f"{name:<14}{value if value is not None else 'none'}" for name, value in lines),
            f"{'spent':<14}{k['spent_this_month_pln']} PLN this month"]


def _credit_limit(text: str) -> CreditLimit:
    """--credit-limit's value: none, default, or an amount in PLN."""
    word = text.strip().lower()
    if word == "none":
        return "none"
    if word == "default":
        return "default"
    return pln_to_micro(text)


def _credit_text(b: dict[str, Any]) -> str:
    """The credit limit in force, and why, in words."""
    if not b["paid"]:
        return "credit limit 0.000000 PLN (until the organisation pays: trial credit only)"
    if b["credit_limit_pln"] is None:
        return "no credit limit" + (" (its own)" if b["credit_limit_own"] == "none" else "")
    own = " (its own)" if b["credit_limit_own"] != "default" else " (GATEWAY_CREDIT_LIMIT_PLN)"
    return f"credit limit {b['credit_limit_pln']} PLN{own}"


if __name__ == "__main__":
    sys.exit(main())
