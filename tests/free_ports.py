"""Ports for the servers the tests start themselves."""
from __future__ import annotations

import socket

_GIVEN: set[tuple[str, int]] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host``, never one this process was given before: servers are often
    started one after another, and the kernel may offer a port again until its server binds it."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if (host, port) not in _GIVEN:
            _GIVEN.add((host, port))
            return port
