"""Per-request records (counts only, never any text)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

MAX_RECORDS = 100_000


@dataclass
class Record:
    request_id: str
    deployment: str
    model: str
    endpoint: str  # "chat" | "embeddings"
    stream: bool = False
    status: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    events_sent: int = 0  # stream: events written whole (before a fail_after_chunks drop)
    usage_reported: bool = False
    completed: bool = False
    # how the request came (headers only, never a value that could be a key or text)
    content_type: str = ""
    content_length: str | None = None
    transfer_encoding: str | None = None
    body_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class RecordStore:
    """The last :data:`MAX_RECORDS` records, keyed by request id."""

    def __init__(self, limit: int = MAX_RECORDS) -> None:
        self._limit = limit
        self._records: OrderedDict[str, Record] = OrderedDict()

    def add(self, record: Record) -> None:
        self._records.pop(record.request_id, None)
        self._records[record.request_id] = record
        while len(self._records) > self._limit:
            self._records.popitem(last=False)

    def get(self, request_id: str) -> Record | None:
        return self._records.get(request_id)

    def all(self) -> list[Record]:
        return list(self._records.values())

    def clear(self) -> None:
        self._records.clear()
