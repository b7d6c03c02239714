"""The usage writer's settings (``python -m extproc.usage_writer``): the ext_proc's, whose store it opens, and
its own metrics port."""
from __future__ import annotations

from dataclasses import dataclass

from .settings import GatewaySettings
from .settings_base import port


@dataclass(frozen=True)
class WriterSettings(GatewaySettings):
    writer_metrics_port: int = port("GATEWAY_WRITER_METRICS_PORT")  # the usage writer's Prometheus metrics; 0 = GATEWAY_PORT + its PORT_OFFSETS

    @property
    def writer_metrics_http_port(self) -> int:
        return self.port_of("writer_metrics_port")
