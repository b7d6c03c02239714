"""A process of the stack as the launcher runs it, and the readiness probes it waits on."""
from __future__ import annotations

import signal
import socket
import subprocess
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable


def stop_requested() -> Callable[[], bool]:
    """From now on SIGTERM and SIGINT only raise a flag: the returned function says whether one came."""
    came: list[bool] = []

    def note(*_: Any) -> None:
        came.append(True)

    signal.signal(signal.SIGTERM, note)
    signal.signal(signal.SIGINT, note)
    return lambda: bool(came)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as r:
            return 200 <= int(r.status) < 300
    except Exception:  # noqa: BLE001
        return False


@dataclass
class Proc:
    name: str
    argv: list[str]
    ready: Callable[[], bool]
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

