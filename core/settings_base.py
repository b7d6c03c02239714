"""What every process reads (the listener's address and port, the state directory, the catalog, the stores,
development mode, ...) and the one reader of settings from the environment.  Each process's settings extend
``SharedSettings`` in the package that owns the process: the ext_proc's in ``core.settings``, the usage
writer's in ``core.usage_writer_settings``, the console's in ``control.console.settings``; the launcher composes
them in ``control.settings``.  Each field names its environment variable (``env``)."""
from __future__ import annotations

import math
import os
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from .cost import pln_to_micro

_HERE = Path(__file__).resolve().parent.parent
T = TypeVar("T")
S = TypeVar("S", bound="SharedSettings")


def env(name: str, default: T, *, low: int = 0, high: int | None = None, choices: tuple[str, ...] = ()) -> T:
    """A setting read from environment variable ``name``, ``default`` when it is unset.  Its value's form
    follows from the default's type: a boolean, an integer or a number from ``low`` (to ``high``), or a
    text (one of ``choices`` when given)."""
    return field(default=default, metadata={"env": name, "low": low, "high": high, "choices": choices})


# The one table of a stack's default ports: GATEWAY_PORT + offset, the public listener's own first
# (control/ports.py lists every port a stack opens and checks them all before a start).  A port
# setting of the same name, when set, moves its port; the simulators' are the demo catalog's
# port_offset (control/catalog.yaml).  Two stacks whose GATEWAY_PORTs are SPAN apart share no port.
PORT_OFFSETS = {"console_port": 1, "extproc_port": 10, "admin_port": 11, "pg_port": 12, "redis_port": 13,
                "writer_metrics_port": 14, "simulators": 15, "smtp_capture": 18, "metrics_port": 1384}
SPAN = 20


def port(name: str) -> int:
    """A port setting: 0, its default, stands for GATEWAY_PORT + its offset (``PORT_OFFSETS``), or for
    the port its meaning names (GATEWAY_SMTP_PORT: 587)."""
    return env(name, 0, high=65535)


class SettingsError(ValueError):
    """A setting's value that cannot be used: the message names its environment variable."""


TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def form(f: Field[Any]) -> str:
    """What the variable of setting ``f`` takes, as its refusal says it."""
    m, default = f.metadata, f.default
    if isinstance(default, bool):
        return "one of 1/0/true/false/yes/no"
    if isinstance(default, (int, float)):
        what = "an integer" if isinstance(default, int) else "a number (such as 2.5)"
        return f"{what} {m['low']}..{m['high']}" if m["high"] is not None else f"{what} {m['low']} or more"
    return "one of " + "/".join(m["choices"]) if m["choices"] else "a text"


def parse(f: Field[Any], raw: str) -> object:
    """Setting ``f``'s value from its variable's text, or SettingsError in one line: the variable, what it
    takes and what it got (``form``)."""
    default, m = f.default, f.metadata
    value: object = raw
    try:
        if isinstance(default, bool):
            low = raw.strip().lower()
            if low not in TRUE + FALSE:
                raise ValueError
            value = low in TRUE
        elif isinstance(default, (int, float)):
            value = type(default)(raw)
            high = math.inf if m["high"] is None else m["high"]
            if not m["low"] <= value <= high or value == math.inf:  # NaN fails the comparison
                raise ValueError
        elif m["choices"] and raw not in m["choices"]:
            raise ValueError
    except ValueError:
        raise SettingsError(f"{m['env']} must be {form(f)}, got {raw!r}") from None
    return value


@dataclass(frozen=True)
class SharedSettings:
    gateway_host: str = env("GATEWAY_HOST", "127.0.0.1")   # address of the public listener
    gateway_port: int = env("GATEWAY_PORT", 8080, low=1, high=65535)         # public /v1 listener (Envoy); other ports derive from it
    state_dir: str = env("GATEWAY_STATE_DIR", ".gateway")  # embedded servers' data, logs, rendered config
    catalog: str = env("GATEWAY_CATALOG", str(_HERE / "control" / "catalog.yaml"))  # model catalog YAML
    database_url: str = env("DATABASE_URL", "")            # PostgreSQL; empty = embedded server in the state dir
    redis_url: str = env("REDIS_URL", "")                  # Redis; empty = embedded server in the state dir
    dev: bool = env("GATEWAY_DEV", False)                  # development mode: mail capture page and sandbox payments (loopback only)
    trusted_hops: int = env("GATEWAY_TRUSTED_HOPS", 0)     # proxies in front whose X-Forwarded-For is trusted (Envoy, console); 0 = the socket's peer
    event_loop: str = env("GATEWAY_EVENT_LOOP", "asyncio", choices=("asyncio", "uvloop"))  # asyncio | uvloop, for the ext_proc and the usage writer
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
            if (raw := os.environ.get(f.metadata["env"])) is not None:
                values[f.name] = parse(f, raw)
        return cls(**{**values, **overrides})

    @classmethod
    def env_vars(cls) -> dict[str, str]:
        """Field name -> environment variable, for every setting of ``cls``."""
        return {f.name: f.metadata["env"] for f in fields(cls)}

    def as_env(self) -> dict[str, str]:
        """These settings as the environment variables a child process reads them from."""
        return {f.metadata["env"]: _text(getattr(self, f.name)) for f in fields(self)}

    def port_of(self, name: str) -> int:
        """The port of ``name`` (a port setting or another entry of ``PORT_OFFSETS``): the setting's own
        value, else GATEWAY_PORT + its offset."""
        own: int = getattr(self, name, 0)
        return own or self.gateway_port + PORT_OFFSETS[name]

    @property
    def state(self) -> Path:
        return Path(self.state_dir).resolve()


def _text(value: object) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)
