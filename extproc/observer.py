"""The stream watch: bills a streamed reply that Envoy relays itself.

Envoy relays a model server's event stream to the client chunk by chunk (envoy/sse_relay.lua), holding
nothing back but an unfinished event, so every event sent before a failure reaches the client.  A second
ext_proc filter in observability mode sends this process a copy of each chunk as it passes, without
waiting for an answer; the ``Exchange`` that let the request through named the stream in the
``x-gateway-stream`` response header (``stream_context``), and the stream's endpoint's meter
(``endpoints``) counts it.  This module knows nothing of gRPC: the stream loop (``server``) calls
``StreamWatch`` and ends the call when it asks to.

Billing (SPEC section 4, "Billing on failure"; README, Billing):
- the stream ended: the usage the model server reported, else the estimated input and one output token
  per event that carried content (estimated);
- it ended abnormally before any output: nothing;
- the model server broke it (or went idle past the budget, or the total budget ran out) after some
  events: the estimated input and the events that reached the client (estimated); the client saw 200
  and a stream without [DONE], logged as 200 with the code upstream_unavailable / upstream_timeout;
- the client left: the estimated input (logged 499).
A model server that breaks the stream and a client that leaves both end Envoy's stream at any moment;
Envoy's access log tells them apart (``access_log``: the client's requests it marks in Redis).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import metrics
from .cost import Prices, cost_micro_pln
from .decisions import UsageRecord
from .exchange import Gateway, account, count
from .sse import StreamMeter
from .stream_context import HEADER, StreamContext


# Envoy keeps the watch's call open this long after the stream ended (envoy/envoy.yaml
# deferred_close_timeout), so that the last chunks still arrive: the end of the call comes that much
# after the end of the stream.
CLOSE_DELAY_S = 1.0
# Envoy's total-budget timer and this process's clock need not agree to the millisecond.
TOTAL_SLACK_S = 0.25


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a stream ended, as the usage log shows it and what it costs (``tokens`` None: nothing)."""

    status: int
    code: str
    tokens: tuple[int, int] | None
    estimated: bool


def outcome(*, ended: bool, usage: tuple[int, int] | None, content_events: int, output_seen: bool,
            estimated_input: int, failure: str, client_left: bool) -> Outcome:
    """The policy of the module docstring, as a pure function.  ``failure``: "" or the SPEC code of a
    failure known here (the idle or the total budget ran out)."""
    if usage is not None:  # reported usage wins (without the stream's end: the client left at the very end)
        return Outcome(200, "", usage, False)
    if ended:
        return Outcome(200, "", (estimated_input, content_events), True)
    if not output_seen:  # (a client that leaves in that moment is not billed either)
        return Outcome(200, failure or "upstream_unavailable", None, False)
    if failure or not client_left:
        return Outcome(200, failure or "upstream_unavailable", (estimated_input, content_events), True)
    return Outcome(499, "", (estimated_input, 0), True)


class StreamWatch:
    __slots__ = ("gw", "ctx", "meter", "output_seen", "ended", "failure", "last_bytes", "done", "left")

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.ctx: StreamContext | None = None
        self.meter = StreamMeter()  # the stream's endpoint's, once it is known
        self.output_seen = False
        self.ended = False
        self.failure = ""
        self.last_bytes = gw.clock()
        self.done = False
        self.left = False  # Envoy's access log said the client left (``access_log``, in this process)

    @property
    def idle(self) -> float | None:
        """Seconds the next chunk may take (SPEC section 7's idle gap), once the stream is known."""
        return self.gw.idle_timeout_s if self.ctx is not None and not self.done else None

    def response_headers(self, headers: dict[str, str]) -> None:
        raw = headers.get(HEADER)
        if raw is not None:
            self.ctx = ctx = StreamContext.parse(raw)
            self.meter = self.gw.endpoints.by_name[ctx.endpoint].meter()
            self.last_bytes = self.gw.clock()
            if ctx.owner == self.gw.owner:  # handed over by this process: it needs no finish of its own
                self.gw.watched.add(ctx.request_id)

    def response_body(self, body: bytes, end_of_stream: bool) -> None:
        if self.ctx is None:
            return
        if body:
            self.output_seen = True
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
        if not (self.ended or self.failure or self.meter.usage is not None or left) and self.output_seen:
            left = await self.gw.client_left(ctx.request_id)
        o = outcome(ended=self.ended, usage=self.meter.usage, content_events=self.meter.content_events,
                    output_seen=self.output_seen, estimated_input=ctx.estimated_prompt_tokens, failure=self.failure,
                    client_left=left)
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

