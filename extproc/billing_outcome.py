"""What a request is billed and how the usage log shows it, however it ended: one pure function.

The exchange (a JSON reply, a refusal, a stream's hand-over) and the stream watch (a streamed reply)
gather the ``Facts`` of an ending and act on the ``Outcome``; neither decides anything of billing itself.
The rules are docs/interface.md section 4, "Cost computation" and "Billing on failure" (docs/billing.md),
and the usage log's status and code are what the client received:

- usage the model server reported is billed as it is (200);
- a reply that reached its end without usage: the estimated input and the output seen (estimated, 200);
- a reply no living process watched (its process died with it): the estimated input, as the reaper
  bills a request whose ext_proc died;
- a request that never reached a model server, or that got an error reply: nothing, logged with the
  status and code the client got (499 for a client that left before its request went on);
- a client that left after its request reached a model server: the estimated input (estimated, 499);
- a failure before any output reached the client: nothing (a stream: 200 and the failure's code, the
  status already sent; a JSON reply: Envoy's 502); no reply at all and no client leaving (Envoy itself
  went away: the client got no byte): nothing, 500 ``internal_error``;
- a failure after output reached the client: the estimated input, and for a stream the content events
  that reached it (estimated; 200 for a stream, 502 for a JSON reply).
"""
from __future__ import annotations

from dataclasses import dataclass

# the code (docs/interface.md, section 7) of a failure decided here when nothing more specific is known
UPSTREAM_UNAVAILABLE = "upstream_unavailable"
INTERNAL_ERROR = "internal_error"
CLIENT_LEFT = 499  # as nginx logs a client that closed its connection

# How Envoy's access log says a request ended for its client (``access_log``), where that decides its record:
LEFT = "left"  # the client went away (response flag DC or DR)
ANSWERED = "answered"  # Envoy's ext_proc filter answered it itself (its message timeout): the interface's 500


@dataclass(frozen=True, slots=True)
class Facts:
    """How a request ended, as the exchange or the stream watch saw it."""

    estimated_input: int  # the input estimate of the request (``cost.estimate_*``)
    streamed: bool = False  # a streamed reply handed over to Envoy's relay: its 200 went to the client
    # the request went on to a model server (False: refused, or Envoy ended the call before letting it through)
    reached_model: bool = True
    # the process that watched the reply died with it: billed as the reaper bills a request whose ext_proc
    # died (the estimated input), with the status known then
    observed: bool = True
    # the reply's status as it came to the gateway (the model server's, or Envoy's own reply's); 0: none
    status: int = 0
    code: str = ""  # the error code (docs/interface.md, section 7) of the reply the client got, when known
    ended: bool = False  # the reply reached its end (a stream: its last chunk)
    usage: tuple[int, int] | None = None  # (prompt, completion) the model server reported
    output: int = 0  # output tokens seen: a stream's content events, a complete JSON reply's estimate
    # output reached the client: a stream, an event with content (not the role chunk); a JSON reply, the
    # model server started sending it
    content_seen: bool = False
    client_left: bool = False  # Envoy's access log says the client went away (response flag DC or DR)
    failure: str = ""  # the code of a failure known here (an idle gap or the total budget: upstream_timeout)

    @classmethod
    def envoys_500(cls, estimated_input: int) -> "Facts":
        """Envoy's message timeout answered the client with the interface's 500 in the reply's place
        (``ANSWERED``): logged as that 500, billed nothing, whatever the model server had sent."""
        return cls(estimated_input, status=500, code=INTERNAL_ERROR)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The decision: the usage log's status and code, and the tokens billed (None: nothing)."""

    status: int
    code: str
    tokens: tuple[int, int] | None
    estimated: bool

    @property
    def billed(self) -> bool:
        return self.tokens is not None


def decide(f: Facts) -> Outcome:
    """The rules of the module docstring, in their order of precedence."""
    if not f.reached_model:
        if f.client_left:
            return Outcome(CLIENT_LEFT, "", None, False)
        return Outcome(f.status or 500, f.code or INTERNAL_ERROR, None, False)
    if not f.observed:
        return Outcome(f.status or 500, f.code, (f.estimated_input, 0), True)
    if f.usage is not None:  # (a stream whose client left after the usage chunk got all it pays for)
        return Outcome(200, "", f.usage, False)
    if f.ended:
        return Outcome(200, "", (f.estimated_input, f.output), True)
    if f.status >= 400 or 0 < f.status < 200:  # an error reply: the model server produced no output
        return Outcome(f.status, f.code or (INTERNAL_ERROR if f.status == 500 else UPSTREAM_UNAVAILABLE),
                       None, False)
    if f.client_left and not f.failure:
        return Outcome(CLIENT_LEFT, "", (f.estimated_input, 0), True)
    if f.status == 0:  # no reply and no client leaving: the connection went with Envoy, the client got no byte
        return Outcome(500, INTERNAL_ERROR, None, False)
    status, code = (200 if f.streamed else 502), f.failure or UPSTREAM_UNAVAILABLE
    if not f.content_seen:
        return Outcome(status, code, None, False)
    return Outcome(status, code, (f.estimated_input, f.output if f.streamed else 0), True)
