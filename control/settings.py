"""The launcher's settings: every process's (the ext_proc's and Envoy's, the usage writer's, the console's),
composed, and the launcher's own (embedded servers' ports, simulator, ext_proc workers).  ``gateway up``, the
CLI and ``Stack`` hold one of these and pass it whole to each process's environment (``as_env``)."""
from __future__ import annotations

from dataclasses import dataclass

from core.settings_base import env, port
from core.usage_writer_settings import WriterSettings

from .console.settings import ConsoleSettings

MAX_EXTPROC_WORKERS = 64


@dataclass(frozen=True)
class Settings(WriterSettings, ConsoleSettings):
    extproc_workers: int = env("GATEWAY_EXTPROC_WORKERS", 1, low=1, high=MAX_EXTPROC_WORKERS)  # ext_proc processes the launcher starts (Envoy balances across them)
    run_sim: bool = env("GATEWAY_RUN_SIM", True)              # start the simulator for loopback deployments
    pg_port: int = port("GATEWAY_PG_PORT")                  # embedded PostgreSQL port; 0 = GATEWAY_PORT + its PORT_OFFSETS
    redis_port: int = port("GATEWAY_REDIS_PORT")            # embedded Redis port; 0 = GATEWAY_PORT + its PORT_OFFSETS


ENV_VARS = Settings.env_vars()
