"""The launcher's restarts: the policy's delays and limit, and ``Stack.supervise`` (the real loop,
real child processes) restarting a component that keeps dying with growing delays, then giving up."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from control.launcher import GaveUp, Proc, Stack
from control.restarts import GiveUp, Restart, Restarts
from control.settings import Settings


def test_delays_double_up_to_the_cap_then_it_gives_up() -> None:
    r = Restarts(base_s=0.5, cap_s=4.0, limit=5)
    delays = []
    for now in (0.0, 1.0, 2.0, 3.0, 4.0):
        d = r.died("postgres", now)
        assert isinstance(d, Restart)
        delays.append(d.at - now)
        r.started("postgres", now + 0.1)
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert r.died("postgres", 5.0) == GiveUp(6)
    assert r.died("redis", 5.0) == Restart(5.5)  # each component counts its own


def test_a_component_that_stayed_up_starts_again_from_the_first_delay() -> None:
    r = Restarts(base_s=1.0, stable_s=60.0, limit=2)
    assert r.died("envoy", 0.0) == Restart(1.0)
    r.started("envoy", 1.0)
    assert r.died("envoy", 2.0) == Restart(4.0)  # soon after its start: the second in a row
    r.started("envoy", 4.0)
    assert r.died("envoy", 100.0) == Restart(101.0)  # up 96 s: a first death again, not a give-up


def test_supervise_restarts_with_backoff_then_stops(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    stack = Stack(Settings(state_dir=str(tmp_path / "state"), catalog=str(Path("control/catalog.yaml").resolve())))
    p = Proc("flaky", [sys.executable, "-c",
                       f"import time; open({str(starts)!r}, 'a').write(repr(time.monotonic()) + '\\n'); raise SystemExit(3)"],
             ready=lambda: True)
    stack.start_proc(p)
    t0 = time.monotonic()
    with pytest.raises(GaveUp, match=r"flaky exited 4 times in a row .*last exit code 3.*flaky\.log"):
        stack.supervise(lambda: time.monotonic() - t0 > 30, Restarts(base_s=0.2, cap_s=0.8, limit=3))
    times = [float(x) for x in starts.read_text().split()]
    assert len(times) == 4  # the first start and three restarts
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4 and gaps[2] >= 0.8, gaps  # 0.2, 0.4, 0.8 s at least
