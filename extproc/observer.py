"""The stream watch: bills a streamed reply that Envoy relays itself.

Envoy relays a model server's event stream to the client chunk by chunk (envoy/sse_relay.lua), holding
nothing back but an unfinished event, so every event sent before a failure reaches the client.  A second
ext_proc filter in observability mode sends this process a copy of each chunk as it passes, without
waiting for an answer; the ``Exchange`` that let the request through named the stream in the
``x-gateway-stream`` response header (``stream_context``), and the stream's endpoint's meter
(``endpoints``) counts it.  This module knows nothing of gRPC: the stream loop (``server``) calls
``StreamWatch`` and ends the call when it asks to.

Billing is ``billing_outcome.decide``'s, on the facts gathered here: whether the stream ended, the usage
the model server reported, the events that carried content (the role chunk carries none), whether the
idle or the total budget ran out, and whether the client left.  A model server that breaks the stream
and a client that leaves both end Envoy's stream at any moment; Envoy's access log tells them apart
(``access_log``: the client's requests it marks in Redis).
"""
from __future__ import annotations

from core.cost import Prices, cost_micro_pln
from core.decisions import UsageRecord
from core.sse import StreamMeter
from core.stream_context import HEADER, StreamContext
from . import metrics
from .billing_outcome import LEFT, Facts, decide
from .exchange import Gateway, account, count


# Envoy keeps the watch's call open this long after the stream ended (envoy/envoy.yaml
# deferred_close_timeout), so that the last chunks still arrive: the end of the call comes that much
# after the end of the stream.
CLOSE_DELAY_S = 1.0
# Envoy's total-budget timer and this process's clock need not agree to the millisecond.
TOTAL_SLACK_S = 0.25


class StreamWatch:
    __slots__ = ("gw", "ctx", "meter", "ended", "failure", "last_bytes", "done", "left")

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.ctx: StreamContext | None = None
        self.meter = StreamMeter()  # the stream's endpoint's, once it is known
        self.ended = False
        self.failure = ""
        self.last_bytes = gw.clock()
        self.done = False
        self.left = False  # Envoy's access log said the client left (``access_log``, in this process)

    @property
    def settled(self) -> bool:
        """The stream reached its end, or this watch billed it (its finish frees the slot now)."""
        return self.ended or self.done

    @property
    def idle(self) -> float | None:
        """Seconds the next chunk may take (docs/interface.md section 7's idle gap), once the stream is known."""
        return self.gw.idle_timeout_s if self.ctx is not None and not self.done else None

    def response_headers(self, headers: dict[str, str]) -> None:
        raw = headers.get(HEADER)
        if raw is not None:
            self.ctx = ctx = StreamContext.parse(raw)
            self.meter = self.gw.endpoints.by_name[ctx.endpoint].meter()
            self.last_bytes = self.gw.clock()
            if ctx.owner == self.gw.owner:  # handed over by this process: it needs no finish of its own
                self.gw.watched[ctx.request_id] = self

    def response_body(self, body: bytes, end_of_stream: bool) -> None:
        if self.ctx is None:
            return
        if body:
            self.last_bytes = self.gw.clock()
            self.meter.feed(body)
        if end_of_stream:
            self.ended = True

    def client_left(self) -> None:
        """Envoy's access log says the client went away: the call ends shortly, before Envoy would end it."""
        self.left = True

    def stalled(self) -> None:
        """No chunk came within the idle budget: the stream loop ends the call with an error, which makes
        Envoy reset the client's stream (it ends without [DONE])."""
        self.failure = "upstream_timeout"

    async def close(self) -> None:
        """The call ended (after the stream's end, or Envoy's deferred close of a stream that broke)."""
        ctx = self.ctx
        if ctx is None or self.done:
            return
        self.done = True
        now = self.gw.clock()
        end = now if self.ended or self.failure or self.left else now - CLOSE_DELAY_S
        if not self.ended and not self.failure and end - ctx.started >= self.gw.total_timeout_s - TOTAL_SLACK_S:
            self.failure = "upstream_timeout"  # Envoy's total budget ended the stream
        left = self.left
        if not (self.ended or self.failure or self.meter.usage is not None or left):
            left = await self.gw.how_ended(ctx.request_id) == LEFT
        events = self.meter.content_events
        o = decide(Facts(ctx.estimated_prompt_tokens, streamed=True, status=200, ended=self.ended,
                         usage=self.meter.usage, output=events, content_seen=events > 0, client_left=left,
                         failure=self.failure))
        prompt, completion = o.tokens or (0, 0)
        alias = ctx.alias
        r = UsageRecord(
            request_id=ctx.request_id, org_id=ctx.org_id, key_id=ctx.key_id, alias=alias,
            upstream_model=ctx.upstream_model, endpoint=ctx.endpoint, status=o.status, stream=True,
            prompt_tokens=prompt, completion_tokens=completion, estimated=o.estimated,
            cost_micro_pln=cost_micro_pln(prompt, completion, Prices(ctx.input_price, ctx.output_price)),
            input_price=ctx.input_price, output_price=ctx.output_price, started_at=ctx.started,
            ttfb_ms=ctx.ttfb_ms, ended_at=max(end, self.last_bytes), error_code=o.code)
        if o.code:
            metrics.labelled(metrics.UPSTREAM_FAILURES, alias, o.code).inc()
        if o.tokens is not None:
            account(r, self.gw.endpoints.by_name[ctx.endpoint])
        else:
            count(alias, ctx.endpoint, o.status, o.code)
        await self.gw.finish(r.org_id, r.request_id, r)

