"""Sans-I/O relay of a model server's server-sent event stream (SPEC section 4, streaming rules).

Fed raw byte chunks as they arrive (cut anywhere), it returns the bytes to pass to the client:
only whole events, the upstream model name replaced by the alias, the final usage chunk taken out
unless the client asked for it.  It works on bytes; only the usage event is ever JSON-parsed.

Framing (the SSE format): lines end with LF, CRLF or CR; a blank line ends an event; lines starting
with a colon are comments; an event's data may span several ``data:`` lines (joined by LF).  A stream
with CRs is rewritten with LFs as it passes (a CR is held until the next byte says whether an LF
follows), so the rest only ever looks for ``\\n\\n``: the common case (vLLM's compact LF stream) costs
one byte search for a CR per chunk more than it would without.
"""
from __future__ import annotations

import json
import re

from .cost import usage_json_tokens

_SEP = b"\n\n"
_CR = 13  # an int: ``in`` is then one memchr (~50 ns for an event; b"\r" in ... takes ~300)
_USAGE = re.compile(rb'"usage":\s*\{')
_DONE = re.compile(rb"^data: ?\[DONE\]$", re.M)
_CONTENT = re.compile(rb'"content":\s*"(?!")')
# vLLM writes compact JSON: then plain byte searches do (several times cheaper than the regexes,
# which stay for servers that put spaces after the colons).  Each search is a pass over the block
# (~5 us for a 14 KB block), so only what billing needs is looked for.
_C_CONTENT, _C_EMPTY, _C_USAGE = b'"content":"', b'"content":""', b'"usage":{'


def _lf(chunk: bytes) -> bytes:
    return chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def event_data(event: bytes) -> bytes | None:
    """The data of one LF-framed event (its ``data:`` lines joined by LF), None when it has none."""
    parts = [line[6:] if line.startswith(b"data: ") else line[5:]
             for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(parts) if parts else None


class StreamRelay:
    __slots__ = ("_buf", "_model", "_compact_model", "_alias", "_show_usage", "usage", "content_events",
                 "_compact", "_cr", "_held")

    def __init__(self, upstream_model: str, alias: str, show_usage: bool) -> None:
        quoted = json.dumps(upstream_model).encode()
        self._model = re.compile(rb'"model":\s*' + re.escape(quoted))
        self._compact_model = b'"model":' + quoted
        self._compact: bool | None = None  # decided on the first events
        self._alias = b'"model":' + json.dumps(alias).encode()
        self._show_usage = show_usage
        self._buf = b""
        self._cr = False  # the last chunk ended with a CR (the next byte says if it was a CRLF)
        self._held: bytes | None = None  # a usage chunk of our own, to go out before [DONE]
        self.usage: tuple[int, int] | None = None  # (prompt, completion) as reported upstream
        self.content_events = 0  # events carrying a content piece: the output estimate

    def feed(self, chunk: bytes) -> bytes:
        if self._cr or _CR in chunk:
            if self._cr:
                chunk = b"\r" + chunk
            self._cr = chunk.endswith(b"\r")
            chunk = _lf(chunk[:-1] if self._cr else chunk)
        data = self._buf + chunk if self._buf else chunk
        cut = data.rfind(_SEP)
        if cut < 0:
            self._buf = data
            return b""
        self._buf = data[cut + 2:]
        return self._events(data[: cut + 2])

    def end(self) -> bytes:
        """The stream ended: whatever is left (an unterminated event) goes out as it is."""
        rest, self._buf = self._buf + (b"\n" if self._cr else b""), b""
        self._cr = False
        out = self._events(rest) if rest else b""
        held, self._held = self._held, None
        return out + self._rename(held) if held is not None else out

    def _rename(self, block: bytes) -> bytes:
        if self._compact:
            return block.replace(self._compact_model, self._alias)
        return self._model.sub(self._alias, block)

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
        if at >= 0 or self._held is not None:
            block = self._take_usage(block, at)
        if self._compact:  # (_rename, inlined: this runs for every chunk)
            return block.replace(self._compact_model, self._alias)
        return self._model.sub(self._alias, block)

    def _take_usage(self, block: bytes, at: int) -> bytes:
        """Each event of the block that carries a usage object, whatever else it holds (issue 22):
        read for billing, and the usage moved where SPEC streaming rule 3 wants it or taken out."""
        out: list[bytes] = []
        pos = 0
        while at >= 0:
            start = block.rfind(_SEP, pos, at)
            start = pos if start < 0 else start + 2
            end = block.find(_SEP, at)
            end = len(block) if end < 0 else end + 2
            out += (block[pos:start], self._usage_event(block[start:end]))
            pos = end
            if self._compact:
                at = block.find(_C_USAGE, pos)
            else:
                m = _USAGE.search(block, pos)
                at = -1 if m is None else m.start()
        if self._held is not None:
            done = _DONE.search(block, pos)
            if done is not None:  # the usage chunk goes out last before [DONE]
                out += (block[pos:done.start()], self._held)
                pos, self._held = done.start(), None
        out.append(block[pos:])
        return b"".join(out)

    def _usage_event(self, event: bytes) -> bytes:
        data = event_data(event)
        try:
            doc = json.loads(data) if data is not None else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return event
        tokens = usage_json_tokens(doc.get("usage"))
        if tokens is None:
            return event
        self.usage = tokens
        choices = doc.get("choices")
        if not choices:  # vLLM's and SGLang's own usage chunk, choices: []
            self._held = None  # the final report: any earlier one is stale
            return event if self._show_usage else b""
        # llama.cpp's and TGI's usage on the finish chunk, LiteLLM's on a chunk with an empty choice,
        # running usage on every chunk: the chunk goes on without it, the usage (when asked) on a chunk
        # of its own before [DONE], and a chunk left with nothing to say is dropped.
        usage = doc.pop("usage")
        if self._show_usage:
            self._held = b"data: " + _dumps({"id": doc.get("id"), "object": doc.get("object", "chat.completion.chunk"),
                                             "created": doc.get("created"), "model": doc.get("model"),
                                             "choices": [], "usage": usage}) + _SEP
        if isinstance(choices, list) and all(_says_nothing(c) for c in choices):
            return b""
        return b"data: " + _dumps(doc) + _SEP


def _says_nothing(choice: object) -> bool:
    return isinstance(choice, dict) and not any(v for k, v in choice.items() if k != "index")


def _dumps(doc: object) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
