"""The console's processes for the launcher (``control.launcher.Stack``): the web app and, in development mode
without an SMTP server, the local capture SMTP server; and the check that refuses a start that would
need a development convenience outside development mode."""
from __future__ import annotations

import sys
from pathlib import Path

from control.procs import Proc, http_ok, port_open

from .invoices import nip_valid
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
    if why := s.ksef_refusal(bool(s.seller_name and s.seller_address and nip_valid(s.seller_nip))):
        return why
    provider = payment_provider(s)
    if provider not in ("", "sandbox", "p24"):
        return f"GATEWAY_PAYMENT_PROVIDER must be p24 (or sandbox in development mode), not {provider!r}"
    if s.dev:
        missing = _p24_missing(s) if provider == "p24" else []
        return f"GATEWAY_PAYMENT_PROVIDER=p24 needs {', '.join(missing)}" if missing else None
    missing = [what for what, absent in (
        ("an SMTP server (GATEWAY_SMTP_HOST)", not s.smtp_host),
        ("a payment provider (GATEWAY_PAYMENT_PROVIDER=p24 and GATEWAY_P24_*)", provider != "p24")) if absent]
    if missing:
        return ("the console needs " + " and ".join(missing)
                + "; the local mail capture and the sandbox payments exist only in development mode (GATEWAY_DEV=1)")
    return _production_refusal(s)


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _p24_missing(s: ConsoleSettings) -> list[str]:
    return [name for name, value in (("GATEWAY_P24_MERCHANT_ID", s.p24_merchant_id), ("GATEWAY_P24_CRC", s.p24_crc),
                                     ("GATEWAY_P24_API_KEY", s.p24_api_key)) if not value]


def _production_refusal(s: ConsoleSettings) -> str | None:
    """What a production start needs beyond a mail server and a payment provider (one line, or None):
    Przelewy24's whole account, the console's public https:// address (e-mail links, payment returns,
    Secure cookies), and SMTP over TLS (passwords and sign-in links cross the network; a relay on this
    host's loopback may take plain SMTP)."""
    if missing := _p24_missing(s):
        return f"GATEWAY_PAYMENT_PROVIDER=p24 needs {', '.join(missing)} (Przelewy24's merchant id, CRC and API key)"
    scheme = s.console_url.split("://", 1)[0].lower() if "://" in s.console_url else ""
    if scheme != "https":
        shown = f"not {s.console_url.split('://', 1)[0]}://…" if s.console_url else "it is not set"
        return ("GATEWAY_CONSOLE_URL must be the console's public https:// address outside development mode "
                f"(GATEWAY_DEV=1); {shown}")
    if s.smtp_tls not in ("starttls", "tls", "none"):
        return f"GATEWAY_SMTP_TLS must be starttls, tls or none, not {s.smtp_tls!r}"
    if s.smtp_tls == "none" and s.smtp_host not in LOOPBACK:
        return (f"GATEWAY_SMTP_TLS=none sends mail to {s.smtp_host} without TLS: use starttls or tls (plain SMTP "
                "only to a relay on this host's loopback, or in development mode, GATEWAY_DEV=1)")
    return None


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
