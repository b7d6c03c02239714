"""vLLM-format error bodies."""

from __future__ import annotations

import json
from http import HTTPStatus

_TYPES: dict[int, str] = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    403: "ForbiddenError",
    404: "NotFoundError",
    408: "RequestTimeoutError",
    413: "RequestEntityTooLargeError",
    422: "UnprocessableEntity",
    429: "TooManyRequestsError",
}


class SimError(Exception):
    """An error reply: HTTP ``status`` with a vLLM-format body carrying ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_type(status: int) -> str:
    """vLLM's ``error.type`` for an HTTP status."""
    if status in _TYPES:
        return _TYPES[status]
    if status >= 500:
        return "InternalServerError"
    try:
        return HTTPStatus(status).phrase.replace(" ", "").replace("-", "") + "Error"
    except ValueError:
        return "BadRequestError"


def error_body(status: int, message: str) -> bytes:
    """``{"error": {"message", "type", "param": null, "code": status}}`` as bytes."""
    doc = {"error": {"message": message, "type": error_type(status), "param": None, "code": status}}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
