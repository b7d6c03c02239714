"""Sans-I/O meter of a model server's server-sent event stream: what billing needs of it.

Envoy relays the stream to the client itself (envoy/sse_relay.lua: whole events, the alias put in, the
usage chunk where the interface wants it); the ext_proc sees a copy of the same chunks, as they pass, and only
counts: the events that carry a content piece (the output estimate of a stream without usage) and the
usage the model server reported (the last report wins).  Fed raw byte chunks cut anywhere; only an event
that carries a usage object is ever JSON-parsed.

Framing (the SSE format): lines end with LF, CRLF or CR; a blank line ends an event; lines starting
with a colon are comments; an event's data may span several ``data:`` lines (joined by LF).  Only
whole events count: one the stream never ends with a blank line reached no SSE client either.  The
counting rule's cases are one table (tests/sse_cases.py), run against this meter and against Envoy's relay.
"""
from __future__ import annotations

import json
import re

from .cost import usage_json_tokens

_SEP = b"\n\n"
_CR = 13  # an int: ``in`` is then one memchr
_USAGE = re.compile(rb'"usage":\s*\{')
_CONTENT = re.compile(rb'"content":\s*"(?!")')
# vLLM writes compact JSON: then plain byte searches do (several times cheaper than the regexes, which
# stay for servers that put spaces after the colons).
_C_CONTENT, _C_EMPTY, _C_USAGE = b'"content":"', b'"content":""', b'"usage":{'


class StreamMeter:
    __slots__ = ("_buf", "_cr", "usage", "content_events")

    def __init__(self) -> None:
        self._buf = b""
        self._cr = False  # the last chunk ended with a CR (an LF first in the next one is its CRLF's)
        self.usage: tuple[int, int] | None = None  # (prompt, completion) as reported upstream
        self.content_events = 0  # whole events carrying a content piece: the output estimate

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self._cr or _CR in chunk:
            if self._cr and chunk[0] == 10:
                chunk = chunk[1:]
            self._cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        data = self._buf + chunk if self._buf else chunk
        cut = data.rfind(_SEP)
        if cut < 0:
            self._buf = data
            return
        self._buf = data[cut + 2:]
        self._count(data[: cut + 2])

    def _count(self, block: bytes) -> None:
        if b'"content": ' in block or b'"usage": ' in block:  # spaced JSON (not vLLM's)
            self.content_events += len(_CONTENT.findall(block))
            m = _USAGE.search(block)
            at = -1 if m is None else m.start()
        else:
            self.content_events += block.count(_C_CONTENT) - block.count(_C_EMPTY)
            at = block.find(_C_USAGE)
        while at >= 0:
            start = block.rfind(_SEP, 0, at)
            start = 0 if start < 0 else start + 2
            end = block.find(_SEP, at)
            end = len(block) if end < 0 else end + 2
            self._read_usage(block[start:end])
            m = _USAGE.search(block, end)
            at = -1 if m is None else m.start()

    def _read_usage(self, event: bytes) -> None:
        # the data of the (LF-framed) event: its ``data:`` lines joined by LF (none: not JSON either)
        data = b"\n".join([line[6:] if line.startswith(b"data: ") else line[5:]
                           for line in event.split(b"\n") if line.startswith(b"data:")])
        try:
            doc = json.loads(data)
        except ValueError:
            return
        if isinstance(doc, dict):
            tokens = usage_json_tokens(doc.get("usage"))
            if tokens is not None:
                self.usage = tokens
