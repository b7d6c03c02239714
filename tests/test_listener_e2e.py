"""End-to-end tests of the public listener against the bytes a client may really send (raw sockets,
exact bytes, HTTP/1.1 and HTTP/2 written by hand): every request passes authentication whatever its
framing (docs/interface.md section 5), and what Envoy answers itself has docs/interface.md section 7's shape."""
from __future__ import annotations

import contextlib
import json
import selectors
import socket
import struct
import time
from dataclasses import dataclass
from typing import AbstractSet, Any, Iterator

import httpx
import pytest
from hpack import Decoder, Encoder

from conftest import Gateway, running_stack, wait_for

CHAT = "/v1/chat/completions"
EMB = "/v1/embeddings"
ERR_MEMBERS = {"message", "type", "code", "param", "request_id"}


# ----------------------------------------------------------------------------------------- raw HTTP/1.1


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self, status: int, code: str, type_: str) -> dict[str, Any]:
        """docs/interface.md section 7: every member, and the request id of the header."""
        assert self.status == status, (self.status, self.body[:300])
        assert self.headers["content-type"].startswith("application/json"), self.headers
        doc = json.loads(self.body)
        assert set(doc) == {"error"} and set(doc["error"]) == ERR_MEMBERS, doc
        err: dict[str, Any] = doc["error"]
        assert (err["code"], err["type"], err["param"]) == (code, type_, None), err
        assert err["message"] and err["request_id"] == self.headers["x-request-id"], (err, self.headers)
        return err


def read_reply(sock: socket.socket) -> Reply | None:
    """One HTTP/1.1 response with a content-length, or None when the connection closes first."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            assert not buf, buf[:300]  # a reply cut short is neither a reply nor a clean refusal
            return None
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a reply"
        body += chunk
    return Reply(status, headers, body[:length])


def exchange(gw: Gateway, raw: bytes, timeout: float = 10) -> Reply | None:
    with socket.create_connection(("127.0.0.1", gw.port), timeout=timeout) as s:
        s.sendall(raw)
        return read_reply(s)


def post(path: str, length: str, body: bytes = b"", key: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n").encode() + body


# ------------------------------------------------------------------------------- raw HTTP/2 (cleartext)


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def h2_exchange(gw: Gateway, headers: list[tuple[str, str]], body: bytes | None) -> Reply | str:
    """One request on stream 1 (END_STREAM on the HEADERS frame when ``body`` is None): the reply, or
    how the stream or connection was refused ("reset", "goaway", "closed")."""
    data = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0)
            + _frame(1, 0x4 | (0x1 if body is None else 0), 1, Encoder().encode(headers)))
    if body is not None:
        data += _frame(0, 0x1, 1, body)
    status, got, out, dec = 0, {}, b"", Decoder()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(data)
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return "closed"
            buf += chunk
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                n, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                payload, buf = buf[9:9 + n], buf[9 + n:]
                if kind == 4 and not flags & 0x1:
                    s.sendall(_frame(4, 0x1, 0))  # settings acknowledged
                elif kind == 7:
                    return "goaway"
                elif kind == 3:
                    return "reset"
                elif kind == 1:
                    hs = {str(k): str(v) for k, v in dec.decode(payload)}
                    status = int(hs.pop(":status"))
                    got.update(hs)
                elif kind == 0:
                    out += payload
                if kind in (0, 1) and flags & 0x1:
                    return Reply(status, got, out)


def h2_post(path: str, length: str | None, key: str | None = None) -> list[tuple[str, str]]:
    hs = [(":method", "POST"), (":path", path), (":scheme", "http"), (":authority", "gateway")]
    if length is not None:
        hs.append(("content-length", length))
    if key:
        hs.append(("authorization", f"Bearer {key}"))
    return hs


# ------------------------------------------------------------ every framing passes authentication first

ZERO_LENGTHS = ["0", "00", "000", "0000000000000000000000000000000", " 0", "0 "]


@pytest.mark.parametrize("path", [CHAT, EMB])
@pytest.mark.parametrize("length", ZERO_LENGTHS)
def test_zero_length_without_key_401(gateway: Gateway, path: str, length: str) -> None:
    """A zero length however written means no body: the ext_proc must still see the request (it used
    to take the body-only route, skip the ext_proc and reach the router: 503 no_capacity, no key)."""
    r = exchange(gateway, post(path, length))
    assert r is not None
    r.error(401, "invalid_api_key", "authentication_error")


@pytest.mark.parametrize("path", [CHAT, EMB])
@pytest.mark.parametrize("length", ZERO_LENGTHS)
def test_zero_length_with_key_400_invalid_json(gateway: Gateway, org: tuple[str, str, str], path: str,
                                               length: str) -> None:
    """An empty body is malformed JSON (docs/interface.md section 7)."""
    r = exchange(gateway, post(path, length, key=org[2]))
    assert r is not None
    r.error(400, "invalid_json", "invalid_request_error")


@pytest.mark.parametrize("length", ["+0", "-0", "0x0", "1e0", "0,0", "+5", "0x05", "٠"])
def test_unparseable_length_400_invalid_request(gateway: Gateway, org: tuple[str, str, str], length: str) -> None:
    """A length that is not a number (RFC 9112 section 6.3: unrecoverable framing, 400 and close) is
    refused by Envoy's codec before it is a request, so before any key is read: the interface's JSON with a
    request id, then the connection is closed.  (The reply used to be lost: held for the ext_proc's
    response phase and dropped when Envoy closed the connection, envoyproxy/envoy#29440.)"""
    for key in (None, org[2]):
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
            s.sendall(post(CHAT, length, b"{}", key=key))
            r = read_reply(s)
            assert r is not None, "closed without a reply"
            r.error(400, "invalid_request", "invalid_request_error")
            assert r.headers["connection"] == "close"
            assert s.recv(100) == b""


@pytest.mark.parametrize("raw", [b"GARBAGE\r\n\r\n", b"GET /v1/models HTTP/1.1\r\nHo st: x\r\n\r\n",
                                 b"GET v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
                                 b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n{}"],
                         ids=["garbage", "space_in_name", "relative_path", "length_and_chunked"])
def test_malformed_request_400_invalid_request(gateway: Gateway, raw: bytes) -> None:
    r = exchange(gateway, raw)
    assert r is not None, "closed without a reply"
    r.error(400, "invalid_request", "invalid_request_error")


@pytest.mark.parametrize("chunks", [b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}\r\nzz\r\n0\r\n\r\n",
                                    b"ffffffffffffffffffff\r\n{}\r\n0\r\n\r\n", b"-2\r\n{}\r\n0\r\n\r\n"],
                         ids=["bad_size", "bad_later_size", "size_overflow", "negative_size"])
@pytest.mark.parametrize("path", [CHAT, EMB])
def test_malformed_chunk_framing_400_invalid_request(gateway: Gateway, org: tuple[str, str, str], path: str,
                                                     chunks: bytes) -> None:
    """A body whose chunk framing Envoy's codec cannot read, after the request was routed: the interface's 400
    with the request's id, then the connection is closed.  (The reply used to be lost: held for the
    ext_proc's reply phase and dropped when Envoy closed the connection at once, envoyproxy/envoy#29440;
    the client got nothing after 1 s.)"""
    for key in (None, org[2]):
        auth = f"Authorization: Bearer {key}\r\n" if key else ""
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n{auth}"
                      f"Transfer-Encoding: chunked\r\n\r\n".encode() + chunks)
            r = read_reply(s)
            assert r is not None, "closed without a reply"
            r.error(400, "invalid_request", "invalid_request_error")
            assert r.headers["connection"] == "close" and "x-gateway-local" not in r.headers, r.headers
            assert s.recv(100) == b""


@pytest.mark.parametrize("raw", [b"GET /v1/models#frag HTTP/1.1\r\nHost: x\r\n\r\n",
                                 b"GET /v1/models HTTP/1.1\r\n\r\n",
                                 b"GET /v1/models HTTP/1.1\r\nHost: a b\r\n\r\n"],
                         ids=["fragment_in_path", "no_host", "host_not_an_authority"])
def test_requests_envoy_refuses_before_routing_get_spec_errors(gateway: Gateway, org: tuple[str, str, str],
                                                               raw: bytes) -> None:
    """Refused by Envoy itself before a route or the ext_proc saw them: the interface's JSON error and a request id
    all the same (Envoy's own reply was an empty or plain-text 400)."""
    r = exchange(gateway, raw.replace(b"\r\n\r\n", f"\r\nAuthorization: Bearer {org[2]}\r\n\r\n".encode(), 1))
    assert r is not None, "closed without a reply"
    r.error(400, "invalid_request", "invalid_request_error")


@pytest.mark.parametrize("line", ["FOO /v1/chat/completions", "get /v1/models", "QUERY /v1/models", "OPTIONS *"])
def test_methods_and_targets_not_offered_404_unsupported_endpoint(gateway: Gateway, org: tuple[str, str, str],
                                                                  line: str) -> None:
    """Any method token is a method (HTTP/1.1 as over HTTP/2): one not offered is the interface's 404
    unsupported_endpoint, as is a request for no path at all; Envoy refused a QUERY without a Content-Type
    and OPTIONS * itself, with an empty reply."""
    r = exchange(gateway, f"{line} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {org[2]}\r\n\r\n".encode())
    assert r is not None, "closed without a reply"
    r.error(404, "unsupported_endpoint", "invalid_request_error")


def test_unknown_method_without_key_401(gateway: Gateway) -> None:
    r = exchange(gateway, b"FOO /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert r is not None
    r.error(401, "invalid_api_key", "authentication_error")


@pytest.mark.parametrize("host", ["Host: gateway\r\n", ""], ids=["host", "no_host"])
def test_http_1_0_served(gateway: Gateway, org: tuple[str, str, str], host: str) -> None:
    """An HTTP/1.0 client is served (Envoy's default answer was 426 Upgrade Required, no JSON)."""
    r = exchange(gateway, f"GET /v1/models HTTP/1.0\r\n{host}Authorization: Bearer {org[2]}\r\n\r\n".encode())
    assert r is not None
    assert r.status == 200 and r.headers["x-request-id"], (r.status, r.body[:200])
    doc = json.loads(r.body)
    assert doc["object"] == "list" and {m["id"] for m in doc["data"]} >= {"polish-pro"}, doc


def test_connect_method_401(gateway: Gateway) -> None:
    """A CONNECT has no path a route matches: the ext_proc still sees it (401 before anything else)."""
    r = exchange(gateway, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    assert r is not None
    r.error(401, "invalid_api_key", "authentication_error")


def test_a_400_of_the_gateways_own_keeps_the_connection(gateway: Gateway, org: tuple[str, str, str]) -> None:
    """A refused request (invalid JSON, a parameter out of range) ends that request, not the connection:
    the next request on it is served (Envoy closed an HTTP/1.1 connection after any 400 it sent)."""
    ok = json.dumps({"model": "polish-pro", "messages": [{"role": "user", "content": "hi"}]}).encode()
    bad = [b"{nope", json.dumps({"model": "polish-pro", "messages": []}).encode(),
           json.dumps({"model": "polish-pro", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 0}).encode()]
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        for body, code in zip(bad, ["invalid_json", "invalid_request", "invalid_request"]):
            s.sendall(post(CHAT, str(len(body)), body, org[2]))
            r = read_reply(s)
            assert r is not None, "closed without a reply"
            err = json.loads(r.body)["error"]
            assert (r.status, err["code"], err["request_id"]) == (400, code, r.headers["x-request-id"]), err
            assert r.headers.get("connection") != "close", r.headers
        s.sendall(post(CHAT, str(len(ok)), ok, org[2]))
        r = read_reply(s)
        assert r is not None and r.status == 200, (r and r.status, r and r.body[:200])
        assert json.loads(r.body)["model"] == "polish-pro"


_UPGRADES = {"websocket": "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
             "h2c": "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
             "other": "Connection: Upgrade\r\nUpgrade: foo/2\r\n"}


@pytest.mark.parametrize("upgrade", sorted(_UPGRADES))
def test_upgrade_requests_are_served_as_plain_requests(gateway: Gateway, org: tuple[str, str, str],
                                                       upgrade: str) -> None:
    """A request that asks to switch protocols is the plain request it also is: the key checked first
    (Envoy's own refusal was an empty 403 before any filter), then served; never a 101."""
    head = _UPGRADES[upgrade]
    r = exchange(gateway, f"GET /v1/models HTTP/1.1\r\nHost: gateway\r\n{head}\r\n".encode())
    assert r is not None
    r.error(401, "invalid_api_key", "authentication_error")
    r = exchange(gateway, f"GET /v1/models HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {org[2]}\r\n"
                          f"{head}\r\n".encode())
    assert r is not None and r.status == 200 and r.headers["x-request-id"], (r.status, r.body[:200])
    assert "upgrade" not in r.headers and json.loads(r.body)["object"] == "list"
    body = json.dumps({"model": "polish-pro", "messages": [{"role": "user", "content": "hi"}]}).encode()
    raw = post(CHAT, str(len(body)), body, org[2]).replace(b"\r\n\r\n", b"\r\n" + head.encode() + b"\r\n", 1)
    r = exchange(gateway, raw)
    assert r is not None and r.status == 200, (r and r.status, r and r.body[:300])
    doc = json.loads(r.body)
    assert doc["object"] == "chat.completion" and doc["model"] == "polish-pro", doc


@pytest.mark.parametrize("length", ["0", "00", "000"])
def test_h2_zero_length_without_key_401(gateway: Gateway, length: str) -> None:
    r = h2_exchange(gateway, h2_post(CHAT, length), None)
    assert isinstance(r, Reply), r
    r.error(401, "invalid_api_key", "authentication_error")


def test_h2_length_without_body_refused(gateway: Gateway) -> None:
    """HTTP/2 framing that contradicts its length (END_STREAM on the headers, or fewer bytes than
    announced) is a protocol error: the stream or connection is refused, nothing else."""
    assert h2_exchange(gateway, h2_post(CHAT, "5"), None) in ("reset", "goaway", "closed")
    assert h2_exchange(gateway, h2_post(CHAT, "5"), b"{}") in ("reset", "goaway", "closed")


def test_leading_zero_length_with_body_served(gateway: Gateway, org: tuple[str, str, str]) -> None:
    """A length with leading zeros takes the route where the ext_proc sees the headers: same service."""
    body = json.dumps({"model": "polish-fast", "messages": [{"role": "user", "content": "hej"}]}).encode()
    r = exchange(gateway, post(CHAT, "000" + str(len(body)), body, key=org[2]))
    assert r is not None and r.status == 200, r
    doc = json.loads(r.body)
    assert doc["model"] == "polish-fast" and doc["object"] == "chat.completion"
    assert r.headers["x-request-id"]
    r = exchange(gateway, post(CHAT, "0" + str(len(body)), body))
    assert r is not None
    r.error(401, "invalid_api_key", "authentication_error")


def test_h2_body_served(gateway: Gateway, org: tuple[str, str, str]) -> None:
    body = json.dumps({"model": "polish-fast", "messages": [{"role": "user", "content": "hej"}]}).encode()
    r = h2_exchange(gateway, h2_post(CHAT, str(len(body)), org[2]), body)
    assert isinstance(r, Reply) and r.status == 200, r
    assert json.loads(r.body)["model"] == "polish-fast"



# ---------------------------------------------------------------------------------------- JSON nesting

UNKNOWN_KEY = "sk-service-" + "Zq9" * 13 + "Z"


def _deep(path: str, depth: int) -> bytes:
    field = ('"messages": [{"role": "user", "content": "hej"}], "model": "polish-fast"' if path == CHAT
             else '"input": "hej", "model": "embed"')
    return ("{" + field + ', "x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}").encode()


@pytest.mark.parametrize("path", [CHAT, EMB])
def test_deep_nesting_400_invalid_json(gateway: Gateway, org: tuple[str, str, str], path: str) -> None:
    """100,000 nested arrays used to end in a RecursionError (500); deeper than the documented 128
    levels is malformed JSON for the gateway (docs/configuration.md)."""
    for raw in (b"[" * 100_000, b"[" * 100_000 + b"]" * 100_000, _deep(path, 129), _deep(path, 5000)):
        r = exchange(gateway, post(path, str(len(raw)), raw, key=org[2]))
        assert r is not None
        r.error(400, "invalid_json", "invalid_request_error")
    raw = _deep(path, 128)
    r = exchange(gateway, post(path, str(len(raw)), raw, key=org[2]))
    assert r is not None and r.status == 200, r


@pytest.mark.parametrize("key", [None, UNKNOWN_KEY])
@pytest.mark.parametrize("path", [CHAT, EMB])
def test_deep_nesting_without_valid_key_401_first(gateway: Gateway, path: str, key: str | None) -> None:
    """Authentication comes first (docs/interface.md section 5): a deep body without a valid key is 401, not 400."""
    for raw in (b"[" * 100_000, _deep(path, 129)):
        r = exchange(gateway, post(path, str(len(raw)), raw, key=key))
        assert r is not None
        r.error(401, "invalid_api_key", "authentication_error")


# ------------------------------------------------- the listener's own limits (a stack with short ones)

HEADERS_TIMEOUT = 2.0
IDLE_TIMEOUT = 8.0
MAX_CONNECTIONS = 60
MAX_STREAMS = 7
DELAYED_CLOSE = 1.0  # Envoy's delayed_close_timeout (default): it waits that long for the client to close


@pytest.fixture(scope="module")
def limited() -> Iterator[Gateway]:
    with running_stack("gw-listener-", default_rpm=100000, default_concurrency=1000,
                       request_headers_timeout_s=HEADERS_TIMEOUT, connection_idle_timeout_s=IDLE_TIMEOUT,
                       max_connections=MAX_CONNECTIONS, max_streams_per_connection=MAX_STREAMS,
                       trusted_hops=1) as gw:
        yield gw


def _active(gw: Gateway) -> int:
    """Client connections Envoy holds on the public listener (its admin statistics)."""
    url = f"http://127.0.0.1:{gw.stack.s.envoy_admin_port}/stats?filter=^http\\.gateway\\.downstream_cx_active$"
    return int(httpx.get(url).text.split(":")[1])


def _until_closed(socks: dict[socket.socket, float], deadline: float,
                  trickle: AbstractSet[socket.socket] = frozenset()) -> dict[socket.socket, tuple[float, bytes]]:
    """Read every socket until the peer closes it: (seconds from its start to the close, bytes received).
    The ``trickle`` sockets are sent one more header byte every 0.2 s meanwhile."""
    got: dict[socket.socket, bytes] = {s: b"" for s in socks}
    closed: dict[socket.socket, tuple[float, bytes]] = {}
    with selectors.DefaultSelector() as sel:
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        while len(closed) < len(socks) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    got[s] += chunk
                else:
                    closed[s] = (time.monotonic() - socks[s], got[s])
                    sel.unregister(s)
            for s in trickle - set(closed):
                with contextlib.suppress(OSError):
                    s.send(b"x")
    return closed


def _reply_of(raw: bytes) -> Reply:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    assert len(body) == int(headers["content-length"]), raw
    return Reply(int(lines[0].split()[1]), headers, body)


def test_slowloris_connections_closed_within_headers_timeout(limited: Gateway) -> None:
    """50 connections that start a request and never finish its headers (some keep trickling bytes)
    are each answered the interface's JSON 400 and closed once the headers timeout has passed; a normal request
    is served meanwhile.  Without the timeout they stayed open indefinitely."""
    key = limited.new_org(100_000_000)[2]
    partial = [b"POST /v1/chat/comp",
               b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer " + key.encode()
               + b"\r\nContent-Le",
               b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\nX-Slow-"]
    socks: dict[socket.socket, float] = {}
    trickle: set[socket.socket] = set()
    try:
        for i in range(50):
            s = socket.create_connection(("127.0.0.1", limited.port), timeout=5)
            s.sendall(partial[i % 3])
            socks[s] = time.monotonic()
            if i % 10 == 0:
                trickle.add(s)
        wait_for(lambda: _active(limited) >= 50, timeout=HEADERS_TIMEOUT - 0.5)  # all held at once
        with httpx.Client(base_url=limited.v1, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            r = c.post("/chat/completions", json={"model": "polish-fast",
                                                  "messages": [{"role": "user", "content": "hej"}]})
            assert r.status_code == 200, r.text
        closed = _until_closed(socks, time.monotonic() + HEADERS_TIMEOUT + DELAYED_CLOSE + 10, trickle)
        assert len(closed) == 50, f"{50 - len(closed)} of 50 connections still open"
        for took, raw in closed.values():
            assert HEADERS_TIMEOUT - 0.2 <= took <= HEADERS_TIMEOUT + DELAYED_CLOSE + 5, took
            r1 = _reply_of(raw)
            r1.error(400, "invalid_request", "invalid_request_error")
            assert r1.headers["connection"] == "close"
        ids = {json.loads(_reply_of(raw).body)["error"]["request_id"] for _, raw in closed.values()}
        assert len(ids) == 50  # one request id each
    finally:
        for s in socks:
            s.close()


def test_idle_connections_closed_within_idle_timeout(limited: Gateway) -> None:
    """Connections that send nothing at all are closed, without a reply, once idle that long."""
    socks = {socket.create_connection(("127.0.0.1", limited.port), timeout=5): time.monotonic()
             for _ in range(10)}
    try:
        closed = _until_closed(socks, time.monotonic() + IDLE_TIMEOUT + 10)
        assert len(closed) == 10, f"{10 - len(closed)} of 10 idle connections still open"
        for took, raw in closed.values():
            assert raw == b"" and IDLE_TIMEOUT - 0.2 <= took <= IDLE_TIMEOUT + 5, (took, raw)
    finally:
        for s in socks:
            s.close()


def test_connection_cap_refuses_connections_above_it(limited: Gateway) -> None:
    """With GATEWAY_MAX_CONNECTIONS held open, one more connection is closed as soon as it is accepted
    (no reply: nothing was read); once one of them closes, requests are served again."""
    wait_for(lambda: _active(limited) == 0, timeout=30)
    key = limited.new_org(100_000_000)[2]
    held = [socket.create_connection(("127.0.0.1", limited.port), timeout=5) for _ in range(MAX_CONNECTIONS)]
    try:
        wait_for(lambda: _active(limited) == MAX_CONNECTIONS, timeout=IDLE_TIMEOUT / 2)
        extra = {socket.create_connection(("127.0.0.1", limited.port), timeout=5): time.monotonic()
                 for _ in range(3)}
        closed = _until_closed(extra, time.monotonic() + IDLE_TIMEOUT / 2)
        assert len(closed) == 3 and all(raw == b"" for _, raw in closed.values()), closed
        for s in extra:
            s.close()
        assert _active(limited) == MAX_CONNECTIONS  # the held ones are untouched
        for s in held[:5]:
            s.close()
        with httpx.Client(base_url=limited.v1, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            assert c.get("/models").status_code == 200
    finally:
        for s in held:
            s.close()


def _h2_settings_from(s: socket.socket) -> dict[int, int]:
    """The SETTINGS Envoy announces on a new HTTP/2 connection (the frames before them are read too)."""
    buf = b""
    while True:
        chunk = s.recv(9 - len(buf) if len(buf) < 9 else 9 + int.from_bytes(buf[:3], "big") - len(buf))
        assert chunk, "closed before SETTINGS"
        buf += chunk
        if len(buf) >= 9 and len(buf) == 9 + int.from_bytes(buf[:3], "big"):
            kind, flags, payload, buf = buf[3], buf[4], buf[9:], b""
            if kind == 4 and not flags & 0x1:
                return {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
                        for i in range(0, len(payload), 6)}


def _h2_settings(gw: Gateway) -> dict[int, int]:
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0))
        return _h2_settings_from(s)


def test_h2_concurrent_streams_per_connection(limited: Gateway) -> None:
    """GATEWAY_MAX_STREAMS_PER_CONNECTION is what Envoy announces as SETTINGS_MAX_CONCURRENT_STREAMS; a
    client that opens more at once breaks HTTP/2 and loses the connection."""
    assert _h2_settings(limited)[0x3] == MAX_STREAMS
    enc = Encoder()
    opened = b"".join(_frame(1, 0x4, sid, enc.encode(h2_post(CHAT, "100")))  # bodies never sent
                      for sid in range(1, 2 * MAX_STREAMS + 2, 2))
    with socket.create_connection(("127.0.0.1", limited.port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0))
        _h2_settings_from(s)
        s.sendall(_frame(4, 0x1, 0) + opened)  # one stream more than announced: Envoy ends the connection
        while s.recv(65536):  # until Envoy closes it (a socket timeout fails the test)
            pass


# ----------------------------------------------------------------------------- trusted proxy hops


SPOOF = {"X-Forwarded-For": "203.0.113.7, 198.51.100.9", "X-Envoy-External-Address": "203.0.113.66",
         "X-Envoy-Internal": "true"}


def _seen(gw: Gateway, key: str, headers: dict[str, str]) -> tuple[dict[str, str], str]:
    """The headers the model server got (the simulator echoes them) and the client address Envoy
    decided on (its access log's ``client``, found by the request id)."""
    with httpx.Client(base_url=gw.v1, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
        r = c.post("/chat/completions", headers=headers,
                   json={"model": "polish-fast", "messages": [{"role": "user", "content": "hej"}],
                         "sim": {"echo": True}})
    assert r.status_code == 200, r.text
    seen: dict[str, str] = json.loads(r.json()["choices"][0]["message"]["content"])["headers"]
    rid = r.headers["x-request-id"]
    access = gw.stack.state / "logs" / "envoy-access.log"
    # Envoy flushes its access log about once a second: wait for this request's line
    line = wait_for(lambda: next((d for d in map(json.loads, access.read_text().splitlines())
                                  if d["request_id"] == rid), None), timeout=15)
    return {k.lower(): v for k, v in seen.items()}, str(line["client"])


def test_no_trusted_hops_client_address_is_the_peer(gateway: Gateway, org: tuple[str, str, str]) -> None:
    """GATEWAY_TRUSTED_HOPS=0 (the default): whatever a client writes in X-Forwarded-For, its address is
    the socket's peer, and it cannot pass itself off as internal; none of it reaches the model server."""
    seen, client = _seen(gateway, org[2], SPOOF)
    assert client == "127.0.0.1"
    for h in ("x-forwarded-for", "x-envoy-external-address", "x-envoy-internal"):
        assert h not in seen, seen


def test_trusted_hops_client_address_from_the_proxy(limited: Gateway) -> None:
    """GATEWAY_TRUSTED_HOPS=1: the address the proxy in front appended (the rightmost) is the client's;
    what the client itself wrote before it is not trusted."""
    key = limited.new_org(100_000_000)[2]
    seen, client = _seen(limited, key, SPOOF)
    assert client == "198.51.100.9"
    assert "x-envoy-internal" not in seen and "x-forwarded-for" not in seen, seen
    assert _seen(limited, key, {"X-Forwarded-For": "198.51.100.10"})[1] == "198.51.100.10"
