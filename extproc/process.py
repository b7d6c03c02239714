"""What each of the package's processes (``python -m extproc``, ``python -m extproc.usage_writer``) does
to start and to learn that it must stop."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any, Callable, Coroutine

from core import logs
from core.settings_base import S, SettingsError
from core.urls import RedisUrlError

log = logging.getLogger("extproc")


def run(settings_type: type[S], serve: Callable[[S], Coroutine[Any, Any, None]]) -> None:
    """JSON-lines logging at ``GATEWAY_LOG_LEVEL`` (stdout buffered: the request lines in batches), then ``serve`` with the process's settings (``settings_type``)
    read from the environment."""
    logs.setup(getattr(logging, os.environ.get("GATEWAY_LOG_LEVEL", "INFO").upper(), logging.INFO), buffer=True)
    try:
        settings = settings_type.from_env()
        if settings.event_loop == "uvloop":
            import uvloop
            uvloop.run(serve(settings))
        else:  # asyncio: the only other value GATEWAY_EVENT_LOOP takes (settings_base.parse)
            asyncio.run(serve(settings))
    except (RedisUrlError, SettingsError) as e:  # a configuration error: said in one line (the password masked), no traceback
        log.error("%s", e)
        raise SystemExit(2) from None


async def until_stopped() -> None:
    """Returns once SIGTERM or SIGINT has come."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
