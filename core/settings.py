"""The ext_proc's settings and those Envoy's configuration is rendered from (the launcher composes them with the
other processes' in ``control.settings``)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .settings_base import SharedSettings, env, port


@dataclass(frozen=True)
class GatewaySettings(SharedSettings):
    extproc_port: int = port("GATEWAY_EXTPROC_PORT")        # ext_proc gRPC port; 0 = GATEWAY_PORT + its PORT_OFFSETS
    admin_port: int = port("GATEWAY_ADMIN_PORT")            # Envoy admin (loopback only); 0 = GATEWAY_PORT + its PORT_OFFSETS
    default_rpm: int = env("GATEWAY_DEFAULT_RPM", 600)        # requests per minute per key
    default_concurrency: int = env("GATEWAY_DEFAULT_CONCURRENCY", 32)  # concurrent requests per organisation
    key_cache_ttl_s: int = env("GATEWAY_KEY_CACHE_TTL_S", 60)  # backstop lifetime of a cached key in Redis
    max_body_bytes: int = env("GATEWAY_MAX_BODY_BYTES", 20 * 1024 * 1024)  # request body cap (400 above it)
    max_reply_bytes: int = env("GATEWAY_MAX_REPLY_BYTES", 64 * 1024 * 1024)  # relayable model-server reply (502 above)
    first_byte_timeout_s: float = env("GATEWAY_FIRST_BYTE_TIMEOUT_S", 180.0)  # retried once on another deployment
    idle_timeout_s: float = env("GATEWAY_IDLE_TIMEOUT_S", 60.0)    # gap inside an upstream reply
    total_timeout_s: float = env("GATEWAY_TOTAL_TIMEOUT_S", 600.0)  # whole upstream budget
    otlp_endpoint: str = env("GATEWAY_OTLP_ENDPOINT", "")     # host:port of an OTLP/gRPC collector; empty = no traces
    drain_grace_s: float = env("GATEWAY_DRAIN_GRACE_S", 30.0)  # on stop, time for requests in flight to finish
    # on SIGTERM the ext_proc first drains the Envoy on the admin port (where both stop together: compose,
    # Kubernetes); never under `gateway up`, which drains Envoy itself and may restart one ext_proc alone
    drain_envoy_on_stop: bool = env("GATEWAY_DRAIN_ENVOY_ON_STOP", False)
    # ---- the public listener (Envoy) ----
    request_headers_timeout_s: float = env("GATEWAY_REQUEST_HEADERS_TIMEOUT_S", 10.0)  # a request's headers must arrive whole within this
    connection_idle_timeout_s: float = env("GATEWAY_CONNECTION_IDLE_TIMEOUT_S", 60.0)  # a connection without a request in flight is closed after this
    max_connections: int = env("GATEWAY_MAX_CONNECTIONS", 10000)  # client connections open at once (more are closed on arrival)
    max_streams_per_connection: int = env("GATEWAY_MAX_STREAMS_PER_CONNECTION", 100)  # concurrent HTTP/2 requests on one connection
    envoy_access_log: str = env("GATEWAY_ENVOY_ACCESS_LOG", "")  # Envoy's access log file; empty = <state>/logs/envoy-access.log (the image: /dev/stdout)
    metrics_port: int = port("GATEWAY_METRICS_PORT")        # Prometheus metrics; 0 = GATEWAY_PORT + its PORT_OFFSETS
    metrics_envoy: bool = env("GATEWAY_METRICS_ENVOY", True)  # serve Envoy's own statistics (envoy_*) beside the ext_proc's
    # Envoy reaches each ext_proc process by a Unix socket in the state directory, beside its TCP port
    # (health probes, `gateway status`): `gateway up`, which starts both on one machine, sets it where
    # the path fits (BENCHMARKS.md, "Unix sockets on the request path"); containers keep TCP
    extproc_unix: bool = env("GATEWAY_EXTPROC_UNIX", False)
    request_policies: str = env("GATEWAY_REQUEST_POLICIES", "")  # module:function request policies, comma-separated; empty = none (docs/extending.md)

    @property
    def grpc_port(self) -> int:
        return self.port_of("extproc_port")

    def extproc_socket(self, grpc_port: int) -> Path | None:
        """The Unix socket of the ext_proc process on ``grpc_port`` (GATEWAY_EXTPROC_UNIX), else None."""
        return unix_socket(self.state / "run" / f"extproc-{grpc_port}.sock") if self.extproc_unix else None

    @property
    def metrics_http_port(self) -> int:
        return self.port_of("metrics_port")

    @property
    def envoy_admin_port(self) -> int:
        return self.port_of("admin_port")


# A Unix socket's path is at most 107 bytes (Linux's sun_path, its NUL aside).
UNIX_PATH_MAX = 107


def unix_socket(path: Path) -> Path | None:
    """``path`` if a Unix socket can be bound there (short enough), else None."""
    return path if len(os.fsencode(path)) <= UNIX_PATH_MAX else None
