"""Sans-I/O relay of a model server's server-sent event stream (SPEC section 4, streaming rules).

Fed raw byte chunks as they arrive (cut anywhere), it returns the bytes to pass to the client:
only whole events, the upstream model name replaced by the alias, the final usage chunk taken out
unless the client asked for it.  It works on bytes; only the usage event is ever JSON-parsed.
"""
from __future__ import annotations

import json
import re

from .cost import usage_json_tokens

_SEP = b"\n\n"
_USAGE = re.compile(rb'"usage":\s*\{')
_CONTENT = re.compile(rb'"content":\s*"(?!")')
# vLLM writes compact JSON: then plain byte searches do (several times cheaper than the regexes,
# which stay for servers that put spaces after the colons).  Each search is a pass over the block
# (~5 us for a 14 KB block), so only what billing needs is looked for.
_C_CONTENT, _C_EMPTY, _C_USAGE = b'"content":"', b'"content":""', b'"usage":{' 


class StreamRelay:
    __slots__ = ("_buf", "_model", "_compact_model", "_alias", "_show_usage", "usage", "content_events",
                 "_compact")

    def __init__(self, upstream_model: str, alias: str, show_usage: bool) -> None:
        quoted = json.dumps(upstream_model).encode()
        self._model = re.compile(rb'"model":\s*' + re.escape(quoted))
        self._compact_model = b'"model":' + quoted
        self._compact: bool | None = None  # decided on the first events
        self._alias = b'"model":' + json.dumps(alias).encode()
        self._show_usage = show_usage
        self._buf = b""
        self.usage: tuple[int, int] | None = None  # (prompt, completion) as reported upstream
        self.content_events = 0  # events carrying a content piece: the output estimate

    def feed(self, chunk: bytes) -> bytes:
        data = self._buf + chunk if self._buf else chunk
        cut = data.rfind(_SEP)
        if cut < 0:
            self._buf = data
            return b""
        self._buf = data[cut + 2:]
        return self._events(data[: cut + 2])

    def end(self) -> bytes:
        """The stream ended: whatever is left (an unterminated event) goes out as it is."""
        rest, self._buf = self._buf, b""
        return self._events(rest) if rest else b""

    def _events(self, block: bytes) -> bytes:
        if self._compact is None and b'"model"' in block:
            self._compact = self._compact_model in block
        if self._compact:
            self.content_events += block.count(_C_CONTENT) - block.count(_C_EMPTY)
            at = block.find(_C_USAGE)
        else:
            self.content_events += len(_CONTENT.findall(block))
            m = _USAGE.search(block)
            at = -1 if m is None else m.start()
        if at >= 0:
            block = self._take_usage(block, at)
        if self._compact:
            return block.replace(self._compact_model, self._alias)
        return self._model.sub(self._alias, block)

    def _take_usage(self, block: bytes, at: int) -> bytes:
        start = block.rfind(_SEP, 0, at)
        start = 0 if start < 0 else start + 2
        end = block.find(_SEP, at)
        end = len(block) if end < 0 else end + 2
        event = block[start:end]
        payload = event.strip()
        if payload.startswith(b"data:"):
            try:
                doc = json.loads(payload[5:])
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                tokens = usage_json_tokens(doc.get("usage"))
                if tokens is not None:
                    self.usage = tokens
                    if not doc.get("choices") and not self._show_usage:
                        return block[:start] + block[end:]
        return block
