"""Envoy's stream relay (envoy/sse_relay.lua) run outside Envoy, in LuaJIT through lupa, beside the
ext_proc's meter of the same bytes (core/sse.py): the pair the gateway runs on every streamed reply."""
from __future__ import annotations

import json
from pathlib import Path

from lupa import luajit21

from core.cost import Prices
from core.sse import StreamMeter

SCRIPT = Path(__file__).resolve().parent.parent / "envoy" / "sse_relay.lua"
_lua = luajit21.LuaRuntime(encoding=None)
_lua.execute(SCRIPT.read_bytes())
_module = _lua.globals()[b"sse_relay"]


PRICES = Prices(1_500_000, 3_000_000)  # polish-pro's, in the tests' catalog


class Relay:
    """``feed`` returns what Envoy passes on for a chunk; ``usage`` and ``content_events`` are what the
    ext_proc read of the same chunks."""

    def __init__(self, upstream_model: str, alias: str, show_usage: bool, prompt_estimate: int = 0,
                 prices: Prices = PRICES) -> None:
        self._lua = _module[b"Relay"][b"new"](json.dumps(upstream_model).encode(), json.dumps(alias).encode(),
                                               show_usage, str(prompt_estimate).encode(),
                                               str(prices.input).encode(), str(prices.output).encode())
        self.prices = prices
        self._feed = self._lua[b"feed"]
        self.meter = StreamMeter()

    def feed(self, chunk: bytes) -> bytes:
        self.meter.feed(chunk)
        out = self._feed(self._lua, chunk)
        assert isinstance(out, bytes)
        return out

    def end(self) -> bytes:
        """The stream ended: Envoy has nothing more to pass on (an unterminated event is dropped)."""
        return b""

    @property
    def lua_content_events(self) -> int:
        """The relay's own count (kept while the client asked for usage and none was reported)."""
        return int(self._lua[b"content"])

    @property
    def usage(self) -> tuple[int, int] | None:
        return self.meter.usage

    @property
    def content_events(self) -> int:
        return self.meter.content_events


def ctx_field(ctx: bytes, name: str) -> bytes | None:
    out = _module[b"ctx_field"](ctx, name.encode())
    assert out is None or isinstance(out, bytes)
    return out


def lua_cost(prompt: int, completion: int, prices: Prices) -> int:
    """The relay's figure for the usage it shows (the text it writes, as an integer)."""
    out = _module[b"cost_micro_pln"](prompt, completion, prices.input, prices.output)
    assert isinstance(out, bytes) and out.isdigit()
    return int(out)
