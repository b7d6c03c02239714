"""Prometheus metrics of the request path, named after the OpenTelemetry GenAI semantic conventions
where one exists.  Labels carry only bounded metadata: alias, endpoint, status, code, kind, phase —
never a key, a request id or any content.  Served on GATEWAY_METRICS_PORT, never the public listener."""
from __future__ import annotations

import urllib.request
from typing import Any, Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TOK = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)

TOKENS = Histogram("gen_ai_client_token_usage", "Tokens billed per request (gen_ai.client.token.usage)",
                   ["gen_ai_token_type", "gen_ai_request_model", "gen_ai_response_model"], buckets=_TOK)
TTFT = Histogram("gen_ai_server_time_to_first_token_seconds",
                 "Time to the model server's first byte (gen_ai.server.time_to_first_token)",
                 ["gen_ai_request_model"], buckets=_LAT)
TPOT = Histogram("gen_ai_server_time_per_output_token_seconds",
                 "Time per output token after the first (gen_ai.server.time_per_output_token)",
                 ["gen_ai_request_model"], buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
DURATION = Histogram("gen_ai_server_request_duration_seconds", "Request duration (gen_ai.server.request.duration)",
                     ["gen_ai_request_model", "endpoint"], buckets=_LAT)
REQUESTS = Counter("gateway_requests", "Requests by alias, endpoint, HTTP status and error code",
                   ["alias", "endpoint", "status", "code"])
BILLED = Counter("gateway_billed_micro_pln", "Billed micro-PLN", ["alias"])
REJECTIONS = Counter("gateway_limiter_rejections", "Requests refused by a limit", ["kind"])
PHASE = Histogram("gateway_extproc_phase_seconds", "ext_proc time per phase", ["phase"],
                  buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1))
_CHILDREN: dict[tuple[object, tuple[str, ...]], Any] = {}


def labelled(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, looked up once per label set rather than on every request (labels
    are bounded, so the cache is too)."""
    key = (metric, values)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = metric.labels(*values)
    return child


KEY_LOOKUPS = Counter("gateway_key_cache_lookups", "Key look-ups by result (hit: Redis, miss: PostgreSQL)",
                      ["result"])
WRITE_LAG = Histogram("gateway_usage_write_lag_seconds", "From a request's end to its usage record in PostgreSQL",
                      buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300))
DEPENDENCY_UP = Gauge("gateway_dependency_up", "1 while the dependency (redis, postgres) answered the ext_proc's "
                      "last health check within its timeout, else 0 (extproc/health.py)", ["dependency"])
UPSTREAM_FAILURES = Counter("gateway_upstream_failures", "Model-server failures by alias and code",
                            ["alias", "code"])
FINISHES_WAITING = Gauge("gateway_usage_records_waiting",
                         "Finished requests whose record and release Redis has not taken yet (retried, kept on disk)")
FINISHED_WITHOUT_JOURNAL = Counter("gateway_finished_without_journal",
                                   "Finishes that found no in-flight entry in Redis (lost with Redis, or a repeat): "
                                   "record queued, Redis's balance not debited")
# the usage writer's: records in the Redis usage stream not yet written to PostgreSQL (set every second)
RECORDS_QUEUED = Gauge("gateway_usage_records_queued", "Usage records queued in Redis, not yet in PostgreSQL")

# an error code -> the ``kind`` label of REJECTIONS
REJECTION_KIND = {"rate_limit_exceeded": "rate", "concurrency_limit_exceeded": "concurrency",
                  "insufficient_quota": "quota", "org_suspended": "suspended"}


class EnvoyStats(Collector):
    """Envoy's own statistics (its admin ``/stats/prometheus``, loopback only), served beside the
    ext_proc's so that one scrape of the metrics port sees both.  Fetched at scrape time only, within
    ``TIMEOUT_S``: a frozen Envoy leaves its statistics out rather than hold up the scrape (and the
    health checks of ``gateway status``, which read this endpoint within 1 s)."""

    TIMEOUT_S = 0.5

    def __init__(self, admin_port: int) -> None:
        self.url = f"http://127.0.0.1:{admin_port}/stats/prometheus"

    def collect(self) -> Iterator[Metric]:
        try:
            with urllib.request.urlopen(self.url, timeout=self.TIMEOUT_S) as r:
                text = r.read().decode()
        except OSError:
            return
        yield from text_string_to_metric_families(text)


def serve(port: int, host: str, envoy_admin_port: int | None) -> None:
    if envoy_admin_port is not None:
        REGISTRY.register(EnvoyStats(envoy_admin_port))
    start_http_server(port, addr=host)
