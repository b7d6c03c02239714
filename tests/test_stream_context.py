"""The streamed reply's context (core/stream_context.py): one type, its wire names written once, and
Envoy's relay (envoy/sse_relay.lua) reading exactly those: the relay's own entry point is run here in
LuaJIT (through lupa, tests/lua_relay.py) on a header the Python type wrote."""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, cast

from core.stream_context import HEADER, RELAY_READS, WIRE, StreamContext
from extproc_fakes import chunk, sse, usage_chunk
from lua_relay import SCRIPT, _lua

CTX = StreamContext(endpoint="chat", alias="polish-pro", upstream_model="up/pro \"1\"", client_wants_usage=True,
                    request_id="rid-1", org_id="org_1", key_id="key_1", started=1_800_000_000.25, ttfb_ms=120,
                    input_price=1_500_000, output_price=3_000_000, estimated_prompt_tokens=17, owner="p1")

# envoy_on_response with a handle that offers the header and one body chunk, returning what it passed on
_RESPOND = cast(Callable[[bytes, bytes], Any], _lua.eval(b"""
function(header, body)
  local out, removed = {}, {}
  local headers = {get = function(_, name) if name == "x-gateway-stream" then return header end end,
                   remove = function(_, name) removed[#removed + 1] = name end}
  local given = false
  -- (the relay's counts for Envoy's access log: tests/test_relay_e2e.py reads them through Envoy)
  local metadata = {set = function(_, namespace, key, value) end}
  local handle = {
    headers = function(_) return headers end,
    streamInfo = function(_) return {dynamicMetadata = function(_) return metadata end} end,
    bodyChunks = function(_)
      return function()
        if given then return nil end
        given = true
        return {length = function(_) return #body end, getBytes = function(_, i, n) return body end,
                setBytes = function(_, b) out[#out + 1] = b end}
      end
    end}
  envoy_on_response(handle)
  return table.concat(out), table.concat(removed, ",")
end"""))


def relayed(ctx: StreamContext, body: bytes) -> tuple[bytes, bytes]:
    out, removed = _RESPOND(ctx.header().encode(), body)
    return bytes(out), bytes(removed)


def test_every_field_has_one_wire_name() -> None:
    fields = [f.name for f in dataclasses.fields(StreamContext)]
    assert sorted(WIRE) == sorted(fields) and len(set(WIRE.values())) == len(WIRE)
    assert set(RELAY_READS) <= set(fields)


def test_the_header_is_compact_ascii_json_under_the_wire_names_and_parses_back() -> None:
    header = CTX.header()
    doc = json.loads(header)
    assert header.isascii() and header == json.dumps(doc, separators=(",", ":"))
    assert doc == {"e": "chat", "a": "polish-pro", "u": 'up/pro "1"', "w": 1, "r": "rid-1", "o": "org_1",
                   "k": "key_1", "s": 1_800_000_000.25, "t": 120, "i": 1_500_000, "x": 3_000_000, "p": 17,
                   "n": "p1"}
    assert StreamContext.parse(header) == CTX
    quiet = dataclasses.replace(CTX, client_wants_usage=False, ttfb_ms=None, alias="żółw")
    assert json.loads(quiet.header())["w"] == 0 and quiet.header().isascii()
    assert StreamContext.parse(quiet.header()) == quiet


def test_the_lua_relay_reads_exactly_the_wire_names_of_what_it_needs() -> None:
    read = set(re.findall(r'ctx_field\(ctx, "(\w+)"\)', SCRIPT.read_text()))
    assert read == {WIRE[name] for name in RELAY_READS}
    assert f'headers:get("{HEADER}")' in SCRIPT.read_text() and f'headers:remove("{HEADER}")' in SCRIPT.read_text()


def test_the_relay_renames_and_shows_usage_as_the_context_says() -> None:
    """The alias in place of the upstream model ("a", "u"), the usage shown only when asked for ("w"),
    the estimated input ("p") in the usage of a stream that reported none, the cost at the prices ("i",
    "x"); the header removed."""
    stream = sse(chunk("Cześć", model=CTX.upstream_model), usage_chunk(9, 1, model=CTX.upstream_model))
    out, removed = relayed(CTX, stream)
    assert removed == HEADER.encode()
    events = [json.loads(e[6:]) for e in out.decode().split("\n\n") if e.startswith("data: {")]
    assert [e["model"] for e in events] == ["polish-pro", "polish-pro"]
    # the cost at the header's prices ("i", "x"): ceil(9 x 1.5) + ceil(1 x 3)
    assert events[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10,
                                   "cost_micro_pln": 14 + 3}
    out, _ = relayed(dataclasses.replace(CTX, client_wants_usage=False), stream)
    assert b'"usage"' not in out and out.count(b'"model":"polish-pro"') == 1
    out, _ = relayed(CTX, sse(chunk("Cześć", model=CTX.upstream_model), chunk("!", model=CTX.upstream_model)))
    usage = [json.loads(e[6:]) for e in out.decode().split("\n\n") if '"usage"' in e]
    assert [u["usage"] for u in usage] == [{"prompt_tokens": 17, "completion_tokens": 2, "total_tokens": 19,
                                            "cost_micro_pln": 26 + 6, "estimated": True}]
