"""HTTP handlers of the simulated vLLM OpenAI-compatible server.

JSON is written compactly (``separators=(",", ":")``, ``ensure_ascii=False``),
as vLLM (pydantic / starlette ``JSONResponse``) does, both for plain replies
and for every ``data:`` event of a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import Any

from aiohttp import web

from .guided import generate
from .knobs import is_int, is_number, Knobs, parse_knobs, SimError
from .tokens import (
    apply_stop,
    chat_prompt_tokens,
    content_text,
    count_tokens,
    EMBEDDING_DIM,
    embedding_vector,
    generate_tokens,
    pack_base64,
    unit,
)

MULTIMODAL_PART_TYPES = frozenset({"image_url", "input_audio", "audio_url", "video_url", "image", "image_embeds"})
TOOL_CALL_TOKENS = 5
CLIENT_MAX_SIZE = 1 << 30  # accept very large prompts (context-length tests)
MAX_RECORDS = 100_000


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _hex() -> str:
    return uuid.uuid4().hex


def error_type(status: int) -> str:
    """vLLM's ``error.type`` for an HTTP status."""
    # not from the phrase: vLLM names 422 without "Error", and Python 3.13 renamed 413's phrase
    if status == 413:
        return "RequestEntityTooLargeError"
    if status == 422:
        return "UnprocessableEntity"
    if status >= 500:
        return "InternalServerError"
    try:
        return HTTPStatus(status).phrase.replace(" ", "").replace("-", "") + "Error"
    except ValueError:
        return "BadRequestError"


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=_dumps(doc), content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    """A vLLM-format error reply: ``{"error": {"message", "type", "param": null, "code": status}}``."""
    return _json({"error": {"message": message, "type": error_type(status), "param": None, "code": status}}, status)


_TEXT_PIECES = re.compile(r"\s*(?:\w+|[^\w\s])")


def _arg_pieces(args: str, tokens: int) -> list[tuple[str, int]]:
    """Split tool-call arguments into stream deltas (one token each); the first carries the call overhead."""
    pieces = _TEXT_PIECES.findall(args)
    if "".join(pieces) != args:
        pieces = [args]
    return [(p, 1 if k else tokens - (len(pieces) - 1)) for k, p in enumerate(pieces)]


_JSON_OBJECT: dict[str, Any] = {"type": "object", "properties": {"answer": {"type": "string"}},
                                "required": ["answer"]}


def _schema_in_prompt(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A JSON schema quoted in the prompt (what a model in json_object mode would follow), if any."""
    decoder = json.JSONDecoder()
    for msg in messages:
        text = content_text(msg.get("content"))
        for brace in itertools.islice(re.finditer("{", text), 50):
            try:
                value, _ = decoder.raw_decode(text, brace.start())
            except ValueError:
                continue
            if isinstance(value, dict) and isinstance(value.get("properties"), dict):
                return value
    return None


def _number(body: dict[str, Any], name: str, integer: bool, rule: str, ok: Callable[[Any], bool]) -> Any:
    """``body[name]`` (``None`` when absent) if it is a number (an integer) that passes ``ok``, else SimError."""
    if (value := body.get(name)) is None:
        return None
    if not (is_int(value) if integer else is_number(value)):
        raise SimError(400, f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}.")
    if not ok(value):
        raise SimError(400, f"{rule}, got {value if integer else float(value)}.")
    return value


def _quote(body: dict[str, Any], endpoint: str) -> str:
    """The prompt the quote_prompt knob appends to errors: the first user message or input string."""
    if endpoint == "chat":
        messages = body.get("messages")
        for m in messages if isinstance(messages, list) else []:
            if isinstance(m, dict) and m.get("role") == "user":
                return content_text(m.get("content"))
        return ""
    inp = body.get("input")
    first = inp[0] if isinstance(inp, list) and inp else inp
    return first if isinstance(first, str) else ""


def _response_schema(rf: Any) -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` asks for (``None`` for text)."""
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise SimError(400, "response_format must be an object.")
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return _JSON_OBJECT
    if kind == "json_schema":
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if not isinstance(schema, dict):
            raise SimError(400, "response_format.json_schema.schema must be an object.")
        return schema
    raise SimError(400, f"Unknown response_format type: {kind!r}.")


def _pick_tool(messages: list[dict[str, Any]], tools: list[str], choice: Any) -> str | None:
    """Which tool to call this turn, or ``None`` for a text answer.

    A named tool_choice always calls that tool. ``auto`` (the default with tools) calls the first
    tool until a ``tool`` message answers it, then answers in text so agent loops end. ``required``
    calls the first tool not yet called since the last user message (the last tool once all were).
    """
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        return str(choice["function"]["name"])
    called: list[str] = []
    answered = False
    for msg in messages:
        if msg.get("role") == "user":
            called, answered = [], False
        elif msg.get("role") == "tool":
            answered = True
        for tc in msg.get("tool_calls") or []:
            if isinstance(tc, dict) and isinstance(tc.get("function"), dict):
                called.append(str(tc["function"].get("name")))
    if choice == "required":
        return next((t for t in tools if t not in called), tools[-1])
    return None if answered and messages[-1].get("role") == "tool" else tools[0]


@dataclass
class ChoicePlan:
    """What one choice will contain."""

    pieces: list[str] = field(default_factory=list)  # content chunks, one token each
    weights: list[int] = field(default_factory=list)  # tokens per piece
    finish_reason: str = "stop"
    tool_call: dict[str, Any] | None = None

    @property
    def tokens(self) -> int:
        if self.tool_call is not None:
            return TOOL_CALL_TOKENS - 2 + count_tokens(self.tool_call["function"]["arguments"])
        return sum(self.weights)


_EOL = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
_STRING_OR_COMMA = re.compile(rb'"(?:[^"\\]|\\.)*"|,')


def frame_event(data: bytes, knobs: Knobs) -> bytes:
    """One LF-framed ``data:`` event written as the framing knobs say (SSE allows all of them)."""
    if knobs.framing == "lf" and not knobs.comments and not knobs.multiline:
        return data
    eol = _EOL[knobs.framing]
    payload = data.rstrip(b"\n")[len(b"data: "):]
    lines = [b"data: " + payload]
    if knobs.multiline and payload != b"[DONE]":
        # cut after commas outside strings: the data lines joined by LF are the same JSON document
        cuts = [m.end() for m in _STRING_OR_COMMA.finditer(payload) if m.group() == b","]
        pieces = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)])]
        lines = [b"data:" + (b" " if k % 2 == 0 else b"") + p for k, p in enumerate(pieces)]
    if knobs.comments:
        return b": keep-alive" + eol + eol + eol.join([b": event", *lines]) + eol + eol
    return eol.join(lines) + eol + eol


@dataclass
class Record:
    """What the simulator saw of one request (counts only, never any text); served at ``/sim/requests``."""

    request_id: str
    deployment: str
    model: str
    endpoint: str  # "chat" | "embeddings"
    stream: bool = False
    status: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    events_sent: int = 0  # stream: events written whole (before a fail_after_chunks drop)
    usage_reported: bool = False
    completed: bool = False
    # how the request came (headers only, never a value that could be a key or text)
    content_type: str = ""
    content_length: str | None = None
    transfer_encoding: str | None = None
    body_bytes: int = 0


@dataclass
class StreamEvent:
    data: bytes
    tokens: int = 0
    usage: bool = False


class Simulator:
    """State and handlers of one simulated deployment."""

    def __init__(self, name: str, chat_models: dict[str, int], embed_models: dict[str, int]) -> None:
        self.name = name
        self.chat_models = dict(chat_models)
        self.embed_models = dict(embed_models)
        self.records: dict[str, Record] = {}  # the last MAX_RECORDS, oldest first
        self.created = int(time.time())

    # ------------------------------------------------------------------ helpers

    def _begin(self, request: web.Request, endpoint: str) -> Record:
        h = request.headers
        rid = h.get("X-Request-Id") or _hex()
        rec = Record(request_id=rid, deployment=self.name, model="", endpoint=endpoint,
                     content_type=h.get("Content-Type", ""), content_length=h.get("Content-Length"),
                     transfer_encoding=h.get("Transfer-Encoding"))
        self.records.pop(rid, None)
        self.records[rid] = rec
        if len(self.records) > MAX_RECORDS:
            del self.records[next(iter(self.records))]
        return rec

    def _resolve_model(self, body: dict[str, Any], endpoint: str) -> str:
        model = body.get("model")
        own = self.chat_models if endpoint == "chat" else self.embed_models
        if model is None:
            names = list(own) or list(self.chat_models) + list(self.embed_models)
            if not names:
                raise SimError(404, "The model `None` does not exist.")
            model = names[0]
        if not isinstance(model, str):
            raise SimError(400, "model must be a string.")
        if model not in self.chat_models and model not in self.embed_models:
            raise SimError(404, f"The model `{model}` does not exist.")
        if model not in own:
            api = "Chat Completions API" if endpoint == "chat" else "Embeddings API"
            raise SimError(400, f"The model `{model}` does not support {api}.")
        return model

    @staticmethod
    async def _read_json(request: web.Request, rec: Record) -> dict[str, Any]:
        raw = await request.read()
        rec.body_bytes = len(raw)
        # vLLM's validate_json_request: any other media type is refused before the body is read as JSON
        if rec.content_type.split(";", 1)[0].strip().lower() != "application/json":
            raise SimError(400, "Unsupported Media Type: Only 'application/json' is allowed")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SimError(400, f"JSON decode error: {exc}") from None
        if not isinstance(body, dict):
            raise SimError(400, "Request body must be a JSON object.")
        return body

    @staticmethod
    async def _drop(request: web.Request) -> None:
        """Abort the TCP connection once what was written has left the process."""
        if (transport := request.transport) is None:
            return
        for _ in range(400):
            if transport.is_closing() or transport.get_write_buffer_size() == 0:
                break
            await asyncio.sleep(0.005)
        transport.abort()

    async def _send_json(self, request: web.Request, rec: Record, doc: dict[str, Any], knobs: Knobs
                         ) -> web.StreamResponse:
        """Send a 200 JSON body honouring the reply_bytes/stall/fail knobs."""
        data = _dumps(doc).ljust(knobs.reply_bytes)
        resp = web.StreamResponse(status=200)
        resp.content_type = "application/json"
        resp.content_length = len(data)
        try:
            await resp.prepare(request)
            if knobs.fail_after_chunks is not None or knobs.stall_ms:
                view = memoryview(data)
                half = len(data) // 2
                await resp.write(view[:half])
                if knobs.fail_after_chunks is not None:
                    await self._drop(request)
                    return resp
                await asyncio.sleep(knobs.stall_ms / 1000)
                await resp.write(view[half:])
            else:
                await resp.write(data)
            await resp.write_eof()
            rec.completed = True
            rec.usage_reported = not knobs.no_usage
        except ConnectionError:
            pass
        return resp

    # ------------------------------------------------------------- plain routes

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        data = [{
            "id": name, "object": "model", "created": self.created, "owned_by": "vllm", "root": name,
            "parent": None, "max_model_len": ctx,
            "permission": [{
                "id": f"modelperm-{_hex()}", "object": "model_permission", "created": self.created,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        } for name, ctx in itertools.chain(self.chat_models.items(), self.embed_models.items())]
        return _json({"object": "list", "data": data})

    async def get_record(self, request: web.Request) -> web.Response:
        rec = self.records.get(request.match_info["request_id"])
        return _error(404, "Unknown request id.") if rec is None else _json(asdict(rec))

    async def list_records(self, request: web.Request) -> web.Response:
        return _json({"data": [asdict(r) for r in self.records.values()]})

    async def clear_records(self, request: web.Request) -> web.Response:
        self.records.clear()
        return _json({})

    async def serve(self, endpoint: str, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` (``endpoint`` "chat") or ``/v1/embeddings`` ("embeddings")."""
        rec = self._begin(request, endpoint)
        knobs = Knobs()
        quote: str | None = None
        reply: dict[str, Any] | list[StreamEvent] | SimError
        try:
            body = await self._read_json(request, rec)
            if isinstance(body.get("model"), str):
                rec.model = body["model"]
            rec.stream = endpoint == "chat" and body.get("stream") is True
            sim = body.get("sim")
            if isinstance(sim, dict) and sim.get("quote_prompt") is True:
                quote = _quote(body, endpoint)
            knobs = parse_knobs(sim)
            if knobs.status is not None:
                if endpoint == "chat":
                    with contextlib.suppress(Exception):  # best effort only
                        rec.prompt_tokens = chat_prompt_tokens(body["messages"])
                raise SimError(knobs.status, knobs.message)
            rec.model = self._resolve_model(body, endpoint)
            if endpoint == "chat":
                reply = self._chat(request, body, rec.model, knobs, rec)
            else:
                reply = self._embeddings(body, rec.model, rec)
        except SimError as err:
            reply = err
        if knobs.ttft_ms:
            await asyncio.sleep(knobs.ttft_ms / 1000)
        if isinstance(reply, SimError):
            message = reply.message if quote is None else f"{reply.message} Prompt: {quote}"
            rec.status = reply.status
            rec.completed = True
            return _error(reply.status, message)
        rec.status = 200
        if isinstance(reply, list):
            return await self._send_stream(request, rec, reply, knobs)
        if knobs.no_usage:
            del reply["usage"]
        elif knobs.usage_details:
            reply["usage"] = _with_details(reply["usage"], knobs.usage_details)
        return await self._send_json(request, rec, reply, knobs)

    # ------------------------------------------------------------------- chat

    def _validate_messages(self, model: str, messages: Any) -> list[dict[str, Any]]:
        if not isinstance(messages, list) or not messages:
            raise SimError(400, "Field 'messages' is required and must be a non-empty array.")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise SimError(400, "Each message must be an object with a string 'role'.")
            content = m.get("content")
            if content is None or isinstance(content, str):
                continue
            if not isinstance(content, list):
                raise SimError(400, "Message content must be a string, null or an array of parts.")
            for part in content:
                ptype = part.get("type") if isinstance(part, dict) else None
                if not isinstance(ptype, str):
                    raise SimError(400, "Each content part needs a string 'type'.")
                if ptype == "text":
                    if not isinstance(part.get("text"), str):
                        raise SimError(400, "Text content parts must have a string 'text'.")
                elif ptype in MULTIMODAL_PART_TYPES:
                    raise SimError(400, f"{model} is not a multimodal model")
                else:
                    raise SimError(400, f"Unknown part type: {ptype}")
        return messages

    def _chat(
        self, request: web.Request, body: dict[str, Any], model: str, knobs: Knobs, rec: Record
    ) -> dict[str, Any] | list[StreamEvent]:
        """Validate a chat request; return its reply (a stream's events)."""
        messages = self._validate_messages(model, body.get("messages"))

        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise SimError(400, "stream must be a boolean.")
        stream = bool(stream)

        mt_name = "max_tokens" if body.get("max_completion_tokens") is None else "max_completion_tokens"
        max_tokens = _number(body, mt_name, True, "max_tokens must be at least 1", lambda v: v >= 1)
        n = _number(body, "n", True, "n must be at least 1", lambda v: v >= 1) or 1
        _number(body, "temperature", False, "temperature must be non-negative", lambda v: not v < 0)
        _number(body, "top_p", False, "top_p must be in (0, 1]", lambda v: 0 < v <= 1)

        stop = body.get("stop")
        stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise SimError(400, "stop must be a string or an array of strings.")

        include_usage = False
        stream_options = body.get("stream_options")
        if stream_options is not None:
            if not isinstance(stream_options, dict):
                raise SimError(400, "stream_options must be an object.")
            if not stream:
                raise SimError(400, "Stream options can only be defined when `stream=True`.")
            iu = stream_options.get("include_usage")
            if iu is not None and not isinstance(iu, bool):
                raise SimError(400, "stream_options.include_usage must be a boolean.")
            include_usage = bool(iu)

        tools = body.get("tools")
        tool_names: list[str] = []
        if tools is not None:
            if not isinstance(tools, list):
                raise SimError(400, "tools must be an array.")
            for t in tools:
                fn = t.get("function") if isinstance(t, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise SimError(400, "Each tool must be {'type': 'function', 'function': {'name': ...}}.")
                tool_names.append(fn["name"])
        tool_choice = body.get("tool_choice")
        if isinstance(tool_choice, dict):
            fn = tool_choice.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str):
                raise SimError(400, "Invalid tool_choice.")
            if name not in tool_names:
                raise SimError(400, f"Tool '{name}' has not been passed in `tools`.")
        elif tool_choice is not None and tool_choice not in ("none", "auto", "required"):
            raise SimError(400, f"Invalid tool_choice: {tool_choice!r}.")
        elif tool_choice == "required" and not tool_names:
            raise SimError(400, "When using `tool_choice`, `tools` must be set.")

        prompt_tokens = chat_prompt_tokens(messages)
        rec.prompt_tokens = prompt_tokens
        ctx = self.chat_models[model]
        if prompt_tokens > ctx:
            raise SimError(400, f"This model's maximum context length is {ctx} tokens. However, your request has "
                                f"{prompt_tokens} input tokens. Please reduce the length of the input messages.")
        if max_tokens is not None and prompt_tokens + max_tokens > ctx:
            raise SimError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} "
                                "in the completion). Please reduce the length of the messages or completion.")

        guided = _response_schema(body.get("response_format"))
        if guided is _JSON_OBJECT:
            guided = _schema_in_prompt(messages) or guided
        seed = json.dumps([model, messages, guided, tools], sort_keys=True, default=str)
        call_name = _pick_tool(messages, tool_names, tool_choice)
        choices: list[ChoicePlan] = []
        if call_name is not None:
            params = next(t["function"].get("parameters") or {"type": "object"}
                          for t in tools or [] if t["function"]["name"] == call_name)
            for i in range(n):
                args = json.dumps(generate(params, f"{seed}/{call_name}/{i}"), ensure_ascii=False)
                call = {"id": f"call_{_hex()[:24]}", "type": "function",
                        "function": {"name": call_name, "arguments": args}}
                choices.append(ChoicePlan(finish_reason="tool_calls", tool_call=call))
        elif guided is not None or (tool_names and messages[-1].get("role") == "tool"):
            for i in range(n):
                if guided is not None:
                    text = json.dumps(generate(guided, f"{seed}/{i}"), ensure_ascii=False)
                else:
                    text = "Done: " + content_text(messages[-1].get("content"))[:200]
                pieces = _TEXT_PIECES.findall(text)
                finish = "stop"
                if max_tokens is not None and len(pieces) > max_tokens:
                    pieces, finish = pieces[:max_tokens], "length"
                choices.append(ChoicePlan(pieces=pieces, weights=[1] * len(pieces), finish_reason=finish))
        elif knobs.echo:
            headers = {k.lower(): ", ".join(request.headers.getall(k)) for k in request.headers}
            content = json.dumps({"body": body, "headers": headers}, ensure_ascii=False)
            choices = [ChoicePlan(pieces=[content], weights=[count_tokens(content)]) for _ in range(n)]
        else:
            count = knobs.output_tokens
            finish = "stop"
            if max_tokens is not None and max_tokens < count:
                count, finish = max_tokens, "length"
            for i in range(n):
                pieces, hit = apply_stop(generate_tokens(model, i, count), stops)
                choices.append(ChoicePlan(pieces=pieces, weights=[1] * len(pieces),
                                          finish_reason="stop" if hit else finish))

        completion = sum(c.tokens for c in choices)
        usage = {"prompt_tokens": rec.prompt_tokens, "total_tokens": rec.prompt_tokens + completion,
                 "completion_tokens": completion}
        cid = f"chatcmpl-{_hex()}"
        created = int(time.time())
        if not stream:
            out = []
            for i, c in enumerate(choices):
                if c.tool_call is not None:
                    msg: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [c.tool_call]}
                else:
                    msg = {"role": "assistant", "content": "".join(c.pieces), "tool_calls": []}
                out.append({"index": i, "message": msg, "logprobs": None,
                            "finish_reason": c.finish_reason, "stop_reason": None})
            rec.completion_tokens = completion
            return {"id": cid, "object": "chat.completion", "created": created, "model": model,
                    "choices": out, "usage": usage, "prompt_logprobs": None}
        return self._stream_events(cid, created, model, choices,
                                   usage if include_usage and not knobs.no_usage else None, knobs.usage_shape)

    @staticmethod
    def _stream_events(
        cid: str, created: int, model: str, choices: list[ChoicePlan], usage: dict[str, int] | None,
        shape: str = "vllm",
    ) -> list[StreamEvent]:
        def chunk(chs: list[dict[str, Any]], u: dict[str, int] | None = None) -> bytes:
            doc: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created,
                                   "model": model, "choices": chs}
            if u is not None:
                doc["usage"] = u
            elif shape == "sglang":
                doc["usage"] = None
            return b"data: " + _dumps(doc) + b"\n\n"

        def ch(i: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}

        events = [StreamEvent(chunk([ch(i, {"role": "assistant", "content": ""})])) for i in range(len(choices))]
        per_choice: list[list[StreamEvent]] = []
        for i, c in enumerate(choices):
            evs: list[StreamEvent] = []
            if c.tool_call is not None:
                tc = c.tool_call
                evs.append(StreamEvent(chunk([ch(i, {"tool_calls": [{
                    "index": 0, "id": tc["id"], "type": "function",
                    "function": {"name": tc["function"]["name"], "arguments": ""}}]})])))
                evs.extend(StreamEvent(chunk([ch(i, {"tool_calls": [{
                    "index": 0, "function": {"arguments": piece}}]})]), tokens=w)
                    for piece, w in _arg_pieces(tc["function"]["arguments"], c.tokens))
            else:
                evs.extend(StreamEvent(chunk([ch(i, {"content": p})]), tokens=w) for p, w in zip(c.pieces, c.weights))
            evs.append(StreamEvent(chunk([ch(i, {}, c.finish_reason)])))
            per_choice.append(evs)
        for step in itertools.zip_longest(*per_choice):
            events.extend(ev for ev in step if ev is not None)
        if usage is not None and shape in ("llamacpp", "tgi"):
            # on the last chunk that carries a finish_reason (llama.cpp adds its timings there)
            last = max(k for k, ev in enumerate(events) if b'"finish_reason":"' in ev.data)
            doc = json.loads(events[last].data[len(b"data: "):])
            if shape == "llamacpp":
                doc = {"choices": [{"finish_reason": c["finish_reason"], "index": c["index"], "delta": {}}
                                   for c in doc["choices"]],
                       "created": created, "id": cid, "model": model, "system_fingerprint": "b6097-sim",
                       "object": "chat.completion.chunk", "usage": usage,
                       "timings": {"prompt_n": usage["prompt_tokens"], "predicted_n": usage["completion_tokens"]}}
            else:
                doc["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                doc["system_fingerprint"] = "3.3.4-sim"
                doc["usage"] = usage
            events[last] = StreamEvent(b"data: " + _dumps(doc) + b"\n\n", tokens=events[last].tokens, usage=True)
        elif usage is not None and shape == "litellm":
            events.append(StreamEvent(chunk([{"index": 0, "delta": {}}], usage), usage=True))
        elif usage is not None:
            events.append(StreamEvent(chunk([], usage), usage=True))
        events.append(StreamEvent(b"data: [DONE]\n\n"))
        return events

    async def _send_stream(
        self, request: web.Request, rec: Record, events: list[StreamEvent], knobs: Knobs
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
        half = len(events) // 2
        try:
            await resp.prepare(request)
            for k, ev in enumerate(events):
                if knobs.fail_after_chunks is not None and k >= knobs.fail_after_chunks:
                    await self._drop(request)
                    return resp
                if k > 0 and knobs.itl_ms:
                    await asyncio.sleep(knobs.itl_ms / 1000)
                if k == 0 and knobs.first_event_ms:
                    await asyncio.sleep(knobs.first_event_ms / 1000)
                if k == half and knobs.stall_ms:
                    await asyncio.sleep(knobs.stall_ms / 1000)
                data = frame_event(ev.data, knobs)
                step = knobs.write_bytes or len(data)
                for at in range(0, len(data), step):
                    if at:  # a piece apart from the last one, as a slow network delivers it
                        await asyncio.sleep(0.001)
                    await resp.write(data[at:at + step])
                rec.completion_tokens += ev.tokens
                rec.events_sent += 1
                rec.usage_reported |= ev.usage
            await resp.write_eof()
            rec.completed = True
        except ConnectionError:
            pass
        return resp

    # -------------------------------------------------------------- embeddings

    @staticmethod
    def _embed_items(inp: Any) -> list[str | list[int]]:
        if isinstance(inp, str):
            return [inp]
        if isinstance(inp, list):
            if not inp:
                raise SimError(400, "Input cannot be empty.")
            if all(isinstance(x, str) for x in inp):
                return list(inp)
            if all(is_int(x) for x in inp):
                return [list(inp)]
            if all(isinstance(x, list) and x and all(is_int(y) for y in x) for x in inp):
                return [list(x) for x in inp]
        raise SimError(400, "input must be a string, an array of strings, an array of integers "
                            "or an array of non-empty arrays of integers.")

    def _embeddings(self, body: dict[str, Any], model: str, rec: Record) -> dict[str, Any]:
        """Validate an embeddings request; return its reply."""
        items = self._embed_items(body.get("input"))
        fmt = body.get("encoding_format")  # None: float
        if fmt not in (None, "float", "base64"):
            raise SimError(400, f"encoding_format must be 'float' or 'base64', got {fmt!r}.")
        dims = body.get("dimensions")
        if dims is not None and (not is_int(dims) or not 1 <= dims <= EMBEDDING_DIM):
            raise SimError(400, f"dimensions must be an integer between 1 and {EMBEDDING_DIM}, got {dims!r}.")
        ctx = self.embed_models[model]
        counts = [count_tokens(x) if isinstance(x, str) else len(x) for x in items]
        rec.prompt_tokens = sum(counts)
        for c in counts:
            if c > ctx:
                raise SimError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                                    f"{c} tokens in the input for embedding generation. Please reduce the length "
                                    "of the input.")
        data = []
        for i, item in enumerate(items):
            vec = embedding_vector(item)
            if dims is not None and dims < len(vec):  # Matryoshka-style: truncate, renormalise
                vec = unit(vec[:dims])
            data.append({"index": i, "object": "embedding",
                         "embedding": pack_base64(vec) if fmt == "base64" else vec})
        return {
            "id": f"embd-{_hex()}", "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": {"prompt_tokens": rec.prompt_tokens, "total_tokens": rec.prompt_tokens, "completion_tokens": 0},
        }


def _require_key(api_key: str) -> Any:
    """vLLM's ``--api-key``: every ``/v1`` request needs ``Authorization: Bearer <key>``, else 401."""
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1") and not hmac.compare_digest(
                request.headers.get("Authorization", "").encode(), expected):
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response
    return check


def make_app(name: str, chat_models: dict[str, int], embed_models: dict[str, int],
             api_key: str | None = None) -> web.Application:
    """Build the aiohttp application of one simulated deployment."""
    sim = Simulator(name, chat_models, embed_models)
    app = web.Application(client_max_size=CLIENT_MAX_SIZE,
                          middlewares=[_require_key(api_key)] if api_key else [])
    app.router.add_get("/health", sim.health)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_post("/v1/chat/completions", functools.partial(sim.serve, "chat"))
    app.router.add_post("/v1/embeddings", functools.partial(sim.serve, "embeddings"))
    app.router.add_get("/sim/requests", sim.list_records)
    app.router.add_delete("/sim/requests", sim.clear_records)
    app.router.add_get("/sim/requests/{request_id}", sim.get_record)
    return app


def _with_details(usage: dict[str, Any], where: str) -> dict[str, Any]:
    """The usage object with ``prompt_tokens_details`` first or between the prompt and the completion
    counts (JSON keeps the order)."""
    details = {"cached_tokens": 0}
    if where == "first":
        return {"prompt_tokens_details": details, **usage}
    return {"prompt_tokens": usage["prompt_tokens"], "prompt_tokens_details": details,
            **{k: v for k, v in usage.items() if k != "prompt_tokens"}}
