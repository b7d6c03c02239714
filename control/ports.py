"""Every port a stack opens, with the setting that moves it: the one table ``gateway up`` checks before it
starts anything, so that a port already taken stops the start with one line naming the port and the
variable, instead of a component crash-looping (or, worse, a second stack's requests reaching the first
stack's simulators).

The defaults are relative to GATEWAY_PORT (by core.settings_base.PORT_OFFSETS, the one table of them), and
so are the embedded simulators' ports (the catalog's ``port_offset``): two stacks with different GATEWAY_PORTs
share nothing.  The ext_proc workers' ports follow the first one's (``extproc_workers``).
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

from core.catalog import Catalog
from core.settings_base import PORT_OFFSETS, SPAN

from .settings import MAX_EXTPROC_WORKERS, Settings

LOOPBACK = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class PortUse:
    port: int
    what: str     # who listens there
    setting: str  # what moves it
    host: str = "127.0.0.1"


# worker k (1 .. N-1) of the ext_proc listens on the first one's gRPC port + WORKER_GRPC + k and metrics port
# + WORKER_METRICS + k: with at most MAX_EXTPROC_WORKERS workers, clear of GATEWAY_PORT .. + SPAN - 1 and each other
WORKER_GRPC, WORKER_METRICS = 100, 200


def _derived(s: Settings, name: str) -> str:
    """What moves the port of setting ``name``: its variable, or GATEWAY_PORT while it is unset."""
    var = Settings.env_vars()[name]
    return var if getattr(s, name) else f"{var}, or GATEWAY_PORT (it is GATEWAY_PORT + {PORT_OFFSETS[name]} by default)"


def extproc_workers(s: Settings) -> list[tuple[str, int, int]]:
    """The ext_proc processes of one gateway instance: (name, gRPC port, metrics port) each.  The first is
    "extproc" on ``GATEWAY_EXTPROC_PORT`` / ``GATEWAY_METRICS_PORT``; worker k (k = 1 .. N-1) is
    "extproc-<k+1>" on gRPC port + WORKER_GRPC + k and metrics port + WORKER_METRICS + k (defaults: 8191..,
    9665..).  Ports that would collide anyway (explicit settings) are refused here."""
    n = s.extproc_workers
    if not 1 <= n <= MAX_EXTPROC_WORKERS:
        raise ValueError(f"GATEWAY_EXTPROC_WORKERS must be 1..{MAX_EXTPROC_WORKERS}, not {n}")
    out = [("extproc", s.grpc_port, s.metrics_http_port)]
    out += [(f"extproc-{k + 1}", s.grpc_port + WORKER_GRPC + k, s.metrics_http_port + WORKER_METRICS + k)
            for k in range(1, n)]
    extra = [p for _, g, m in out[1:] for p in (g, m)]
    taken = {s.gateway_port + i for i in range(SPAN)} | {s.grpc_port, s.metrics_http_port, s.envoy_admin_port,
                                                         s.console_http_port, s.port_of("pg_port"),
                                                         s.port_of("redis_port"), s.writer_metrics_http_port}
    if clash := sorted({p for p in extra if p in taken or extra.count(p) > 1}):
        raise ValueError(f"ext_proc worker ports collide with other ports of the gateway: {clash}")
    return out


def simulators(cat: Catalog, s: Settings) -> dict[tuple[str, int], list[str]]:
    """The loopback deployments the launcher serves with a simulator: (name, port) -> upstream models."""
    out: dict[tuple[str, int], list[str]] = {}
    for model, deps in cat.deployments.items():
        for d in deps:
            if d.host in LOOPBACK:
                out.setdefault((d.name, d.port_at(s.gateway_port)), []).append(model)
    return out


def planned(s: Settings, cat: Catalog | None) -> list[PortUse]:
    """The ports the stack of ``s`` will listen on (with its catalog's simulators when it runs them)."""
    uses = [PortUse(s.gateway_port, "Envoy's listener", "GATEWAY_PORT", s.gateway_host or "0.0.0.0"),
            PortUse(s.envoy_admin_port, "Envoy's admin", _derived(s, "admin_port")),
            PortUse(s.console_http_port, "the console", _derived(s, "console_port")),
            PortUse(s.writer_metrics_http_port, "the usage writer's metrics", _derived(s, "writer_metrics_port"))]
    for name, grpc_port, metrics_port in extproc_workers(s):
        uses += [PortUse(grpc_port, f"{name}'s gRPC", _derived(s, "extproc_port")),
                 PortUse(metrics_port, f"{name}'s metrics", _derived(s, "metrics_port"))]
    if not s.database_url:
        uses.append(PortUse(s.port_of("pg_port"), "the embedded PostgreSQL", _derived(s, "pg_port")))
    if not s.redis_url:
        uses.append(PortUse(s.port_of("redis_port"), "the embedded Redis", _derived(s, "redis_port")))
    if s.dev and not s.smtp_host:
        uses.append(PortUse(s.smtp_capture_port, "the development mail capture",
                            f"GATEWAY_PORT (+ {PORT_OFFSETS['smtp_capture']})"))
    if s.run_sim and cat is not None:
        by_port = {d.port_at(s.gateway_port): d for deps in cat.deployments.values() for d in deps}
        for name, port in simulators(cat, s):
            d = by_port[port]
            how = (f"GATEWAY_PORT (the simulator's port is GATEWAY_PORT + {d.port_offset}: the catalog's "
                   f"port_offset of deployment {name})"
                   if d.port_offset is not None else f"the catalog's port of deployment {name} ({s.catalog})")
            uses.append(PortUse(port, f"the simulator {name}", how))
    return uses


def taken(use: PortUse) -> bool:
    host = "0.0.0.0" if use.host in ("", "::") else use.host
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, use.port))
            return False
        except OSError:
            return True


def first_problem(uses: list[PortUse]) -> str | None:
    """One line about the first port that is taken or given twice, or None."""
    seen: dict[int, PortUse] = {}
    for u in uses:
        if u.port in seen:
            return (f"port {u.port} is both {seen[u.port].what}'s and {u.what}'s; move one with {u.setting}")
        seen[u.port] = u
        if taken(u):
            return f"port {u.port} ({u.what}) is already in use; set {u.setting} to move it"
    return None
