"""The setting the single-question scripts share: a temporary directory, the processes started in it
(stopped on the way out), the request bodies, and the fixed-reply upstream (JSON port, SSE port)."""
from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import Iterator

from .load import write_bodies
from .procs import Procs
from .envoys import Upstream
from .systems import start_upstream


@contextlib.contextmanager
def harness(prefix: str) -> Iterator[tuple[Path, Procs, Path, Upstream]]:
    with tempfile.TemporaryDirectory(prefix=prefix) as t:
        tmp = Path(t)
        procs = Procs(tmp / "logs")
        bodies = tmp / "bodies"
        bodies.mkdir()
        write_bodies(bodies)
        try:
            yield tmp, procs, bodies, start_upstream(procs, tmp)
        finally:
            procs.stop_all()


def round_args(doc: str | None) -> argparse.Namespace:
    """``--seconds`` per cell and ``--rounds`` of alternation, the scripts' two knobs."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    return ap.parse_args()
