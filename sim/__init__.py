"""A stand-in for a vLLM OpenAI-compatible model server (tests and demos).

Run ``python -m sim --port 9000 --chat-model NAME[@CTX] --embed-model NAME[@CTX]``
or embed it with :func:`make_app`.  See :mod:`sim.tokens` for the token
counting rule and :mod:`sim.knobs` for the per-request ``"sim"`` knobs.
"""

from __future__ import annotations

from .app import Simulator, make_app
from .cli import main, parse_model_spec

__all__ = ["Simulator", "make_app", "main", "parse_model_spec"]
