"""JSON-lines logging.  Records carry metadata only (request id, alias, status, tokens, durations, bytes):
never a body, a prompt, a completion, an embedding input, a key or a model server's message."""
from __future__ import annotations

import asyncio
import io
import json
from json.encoder import encode_basestring_ascii as _q  # C: a JSON string literal, ASCII
import logging
import sys
import threading
import time
from collections.abc import Callable

# Fields a caller may attach with ``extra=``; anything else is not written.
FIELDS = ("request_id", "alias", "endpoint", "status", "code", "prompt_tokens", "completion_tokens",
          "estimated", "cost_micro_pln", "duration_ms", "ttfb_ms", "bytes_in", "bytes_out", "phase", "repeated")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": _stamp(record.created),
            "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        for f in FIELDS:
            v = record.__dict__.get(f)
            if v is not None:
                doc[f] = v
        if record.exc_info:
            # the exception's type and where it was raised; its message may quote data, so it is left out
            etype, _, tb = record.exc_info
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            doc["error"] = etype.__name__ if etype else "Exception"
            if tb is not None:
                doc["at"] = f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"
        return json.dumps(doc, separators=(",", ":"))


_REQUESTS = logging.getLogger("extproc.requests")


def request_line(*, request_id: str, alias: str, endpoint: str, status: int, prompt_tokens: int,
                 completion_tokens: int, estimated: bool, cost_micro_pln: int, duration_ms: int,
                 ttfb_ms: int | None) -> None:
    """One line per request (metadata only), written without the logging machinery's per-record cost
    and formatted by hand (a third of ``json.dumps``'s cost); in a process whose stdout is ``buffered``,
    lines reach it in batches, at most ``FLUSH_S`` after they were written."""
    if _REQUESTS.isEnabledFor(logging.INFO):
        if _flush.due is False:
            _flush.schedule()
        sys.stdout.write(
            f'{{"time":"{_stamp(time.time())}","level":"info","logger":"extproc.requests","msg":"request",'
            f'"request_id":{_q(request_id)},"alias":{_q(alias)},"endpoint":{_q(endpoint)},"status":{status:d},'
            f'"prompt_tokens":{prompt_tokens:d},"completion_tokens":{completion_tokens:d},'
            f'"estimated":{"true" if estimated else "false"},"cost_micro_pln":{cost_micro_pln:d},'
            f'"duration_ms":{duration_ms:d},"ttfb_ms":{"null" if ttfb_ms is None else int(ttfb_ms)}}}\n')


FLUSH_S = 0.1  # the longest a request line waits in a buffered stdout


class _Flush:
    """The flush of a buffered stdout ``FLUSH_S`` after the first request line written since the last one;
    ``due`` None: stdout is not buffered here (nothing to schedule)."""

    due: bool | None = None

    def schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop: written through at once
            sys.stdout.flush()
            return
        self.due = True
        loop.call_later(FLUSH_S, self.run)

    def run(self) -> None:
        self.due = False
        sys.stdout.flush()


_flush = _Flush()


def buffered() -> None:
    """This process's stdout block-buffered when it is not a terminal, whatever PYTHONUNBUFFERED says (the
    container image sets it): the request lines go out in one write per ``FLUSH_S`` instead of one each,
    a write system call per request less under load; a log record still goes out at once (its handler
    flushes), after the request lines written before it."""
    out = sys.stdout
    if out.isatty():
        return
    raw = io.FileIO(out.fileno(), "w", closefd=False)
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw, 1 << 16), encoding=out.encoding, errors=out.errors)
    _flush.due = False


def _stamp(t: float) -> str:
    """``t`` as UTC ISO 8601 to the millisecond; the whole second's text is kept from the last call."""
    global _second
    whole, last = int(t), _second  # (one read: a record of another thread may replace it)
    if whole != last[0]:
        last = _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{last[1]}.{int(t % 1 * 1000):03d}Z"


_second: tuple[int, str] = (-1, "")  # the second ``_stamp`` wrote last, and its text


REPEAT_WINDOW_S = 10.0


class Repeats(logging.Filter):
    """A burst of identical warnings or errors is one line, then one summary: the first record of a kind
    (same logger, level, message and exception type; a request id rides in ``extra``, not in the message,
    so it does not tell two apart) is written, the same ones within ``window`` seconds of it are only
    counted, and when the window ends one line says how many there were (the first one's message with
    "... repeated N times in W s", and ``repeated``: N).  A Redis that restarts under load would
    otherwise write the same line once per request in flight."""

    def __init__(self, emit: Callable[[logging.LogRecord], object], window: float = REPEAT_WINDOW_S) -> None:
        super().__init__()
        self.emit = emit
        self.window = window
        self._lock = threading.Lock()
        self._bursts: dict[tuple[str, int, str, object], _Burst] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or "repeated" in record.__dict__:
            return True
        kind = (record.name, record.levelno, record.getMessage(), record.exc_info[0] if record.exc_info else None)
        with self._lock:
            burst = self._bursts.get(kind)
            if burst is not None:
                burst.count += 1
                return False
            self._bursts[kind] = _Burst(record)
        timer = threading.Timer(self.window, self._end, (kind,))
        timer.daemon = True  # a summary still due when the process exits is lost, never waited for
        timer.start()
        return True

    def _end(self, kind: tuple[str, int, str, object]) -> None:
        with self._lock:
            burst = self._bursts.pop(kind)
        if burst.count:
            self.emit(_summary(burst.first, burst.count, self.window))


class _Burst:
    """The first record of a kind, and how many like it followed within the window."""

    __slots__ = ("first", "count")

    def __init__(self, first: logging.LogRecord) -> None:
        self.first = first
        self.count = 0


def _summary(first: logging.LogRecord, count: int, window: float) -> logging.LogRecord:
    rec = logging.LogRecord(first.name, first.levelno, first.pathname, first.lineno,
                            "%s ... repeated %d times in %g s", (first.getMessage(), count, window),
                            first.exc_info, first.funcName)
    rec.repeated = count
    return rec


def setup(level: int = logging.INFO, *, buffer: bool = False) -> None:
    """JSON lines on stdout at ``level``; ``buffer``: stdout ``buffered`` first."""
    if buffer:
        buffered()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(Repeats(handler.handle))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("grpc").setLevel(logging.WARNING)
