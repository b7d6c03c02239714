"""One request's journey through the ext_proc phases, as plain method calls.

The stream loop (``server``) turns ext_proc messages into calls on an ``Exchange`` and its ``Answer``s
back into messages; this module knows nothing of gRPC.  Pure rules come from ``rules``, ``sse``,
``responses`` and ``cost``; I/O goes through ``Gateway.store`` (Redis) and, on a cache miss only,
``Gateway.directory`` (PostgreSQL).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine, Protocol
from urllib.parse import unquote

from core import logs
from core.catalog import Alias, Catalog
from core.cost import Prices, cost_micro_pln
from core.decisions import Admission, UsageRecord
from core.directory import Directory
from core.endpoints import REGISTRY, Endpoint, Registry
from . import metrics
from .billing_outcome import ANSWERED, LEFT, Facts, Outcome, decide
from core.errors import (BODY_TOO_LARGE, INTERNAL_ERROR, INVALID_KEY, MODEL_NOT_FOUND, UNSUPPORTED_ENDPOINT,
                     UPSTREAM_TIMEOUT, ApiError)
from core.keys import bearer_key, key_hash
from core.responses import upstream_error
from core.rules import Prepared
from core.stream_context import HEADER as STREAM_HEADER, StreamContext
from .hold import worst_case
from .policies import NONE, Policies
from .spool import NoSpool, PendingFinish, Spool
from .store import Late, Miss, Store

log = logging.getLogger("extproc")

CLUSTER_HEADER = "x-gateway-cluster"
# What of the request headers the ext_proc gets as attributes of the request-body message when Envoy
# skips the request-headers message (envoy/envoy.yaml, POST chat and embeddings with a body).
ATTR_ID, ATTR_METHOD, ATTR_PATH, ATTR_AUTH = ("request.id", "request.method", "request.path",
                                              "request.headers['authorization']")
# ... and of the reply, with its headers message: how Envoy came by it ("via_upstream": the model server)
ATTR_DETAILS, VIA_UPSTREAM = "response.code_details", "via_upstream"

# How long after the end of a call a stream it handed over may still be billed by the stream watch
# (Envoy keeps the watch's call open 1 s after the stream ended, envoy/envoy.yaml deferred_close_timeout).
# The concurrency slot is given back at the end of the call, not after this (``Gateway.release``).
HAND_OVER_GRACE_S = 5.0
# How long after the end of a call a stream it handed over waits for this process's stream watch to have
# read its first copy, when it had not yet (Envoy ends the call as the stream ends, and the watch's call,
# another stream of the connection, may be read a moment later: ~40% of 64-event bursts at 64
# connections): a stream that reached its end then needs no early release of its slot, a Redis call.
WATCH_WAIT_S = 0.05
# How long a non-streaming reply that ended before its end waits for Envoy's access log to say whether the
# client left (logged 499) or the model server broke it (502): both end the call alike, the access log's
# entry comes right after.
LEFT_WAIT_S = 0.25

_MODELS_PATH = "/v1/models"  # answered here (the endpoints, ``endpoints``, are forwarded)
_FREE = Prices(0, 0)  # a refusal's, logged before an alias was chosen


class Watch(Protocol):
    """This process's stream watch of a request (``observer.StreamWatch``), as the exchange sees it."""

    @property
    def settled(self) -> bool:
        """The stream reached its end or the watch billed it: its finish frees the slot now."""


@dataclass(slots=True)
class Answer:
    """What the stream loop sends back for one phase.  ``reply`` set means an immediate response."""

    set_headers: dict[str, str] = field(default_factory=dict)
    remove_headers: list[str] = field(default_factory=list)
    body: bytes | None = None
    cluster: str | None = None  # the upstream cluster chosen (Envoy routes by it, envoy/envoy.yaml)
    clear_route_cache: bool = False
    # a streamed reply handed over to Envoy's relay and the stream watch (``observer``): the body is no
    # longer sent here, the end of the stream still is (as the trailers phase, which may never come)
    hand_over: bool = False
    reply: tuple[int, bytes, dict[str, str]] | None = None


@dataclass(slots=True)
class Gateway:
    """What every exchange shares: configuration and the two stores."""

    catalog: Catalog
    store: Store
    directory: Directory
    pick: Callable[[Alias, float], str | None]  # an upstream model of the alias in force at that time
    endpoints: Registry = REGISTRY
    policies: Policies = NONE  # the operator's request policies (GATEWAY_REQUEST_POLICIES): none by default
    clock: Callable[[], float] = time.time
    max_body_bytes: int = 20 * 1024 * 1024
    # docs/interface.md section 7: the longest gap allowed inside an upstream reply once it has started.  Envoy's
    # idle timers run from the start of the upstream request, so the ext_proc keeps this one.
    idle_timeout_s: float = 60.0
    # docs/interface.md section 7's total budget (Envoy's route timeout, which starts after the ext_proc let the
    # request through): a stream Envoy ends at it was failed by the model server, not left by the client
    total_timeout_s: float = 600.0
    # The longest an admission may wait on Redis and PostgreSQL before the request is answered 500
    # internal_error: well inside Envoy's ext_proc message_timeout (5 s, envoy/envoy.yaml), so that a
    # hung dependency gives the client the interface's error, never Envoy's empty 504.
    dependency_budget_s: float = 3.5
    auth_cache: "AuthCache" = field(default_factory=lambda: AuthCache())
    _models: tuple[int, Catalog, bytes] | None = None
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)  # this process, in the in-flight journal
    # streams this process handed over whose stream watch runs in this process too (``observer``), by
    # request id: their hand-over needs no finish of its own (``Exchange._handed_over_end``)
    watched: dict[str, Watch] = field(default_factory=dict)
    # what in this process waits on Envoy's access log to say how a request ended for its client
    # (``access_log``: ``LEFT`` or ``ANSWERED``), by request id: a stream watch (billed and its slot freed
    # at once, not when Envoy's deferred close of its call, 1 s later, would end it) or a non-streaming
    # reply that ended before its end (499, 502, or Envoy's 500)
    leaving: dict[str, Callable[[str], None]] = field(default_factory=dict)
    _retrying: set[asyncio.Task[None]] = field(default_factory=set)
    spool: Spool = field(default_factory=NoSpool)  # finishes Redis did not take, on local disk

    async def how_ended(self, request_id: str) -> str:
        """How Envoy's access log marked this request's ending in Redis (any process may have received the
        entry): ``LEFT``, ``ANSWERED`` or ""; Redis unreachable: "" (taken for a reply the model server broke)."""
        try:
            return await self.store.how_ended(request_id)
        except Exception as e:  # noqa: BLE001
            log.warning("could not tell how a reply ended: %s", type(e).__name__, extra={"request_id": request_id})
            return ""

    async def finish(self, org_id: str, request_id: str, record: UsageRecord | None, refused: bool = False,
                     first_only: bool = False) -> None:
        """Release and record through the store; while Redis does not take it, keep it on disk and retry in
        the background (``finish_until_taken``), so a served request's record is not lost."""
        try:
            await self.store.finish(org_id, request_id, record, refused=refused, first_only=first_only)
        except Exception:  # noqa: BLE001
            self.finish_until_taken(PendingFinish(org_id, request_id, record, refused, first_only))

    def finish_until_taken(self, p: PendingFinish, kept: bool = False) -> None:
        """A finish Redis did not take: kept on disk (``spool``) and retried in the background until it
        does (the file then removed); ``kept``: it is on disk already (replayed at start)."""
        if not kept:
            self.spool.keep(p)
        metrics.FINISHES_WAITING.inc()

        async def once() -> None:
            await self.store.finish(p.org_id, p.request_id, p.record, refused=p.refused, first_only=p.first_only)
            self.spool.done(p.request_id)
            metrics.FINISHES_WAITING.dec()
        self._retry(once, "a usage record", p.request_id)

    def finish_later(self, org_id: str, request_id: str, record: UsageRecord, answered: UsageRecord) -> None:
        """``finish`` after ``HAND_OVER_GRACE_S``, unless this process's stream watch took the request
        meanwhile: a record that counts only if no other came first; ``answered`` in its place if Envoy's
        access log says its ext_proc filter answered the client itself."""
        async def later() -> None:
            await asyncio.sleep(HAND_OVER_GRACE_S)
            if self.watched.pop(request_id, None) is not None:
                return
            chosen = answered if await self.how_ended(request_id) == ANSWERED else record
            await self.finish(org_id, request_id, chosen, first_only=True)
        self._background(later())

    def release(self, org_id: str, request_id: str) -> None:
        """Give the request's concurrency slot back now, in the background, ahead of its finish (which
        still comes, with the record and the debit); Redis unreachable: the finish gives it back."""
        async def once() -> None:
            try:
                await self.store.release(org_id, request_id)
            except Exception as e:  # noqa: BLE001
                log.warning("could not free a slot early: %s", type(e).__name__, extra={"request_id": request_id})
        self._background(once())

    def cancel(self, request_id: str) -> None:
        """An admission given up on (``Store.cancel``), in the background until Redis takes it."""
        self._retry(lambda: self.store.cancel(request_id), "a cancellation", request_id, first=0.0)

    def _retry(self, call: Callable[[], Awaitable[None]], what: str, request_id: str, first: float = 0.1) -> None:
        self._background(self._retrying_call(call, what, request_id, first))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._retrying.add(task)  # held here: the loop keeps only a weak reference to a task
        task.add_done_callback(self._retrying.discard)

    async def _retrying_call(self, call: Callable[[], Awaitable[None]], what: str, request_id: str,
                             delay: float) -> None:
        deadline = self.clock() + 3600
        while self.clock() < deadline:
            await asyncio.sleep(delay)
            try:
                await call()
                return
            except Exception:  # noqa: BLE001
                delay = min(max(delay, 0.05) * 2, 2.0)
        log.error("%s could not be handed to Redis for an hour: kept on disk for the next start", what,
                  extra={"request_id": request_id})

    def models_body(self, aliases: tuple[str, ...] | None = None) -> bytes:
        """The model list, rendered at most once a second (prices change at whole seconds); for a key
        allowed some aliases only (``aliases``), those of them offered."""
        now = int(self.clock())
        if aliases is not None:
            return _json({"object": "list", "data": [a.model_object(now) for a in self.catalog.aliases.values()
                                                     if a.id in aliases and a.offered_at(now)]})
        cached = self._models
        if cached is None or cached[0] != now or cached[1] is not self.catalog:
            body = _json({"object": "list", "data": [a.model_object(now) for a in self.catalog.aliases.values()
                                                     if a.offered_at(now)]})
            cached = self._models = (now, self.catalog, body)
        return cached[2]

    def upstream_for(self, alias: Alias, when: float) -> str | None:
        """The upstream model for a request to ``alias`` that started at ``when``."""
        up = self.pick(alias, when)
        return up if up is not None and self.catalog.deployments.get(up) else None


def stream_context(endpoint: Endpoint, p: Prepared, request_id: str, org_id: str, key_id: str, started: float,
                   ttfb_ms: int | None, owner: str) -> StreamContext:
    """What Envoy's relay and the stream watch (``observer``) need to know of a streamed reply.
    ``owner``: the process that handed it over."""
    prices = p.alias.prices_at(started)
    return StreamContext(
        endpoint=endpoint.name, alias=p.alias.id, upstream_model=p.upstream_model,
        client_wants_usage=p.client_wants_usage, request_id=request_id, org_id=org_id, key_id=key_id,
        started=started, ttfb_ms=ttfb_ms, input_price=prices.input, output_price=prices.output,
        estimated_prompt_tokens=p.estimated_prompt_tokens, owner=owner)


def count(alias: str, endpoint: str, status: int, code: str) -> None:
    metrics.labelled(metrics.REQUESTS, alias, endpoint, str(status), code).inc()


def account(r: UsageRecord, endpoint: Endpoint) -> None:
    """A billed request's metrics and its log line (metadata only)."""
    count(r.alias, r.endpoint, r.status, "" if r.status == 200 else "aborted")
    logs.request_line(request_id=r.request_id, alias=r.alias, endpoint=r.endpoint, status=r.status,
                      prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                      estimated=r.estimated, cost_micro_pln=r.cost_micro_pln,
                      duration_ms=int((r.ended_at - r.started_at) * 1000), ttfb_ms=r.ttfb_ms)
    alias = r.alias
    metrics.labelled(metrics.TOKENS, "input", alias, alias).observe(r.prompt_tokens)
    if endpoint.bills_output:
        metrics.labelled(metrics.TOKENS, "output", alias, alias).observe(r.completion_tokens)
    metrics.labelled(metrics.BILLED, alias).inc(r.cost_micro_pln)
    metrics.labelled(metrics.DURATION, alias, r.endpoint).observe(r.ended_at - r.started_at)
    if r.ttfb_ms is not None:
        ttfb = r.started_at + r.ttfb_ms / 1000
        metrics.labelled(metrics.TTFT, alias).observe(ttfb - r.started_at)
        if r.stream and r.completion_tokens > 1:
            metrics.labelled(metrics.TPOT, alias).observe((r.ended_at - ttfb) / (r.completion_tokens - 1))


def _error_code(body: bytes) -> str:
    """The interface's code in one of Envoy's own replies (envoy/envoy.yaml local_reply_config)."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "upstream_unavailable"
    return code if isinstance(code, str) else "upstream_unavailable"


def _forget(task: "asyncio.Future[Any]") -> None:
    """A read given up on: its outcome (when PostgreSQL resumes) is dropped, its error too."""
    if not task.cancelled():
        task.exception()


class AuthCache:
    """Successful authentications, kept for half a second in this process: enough to spare Redis a round
    trip on ``GET /v1/models`` under load, short enough that a revocation or suspension still takes
    effect within a second (docs/interface.md section 3)."""

    def __init__(self, ttl: float = 0.5, size: int = 10000, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self._entries: dict[str, tuple[float, Admission]] = {}

    def get(self, key_hash: str) -> Admission | None:
        hit = self._entries.get(key_hash)
        if hit is None:
            return None
        if hit[0] < self.clock():
            del self._entries[key_hash]
            return None
        return hit[1]

    def put(self, key_hash: str, adm: Admission) -> None:
        if len(self._entries) >= self.size:
            self._entries.clear()
        self._entries[key_hash] = (self.clock() + self.ttl, adm)


def error_answer(err: ApiError, request_id: str) -> Answer:
    headers = {"content-type": "application/json"}
    if err.retry_after is not None:
        headers["retry-after"] = str(err.retry_after)
    return Answer(reply=(err.status, err.body(request_id), headers))


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


class Exchange:
    __slots__ = ("gw", "request_id", "method", "path", "endpoint", "key_hash", "admission", "prepared", "started",
                 "ttfb", "status", "error_code", "handed_over", "envoys_reply", "finished", "idle", "finishing",
                 "cut", "delivered", "stream_ended")

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.request_id = ""
        self.method = ""
        self.path = ""
        self.endpoint: Endpoint | None = None  # the path's, when it is one of the endpoints served
        self.key_hash: str | None = None
        self.admission: Admission | None = None
        self.prepared: Prepared | None = None
        self.started = gw.clock()
        self.ttfb: float | None = None
        self.status = 0
        self.error_code = ""  # The interface's code of the error the client got, for the usage log
        # a streamed reply went to Envoy's relay: the stream watch (``observer``) bills it
        self.handed_over = False
        self.envoys_reply = False  # the reply is Envoy's own (local_reply_config: the interface's shape already)
        self.finished = False
        self.delivered = True  # False: Envoy ended the call before the request went on (``undelivered``)
        self.stream_ended = False  # a handed-over stream reached its end (its trailers phase)
        # Envoy ended the call while the answer to this response phase was in flight (``cut_off``)
        self.cut: str | None = None
        # seconds the next message may take to come (None: no limit here); set once the reply started
        self.idle: float | None = None
        # the request's release and usage record, decided but not yet handed to Redis (``send_finish``), and
        # whether it is a refusal (never admitted: only logged)
        self.finishing: tuple[str, UsageRecord | None, bool] | None = None

    # ---- metrics (bounded labels only) -------------------------------------------------------
    def _count(self, status: int, code: str) -> None:
        endpoint = (self.endpoint.name if self.endpoint is not None
                    else "models" if self.path.startswith(_MODELS_PATH) else "other")
        count(self.prepared.alias.id if self.prepared is not None else "-", endpoint, status, code)

    def _reject(self, err: ApiError) -> Answer:
        self._count(err.status, err.code)
        kind = metrics.REJECTION_KIND.get(err.code)
        if kind is not None:
            metrics.labelled(metrics.REJECTIONS, kind).inc()
        self.status, self.error_code = err.status, err.code
        if self.prepared is None:
            self._log_refusal()
        return error_answer(err, self.request_id)

    def _log_refusal(self) -> None:
        """A chat or embeddings request refused on the way in (400, 402, 403, 404, 429): it goes to the
        usage log at cost 0 and touches no balance.  Only a caller whose key is known has a log (a 401,
        a body over the size limit checked before the key, a Redis or PostgreSQL outage: none)."""
        adm = self.admission
        if (self.finished or adm is None or adm.identity is None or self.method != "POST"
                or self.endpoint is None):
            return
        self.finished = True
        o = decide(Facts(0, reached_model=False, status=self.status, code=self.error_code))
        self.finishing = (adm.identity.org_id, self._record(o, adm.identity.org_id, adm.identity.key_id), True)

    def _refuse_admitted(self, err: ApiError) -> Answer:
        """A request admitted (its slot, journal entry and hold taken) that a request policy refused: its
        finish undoes the admission and logs it at cost 0, after the answer like any request's."""
        answer = self._reject(err)
        self._finish(Facts(0, reached_model=False, status=err.status, code=err.code))
        return answer

    def _ok(self, body: bytes) -> Answer:
        self._count(200, "")
        return Answer(reply=(200, body, {"content-type": "application/json"}))

    # ---- request headers -------------------------------------------------------------------
    def _identify(self, request_id: str, method: str, path: str, authorization: str | None) -> bool:
        self.request_id = request_id
        self.method = method
        self.path = path.split("?", 1)[0]
        self.endpoint = self.gw.endpoints.by_path.get(self.path)
        key = bearer_key(authorization)
        if key is None:
            return False
        self.key_hash = key_hash(key)
        return True

    async def request_headers(self, headers: dict[str, str], end_of_stream: bool) -> Answer:
        if not self._identify(headers.get("x-request-id", ""), headers.get(":method", ""),
                              headers.get(":path", ""), headers.get("authorization")):
            return self._reject(INVALID_KEY)
        if self.method == "POST" and self.endpoint is not None:
            # a body-less or chunked POST (others skip this message: see request_body's attributes)
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > self.gw.max_body_bytes:
                return await self._too_large()
            if end_of_stream:
                return await self.request_body(b"")
            return Answer()
        # Everything else is answered here, after authentication only.
        adm = await self._admit(limits=False)
        if adm.error is not None:
            return self._reject(adm.error)
        if self.method == "GET" and self.path == _MODELS_PATH:
            return self._ok(self.gw.models_body(adm.aliases))
        if self.method == "GET" and self.path.startswith(_MODELS_PATH + "/"):
            # the id as the client meant it: percent-encoding undone (RFC 3986; /v1/models/%65mbed is embed)
            alias = self.gw.catalog.aliases.get(unquote(self.path[len(_MODELS_PATH) + 1:]))
            if (alias is None or not alias.offered_at(self.gw.clock())
                    or (adm.aliases is not None and alias.id not in adm.aliases)):
                return self._reject(MODEL_NOT_FOUND)
            return self._ok(_json(alias.model_object(self.gw.clock())))
        return self._reject(UNSUPPORTED_ENDPOINT)

    # ---- request body ----------------------------------------------------------------------
    async def _too_large(self) -> Answer:
        """A body over the cap: 400, once the key is known good (docs/interface.md section 5: authentication first;
        a body over Envoy's buffer limit gets Envoy's 413, mapped to the same 400, before any key check)."""
        adm = await self._admit(limits=False)
        if adm.error is not None:
            return self._reject(adm.error)
        return self._reject(BODY_TOO_LARGE)

    async def request_body(self, body: bytes, attributes: dict[str, str] | None = None) -> Answer:
        """``attributes``: the request-headers message was skipped and what is needed of the headers
        came with this one (``ATTR_*``)."""
        if attributes is not None and not self._identify(
                attributes.get(ATTR_ID, ""), attributes.get(ATTR_METHOD, ""), attributes.get(ATTR_PATH, ""),
                attributes.get(ATTR_AUTH)):
            return self._reject(INVALID_KEY)
        if len(body) > self.gw.max_body_bytes:
            return await self._too_large()
        if self.endpoint is None:  # (Envoy sends a body only on an endpoint's route)
            return self._reject(UNSUPPORTED_ENDPOINT)
        prepared = self.endpoint.prepare(body, self.gw.catalog,
                                         lambda alias: self.gw.upstream_for(alias, self.started))
        if isinstance(prepared, Prepared) and not prepared.alias.offered_at(self.started):
            prepared = MODEL_NOT_FOUND  # no price in force yet: not offered before its first price
        if isinstance(prepared, Prepared):
            self.prepared = prepared
        adm = await self._admit(limits=self.prepared is not None)
        if adm.error is not None:
            self.prepared = None
            return self._reject(adm.error)
        if isinstance(prepared, ApiError):
            if prepared.alias is not None and adm.aliases is not None and prepared.alias not in adm.aliases:
                return self._reject(MODEL_NOT_FOUND)  # an alias the key may not use, as if it did not exist
            return self._reject(prepared)
        assert adm.identity is not None  # admitted
        refusal = self.gw.policies.check(prepared, adm.identity)
        if refusal is not None:
            return self._refuse_admitted(refusal)
        # The routing header and the new length apply where Envoy sent the headers message.  Where the
        # route skipped it Envoy drops them (a buffer filter sets the length; the cluster comes from the
        # dynamic metadata) but needs some header mutation to re-route the request.
        cluster = Catalog.cluster_name(prepared.upstream_model)
        return Answer(set_headers={CLUSTER_HEADER: cluster, "content-length": str(len(prepared.body))},
                      body=prepared.body, cluster=cluster, clear_route_cache=True)

    async def _admit(self, *, limits: bool) -> Admission:
        """One round trip to Redis; on a cache miss, a PostgreSQL read and a fill first.  All of it within
        ``dependency_budget_s``: past it (a hung or dead Redis or PostgreSQL) the
        answer is 500 internal_error, and an admission that may have taken effect is undone (``cancel``),
        so the request is never billed and holds no slot."""
        assert self.key_hash is not None
        if not limits:  # authentication only (models, unsupported paths): a recent answer will do
            cached = self.gw.auth_cache.get(self.key_hash)
            if cached is not None:
                self.admission = cached
                return cached
        pending, hold, alias = "", None, ""
        if limits:  # a prepared request: journalled, its worst case held (README, "Billing")
            assert self.prepared is not None
            pending = self._pending()
            hold = worst_case(self.prepared, self.prepared.alias.prices_at(self.started))
            alias = self.prepared.alias.id
        # from now, not the request's start: Envoy's message timeout runs from the message that brought
        # us here (a chunked body may come seconds after the headers)
        deadline = self.gw.clock() + self.gw.dependency_budget_s
        try:
            async with asyncio.timeout(self.gw.dependency_budget_s):
                for _ in range(4):  # a key, its organisation and its month's spend may be missing
                    try:
                        adm = await self.gw.store.admit(self.key_hash, self.request_id, limits=limits,
                                                        pending=pending, deadline=deadline, hold=hold,
                                                        alias=alias, now=self.started)
                    except Miss as miss:
                        await self._fill(miss)
                        continue
                    break
                else:
                    raise RuntimeError("cache fill did not converge")
            if limits and adm.admitted and self.gw.clock() > deadline:
                raise TimeoutError("admitted after the budget")  # too late for Envoy: undone below
        except Exception as e:  # noqa: BLE001 - Redis or PostgreSQL hung, gone or late
            if isinstance(e, (TimeoutError, OSError, Late)):  # ConnectionError is an OSError
                log.warning("admission failed: %s", type(e).__name__, extra={"request_id": self.request_id})
            else:
                log.exception("admission failed", extra={"request_id": self.request_id})
            if limits:
                self.gw.cancel(self.request_id)
            self.admission = None
            return Admission(None, INTERNAL_ERROR)
        if self.admission is None:
            metrics.labelled(metrics.KEY_LOOKUPS, "hit").inc()
        self.admission = adm
        if not limits and adm.error is None:
            self.gw.auth_cache.put(self.key_hash, adm)
        return adm

    async def _fill(self, miss: Miss) -> None:
        """Read the missing entry from PostgreSQL and cache it in Redis.  The read runs as a task of its
        own, left behind when the budget runs out: a connection of a hung PostgreSQL cannot be given back
        to the pool promptly, and the client must not wait for that."""
        assert self.key_hash is not None
        if miss.what == "spend":
            assert miss.key_id is not None and miss.org_id is not None
            spend = asyncio.ensure_future(self.gw.directory.key_spend(miss.org_id, miss.key_id, self.started))
            spend.add_done_callback(_forget)
            await asyncio.wait((spend,))
            await self.gw.store.fill_spend(miss.org_id, miss.key_id, miss.month, spend.result())
            return
        if miss.what == "key":
            metrics.labelled(metrics.KEY_LOOKUPS, "miss").inc()
            read: Awaitable[dict[str, Any] | None] = self.gw.directory.key(self.key_hash)
        else:
            assert miss.org_id is not None
            read = self.gw.directory.org(miss.org_id)
        task = asyncio.ensure_future(read)
        task.add_done_callback(_forget)
        await asyncio.wait((task,))  # cancelled by the budget's timeout, the read itself is not
        fields = task.result()
        if miss.what == "key":
            await self.gw.store.fill_key(self.key_hash, fields)
        else:
            assert miss.org_id is not None and fields is not None
            await self.gw.store.fill_org(miss.org_id, fields)

    # ---- response --------------------------------------------------------------------------
    async def response_headers(self, headers: dict[str, str], attributes: dict[str, str] | None = None) -> Answer:
        self.ttfb = self.gw.clock()
        self.status = int(headers.get(":status", "0") or 0)
        self.envoys_reply = attributes is not None and attributes.get(ATTR_DETAILS, VIA_UPSTREAM) != VIA_UPSTREAM
        p, endpoint = self.prepared, self.endpoint
        if p is None or endpoint is None:
            return Answer()
        self.idle = self.gw.idle_timeout_s
        if (p.stream and self.status == 200
                and headers.get("content-type", "").startswith("text/event-stream")):
            # Envoy relays the stream itself (envoy/sse_relay.lua) and the stream watch sees a copy of
            # it: both learn the request from this header (Envoy's relay removes it from the reply)
            self.handed_over = True
            self.idle = None  # the stream watch keeps the idle budget between events
            adm = self.admission
            assert adm is not None and adm.identity is not None
            ctx = stream_context(endpoint, p, self.request_id, adm.identity.org_id, adm.identity.key_id, self.started,
                                 self._ttfb_ms(), self.gw.owner)
            # the relay changes the length of what passes: a model server's length no longer holds
            return Answer(hand_over=True, set_headers={STREAM_HEADER: ctx.header()},
                          remove_headers=["content-length"])
        return Answer()

    async def response_body(self, body: bytes, end_of_stream: bool) -> Answer:
        p, endpoint = self.prepared, self.endpoint
        if p is None or endpoint is None:
            return Answer()
        if self.status >= 400 or self.status < 200:
            if self.envoys_reply:  # already in the interface's shape: passed on as it is
                code = self.error_code = _error_code(body)
                self._count(self.status, code)
                answer = Answer()
            else:
                err = upstream_error(self.status, body, endpoint.input_param)
                code = err.code
                answer = self._reject(err)
            metrics.labelled(metrics.UPSTREAM_FAILURES, p.alias.id, code).inc()
            self._finish(Facts(p.estimated_prompt_tokens, status=self.status, code=code))
            return answer
        reply = endpoint.rewrite(body, p.upstream_model, p.alias.id)
        usage, output = reply.tokens, 0
        if usage is None:  # a complete reply without usage: its input and its output estimated, and shown
            reply, output = endpoint.estimate(reply.head, p.estimated_prompt_tokens)
        r = self._finish(Facts(p.estimated_prompt_tokens, status=self.status, ended=True, usage=usage, output=output))
        # the usage says what the request is billed, the usage record's own figure
        new = reply.body() if r is None else reply.body(r.cost_micro_pln, r.estimated)
        return Answer(body=new, set_headers={"content-length": str(len(new))})

    def response_trailers(self) -> Answer:
        """A handed-over stream reached its end: the stream watch bills it at once (its last copy is on
        its way), so the slot needs no early release."""
        self.stream_ended = True
        return Answer()

    async def idle_gap(self) -> Answer:
        """Nothing more of a non-streaming reply came within the idle budget (docs/interface.md section 7): 502
        upstream_timeout (Envoy still holds the reply whole, so the client gets the error).  A stream's
        idle budget is the stream watch's (``observer``)."""
        p = self.prepared
        assert p is not None
        metrics.labelled(metrics.UPSTREAM_FAILURES, p.alias.id, "upstream_timeout").inc()
        self.error_code = "upstream_timeout"
        await self.close()  # billed (and counted) as a reply that failed after it started: 502
        return error_answer(UPSTREAM_TIMEOUT, self.request_id)

    # ---- the end, however it came ----------------------------------------------------------
    def cut_off(self, phase: str) -> None:
        """Envoy ended the call while the answer to ``phase`` (the response headers) may still have been
        on its way: then it was never read, and the client got Envoy's 502.  That is how a model server
        that drops the connection right after its headers shows here (Envoy resets the client's stream
        at once, dropping what the ext_proc still held)."""
        if not self.finished:
            self.cut = phase

    async def answered_by_envoy(self, attributes: dict[str, str] | None = None) -> Answer:
        """Envoy reset the call before the request was admitted: its message timeout answered the client
        (the interface's 500 internal_error) while this process was paused.  Logged as the client saw it, after
        authentication only (the usage log is its organisation's); admitted never: no slot, no request
        of the per-minute budget, nothing billed.  ``attributes`` as for ``request_body``."""
        if attributes is None or self._identify(attributes.get(ATTR_ID, ""), attributes.get(ATTR_METHOD, ""),
                                                attributes.get(ATTR_PATH, ""), attributes.get(ATTR_AUTH)):
            if self.key_hash is not None:
                await self._admit(limits=False)
        return self._reject(INTERNAL_ERROR)

    def timed_out(self) -> None:
        """Envoy reset the call while this process was paused with the reply's headers in hand (a JSON
        reply's are held with its body): its message timeout answered the client with the interface's 500
        internal_error in their place, so none of the reply reached the client.  Logged as that 500, billed
        nothing, whatever the model server had sent."""
        p = self.prepared
        if p is not None:
            self._count(500, INTERNAL_ERROR.code)
            self._finish(Facts.envoys_500(p.estimated_prompt_tokens))

    async def maybe_unread(self) -> None:
        """Envoy may not have read this request's last answer (``server``: it ended the call before the
        answer went, or long after): Envoy's access log says what the client got instead.  Its message
        timeout answered (this process paused past it, or Envoy paused with the answer unread and its timer
        seen first on resuming): the interface's 500, billed nothing, whatever the model server replied.  The
        client left: as a client that left (499, the estimated input, once the request reached a model
        server).  Neither: the decided record stands."""
        if not self._recorded_at_its_end():
            return
        how = await self._how_ended()
        est = self._estimated_input()
        if how == ANSWERED:
            facts = Facts.envoys_500(est)
        elif how == LEFT:
            facts = Facts(est, reached_model=self.delivered, status=self.status, code=self.error_code,
                          client_left=True)
        else:
            return
        self._record_instead(facts, "the last answer was not read by Envoy: recorded as the client saw it")

    def envoy_gone(self) -> None:
        """Envoy's connection went away after this request's last answer, before Envoy ended the call.
        Envoy ends it when it destroys the request's filters, in the same turn of its loop as it hands
        the reply to the client's connection, and both go out together: so Envoy died before either
        went, and the client got no byte of the reply (its connection broke).  Recorded as a request
        whose connection went with Envoy: 500 ``internal_error``, nothing billed, whatever was decided."""
        if self._recorded_at_its_end():
            self._record_instead(Facts(self._estimated_input()),
                                 "Envoy went away with the reply: recorded as its client saw it")

    def _recorded_at_its_end(self) -> bool:
        """A record was decided at the request's last answer, not sent yet (``finishing``), of a request
        that has its organisation and key."""
        adm = self.admission
        return (self.finishing is not None and self.finishing[1] is not None and adm is not None
                and adm.identity is not None)

    def _estimated_input(self) -> int:
        return 0 if self.prepared is None else self.prepared.estimated_prompt_tokens

    def _record_instead(self, facts: Facts, why: str) -> None:
        """The record ``facts`` decide in place of the one decided at the last answer (the client got
        something else than that answer); ``why`` logged (with the request id only)."""
        decided, adm = self.finishing, self.admission
        assert decided is not None and adm is not None and adm.identity is not None
        ident = adm.identity
        self.finishing = (decided[0], self._record(decide(facts), ident.org_id, ident.key_id), decided[2])
        log.warning(why, extra={"request_id": self.request_id})

    def undelivered(self) -> None:
        """Envoy ended the call before the answer that lets the request through (this process was late
        past Envoy's message timeout, or the client left): no model server ever saw the request, so
        nothing is billed (``close`` records it, as the client's 499 or Envoy's 500)."""
        self.delivered = False

    async def close(self) -> None:
        """The gRPC stream ended.  A forwarded request not billed yet ended abnormally."""
        p = self.prepared
        if self.handed_over:
            self._handed_over_end()
        elif not self.finished and p is not None:
            # never let through, or a reply under way that ended before its end: the client left, the
            # model server broke it, or Envoy went away
            asked = self.status == 0 or (200 <= self.status < 400 and not self.error_code)
            adm = self.admission
            if asked and adm is not None and adm.identity is not None:
                # the slot now, not after the wait for Envoy's access log (up to LEFT_WAIT_S)
                self.gw.release(adm.identity.org_id, self.request_id)
            ended = await self._how_ended() if asked else ""
            if ended == ANSWERED:  # Envoy's message timeout answered the client though this answer was on its way
                self.timed_out()
            else:
                self._finish(Facts(p.estimated_prompt_tokens, reached_model=self.delivered, status=self.status,
                                   code=self.error_code, content_seen=200 <= self.status < 400,
                                   client_left=ended == LEFT, failure=self.error_code))
        await self.send_finish()

    async def _how_ended(self) -> str:
        """How Envoy's access log says this request ended for its client (``access_log``): told here
        (``Gateway.leaving``) within ``LEFT_WAIT_S``, else marked in Redis (another process was told, or
        the entry came first).  Asked only of a reply that ended before its end."""
        told: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def tell(how: str) -> None:
            if not told.done():
                told.set_result(how)

        self.gw.leaving[self.request_id] = tell
        try:
            return await asyncio.wait_for(told, LEFT_WAIT_S)
        except TimeoutError:
            return await self.gw.how_ended(self.request_id)
        finally:
            self.gw.leaving.pop(self.request_id, None)

    def _handed_over_end(self) -> None:
        """A stream handed over to Envoy's relay is the stream watch's to bill, once Envoy passed its
        headers on.  This call ends with the stream: its concurrency slot is given back now, unless the
        stream watch in this process saw the stream reach its end (looked for again ``WATCH_WAIT_S``
        later if it had not read its first copy yet; a client's next request is not refused for a stream
        that is over), and a finish of its own follows ``HAND_OVER_GRACE_S`` later, which counts only if
        the stream watch's did not come first (``Store.finish`` takes the first finish of a request):
        when the call ended right after the hand-over, Envoy may have reset the client's stream before it
        read it (the client got 502 and the stream watch saw nothing), recorded as that 502 at no cost;
        otherwise the stream watch's process died with the stream, billed the estimated input as the
        reaper bills a request whose ext_proc died."""
        p = self.prepared
        adm = self.admission
        if self.finished or p is None or adm is None or adm.identity is None:
            return
        self.finished = True
        watch = self.gw.watched.pop(self.request_id, None)
        if watch is None and not self.stream_ended:  # the watch may not have read its first copy yet
            asyncio.get_running_loop().call_later(
                WATCH_WAIT_S, lambda: self._after_hand_over(self.gw.watched.pop(self.request_id, None)))
            return
        self._after_hand_over(watch)

    def _after_hand_over(self, watch: Watch | None) -> None:
        """``_handed_over_end``'s slot and fallback finish, once this process's stream watch (if any)
        is known."""
        p, adm = self.prepared, self.admission
        assert p is not None and adm is not None and adm.identity is not None
        org_id = adm.identity.org_id
        # a stream that broke or was left is billed when the watch's call ends, up to 1 s later: its slot
        # is given back now (a stream that reached its end is billed by the watch right away)
        if not (self.stream_ended or (watch is not None and watch.settled)):
            self.gw.release(org_id, self.request_id)
        if watch is not None:  # this process's stream watch has it
            return
        if self.cut == "response_headers":
            facts = Facts(p.estimated_prompt_tokens, streamed=True, status=502, code="upstream_unavailable")
        else:
            facts = Facts(p.estimated_prompt_tokens, streamed=True, status=200, observed=False)
        record = self._record(decide(facts), org_id, adm.identity.key_id)
        # unless Envoy's message timeout answered the client in the headers' place (``access_log``)
        answered = self._record(decide(Facts.envoys_500(p.estimated_prompt_tokens)), org_id, adm.identity.key_id)
        self.gw.finish_later(org_id, self.request_id, record, answered)

    def _record(self, o: Outcome, org_id: str, key_id: str) -> UsageRecord:
        """The request's usage record; without ``prepared`` (refused before an alias was chosen) it has
        no alias, no prices and costs nothing."""
        p = self.prepared
        prompt, completion = o.tokens or (0, 0)
        endpoint = "" if self.endpoint is None else self.endpoint.name  # (only an endpoint's is recorded)
        if p is None:
            alias, upstream, stream, prices = "", "", False, _FREE
        else:
            alias, upstream, stream = p.alias.id, p.upstream_model, p.stream
            prices = p.alias.prices_at(self.started)
            if self.endpoint is not None and not self.endpoint.bills_output:
                completion = 0
        return UsageRecord(
            request_id=self.request_id, org_id=org_id, key_id=key_id, alias=alias, upstream_model=upstream,
            endpoint=endpoint, status=o.status, stream=stream, prompt_tokens=prompt, completion_tokens=completion,
            estimated=o.estimated, cost_micro_pln=cost_micro_pln(prompt, completion, prices),
            input_price=prices.input, output_price=prices.output, started_at=self.started,
            ttfb_ms=self._ttfb_ms(), ended_at=self.gw.clock(), error_code=o.code)

    def _ttfb_ms(self) -> int | None:
        return None if self.ttfb is None else int((self.ttfb - self.started) * 1000)

    def _pending(self) -> str:
        """The journal entry while in flight: what is billed if this process dies (estimated input)."""
        assert self.prepared is not None  # only a request with limits (a prepared one) is journalled
        rec = self._record(decide(Facts(self.prepared.estimated_prompt_tokens, observed=False)), "", "")
        return self.gw.owner + "|" + rec.to_json()

    def _finish(self, facts: Facts) -> UsageRecord | None:
        """Release the slot and record the request once, as ``billing_outcome`` decides (a request billed
        nothing still goes to the usage log, at cost 0): the record, or None when it was recorded before."""
        if self.finished:
            return None
        self.finished = True
        adm = self.admission
        if adm is None or adm.identity is None or self.prepared is None:
            return None
        ident = adm.identity
        o = decide(facts)
        record = self._record(o, ident.org_id, ident.key_id)
        if o.billed and self.endpoint is not None:
            account(record, self.endpoint)
        self.finishing = (ident.org_id, record, False)
        return record

    async def send_finish(self) -> None:
        """Hand the decided release and usage record to Redis.  The stream loop calls this right after
        it has sent the answer that carried the decision, so the Redis round trip is not part of the
        client's wait; ``close`` calls it too, so nothing decided is ever left behind."""
        pending, self.finishing = self.finishing, None
        if pending is not None:
            await self.gw.finish(pending[0], self.request_id, pending[1], pending[2])

