"""Unit tests of reply translation, the cost rule, the catalog and key handling."""
import json

import pytest

from core.catalog import CatalogError, parse
from core.cost import Prices, cost_micro_pln, estimate_chat_prompt
from core.keys import bearer_key, key_hash, new_key
from core.responses import read_usage, rewrite_body, upstream_error, with_estimated_usage


def test_rewrite_body_puts_alias_back_and_reads_usage() -> None:
    body = json.dumps({"id": "x", "model": "up-pro", "choices": [],
                       "usage": {"prompt_tokens": 12, "total_tokens": 20, "completion_tokens": 8}}).encode()
    reply = rewrite_body(body, "up-pro", "polish-pro")
    assert json.loads(reply.body())["model"] == "polish-pro" and reply.tokens == (12, 8)
    assert read_usage(b'{"model":"m"}') is None
    emb = b'{"object":"list","model":"e","data":[],"usage":{"prompt_tokens":3,"total_tokens":3}}'
    assert rewrite_body(emb, "e", "embed").tokens == (3, 0)
    plain = b'{"object":"list","model":"e","data":[]}'
    assert rewrite_body(plain, "e", "embed").tokens is None and rewrite_body(plain, "other", "x").body(5) == plain


_LOGPROB_USAGE = {"token": "usage", "logprob": -0.1, "bytes": [117], "top_logprobs": [{"token": "usage"}]}


@pytest.mark.parametrize("usage,expected", [
    ({"prompt_tokens": 12, "total_tokens": 20, "completion_tokens": 8}, (12, 8)),
    # a nested object before the counts, or between them (members in any order)
    ({"prompt_tokens_details": {"cached_tokens": 4}, "prompt_tokens": 12, "completion_tokens": 8}, (12, 8)),
    ({"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 4}, "completion_tokens": 8}, (12, 8)),
    ({"completion_tokens": 8, "completion_tokens_details": {"reasoning_tokens": 2}, "prompt_tokens": 12}, (12, 8)),
    ({"prompt_tokens": 12, "total_tokens": 12}, (12, 0)),  # embeddings: no completion count
    ({"total_tokens": 20}, None),
    ({"prompt_tokens": "12", "completion_tokens": 8}, None),
    (None, None),
])
@pytest.mark.parametrize("usage_first", [False, True])
def test_a_replys_usage_is_read_as_json(usage: object, expected: tuple[int, int] | None, usage_first: bool) -> None:
    """The usage object is decoded, wherever it is in the reply; a logprobs token spelled "usage" or
    content that says it are no usage member."""
    choices = [{"index": 0, "message": {"role": "assistant", "content": 'say "usage": {"prompt_tokens": 99}'},
                "logprobs": {"content": [_LOGPROB_USAGE]}, "finish_reason": "stop"}]
    doc: dict[str, object] = {"id": "x", "model": "up-pro"}
    doc.update({"usage": usage, "choices": choices} if usage_first else {"choices": choices, "usage": usage})
    if usage is None:
        del doc["usage"]
    body = json.dumps(doc).encode()
    assert read_usage(body) == expected
    assert read_usage(json.dumps(doc, separators=(",", ":")).encode()) == expected
    reply = rewrite_body(body, "up-pro", "polish-pro")
    assert reply.tokens == expected and json.loads(reply.body())["model"] == "polish-pro"
    if expected is not None:  # the cost goes in the usage object itself, whatever surrounds it
        doc = json.loads(reply.body(123))
        assert doc["usage"] == {**usage, "cost_micro_pln": 123}  # type: ignore[dict-item]
        assert doc["choices"] == choices and doc["model"] == "polish-pro"


def test_embeddings_usage_loses_its_completion_count_only() -> None:
    emb = b'{"object":"list","model":"e","data":[],"usage":{"prompt_tokens":3,"completion_tokens":0,"total_tokens":3}}'
    reply = rewrite_body(emb, "e", "embed", embeddings=True)
    assert reply.tokens == (3, 0) and json.loads(reply.body())["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert json.loads(reply.body(1))["usage"] == {"prompt_tokens": 3, "total_tokens": 3, "cost_micro_pln": 1}


def test_the_usage_carries_the_cost_once_and_estimated_only_where_it_is() -> None:
    """A model server's own cost_micro_pln or estimated (another gateway's) gives way to this request's."""
    body = (b'{"id":"x","model":"up-pro","choices":[],"usage":{"prompt_tokens":2,"cost_micro_pln":9,'
            b'"completion_tokens":1,"estimated":true,"total_tokens":3}}')
    reply = rewrite_body(body, "up-pro", "polish-pro")
    assert reply.body(7).endswith(b'"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3,'
                                  b'"cost_micro_pln":7}}')
    assert json.loads(reply.body(7, estimated=True))["usage"]["estimated"] is True


def test_the_model_servers_usage_bytes_are_kept_and_the_cost_follows_them() -> None:
    body = b'{"model": "up-pro", "usage": {"prompt_tokens": 2, "completion_tokens": 1, "queue_time": 1.50 }, "x": 1}'
    reply = rewrite_body(body, "up-pro", "polish-pro")
    assert reply.body() == body.replace(b'"model": "up-pro"', b'"model":"polish-pro"')
    assert reply.body(4) == (b'{"model":"polish-pro", "usage": {"prompt_tokens": 2, "completion_tokens": 1, '
                             b'"queue_time": 1.50 ,"cost_micro_pln":4}, "x": 1}')


@pytest.mark.parametrize("doc,embeddings", [
    ({"id": "x", "model": "polish-pro", "choices": [{"index": 0, "message": {"content": "Ala ma kota"}}]}, False),
    ({"id": "x", "usage": None, "choices": [{"index": 0, "message": {"content": "Ala ma kota"}}]}, False),
    ({}, False),
    ({"object": "list", "model": "embed", "data": []}, True),
])
def test_an_estimated_usage_says_so_with_its_cost(doc: dict[str, object], embeddings: bool) -> None:
    reply, completion = with_estimated_usage(json.dumps(doc).encode(), 40, embeddings=embeddings)
    got = json.loads(reply.body(55, estimated=True))
    assert completion == (0 if embeddings or not doc.get("choices") else 3)
    usage = {"prompt_tokens": 40, "total_tokens": 40 + completion, "cost_micro_pln": 55, "estimated": True}
    if not embeddings:
        usage["completion_tokens"] = completion
    assert got == {**{k: v for k, v in doc.items() if k != "usage"}, "usage": usage}
    assert list(got)[-1] == "usage"
    assert with_estimated_usage(b"[1]", 4) == (with_estimated_usage(b"[1]", 4)[0], 0)
    assert with_estimated_usage(b"[1]", 4)[0].body(1) == b"[1]"


@pytest.mark.parametrize("status,msg,code,http", [
    (400, "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens", "context_length_exceeded", 400),
    # vLLM v1, SGLang, TGI, llama.cpp
    (400, "The decoder prompt (length 9000) is longer than the maximum model length of 8192.", "context_length_exceeded", 400),
    (400, "The input (9000 tokens) is longer than the model's context length (8192 tokens).", "context_length_exceeded", 400),
    (422, "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 8192. Given: 9000 `inputs` tokens "
          "and 100 `max_new_tokens`", "context_length_exceeded", 400),
    (400, "the request exceeds the available context size, try increasing it", "context_length_exceeded", 400),
    (400, "Input audio is not supported: m is not a multimodal model", "invalid_request", 400),
    (400, "temperature must be non-negative, got -1.0.", "invalid_request", 400),
    (400, "m is not a multimodal model", "invalid_request", 400),
    (422, "bad", "invalid_request", 400),
    (500, "boom", "upstream_unavailable", 502),
    (503, "boom", "upstream_unavailable", 502),
    (404, "The model `x` does not exist.", "upstream_unavailable", 502),
])
def test_upstream_errors_mapped(status: int, msg: str, code: str, http: int) -> None:
    body = json.dumps({"error": {"message": msg + " SECRET-PROMPT", "type": "BadRequestError",
                                 "param": None, "code": status}}).encode()
    e = upstream_error(status, body)
    assert (e.code, e.status) == (code, http)
    assert "SECRET-PROMPT" not in e.message and "SECRET-PROMPT" not in e.body("r").decode()


def test_cost_rounds_each_term_up() -> None:
    p = Prices(1_500_000, 3_000_000)
    assert cost_micro_pln(1, 1, p) == 2 + 3
    assert cost_micro_pln(1000, 500, p) == 1500 + 1500
    assert cost_micro_pln(3, 0, Prices(333_333, 0)) == 1  # 0.999999 -> 1
    assert cost_micro_pln(0, 0, p) == 0
    assert estimate_chat_prompt([{"role": "user", "content": "abcdefgh"}]) == 3 + 2 + 4  # priming, text, framing


def test_catalog_errors_name_the_field() -> None:
    with pytest.raises(CatalogError, match=r"aliases\.a\.prices"):
        parse({"aliases": {"a": {"capabilities": ["chat"], "context_length": 1, "max_output_tokens": 1}},
               "upstream_models": {}})
    with pytest.raises(CatalogError, match=r"upstreams\[0\]\.model"):
        parse({"aliases": {"a": {"capabilities": ["chat"], "context_length": 1, "max_output_tokens": 1,
                                 "prices": [{"effective": "2026-01-01", "input_micro_pln_per_1m": 1}],
                                 "upstreams": [{"model": "nope"}]}}, "upstream_models": {}})


def test_prices_in_force_by_effective_time() -> None:
    cat = parse({"aliases": {"a": {"capabilities": ["chat"], "context_length": 1, "max_output_tokens": 1,
                                   "prices": [{"effective": "2026-01-01T00:00:00Z", "input_micro_pln_per_1m": 1,
                                               "output_micro_pln_per_1m": 2},
                                              {"effective": "2027-01-01T00:00:00Z", "input_micro_pln_per_1m": 5,
                                               "output_micro_pln_per_1m": 6}]}}, "upstream_models": {}})
    a = cat.aliases["a"]
    assert a.prices_at(1798761599) == Prices(1, 2)  # 2026-12-31T23:59:59Z
    assert a.prices_at(1798761600) == Prices(5, 6)
    # before its first price the alias has none in force: not offered, and no price is applied early
    assert a.offered_at(1767225600) and not a.offered_at(1767225599)
    with pytest.raises(ValueError, match="no price in force"):
        a.prices_at(1767225599)


def test_keys() -> None:
    k = new_key()
    assert k.startswith("sk-service-") and len(k) == 51
    assert bearer_key(f"Bearer {k}") == k and bearer_key(f"bEaReR {k}") == k
    assert bearer_key(f"Basic {k}") is None and bearer_key(f"Bearer {k}x") is None
    assert bearer_key("Bearer sk-service-short") is None and bearer_key(None) is None
    assert len(key_hash(k)) == 64 and key_hash(k) != k


def test_bad_catalog_file_names_file_line_and_field(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from core.catalog import load
    good = tmp_path / "ok.yaml"
    good.write_text("aliases:\n  a:\n    capabilities: [chat]\n    context_length: 10\n    max_output_tokens: 5\n"
                    "    prices:\n      - {input_micro_pln_per_1m: 1}\n    upstreams: []\nupstream_models: {}\n")
    with pytest.raises(CatalogError, match=r"ok\.yaml: line 7: aliases\.a\.prices\[0\]\.effective"):
        load(good)
    bad = tmp_path / "bad.yaml"
    bad.write_text("aliases:\n  a: [1,\n")
    with pytest.raises(CatalogError, match=r"bad\.yaml: line \d+: malformed YAML"):
        load(bad)
    unknown = tmp_path / "route.yaml"
    unknown.write_text("aliases:\n  a:\n    capabilities: [chat]\n    context_length: 10\n    max_output_tokens: 5\n"
                       "    prices:\n      - {effective: 2026-01-01, input_micro_pln_per_1m: 1}\n"
                       "    upstreams:\n      - {model: ghost}\nupstream_models: {}\n")
    with pytest.raises(CatalogError, match=r"route\.yaml: line 9: aliases\.a\.upstreams\[0\]\.model"):
        load(unknown)


def test_auth_cache_expires_within_its_ttl() -> None:
    from core.decisions import Admission, Identity
    from extproc.exchange import AuthCache
    now = [100.0]
    cache = AuthCache(ttl=0.5, size=2, clock=lambda: now[0])
    adm = Admission(Identity("k", "o"), None)
    cache.put("h1", adm)
    assert cache.get("h1") is adm and cache.get("h2") is None
    now[0] += 0.51
    assert cache.get("h1") is None  # a revocation is seen after at most the TTL
    cache.put("a", adm)
    cache.put("b", adm)
    cache.put("c", adm)  # full: cleared, never grows past its size
    assert cache.get("a") is None and cache.get("c") is adm


_PRICED = ("aliases:\n  a:\n    capabilities: [chat]\n    context_length: 10\n    max_output_tokens: 5\n"
           "    prices:\n      - effective: 2026-01-01\n        input_micro_pln_per_1m: {i}\n"
           "        output_micro_pln_per_1m: {o}\n    upstreams: []\nupstream_models: {{}}\n")


@pytest.mark.parametrize("i,o,line,field,shown", [
    ("1", "1.5e6", 9, "output_micro_pln_per_1m", "'1.5e6'"),  # YAML 1.1 reads it as text
    ("1", "1.5e+6", 9, "output_micro_pln_per_1m", "1500000.0"),
    ("1", "1.5", 9, "output_micro_pln_per_1m", "1.5"),
    ("1", "abc", 9, "output_micro_pln_per_1m", "'abc'"),
    ("1", "-1", 9, "output_micro_pln_per_1m", "-1"),
    ("-5", "1", 8, "input_micro_pln_per_1m", "-5"),
    ("2.0", "1", 8, "input_micro_pln_per_1m", "2.0"),
    ("true", "1", 8, "input_micro_pln_per_1m", "True"),
])
def test_a_price_that_is_not_a_non_negative_integer_is_refused(tmp_path, i: str, o: str, line: int,  # type: ignore[no-untyped-def]
                                                               field: str, shown: str) -> None:
    from core.catalog import load
    f = tmp_path / "prices.yaml"
    f.write_text(_PRICED.format(i=i, o=o))
    with pytest.raises(CatalogError) as e:
        load(f)
    assert str(e.value) == (f"{f}: line {line}: aliases.a.prices[0].{field}: must be an integer >= 0 "
                            f"(got {shown})")


def test_a_catalog_of_the_wrong_shape_is_refused_by_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from core.catalog import load
    f = tmp_path / "shape.yaml"
    for text, message in [
        ("aliases: [a, b]\n", "line 1: aliases: must be a mapping"),
        ("aliases:\n  a:\n    capabilities: chat\n", "line 3: aliases.a.capabilities: must be a list"),
        ("upstream_models:\n  m: [1]\n", "line 2: upstream_models.m: must be a mapping"),
        ("aliases:\n  a:\n    capabilities: [chat]\n    prices: {x: 1}\n", "line 4: aliases.a.prices: must be a list"),
    ]:
        f.write_text(text)
        with pytest.raises(CatalogError) as e:
            load(f)
        assert str(e.value) == f"{f}: {message}", text
