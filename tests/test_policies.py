"""Request policies (extproc/policies.py): loaded from GATEWAY_REQUEST_POLICIES, none by default, asked
in order after the admission, and a refusal answered in the interface's error shape with the admission undone (the
exchange on the in-memory store of tests/extproc_fakes.py)."""
from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from core.decisions import Identity
from core.errors import ApiError
from core.rules import Prepared
from core.settings import GatewaySettings
from extproc.exchange import Answer, Exchange, Gateway
from extproc.policies import NONE, Policies, RequestPolicy, load
from extproc_fakes import CHAT_BODY, KEY, gateway, store

LONG = ApiError("invalid_request", "Prompts from this key are limited.")
seen: list[tuple[int, str, str]] = []


def refuse_key_1(request: Prepared, caller: Identity) -> ApiError | None:
    seen.append((request.estimated_prompt_tokens, caller.key_id, caller.org_id))
    return LONG if caller.key_id == "key_1" else None


def admit(request: Prepared, caller: Identity) -> ApiError | None:
    return None


def broken(request: Prepared, caller: Identity) -> ApiError | None:
    raise KeyError("Dzień dobry")  # what a careless policy might put in an exception: never logged


def wrong(request: Prepared, caller: Identity) -> Any:
    return "no"


async def chat(gw: Gateway, close: bool = True) -> Answer:
    """The request body's phase (and its finish); ``close``: the call ends after it."""
    ex = Exchange(gw)
    answer = await ex.request_body(CHAT_BODY, {"request.id": "rid-1", "request.method": "POST",
                                               "request.path": "/v1/chat/completions",
                                               "request.headers['authorization']": "Bearer " + KEY})
    await ex.send_finish()
    if close:
        await ex.close()
    return answer


def error(answer: Answer) -> tuple[int, dict[str, Any]]:
    assert answer.reply is not None
    status, body, headers = answer.reply
    assert headers == {"content-type": "application/json"}
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "code", "param", "request_id"}
    return status, dict(err)


def with_policies(*policies: RequestPolicy) -> Gateway:
    gw = gateway()
    gw.policies = Policies(tuple((p.__name__, p) for p in policies))
    return gw


def test_none_by_default() -> None:
    assert GatewaySettings().request_policies == ""
    assert load("") == load(" , ") == NONE
    assert gateway().policies is NONE
    assert asyncio.run(chat(gateway())).reply is None


def test_loaded_by_module_and_function_name_in_order() -> None:
    mod = "test_policies"
    assert [n for n, _ in load(f"{mod}:admit, {mod}:refuse_key_1").named] == [f"{mod}:admit", f"{mod}:refuse_key_1"]
    assert load(f"{mod}:refuse_key_1").named[0][1] is sys.modules[mod].refuse_key_1
    for names, why in ((f"{mod}", "is not module:function"), (f"{mod}:nothing", "cannot be loaded"),
                       ("no_such_module:f", "cannot be loaded"), (f"{mod}:LONG", "is not a function")):
        with pytest.raises(ValueError, match="GATEWAY_REQUEST_POLICIES: .* " + why):
            load(names)


def test_a_refusal_is_answered_and_the_admission_undone() -> None:
    """The policy sees the prepared request and the caller the admission named; its error goes to the
    client with the request id; the slot and the hold are released and the refusal is logged at cost 0."""
    seen.clear()
    gw = with_policies(admit, refuse_key_1)
    status, err = error(asyncio.run(chat(gw)))
    assert (status, err["code"], err["type"], err["param"], err["message"], err["request_id"]) == (
        400, "invalid_request", "invalid_request_error", None, "Prompts from this key are limited.", "rid-1")
    assert [(k, o) for _, k, o in seen] == [("key_1", "org_1")] and seen[0][0] > 0
    assert store(gw).admits == [("rid-1", True)]  # one admission, with limits: no extra round trip
    assert store(gw).held() == 0
    [rec] = store(gw).records
    assert (rec.status, rec.error_code, rec.cost_micro_pln, rec.prompt_tokens, rec.alias, rec.endpoint) == (
        400, "invalid_request", 0, 0, "polish-pro", "chat")
    assert store(gw).orgs["org_1"].balance == 10_000_000


def test_an_admitted_request_goes_on() -> None:
    gw = with_policies(admit)
    answer = asyncio.run(chat(gw, close=False))
    assert answer.reply is None and answer.body is not None and store(gw).held() == 1  # on its way upstream
    assert store(gw).records == []


def test_a_failing_policy_is_a_500_that_logs_no_text(caplog: pytest.LogCaptureFixture) -> None:
    for policy in (broken, wrong):
        gw = with_policies(policy)
        with caplog.at_level(logging.ERROR, logger="extproc"):
            status, err = error(asyncio.run(chat(gw)))
        assert (status, err["code"], err["request_id"]) == (500, "internal_error", "rid-1")
        assert store(gw).held() == 0
    assert "Dzień" not in caplog.text and "KeyError" in caplog.text and "returned str" in caplog.text


def test_the_document_names_the_setting() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "extending.md").read_text()
    assert "GATEWAY_REQUEST_POLICIES" in text
