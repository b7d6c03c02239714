"""The usage record's JSON (the in-flight journal entry and the queued record) is one f-string compiled
from its fields, for speed; it must be byte for byte what ``json.dumps`` gives, and read back as the same
record."""
from __future__ import annotations

import dataclasses
import json

import pytest

from core.decisions import UsageRecord


def _record(**over: object) -> UsageRecord:
    base = dict(request_id="0f8fad5b-d9cb-469f-a165-70867728950e", org_id="org_1", key_id="key_1",
                alias="polish-fast", upstream_model="up/model-7b", endpoint="chat", status=200, stream=True,
                prompt_tokens=12, completion_tokens=34, estimated=False, cost_micro_pln=1234, input_price=100,
                output_price=2_000_000, started_at=1767225600.123456, ttfb_ms=12, ended_at=1767225600.5)
    base.update(over)
    return UsageRecord(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("over", [
    {},
    {"ttfb_ms": None, "stream": False, "estimated": True, "status": 499},
    {"alias": 'ąę "quoted" \\ back\nslash\u2028', "upstream_model": "\x00\x7f"},  # escaping as json does
    {"started_at": 1e-7, "ended_at": 1767225600, "cost_micro_pln": 0, "completion_tokens": 0},
])
def test_to_json_is_json_dumps(over: dict[str, object]) -> None:
    r = _record(**over)
    want = json.dumps(dataclasses.asdict(r), separators=(",", ":"))
    assert r.to_json() == want
    assert UsageRecord(**json.loads(r.to_json())) == r
