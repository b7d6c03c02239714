"""The fenced blocks of the project's documents (README.md, docs/*.md), each with the marker the line
before it carries (an HTML comment saying what the block is and how it is checked), and the rule by which
a sample of output matches what a command really printed."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_MARKER = re.compile(r"<!-- (.*?) -->")


@dataclass(frozen=True)
class Block:
    document: str
    line: int     # of the opening fence, 1-based
    marker: str   # the comment before the block, "" when there is none
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"


def blocks(path: Path) -> list[Block]:
    out: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            start, lang = i, lines[i][3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
            m = _MARKER.fullmatch(before.strip())
            out.append(Block(str(path.relative_to(ROOT)), start + 1, m.group(1) if m else "", lang,
                             "\n".join(lines[start + 1:end])))
            i = end + 1
        else:
            i += 1
    return out


def all_blocks() -> list[Block]:
    return [b for d in DOCUMENTS for b in blocks(d)]


def marked(prefix: str) -> list[Block]:
    return [b for b in all_blocks() if b.marker.startswith(prefix)]


def sample_matches(sample: str, output: str) -> list[str]:
    """The lines of ``sample`` that match no line of ``output`` (``…`` in a sample line stands for any text;
    leading and trailing blanks are not compared)."""
    got = [ln.strip() for ln in output.splitlines()]
    missing = []
    for line in (ln.strip() for ln in sample.splitlines() if ln.strip()):
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("…")))
        if not any(pattern.fullmatch(g) for g in got):
            missing.append(line)
    return missing
