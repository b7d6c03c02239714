"""One gateway stack from a given source tree, for bench/tree_ab.py: run as a script with the tree as
the working directory and first on PYTHONPATH, so the stack (and every process it starts) runs that
tree's code; it imports only what the tree's own bench/systems.py has had since the stack was started
from it.  ``python bench/tree_stack.py STATE_DIR JSON_PORT SSE_PORT``: prints one JSON line (port, key,
pid) once the stack serves, then keeps it up until its standard input closes."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    from bench.envoys import Upstream  # the tree's
    from bench.systems import start_gateway
    tmp, json_port, sse_port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    system, stack = start_gateway(tmp, Upstream(json_port, sse_port))
    try:
        print(json.dumps({"port": system.port, "key": system.key, "pid": os.getpid()}), flush=True)
        sys.stdin.read()
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
