"""JSON-lines logging.  Records carry metadata only (request id, alias, status, tokens, durations, bytes):
never a body, a prompt, a completion, an embedding input, a key or a model server's message."""
from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii as _q  # C: a JSON string literal, ASCII
import logging
import sys
import time

# Fields a caller may attach with ``extra=``; anything else is not written.
FIELDS = ("request_id", "alias", "endpoint", "status", "code", "prompt_tokens", "completion_tokens",
          "estimated", "cost_micro_pln", "duration_ms", "ttfb_ms", "bytes_in", "bytes_out", "phase")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": _stamp(record.created),
            "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        for f in FIELDS:
            v = record.__dict__.get(f)
            if v is not None:
                doc[f] = v
        if record.exc_info:
            # the exception's type and where it was raised; its message may quote data, so it is left out
            etype, _, tb = record.exc_info
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            doc["error"] = etype.__name__ if etype else "Exception"
            if tb is not None:
                doc["at"] = f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"
        return json.dumps(doc, separators=(",", ":"))


_REQUESTS = logging.getLogger("extproc.requests")


def request_line(*, request_id: str, alias: str, endpoint: str, status: int, prompt_tokens: int,
                 completion_tokens: int, estimated: bool, cost_micro_pln: int, duration_ms: int,
                 ttfb_ms: int | None) -> None:
    """One line per request (metadata only), written without the logging machinery's per-record cost
    and formatted by hand (a third of ``json.dumps``'s cost); stdout is block-buffered when it is a
    file, so lines reach it in batches."""
    if _REQUESTS.isEnabledFor(logging.INFO):
        sys.stdout.write(
            f'{{"time":"{_stamp(time.time())}","level":"info","logger":"extproc.requests","msg":"request",'
            f'"request_id":{_q(request_id)},"alias":{_q(alias)},"endpoint":{_q(endpoint)},"status":{status:d},'
            f'"prompt_tokens":{prompt_tokens:d},"completion_tokens":{completion_tokens:d},'
            f'"estimated":{"true" if estimated else "false"},"cost_micro_pln":{cost_micro_pln:d},'
            f'"duration_ms":{duration_ms:d},"ttfb_ms":{"null" if ttfb_ms is None else int(ttfb_ms)}}}\n')


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def setup(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("grpc").setLevel(logging.WARNING)
