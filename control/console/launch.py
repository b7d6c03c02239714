"""The console's processes for ``control.launcher.Stack``: the web app and, when no SMTP server is
configured, the local capture SMTP server."""
from __future__ import annotations

import sys
from dataclasses import fields
from typing import TYPE_CHECKING

from extproc.settings import ENV_VARS, Settings

if TYPE_CHECKING:
    from control.launcher import Proc, Stack

CONSOLE_FIELDS = ("console_port", "console_url", "console_secret", "smtp_host", "smtp_port", "smtp_user",
                  "smtp_password", "smtp_tls", "mail_from", "payment_provider", "p24_merchant_id", "p24_pos_id",
                  "p24_crc", "p24_api_key", "p24_sandbox", "p24_api_url", "trial_balance_pln", "gateway_host")


def console_env(s: Settings) -> dict[str, str]:
    """The console's settings as environment variables (a Stack's Settings may carry overrides)."""
    values = {f.name: getattr(s, f.name) for f in fields(s)}
    return {ENV_VARS[n]: ("1" if values[n] else "0") if isinstance(values[n], bool) else str(values[n])
            for n in CONSOLE_FIELDS}


def console_proc(stack: "Stack", settings: Settings | None = None, name: str = "console") -> "Proc":
    from control.launcher import Proc, _http_ok
    s = settings or stack.s
    env = stack._child_env()
    env.update(console_env(s))
    port = s.console_http_port
    return Proc(name, [sys.executable, "-m", "control.console"], env=env,
                ready=lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"))


def smtp_proc(stack: "Stack") -> "Proc":
    from control.launcher import Proc, _port_open
    port = stack.s.smtp_capture_port
    return Proc("smtp", [sys.executable, "-m", "control.console.smtp_capture", "--port", str(port),
                         "--dir", str(stack.state / "mail")], ready=lambda: _port_open(port))
