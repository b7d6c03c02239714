"""Finishes Redis did not take, kept on local disk until it does: a served request's record and release
must reach Redis (and through it PostgreSQL) even when Redis is away longer than this process lives.

A finish that fails is written here (one small JSON file per request, in the state directory's
``spool/``), retried in the background, and its file removed once Redis took it; a process that starts
replays every file it finds (another process's too: a finish is idempotent - the in-flight journal entry
and the usage record's primary key make a repeat count once).  ``NoSpool`` keeps nothing (tests, tools).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.decisions import UsageRecord

log = logging.getLogger("extproc")


@dataclass(frozen=True, slots=True)
class PendingFinish:
    org_id: str
    request_id: str
    record: UsageRecord | None
    refused: bool = False
    first_only: bool = False

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "record": None if self.record is None else asdict(self.record)})

    @classmethod
    def from_json(cls, text: str) -> "PendingFinish":
        doc: dict[str, Any] = json.loads(text)
        rec = doc.pop("record")
        return cls(**doc, record=None if rec is None else UsageRecord(**rec))


class Spool:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def _path(self, request_id: str) -> Path:
        return self.dir / ("".join(c if c.isalnum() or c in "-_" else "_" for c in request_id) + ".json")

    def keep(self, p: PendingFinish) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.dir / f".{os.getpid()}.tmp"
            tmp.write_text(p.to_json())
            os.replace(tmp, self._path(p.request_id))
        except OSError as e:  # a full or read-only disk: the retry in memory goes on
            log.error("finish not kept on disk (%s): retried in memory only", type(e).__name__,
                      extra={"request_id": p.request_id})

    def done(self, request_id: str) -> None:
        self._path(request_id).unlink(missing_ok=True)

    def pending(self) -> list[PendingFinish]:
        """Every finish kept here (by this process or one before it)."""
        out = []
        for f in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                out.append(PendingFinish.from_json(f.read_text()))
            except (OSError, ValueError, TypeError, KeyError):
                log.error("spool file %s unreadable: left in place", f.name)
        return out


class NoSpool(Spool):
    """Keeps nothing: the retry in memory only."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent-spool"))

    def keep(self, p: PendingFinish) -> None:
        return

    def done(self, request_id: str) -> None:
        return

    def pending(self) -> list[PendingFinish]:
        return []
