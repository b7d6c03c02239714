"""The per-request log line is formatted by hand for speed: it must be one valid JSON object per line
with exactly the metadata fields, escaped as JSON, and nothing when INFO is off."""
from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_for
from core import logs

ROOT = Path(__file__).resolve().parent.parent

FIELDS = dict(request_id="0f8fad5b-d9cb-469f-a165-70867728950e", alias='ąę "x"\\\n', endpoint="chat", status=200,
              prompt_tokens=12, completion_tokens=0, estimated=True, cost_micro_pln=1234, duration_ms=57,
              ttfb_ms=None)


def _written(monkeypatch: pytest.MonkeyPatch, level: int, **over: object) -> str:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    logging.getLogger("extproc.requests").setLevel(level)
    try:
        logs.request_line(**{**FIELDS, **over})  # type: ignore[arg-type]
    finally:
        logging.getLogger("extproc.requests").setLevel(logging.NOTSET)
    return out.getvalue()


@pytest.mark.parametrize("over", [{}, {"ttfb_ms": 12, "estimated": False, "status": 499}])
def test_request_line_is_one_json_object(monkeypatch: pytest.MonkeyPatch, over: dict[str, object]) -> None:
    line = _written(monkeypatch, logging.INFO, **over)
    assert line.endswith("\n") and line.count("\n") == 1 and line.isascii()
    doc = json.loads(line)
    assert doc.pop("time").endswith("Z")
    assert doc == {"level": "info", "logger": "extproc.requests", "msg": "request", **FIELDS, **over}


def test_request_line_off_below_info(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _written(monkeypatch, logging.WARNING) == ""


def _repeats(window: float) -> tuple[logging.Logger, list[dict[str, object]], logs.Repeats]:
    """A logger whose records go through ``Repeats`` into a list, as JSON lines would."""
    out: list[dict[str, object]] = []
    fmt = logs.JsonFormatter()

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            out.append(json.loads(fmt.format(record)))

    handler = Collect()
    repeats = logs.Repeats(handler.handle, window=window)
    handler.addFilter(repeats)
    log = logging.getLogger(f"extproc.test-repeats-{id(out)}")
    log.propagate = False
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    return log, out, repeats


def test_a_burst_of_identical_errors_is_one_line_then_a_count() -> None:
    """112 requests whose admission failed alike within the window (a Redis restarting under load): the
    first is written with its request id, the other 111 are one summary line when the window ends."""
    log, out, _ = _repeats(window=0.3)
    for i in range(112):
        log.warning("admission failed: %s", "ConnectionError", extra={"request_id": f"rid-{i}"})
    log.warning("could not mark a client gone: %s", "TimeoutError", extra={"request_id": "rid-x"})  # another kind
    log.info("catalog reloaded: %d aliases", 3)  # below warning: never held back
    log.info("catalog reloaded: %d aliases", 3)
    assert [(d["msg"], d.get("request_id")) for d in out] == [
        ("admission failed: ConnectionError", "rid-0"), ("could not mark a client gone: TimeoutError", "rid-x"),
        ("catalog reloaded: 3 aliases", None), ("catalog reloaded: 3 aliases", None)]
    wait_for(lambda: len(out) >= 5, timeout=5)
    summary = out[4]
    assert len(out) == 5, out
    assert summary["msg"] == "admission failed: ConnectionError ... repeated 111 times in 0.3 s"
    assert (summary["level"], summary["repeated"], summary.get("request_id")) == ("warning", 111, None)
    # the window over: the next one is written again, and starts a window of its own
    log.warning("admission failed: %s", "ConnectionError", extra={"request_id": "rid-later"})
    assert out[5]["msg"] == "admission failed: ConnectionError" and out[5]["request_id"] == "rid-later"


def test_a_lone_error_has_no_summary_and_an_exception_is_told_by_its_type() -> None:
    log, out, _ = _repeats(window=0.1)
    for exc in (KeyError, KeyError, ValueError):
        try:
            raise exc("a message that may quote data")
        except Exception:
            log.exception("phase %s failed", "request_body")
    wait_for(lambda: len(out) >= 3, timeout=5)
    assert [(d["msg"], d["error"]) for d in out] == [
        ("phase request_body failed", "KeyError"), ("phase request_body failed", "ValueError"),
        ("phase request_body failed ... repeated 1 times in 0.1 s", "KeyError")]
    assert "quote data" not in json.dumps(out)


_BUFFERED = r"""
import asyncio, json, logging, os, sys, time
from core import logs

def writes():
    return int(dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())["syscw"])

def lines():
    with open(sys.argv[1]) as f:
        return f.read().splitlines()

async def main():
    logs.setup(logging.INFO, buffer=True)
    before = writes()
    for i in range(200):
        logs.request_line(request_id=f"r{i}", alias="a", endpoint="chat", status=200, prompt_tokens=1,
                          completion_tokens=1, estimated=False, cost_micro_pln=1, duration_ms=1, ttfb_ms=1)
    written, seen = writes() - before, len(lines())
    await asyncio.sleep(logs.FLUSH_S + 0.2)
    flushed = len(lines())
    logs.request_line(request_id="last", alias="a", endpoint="chat", status=200, prompt_tokens=1,
                      completion_tokens=1, estimated=False, cost_micro_pln=1, duration_ms=1, ttfb_ms=1)
    logging.getLogger("extproc").warning("after the last request line")
    print(json.dumps([written, seen, flushed, len(lines())]), file=sys.stderr)

asyncio.run(main())
"""


def test_request_lines_go_out_in_batches_and_before_a_later_record(tmp_path: Path) -> None:
    """In the ext_proc's processes stdout is buffered even under PYTHONUNBUFFERED (the container image
    sets it): 200 request lines are written in no write system call at once, all of them within
    ``FLUSH_S``, and a log record written later comes after them in the file, at once."""
    out = tmp_path / "stdout.log"
    with open(out, "wb") as f:
        r = subprocess.run([sys.executable, "-c", _BUFFERED, str(out)], stdout=f, stderr=subprocess.PIPE, text=True,
                           cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    written, seen, flushed, total = json.loads(r.stderr.strip().splitlines()[-1])
    assert (written, seen) == (0, 0)  # held in the buffer
    assert (flushed, total) == (200, 202)
    docs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [d.get("request_id") for d in docs[:200]] == [f"r{i}" for i in range(200)]
    assert docs[200]["request_id"] == "last" and docs[200]["msg"] == "request"
    assert (docs[201]["level"], docs[201]["msg"]) == ("warning", "after the last request line")


def test_the_time_stamp_is_utc_to_the_millisecond_whatever_order_the_moments_come_in() -> None:
    """``_stamp`` keeps the last whole second's text: the same text as a conversion of each moment."""
    import random
    import time

    def converted(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"

    rnd = random.Random(3)
    moments = [rnd.uniform(0, 2e9) for _ in range(500)] + [1767225599.9 + i * 0.0004 for i in range(1000)]
    for t in moments + moments[::-1]:
        assert logs._stamp(t) == converted(t)
    assert logs._stamp(1767225599.9996) == "2025-12-31T23:59:59.999Z"
    assert logs._stamp(1767225600.0004) == "2026-01-01T00:00:00.000Z"
