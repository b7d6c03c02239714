"""The local SMTP server of development and tests: it accepts every message and keeps it as a file
in ``<state>/mail`` for the console's development page.  ``python -m control.console.smtp_capture``."""
from __future__ import annotations

import argparse
import asyncio
import email
import email.policy
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session


class CaptureHandler:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        data = envelope.content if isinstance(envelope.content, bytes) else str(envelope.content).encode()
        head = "".join(f"X-Envelope-To: {r}\r\n" for r in envelope.rcpt_tos).encode()
        name = f"{time.time_ns():020d}-{secrets.token_hex(4)}.eml"
        tmp = self.dir / (name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(head + data)
        tmp.rename(self.dir / name)
        return "250 Message accepted for delivery"


def read_messages(directory: Path, to: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Captured messages, newest first: to, subject, date (unix), body (text), attachments (file names)."""
    if not directory.is_dir():
        return []
    out = []
    for f in sorted(directory.glob("*.eml"), reverse=True):
        msg = email.message_from_bytes(f.read_bytes(), policy=email.policy.default)
        rcpts = [str(v).lower() for v in msg.get_all("X-Envelope-To", [])]
        if to and to.lower() not in rcpts:
            continue
        body = msg.get_body(preferencelist=("plain",))
        out.append({"id": f.stem, "to": ", ".join(rcpts), "subject": str(msg["Subject"] or ""),
                    "at": int(f.stem.split("-")[0]) / 1e9,
                    "body": body.get_content() if body is not None else "",
                    "attachments": [str(a.get_filename()) for a in msg.iter_attachments()]})
        if len(out) >= limit:
            break
    return out


async def serve(host: str, port: int, directory: Path) -> None:
    handler = CaptureHandler(directory)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(handler, hostname="capture.local"), host, port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dir", required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        asyncio.run(serve(a.host, a.port, Path(a.dir)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
