"""Request policies: rules of the operator's own on who may send what, beside the interface's
(docs/interface.md).

A ``RequestPolicy`` is a function of the prepared request (``rules.Prepared``: the alias, the upstream
model, the estimated input, the output asked for, whether it streams) and the caller (``Identity``: key
and organisation ids) that admits it (None) or refuses it with one of the interface's errors
(``errors.ApiError``, docs/interface.md section 7).  The exchange runs them in the phase that validates
the request body, after its one admission round trip to Redis (which names the caller), before the
request goes upstream: a refusal costs the client no extra round trip.  None runs unless
``GATEWAY_REQUEST_POLICIES`` names it (``load``); docs/extending.md shows one.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Callable

from core.decisions import Identity
from core.errors import INTERNAL_ERROR, ApiError
from core.rules import Prepared

log = logging.getLogger("extproc")

RequestPolicy = Callable[[Prepared, Identity], ApiError | None]


@dataclass(frozen=True, slots=True)
class Policies:
    """The policies in force, in the order named: the first refusal is the answer."""

    named: tuple[tuple[str, RequestPolicy], ...] = ()

    def check(self, request: Prepared, caller: Identity) -> ApiError | None:
        for name, policy in self.named:
            try:
                refusal = policy(request, caller)
            except Exception as e:  # noqa: BLE001 - a policy's failure is the request's 500, not the process's
                log.error("request policy %s failed: %s", name, type(e).__name__)  # never its text: a prompt
                return INTERNAL_ERROR
            if refusal is not None:
                if not isinstance(refusal, ApiError):
                    log.error("request policy %s returned %s, not an ApiError or None", name,
                              type(refusal).__name__)
                    return INTERNAL_ERROR
                return refusal
        return None


NONE = Policies()


def load(names: str) -> Policies:
    """``GATEWAY_REQUEST_POLICIES``: ``module:function`` names, comma-separated (empty: none)."""
    named: list[tuple[str, RequestPolicy]] = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        module, _, function = name.partition(":")
        if not module or not function:
            raise ValueError(f"GATEWAY_REQUEST_POLICIES: {name!r} is not module:function")
        try:
            policy = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"GATEWAY_REQUEST_POLICIES: {name!r} cannot be loaded ({e})") from None
        if not callable(policy):
            raise ValueError(f"GATEWAY_REQUEST_POLICIES: {name!r} is not a function")
        named.append((name, policy))
    return Policies(tuple(named))
