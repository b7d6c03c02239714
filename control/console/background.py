"""Work done off the request path (e-mail above all): an answer then takes the same time whether or
not there was anything to send, so its timing does not tell who has an account.  Failures are
logged by kind only (a message holds single-use links)."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Coroutine

log = logging.getLogger("console.background")


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self, work: Coroutine[Any, Any, Any], what: str) -> None:
        task = asyncio.create_task(self._guard(work, what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _guard(work: Coroutine[Any, Any, Any], what: str) -> None:
        try:
            await work
        except Exception as e:  # one failed mail must not take anything else down
            log.warning("%s failed: %s", what, type(e).__name__)

    async def drain(self, timeout: float = 10.0) -> None:
        """On shutdown: let the work under way finish (bounded)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)


async def every(seconds: float, once: Callable[[], Awaitable[Any]], what: str) -> None:
    """``once()`` every ``seconds`` for the console's lifetime; a failure (a database or Redis outage) is
    logged by kind and tried again next time."""
    while True:
        try:
            await once()
        except Exception as e:  # noqa: BLE001
            log.warning("%s failed: %s", what, type(e).__name__)
        await asyncio.sleep(seconds)
