"""Sans-I/O meter of a model server's server-sent event stream: what billing needs of it.

Envoy relays the stream to the client itself (envoy/sse_relay.lua: whole events, the alias put in, the
usage chunk where the interface wants it); the ext_proc sees a copy of the same chunks, as they pass, and only
counts: the usage the model server reported (the last report wins) and, while it reported none, the events
that carry a content piece (the output estimate of a stream without usage; billing reads no other).  Fed raw byte chunks cut anywhere; only an event
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
_C_CONTENT, _C_EMPTY = b'"content":"', b'"content":""'
_AT_USAGE = b'"usage":'  # where ``_USAGE`` may match


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
        # The usage first, from the block's end (the last report wins: in a burst it is a few hundred
        # bytes from the end); the events with content, the output estimate, matter only to a stream
        # without usage and are counted only while none was reported (each count scans the block).
        at = block.rfind(_AT_USAGE)
        while at >= 0:
            if _USAGE.match(block, at) is not None:
                start = block.rfind(_SEP, 0, at)
                end = block.find(_SEP, at)
                if self._read_usage(block[0 if start < 0 else start + 2:len(block) if end < 0 else end + 2]):
                    return
            at = block.rfind(_AT_USAGE, 0, at)
        if self.usage is not None:
            return
        if b'"content": ' in block or b'"usage": ' in block:  # spaced JSON (not vLLM's)
            self.content_events += len(_CONTENT.findall(block))
        else:
            self.content_events += block.count(_C_CONTENT) - block.count(_C_EMPTY)

    def _read_usage(self, event: bytes) -> bool:
        """Whether the event reported a usage billing can read (then it is ``usage``)."""
        # the data of the (LF-framed) event: its ``data:`` lines joined by LF (none: not JSON either)
        data = b"\n".join([line[6:] if line.startswith(b"data: ") else line[5:]
                           for line in event.split(b"\n") if line.startswith(b"data:")])
        try:
            doc = json.loads(data)
        except ValueError:
            return False
        tokens = usage_json_tokens(doc.get("usage")) if isinstance(doc, dict) else None
        if tokens is None:
            return False
        self.usage = tokens
        return True
