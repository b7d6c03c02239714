"""Command line: ``python -m sim --port 9000 --chat-model NAME[@CTX] ...``."""

from __future__ import annotations

import argparse
import functools
import os
import ssl

from aiohttp import web

from .app import make_app

DEFAULT_CTX = 8192


def parse_model_spec(spec: str) -> tuple[str, int]:
    """``"name@4096"`` → ``("name", 4096)``; ``"name"`` → ``("name", 8192)``."""
    name, sep, ctx = spec.rpartition("@")
    if sep and name and ctx.isdigit() and int(ctx) > 0:
        return name, int(ctx)
    if not spec:
        raise argparse.ArgumentTypeError("empty model name")
    return spec, DEFAULT_CTX


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim", description="Simulated vLLM OpenAI-compatible server.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", default="sim", help="deployment name reported in the records")
    p.add_argument("--chat-model", action="append", default=[], type=parse_model_spec, metavar="NAME[@CTX]")
    p.add_argument("--embed-model", action="append", default=[], type=parse_model_spec, metavar="NAME[@CTX]")
    p.add_argument("--api-key-env", metavar="VAR",
                   help="like vLLM's --api-key: /v1 requests need 'Authorization: Bearer' the value of VAR")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    return p


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` and serve until SIGINT/SIGTERM."""
    parser = _parser()
    args = parser.parse_args(argv)
    chat = dict(args.chat_model)
    embed = dict(args.embed_model)
    if not chat and not embed:
        parser.error("at least one --chat-model or --embed-model is required")
    if both := set(chat) & set(embed):
        parser.error(f"model(s) both chat and embed: {', '.join(sorted(both))}")
    api_key = None
    if args.api_key_env:
        if not (api_key := os.environ.get(args.api_key_env)):
            parser.error(f"--api-key-env: {args.api_key_env} is not set")
    ssl_context = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            parser.error("--tls-cert and --tls-key go together")
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(args.tls_cert, args.tls_key)
    app = make_app(args.name, chat, embed, api_key)
    web.run_app(app, host=args.host, port=args.port, print=functools.partial(print, flush=True), access_log=None,
                ssl_context=ssl_context)
