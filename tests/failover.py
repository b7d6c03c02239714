"""A Redis failover under load from several gateway instances: the load, and the instances' start."""
from __future__ import annotations

import threading
from typing import Callable


from conftest import Gateway
from control.launcher import Stack
from test_reconciliation_e2e import Seen, _load

CLIENTS = 6  # two per instance of three


def start_all(stacks: list[Stack]) -> None:
    """The stacks started side by side (each its own Envoy, ext_proc, usage writer): a failure is raised."""
    failed: list[BaseException] = []

    def start(stack: Stack) -> None:
        try:
            stack.start()
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            failed.append(e)
    threads = [threading.Thread(target=start, args=(s,)) for s in stacks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


def load_through(gws: list[Gateway], key: str, fault: Callable[[], None]) -> list[Seen]:
    """``CLIENTS`` clients spread over the instances send back to back (test_reconciliation_e2e's load);
    no request waits longer than its client's 30 s: a hang is a failure."""
    return _load(gws, key, fault, CLIENTS, timeout=30)
