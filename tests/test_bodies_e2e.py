"""Request bodies that must never be a 500, through the real stack: lone UTF-16 surrogates
are refused with 400 invalid_request (docs/configuration.md), NaN / Infinity / -Infinity with 400 invalid_json, and
arbitrary JSON values and arbitrary bytes sent to both POST endpoints get no 5xx and the interface's error shape."""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import assert_error

ENDPOINTS = [("/chat/completions", "polish-pro", "messages"), ("/embeddings", "embed", "input")]


def _post(client: httpx.Client, path: str, raw: bytes) -> httpx.Response:
    return client.post(path, content=raw, headers={"content-type": "application/json"})


@pytest.mark.parametrize("path,model,field", ENDPOINTS)
def test_lone_surrogate_is_refused(client: httpx.Client, path: str, model: str, field: str) -> None:
    value = '[{"role":"user","content":"a\\ud800b"}]' if field == "messages" else '"a\\ud800b"'
    raw = ('{"model":"%s","%s":%s}' % (model, field, value)).encode()
    err = assert_error(_post(client, path, raw), 400, "invalid_request", "invalid_request_error")
    assert "\\ud800" not in err["message"] or "escape" in err["message"]  # names the rule, quotes nothing
    # a key holding one too, and a low surrogate alone
    raw = ('{"model":"%s","%s":%s,"x\\udc00":1}' % (model, field, value.replace("\\ud800", ""))).encode()
    assert_error(_post(client, path, raw), 400, "invalid_request", "invalid_request_error")


@pytest.mark.parametrize("path,model,field", ENDPOINTS)
def test_surrogate_pair_is_text(client: httpx.Client, path: str, model: str, field: str) -> None:
    value = '[{"role":"user","content":"a\\ud83d\\ude00b"}]' if field == "messages" else '"a\\ud83d\\ude00b"'
    r = _post(client, path, ('{"model":"%s","%s":%s}' % (model, field, value)).encode())
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path,model,field", ENDPOINTS)
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_numbers_are_invalid_json(client: httpx.Client, path: str, model: str, field: str,
                                           literal: str) -> None:
    value = '[{"role":"user","content":"hej"}]' if field == "messages" else '"hej"'
    raw = ('{"model":"%s","%s":%s,"temperature":%s}' % (model, field, value, literal)).encode()
    assert_error(_post(client, path, raw), 400, "invalid_json", "invalid_request_error")


def _shape(r: httpx.Response) -> None:
    """No 5xx; an error has docs/interface.md section 7's shape; a success is JSON with the request id header."""
    assert r.status_code < 500, (r.status_code, r.text[:300])
    assert r.headers.get("x-request-id")
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"error"}
        err = body["error"]
        assert set(err) == {"message", "type", "code", "param", "request_id"}
        assert isinstance(err["message"], str) and err["message"] and isinstance(err["code"], str)
        assert err["type"] in ("invalid_request_error", "authentication_error", "permission_error",
                               "insufficient_quota", "rate_limit_error", "not_found_error")
        assert err["request_id"] == r.headers["x-request-id"]
        assert err["param"] is None or isinstance(err["param"], str)


# text with lone surrogates too (json.dumps writes them as \u escapes)
_text = st.text(st.characters(exclude_categories=()), max_size=20)
_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _text
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
                     max_leaves=12)
_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                                             "content": _json}), max_size=3)
_any = _json | st.floats()  # NaN and infinities too (json.dumps writes NaN, Infinity, -Infinity)
# bodies close to valid ones, each field possibly replaced by any value, texts with lone surrogates
_near_valid = st.fixed_dictionaries(
    {"model": st.sampled_from(["polish-pro", "embed"]) | _json},
    optional={"messages": st.lists(st.fixed_dictionaries({"role": st.just("user") | _json,
                                                          "content": _text | _any}), min_size=1, max_size=3) | _any,
              "input": _text | st.lists(_text, max_size=3) | _any, "stream": st.booleans() | _any,
              "max_tokens": st.integers(-2, 5000) | _any,
              "temperature": st.sampled_from([0.5, float("nan"), float("inf"), float("-inf")]) | _any,
              "n": _any, "tools": _any, "stream_options": _any, "user": _any,
              "sim": st.just({"output_tokens": 2})})
_bodies = st.one_of(_near_valid, _near_valid, _near_valid, _json)
_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _non_finite(doc: Any) -> bool:
    if isinstance(doc, float):
        return doc != doc or doc in (float("inf"), float("-inf"))
    if isinstance(doc, list):
        return any(_non_finite(v) for v in doc)
    if isinstance(doc, dict):
        return any(_non_finite(v) for v in doc.values())
    return False


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings"])
def test_arbitrary_json_values_are_never_a_5xx(client: httpx.Client, path: str) -> None:
    @_SETTINGS
    @given(_bodies)
    def check(doc: Any) -> None:
        r = _post(client, path, json.dumps(doc).encode())
        _shape(r)
        if _non_finite(doc):
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    check()


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings"])
def test_arbitrary_bytes_are_never_a_5xx(client: httpx.Client, path: str) -> None:
    @_SETTINGS
    @given(st.binary(min_size=1, max_size=300)
           | st.text(min_size=1).map(lambda t: t.encode("utf-8", "surrogatepass")))
    def check(raw: bytes) -> None:
        _shape(_post(client, path, raw))
    check()
