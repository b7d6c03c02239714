"""docs/interface.md section 7 as data: every client-visible error code, its HTTP status and type, and every message the
gateway gives with one, whichever part answers (the ext_proc, or Envoy's own replies: control/envoy_config.py
renders envoy/envoy.yaml's ``local_reply_config`` bodies from the constants here).  This is the only place a
message is written; tests/test_errors_home.py fails if one appears anywhere else.

Pure: no I/O.  ``ApiError`` is the one value every rule returns to reject a request.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

# code -> (HTTP status, type)
TABLE: dict[str, tuple[int, str]] = {
    "invalid_json": (400, "invalid_request_error"),
    "invalid_request": (400, "invalid_request_error"),
    "context_length_exceeded": (400, "invalid_request_error"),
    "invalid_api_key": (401, "authentication_error"),
    "insufficient_quota": (402, "insufficient_quota"),
    "org_suspended": (403, "permission_error"),
    "model_not_found": (404, "invalid_request_error"),
    "unsupported_endpoint": (404, "invalid_request_error"),
    "rate_limit_exceeded": (429, "rate_limit_error"),
    "concurrency_limit_exceeded": (429, "rate_limit_error"),
    "internal_error": (500, "server_error"),
    "no_capacity": (503, "server_error"),
    "upstream_unavailable": (502, "upstream_error"),
    "upstream_timeout": (502, "upstream_error"),
}


@dataclass(frozen=True, slots=True)
class ApiError:
    """A rejection with the interface's code; ``message`` never quotes request or reply text."""

    code: str
    message: str
    param: str | None = None
    retry_after: int | None = None
    # the alias a refused request named, where the refusal came after it was found: a key allowed other
    # aliases only is told model_not_found instead (extproc/exchange.py), not that the alias exists
    alias: str | None = field(default=None, compare=False)

    @property
    def status(self) -> int:
        return TABLE[self.code][0]

    @property
    def type(self) -> str:
        return TABLE[self.code][1]

    def body(self, request_id: str) -> bytes:
        return json.dumps({"error": {"message": self.message, "type": self.type, "code": self.code,
                                     "param": self.param, "request_id": request_id}}, separators=(",", ":")).encode()


def naming(err: ApiError, alias: str) -> ApiError:
    """``err`` for a request that named ``alias``."""
    return replace(err, alias=alias)


def _invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError("invalid_request", message, param)


# ---- the request (HTTP) itself; Envoy answers most of these ----
UNSUPPORTED_ENDPOINT = ApiError("unsupported_endpoint", "This endpoint or method is not offered by the service.")
BODY_TOO_LARGE = _invalid("The request body is larger than the size limit.")
MALFORMED_REQUEST = _invalid("The HTTP request is malformed.")
HEADERS_TIMEOUT = _invalid("The request headers did not arrive in time.")

# ---- the caller ----
INVALID_KEY = ApiError("invalid_api_key", "Invalid API key.")
SUSPENDED = ApiError("org_suspended", "The organisation is suspended.")
QUOTA = ApiError("insufficient_quota", "The organisation's prepaid balance is exhausted; top up to continue.")
QUOTA_HELD = ApiError("insufficient_quota", "The organisation's prepaid balance is exhausted, or held by its "
                      "requests in flight; top up to continue.")
CONCURRENCY = ApiError("concurrency_limit_exceeded", "Too many concurrent requests for this organisation.",
                       retry_after=1)


def rate_limited(retry_after: int) -> ApiError:
    return ApiError("rate_limit_exceeded", "Too many requests for this API key; retry after the window resets.",
                    retry_after=retry_after)


def over_balance(cost_pln: str, available_pln: str, fits: int | None, choices: int) -> ApiError:
    """402 for a request whose worst case (``cost_pln``) is more than ``available_pln``: ``fits`` is the
    largest max_tokens that would fit (0: not even 1; None: the request has no max_tokens)."""
    head = (f"This request could cost up to {cost_pln} PLN, more than the organisation's available balance "
            f"of {available_pln} PLN")
    if fits is None:
        return ApiError("insufficient_quota", head + "; send less input, or top up to continue.")
    if fits < 1:
        return ApiError("insufficient_quota", head + ", even with max_tokens 1; top up to continue.")
    with_n = f" with n = {choices}" if choices > 1 else ""
    return ApiError("insufficient_quota", head + f"; the largest max_tokens it allows{with_n} is {fits}. "
                    "Ask for fewer tokens, or top up to continue.")


def key_limit_reached(limit_micro: int) -> ApiError:
    """402 for a key whose spend this month (with its requests in flight) reached its monthly limit."""
    return ApiError("insufficient_quota", f"This API key has reached its monthly spending limit of "
                    f"{_pln(limit_micro)} PLN; an owner of the organisation can raise it, or it starts again "
                    "on the 1st of next month (Europe/Warsaw).")


def over_key_limit(cost_pln: str, left_pln: str, limit_micro: int, fits: int | None, choices: int) -> ApiError:
    """402 for a request whose worst case (``cost_pln``) is more than what is left (``left_pln``) of its
    key's monthly spending limit; ``fits`` as for ``over_balance``."""
    head = (f"This request could cost up to {cost_pln} PLN, more than the {left_pln} PLN left this month of "
            f"this API key's monthly spending limit of {_pln(limit_micro)} PLN")
    if fits is None:
        return ApiError("insufficient_quota", head + "; send less input, or ask an owner to raise the limit.")
    if fits < 1:
        return ApiError("insufficient_quota", head + ", even with max_tokens 1; ask an owner to raise the limit.")
    with_n = f" with n = {choices}" if choices > 1 else ""
    return ApiError("insufficient_quota", head + f"; the largest max_tokens it allows{with_n} is {fits}. "
                    "Ask for fewer tokens, or ask an owner to raise the limit.")


def _pln(micro: int) -> str:
    """An amount as the messages name it: PLN with two decimals, more only where it has them."""
    whole, fraction = divmod(micro, 1_000_000)
    digits = f"{fraction:06d}".rstrip("0")
    return f"{whole}.{digits.ljust(2, '0')}"


# ---- the request body (core/rules.py) ----
INVALID_JSON = ApiError("invalid_json", "The request body is not valid JSON.")
NOT_AN_OBJECT = _invalid("The request body must be a JSON object.")
# a number such as 1e400 is valid JSON, but parses to infinity, which JSON cannot write
NUMBER_OUT_OF_RANGE = _invalid("A number in the request body is beyond the range of a 64-bit floating-point number.")
# Python's guard against the quadratic cost of converting huge integers (sys.get_int_max_str_digits())
TOO_MANY_DIGITS = _invalid("An integer in the request body has more than 4,300 digits.")
LONE_SURROGATE = _invalid("The request body contains a lone UTF-16 surrogate (a \\ud800-\\udfff escape not part "
                          "of a pair), which is not text.")


def too_deep(levels: int) -> ApiError:
    return ApiError("invalid_json", f"The request body nests arrays and objects deeper than {levels} levels.")


MODEL_REQUIRED = _invalid("The 'model' field is required.", "model")
MODEL_NOT_A_STRING = _invalid("The 'model' field must be a string.", "model")
MODEL_NOT_FOUND = ApiError("model_not_found", "The requested model does not exist.", "model")
MESSAGES_REQUIRED = _invalid("'messages' must be a non-empty array.", "messages")
MESSAGE_ROLE = _invalid("Each message must be an object with a valid 'role'.", "messages")
STREAM_NOT_A_BOOLEAN = _invalid("'stream' must be a boolean.", "stream")
STREAM_OPTIONS_NOT_AN_OBJECT = _invalid("'stream_options' must be an object.", "stream_options")
INCLUDE_USAGE_NOT_A_BOOLEAN = _invalid("'stream_options.include_usage' must be a boolean.", "stream_options")
TOKEN_INPUT = _invalid("Pre-tokenized (integer) input is not accepted; send strings.", "input")
INPUT_REQUIRED = _invalid("'input' must be a string or a non-empty array of strings.", "input")
ENCODING_FORMAT = _invalid("'encoding_format' must be 'float' or 'base64'.", "encoding_format")


def wrong_capability(what: str) -> ApiError:
    """``what``: what the alias was asked for (chat completions, embeddings)."""
    return _invalid(f"This model does not support {what}.", "model")


def not_a_positive_integer(name: str) -> ApiError:
    """``name``: one of the request's own field names (max_tokens, max_completion_tokens), never its value."""
    return _invalid(f"'{name}' must be an integer >= 1.", name)


# ---- the model server's reply (core/responses.py) and the gateway ----
def context_length_exceeded(input_param: str) -> ApiError:
    return ApiError("context_length_exceeded", "The input is longer than the model's context length.", input_param)


def text_only(input_param: str) -> ApiError:
    return _invalid("This model accepts text content only.", input_param)


def upstream_rejected(param: str | None) -> ApiError:
    """The model server refused a field; ``param``: its name as the model server gave it, never a value."""
    return _invalid("The model server rejected the request" + (f" (parameter '{param}')." if param else "."), param)


INTERNAL_ERROR = ApiError("internal_error", "The gateway failed unexpectedly; retry with backoff.")
NO_CAPACITY = ApiError("no_capacity", "No capacity for this model right now; retry with backoff.")
UPSTREAM_TIMEOUT = ApiError("upstream_timeout", "The model server timed out; retry with backoff.")
UPSTREAM_FAILED = ApiError("upstream_unavailable", "The model server could not complete the request; retry with backoff.")
REPLY_TOO_LARGE = ApiError("upstream_unavailable",
                           "The reply of the model server is larger than the 64 MiB that can be relayed.")
