"""Small typed values that policies return and the exchange acts on."""
from __future__ import annotations

from json.encoder import encode_basestring_ascii as _q  # C: a JSON string literal, ASCII
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from .errors import ApiError


@dataclass(frozen=True, slots=True)
class Identity:
    key_id: str
    org_id: str


@dataclass(frozen=True, slots=True)
class Admission:
    """The one answer of the way-in Redis script: who is calling and whether they may proceed."""

    identity: Identity | None
    error: ApiError | None
    # the aliases the key may use (None: every one); told by an authentication-only admission (the model list)
    aliases: tuple[str, ...] | None = None

    @property
    def admitted(self) -> bool:
        return self.error is None and self.identity is not None


def _column(pg_type: str, **default: Any) -> Any:
    """A field of the usage record and its column in PostgreSQL's ``usage_records`` (control/schema.py), of
    type ``pg_type``: a ``timestamptz`` travels as epoch seconds, ``int | None`` is a nullable column, and
    a text whose default is "" is NULL when empty (tests/test_usage_record.py holds them to the table)."""
    return field(metadata={"pg_type": pg_type}, **default)


@dataclass(slots=True)  # not frozen: a frozen dataclass costs 7x as much to build, twice per request
class UsageRecord:
    """Metadata of one request: never any text.  Treated as immutable.  The one definition of the record:
    its JSON (``to_json``, queued in Redis and spooled on disk), the usage writer's SQL
    (extproc/usage_writer.py), the operator's and the console's usage columns are derived from its fields;
    a new field goes last, with a default, so that records queued by an older version still read."""

    request_id: str = _column("text")
    org_id: str = _column("text")
    key_id: str = _column("text")
    alias: str = _column("text")
    upstream_model: str = _column("text")
    endpoint: str = _column("text")
    status: int = _column("integer")
    stream: bool = _column("boolean")
    prompt_tokens: int = _column("integer")
    completion_tokens: int = _column("integer")
    estimated: bool = _column("boolean")
    cost_micro_pln: int = _column("bigint")
    input_price: int = _column("bigint")
    output_price: int = _column("bigint")
    started_at: float = _column("timestamptz")
    ttfb_ms: int | None = _column("integer")
    ended_at: float = _column("timestamptz")
    error_code: str = _column("text", default="")  # The interface's error code of what the client got ("" when none); refusals cost 0

    def to_json(self) -> str:
        """``json.dumps`` of the fields, compact (tests/test_decisions.py holds the two to the same bytes),
        at a third of its cost: twice per request.  Written from the fields below (``_json_writer``)."""
        return _to_json(self)


_B = {True: "true", False: "false"}

# how a field of each type is written into JSON, as an f-string replacement field of record ``r``
_JSON_OF = {"str": "{_q(r.%s)}", "int": "{r.%s:d}", "bool": "{_B[r.%s]}", "float": "{r.%s!r}",
            "int | None": '{"null" if r.%s is None else int(r.%s)}'}


def _json_writer(cls: type) -> Callable[[Any], str]:
    """``cls``'s compact JSON as one f-string of its fields, compiled once (as ``dataclasses`` writes
    ``__init__``): the fields in order, each written by its type (``_JSON_OF``)."""
    parts = []
    for f in fields(cls):
        assert f.name.isidentifier() and f.type in _JSON_OF, f  # names and types of our own, no input
        parts.append('"%s":' % f.name + _JSON_OF[str(f.type)].replace("%s", f.name))
    source = "lambda r: f'{{" + ",".join(parts) + "}}'"
    writer: Callable[[Any], str] = eval(source, {"_q": _q, "_B": _B})  # noqa: S307 - our own fields' names only
    return writer


_to_json = _json_writer(UsageRecord)
