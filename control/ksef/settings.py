"""The operator's KSeF settings (docs/configuration.md, "KSeF"): which environment, and the KSeF token, or
the certificate and key, that authenticate the seller (its NIP: ``GATEWAY_SELLER_NIP``).  No environment: invoices are still made as
FA(3) documents, kept and offered for download, but not sent (the console says so when it starts)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ksef_client.config import KsefEnvironment, KsefQrEnvironment

from core.settings_base import env

ENVIRONMENTS = {"test": (KsefEnvironment.TEST, KsefQrEnvironment.TEST),
                "demo": (KsefEnvironment.DEMO, KsefQrEnvironment.DEMO),
                "production": (KsefEnvironment.PROD, KsefQrEnvironment.PROD)}


@dataclass(frozen=True)
class KsefSettings:
    ksef_env: str = env("GATEWAY_KSEF_ENV", "", choices=("", "test", "demo", "production"))  # KSeF environment invoices are sent to; empty = not sent
    ksef_token: str = env("GATEWAY_KSEF_TOKEN", "")           # the KSeF token (generated in KSeF for the seller's NIP, right to issue invoices)
    ksef_cert: str = env("GATEWAY_KSEF_CERT", "")             # or a certificate (PEM file) the seller authenticates with (XAdES signature) ...
    ksef_key: str = env("GATEWAY_KSEF_KEY", "")               # ... and its private key (PEM file, unencrypted)
    ksef_url: str = env("GATEWAY_KSEF_URL", "")               # override of the environment's API address (a proxy)
    ksef_retry_s: float = env("GATEWAY_KSEF_RETRY_S", 60.0)   # first wait before sending again after KSeF could not be reached; doubles, at most an hour

    def ksef_refusal(self, seller_ok: bool) -> str | None:
        """Why KSeF as configured cannot be used (one line for the start's refusal), or None."""
        if not self.ksef_on:
            return None
        if bool(self.ksef_token) == bool(self.ksef_cert or self.ksef_key) or bool(self.ksef_cert) != bool(self.ksef_key):
            return (f"GATEWAY_KSEF_ENV={self.ksef_env} needs GATEWAY_KSEF_TOKEN (a KSeF token of the seller's NIP) or"
                    " GATEWAY_KSEF_CERT and GATEWAY_KSEF_KEY (its certificate and private key), one of the two")
        for var, path in (("GATEWAY_KSEF_CERT", self.ksef_cert), ("GATEWAY_KSEF_KEY", self.ksef_key)):
            if path and not os.access(path, os.R_OK):
                return f"{var}: cannot read {path}"
        if self.ksef_on and not seller_ok:
            return (f"GATEWAY_KSEF_ENV={self.ksef_env} needs the seller: GATEWAY_SELLER_NAME, GATEWAY_SELLER_NIP"
                    " (a valid NIP) and GATEWAY_SELLER_ADDRESS")
        return None

    @property
    def ksef_on(self) -> bool:
        return bool(self.ksef_env)

    @property
    def ksef_api_url(self) -> str:
        return self.ksef_url or ENVIRONMENTS[self.ksef_env][0].value

    @property
    def ksef_qr_url(self) -> str:
        """Where the verification QR code points: the environment's (never the override's)."""
        return ENVIRONMENTS[self.ksef_env or "production"][1].value
