"""When the launcher restarts a component that died: after a delay that doubles with each death in a
row (so a component that cannot start does not spin the machine), and not at all past a limit (then
``gateway up`` stops, saying which component and where its log is).  A component that stayed up long
enough starts again from the shortest delay.  Pure policy: no processes, no clock of its own."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Restart:
    at: float  # when (monotonic seconds) to start it again


@dataclass(frozen=True, slots=True)
class GiveUp:
    deaths: int  # deaths in a row, each one soon after its start


@dataclass(slots=True)
class Restarts:
    base_s: float = 0.5     # the first delay; then 1, 2, 4 ... s
    cap_s: float = 30.0     # the longest delay
    stable_s: float = 60.0  # up this long: the next death is a first one again
    limit: int = 6          # deaths in a row that are restarted; the next one gives up
    _deaths: dict[str, int] = field(default_factory=dict)
    _started: dict[str, float] = field(default_factory=dict)

    def started(self, name: str, now: float) -> None:
        self._started[name] = now

    def died(self, name: str, now: float) -> Restart | GiveUp:
        started = self._started.get(name)
        if started is not None and now - started >= self.stable_s:
            self._deaths[name] = 0
        n = self._deaths.get(name, 0) + 1
        self._deaths[name] = n
        if n > self.limit:
            return GiveUp(n)
        return Restart(now + min(self.cap_s, self.base_s * 2 ** (n - 1)))

