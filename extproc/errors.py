"""SPEC section 7 as data: every client-visible error code, its HTTP status and type.

Pure: no I/O.  ``ApiError`` is the one value every rule returns to reject a request.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

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
    """A rejection with SPEC's code; ``message`` never quotes request or reply text."""

    code: str
    message: str
    param: str | None = None
    retry_after: int | None = None

    @property
    def status(self) -> int:
        return TABLE[self.code][0]

    @property
    def type(self) -> str:
        return TABLE[self.code][1]

    def body(self, request_id: str) -> bytes:
        return json.dumps({"error": {"message": self.message, "type": self.type, "code": self.code,
                                     "param": self.param, "request_id": request_id}}, separators=(",", ":")).encode()


# the rejections given in more than one place
INTERNAL_ERROR = ApiError("internal_error", "The gateway failed unexpectedly; retry with backoff.")
MODEL_NOT_FOUND = ApiError("model_not_found", "The requested model does not exist.", "model")
NO_CAPACITY = ApiError("no_capacity", "No capacity for this model right now; retry with backoff.")
UPSTREAM_TIMEOUT = ApiError("upstream_timeout", "The model server timed out; retry with backoff.")
UPSTREAM_FAILED = ApiError("upstream_unavailable", "The model server could not complete the request; retry with backoff.")
UNSUPPORTED_ENDPOINT = ApiError("unsupported_endpoint", "This endpoint or method is not offered by the service.")
BODY_TOO_LARGE = ApiError("invalid_request", "The request body is larger than the size limit.")
