"""Envoy configurations of the comparison: the fixed-reply upstream, bare Envoy and the Envoy in front of
the minimal ext_proc.  Bare and minimal share one listener/route/cluster shape copied from the gateway's
envoy/envoy.yaml (buffer filter with the same 20 MiB cap, request-id generation, the same access log
format, the same route timeouts and retry policy); the minimal one adds the gateway's ext_proc filter
with the same settings.  Only what needs the body (choosing the cluster from the model) differs: here a
request header `x-bench-route` picks the upstream listener, as Envoy cannot read the body."""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import yaml

from . import fixtures as fx

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
BUFFER = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
HEADER_MUTATION = "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
HEADER_MUTATION_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutationPerRoute"
FILE_LOG = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"


class Upstream(NamedTuple):
    """Ports of the fixed-reply upstream: JSON replies, the SSE reply, and (0 until started) the cadenced
    long-stream server of bench/long_streams.py."""
    json: int
    sse: int
    long: int = 0


def _admin(port: int) -> dict[str, Any]:
    return {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}


def _cluster(name: str, port: int, *, http2: bool = False, unix: Path | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name, "type": "STATIC", "connect_timeout": "2s",
        "per_connection_buffer_limit_bytes": 65 * 1024 * 1024,
        # Envoy's default circuit breakers allow 1,024 connections, pending and active requests per
        # cluster: a reference that has to hold 2,000 long streams (bench/long_streams.py) must not stop
        # at 1,024 (the gateway's clusters keep the defaults; its figures show what that costs)
        "circuit_breakers": {"thresholds": [{"max_connections": 100_000, "max_pending_requests": 100_000,
                                             "max_requests": 100_000}]},
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"pipe": {"path": str(unix)}} if unix is not None else
                          {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}
    if http2:
        c["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c


def _direct(prefix: str, body: bytes, content_type: str, chunked: bool = False) -> dict[str, Any]:
    r: dict[str, Any] = {"match": {"prefix": prefix},
                         "direct_response": {"status": 200, "body": {"inline_bytes": body}},
                         "response_headers_to_add": [{"header": {"key": "content-type", "value": content_type},
                                                      "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]}
    if chunked:
        # A model server streams with chunked transfer encoding, never with a content-length: the
        # header_mutation filter takes out the one Envoy puts on a direct response.
        r["typed_per_filter_config"] = {"envoy.filters.http.header_mutation": {
            "@type": HEADER_MUTATION_ROUTE,
            "mutations": {"response_mutations": [{"remove": "content-length"}]}}}
    return r


def upstream(json_port: int, sse_port: int, admin_port: int) -> dict[str, Any]:
    """Two listeners of one Envoy: JSON replies (chat, embeddings, models) and the SSE chat stream.  The
    buffer filter reads each request whole first, so connections stay alive after a POST."""
    def listener(name: str, port: int, routes: list[dict[str, Any]]) -> dict[str, Any]:
        return {"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": {
                    "@type": HCM, "stat_prefix": name,
                    "route_config": {"name": name, "max_direct_response_body_size_bytes": 4 * 1024 * 1024,
                                     "virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]},
                    "http_filters": [
                        {"name": "envoy.filters.http.buffer",
                         "typed_config": {"@type": BUFFER, "max_request_bytes": 20 * 1024 * 1024}},
                        {"name": "envoy.filters.http.header_mutation", "typed_config": {"@type": HEADER_MUTATION}},
                        {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}]}}]}]}
    json_routes = [_direct("/v1/chat/completions", fx.chat_reply(), "application/json"),
                   _direct("/v1/embeddings", fx.embed_reply(), "application/json"),
                   _direct("/v1/models", fx.models_reply(), "application/json")]
    sse_routes = [_direct("/v1/chat/completions", fx.stream_reply(), "text/event-stream", chunked=True)]
    return {"node": {"id": "bench-upstream", "cluster": "bench"}, "admin": _admin(admin_port),
            "static_resources": {"listeners": [listener("up_json", json_port, json_routes),
                                               listener("up_sse", sse_port, sse_routes)]}}


def proxy(port: int, admin_port: int, up: Upstream, log_path: Path,
          extproc_port: int | None = None, mode: dict[str, str] | None = None,
          extproc_unix: Path | None = None) -> dict[str, Any]:
    """`x-bench-route: sse` goes to the SSE listener, `long` to the cadenced long-stream server (when
    started), anything else to the JSON listener.  ``mode``: changes to the ext_proc filter's processing
    mode (bench/message_cost.py), which otherwise sends all four phases as the gateway's routes do.
    ``extproc_unix``: the ext_proc's Unix socket, Envoy's way to it (as `gateway up`'s), else its port."""
    route_common = {"timeout": "600s", "idle_timeout": "60s",
                    "retry_policy": {"retry_on": "connect-failure,reset-before-request", "num_retries": 1,
                                     "per_try_timeout": "180s",
                                     "retry_host_predicate": [{
                                         "name": "envoy.retry_host_predicates.previous_hosts",
                                         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry."
                                                                   "host.previous_hosts.v3.PreviousHostsPredicate"}}],
                                     "host_selection_retry_max_attempts": 3}}
    filters: list[dict[str, Any]] = [
        {"name": "envoy.filters.http.buffer", "typed_config": {"@type": BUFFER, "max_request_bytes": 20 * 1024 * 1024}}]
    clusters = [_cluster("up_json", up.json), _cluster("up_sse", up.sse)]
    routes = [{"match": {"prefix": "/", "headers": [{"name": "x-bench-route", "string_match": {"exact": "sse"}}]},
               "route": {"cluster": "up_sse", **route_common}}]
    if up.long:
        clusters.append(_cluster("up_long", up.long))
        routes.append({"match": {"prefix": "/", "headers": [{"name": "x-bench-route",
                                                             "string_match": {"exact": "long"}}]},
                       "route": {"cluster": "up_long", **route_common}})
    routes.append({"match": {"prefix": "/"}, "route": {"cluster": "up_json", **route_common}})
    if extproc_port is not None:
        # The gateway's ext_proc filter, setting for setting (envoy/envoy.yaml).
        filters.append({"name": "envoy.filters.http.ext_proc", "typed_config": {
            "@type": EXT_PROC, "grpc_service": {"envoy_grpc": {"cluster_name": "extproc"}, "timeout": "30s"},
            "failure_mode_allow": False, "message_timeout": "5s", "allow_mode_override": True,
            "processing_mode": {"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                                "request_trailer_mode": "SKIP", "response_header_mode": "SEND",
                                "response_body_mode": "BUFFERED", "response_trailer_mode": "SKIP",
                                **(mode or {})}}})
        ext = _cluster("extproc", extproc_port, http2=True, unix=extproc_unix)
        ext["connect_timeout"] = "1s"
        del ext["per_connection_buffer_limit_bytes"]
        clusters.append(ext)
    filters.append({"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}})
    hcm = {
        "@type": HCM, "stat_prefix": "bench", "use_remote_address": True,
        "internal_address_config": {"cidr_ranges": []},
        "generate_request_id": True, "preserve_external_request_id": False,
        "always_set_request_id_in_response": True, "stream_idle_timeout": "300s",
        "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
            "@type": FILE_LOG, "path": str(log_path), "log_format": {"json_format": {
                "time": "%START_TIME%", "request_id": "%REQ(X-REQUEST-ID)%", "method": "%REQ(:METHOD)%",
                "path": "%REQ(:PATH)%", "status": "%RESPONSE_CODE%", "flags": "%RESPONSE_FLAGS%",
                "upstream": "%UPSTREAM_HOST%", "bytes_in": "%BYTES_RECEIVED%", "bytes_out": "%BYTES_SENT%",
                "duration_ms": "%DURATION%", "upstream_ms": "%RESPONSE_DURATION%",
                "details": "%RESPONSE_CODE_DETAILS%"}}}}],
        "route_config": {"name": "bench", "virtual_hosts": [{"name": "bench", "domains": ["*"], "routes": routes}]},
        "http_filters": filters}
    return {"node": {"id": "bench-proxy", "cluster": "bench"}, "admin": _admin(admin_port),
            # as in envoy/envoy.yaml: ext_proc streams half-closed, not reset, at their end
            "layered_runtime": {"layers": [{"name": "static", "static_layer": {
                "envoy.reloadable_features.ext_proc_graceful_grpc_close": True}}]},
            "static_resources": {
                "listeners": [{"name": "bench", "per_connection_buffer_limit_bytes": 65 * 1024 * 1024,
                               "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                               "filter_chains": [{"filters": [{
                                   "name": "envoy.filters.network.http_connection_manager",
                                   "typed_config": hcm}]}]}],
                "clusters": clusters}}


class _Dumper(yaml.SafeDumper):
    pass


def _bytes(dumper: yaml.SafeDumper, data: bytes) -> yaml.Node:
    # inline_bytes is base64 in Envoy's YAML/JSON mapping
    import base64
    return dumper.represent_scalar("tag:yaml.org,2002:str", base64.b64encode(data).decode())


_Dumper.add_representer(bytes, _bytes)


def write(doc: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1 << 20))
    return path
