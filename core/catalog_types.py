"""The catalog's values: aliases (capabilities, limits, prices and upstream models, each with effective
times), upstream models and their deployments.  Pure data and the choices made from it; ``catalog`` loads
and checks them from YAML.
"""
from __future__ import annotations

import bisect
import random
from itertools import accumulate
from dataclasses import dataclass, field
from typing import Any

from .cost import Prices


class CatalogError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class PriceStep:
    effective: int  # unix seconds
    prices: Prices


@dataclass(frozen=True, slots=True)
class Upstream:
    model: str
    share: int


@dataclass(frozen=True, slots=True)
class UpstreamStep:
    """The upstream models behind an alias (with traffic shares) from ``effective`` on (unix seconds;
    ``ALWAYS``: the alias's plain ``upstreams``, in force since always)."""
    effective: int
    upstreams: tuple[Upstream, ...]


ALWAYS = -(2 ** 62)


@dataclass(frozen=True, slots=True)
class Deployment:
    name: str
    host: str
    port: int  # 0 when the catalog gives ``port_offset`` instead
    # The name of an environment variable holding the bearer key the gateway sends this model server
    # (the key itself is never in the catalog); Envoy reads it from its own environment.
    api_key_env: str | None = None
    tls: bool = False  # TLS to the model server, its certificate verified
    ca_file: str | None = None  # the CAs to verify it with (default: the system's bundle)
    sni: str | None = None  # the server name to ask for and verify (default: host, unless an address)
    # the port relative to GATEWAY_PORT (the embedded simulators': every stack on a machine its own)
    port_offset: int | None = None

    def port_at(self, gateway_port: int) -> int:
        """The port to reach it on, for the stack whose GATEWAY_PORT is ``gateway_port``."""
        return self.port if self.port_offset is None else gateway_port + self.port_offset


@dataclass(slots=True)
class Alias:
    id: str
    capabilities: tuple[str, ...]
    context_length: int
    max_output_tokens: int
    created: int
    price_steps: tuple[PriceStep, ...]
    upstream_steps: tuple[UpstreamStep, ...]  # the first one effective ALWAYS, then by effective time
    _cums: list[list[int]] = field(default_factory=list)
    _starts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._starts = [s.effective for s in self.upstream_steps]
        self._cums = [list(accumulate(u.share for u in s.upstreams)) for s in self.upstream_steps]

    @property
    def upstreams(self) -> tuple[Upstream, ...]:
        """Every upstream model some step of the alias names (each once): the clusters and simulators
        it needs, whenever a step applies."""
        seen: dict[str, Upstream] = {}
        for s in self.upstream_steps:
            for u in s.upstreams:
                seen.setdefault(u.model, u)
        return tuple(seen.values())

    def _step(self, when: float) -> int:
        return max(bisect.bisect_right(self._starts, when) - 1, 0)

    def upstreams_at(self, when: float) -> tuple[Upstream, ...]:
        """The upstream models (with shares) in force at ``when`` (unix seconds)."""
        return self.upstream_steps[self._step(when)].upstreams

    def offered_at(self, when: float) -> bool:
        """Whether the alias is offered at ``when`` (unix seconds): from its first price's effective time
        on.  Before it, it has no price in force and is not offered (an unknown model to a client)."""
        return self.price_steps[0].effective <= when

    def prices_at(self, when: float) -> Prices:
        """The prices in force at ``when`` (unix seconds), never one before its effective time: asked
        only of an alias offered then (``offered_at``)."""
        chosen = None
        for step in self.price_steps:
            if step.effective <= when:
                chosen = step.prices
        if chosen is None:
            raise ValueError(f"alias {self.id!r} has no price in force at {when}: not offered yet")
        return chosen

    def pick_upstream(self, when: float) -> str | None:
        """An upstream model chosen by traffic share among those in force at ``when`` (a request's start);
        None when the alias has none then."""
        i = self._step(when)
        cum = self._cums[i]
        if not cum or cum[-1] <= 0:
            return None
        x = random.randrange(cum[-1])
        return self.upstream_steps[i].upstreams[bisect.bisect_right(cum, x)].model

    def scheduled(self, now: float) -> list[PriceStep]:
        """The price changes still to come (``effective`` after ``now``), soonest first."""
        return [s for s in self.price_steps if s.effective > now]

    def model_object(self, now: float) -> dict[str, Any]:
        p = self.prices_at(now)
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "service",
                "capabilities": list(self.capabilities), "context_length": self.context_length,
                "max_output_tokens": self.max_output_tokens,
                "pricing": {"input_micro_pln_per_1m": p.input, "output_micro_pln_per_1m": p.output,
                            "currency": "PLN"}}


@dataclass(slots=True)
class Catalog:
    aliases: dict[str, Alias]
    deployments: dict[str, tuple[Deployment, ...]]  # upstream model -> deployments

    @staticmethod
    def cluster_name(upstream_model: str) -> str:
        return "upstream_" + "".join(c if c.isalnum() or c in "-_." else "_" for c in upstream_model)
