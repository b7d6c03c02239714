"""The official FA(3) schema (schemat_FA(3)_v1-0E.xsd with the three schemas it imports, as the Ministry
of Finance publishes them: their imports name crd.gov.pl addresses) from the copy the ksef-client wheel
ships, loaded by lxml here, apart from the library's own validation, with those addresses resolved to
the files beside it, so nothing is fetched."""
from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from lxml import etree

SCHEMAS = Path(str(resources.files("ksef_client.documents.fa3") / "schemas"))
MAIN = "schemat_FA(3)_v1-0E.xsd"


class _Beside(etree.Resolver):
    def resolve(self, url: str | None, id: str | None, context: Any) -> Any:
        name = (url or "").rsplit("/", 1)[-1]
        if (SCHEMAS / name).is_file():
            return self.resolve_filename(str(SCHEMAS / name), context)
        raise AssertionError(f"the FA(3) schema imports {url!r}, which is not shipped beside it")


@cache
def schema() -> etree.XMLSchema:
    parser = etree.XMLParser()
    parser.resolvers.add(_Beside())
    return etree.XMLSchema(etree.parse(str(SCHEMAS / MAIN), parser))


def fa3_errors(xml: bytes) -> list[str]:
    """What the official FA(3) schema says is wrong with ``xml`` (nothing: valid)."""
    s = schema()
    if s.validate(etree.fromstring(xml)):
        return []
    return [f"line {e.line}: {e.message}" for e in s.error_log]


def assert_fa3(xml: bytes) -> etree._Element:
    """``xml`` is a valid FA(3) document: its root, to read it further."""
    assert fa3_errors(xml) == []
    root = etree.fromstring(xml)
    assert root.tag == "{http://crd.gov.pl/wzor/2025/06/25/13775/}Faktura"
    return root
