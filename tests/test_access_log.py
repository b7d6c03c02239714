"""extproc/access_log.py alone: Envoy's access-log entries of requests whose client went away, or that
Envoy answered itself, mark them; other entries do not; a Redis that fails one mark (down, or hung past
its timeout) loses that mark only."""
from __future__ import annotations

import asyncio

from envoy.data.accesslog.v3 import accesslog_pb2 as al
from envoy.service.accesslog.v3 import als_pb2

from extproc.access_log import ClientsLeft
from extproc.billing_outcome import ANSWERED, LEFT
from extproc_fakes import FakeCall


def _entry(request_id: str, *, left: bool, details: str = "via_upstream") -> al.HTTPAccessLogEntry:
    e = al.HTTPAccessLogEntry()
    e.request.request_id = request_id
    e.common_properties.response_flags.downstream_connection_termination = left
    e.response.response_code_details = details
    return e


class Marks:
    def __init__(self, failing: set[str]) -> None:
        self.failing, self.marked, self.how = failing, [], {}  # type: tuple[set[str], list[str], dict[str, str]]

    async def mark_ended(self, request_id: str, how: str) -> None:
        if request_id in self.failing:
            raise TimeoutError
        self.marked.append(request_id)
        self.how[request_id] = how


def test_envoys_own_answer_in_the_ext_procs_place_is_marked_answered_and_told() -> None:
    """An entry whose reply Envoy's ext_proc filter made itself (its message timeout: the client got the
    interface's 500, whatever the ext_proc had answered) is marked ``ANSWERED``; a client that left,
    ``LEFT``; a connection Envoy closed itself, and a reply from upstream, nothing."""
    msg = als_pb2.StreamAccessLogsMessage()
    msg.http_logs.log_entry.extend([
        _entry("timeout", left=False, details="ext_proc_error_per-message_timeout_exceeded"),
        _entry("left", left=True), _entry("upstream", left=False),
        _entry("drained", left=True, details="downstream_local_disconnect(draining)")])
    told: list[tuple[str, str]] = []
    leaving = {rid: (lambda how, rid=rid: told.append((rid, how))) for rid in ("timeout", "upstream")}
    marks = Marks(failing=set())
    asyncio.run(ClientsLeft(marks, leaving).stream(FakeCall(msg)))  # type: ignore[arg-type]
    assert marks.how == {"timeout": ANSWERED, "left": LEFT}
    assert told == [("timeout", ANSWERED)] and set(leaving) == {"upstream"}


def test_only_clients_that_left_are_marked_and_a_failed_mark_loses_only_itself() -> None:
    msg = als_pb2.StreamAccessLogsMessage()
    msg.http_logs.log_entry.extend([_entry("a", left=True), _entry("b", left=False), _entry("c", left=True),
                                    _entry("d", left=True)])
    marks = Marks(failing={"c"})
    asyncio.run(ClientsLeft(marks).stream(FakeCall(msg)))  # type: ignore[arg-type]
    assert marks.marked == ["a", "d"]


def test_a_stream_watch_of_this_process_is_told_at_once_even_when_redis_fails() -> None:
    """A watch in this process (``Gateway.leaving``) is told as the entry is read, once, and no longer
    listed; an entry of a client that did not leave tells nobody; a failed Redis mark does not stop it."""
    msg = als_pb2.StreamAccessLogsMessage()
    msg.http_logs.log_entry.extend([_entry("a", left=True), _entry("b", left=False), _entry("c", left=True),
                                    _entry("a", left=True)])
    told: list[str] = []
    leaving = {rid: (lambda how, rid=rid: told.append(rid)) for rid in ("a", "b", "c", "z")}
    marks = Marks(failing={"c"})
    asyncio.run(ClientsLeft(marks, leaving).stream(FakeCall(msg)))  # type: ignore[arg-type]
    assert told == ["a", "c"] and set(leaving) == {"b", "z"}
    assert marks.marked == ["a", "a"]
