"""Every setting and its environment variable, in one place (the README's table is generated from this)."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    gateway_host: str = "127.0.0.1"          # GATEWAY_HOST: address of the public listener
    gateway_port: int = 8080                 # GATEWAY_PORT: public /v1 listener (Envoy)
    state_dir: str = ".gateway"              # GATEWAY_STATE_DIR: embedded servers' data, logs, rendered config
    catalog: str = str(_HERE / "control" / "catalog.yaml")  # GATEWAY_CATALOG: model catalog YAML
    database_url: str = ""                   # DATABASE_URL: PostgreSQL; empty = embedded server in the state dir
    redis_url: str = ""                      # REDIS_URL: Redis; empty = embedded server in the state dir
    extproc_port: int = 0                    # GATEWAY_EXTPROC_PORT: ext_proc gRPC port; 0 = gateway_port + 10
    extproc_workers: int = 1                 # GATEWAY_EXTPROC_WORKERS: ext_proc processes the launcher starts (Envoy balances across them)
    admin_port: int = 0                      # GATEWAY_ADMIN_PORT: Envoy admin (loopback only); 0 = gateway_port + 11
    default_rpm: int = 600                   # GATEWAY_DEFAULT_RPM: requests per minute per key
    default_concurrency: int = 32            # GATEWAY_DEFAULT_CONCURRENCY: concurrent requests per organisation
    trial_balance_pln: str = "5"             # GATEWAY_TRIAL_BALANCE_PLN: demo organisation's first credit
    event_loop: str = "asyncio"              # GATEWAY_EVENT_LOOP: asyncio | uvloop, for the ext_proc and the usage writer
    seller_name: str = ""                    # GATEWAY_SELLER_NAME: the seller on VAT invoices (company name)
    seller_nip: str = ""                     # GATEWAY_SELLER_NIP: the seller's NIP
    seller_address: str = ""                 # GATEWAY_SELLER_ADDRESS: the seller's address
    low_balance_check_s: float = 60.0        # GATEWAY_LOW_BALANCE_CHECK_S: how often the console looks for balances under their owners' threshold
    key_cache_ttl_s: int = 60                # GATEWAY_KEY_CACHE_TTL_S: backstop lifetime of a cached key in Redis
    max_body_bytes: int = 20 * 1024 * 1024   # GATEWAY_MAX_BODY_BYTES: request body cap (400 above it)
    max_reply_bytes: int = 64 * 1024 * 1024  # GATEWAY_MAX_REPLY_BYTES: relayable model-server reply (502 above)
    first_byte_timeout_s: float = 180.0      # GATEWAY_FIRST_BYTE_TIMEOUT_S: retried once on another deployment
    idle_timeout_s: float = 60.0             # GATEWAY_IDLE_TIMEOUT_S: gap inside an upstream reply
    total_timeout_s: float = 600.0           # GATEWAY_TOTAL_TIMEOUT_S: whole upstream budget
    run_sim: bool = True                     # GATEWAY_RUN_SIM: start the simulator for loopback deployments
    otlp_endpoint: str = ""                  # GATEWAY_OTLP_ENDPOINT: host:port of an OTLP/gRPC collector; empty = no traces
    drain_grace_s: float = 30.0              # GATEWAY_DRAIN_GRACE_S: on stop, time for requests in flight to finish
    # ---- the public listener (Envoy) ----
    request_headers_timeout_s: float = 10.0  # GATEWAY_REQUEST_HEADERS_TIMEOUT_S: a request's headers must arrive whole within this
    connection_idle_timeout_s: float = 60.0  # GATEWAY_CONNECTION_IDLE_TIMEOUT_S: a connection without a request in flight is closed after this
    max_connections: int = 10000             # GATEWAY_MAX_CONNECTIONS: client connections open at once (more are closed on arrival)
    max_streams_per_connection: int = 100    # GATEWAY_MAX_STREAMS_PER_CONNECTION: concurrent HTTP/2 requests on one connection
    trusted_hops: int = 0                    # GATEWAY_TRUSTED_HOPS: proxies in front whose X-Forwarded-For is trusted; 0 = the socket's peer is the client
    metrics_port: int = 0                    # GATEWAY_METRICS_PORT: Prometheus metrics (loopback unless GATEWAY_METRICS_HOST); 0 = gateway_port + 1384 (9464)
    writer_metrics_port: int = 0             # GATEWAY_WRITER_METRICS_PORT: the usage writer's Prometheus metrics; 0 = gateway_port + 14 (8094)
    metrics_envoy: bool = True               # GATEWAY_METRICS_ENVOY: serve Envoy's own statistics (envoy_*) beside the ext_proc's
    metrics_host: str = "127.0.0.1"          # GATEWAY_METRICS_HOST: address of the metrics endpoint
    pg_port: int = 0                         # GATEWAY_PG_PORT: embedded PostgreSQL port; 0 = gateway_port + 12
    redis_port: int = 0                      # GATEWAY_REDIS_PORT: embedded Redis port; 0 = gateway_port + 13
    # ---- the console (control/console) ----
    console_port: int = 0                    # GATEWAY_CONSOLE_PORT: console web app; 0 = gateway_port + 1 (8081)
    console_url: str = ""                    # GATEWAY_CONSOLE_URL: public address of the console (links, payments)
    console_secret: str = ""                 # GATEWAY_CONSOLE_SECRET: CSRF/signing secret; empty = generated in state dir
    dev: bool = False                        # GATEWAY_DEV: development mode: mail capture page and sandbox payments (loopback only)
    smtp_host: str = ""                      # GATEWAY_SMTP_HOST: mail server; empty = the local capture server (development mode only)
    smtp_port: int = 0                       # GATEWAY_SMTP_PORT: 0 = 587 (or the capture server: gateway_port + 18)
    smtp_user: str = ""                      # GATEWAY_SMTP_USER
    smtp_password: str = ""                  # GATEWAY_SMTP_PASSWORD
    smtp_tls: str = "starttls"               # GATEWAY_SMTP_TLS: starttls | tls | none
    mail_from: str = "console@localhost"     # GATEWAY_MAIL_FROM: sender of the console's e-mails
    payment_provider: str = ""               # GATEWAY_PAYMENT_PROVIDER: p24 | sandbox (development mode only); empty = sandbox in development mode
    p24_merchant_id: int = 0                 # GATEWAY_P24_MERCHANT_ID
    p24_pos_id: int = 0                      # GATEWAY_P24_POS_ID: 0 = the merchant id
    p24_crc: str = ""                        # GATEWAY_P24_CRC: CRC key (signatures)
    p24_api_key: str = ""                    # GATEWAY_P24_API_KEY: REST API key (HTTP basic password)
    p24_sandbox: bool = True                 # GATEWAY_P24_SANDBOX: sandbox.przelewy24.pl instead of secure.
    p24_api_url: str = ""                    # GATEWAY_P24_API_URL: override of the P24 base address

    @classmethod
    def from_env(cls, **overrides: object) -> "Settings":
        values: dict[str, object] = {}
        for f in fields(cls):
            env = _ENV[f.name]
            if env in os.environ:
                raw = os.environ[env]
                default = f.default
                if isinstance(default, bool):
                    values[f.name] = raw.lower() in ("1", "true", "yes", "on")
                elif isinstance(default, int):
                    values[f.name] = int(raw)
                elif isinstance(default, float):
                    values[f.name] = float(raw)
                else:
                    values[f.name] = raw
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def grpc_port(self) -> int:
        return self.extproc_port or self.gateway_port + 10

    @property
    def metrics_http_port(self) -> int:
        return self.metrics_port or self.gateway_port + 1384

    @property
    def writer_metrics_http_port(self) -> int:
        return self.writer_metrics_port or self.gateway_port + 14

    @property
    def envoy_admin_port(self) -> int:
        return self.admin_port or self.gateway_port + 11

    @property
    def console_http_port(self) -> int:
        return self.console_port or self.gateway_port + 1

    @property
    def smtp_capture_port(self) -> int:
        return self.gateway_port + 18

    @property
    def console_base_url(self) -> str:
        return (self.console_url or f"http://{self.gateway_host}:{self.console_http_port}").rstrip("/")

    @property
    def state(self) -> Path:
        return Path(self.state_dir).resolve()


_ENV = {
    "gateway_host": "GATEWAY_HOST", "gateway_port": "GATEWAY_PORT", "state_dir": "GATEWAY_STATE_DIR",
    "catalog": "GATEWAY_CATALOG", "database_url": "DATABASE_URL", "redis_url": "REDIS_URL",
    "extproc_port": "GATEWAY_EXTPROC_PORT", "extproc_workers": "GATEWAY_EXTPROC_WORKERS", "admin_port": "GATEWAY_ADMIN_PORT",
    "default_rpm": "GATEWAY_DEFAULT_RPM", "default_concurrency": "GATEWAY_DEFAULT_CONCURRENCY",
    "trial_balance_pln": "GATEWAY_TRIAL_BALANCE_PLN", "key_cache_ttl_s": "GATEWAY_KEY_CACHE_TTL_S",
    "low_balance_check_s": "GATEWAY_LOW_BALANCE_CHECK_S", "event_loop": "GATEWAY_EVENT_LOOP",
    "seller_name": "GATEWAY_SELLER_NAME", "seller_nip": "GATEWAY_SELLER_NIP", "seller_address": "GATEWAY_SELLER_ADDRESS",
    "max_body_bytes": "GATEWAY_MAX_BODY_BYTES", "max_reply_bytes": "GATEWAY_MAX_REPLY_BYTES",
    "first_byte_timeout_s": "GATEWAY_FIRST_BYTE_TIMEOUT_S", "idle_timeout_s": "GATEWAY_IDLE_TIMEOUT_S",
    "total_timeout_s": "GATEWAY_TOTAL_TIMEOUT_S", "run_sim": "GATEWAY_RUN_SIM",
    "otlp_endpoint": "GATEWAY_OTLP_ENDPOINT", "drain_grace_s": "GATEWAY_DRAIN_GRACE_S",
    "request_headers_timeout_s": "GATEWAY_REQUEST_HEADERS_TIMEOUT_S",
    "connection_idle_timeout_s": "GATEWAY_CONNECTION_IDLE_TIMEOUT_S", "max_connections": "GATEWAY_MAX_CONNECTIONS",
    "max_streams_per_connection": "GATEWAY_MAX_STREAMS_PER_CONNECTION", "trusted_hops": "GATEWAY_TRUSTED_HOPS",
    "metrics_port": "GATEWAY_METRICS_PORT", "metrics_host": "GATEWAY_METRICS_HOST",
    "metrics_envoy": "GATEWAY_METRICS_ENVOY", "writer_metrics_port": "GATEWAY_WRITER_METRICS_PORT",
    "pg_port": "GATEWAY_PG_PORT", "redis_port": "GATEWAY_REDIS_PORT",
    "console_port": "GATEWAY_CONSOLE_PORT", "console_url": "GATEWAY_CONSOLE_URL",
    "console_secret": "GATEWAY_CONSOLE_SECRET", "dev": "GATEWAY_DEV", "smtp_host": "GATEWAY_SMTP_HOST", "smtp_port": "GATEWAY_SMTP_PORT",
    "smtp_user": "GATEWAY_SMTP_USER", "smtp_password": "GATEWAY_SMTP_PASSWORD", "smtp_tls": "GATEWAY_SMTP_TLS",
    "mail_from": "GATEWAY_MAIL_FROM", "payment_provider": "GATEWAY_PAYMENT_PROVIDER",
    "p24_merchant_id": "GATEWAY_P24_MERCHANT_ID", "p24_pos_id": "GATEWAY_P24_POS_ID", "p24_crc": "GATEWAY_P24_CRC",
    "p24_api_key": "GATEWAY_P24_API_KEY", "p24_sandbox": "GATEWAY_P24_SANDBOX", "p24_api_url": "GATEWAY_P24_API_URL",
}
ENV_VARS = _ENV
