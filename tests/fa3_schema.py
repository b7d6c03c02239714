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


def made_documents(gw: Any, numbers: list[str] | None = None, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The FA(3) documents of invoices ``numbers`` (None: every invoice the stack issued) once the
    console's loop has made them all, each checked against the official schema."""
    from conftest import wait_for
    where, args = ("WHERE number = ANY($1)", [numbers]) if numbers is not None else ("", [])

    def made() -> tuple[list[dict[str, Any]]] | None:  # (rows,): none made is an answer too
        rows = gw.sql(f"SELECT number, state, xml, problem FROM ksef_documents {where} ORDER BY number", *args)
        return None if any(r["state"] == "new" for r in rows) else (rows,)
    rows: list[dict[str, Any]] = wait_for(made, timeout=timeout, interval=0.2)[0] if numbers != [] else []
    if numbers is not None:
        assert sorted(r["number"] for r in rows) == sorted(numbers), "an issued invoice has no FA(3) document"
    issued = {r["number"] for r in gw.sql("SELECT number FROM invoices")}
    assert issued <= {r["number"] for r in gw.sql("SELECT number FROM ksef_documents")}
    for r in rows:
        assert r["xml"] is not None, (r["number"], r["problem"])
        assert fa3_errors(r["xml"]) == [], r["number"]
    return rows
