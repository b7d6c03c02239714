"""A Redis failover under load from several gateway instances: the load, and the instances' start."""
from __future__ import annotations

import threading
from typing import Callable

import httpx

from conftest import Gateway, wait_for
from control.launcher import Stack
from test_reconciliation_e2e import Seen, _one

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
    """``CLIENTS`` clients spread over the instances send back to back; ``fault`` strikes once 8 requests
    came back, and the load goes on until 8 more were served whole after it.  No request waits longer
    than its client's 30 s: a hang is a failure."""
    seen: list[Seen] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def worker(i: int) -> None:
        gw = gws[i % len(gws)]
        with httpx.Client(base_url=gw.v1, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            n = i
            while not stop.is_set():
                n += 1
                try:
                    s = _one(c, n)
                except Exception as e:  # noqa: BLE001 - a reply without the interface's error shape, say
                    errors.append(f"{type(e).__name__}: {e}")
                    continue
                if s is not None:
                    with lock:
                        seen.append(s)

    def whole() -> int:
        with lock:
            return sum(1 for s in seen if s.whole)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(seen) >= 8, timeout=30, interval=0.02)
        fault()
        after = whole()
        wait_for(lambda: whole() >= after + 8, timeout=30, interval=0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    return seen
