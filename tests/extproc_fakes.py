"""Unit-test doubles for the ext_proc's own interfaces (never for Redis, PostgreSQL or Envoy, which the
end-to-end tests run for real): an in-memory store with the way-in checks of docs/interface.md section 5, a
directory of keys and organisations, a scripted gRPC call, and hand-made ext_proc messages."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

from conftest import make_catalog
from core import catalog as catalog_mod
from core.decisions import Admission, Identity, UsageRecord
from core.errors import ApiError
from core.keys import key_hash
from core.errors import CONCURRENCY, INVALID_KEY, QUOTA, SUSPENDED
from extproc.billing_outcome import ANSWERED, LEFT
from extproc.exchange import ATTR_AUTH, ATTR_ID, ATTR_METHOD, ATTR_PATH, Gateway
from extproc.grpc_server import EOF
from extproc.hold import WorstCase
from extproc.store import Miss

KEY = "sk-service-" + "a" * 40
OTHER_KEY = "sk-service-" + "b" * 40  # well formed, unknown
CHAT_BODY = json.dumps({"model": "polish-pro", "messages": [{"role": "user", "content": "Dzień dobry"}]}).encode()


@dataclass
class Org:
    status: str = "active"
    balance: int = 10_000_000
    rpm: int = 1000
    conc: int = 100


@dataclass
class FakeStore:
    """The ``Store`` interface in memory: ``admit`` checks, in docs/interface.md section 5's order, the key, the
    organisation's status, then (with ``limits``) the balance, the per-key rate and the concurrency,
    and takes a slot; ``finish`` releases it and, with a record, debits and queues the record once.
    Cache entries start empty, so the first ``admit`` misses as Redis would after a restart."""

    keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # key hash -> (key id, org id), cached
    orgs: dict[str, Org] = field(default_factory=dict)  # cached organisations
    revoked: set[str] = field(default_factory=set)
    used: dict[str, int] = field(default_factory=dict)  # key id -> requests this minute
    slots: dict[str, set[str]] = field(default_factory=dict)  # org -> request ids in flight (concurrency slots)
    journal: set[str] = field(default_factory=set)  # admitted and not finished yet (the real gw:if)
    released: list[str] = field(default_factory=list)  # slots given back ahead of their finish
    records: list[UsageRecord] = field(default_factory=list)  # the usage stream
    left: set[str] = field(default_factory=set)  # requests whose client went away (Envoy's access log)
    answered: set[str] = field(default_factory=set)  # requests Envoy's ext_proc filter answered itself (its 500)
    admits: list[tuple[str, bool]] = field(default_factory=list)  # (request id, limits) asked
    finishes: list[tuple[str, str, UsageRecord | None]] = field(default_factory=list)

    deadlines: list[float | None] = field(default_factory=list)  # each admission's deadline (unix s)
    cancelled: list[str] = field(default_factory=list)
    holds: list[WorstCase | None] = field(default_factory=list)  # each admission's worst case (the real script holds it)

    async def admit(self, key_hash: str, request_id: str, *, limits: bool, pending: str = "",
                    deadline: float | None = None, hold: WorstCase | None = None, alias: str = "",
                    now: float | None = None) -> Admission:
        self.deadlines.append(deadline)
        self.holds.append(hold)
        if key_hash in self.revoked:
            self.admits.append((request_id, limits))
            return Admission(None, INVALID_KEY)
        if key_hash not in self.keys:
            raise Miss("key")
        key_id, org_id = self.keys[key_hash]
        ident = Identity(key_id, org_id)
        org = self.orgs.get(org_id)
        if org is None:
            raise Miss("org", org_id)
        self.admits.append((request_id, limits))  # answered (a miss is asked again once filled)
        if org.status != "active":
            return Admission(ident, SUSPENDED)
        if not limits:
            return Admission(ident, None)
        if org.balance <= 0:
            return Admission(ident, QUOTA)
        if self.used.get(key_id, 0) >= org.rpm:
            return Admission(ident, ApiError("rate_limit_exceeded", "Too many requests for this API key.",
                                             None, 17))
        held = self.slots.setdefault(org_id, set())
        if len(held) >= org.conc:
            return Admission(ident, CONCURRENCY)
        self.used[key_id] = self.used.get(key_id, 0) + 1
        held.add(request_id)
        self.journal.add(request_id)
        return Admission(ident, None)

    async def mark_ended(self, request_id: str, how: str) -> None:
        (self.left if how == LEFT else self.answered).add(request_id)

    async def how_ended(self, request_id: str) -> str:
        return LEFT if request_id in self.left else ANSWERED if request_id in self.answered else ""

    async def finish(self, org_id: str, request_id: str, record: UsageRecord | None, *,
                     refused: bool = False, first_only: bool = False) -> None:
        self.finishes.append((org_id, request_id, record))
        if refused:  # never admitted: logged at cost 0, no slot, no balance
            assert record is not None and record.cost_micro_pln == 0
            self.records.append(record)
            return
        held = self.slots.get(org_id, set())
        held.discard(request_id)
        if request_id not in self.journal:
            # a repeated finish (or one whose in-flight entry Redis lost): its record is queued unless it
            # counts only as the first, and PostgreSQL keeps the first record of a request id
            if record is not None and not first_only and all(r.request_id != request_id for r in self.records):
                self.records.append(record)
            return
        self.journal.discard(request_id)
        if record is not None:
            self.orgs[org_id].balance -= record.cost_micro_pln
            self.records.append(record)

    async def release(self, org_id: str, request_id: str) -> None:
        """The slot given back ahead of the finish; the journal entry stays for it."""
        self.released.append(request_id)
        self.slots.get(org_id, set()).discard(request_id)

    async def cancel(self, request_id: str) -> None:
        """The caller gave up on this admission: undo it (the real script also refuses one still queued)."""
        self.cancelled.append(request_id)
        self.journal.discard(request_id)
        for held in self.slots.values():
            held.discard(request_id)

    async def sync_clock(self) -> None:
        return None

    async def fill_key(self, key_hash: str, fields: dict[str, Any] | None) -> None:
        if fields is None:
            self.revoked.add(key_hash)
        else:
            self.keys[key_hash] = (fields["id"], fields["org"])

    async def fill_org(self, org_id: str, fields: dict[str, Any]) -> None:
        self.orgs[org_id] = Org(fields["status"], fields["balance"], fields.get("rpm") or 1000,
                                fields.get("conc") or 100)

    def held(self) -> int:
        return sum(len(s) for s in self.slots.values())


@dataclass
class FakeDirectory:
    """What PostgreSQL answers on a cache miss."""

    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    orgs: dict[str, dict[str, Any]] = field(default_factory=dict)
    lookups: int = 0

    async def key(self, key_hash: str) -> dict[str, Any] | None:
        self.lookups += 1
        return self.keys.get(key_hash)

    async def org(self, org_id: str) -> dict[str, Any]:
        self.lookups += 1
        return self.orgs.get(org_id, {"status": "suspended", "balance": 0})


def gateway(balance: int = 10_000_000, status: str = "active", rpm: int = 1000, conc: int = 100,
            idle_timeout_s: float = 60.0, max_body_bytes: int = 20 * 1024 * 1024) -> Gateway:
    """A gateway with one organisation ``org_1`` holding key ``key_1`` (``KEY``), known only to the
    directory at first; the test catalog of the e2e suite."""
    cat = catalog_mod.parse(make_catalog(20000))
    d = FakeDirectory(keys={key_hash(KEY): {"id": "key_1", "org": "org_1", "rpm": None}},
                      orgs={"org_1": {"status": status, "balance": balance, "rpm": rpm, "conc": conc}})
    clock = iter(range(1_800_000_000, 1_900_000_000))  # a second per reading: ttfb and durations are whole
    return Gateway(catalog=cat, store=FakeStore(), directory=d,  # type: ignore[arg-type]
                   pick=lambda a, when: a.pick_upstream(when), clock=lambda: float(next(clock)),
                   idle_timeout_s=idle_timeout_s, max_body_bytes=max_body_bytes)


def store(gw: Gateway) -> FakeStore:
    assert isinstance(gw.store, FakeStore)
    return gw.store


# ---- hand-made ext_proc messages -------------------------------------------------------------------
def _header_map(headers: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                       for k, v in headers.items()])


def request_headers(method: str, path: str, key: str | None = KEY, request_id: str = "rid-1",
                    end_of_stream: bool = True, **extra: str) -> ep.ProcessingRequest:
    h = {":method": method, ":path": path, "x-request-id": request_id, **extra}
    if key is not None:
        h["authorization"] = "Bearer " + key
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=_header_map(h),
                                                               end_of_stream=end_of_stream))


def request_body(body: bytes, path: str = "/v1/chat/completions", key: str | None = KEY,
                 request_id: str = "rid-1") -> ep.ProcessingRequest:
    """The first message of a POST with a body: Envoy skips the headers message on those routes and
    sends what is needed of the headers as attributes (envoy/envoy.yaml)."""
    attrs = struct_pb2.Struct()
    fields = {ATTR_ID: request_id, ATTR_METHOD: "POST", ATTR_PATH: path}
    if key is not None:
        fields[ATTR_AUTH] = "Bearer " + key
    attrs.update(fields)
    msg = ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True))
    msg.attributes["envoy.filters.http.ext_proc"].CopyFrom(attrs)
    return msg


def response_headers(status: int, content_type: str = "application/json",
                     end_of_stream: bool = False, details: str = "via_upstream", **extra: str) -> ep.ProcessingRequest:
    """``details``: Envoy's response.code_details attribute ("via_upstream": the model server's reply)."""
    msg = ep.ProcessingRequest(response_headers=ep.HttpHeaders(
        headers=_header_map({":status": str(status), "content-type": content_type, **extra}),
        end_of_stream=end_of_stream))
    attrs = struct_pb2.Struct()
    attrs.update({"response.code_details": details})
    msg.attributes["envoy.filters.http.ext_proc"].CopyFrom(attrs)
    return msg


def response_body(body: bytes, end_of_stream: bool = True) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_body=ep.HttpBody(body=body, end_of_stream=end_of_stream))


def chat_reply(model: str = "up-pro", prompt: int = 11, completion: int = 7) -> bytes:
    return json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": model,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "Cześć"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}}).encode()


def sse(*docs: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(d).encode() + b"\n\n" for d in docs)
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunk(content: str | None, model: str = "up-pro", finish: str | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def usage_chunk(prompt: int, completion: int, model: str = "up-pro") -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


STALL = object()  # FakeCall: no message comes (the reply stalled)


class FakeCall:
    """A scripted ``grpc_server.Call``: ``read`` hands out the given messages in order; ``EOF`` is
    Envoy ending (or resetting) the stream; ``STALL`` is a wait that only an idle timer ends (a read
    without one, which would hang for ever, fails the test).  What the server writes is kept."""

    def __init__(self, *script: Any, metadata: dict[str, str] | None = None) -> None:
        self.script = list(script)
        self.written: list[ep.ProcessingResponse] = []
        self.timeouts: list[float | None] = []
        self._metadata = metadata or {}
        self.ended = False  # Envoy ended or reset the call: set once ``read`` has handed out EOF
        self.reset = False  # Envoy reset the call (its message timeout answered the client)
        self.expired = False  # reset while the process was paused (``settle`` says so)
        self.gone = False  # the connection went away (Envoy died) instead of Envoy ending the call
        self.ending: list[float] = []  # the delays ``end_soon`` was asked for

    def metadata(self, name: str) -> str | None:
        return self._metadata.get(name)

    async def read(self, timeout: float | None = None) -> Any:
        self.timeouts.append(timeout)
        if not self.script:
            self.ended = True
            return EOF  # Envoy closed its side after the last message
        item = self.script.pop(0)
        while callable(item):  # something that happens meanwhile (another call's doing), then the next
            item()
            item = self.script.pop(0) if self.script else EOF
        if item is STALL:
            assert timeout is not None, "the server waits for a stalled reply with no idle timer"
            raise TimeoutError
        if item is EOF:
            self.ended = True
        return item

    async def settle(self) -> bool:
        return self.expired

    async def consume(self, sink: Any) -> None:
        """``Call.consume`` over the script: each message to ``sink.feed`` until it returns True (the
        idle limit asked before each is kept in ``timeouts``, as ``read`` keeps its timeout)."""
        while True:
            item = await self.read(sink.idle)
            if item is EOF or sink.feed(item):
                return

    def write(self, message: ep.ProcessingResponse) -> None:
        self.written.append(message)

    def end_soon(self, delay: float) -> None:
        self.ending.append(delay)


def logged_free(store: "FakeStore") -> tuple[int, str]:
    """The one usage record of a request that cost nothing: (status, error code) as the log shows it;
    asserts it is the only record and carries no tokens and no cost."""
    [rec] = store.records
    assert (rec.prompt_tokens, rec.completion_tokens, rec.cost_micro_pln, rec.estimated) == (0, 0, 0, False), rec
    return rec.status, rec.error_code
