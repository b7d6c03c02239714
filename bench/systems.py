"""Starting each system of the comparison on the same fixed-reply upstream."""
from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import envoys
from .envoys import Upstream
from . import fixtures as fx
from . import litellm_env
from .procs import Procs, free_port, http_ok, port_open

ROOT = Path(__file__).resolve().parent.parent
ENVOY = str(Path(sys.executable).parent / "envoy")
LITELLM_KEY = "sk-bench-master"


@dataclass
class System:
    name: str
    label: str
    port: int
    key: str = "sk-bench-none"
    sse_port: int | None = None  # "direct" only: the streaming listener of the upstream
    pid: int | None = None  # the ext_proc process, where there is one
    envoy_pid: int | None = None  # the proxy's Envoy, where there is one
    note: str = ""
    expect_alias: bool = True  # replies carry the client's model name (the proxy put it back)
    extra: dict[str, Any] = field(default_factory=dict)

    def url(self, scenario: str) -> str:
        port = self.sse_port if scenario == "stream" and self.sse_port else self.port
        return f"http://127.0.0.1:{port}"


def start_envoy(procs: Procs, name: str, doc: dict[str, Any], tmp: Path, port: int, admin: int) -> int:
    cfg = envoys.write(doc, tmp / f"{name}.yaml")
    p = procs.start(name, [ENVOY, "-c", str(cfg), "--concurrency", "1", "--log-level", "warn",
                           "--disable-hot-restart"])
    procs.wait_ready(name, lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), 30)
    return p.pid


def start_upstream(procs: Procs, tmp: Path) -> Upstream:
    j, s, a = free_port(), free_port(), free_port()
    start_envoy(procs, "upstream", envoys.upstream(j, s, a), tmp, j, a)
    return Upstream(j, s)


def direct(up: Upstream) -> System:
    return System("direct", "direct to upstream", up[0], sse_port=up[1], expect_alias=False,
                  note="wrk straight to the fixed-reply Envoy")


def start_bare(procs: Procs, tmp: Path, up: Upstream) -> System:
    p, a = free_port(), free_port()
    envoy = start_envoy(procs, "bare-envoy", envoys.proxy(p, a, up, tmp / "bare-access.log"), tmp, p, a)
    return System("bare_envoy", "bare Envoy", p, expect_alias=False, envoy_pid=envoy,
                  note="same listener/route/cluster shape as the gateway, no ext_proc")


def start_minimal(procs: Procs, tmp: Path, up: Upstream, server: str = "grpcio") -> System:
    """The minimal pass-through processor behind an Envoy of its own; ``server``: the gRPC server it runs
    on (grpcio, the reference; or own, grpclib: bench/grpc_servers.py)."""
    g, p, a = free_port(), free_port(), free_port()
    suffix = "" if server == "grpcio" else f"-{server}"
    # Envoy reaches it by a Unix socket, as the gateway's Envoy reaches the gateway's ext_proc under
    # `gateway up` (its TCP port answers the readiness check)
    sock = tmp / f"minimal{suffix}.sock"
    proc = procs.start(f"minimal-extproc{suffix}", [sys.executable, "-m", "bench.minimal_extproc", "--port", str(g),
                                                    "--server", server, "--unix", str(sock)], cwd=str(ROOT))
    procs.wait_ready(f"minimal-extproc{suffix}", lambda: port_open(g) and sock.exists(), 30)
    envoy = start_envoy(procs, f"minimal-envoy{suffix}",
                        envoys.proxy(p, a, up, tmp / f"minimal{suffix}-access.log", g, extproc_unix=sock), tmp, p, a)
    if server == "grpcio":
        return System("minimal_extproc", "minimal ext_proc", p, pid=proc.pid, envoy_pid=envoy,
                      note="bench/minimal_extproc.py behind the gateway's ext_proc filter settings",
                      extra={"grpc_port": g})
    return System(f"minimal_{server}", f"minimal ext_proc on {server}", p, pid=proc.pid, envoy_pid=envoy,
                  note=f"bench/minimal_extproc.py --server {server}", extra={"grpc_port": g})


# ---- the gateway: the real stack ------------------------------------------------------------
def gateway_catalog(up: Upstream) -> dict[str, Any]:
    price = [{"effective": "2026-01-01T00:00:00Z", "input_micro_pln_per_1m": 800000,
              "output_micro_pln_per_1m": 1600000}]
    chat = {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048, "prices": price}
    cat: dict[str, Any] = {
        "aliases": {
            fx.CHAT_ALIAS: {**chat, "upstreams": [{"model": fx.UP_CHAT}]},
            fx.STREAM_ALIAS: {**chat, "upstreams": [{"model": fx.UP_STREAM}]},
            fx.EMBED_ALIAS: {"capabilities": ["embeddings"], "context_length": 8192, "max_output_tokens": 0,
                             "prices": [{**price[0], "output_micro_pln_per_1m": 0}],
                             "upstreams": [{"model": fx.UP_EMBED}]},
        },
        "upstream_models": {
            fx.UP_CHAT: {"deployments": [{"name": "fixed-json", "host": "127.0.0.1", "port": up.json}]},
            fx.UP_STREAM: {"deployments": [{"name": "fixed-sse", "host": "127.0.0.1", "port": up.sse}]},
            fx.UP_EMBED: {"deployments": [{"name": "fixed-json", "host": "127.0.0.1", "port": up.json}]},
        },
    }
    if up.long:
        cat["aliases"][fx.LONG_ALIAS] = {**chat, "upstreams": [{"model": fx.UP_LONG}]}
        cat["upstream_models"][fx.UP_LONG] = {"deployments": [{"name": "cadenced-sse", "host": "127.0.0.1",
                                                               "port": up.long}]}
    return cat


def start_gateway(tmp: Path, up: Upstream, workers: int = 1, event_loop: str | None = None) -> tuple[System, Any]:
    """The full stack through control.launcher.Stack (Envoy, ext_proc, PostgreSQL, Redis, usage writer);
    only Envoy's worker count is set to 1 like every other Envoy here (the launcher uses 2).
    ``workers``: GATEWAY_EXTPROC_WORKERS (ext_proc processes behind that one Envoy)."""
    from control.admin import Admin
    from control.ports import extproc_workers
    from control.launcher import Stack, bindable, free_port_base
    from control.procs import Proc
    from control.settings import Settings

    class BenchStack(Stack):
        def _envoy_proc(self) -> Proc:
            p = super()._envoy_proc()
            if "--concurrency" in p.argv:
                p.argv[p.argv.index("--concurrency") + 1] = "1"
            else:
                p.argv += ["--concurrency", "1"]
            return p

    cat = tmp / "gateway-catalog.yaml"
    cat.write_text(yaml.safe_dump(gateway_catalog(up)))
    for _ in range(50):
        base = free_port_base()
        # A later stack (another worker count) reuses the state directory: no second initdb.
        settings = Settings.from_env(gateway_port=base, gateway_host="127.0.0.1", state_dir=str(tmp / "gateway"),
                                     extproc_workers=workers, **({"event_loop": event_loop} if event_loop else {}),
                                     catalog=str(cat), database_url="", redis_url="", extproc_port=0,
                                     admin_port=0, pg_port=0, redis_port=0, run_sim=False, dev=True,
                                     default_rpm=1_000_000_000, default_concurrency=1_000_000)
        # the ports derived beyond the base's span (the metrics ports; each further ext_proc process's) free
        # too: a taken one failed a whole `make bench` run at its 2-process cell
        if all(bindable(p) for _, grpc, metrics in extproc_workers(settings) for p in (grpc, metrics)):
            break
    else:
        raise RuntimeError("no free port range for the gateway's ext_proc processes")
    # The ext_proc child reads its limits from the environment; earlier launchers passed it only
    # ports, state, catalog and URLs, so the overrides are put in the environment too (same values).
    os.environ["GATEWAY_DEFAULT_RPM"] = str(settings.default_rpm)
    os.environ["GATEWAY_DEFAULT_CONCURRENCY"] = str(settings.default_concurrency)
    os.environ["GATEWAY_RUN_SIM"] = "0"
    stack = BenchStack(settings)
    try:
        stack.start()
    except BaseException:
        stack.stop()
        raise

    async def make_key() -> tuple[str, str]:
        import asyncpg
        from core.redis_client import redis_client
        pool = await asyncpg.create_pool(stack.database_url, min_size=1, max_size=2)
        r = redis_client(stack.redis_url, 2)
        try:
            admin = Admin(pool, r)
            org = await admin.create_org("bench", 10**15)  # a billion PLN: never runs out
            _, key = await admin.create_key(org)
            return org, key
        finally:
            await pool.close()
            await r.aclose()

    try:
        org, key = asyncio.run(make_key())
    except BaseException:
        stack.stop()
        raise
    pid, envoy = (p.pid for p in (stack.procs["extproc"].popen, stack.procs["envoy"].popen) if p is not None)
    if workers == 1:
        return System("gateway", "gateway (full stack)", base, key=key, pid=pid, envoy_pid=envoy,
                      note="control.launcher.Stack: Envoy + ext_proc + Redis + PostgreSQL + usage writer",
                      extra={"org": org}), stack
    return System(f"gateway_w{workers}", f"gateway, {workers} ext_proc processes (GATEWAY_EXTPROC_WORKERS={workers})",
                  base, key=key, pid=pid, envoy_pid=envoy, note=f"the same stack with {workers} ext_proc processes behind its one "
                  "Envoy (least-request balancing)", extra={"org": org, "workers": workers}), stack


# ---- LiteLLM ----------------------------------------------------------------------------------
def ensure_litellm(log: Path) -> str | None:
    """The litellm binary of bench/.venv-litellm (bench/litellm_env.py), installed there if needed."""
    return litellm_env.ensure(log)


def launch_litellm(procs: Procs, tmp: Path, up: Upstream, binary: str) -> System:
    port = free_port()
    api = lambda p: f"http://127.0.0.1:{p}/v1"  # noqa: E731
    cfg = {"model_list": [
        {"model_name": fx.CHAT_ALIAS, "litellm_params": {"model": f"openai/{fx.UP_CHAT}", "api_base": api(up[0]),
                                                          "api_key": "sk-none"}},
        {"model_name": fx.STREAM_ALIAS, "litellm_params": {"model": f"openai/{fx.UP_STREAM}",
                                                            "api_base": api(up[1]), "api_key": "sk-none"}},
        {"model_name": fx.EMBED_ALIAS, "litellm_params": {"model": f"openai/{fx.UP_EMBED}", "api_base": api(up[0]),
                                                           "api_key": "sk-none"}}]}
    if up.long:
        cfg["model_list"].append({"model_name": fx.LONG_ALIAS, "litellm_params": {
            "model": f"openai/{fx.UP_LONG}", "api_base": api(up.long), "api_key": "sk-none"}})
    path = tmp / "litellm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    workers = os.cpu_count() or 1
    p = procs.start("litellm", litellm_env.proxy_argv(binary, path, port, workers),
                    env=litellm_env.proxy_env(LITELLM_KEY), cwd=str(tmp))
    return System("litellm", "LiteLLM proxy", port, key=LITELLM_KEY,
                  note=f"litellm[proxy], {workers} workers (one per core), no database",
                  extra={"pgid": p.pid})  # its process group: the proxy and its workers


def litellm_ready(port: int) -> bool:
    return http_ok(f"http://127.0.0.1:{port}/health/liveliness")
