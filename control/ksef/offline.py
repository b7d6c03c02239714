"""The seller's KSeF offline certificate (type Offline, issued in KSeF beside the authentication one):
its key signs the certificate verification code (KOD II) an invoice issued offline carries
(``GATEWAY_KSEF_OFFLINE_CERT`` / ``GATEWAY_KSEF_OFFLINE_KEY``, PEM files, the key unencrypted)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from ksef_client.utils.certificate_serial import is_valid_certificate_serial_number


@dataclass(frozen=True, slots=True)
class OfflineCertificate:
    serial: str  # the certificate's serial number as KSeF writes it: 16 upper-case hexadecimal digits
    cert_pem: str
    key_pem: str


def load(cert_path: str, key_path: str) -> OfflineCertificate:
    """The certificate and its key; ValueError (one line, no key material) when they cannot sign KOD II."""
    cert_pem, key_pem = Path(cert_path).read_bytes(), Path(key_path).read_bytes()
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise ValueError(f"{cert_path} is not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise ValueError(f"{key_path} is not an unencrypted PEM private key") from None
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
        raise ValueError(f"{key_path}: an RSA or EC key signs KOD II")
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise ValueError(f"{key_path} is not the key of {cert_path}")
    serial = f"{cert.serial_number:016X}"
    if not is_valid_certificate_serial_number(serial):
        raise ValueError(f"{cert_path} is not a KSeF certificate (its serial number is not 16 hexadecimal digits)")
    return OfflineCertificate(serial, cert_pem.decode("ascii"), key_pem.decode("ascii"))
