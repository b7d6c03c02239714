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
    text = _substitute(s)
    return with_tracing(text, s.otlp_endpoint) if s.otlp_endpoint else text


def with_tracing(text: str, endpoint: str) -> str:
    """OpenTelemetry traces (off unless an OTLP/gRPC collector is configured): a span per request and
    one per upstream try, W3C ``traceparent`` propagated upstream, attributes from metadata only."""
    doc = yaml.safe_load(text)
    host, _, port = endpoint.rpartition(":")
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["tracing"] = {
        "random_sampling": {"value": 100},
        "spawn_upstream_span": True,
        "custom_tags": [{"tag": "gateway.upstream_cluster", "request_header": {"name": "x-gateway-cluster"}}],
        "provider": {"name": "envoy.tracers.opentelemetry", "typed_config": {
            "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
            "grpc_service": {"envoy_grpc": {"cluster_name": "otlp"}, "timeout": "2s"},
            "service_name": "llm-gateway"}},
    }
    doc["static_resources"]["clusters"].append({
        "name": "otlp", "type": "STRICT_DNS", "connect_timeout": "1s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": "otlp", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": int(port)}}}}]}]}})
    doc["layered_runtime"] = {"layers": [{"name": "static", "static_layer": {
        "tracing.opentelemetry.flush_interval_ms": 1000}}]}
    return yaml.safe_dump(doc, sort_keys=False)


def _substitute(s: Settings) -> str:
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
