"""The console's processes for the launcher (``control.launcher.Stack``): the web app and, in development mode
without an SMTP server, the local capture SMTP server; and the check that refuses a start that would
need a development convenience outside development mode."""
from __future__ import annotations

import sys
from pathlib import Path

from control.procs import Proc, http_ok, port_open

from .settings import ConsoleSettings

# where the stores, the state and the catalog are: the stack's (``Stack.child_env``), not a Settings' own
_STACK_RESOLVED = {"DATABASE_URL", "REDIS_URL", "GATEWAY_STATE_DIR", "GATEWAY_CATALOG"}


class ConfigError(RuntimeError):
    """A start that cannot go on (one line, for the operator)."""


def payment_provider(s: ConsoleSettings) -> str:
    """The provider in force: the configured one, or the sandbox in development mode."""
    return s.payment_provider or ("sandbox" if s.dev else "")


def refusal(s: ConsoleSettings) -> str | None:
    """Why the console must not start with these settings (one line), or None.  Mail capture and the
    sandbox payment provider exist only in development mode (GATEWAY_DEV=1)."""
    provider = payment_provider(s)
    if provider not in ("", "sandbox", "p24"):
        return f"GATEWAY_PAYMENT_PROVIDER must be p24 (or sandbox in development mode), not {provider!r}"
    if s.dev:
        return None
    missing = [what for what, absent in (
        ("an SMTP server (GATEWAY_SMTP_HOST)", not s.smtp_host),
        ("a payment provider (GATEWAY_PAYMENT_PROVIDER=p24 and GATEWAY_P24_*)", provider != "p24")) if absent]
    return ("the console needs " + " and ".join(missing)
            + "; the local mail capture and the sandbox payments exist only in development mode (GATEWAY_DEV=1)"
            if missing else None)


def check(s: ConsoleSettings) -> None:
    why = refusal(s)
    if why:
        raise ConfigError(why)


def console_env(s: ConsoleSettings) -> dict[str, str]:
    """The console's settings as environment variables (a Stack's Settings may carry overrides)."""
    names = set(ConsoleSettings.env_vars().values()) - _STACK_RESOLVED
    return {name: value for name, value in s.as_env().items() if name in names}


def console_proc(env: dict[str, str], s: ConsoleSettings, name: str = "console") -> Proc:
    """The console web app with ``s``'s settings; ``env``: the stack's environment for its children
    (``Stack.child_env``: where PostgreSQL and Redis are)."""
    return Proc(name, [sys.executable, "-m", "control.console"], env={**env, **console_env(s)},
                ready=lambda: http_ok(f"http://127.0.0.1:{s.console_http_port}/healthz"))


def smtp_proc(s: ConsoleSettings, state: Path) -> Proc:
    port = s.smtp_capture_port
    return Proc("smtp", [sys.executable, "-m", "control.console.smtp_capture", "--port", str(port),
                         "--dir", str(state / "mail")], ready=lambda: port_open(port))
