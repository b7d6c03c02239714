"""The console's settings: its address and secret, mail, payments, the seller on invoices (KSeF's are in
``control.ksef.settings``), the low-balance check and the trial credit (the launcher composes them with the other processes' in ``control.settings``)."""
from __future__ import annotations

from dataclasses import dataclass

from control.ksef.settings import KsefSettings
from core.settings_base import SharedSettings, env, port


@dataclass(frozen=True)
class ConsoleSettings(SharedSettings, KsefSettings):
    console_port: int = port("GATEWAY_CONSOLE_PORT")        # console web app; 0 = GATEWAY_PORT + its PORT_OFFSETS
    console_url: str = env("GATEWAY_CONSOLE_URL", "")         # public address of the console (links, payments)
    console_secret: str = env("GATEWAY_CONSOLE_SECRET", "")   # CSRF/signing secret; empty = generated in state dir
    trial_balance_pln: str = env("GATEWAY_TRIAL_BALANCE_PLN", "5")  # demo organisation's first credit
    trial_per_client_day: int = env("GATEWAY_TRIAL_PER_CLIENT_DAY", 3)  # trial credits per client address a day
    console_headers_timeout_s: float = env("GATEWAY_CONSOLE_HEADERS_TIMEOUT_S", 10.0)  # a request's head whole within this of its first byte
    console_body_timeout_s: float = env("GATEWAY_CONSOLE_BODY_TIMEOUT_S", 30.0)  # a request's body whole within this of its head
    console_idle_timeout_s: float = env("GATEWAY_CONSOLE_IDLE_TIMEOUT_S", 60.0)  # a connection without a request is closed after this
    console_max_connections: int = env("GATEWAY_CONSOLE_MAX_CONNECTIONS", 512)  # open at once; more are answered 503 and closed
    low_balance_check_s: float = env("GATEWAY_LOW_BALANCE_CHECK_S", 60.0)  # how often the console looks for balances under their owners' threshold
    seller_name: str = env("GATEWAY_SELLER_NAME", "")         # the seller on VAT invoices (company name)
    seller_nip: str = env("GATEWAY_SELLER_NIP", "")           # the seller's NIP
    seller_address: str = env("GATEWAY_SELLER_ADDRESS", "")   # the seller's address
    smtp_host: str = env("GATEWAY_SMTP_HOST", "")             # mail server; empty = the local capture server (development mode only)
    smtp_port: int = port("GATEWAY_SMTP_PORT")              # 0 = 587 (or the capture server: PORT_OFFSETS["smtp_capture"])
    smtp_user: str = env("GATEWAY_SMTP_USER", "")
    smtp_password: str = env("GATEWAY_SMTP_PASSWORD", "")
    smtp_tls: str = env("GATEWAY_SMTP_TLS", "starttls")       # starttls | tls | none
    mail_from: str = env("GATEWAY_MAIL_FROM", "console@localhost")  # sender of the console's e-mails
    payment_provider: str = env("GATEWAY_PAYMENT_PROVIDER", "")  # p24 | sandbox (development mode only); empty = sandbox in development mode
    p24_merchant_id: int = env("GATEWAY_P24_MERCHANT_ID", 0)
    p24_pos_id: int = env("GATEWAY_P24_POS_ID", 0)            # 0 = the merchant id
    p24_crc: str = env("GATEWAY_P24_CRC", "")                 # CRC key (signatures)
    p24_api_key: str = env("GATEWAY_P24_API_KEY", "")         # REST API key (HTTP basic password)
    p24_sandbox: bool = env("GATEWAY_P24_SANDBOX", True)      # sandbox.przelewy24.pl instead of secure.
    p24_api_url: str = env("GATEWAY_P24_API_URL", "")         # override of the P24 base address

    @property
    def console_http_port(self) -> int:
        return self.port_of("console_port")

    @property
    def smtp_capture_port(self) -> int:
        return self.port_of("smtp_capture")

    @property
    def gateway_base_url(self) -> str:
        """The gateway's address as the pages show it (the API's paths start with /v1 under it)."""
        return f"http://{self.gateway_host}:{self.gateway_port}"

    @property
    def console_base_url(self) -> str:
        return (self.console_url or f"http://{self.gateway_host}:{self.console_http_port}").rstrip("/")
