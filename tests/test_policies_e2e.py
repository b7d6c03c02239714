"""A request policy through the stack: docs/extending.md's example (read from the document, saved as the
module the ext_proc loads by GATEWAY_REQUEST_POLICIES) refuses a listed key's long prompts with the
interface's error and its request id, logs the refusal at no cost and frees the slot at once (the
organisation may run one request at a time: the next request is served); other keys and short prompts
are served."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from conftest import Gateway, assert_error, running_stack, usage_caught_up, wait_for
from docs_blocks import marked

LONG = "Proszę opisać dokładnie, krok po kroku, jak działa bramka. " * 20


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str, str]]:
    """A stack running the document's policy, limiting the first of two organisations' keys."""
    [block] = [b for b in marked("run by: tests/test_policies_e2e.py") if b.document == "docs/extending.md"]
    modules = tmp_path_factory.mktemp("policies")
    (modules / "prompt_limit.py").write_text(block.text + "\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(modules), os.environ.get("PYTHONPATH")) if p))
        env.setenv("PROMPT_LIMIT_TOKENS", "50")
        with running_stack("gw-policy-", default_concurrency=1,
                           request_policies="prompt_limit:long_prompts") as gw:
            _, limited_key_id, limited_key = gw.new_org()
            _, _, other_key = gw.new_org()
            # the policy's keys are read when its module loads: the ext_proc starts again knowing them
            gw.stack.procs["extproc"].env["PROMPT_LIMIT_KEYS"] = limited_key_id
            gw.stack.restart("extproc")
            wait_for(lambda: chat(gw, other_key, "Cześć").status_code == 200, timeout=30)
            yield gw, limited_key, other_key


def chat(gw: Gateway, key: str, text: str) -> httpx.Response:
    return httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": "polish-fast", "messages": [{"role": "user", "content": text}]})


def test_a_listed_keys_long_prompt_is_refused_and_its_slot_freed(limited: tuple[Gateway, str, str]) -> None:
    gw, key, _ = limited
    r = chat(gw, key, LONG)
    err: dict[str, Any] = assert_error(r, 400, "invalid_request", "invalid_request_error")
    assert err["param"] is None and err["message"] == "Prompts from this key are limited to 50 estimated tokens."
    assert err["request_id"] == r.headers["x-request-id"] and "Proszę" not in r.text
    refused = r.headers["x-request-id"]
    ok = chat(gw, key, "Cześć")  # one request at a time: served only if the refused one's slot is free
    assert ok.status_code == 200, ok.text
    emb = httpx.post(gw.v1 + "/embeddings", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                     json={"model": "embed", "input": LONG})
    assert_error(emb, 400, "invalid_request", "invalid_request_error")
    usage_caught_up(gw, key)
    [row] = gw.sql("SELECT status, error_code, cost_micro_pln, prompt_tokens, endpoint FROM usage_records "
                   "WHERE request_id = $1", refused)
    assert dict(row) == {"status": 400, "error_code": "invalid_request", "cost_micro_pln": 0, "prompt_tokens": 0,
                         "endpoint": "chat"}


def test_other_keys_and_short_prompts_are_served(limited: tuple[Gateway, str, str]) -> None:
    gw, key, other = limited
    r = chat(gw, other, LONG)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 0
    assert chat(gw, key, "Dzień dobry").status_code == 200


def test_the_example_is_the_documented_module() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "extending.md").read_text()
    assert "GATEWAY_REQUEST_POLICIES=prompt_limit:long_prompts" in text
