"""THE PROJECT'S ONLY STAND-IN: a local KSeF API v2, because KSeF (api-test/api-demo/api.ksef.mf.gov.pl)
cannot be reached from where the tests run.  Everything else the tests drive is the real thing (Envoy,
PostgreSQL, Redis, the console, the real ksef-client SDK and its cryptography); this answers exactly
the endpoints control/ksef/sender.py uses, as KSeF's published OpenAPI description (ksef-client's
specs/ksef-openapi.snapshot.json, API v2) defines their requests and answers:

  GET  /v2/security/public-key-certificates          PublicKeyCertificate[] (KsefTokenEncryption, SymmetricKeyEncryption)
  POST /v2/auth/challenge                            AuthenticationChallengeResponse
  POST /v2/auth/ksef-token                           202 AuthenticationInitResponse (the token RSA-OAEP/SHA-256 "token|timestampMs")
  POST /v2/auth/xades-signature                      202 AuthenticationInitResponse (AuthTokenRequest, XAdES-signed; xmlsec verifies it)
  GET  /v2/auth/{referenceNumber}                    AuthenticationOperationStatusResponse (bearer: the authentication token)
  POST /v2/auth/token/redeem                         AuthenticationTokensResponse
  POST /v2/sessions/online                           201 OpenOnlineSessionResponse (formCode FA (3) 1-0E FA; the AES key RSA-OAEP)
  POST /v2/sessions/online/{referenceNumber}/invoices  202 SendInvoiceResponse (AES-256-CBC/PKCS#7, SHA-256 of both checked)
  POST /v2/sessions/online/{referenceNumber}/close   204
  GET  /v2/sessions/{referenceNumber}/invoices/{invoiceReferenceNumber}  SessionInvoiceStatusResponse

It checks what KSeF checks that a test can see: the token or the signature and the context NIP, the bearer token of each
call, the hashes and sizes, the decrypted document against the official FA(3) schema (status 450 when
refused), a number sent twice (440 with the first KSeF number); ``reject`` makes it refuse the next
document (450), as KSeF does a document whose content it does not accept.  KSeF numbers are
``<NIP>-<YYYYMMDD>-<12 hex>-<CRC-8>`` (ksef-client's validate_ksef_number accepts them)."""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, padding as sympad, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.x509.oid import NameOID
from lxml import etree

from fa3_schema import fa3_errors

OAEP = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)


def _cert(key: rsa.RSAPrivateKey, usage: str) -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"KSeF stand-in {usage}")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30)).sign(key, hashes.SHA256()))
    return base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()


def _crc8(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def ksef_number(nip: str) -> str:
    body = f"{nip}-{dt.date.today():%Y%m%d}-{secrets.token_hex(6).upper()}"
    return f"{body}-{_crc8(body.encode()):02X}"


def _ref(kind: str) -> str:
    return f"{dt.date.today():%Y%m%d}-{kind}-{secrets.token_hex(5).upper()}-{secrets.token_hex(5).upper()}-{secrets.token_hex(1).upper()}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


@dataclass
class Received:
    """A document KSeF took: its XML (decrypted), whether declared offline, its outcome."""
    xml: bytes
    offline: bool
    number: str
    status: dict[str, Any]
    ksef_number: str | None


@dataclass
class KsefStandIn:
    token: str
    nip: str
    port: int = 0
    cert_pem: str | None = None  # the seller's certificate, for POST /v2/auth/xades-signature
    reject: bool = False
    received: list[Received] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._token_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._aes_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._certs = [(_cert(self._token_key, "KsefTokenEncryption"), "KsefTokenEncryption"),
                       (_cert(self._aes_key, "SymmetricKeyEncryption"), "SymmetricKeyEncryption")]
        self._challenges: dict[str, int] = {}
        self._auth: dict[str, str] = {}  # authentication token -> operation reference
        self._access: set[str] = set()
        self._sessions: dict[str, tuple[bytes, bytes, bool]] = {}  # reference -> AES key, IV, open
        self._invoices: dict[tuple[str, str], Received] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "KsefStandIn":
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stand_in._serve(self, "GET")

            def do_POST(self) -> None:
                stand_in._serve(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- HTTP ----------------------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = raw if "xml" in (h.headers.get("Content-Type") or "") else json.loads(raw) if raw else None
        path = h.path.split("?")[0]
        bearer = (h.headers.get("Authorization") or "").removeprefix("Bearer ")
        with self._lock:
            self.calls.append(f"{method} {path}")
            status, answer = self._route(method, path, body, bearer)
        data = b"" if answer is None else json.dumps(answer).encode()
        h.send_response(status)
        if data:
            h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _error(status: int, code: int, description: str) -> tuple[int, dict[str, Any]]:
        return status, {"exception": {"exceptionDetailList": [{"exceptionCode": code, "exceptionDescription": description}],
                                      "referenceNumber": _ref("EX"), "serviceCode": "stand-in", "timestamp": _now()}}

    def _route(self, method: str, path: str, body: Any, bearer: str) -> tuple[int, Any]:
        if (method, path) == ("GET", "/v2/security/public-key-certificates"):
            now = dt.datetime.now(dt.timezone.utc)
            return 200, [{"certificate": c, "certificateId": hashlib.sha256(c.encode()).hexdigest()[:16],
                          "publicKeyId": base64.b64encode(hashlib.sha256(c.encode()).digest()).decode(),
                          "validFrom": (now - dt.timedelta(days=1)).isoformat(),
                          "validTo": (now + dt.timedelta(days=30)).isoformat(), "usage": [u]} for c, u in self._certs]
        if (method, path) == ("POST", "/v2/auth/challenge"):
            challenge = _ref("CR")
            ms = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
            self._challenges[challenge] = ms
            return 200, {"challenge": challenge, "timestamp": _now(), "timestampMs": ms, "clientIp": "127.0.0.1"}
        if (method, path) == ("POST", "/v2/auth/ksef-token"):
            ms = self._challenges.pop(body["challenge"], -1)
            ctx = body["contextIdentifier"]
            plain = self._token_key.decrypt(base64.b64decode(body["encryptedToken"]), OAEP).decode()
            if ms < 0 or plain != f"{self.token}|{ms}" or ctx != {"type": "Nip", "value": self.nip}:
                return self._error(400, 21301, "Brak autoryzacji.")
            token, ref = secrets.token_urlsafe(24), _ref("AU")
            self._auth[token] = ref
            return 202, {"referenceNumber": ref, "authenticationToken": {"token": token, "validUntil": _now()}}
        if (method, path) == ("POST", "/v2/auth/xades-signature"):
            return self._signed(body)
        if method == "GET" and (m := re.fullmatch(r"/v2/auth/([\w-]+)", path)) and m[1] not in ("sessions",):
            if self._auth.get(bearer) != m[1]:
                return self._error(401, 0, "Unauthorized")
            return 200, {"startDate": _now(), "authenticationMethod": "Token",
                         "authenticationMethodInfo": {"category": "Token", "code": "token.ksef", "displayName": "Token KSeF"},
                         "status": {"code": 200, "description": "Uwierzytelnianie zakończone sukcesem"}}
        if (method, path) == ("POST", "/v2/auth/token/redeem"):
            if self._auth.pop(bearer, None) is None:
                return self._error(401, 0, "Unauthorized")
            access = secrets.token_urlsafe(24)
            self._access.add(access)
            return 200, {"accessToken": {"token": access, "validUntil": _now()},
                         "refreshToken": {"token": secrets.token_urlsafe(24), "validUntil": _now()}}
        if bearer not in self._access:
            return self._error(401, 0, "Unauthorized")
        if (method, path) == ("POST", "/v2/sessions/online"):
            if body["formCode"] != {"systemCode": "FA (3)", "schemaVersion": "1-0E", "value": "FA"}:
                return self._error(400, 21405, "Nieprawidłowy kod formularza.")
            key = self._aes_key.decrypt(base64.b64decode(body["encryption"]["encryptedSymmetricKey"]), OAEP)
            ref = _ref("SO")
            self._sessions[ref] = (key, base64.b64decode(body["encryption"]["initializationVector"]), True)
            return 201, {"referenceNumber": ref, "validUntil": _now()}
        if method == "POST" and (m := re.fullmatch(r"/v2/sessions/online/([\w-]+)/invoices", path)):
            return self._take(m[1], body)
        if method == "POST" and (m := re.fullmatch(r"/v2/sessions/online/([\w-]+)/close", path)):
            key, iv, _ = self._sessions[m[1]]
            self._sessions[m[1]] = (key, iv, False)
            return 204, None
        if method == "GET" and (m := re.fullmatch(r"/v2/sessions/([\w-]+)/invoices/([\w-]+)", path)):
            got = self._invoices.get((m[1], m[2]))
            if got is None:
                return self._error(404, 21164, "Faktura o podanym identyfikatorze nie istnieje.")
            return 200, {**got.status, "ordinalNumber": 1, "referenceNumber": m[2], "invoiceNumber": got.number,
                         "invoiceHash": base64.b64encode(hashlib.sha256(got.xml).digest()).decode(),
                         "invoicingDate": _now(), "invoicingMode": "Offline" if got.offline else "Online",
                         **({"ksefNumber": got.ksef_number} if got.ksef_number else {})}
        return 404, {"title": "Not Found", "status": 404, "detail": f"{method} {path} is not one of the stand-in's"}

    def _signed(self, xml: bytes) -> tuple[int, Any]:
        """AuthTokenRequest signed (XAdES, enveloped) with the certificate the stand-in trusts."""
        import xmlsec
        root = etree.fromstring(xml)
        ns = {"a": "http://ksef.mf.gov.pl/auth/token/2.1"}
        ms = self._challenges.pop(root.findtext("a:Challenge", namespaces=ns) or "", -1)
        if self.cert_pem is None or ms < 0 or root.findtext("a:ContextIdentifier/a:Nip", namespaces=ns) != self.nip:
            return self._error(400, 21301, "Brak autoryzacji.")
        ctx = xmlsec.SignatureContext()
        ctx.key = xmlsec.Key.from_memory(self.cert_pem.encode(), xmlsec.constants.KeyDataFormatCertPem)
        for node in root.iter():
            if node.get("Id"):
                ctx.register_id(node, "Id")
        try:
            ctx.verify(xmlsec.tree.find_node(root, xmlsec.constants.NodeSignature))
        except xmlsec.Error:
            return self._error(400, 21117, "Nieprawidłowy podpis.")
        token, ref = secrets.token_urlsafe(24), _ref("AU")
        self._auth[token] = ref
        return 202, {"referenceNumber": ref, "authenticationToken": {"token": token, "validUntil": _now()}}

    def _take(self, session: str, body: dict[str, Any]) -> tuple[int, Any]:
        key, iv, open_ = self._sessions.get(session, (b"", b"", False))
        if not open_:
            return self._error(400, 21180, "Sesja nie jest otwarta.")
        enc = base64.b64decode(body["encryptedInvoiceContent"])
        if (len(enc) != body["encryptedInvoiceSize"]
                or base64.b64encode(hashlib.sha256(enc).digest()).decode() != body["encryptedInvoiceHash"]):
            return self._error(400, 21155, "Nieprawidłowy skrót lub rozmiar zaszyfrowanej faktury.")
        dec = Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor()
        unpad = sympad.PKCS7(128).unpadder()
        xml = unpad.update(dec.update(enc) + dec.finalize()) + unpad.finalize()
        if len(xml) != body["invoiceSize"] or base64.b64encode(hashlib.sha256(xml).digest()).decode() != body["invoiceHash"]:
            return self._error(400, 21155, "Nieprawidłowy skrót lub rozmiar faktury.")
        number = etree.fromstring(xml).findtext(".//{*}Fa/{*}P_2") or ""
        first = next((r for r in self.received if r.number == number and r.ksef_number), None)
        problems = fa3_errors(xml)
        if first is not None:
            status, ksef = {"status": {"code": 440, "description": "Duplikat faktury", "extensions": {
                "originalKsefNumber": first.ksef_number}}}, None
        elif problems or self.reject:
            self.reject = False
            status, ksef = {"status": {"code": 450, "description": "Błąd weryfikacji semantyki dokumentu faktury",
                                       "details": problems[:1] or ["Stand-in told to refuse this document."]}}, None
        else:
            ksef = ksef_number(self.nip)
            status = {"status": {"code": 200, "description": "Sukces"}}
        got = Received(xml, bool(body.get("offlineMode")), number, status, ksef)
        self.received.append(got)
        ref = _ref("EE")
        self._invoices[(session, ref)] = got
        return 202, {"referenceNumber": ref}
