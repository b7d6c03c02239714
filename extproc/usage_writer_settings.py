"""The usage writer's settings (``python -m extproc.usage_writer``): the ext_proc's, whose store it opens, and
its own metrics port."""
from __future__ import annotations

from dataclasses import dataclass

from .settings import GatewaySettings
from .settings_base import env


@dataclass(frozen=True)
class WriterSettings(GatewaySettings):
    writer_metrics_port: int = env("GATEWAY_WRITER_METRICS_PORT", 0)  # the usage writer's Prometheus metrics; 0 = gateway_port + 14 (8094)

    @property
    def writer_metrics_http_port(self) -> int:
        return self.writer_metrics_port or self.gateway_port + 14
