"""Renders Envoy's bootstrap (envoy/envoy.yaml, a template) and the model-server clusters (from the catalog)."""
from __future__ import annotations

import contextlib
import copy
import ipaddress
import json
import os
from pathlib import Path
from string import Template
from typing import Any

import yaml

from core import errors
from core.catalog import Catalog, CatalogError, load
from core.endpoints import REGISTRY, Registry

from .embedded import PRIVATE_DIR, write_private
from .ports import extproc_workers
from .settings import Settings

# envoy/ at the repository root, shipped in the control package (control/envoy links to it)
TEMPLATE = Path(__file__).resolve().parent / "envoy" / "envoy.yaml"
SSE_RELAY = TEMPLATE.parent / "sse_relay.lua"  # Envoy's relay of a streamed reply (Lua)


def _extproc_endpoints(s: Settings) -> str:
    """The extproc cluster's endpoints, one per worker (its Unix socket where GATEWAY_EXTPROC_UNIX gives
    one, else its TCP port), as a YAML flow list for the template."""
    def address(port: int) -> str:
        unix = s.extproc_socket(port)
        if unix is None:
            return "{socket_address: {address: 127.0.0.1, port_value: %d}}" % port
        return "{pipe: {path: %s}}" % json.dumps(str(unix))  # (a JSON string is a YAML one)
    return "[" + ", ".join("{endpoint: {address: %s}}" % address(g) for _, g, _ in extproc_workers(s)) + "]"


def access_log_path(s: Settings) -> str:
    """Where Envoy writes its access log: GATEWAY_ENVOY_ACCESS_LOG (the image: /dev/stdout), else a file in
    the state directory's logs."""
    return s.envoy_access_log or str(s.state / "logs" / "envoy-access.log")


def error_bodies() -> dict[str, str]:
    """The template's Envoy reply bodies: ``REQ_<NAME>`` / ``RESP_<NAME>`` is the JSON body of
    ``core.errors.<NAME>`` with Envoy's request id (the request's, or the one its reply minted), as a
    YAML scalar (the same text the bootstrap had when these were written by hand): every message a client
    can see is written in errors.py alone."""
    out = {}
    for name, e in vars(errors).items():
        if isinstance(e, errors.ApiError):
            for src in ("REQ", "RESP"):
                body = e.body(f"%{src}(X-REQUEST-ID)%").decode()
                out[f"{src}_{name}"] = "'" + body.replace("'", "''") + "'"  # YAML's single-quoted scalar
    return out


def render_bootstrap(s: Settings, endpoints: Registry = REGISTRY) -> str:
    text = Template(TEMPLATE.read_text()).substitute(
        **error_bodies(),
        STATE=str(s.state), HOST=s.gateway_host, PORT=s.gateway_port, ADMIN_PORT=s.envoy_admin_port,
        EXTPROC_PORT=s.grpc_port, EXTPROC_ENDPOINTS=_extproc_endpoints(s), REPLY_LIMIT=s.max_reply_bytes,
        # Envoy's idle timer (a backstop: the ext_proc keeps the real one from the start of the reply) runs
        # from the start of the upstream request: it may not fire before both tries had their first-byte budget
        TOTAL_TIMEOUT=s.total_timeout_s, IDLE_TIMEOUT=max(s.idle_timeout_s, 2 * s.first_byte_timeout_s + 1),
        FIRST_BYTE_TIMEOUT=s.first_byte_timeout_s, HEADERS_TIMEOUT=s.request_headers_timeout_s,
        CONNECTION_IDLE_TIMEOUT=s.connection_idle_timeout_s, MAX_CONNECTIONS=s.max_connections,
        MAX_STREAMS=s.max_streams_per_connection, TRUSTED_HOPS=trusted_hops(s), SSE_RELAY=str(SSE_RELAY),
        EXTPROC_LIMIT=2 * s.max_connections, ACCESS_LOG=access_log_path(s))
    doc = yaml.safe_load(text)
    with_endpoint_routes(doc, endpoints)
    if s.extproc_workers > 1:
        with_extproc_failover(doc)
    if s.otlp_endpoint:
        with_tracing(doc, s.otlp_endpoint)
    return yaml.safe_dump(doc, sort_keys=False)


# A request with a body: a POST whose length cannot be zero (a positive number written plainly)
_WITH_BODY = [{"name": ":method", "string_match": {"exact": "POST"}},
              {"name": "content-length", "string_match": {"safe_regex": {"regex": "[1-9][0-9]*"}}}]


def with_endpoint_routes(doc: dict[str, Any], endpoints: Registry) -> None:
    """Two routes per endpoint, first in the route table (envoy/envoy.yaml says why two), each with the
    upstream and ext_proc settings of the template's first route: one for a POST with a body, where the
    ext_proc skips the request-headers message, then one for any other request on the path."""
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    [vhost] = hcm["route_config"]["virtual_hosts"]
    routes = vhost["routes"]
    upstream, full = routes[0]["route"], routes[0]["typed_per_filter_config"]
    body_only = copy.deepcopy(full)
    body_only["envoy.filters.http.ext_proc"]["overrides"]["processing_mode"]["request_header_mode"] = "SKIP"
    routes[:0] = [{"name": e.name, "match": {"path": e.path, "headers": _WITH_BODY}, "route": upstream,
                   "typed_per_filter_config": body_only} for e in endpoints] + [
                  {"name": e.name, "match": {"path": e.path}, "route": upstream, "typed_per_filter_config": full}
                  for e in endpoints]


def with_extproc_failover(doc: dict[str, Any]) -> None:
    """With several ext_proc processes: a request whose gRPC stream could not be opened on one (refused
    connection or stream: a process that has just died, before the health check and the outlier
    detector take it out) opens it on another.  Nothing has been processed then, so it is safe; a
    stream broken after it started is not retried (that request fails with 500 ``internal_error``)."""
    for listener in doc["static_resources"]["listeners"]:
        for chain in listener.get("filter_chains", []):
            for f in chain.get("filters", []):
                for hf in f.get("typed_config", {}).get("http_filters", []):
                    tc = hf.get("typed_config", {})
                    svc = tc.get("extension_config", {}).get("typed_config", tc).get("grpc_service", {})
                    if svc.get("envoy_grpc", {}).get("cluster_name") == "extproc" and "retry_policy" not in svc:
                        svc["retry_policy"] = {
                            "retry_on": "connect-failure,refused-stream", "num_retries": 2,
                            "retry_host_predicate": [{
                                "name": "envoy.retry_host_predicates.previous_hosts",
                                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host."
                                                          "previous_hosts.v3.PreviousHostsPredicate"}}],
                            "host_selection_retry_max_attempts": 3}


def with_tracing(doc: dict[str, Any], endpoint: str) -> None:
    """OpenTelemetry traces (off unless an OTLP/gRPC collector is configured): a span per request and
    one per upstream try, W3C ``traceparent`` propagated upstream, attributes from metadata only."""
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
    static = doc.setdefault("layered_runtime", {"layers": [{"name": "static", "static_layer": {}}]})["layers"][0]
    static["static_layer"]["tracing.opentelemetry.flush_interval_ms"] = 1000


def trusted_hops(s: Settings) -> int:
    """How many proxies in front of the gateway append to X-Forwarded-For (GATEWAY_TRUSTED_HOPS): the
    client's address is the one the outermost of them appended; 0: the socket's peer, whatever a
    client writes in that header."""
    if s.trusted_hops < 0:
        raise ValueError(f"GATEWAY_TRUSTED_HOPS must be 0 or more, not {s.trusted_hops}")
    return s.trusted_hops


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


# Where the system's CA bundle is, on the usual distributions (Debian/Ubuntu/Alpine, Fedora/RHEL, others).
SYSTEM_CA_FILES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                   "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem")


def system_ca_file() -> str:
    for path in SYSTEM_CA_FILES:
        if os.path.isfile(path):
            return path
    with contextlib.suppress(ImportError):  # Mozilla's bundle, where pip put it (requests and httpx bring it)
        import certifi  # type: ignore[import-not-found,unused-ignore]
        return str(certifi.where())
    raise CatalogError("no system CA bundle found (looked in " + ", ".join(SYSTEM_CA_FILES) +
                     "): give the TLS deployment a ca_file")


def _tls_socket(ca_file: str | None, sni: str | None) -> dict[str, Any]:
    """Envoy's upstream TLS context: the server's certificate verified against ``ca_file`` (default: the
    system's bundle) and, when there is one, its name against ``sni``."""
    ctx: dict[str, Any] = {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                           "common_tls_context": {"validation_context": {
                               "trusted_ca": {"filename": str(Path(ca_file).resolve()) if ca_file
                                              else system_ca_file()}}}}
    if sni is not None:
        ctx["sni"] = sni
        ctx["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"] = [
            {"san_type": "DNS", "matcher": {"exact": sni}}]
    return {"name": "envoy.transport_sockets.tls", "typed_config": ctx}


def _with_key(key_env: str) -> dict[str, Any]:
    """The model server's bearer key, set on the way out by an upstream filter of the cluster, after the
    client's own Authorization was removed (envoy.yaml): Envoy reads it from its environment, so the key
    is in no file, no configuration dump and no log, only in the variable named by the catalog."""
    if not os.environ.get(key_env):
        raise CatalogError(f"api_key_env: the environment variable {key_env} is not set (or empty)")
    return {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http_protocol_options": {}},
        "http_filters": [
            {"name": "envoy.filters.http.header_mutation", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"append": {
                    "header": {"key": "authorization", "value": f"Bearer %ENVIRONMENT({key_env})%"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]}}},
            {"name": "envoy.filters.http.upstream_codec", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"}}]}}


def clusters(cat: Catalog, s: Settings) -> list[dict[str, Any]]:
    out = []
    for model, deps in sorted(cat.deployments.items()):
        name = Catalog.cluster_name(model)
        # TLS per deployment: each distinct TLS setting is a transport socket that the deployments having
        # it select by their metadata; a deployment without TLS gets the cluster's plain socket.
        profiles: dict[tuple[str | None, str | None], int] = {}
        endpoints = []
        for d in deps:
            ep: dict[str, Any] = {"endpoint": {
                "address": {"socket_address": {"address": d.host, "port_value": d.port_at(s.gateway_port)}},
                # the Host header the model server gets (the route rewrites it: a hosted endpoint
                # behind a shared address routes by it), the TLS server name where there is one
                "hostname": d.sni or d.host}}
            if d.tls:
                # (CA file, server name): the name defaults to the host unless the host is an address
                k = profiles.setdefault((d.ca_file, d.sni or (None if _is_ip(d.host) else d.host)), len(profiles))
                ep["metadata"] = {"filter_metadata": {"envoy.transport_socket_match": {"gateway_tls": str(k)}}}
            endpoints.append(ep)
        cluster: dict[str, Any] = {
            "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "name": name,
            "type": "STATIC" if all(_is_ip(d.host) for d in deps) else "STRICT_DNS",
            "connect_timeout": "2s",
            "per_connection_buffer_limit_bytes": s.max_reply_bytes,
            # per-deployment statistics (requests, errors, connect failures) beside the cluster's own
            "track_cluster_stats": {"per_endpoint_stats": True},
            # one connection per request in flight (HTTP/1.1 model servers): as many as clients may hold,
            # not Envoy's default 1,024 (long streams beyond it would wait for a whole stream)
            "circuit_breakers": {"thresholds": [{"max_connections": s.max_connections,
                                                 "max_pending_requests": s.max_connections,
                                                 "max_requests": s.max_connections}]},
            "outlier_detection": {"consecutive_5xx": 5, "consecutive_local_origin_failure": 2,
                                  "split_external_local_origin_errors": True,
                                  "base_ejection_time": "10s", "max_ejection_percent": 100},
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]},
        }
        if profiles:
            cluster["transport_socket_matches"] = [
                {"name": f"tls-{k}", "match": {"gateway_tls": str(k)}, "transport_socket": _tls_socket(*p)}
                for p, k in profiles.items()]
        key_env = deps[0].api_key_env if deps else None
        if key_env is not None:
            cluster["typed_extension_protocol_options"] = _with_key(key_env)
        out.append(cluster)
    return out


def write_cds(cat: Catalog, s: Settings) -> Path:
    """Atomically replace the CDS file: a running Envoy picks the new clusters up without a restart."""
    d = s.state / "envoy"
    d.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    path = d / "cds.yaml"
    write_private(path, yaml.safe_dump({"version_info": str(os.getpid()) + "-" + str(os.times().elapsed),
                                        "resources": clusters(cat, s)}, sort_keys=False))
    return path


def write_config(s: Settings) -> Path:
    """The clusters of the catalog and the bootstrap, written into the state directory; the bootstrap's path."""
    write_cds(load(s.catalog), s)
    return write_bootstrap(s)


def write_bootstrap(s: Settings) -> Path:
    d = s.state / "envoy"
    d.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    (s.state / "logs").mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    path = d / "bootstrap.yaml"
    write_private(path, render_bootstrap(s))
    return path
