"""The console's processes for the launcher (``control.launcher.Stack``): the web app and, in development mode
without an SMTP server, the local capture SMTP server; and the check that refuses a start that would
need a development convenience outside development mode."""
from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

from control.procs import Proc, http_ok, port_open
from extproc.settings import ENV_VARS, Settings

CONSOLE_FIELDS = ("dev", "trusted_hops", "console_port", "console_url", "console_secret", "smtp_host", "smtp_port", "smtp_user",
                  "smtp_password", "smtp_tls", "mail_from", "payment_provider", "p24_merchant_id", "p24_pos_id",
                  "p24_crc", "p24_api_key", "p24_sandbox", "p24_api_url", "trial_balance_pln", "gateway_host",
                  "low_balance_check_s", "seller_name", "seller_nip", "seller_address")


class ConfigError(RuntimeError):
    """A start that cannot go on (one line, for the operator)."""


def payment_provider(s: Settings) -> str:
    """The provider in force: the configured one, or the sandbox in development mode."""
    return s.payment_provider or ("sandbox" if s.dev else "")


def refusal(s: Settings) -> str | None:
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
    if not missing:
        return None
    return ("the console needs " + " and ".join(missing)
            + "; the local mail capture and the sandbox payments exist only in development mode (GATEWAY_DEV=1)")


def check(s: Settings) -> None:
    why = refusal(s)
    if why:
        raise ConfigError(why)


def console_env(s: Settings) -> dict[str, str]:
    """The console's settings as environment variables (a Stack's Settings may carry overrides)."""
    values = {f.name: getattr(s, f.name) for f in fields(s)}
    return {ENV_VARS[n]: ("1" if values[n] else "0") if isinstance(values[n], bool) else str(values[n])
            for n in CONSOLE_FIELDS}


def console_proc(env: dict[str, str], s: Settings, name: str = "console") -> Proc:
    """The console web app with ``s``'s settings; ``env``: the stack's environment for its children
    (``Stack.child_env``: where PostgreSQL and Redis are)."""
    env = {**env, **console_env(s)}
    port = s.console_http_port
    return Proc(name, [sys.executable, "-m", "control.console"], env=env,
                ready=lambda: http_ok(f"http://127.0.0.1:{port}/healthz"))


def smtp_proc(s: Settings, state: Path) -> Proc:
    port = s.smtp_capture_port
    return Proc("smtp", [sys.executable, "-m", "control.console.smtp_capture", "--port", str(port),
                         "--dir", str(state / "mail")], ready=lambda: port_open(port))
