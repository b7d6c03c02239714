"""Micro-benchmark of the stream relay's hot path (python -m bench.sse_relay): a vLLM stream (compact
JSON, LF framing, usage chunk with empty choices) fed one event per call, as Envoy hands them over
under light load, and whole (one 14 KB block); then the same stream framed with CRLF.  Prints
microseconds per feed() call and per stream."""
from __future__ import annotations

import timeit

from extproc.sse import StreamRelay

from .fixtures import STREAM_ALIAS, UP_STREAM, stream_reply


def _run(events: list[bytes], show_usage: bool) -> None:
    relay = StreamRelay(UP_STREAM, STREAM_ALIAS, show_usage)
    for e in events:
        relay.feed(e)
    relay.end()


def main() -> None:
    data = stream_reply()
    per_event = [e + b"\n\n" for e in data.split(b"\n\n") if e]
    crlf = [e.replace(b"\n", b"\r\n") for e in per_event]
    cases = {"LF, one event per feed": per_event, "LF, whole stream in one feed": [data],
             "CRLF, one event per feed": crlf, "CRLF, whole stream in one feed": [b"".join(crlf)]}
    for show in (False, True):
        for name, events in cases.items():
            n = 2000
            best = min(timeit.repeat(lambda: _run(events, show), number=n, repeat=5)) / n
            print(f"{name:32s} show_usage={show!s:5s}  {best * 1e6:8.1f} us/stream  "
                  f"{best * 1e6 / len(events):6.2f} us/feed  ({len(events)} feeds)")


if __name__ == "__main__":
    main()
