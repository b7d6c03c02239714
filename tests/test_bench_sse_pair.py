"""The long-stream cell's C pair (bench/sse_upstream.c, bench/sse_client.c), driven against each other and
against a socket that misbehaves: the client's counts — good streams, tokens, gaps, errors by kind — are
what the benchmark reports, so each kind is shown to be counted.  No timing is asserted (the cadence is
1 ms here to keep the test short); the bench measures speed."""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import fixtures as fx
from bench import long_streams
from bench.procs import free_port, port_open
from bench.systems import System

@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return long_streams.build(tmp_path_factory.mktemp("sse-pair"))


@contextlib.contextmanager
def _upstream(exe: Path, tmp: Path, frames: bytes) -> Iterator[dict[str, int]]:
    """Yields {"port": ...}; on the way out adds the upstream's counters (its last line at SIGTERM)."""
    (tmp / "frames").write_bytes(frames)
    port = free_port()
    p = subprocess.Popen([str(exe), str(port), str(tmp / "frames"), "1"], stdout=subprocess.PIPE)
    try:
        for _ in range(100):
            if port_open(port):
                break
            threading.Event().wait(0.05)
        up = {"port": port}
        yield up
    finally:
        p.terminate()
        out, _ = p.communicate(timeout=10)
    assert p.returncode == 0
    up.update(json.loads(out))


def _client(exe: Path, tmp: Path, port: int, streams: int) -> dict[str, int]:
    req = tmp / "request.http"
    req.write_bytes(long_streams.request(System("direct", "direct", port)))
    out = subprocess.run([str(exe), str(port), str(req), str(streams), "100", "20", str(fx.LONG_TOKENS)],
                         capture_output=True, text=True, timeout=60, check=True)
    doc: dict[str, int] = json.loads(out.stdout)
    return doc


def test_every_stream_whole(binaries: tuple[Path, Path], tmp_path: Path) -> None:
    up, client = binaries
    with _upstream(up, tmp_path, fx.long_stream_frames()) as served:
        r = _client(client, tmp_path, served["port"], 40)
        assert (r["streams"], r["good"], r["errors"]) == (40, 40, 0)
        assert r["tokens"] == 40 * fx.LONG_TOKENS
        assert r["gap_n"] == 40 * (fx.LONG_TOKENS - 1)
        assert r["ttft_n"] == r["duration_n"] == 40
        assert r["gap_max_us"] >= r["gap_p99_us"] >= r["gap_p50_us"]  # no timing asserted: 1 ms cadence
    assert (served["streams"], served["frames_sent"]) == (40, 40 * fx.LONG_TOKENS)


def test_short_stream_is_an_error(binaries: tuple[Path, Path], tmp_path: Path) -> None:
    up, client = binaries
    frames = fx.long_stream_frames().split(b"\0")[:10]  # ten tokens, no [DONE]: a chunked reply that ends
    with _upstream(up, tmp_path, b"\0".join(frames)) as served:
        r = _client(client, tmp_path, served["port"], 5)
        assert (r["good"], r["errors"], r["errors_short"]) == (0, 5, 5)
        assert r["tokens"] == 50


def _serve(reply: bytes, conns: int) -> int:
    """A socket that reads each request's first bytes, writes ``reply`` and closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)

    def run() -> None:
        with srv:
            for _ in range(conns):
                c, _ = srv.accept()
                with c:
                    c.recv(65536)
                    c.sendall(reply)

    threading.Thread(target=run, daemon=True).start()
    return int(srv.getsockname()[1])


FIRST = fx.long_stream_frames().split(b"\0")[0]


@pytest.mark.parametrize("reply,kind,tokens", [
    (b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n", "errors_status", 0),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(FIRST), FIRST),
     "errors_closed", 1),  # one token, then the connection closes mid-stream
])
def test_failed_streams_counted_by_kind(binaries: tuple[Path, Path], tmp_path: Path, reply: bytes,
                                        kind: str, tokens: int) -> None:
    _, client = binaries
    r = _client(client, tmp_path, _serve(reply, 3), 3)
    assert (r["good"], r["errors"], r[kind], r["tokens"]) == (0, 3, 3, 3 * tokens)
    assert sum(r[k] for k in r if k.startswith("errors_")) == 3
