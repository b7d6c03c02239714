"""What Envoy's relay (envoy/sse_relay.lua) and the stream watch (``observer``) know of a streamed reply
the exchange handed over: one ``StreamContext``, carried in the ``x-gateway-stream`` response header as
one JSON object (ASCII: a header value) whose member names are ``WIRE``'s, written here only.  The relay
removes the header before the reply leaves, and Envoy removes one a model server sent before any filter
reads it (envoy/envoy.yaml); the names are short because the header passes every streamed reply's
filters.  Pure.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

HEADER = "x-gateway-stream"


@dataclass(frozen=True, slots=True)
class StreamContext:
    endpoint: str  # the endpoint's name (``endpoints``)
    alias: str
    upstream_model: str
    client_wants_usage: bool  # show the usage chunk to the client
    request_id: str
    org_id: str
    key_id: str
    started: float  # unix seconds
    ttfb_ms: int | None
    input_price: int  # micro-PLN per million tokens, in force at ``started``
    output_price: int
    estimated_prompt_tokens: int
    owner: str  # the ext_proc process that handed the stream over

    def header(self) -> str:
        doc: dict[str, Any] = {wire: getattr(self, name) for name, wire in WIRE.items()}
        doc[WIRE["client_wants_usage"]] = int(self.client_wants_usage)  # the relay compares it with "1"
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def parse(cls, header: str) -> StreamContext:
        doc = json.loads(header)
        values: dict[str, Any] = {name: doc[wire] for name, wire in WIRE.items()}
        values["client_wants_usage"] = values["client_wants_usage"] == 1
        return cls(**values)


# Each field's name in the header: the one place they are written (tests/test_stream_context.py holds
# the Lua relay to the names of ``RELAY_READS``).
WIRE: dict[str, str] = {
    "endpoint": "e", "alias": "a", "upstream_model": "u", "client_wants_usage": "w", "request_id": "r",
    "org_id": "o", "key_id": "k", "started": "s", "ttfb_ms": "t", "input_price": "i", "output_price": "x",
    "estimated_prompt_tokens": "p", "owner": "n",
}
# what envoy/sse_relay.lua reads of it
RELAY_READS = ("alias", "upstream_model", "client_wants_usage", "estimated_prompt_tokens", "input_price",
               "output_price")
