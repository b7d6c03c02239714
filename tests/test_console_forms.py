"""Every field of every console form has a visible label: the field sits inside a <label> with text
of its own, or a <label for> names it (a placeholder or an aria-label alone is not a label)."""
from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from control.console.web import HERE

TEMPLATES = sorted((HERE / "templates").glob("*.html"))
NOT_FIELDS = {"hidden", "submit", "button", "reset", "image"}


class Fields(HTMLParser):
    """The fields of a template and whether each is labelled."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: list[list[str]] = []  # the text of each <label> open around here
        self.label_for: set[str] = set()
        self.fields: list[tuple[int, str, str | None, list[str] | None]] = []  # line, name, id, its label's text so far

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "label":
            self.labels.append([])
            if a.get("for"):
                self.label_for.add(str(a["for"]))
        elif tag in ("input", "select", "textarea") and not (tag == "input" and a.get("type") in NOT_FIELDS):
            self.fields.append((self.getpos()[0], str(a.get("name")), a.get("id"),
                                self.labels[-1] if self.labels else None))

    def handle_endtag(self, tag: str) -> None:
        if tag == "label" and self.labels:
            self.labels.pop()

    def handle_data(self, data: str) -> None:
        if self.labels:
            self.labels[-1].append(data)


def unlabelled(template: Path) -> list[str]:
    p = Fields()
    p.feed(template.read_text(encoding="utf-8"))
    p.close()
    return [f"{template.name}:{line} {name}" for line, name, fid, text in p.fields
            if not (text is not None and "".join(text).strip()) and fid not in p.label_for]


def test_the_templates_have_forms() -> None:
    p = Fields()
    for t in TEMPLATES:
        p.feed(t.read_text(encoding="utf-8"))
    assert len(TEMPLATES) > 15 and len(p.fields) > 20  # the check below reads something


def test_every_field_has_a_visible_label() -> None:
    assert [f for t in TEMPLATES for f in unlabelled(t)] == []


def test_a_placeholder_alone_is_not_a_label(tmp_path: Path) -> None:
    t = tmp_path / "t.html"
    t.write_text('<form><input name="a" placeholder="x" aria-label="y"><label><input name="b"></label>'
                 '<label>B<input type="checkbox" name="c"></label><label for="d">D</label><select id="d" name="d">'
                 '</select><input type="hidden" name="csrf"></form>')
    assert unlabelled(t) == ["t.html:1 a", "t.html:1 b"]
