"""`make run`, as the README writes it, from fresh clones wherever a newcomer makes them: as root in `/root`
and in a private (0700) folder whose path has spaces and Polish letters (as an ordinary user: in their
home); two such stacks side by side on one machine, each serving and reaching only its own simulators; and
a port already taken stops `gateway up` with one line naming the port and the setting that moves it.

Each clone gets its `.venv` the way `make install` would fill it, in seconds: the packages of this
environment hard-linked into it (real files under the clone's own path, so the embedded PostgreSQL's
binaries sit where `make install` would put them), and the clone's own code instead of this checkout's."""
from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import accounts_lock, free_base
from docs_blocks import marked, sample_matches

REPO = Path(__file__).resolve().parent.parent
SITE = Path(sysconfig.get_paths()["purelib"])
VERSION = "%d.%d" % sys.version_info[:2]


def _link_tree(src: Path, dst: Path) -> None:
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dst, copy_function=link, symlinks=True,
                    ignore=lambda d, names: [n for n in names if n.startswith(("__editable__", "llm_gateway-"))
                                             or n == "__pycache__"])


def _script(python: Path, body: str) -> str:
    """A console script that works whatever the path (pip's form: a shebang line cannot hold spaces)."""
    return f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n{body}"


def prepared_clone(dest: Path) -> Path:
    """A clone of this repository's committed tree at ``dest`` with a ready `.venv` (see the docstring)."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(dest)], check=True, capture_output=True)
    venv = dest / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site = venv / "lib" / f"python{VERSION}" / "site-packages"
    shutil.rmtree(site)
    _link_tree(SITE, site)
    (site / "gateway-clone.pth").write_text(str(dest) + "\n")  # the clone's code, as `pip install -e .` does
    python = venv / "bin" / "python"
    for name, body in {"gateway": "import sys\nfrom control.cli import main\nsys.exit(main())\n",
                       "envoy": "import sys\nfrom envoy._main import main\nsys.exit(main())\n"}.items():
        (venv / "bin" / name).write_text(_script(python, body))
        (venv / "bin" / name).chmod(0o755)
    (venv / ".installed").touch()  # the Makefile's stamp: installed, newer than pyproject.toml
    return dest


def _modes(p: Path) -> list[tuple[str, int, int, int]]:
    return [(str(q), q.stat().st_mode, q.stat().st_uid, q.stat().st_gid) for q in [p, *p.parents]]


class Run:
    """`make run` in a clone, its output read as it comes."""

    def __init__(self, clone: Path, base: int) -> None:
        self.clone, self.base = clone, base
        env = {**os.environ, "GATEWAY_PORT": str(base), "GATEWAY_METRICS_PORT": str(base + 19)}
        for k in ("GATEWAY_STATE_DIR", "GATEWAY_CATALOG", "DATABASE_URL", "REDIS_URL", "GATEWAY_DEV"):
            env.pop(k, None)
        self.proc = subprocess.Popen(["make", "run"], cwd=clone, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.out = b""

    def key(self, timeout: float = 150) -> str:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while not self.out.endswith(b"every process.\n"):
            assert self.proc.poll() is None, self.failed(f"make run exited {self.proc.returncode}")
            assert time.monotonic() < deadline, self.failed("not ready in time")
            if sel.select(timeout=0.5):
                self.out += os.read(self.proc.stdout.fileno(), 65536)
        text = self.out.decode()
        assert f"Gateway ready on http://127.0.0.1:{self.base}/v1" in text, self.failed("not ready")
        (sample,) = marked("output of: make run")  # README's sample of this output, as it stands
        expected = sample.text.replace(":8080/", f":{self.base}/").replace(":8081/", f":{self.base + 1}/")
        assert not sample_matches(expected, text), (sample_matches(expected, text), text)
        m = re.search(r"API key:\s+(sk-service-\S+)", text)
        assert m, text
        return m.group(1)

    def failed(self, what: str) -> str:
        logs = self.clone / ".gateway" / "logs"
        return (f"{what}: {self.out.decode(errors='replace')[-2000:]}"
                + "".join(f"\n--- {p.name}: {p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.glob("*.log"))))

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()


@pytest.fixture
def places() -> Iterator[list[Path]]:
    """Two fresh private folders: in the account's home (`/root` as root), and a `mktemp -d` (0700) folder
    with a sub-folder whose name has spaces and Polish letters."""
    home = Path(os.path.expanduser("~"))
    a = home / f"gw-clone-{uuid.uuid4().hex[:8]}"
    b_top = Path(tempfile.mkdtemp(prefix="gw-clone-"))
    b = b_top / "mój katalog z ż"
    try:
        yield [a, b]
    finally:
        shutil.rmtree(a, ignore_errors=True)
        shutil.rmtree(b_top, ignore_errors=True)


def test_make_run_from_private_folders_two_stacks_side_by_side(places: list[Path]) -> None:
    with accounts_lock():  # no other test adds an account meanwhile
        _two_stacks_side_by_side(places)


def _two_stacks_side_by_side(places: list[Path]) -> None:
    a, b = places
    assert stat.S_IMODE(b.parent.stat().st_mode) == 0o700
    clones = [prepared_clone(a), prepared_clone(b)]
    before = [_modes(c) for c in clones]
    accounts = [(f, f.read_bytes(), f.stat().st_mtime_ns) for f in (Path("/etc/passwd"), Path("/etc/group"))]
    bases = [free_base(), free_base()]
    while abs(bases[0] - bases[1]) < 40:
        bases[1] = free_base()
    runs = [Run(c, base) for c, base in zip(clones, bases)]  # both start at once
    try:
        keys = [r.key() for r in runs]
        for i, (run, key) in enumerate(zip(runs, keys)):
            other = runs[1 - i].base
            r = httpx.post(f"http://127.0.0.1:{run.base}/v1/chat/completions", timeout=30,
                           headers={"Authorization": f"Bearer {key}"},
                           json={"model": "polish-pro", "messages": [{"role": "user", "content": "Dzień dobry"}]})
            assert r.status_code == 200, r.text
            assert r.json()["model"] == "polish-pro" and r.json()["usage"]["completion_tokens"] > 0
            rid = r.headers["x-request-id"]
            own = [httpx.get(f"http://127.0.0.1:{run.base + k}/sim/requests/{rid}").status_code for k in (15, 16)]
            theirs = [httpx.get(f"http://127.0.0.1:{other + k}/sim/requests/{rid}").status_code for k in (15, 16)]
            assert 200 in own and theirs == [404, 404], (own, theirs)
            # the other stack's key is not known here: each stack has its own PostgreSQL and Redis
            r = httpx.get(f"http://127.0.0.1:{run.base}/v1/models", headers={"Authorization": f"Bearer {keys[1 - i]}"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        for clone, modes in zip(clones, before):
            assert _modes(clone) == modes  # nothing outside the state directory changed owner or mode
            for root, dirs, files in os.walk(clone / ".gateway"):
                for n in dirs + files:
                    st = os.lstat(Path(root) / n)
                    assert st.st_uid == os.geteuid(), (root, n)
        # no account was made for PostgreSQL (as root it runs in a user namespace)
        assert [(f, f.read_bytes(), f.stat().st_mtime_ns) for f, _, _ in accounts] == accounts
        # Ctrl-C: make reports the interrupt (exit by SIGINT) once `gateway up` has stopped every process
        assert [run.stop() for run in runs] == [-signal.SIGINT] * 2, [run.out.decode()[-1500:] for run in runs]
        for run in runs:
            for port in (run.base, run.base + 1, run.base + 12, run.base + 13, run.base + 15, run.base + 16):
                with socket.socket() as s:
                    assert s.connect_ex(("127.0.0.1", port)) != 0, port
    finally:
        for run in runs:
            run.stop()


def test_a_port_taken_stops_the_start_in_one_line(tmp_path: Path) -> None:
    base = free_base()
    env = {**os.environ, "GATEWAY_PORT": str(base), "GATEWAY_METRICS_PORT": str(base + 19), "GATEWAY_DEV": "1",
           "GATEWAY_STATE_DIR": str(tmp_path / "state")}
    env.pop("GATEWAY_CATALOG", None)
    for taken, says in [(base + 15, f"port {base + 15} (the simulator sim-a) is already in use; set GATEWAY_PORT "
                                    "(the simulator's port is GATEWAY_PORT + 15: the catalog's port_offset of "
                                    "deployment sim-a) to move it"),
                        (base + 1, f"port {base + 1} (the console) is already in use; set GATEWAY_CONSOLE_PORT, or "
                                   "GATEWAY_PORT (it is GATEWAY_PORT + 1 by default) to move it"),
                        (base, f"port {base} (Envoy's listener) is already in use; set GATEWAY_PORT to move it")]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", taken))
            s.listen()
            t0 = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "control.cli", "up"], env=env, capture_output=True, text=True,
                               timeout=60)
        assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
        assert r.stderr == f"gateway: not started: {says}\n"
        assert time.monotonic() - t0 < 10
        assert not (tmp_path / "state" / "pg").exists()  # nothing was started
