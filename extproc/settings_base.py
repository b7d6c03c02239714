"""What every process reads (the listener's address and port, the state directory, the catalog, the stores,
development mode, ...) and the one reader of settings from the environment.  Each process's settings extend
``SharedSettings`` in the package that owns the process: the ext_proc's in ``extproc.settings``, the usage
writer's in ``extproc.usage_writer_settings``, the console's in ``control.console.settings``; the launcher composes
them in ``control.settings``.  Each field names its environment variable (``env``)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from .cost import pln_to_micro

_HERE = Path(__file__).resolve().parent.parent
T = TypeVar("T")
S = TypeVar("S", bound="SharedSettings")


def env(name: str, default: T) -> T:
    """A setting read from environment variable ``name``, ``default`` when it is unset."""
    return field(default=default, metadata={"env": name})


class SettingsError(ValueError):
    """A setting's value that cannot be used: the message names its environment variable."""


def _parse(raw: str, default: object) -> object:
    if isinstance(default, bool):
        return raw.lower() in ("1", "true", "yes", "on")
    if isinstance(default, (int, float)):
        return type(default)(raw)
    return raw


@dataclass(frozen=True)
class SharedSettings:
    gateway_host: str = env("GATEWAY_HOST", "127.0.0.1")   # address of the public listener
    gateway_port: int = env("GATEWAY_PORT", 8080)          # public /v1 listener (Envoy); other ports derive from it
    state_dir: str = env("GATEWAY_STATE_DIR", ".gateway")  # embedded servers' data, logs, rendered config
    catalog: str = env("GATEWAY_CATALOG", str(_HERE / "control" / "catalog.yaml"))  # model catalog YAML
    database_url: str = env("DATABASE_URL", "")            # PostgreSQL; empty = embedded server in the state dir
    redis_url: str = env("REDIS_URL", "")                  # Redis; empty = embedded server in the state dir
    dev: bool = env("GATEWAY_DEV", False)                  # development mode: mail capture page and sandbox payments (loopback only)
    trusted_hops: int = env("GATEWAY_TRUSTED_HOPS", 0)     # proxies in front whose X-Forwarded-For is trusted (Envoy, console); 0 = the socket's peer
    event_loop: str = env("GATEWAY_EVENT_LOOP", "asyncio")  # asyncio | uvloop, for the ext_proc and the usage writer
    metrics_host: str = env("GATEWAY_METRICS_HOST", "127.0.0.1")  # address of the metrics endpoints
    # how far below zero a paid organisation's balance may go (README, "Billing"): the ext_proc holds each
    # request's worst case against it, the CLI and the console show it; empty = no limit (402 only when
    # the balance is not positive)
    credit_limit_pln: str = env("GATEWAY_CREDIT_LIMIT_PLN", "")

    def __post_init__(self) -> None:
        self.credit_limit_micro  # noqa: B018 - refused at start, not at the first request

    @property
    def credit_limit_micro(self) -> int | None:
        """GATEWAY_CREDIT_LIMIT_PLN in micro-PLN; None: no limit."""
        if not self.credit_limit_pln.strip():
            return None
        try:
            micro = pln_to_micro(self.credit_limit_pln)
        except ValueError as e:
            raise SettingsError(f"GATEWAY_CREDIT_LIMIT_PLN: {e}") from None
        if micro < 0:
            raise SettingsError(f"GATEWAY_CREDIT_LIMIT_PLN must be 0 or more PLN, not {self.credit_limit_pln!r}")
        return micro

    @classmethod
    def from_env(cls: type[S], **overrides: Any) -> S:
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = f.metadata["env"]
            if name in os.environ:
                try:
                    values[f.name] = _parse(os.environ[name], f.default)
                except ValueError:
                    what = "an integer" if isinstance(f.default, int) else "a number"
                    raise SettingsError(f"{name} must be {what}, not {os.environ[name]!r}") from None
        return cls(**{**values, **overrides})

    @classmethod
    def env_vars(cls) -> dict[str, str]:
        """Field name -> environment variable, for every setting of ``cls``."""
        return {f.name: f.metadata["env"] for f in fields(cls)}

    def as_env(self) -> dict[str, str]:
        """These settings as the environment variables a child process reads them from."""
        return {f.metadata["env"]: _text(getattr(self, f.name)) for f in fields(self)}

    @property
    def state(self) -> Path:
        return Path(self.state_dir).resolve()


def _text(value: object) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)
