"""Renders Envoy's bootstrap (envoy/envoy.yaml, a template) and the model-server clusters (from the catalog)."""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from string import Template
from typing import Any

import yaml

from extproc.catalog import Catalog
from extproc.settings import Settings

TEMPLATE = Path(__file__).resolve().parent.parent / "envoy" / "envoy.yaml"


def idle_budget(s: Settings) -> float:
    """Envoy's idle timer runs from the start of the upstream request: it may not fire before both
    tries have had their first-byte budget."""
    return max(s.idle_timeout_s, 2 * s.first_byte_timeout_s + 1)


def render_bootstrap(s: Settings) -> str:
    return Template(TEMPLATE.read_text()).substitute(
        STATE=str(s.state), HOST=s.gateway_host, PORT=s.gateway_port, ADMIN_PORT=s.envoy_admin_port,
        EXTPROC_PORT=s.grpc_port, REPLY_LIMIT=s.max_reply_bytes,
        TOTAL_TIMEOUT=s.total_timeout_s, IDLE_TIMEOUT=idle_budget(s),
        FIRST_BYTE_TIMEOUT=s.first_byte_timeout_s)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def clusters(cat: Catalog, s: Settings) -> list[dict[str, Any]]:
    out = []
    for model, deps in sorted(cat.deployments.items()):
        name = Catalog.cluster_name(model)
        out.append({
            "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "name": name,
            "type": "STATIC" if all(_is_ip(d.host) for d in deps) else "STRICT_DNS",
            "connect_timeout": "2s",
            "per_connection_buffer_limit_bytes": s.max_reply_bytes,
            "outlier_detection": {"consecutive_5xx": 5, "consecutive_local_origin_failure": 2,
                                  "split_external_local_origin_errors": True,
                                  "base_ejection_time": "10s", "max_ejection_percent": 100},
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": d.host, "port_value": d.port}}}}
                for d in deps]}]},
        })
    return out


def write_cds(cat: Catalog, s: Settings) -> Path:
    """Atomically replace the CDS file: a running Envoy picks the new clusters up without a restart."""
    d = s.state / "envoy"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "cds.yaml"
    tmp = d / ".cds.yaml.tmp"
    tmp.write_text(yaml.safe_dump({"version_info": str(os.getpid()) + "-" + str(os.times().elapsed),
                                   "resources": clusters(cat, s)}, sort_keys=False))
    os.replace(tmp, path)
    return path


def write_bootstrap(s: Settings) -> Path:
    d = s.state / "envoy"
    d.mkdir(parents=True, exist_ok=True)
    (s.state / "logs").mkdir(parents=True, exist_ok=True)
    path = d / "bootstrap.yaml"
    path.write_text(render_bootstrap(s))
    return path
