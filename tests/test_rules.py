"""Unit tests of the pure request rules (no sockets)."""
import json

import pytest

from core.catalog import parse
from core.errors import ApiError
from core.rules import MAX_JSON_DEPTH, prepare_chat, prepare_embeddings

CAT = parse({
    "aliases": {
        "polish-pro": {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048,
                       "prices": [{"effective": "2026-01-01T00:00:00Z", "input_micro_pln_per_1m": 1500000,
                                   "output_micro_pln_per_1m": 3000000}],
                       "upstreams": [{"model": "up-pro"}]},
        "embed": {"capabilities": ["embeddings"], "context_length": 8192, "max_output_tokens": 0,
                  "prices": [{"effective": "2026-01-01T00:00:00Z", "input_micro_pln_per_1m": 200000}],
                  "upstreams": [{"model": "up-embed"}]},
    },
    "upstream_models": {"up-pro": {"deployments": [{"host": "127.0.0.1", "port": 1}]},
                        "up-embed": {"deployments": [{"host": "127.0.0.1", "port": 1}]}},
})


def pick(alias):  # type: ignore[no-untyped-def]
    return alias.upstreams[0].model


def chat(doc: object) -> object:
    return prepare_chat(json.dumps(doc).encode(), CAT, pick)


MSG = [{"role": "user", "content": "Cześć"}]


def test_rewrites_model_and_sets_ceiling_when_absent() -> None:
    p = chat({"model": "polish-pro", "messages": MSG, "temperature": None, "x-custom": {"a": 1}})
    assert not isinstance(p, ApiError)
    sent = json.loads(p.body)
    assert sent["model"] == "up-pro"
    assert sent["max_tokens"] == 2048
    assert sent["temperature"] is None and sent["x-custom"] == {"a": 1}
    assert "stream_options" not in sent and p.stream is False


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_clamped_and_renamed(field: str) -> None:
    p = chat({"model": "polish-pro", "messages": MSG, field: 999999})
    assert not isinstance(p, ApiError)
    sent = json.loads(p.body)
    assert sent["max_tokens"] == 2048 and "max_completion_tokens" not in sent


def test_smaller_of_both_synonyms_and_null_is_absent() -> None:
    p = chat({"model": "polish-pro", "messages": MSG, "max_tokens": 7, "max_completion_tokens": None})
    assert not isinstance(p, ApiError)
    assert json.loads(p.body)["max_tokens"] == 7


@pytest.mark.parametrize("value", [0, -1, "5", 1.5, True, [], {}])
def test_bad_max_tokens(value: object) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        e = chat({"model": "polish-pro", "messages": MSG, field: value})
        assert isinstance(e, ApiError) and (e.code, e.param, e.status) == ("invalid_request", field, 400)


@pytest.mark.parametrize("doc,code,param", [
    ({"messages": MSG}, "invalid_request", "model"),
    ({"model": None, "messages": MSG}, "invalid_request", "model"),
    ({"model": "gpt-4o", "messages": MSG}, "model_not_found", "model"),
    ({"model": "embed", "messages": MSG}, "invalid_request", "model"),
    ({"model": "polish-pro"}, "invalid_request", "messages"),
    ({"model": "polish-pro", "messages": None}, "invalid_request", "messages"),
    ({"model": "polish-pro", "messages": []}, "invalid_request", "messages"),
    ({"model": "polish-pro", "messages": "hi"}, "invalid_request", "messages"),
    ({"model": "polish-pro", "messages": [{"content": "x"}]}, "invalid_request", "messages"),
    ({"model": "polish-pro", "messages": MSG, "stream": True, "stream_options": "yes"},
     "invalid_request", "stream_options"),
    # the model server never sees the client's include_usage (always true upstream): checked here
    *[({"model": "polish-pro", "messages": MSG, "stream": True, "stream_options": {"include_usage": v}},
       "invalid_request", "stream_options") for v in (1, 0, "yes", "true", [], {})],
])
def test_chat_rejections(doc: dict, code: str, param: str) -> None:
    e = chat(doc)
    assert isinstance(e, ApiError) and (e.code, e.param) == (code, param)


def test_invalid_json_and_non_object() -> None:
    e = prepare_chat(b"{nope", CAT, pick)
    assert isinstance(e, ApiError) and e.code == "invalid_json" and e.param is None
    e = prepare_chat(b"[1]", CAT, pick)
    assert isinstance(e, ApiError) and e.code == "invalid_request"


def _nested(depth: int, where: str = "extra") -> bytes:
    """A chat body whose arrays and objects nest ``depth`` levels (the body itself is level 1)."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    body = '{"model": "polish-pro", "messages": [{"role": "user", "content": "hej"}], "%s": %s}'
    return (body % (where, inner)).encode()


@pytest.mark.parametrize("prepare", [prepare_chat, prepare_embeddings])
@pytest.mark.parametrize("raw", [b"[" * 100_000, b"[" * 100_000 + b"]" * 100_000,
                                 b'{"model": "embed", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                                 b'{"a":' * 3000 + b"1" + b"}" * 3000],
                         ids=["100k_open", "100k_closed", "5k_in_field", "3k_objects"])
def test_deep_nesting_is_invalid_json_not_a_crash(prepare, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    """Deeper than the parser's recursion limit: RecursionError used to escape (500)."""
    e = prepare(raw, CAT, pick)
    assert isinstance(e, ApiError) and (e.code, e.status, e.param) == ("invalid_json", 400, None)
    assert "128" in e.message


def test_nesting_limit_is_128_levels() -> None:
    assert MAX_JSON_DEPTH == 128
    p = prepare_chat(_nested(128), CAT, pick)
    assert not isinstance(p, ApiError)
    assert json.loads(p.body)["extra"] == json.loads(_nested(128))["extra"]  # forwarded unchanged
    for raw in (_nested(129), _nested(129, "messages"), _nested(300)):
        e = prepare_chat(raw, CAT, pick)
        assert isinstance(e, ApiError) and (e.code, e.param) == ("invalid_json", None), raw[:80]
    def objects(n: int) -> bytes:  # n levels of objects inside the body's own
        return ('{"model": "embed", "input": "x", "o": ' + '{"a":' * n + "1" + "}" * n + "}").encode()
    assert not isinstance(prepare_embeddings(objects(127), CAT, pick), ApiError)
    e = prepare_embeddings(objects(128), CAT, pick)
    assert isinstance(e, ApiError) and e.code == "invalid_json"


def test_many_brackets_nesting_shallow_accepted() -> None:
    """The limit is on depth, not on how many arrays, objects or bracket characters a body has."""
    many = [{"role": "user", "content": "[[[[{{{{" * 100}] * 500
    p = chat({"model": "polish-pro", "messages": many, "tools": [[[{"a": [1]}]]] * 300})
    assert not isinstance(p, ApiError)
    assert len(json.loads(p.body)["messages"]) == 500


def test_stream_usage_always_requested_upstream_shown_only_when_asked() -> None:
    for opts, shown in [(None, False), ({"include_usage": False}, False), ({"include_usage": True}, True),
                        ({}, False), ({"include_usage": None}, False), ({"include_usage": True, "x": 1}, True)]:
        doc = {"model": "polish-pro", "messages": MSG, "stream": True}
        if opts is not None or shown:
            doc["stream_options"] = opts
        p = chat(doc)
        assert not isinstance(p, ApiError)
        assert json.loads(p.body)["stream_options"]["include_usage"] is True
        assert p.client_wants_usage is shown


def test_null_stream_options_on_a_stream_means_include_usage() -> None:
    """docs/interface.md section 4 rule 4: a null stream_options on a streaming request is replaced by include_usage
    true, so the client asked for the usage chunk (absent stream_options: it did not)."""
    p = chat({"model": "polish-pro", "messages": MSG, "stream": True, "stream_options": None})
    assert not isinstance(p, ApiError)
    assert json.loads(p.body)["stream_options"] == {"include_usage": True}
    assert p.client_wants_usage is True
    p = chat({"model": "polish-pro", "messages": MSG, "stream_options": None})
    assert not isinstance(p, ApiError)
    assert json.loads(p.body)["stream_options"] is None and p.client_wants_usage is False


def test_no_capacity_when_no_upstream() -> None:
    e = prepare_chat(json.dumps({"model": "polish-pro", "messages": MSG}).encode(), CAT, lambda a: None)
    assert isinstance(e, ApiError) and (e.code, e.status) == ("no_capacity", 503)


@pytest.mark.parametrize("inp,ok", [("x", True), (["a", "b"], True), ([], False), ([1, 2], False),
                                    ([[1, 2]], False), (None, False), (5, False), (["a", 1], False)])
def test_embedding_inputs(inp: object, ok: bool) -> None:
    p = prepare_embeddings(json.dumps({"model": "embed", "input": inp}).encode(), CAT, pick)
    if ok:
        assert not isinstance(p, ApiError) and json.loads(p.body)["model"] == "up-embed"
    else:
        assert isinstance(p, ApiError) and (p.code, p.param) == ("invalid_request", "input")


def test_embeddings_wrong_alias_and_format() -> None:
    e = prepare_embeddings(b'{"model":"polish-pro","input":"x"}', CAT, pick)
    assert isinstance(e, ApiError) and (e.code, e.param) == ("invalid_request", "model")
    e = prepare_embeddings(b'{"model":"nope","input":"x"}', CAT, pick)
    assert isinstance(e, ApiError) and (e.code, e.status) == ("model_not_found", 404)
    e = prepare_embeddings(b'{"model":"embed","input":"x","encoding_format":"hex"}', CAT, pick)
    assert isinstance(e, ApiError) and e.param == "encoding_format"


@pytest.mark.parametrize("number", [b"1e400", b"-1E999", b"123456789e400"])
@pytest.mark.parametrize("prepare,head", [
    (prepare_chat, b'{"model":"polish-pro","messages":[{"role":"user","content":"x"}],"temperature":'),
    (prepare_embeddings, b'{"model":"embed","input":"x","dimensions":'),
])
def test_a_number_beyond_a_doubles_range_is_refused_not_forwarded_as_infinity(  # type: ignore[no-untyped-def]
        prepare, head: bytes, number: bytes) -> None:
    """Valid JSON that Python reads as infinity: re-written it would be ``Infinity``, which is not JSON
    (no model server could read the body); it is refused as the interface's invalid_request instead."""
    r = prepare(head + number + b"}", CAT, pick)
    assert isinstance(r, ApiError)
    assert (r.status, r.code, r.type, r.param) == (400, "invalid_request", "invalid_request_error", None)
    assert number.decode() not in r.message


def test_large_but_finite_numbers_are_forwarded_as_json() -> None:
    p = prepare_chat(b'{"model":"polish-pro","messages":[{"role":"user","content":"x"}],"temperature":1e308,'
                     b'"logit_bias":{"5":-1.5e-320},"seed":123456789012345678901234567890}', CAT, pick)
    assert not isinstance(p, ApiError)
    assert b"Infinity" not in p.body and b"NaN" not in p.body
    sent = json.loads(p.body)
    assert (sent["temperature"], sent["logit_bias"], sent["seed"]) == (
        1e308, {"5": -1.5e-320}, 123456789012345678901234567890)


def test_an_integer_over_pythons_digit_limit_is_out_of_range_not_malformed() -> None:
    """4,300 digits parse; more is valid JSON that Python refuses to convert (its guard, kept): the interface's
    "parameter out of range", invalid_request, not invalid_json."""
    head = b'{"model":"polish-pro","messages":[{"role":"user","content":"x"}],"seed":'
    assert not isinstance(prepare_chat(head + b"9" * 4300 + b"}", CAT, pick), ApiError)
    r = prepare_chat(head + b"9" * 4301 + b"}", CAT, pick)
    assert isinstance(r, ApiError)
    assert (r.status, r.code, r.param) == (400, "invalid_request", None) and "4,300" in r.message
    bad = prepare_chat(head + b"NaN}", CAT, pick)  # a constant that is not JSON is still malformed
    assert isinstance(bad, ApiError) and bad.code == "invalid_json"


@pytest.mark.parametrize("inp,pretokenized", [([1, 2], True), ([[1, 2], [3]], True), ([1, [2]], True),
                                             ([True], False), ([[True]], False), ([["a"]], False), ([[]], False),
                                             ([1.5], False)])
def test_only_token_ids_are_called_pre_tokenized(inp: object, pretokenized: bool) -> None:
    """The interface: arrays of integers (pre-tokenized input) are rejected; other wrong arrays get the general
    message (a boolean is no token id)."""
    e = prepare_embeddings(json.dumps({"model": "embed", "input": inp}).encode(), CAT, pick)
    assert isinstance(e, ApiError) and (e.status, e.code, e.param) == (400, "invalid_request", "input")
    assert ("Pre-tokenized" in e.message) is pretokenized, e.message


@pytest.mark.parametrize("n, choices", [
    (None, 1), (1, 1), (3, 3), (500, 500), (2.0, 2), ("7", 7), (" 4 ", 4), (True, 1), (False, 1), (0, 1),
    (-5, 1), (2.5, 1), ("2.5", 1), ("many", 1), ("²", 1), ([3], 1), ({"n": 3}, 1), ("9" * 19, 1)])
def test_the_choices_a_request_can_get_are_its_n_as_a_model_server_reads_it(n: object, choices: int) -> None:
    """The hold counts n x max_tokens output tokens: n as vLLM's lax parsing reads it (2.0 and "7" too);
    what no model server takes as a count (absent, a boolean, below 1, not whole) counts as 1."""
    doc: dict[str, object] = {"model": "polish-pro", "messages": MSG, "max_tokens": 100}
    if n is not None:
        doc["n"] = n
    p = chat(doc)
    assert not isinstance(p, ApiError)
    assert (p.choices, p.max_tokens) == (choices, 100)
    assert json.loads(p.body).get("n") == n  # forwarded unchanged (the interface)


def test_the_forwarded_max_tokens_is_kept_for_the_hold() -> None:
    p = chat({"model": "polish-pro", "messages": MSG, "max_completion_tokens": 9000})
    assert not isinstance(p, ApiError) and p.max_tokens == 2048 and p.choices == 1  # clamped to the ceiling
    e = prepare_embeddings(json.dumps({"model": "embed", "input": ["ab", "cd"]}).encode(), CAT, pick)
    assert not isinstance(e, ApiError) and (e.max_tokens, e.choices) == (0, 1)
