"""Every way a request ends, as one table: the facts the exchange or the stream watch saw, and what the
usage log shows and the request is billed (``billing_outcome.decide``).  The rows are docs/interface.md's
"Cost computation" and "Billing on failure" rules (docs/billing.md), the statuses a client can get
(docs/billing.md: the usage log's status and code are what the client received) and the edges the stack once
got wrong, each reproduced through the stack in tests/test_billing_edges_e2e.py."""
from __future__ import annotations

import pytest

from extproc.billing_outcome import Facts, Outcome, decide

EST = 16  # the estimated input
NOTHING = None

ROWS: list[tuple[str, Facts, Outcome]] = [
    # -- reported usage is what is billed
    ("a JSON reply with usage", Facts(EST, status=200, ended=True, usage=(10, 31)),
     Outcome(200, "", (10, 31), False)),
    ("a stream that reached [DONE] with usage", Facts(EST, streamed=True, status=200, ended=True, usage=(10, 31),
                                                     output=30, content_seen=True),
     Outcome(200, "", (10, 31), False)),
    ("a stream whose client left after the usage chunk", Facts(EST, streamed=True, status=200, usage=(10, 31),
                                                                output=30, content_seen=True, client_left=True),
     Outcome(200, "", (10, 31), False)),
    # -- not reported: estimated, and marked so
    ("a JSON reply without usage", Facts(EST, status=200, ended=True, output=7),
     Outcome(200, "", (EST, 7), True)),
    ("a stream that reached [DONE] without usage", Facts(EST, streamed=True, status=200, ended=True, output=5,
                                                        content_seen=True),
     Outcome(200, "", (EST, 5), True)),
    # -- no output before the failure: nothing billed
    ("a model server's error reply", Facts(EST, status=400, code="invalid_request"),
     Outcome(400, "invalid_request", NOTHING, False)),
    ("a model server's 5xx, mapped", Facts(EST, status=502, code="upstream_unavailable"),
     Outcome(502, "upstream_unavailable", NOTHING, False)),
    ("Envoy's own 503 (no healthy upstream)", Facts(EST, status=503, code="no_capacity"),
     Outcome(503, "no_capacity", NOTHING, False)),
    ("Envoy's own 502 for an upstream timeout", Facts(EST, status=502, code="upstream_timeout"),
     Outcome(502, "upstream_timeout", NOTHING, False)),
    ("an error reply the client left", Facts(EST, status=500, client_left=True),
     Outcome(500, "internal_error", NOTHING, False)),
    # (the role chunk carries no content: a stream that broke after it alone saw no output)
    ("a stream broken before any event, or after only the role chunk", Facts(EST, streamed=True, status=200),
     Outcome(200, "upstream_unavailable", NOTHING, False)),
    ("a stream idle past the budget after only the role chunk",
     Facts(EST, streamed=True, status=200, failure="upstream_timeout"),
     Outcome(200, "upstream_timeout", NOTHING, False)),
    ("a stream cut while its headers were held (the client got Envoy's 502)",
     Facts(EST, streamed=True, status=502, code="upstream_unavailable"),
     Outcome(502, "upstream_unavailable", NOTHING, False)),
    # -- a failure after output reached the client
    ("a JSON reply broken after it began (the client got Envoy's 502)", Facts(EST, status=200, content_seen=True),
     Outcome(502, "upstream_unavailable", (EST, 0), True)),
    ("a JSON reply idle past the budget after it began", Facts(EST, status=200, content_seen=True,
                                                              code="upstream_timeout", failure="upstream_timeout"),
     Outcome(502, "upstream_timeout", (EST, 0), True)),
    ("a stream broken after content", Facts(EST, streamed=True, status=200, output=3, content_seen=True),
     Outcome(200, "upstream_unavailable", (EST, 3), True)),
    ("a stream idle past the budget after content", Facts(EST, streamed=True, status=200, output=3,
                                                         content_seen=True, failure="upstream_timeout"),
     Outcome(200, "upstream_timeout", (EST, 3), True)),
    ("a stream the total budget ended, its client leaving then", Facts(
        EST, streamed=True, status=200, output=3, content_seen=True, client_left=True, failure="upstream_timeout"),
     Outcome(200, "upstream_timeout", (EST, 3), True)),
    # -- a client that left after its request reached a model server: the estimated input, 499
    ("a client that left before the reply", Facts(EST, client_left=True),
     Outcome(499, "", (EST, 0), True)),
    ("a client that left a JSON reply half-way", Facts(EST, status=200, content_seen=True, client_left=True),
     Outcome(499, "", (EST, 0), True)),
    ("a client that left a stream after its headers, before the first chunk",
     Facts(EST, streamed=True, status=200, client_left=True),
     Outcome(499, "", (EST, 0), True)),
    ("a client that left a stream after content", Facts(EST, streamed=True, status=200, output=9,
                                                       content_seen=True, client_left=True),
     Outcome(499, "", (EST, 0), True)),
    # -- the client got no byte: nothing
    ("Envoy went away before the reply (no client leaving)", Facts(EST),
     Outcome(500, "internal_error", NOTHING, False)),
    # -- never reached a model server: nothing, the status the client got
    ("a refusal", Facts(0, reached_model=False, status=429, code="concurrency_limit_exceeded"),
     Outcome(429, "concurrency_limit_exceeded", NOTHING, False)),
    ("a client that left before its request went on", Facts(EST, reached_model=False, client_left=True),
     Outcome(499, "", NOTHING, False)),
    ("Envoy's message timeout answered the client before the request went on", Facts(EST, reached_model=False),
     Outcome(500, "internal_error", NOTHING, False)),
    # -- the process that watched a stream died with it: the reaper's rule
    ("a stream whose watch died with its process", Facts(EST, streamed=True, status=200, observed=False),
     Outcome(200, "", (EST, 0), True)),
    ("the in-flight journal's entry (billed if the process dies)", Facts(EST, observed=False),
     Outcome(500, "", (EST, 0), True)),
]


@pytest.mark.parametrize(("facts", "expected"), [pytest.param(f, o, id=name) for name, f, o in ROWS])
def test_each_ending_is_billed_and_logged_as_the_rules_say(facts: Facts, expected: Outcome) -> None:
    assert decide(facts) == expected


def test_the_table_names_each_ending_once() -> None:
    names = [name for name, _, _ in ROWS]
    assert len(names) == len(set(names))
    assert len({f for _, f, _ in ROWS}) == len(ROWS)  # no two rows with the same facts
