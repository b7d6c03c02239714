"""The console's look, checked from its stylesheet: text colours meet WCAG AA contrast (4.5:1) where
a review found them short (the active navigation link, the footer, the "estimated" tag, muted text)."""
from __future__ import annotations

import re
from pathlib import Path

CSS = (Path(__file__).resolve().parent.parent / "control" / "console" / "static" / "console.css").read_text()


def _var(name: str) -> str:
    m = re.search(rf"--{name}:\s*(#[0-9a-fA-F]{{6}})", CSS)
    assert m, name
    return m.group(1)


def _rule(selector: str) -> dict[str, str]:
    m = re.search(re.escape(selector) + r"\s*\{([^}]*)\}", CSS)
    assert m, selector
    out = {}
    for decl in m.group(1).split(";"):
        if ":" in decl:
            k, v = decl.split(":", 1)
            v = v.strip()
            ref = re.fullmatch(r"var\(--([a-z]+)\)", v)
            out[k.strip()] = _var(ref.group(1)) if ref else v
    return out


def _luminance(hex_colour: str) -> float:
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_contrast_formula() -> None:
    assert round(contrast("#000000", "#ffffff"), 1) == 21.0 and contrast("#777777", "#ffffff") < 4.5


def test_text_colours_meet_aa() -> None:
    nav = _rule("nav a.on, nav a:hover")
    tag = _rule(".tag")
    pairs = {
        "active navigation link": (nav["color"], nav["background"]),
        "estimated tag": (tag["color"], tag["background"]),
        "footer on the page": (_rule("footer")["color"], _var("bg")),
        "muted text on a card": (_var("muted"), "#ffffff"),
        "muted text on the page": (_var("muted"), _var("bg")),
        "body text": (_var("ink"), _var("bg")),
    }
    low = {k: round(contrast(*v), 2) for k, v in pairs.items() if contrast(*v) < 4.5}
    assert not low, low
