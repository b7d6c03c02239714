"""Draining the Envoy in front of this gateway through its admin port (loopback): new connections refused
at once, then a wait for the requests and streams in flight.  One definition for every process that
drains it: the launcher (``gateway up``), the image's Envoy runner, and the ext_proc itself when it is
told to stop first (compose stops the ext_proc before the Envoy whose network it shares)."""
from __future__ import annotations

import time
import urllib.request


def active_requests(admin_port: int) -> int | None:
    """Requests and streams Envoy's public listener has in flight (None: the admin did not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/stats?filter=http.gateway.downstream_rq_active",
                                    timeout=2) as r:
            return next(int(ln.split(":")[1]) for ln in r.read().decode().splitlines()
                        if ln.startswith("http.gateway.downstream_rq_active:"))
    except (OSError, ValueError, StopIteration):
        return None


def drain(admin_port: int, grace_s: float) -> None:
    """Refuse new connections at once (the listeners close, without the graceful period in which they
    still accept), then wait up to ``grace_s`` for the requests and streams in flight to finish.  An
    Envoy that is not there (stopped already) is left alone.  Blocking: an event loop runs it in a thread."""
    try:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{admin_port}/drain_listeners",
                                                      method="POST"), timeout=2).close()
    except OSError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not active_requests(admin_port):  # 0, or the admin gone
            return
        time.sleep(0.1)
