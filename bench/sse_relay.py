"""Micro-benchmark of a streamed reply's per-chunk work outside Envoy (python -m bench.sse_relay
[relay.lua ...]): Envoy's relay (envoy/sse_relay.lua, or the given copies of it, for an A/B) in LuaJIT
through lupa, timed inside Lua, and the ext_proc's meter (core/sse.py).  The bench's 64-event
stream (vLLM's shape: compact JSON, LF, the usage chunk with empty choices), fed as one chunk (a burst)
and one event a chunk (a stream at a model server's pace), then the same framed with CRLF (the general
path); usage asked for and not.  The files are alternated over rounds; medians in µs per stream."""
from __future__ import annotations

import json
import statistics
import sys
import timeit
from pathlib import Path

from lupa import luajit21

from core.sse import StreamMeter

from .fixtures import STREAM_ALIAS, UP_STREAM, stream_reply

RELAY = Path(__file__).resolve().parent.parent / "envoy" / "sse_relay.lua"
ROUNDS, STREAMS = 7, 300
_TIMED = b"""function(chunks, upstream, alias, show, n)
  local new, clock = sse_relay.Relay.new, os.clock
  local t = clock()
  for _ = 1, n do
    local relay = new(upstream, alias, show, "12")
    for i = 1, #chunks do relay:feed(chunks[i]) end
  end
  return (clock() - t) / n * 1e6
end"""


def cases() -> dict[str, list[bytes]]:
    data = stream_reply()
    per_event = [e + b"\n\n" for e in data.split(b"\n\n") if e]
    crlf = [e.replace(b"\n", b"\r\n") for e in per_event]
    return {"burst (one chunk)": [data], "one event a chunk": per_event,
            "CRLF, one chunk": [b"".join(crlf)], "CRLF, one event a chunk": crlf}


def _meter(chunks: list[bytes]) -> None:
    m = StreamMeter()
    for c in chunks:
        m.feed(c)


def main(files: list[Path]) -> None:
    timed = []
    for f in files:
        lua = luajit21.LuaRuntime(encoding=None)
        lua.execute(f.read_bytes())
        timed.append((lua, lua.eval(_TIMED)))
    up, alias = json.dumps(UP_STREAM).encode(), json.dumps(STREAM_ALIAS).encode()
    runs: dict[tuple[str, str, bool], list[float]] = {}
    for r in range(ROUNDS):
        order = list(zip(files, timed)) if r % 2 == 0 else list(zip(files, timed))[::-1]
        for name, chunks in cases().items():
            for f, (lua, run) in order:
                for show in (False, True):
                    runs.setdefault((str(f), name, show), []).append(
                        run(lua.table_from(chunks), up, alias, show, STREAMS))
            runs.setdefault(("meter (core/sse.py)", name, False), []).append(
                min(timeit.repeat(lambda: _meter(chunks), number=STREAMS, repeat=1)) / STREAMS * 1e6)
    for name in cases():
        for (f, case, show), v in runs.items():
            if case == name:
                usage = "" if f.startswith("meter") else f"  usage asked: {'yes' if show else 'no ':3s}"
                print(f"{name:24s} {f:40s}{usage}  {statistics.median(v):7.1f} us/stream"
                      f"  (spread {min(v):.1f}-{max(v):.1f})")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or [RELAY])
