"""Every port a stack opens, with the setting that moves it: the one table ``gateway up`` checks before it
starts anything, so that a port already taken stops the start with one line naming the port and the
variable, instead of a component crash-looping (or, worse, a second stack's requests reaching the first
stack's simulators).

The defaults are relative to GATEWAY_PORT (the properties of the settings classes say by how much), and so
are the embedded simulators' ports (the catalog's ``port_offset``): two stacks with different GATEWAY_PORTs
share nothing.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

from extproc.catalog import Catalog

from .settings import Settings

LOOPBACK = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class PortUse:
    port: int
    what: str     # who listens there
    setting: str  # what moves it
    host: str = "127.0.0.1"


def _derived(var: str, own: int, offset: int) -> str:
    return var if own else f"{var}, or GATEWAY_PORT (it is GATEWAY_PORT + {offset} by default)"


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
    from .envoy_config import extproc_workers
    uses = [PortUse(s.gateway_port, "Envoy's listener", "GATEWAY_PORT", s.gateway_host or "0.0.0.0"),
            PortUse(s.envoy_admin_port, "Envoy's admin", _derived("GATEWAY_ADMIN_PORT", s.admin_port, 11)),
            PortUse(s.console_http_port, "the console", _derived("GATEWAY_CONSOLE_PORT", s.console_port, 1)),
            PortUse(s.writer_metrics_http_port, "the usage writer's metrics",
                    _derived("GATEWAY_WRITER_METRICS_PORT", s.writer_metrics_port, 14))]
    for name, grpc_port, metrics_port in extproc_workers(s):
        uses += [PortUse(grpc_port, f"{name}'s gRPC", _derived("GATEWAY_EXTPROC_PORT", s.extproc_port, 10)),
                 PortUse(metrics_port, f"{name}'s metrics", _derived("GATEWAY_METRICS_PORT", s.metrics_port, 1384))]
    if not s.database_url:
        uses.append(PortUse(s.pg_port or s.gateway_port + 12, "the embedded PostgreSQL",
                            _derived("GATEWAY_PG_PORT", s.pg_port, 12)))
    if not s.redis_url:
        uses.append(PortUse(s.redis_port or s.gateway_port + 13, "the embedded Redis",
                            _derived("GATEWAY_REDIS_PORT", s.redis_port, 13)))
    if s.dev and not s.smtp_host:
        uses.append(PortUse(s.smtp_capture_port, "the development mail capture", "GATEWAY_PORT (+ 18)"))
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
