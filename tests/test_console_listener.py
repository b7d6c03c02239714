"""The console's listener under a slow or greedy client, as the API's is (tests/test_listener_e2e.py):
a client trickling header lines is cut off at the header timeout, an idle connection at the idle
timeout, a slow body is answered 408 and a big one 413, and over the connection cap one more
connection is answered 503 and closed while the console goes on serving once a slot is free.  A
console of the test stack's with small limits (seconds, not minutes) takes the attacks; the stack's
own console shows the defaults: a trickle cut off at 10 s, 250 idle connections not stopping it."""
from __future__ import annotations

import selectors
import socket
import time
from typing import Iterator

import httpx
import pytest

from conftest import Gateway, wait_for
from control.console.listener import REFUSAL
from test_listener_e2e import _reply_of, _until_closed

HEADERS_TIMEOUT = 2.0
BODY_TIMEOUT = 3.0  # longer than the head's: a 408 at 3 s shows the head's deadline ended with the head
IDLE_TIMEOUT = 4.0
MAX_CONNECTIONS = 40


@pytest.fixture(scope="module")
def small(gateway: Gateway) -> Iterator[int]:
    """A second console on the test stack's stores, with small listener limits: its port."""
    with gateway.another_console("console-small", console_headers_timeout_s=HEADERS_TIMEOUT,
                                 console_body_timeout_s=BODY_TIMEOUT, console_idle_timeout_s=IDLE_TIMEOUT,
                                 console_max_connections=MAX_CONNECTIONS) as port:
        yield port


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _trickling(port: int) -> socket.socket:
    s = _connect(port)
    s.sendall(b"GET /login HTTP/1.1\r\nHost: console\r\n")
    return s


def _trickle_lines(socks: dict[socket.socket, float], every: float, deadline: float) -> dict[socket.socket, float]:
    """Send each socket one more header line every ``every`` seconds until the console closes it:
    seconds from its start to the close, per socket.  Nothing may be answered meanwhile."""
    closed: dict[socket.socket, float] = {}
    n = 0
    with selectors.DefaultSelector() as sel:
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        next_line = time.monotonic() + every
        while len(closed) < len(socks) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.1):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    got = s.recv(65536)
                except ConnectionResetError:
                    got = b""
                assert got == b"", got[:200]  # cut off, not answered
                closed[s] = time.monotonic() - socks[s]
                sel.unregister(s)
            if time.monotonic() >= next_line:
                n += 1
                for s in set(socks) - set(closed):
                    try:
                        s.send(f"X-Trickle-{n}: y\r\n".encode())
                    except OSError:
                        pass
                next_line += every
    return closed


def test_a_trickling_client_is_cut_off_at_the_header_timeout(gateway: Gateway, small: int) -> None:
    socks = {_trickling(small): time.monotonic() for _ in range(5)}
    try:
        closed = _trickle_lines(socks, 0.5, time.monotonic() + HEADERS_TIMEOUT + 10)
        assert len(closed) == 5, f"{5 - len(closed)} of 5 trickling connections still open"
        for took in closed.values():
            assert HEADERS_TIMEOUT - 0.2 <= took <= HEADERS_TIMEOUT + 2, took
        assert httpx.get(f"http://127.0.0.1:{small}/login").status_code == 200  # served meanwhile and after
    finally:
        for s in socks:
            s.close()


def test_the_stack_console_cuts_a_trickle_off_within_10_s(gateway: Gateway) -> None:
    """The defaults (GATEWAY_CONSOLE_HEADERS_TIMEOUT_S=10): a header line every 2 s held a connection
    75 s before; now 10 s."""
    port = gateway.stack.s.console_http_port
    s = _trickling(port)
    try:
        closed = _trickle_lines({s: time.monotonic()}, 2.0, time.monotonic() + 20)
        assert len(closed) == 1 and 9.8 <= closed[s] <= 12.0, closed
    finally:
        s.close()


def test_idle_connections_are_closed_at_the_idle_timeout(gateway: Gateway, small: int) -> None:
    """Connections that never send a byte, and one idle after a request it was answered, are closed
    without a reply once idle that long."""
    socks = {_connect(small): time.monotonic() for _ in range(5)}
    served = _connect(small)
    served.sendall(b"GET /healthz HTTP/1.1\r\nHost: console\r\n\r\n")
    reply = served.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"ok"), reply
    socks[served] = time.monotonic()
    try:
        closed = _until_closed(socks, time.monotonic() + IDLE_TIMEOUT + 10)
        assert len(closed) == 6, f"{6 - len(closed)} of 6 idle connections still open"
        for took, raw in closed.values():
            assert raw == b"" and IDLE_TIMEOUT - 0.2 <= took <= IDLE_TIMEOUT + 2, (took, raw)
    finally:
        for s in socks:
            s.close()


def test_a_keep_alive_connection_is_served_past_the_header_timeout(gateway: Gateway, small: int) -> None:
    """The head's deadline is each request's own: requests every 1.5 s on one connection, 6 s in all."""
    s = _connect(small)
    try:
        for i in range(5):
            due = time.monotonic() + (1.5 if i else 0)
            wait_for(lambda: time.monotonic() >= due, timeout=3)  # noqa: B023 (read at once)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: console\r\n\r\n")
            reply = s.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"ok"), (i, reply)
    finally:
        s.close()


def test_a_slow_body_is_answered_408_and_a_big_one_413(gateway: Gateway, small: int) -> None:
    slow = _connect(small)
    try:
        slow.sendall(b"POST /login HTTP/1.1\r\nHost: console\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                     b"Content-Length: 1000\r\n\r\nemail=a")
        start = time.monotonic()
        closed = _until_closed({slow: start}, start + BODY_TIMEOUT + 10)
        took, raw = closed[slow]
        assert BODY_TIMEOUT - 0.2 <= took <= BODY_TIMEOUT + 2, took
        r = _reply_of(raw)
        assert r.status == 408 and r.body == b"The request's body came too slowly.\n", r
        assert r.headers["connection"] == "close"
    finally:
        slow.close()
    for path in ("/login", "/payments/notify/sandbox"):
        r2 = httpx.post(f"http://127.0.0.1:{small}{path}", content=b"x" * (64 * 1024 + 1),
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r2.status_code == 413, (path, r2.status_code, r2.text[:200])


def test_the_connection_cap_holds_and_refuses_cleanly(gateway: Gateway, small: int) -> None:
    """250 idle connections against a cap of 40: 40 are held, each of the others is answered 503 and
    closed at once, a fresh client too; once the held ones reach the idle timeout it is served again."""
    url = f"http://127.0.0.1:{small}/login"
    wait_for(lambda: httpx.get(url).status_code == 200, timeout=IDLE_TIMEOUT + 5)  # the earlier tests' gone
    socks = {_connect(small): time.monotonic() for _ in range(250)}
    try:
        refused = _until_closed(socks, time.monotonic() + IDLE_TIMEOUT / 2)
        assert len(refused) == 250 - MAX_CONNECTIONS, len(refused)
        assert all(raw == REFUSAL for _, raw in refused.values())
        r = _reply_of(REFUSAL)
        assert r.status == 503 and r.headers["retry-after"] == "5" and r.body == b"Too many connections; try again shortly.\n"
        fresh = httpx.get(url)
        assert fresh.status_code == 503 and fresh.text == "Too many connections; try again shortly.\n"
        held = {s: t for s, t in socks.items() if s not in refused}
        closed = _until_closed(held, time.monotonic() + IDLE_TIMEOUT + 10)
        assert len(closed) == MAX_CONNECTIONS and all(raw == b"" for _, raw in closed.values())
        assert httpx.get(url).status_code == 200
    finally:
        for s in socks:
            s.close()


def test_the_stack_console_serves_beside_250_idle_connections(gateway: Gateway) -> None:
    port = gateway.stack.s.console_http_port
    socks = [_connect(port) for _ in range(250)]
    try:
        start = time.monotonic()
        r = httpx.get(f"http://127.0.0.1:{port}/login")
        assert r.status_code == 200 and time.monotonic() - start < 2
    finally:
        for s in socks:
            s.close()
