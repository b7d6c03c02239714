"""The endpoints the gateway serves, one record each, registered in ``REGISTRY``.

An ``Endpoint`` is everything that differs from one endpoint to another: its path, the capability an
alias needs for it, how its request is prepared (``rules``), how a successful reply is rewritten and its
usage read (``responses``), what a complete reply without usage is billed, and how a streamed reply is
metered (``sse``).  The registry drives the exchange (which endpoint a path is), the stream watch (which
meter and endpoint a handed-over stream has), the catalog's capabilities (``catalog``) and the Envoy
routes (control/envoy_config.py renders two per endpoint).  docs/adding-an-endpoint.md says what a new
one takes.  Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from .catalog_types import Alias, Catalog
from .errors import ApiError
from .responses import Reply, rewrite_body, with_estimated_usage
from .rules import CHAT, EMBEDDINGS, Prepared, prepare_chat, prepare_embeddings
from .sse import StreamMeter

# the upstream model of an alias for this request (None: none in force)
Pick = Callable[[Alias], str | None]
# the request body -> the request to forward (and what billing needs of it), or the refusal
Prepare = Callable[[bytes, Catalog, Pick], Prepared | ApiError]
# a successful reply, the upstream model and the alias -> the reply for the client, cut around the usage
# it reports (``Reply.body`` puts the request's cost in it)
Rewrite = Callable[[bytes, str, str], Reply]
# a complete reply that reports no usage, the estimated input -> the reply with the usage it is billed,
# the output tokens estimated
Estimate = Callable[[bytes, int], tuple[Reply, int]]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint (modelled on Envoy AI Gateway's endpoint specs: one value per path)."""

    name: str  # the usage log's ``endpoint``, the metrics' label and the Envoy routes' name
    path: str  # POST only
    capability: str  # what an alias lists in the catalog to be served here
    prepare: Prepare
    rewrite: Rewrite
    estimate: Estimate
    input_param: str  # the request field a model server's refusal of the input names (docs/interface.md, section 7)
    bills_output: bool  # whether output tokens are billed (embeddings: input only)
    meter: Callable[[], StreamMeter] = StreamMeter  # a streamed reply's (a request ``prepare`` lets stream)


@dataclass(frozen=True)
class Registry:
    """The endpoints served, by path and by name."""

    endpoints: tuple[Endpoint, ...]
    by_path: dict[str, Endpoint] = field(init=False, repr=False, compare=False)
    by_name: dict[str, Endpoint] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_path = {e.path: e for e in self.endpoints}
        by_name = {e.name: e for e in self.endpoints}
        if len(by_path) != len(self.endpoints) or len(by_name) != len(self.endpoints):
            raise ValueError("two endpoints share a path or a name")
        object.__setattr__(self, "by_path", by_path)
        object.__setattr__(self, "by_name", by_name)

    def __iter__(self) -> Iterator[Endpoint]:
        return iter(self.endpoints)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(e.capability for e in self.endpoints)

    def with_endpoint(self, endpoint: Endpoint) -> Registry:
        return Registry((*self.endpoints, endpoint))


def _chat_reply(body: bytes, upstream_model: str, alias: str) -> Reply:
    return rewrite_body(body, upstream_model, alias)


def _chat_estimate(body: bytes, prompt_tokens: int) -> tuple[Reply, int]:
    return with_estimated_usage(body, prompt_tokens)


def _embeddings_reply(body: bytes, upstream_model: str, alias: str) -> Reply:
    return rewrite_body(body, upstream_model, alias, embeddings=True)


def _embeddings_estimate(body: bytes, prompt_tokens: int) -> tuple[Reply, int]:
    return with_estimated_usage(body, prompt_tokens, embeddings=True)


CHAT_COMPLETIONS = Endpoint(name=CHAT, path="/v1/chat/completions", capability=CHAT, prepare=prepare_chat,
                            rewrite=_chat_reply, estimate=_chat_estimate, input_param="messages",
                            bills_output=True)
EMBEDDINGS_ENDPOINT = Endpoint(name=EMBEDDINGS, path="/v1/embeddings", capability=EMBEDDINGS,
                               prepare=prepare_embeddings, rewrite=_embeddings_reply,
                               estimate=_embeddings_estimate, input_param="input", bills_output=False)

REGISTRY = Registry((CHAT_COMPLETIONS, EMBEDDINGS_ENDPOINT))
