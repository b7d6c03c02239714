"""Entrypoint of the gateway image (see ../../Dockerfile and ../../compose.yaml).

    envoy [ENVOY ARGS...]  run Envoy as control.envoy_runner does: render its bootstrap (template
                           envoy/envoy.yaml) and the model-server clusters (CDS, from $GATEWAY_CATALOG)
                           into $GATEWAY_STATE_DIR/envoy, start it, re-render the clusters when the
                           catalog changes, and on SIGTERM drain it before it stops
    migrate                apply the PostgreSQL migrations to $DATABASE_URL (``gateway migrate``), exit
    anything else          exec'd as given: ``python -m extproc``, ``python -m extproc.usage_writer``,
                           ``python -m sim ...``, ``gateway ...``

All settings come from the environment variables of control/settings.py.
"""
from __future__ import annotations

import os
import sys

from control.cli import main as gateway
from control.envoy_runner import run as run_envoy
from control.settings import Settings


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    cmd, rest = argv[0], argv[1:]
    if cmd == "envoy":
        sys.exit(run_envoy(Settings.from_env(), rest))
    elif cmd == "migrate":
        if not Settings.from_env().database_url:
            sys.exit("entrypoint: DATABASE_URL is not set")
        sys.exit(gateway(["migrate", *rest]))  # PostgreSQL may still be starting: waits up to a minute
    else:
        os.execvp(cmd, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
