"""The per-request log line is formatted by hand for speed: it must be one valid JSON object per line
with exactly the metadata fields, escaped as JSON, and nothing when INFO is off."""
from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from extproc import logs

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
