"""What each part of a streamed reply's path costs: the gateway as built, and the same gateway with its
stream watch or its relay's body work taken out (measurement only: without the watch nothing bills a
stream within the cell, without the relay's body work no alias is put in), and two prototypes of billing
from the relay's own facts instead of the watch's copies (``PARTS``' last two), on the two streaming cells of
``make bench``: the 500 long streams (one event every 25 ms, ``bench/long_streams.py``) and the 64-event
burst at 64 connections (``bench/lua/``).  Bare Envoy is the long streams' reference and the minimal
ext_proc the burst's, all measured in the same run, alternated over ``--rounds`` (reversed every other
round); each figure is the median over the rounds, a ratio taken within each round first.

Per variant: the gap p99 the long streams add over bare Envoy's of the same round, Envoy's and the
ext_proc's CPU per chunk there (utime + stime from /proc over the cell, over the token events
delivered); the burst's req/s over the minimal's of the same round and the CPU per burst of each
process.  ``--variant NAME=TEMPLATE.yaml[,RELAY.lua]`` adds a gateway on another envoy/envoy.yaml
(and relay): a change to either measured against the tree in the same run.

``python -m bench.stream_parts [--rounds 5] [--streams 500] [--seconds 3] [--parts 0,1,...]
[--variant NAME=...]``; the last line printed is JSON."""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from control import envoy_config

from . import long_streams, rounds
from .harness import harness
from .relay_ab import burst
from .systems import System, start_bare, start_gateway, start_minimal

WATCH = re.compile(r"          - name: stream-watch\n.*?(?=          - name: envoy\.filters\.http\.ext_proc\n)", re.S)
# the relay's body work taken out: the stream's header is still removed, nothing else is done
NO_RELAY = 'function envoy_on_response(handle)\n  handle:headers():remove("x-gateway-stream")\nend\n'
PARTS = ("gateway", "without the watch", "without the relay's body work", "without either",
         "the relay's facts by the access log, no watch", "the relay's facts by a call at the end, no watch")
# The last two: what billing from the relay's own facts would cost, in place of the watch's copies
# (prototypes: nothing bills a stream in the cell).  The relay counts the events with content whether or
# not the client asked for usage and puts the count in Envoy's dynamic metadata whenever it changes (a
# stream that breaks keeps what it had); the facts reach the ext_proc by each relayed stream's access log
# entry, or by an asynchronous call of the relay's own (``httpCall``) when the stream ended (a method the
# ext_proc does not serve: it answers at once that it has none).
_COUNT = ("function Relay:count(block)\n  if self.show and not self.reported then",
          "function Relay:count(block)\n  if not self.reported then")
_LOOP = ("    if n > 0 then chunk:setBytes(relay:feed(chunk:getBytes(0, n))) end\n",
         "    if n > 0 then chunk:setBytes(relay:feed(chunk:getBytes(0, n))) end\n"
         "    if relay.content ~= seen then\n"
         "      seen = relay.content\n"
         '      handle:streamInfo():dynamicMetadata():set("gateway.relay", "content", seen)\n'
         "    end\n")
_LOOP_START = ("  for chunk in handle:bodyChunks() do\n", "  local seen = 0\n  for chunk in handle:bodyChunks() do\n")
_CALL = ('  meta:set("gateway.relay", "chunks", relay.chunks)\n',
         '  handle:httpCall("extproc", {[":method"] = "POST", [":path"] = "/gateway.Relay/Ended",\n'
         '    [":authority"] = "extproc", ["content-type"] = "application/grpc", ["te"] = "trailers"},\n'
         '    "\\0\\0\\0\\0\\16" .. string.format("%016d", relay.content), 1000, true)\n'
         '  meta:set("gateway.relay", "chunks", relay.chunks)\n')
_ALS = ("                - response_flag_filter: {flags: [DC, DR]}\n",
        "                - response_flag_filter: {flags: [DC, DR]}\n"
        "                - metadata_filter:\n"
        "                    matcher: {filter: gateway.relay, path: [{key: chunks}], value: {present_match: true}}\n")


def _edit(text: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        if text.count(old) != 1:
            raise RuntimeError(f"not found once in the tree's file: {old!r}")
        text = text.replace(old, new)
    return text


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--streams", type=int, default=long_streams.HEADLINE_C, help="long streams at once")
    ap.add_argument("--seconds", type=float, default=3.0, help="each burst cell")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=TEMPLATE[,RELAY]")
    ap.add_argument("--parts", default=",".join(map(str, range(len(PARTS)))),
                    help="which of PARTS to run besides the variants, by index (default: all)")
    return ap.parse_args()


def _files(tmp: Path, variants: list[str], parts: str) -> dict[str, tuple[Path, Path]]:
    """Each gateway's (Envoy template, relay)."""
    template, relay = Path(envoy_config.TEMPLATE), Path(envoy_config.SSE_RELAY)
    text = template.read_text()
    no_watch = tmp / "no-watch.yaml"
    no_watch.write_text(WATCH.sub("", text, count=1))
    if no_watch.read_text() == text:
        raise RuntimeError("the stream watch's filter was not found in envoy/envoy.yaml")
    no_relay = tmp / "no-relay.lua"
    no_relay.write_text(NO_RELAY)
    facts_relay, facts_template = tmp / "relay-facts.lua", tmp / "relay-facts.yaml"
    facts_relay.write_text(_edit(relay.read_text(), _COUNT, _LOOP_START, _LOOP))
    facts_template.write_text(_edit(no_watch.read_text(), _ALS))
    call_relay = tmp / "relay-facts-call.lua"
    call_relay.write_text(_edit(facts_relay.read_text(), _CALL))
    every = dict(zip(PARTS, ((template, relay), (no_watch, relay), (template, no_relay), (no_watch, no_relay),
                             (facts_template, facts_relay), (no_watch, call_relay))))
    out = {PARTS[int(i)]: every[PARTS[int(i)]] for i in parts.split(",") if i}
    for v in variants:
        name, _, files = v.partition("=")
        t, _, r = files.partition(",")
        out[name] = (Path(t), Path(r) if r else relay)
    return out


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main() -> None:
    args = _args()
    long_runs: dict[str, list[dict[str, Any]]] = {}
    burst_runs: dict[str, list[dict[str, Any]]] = {}
    with harness("bench-stream-parts-") as (tmp, procs, bodies, up):
        exe_up, client = long_streams.build(tmp)
        up = up._replace(long=long_streams.start_upstream(procs, tmp, exe_up))
        bare, minimal = start_bare(procs, tmp, up), start_minimal(procs, tmp, up)
        gateways: dict[str, System] = {}
        stacks = []
        tree = (envoy_config.TEMPLATE, envoy_config.SSE_RELAY)
        try:
            for name, (template, relay) in _files(tmp, args.variant, args.parts).items():
                d = tmp / _slug(name)
                d.mkdir()
                envoy_config.TEMPLATE, envoy_config.SSE_RELAY = template, relay  # read when the stack starts
                try:
                    system, stack = start_gateway(d, up)
                finally:
                    envoy_config.TEMPLATE, envoy_config.SSE_RELAY = tree
                stacks.append(stack)
                system.name, system.label = _slug(name), name
                gateways[name] = system
            systems = {"bare Envoy": bare, **gateways}
            idle = {s.name: long_streams.idle_rss(s) for s in systems.values()}
            for i in range(args.rounds):
                for name in rounds.order(list(systems), i):
                    s = systems[name]
                    r = long_streams.run_cell(s, s.port, args.streams, client, tmp, idle[s.name])
                    long_runs.setdefault(name, []).append(r)
                    print(f"round {i + 1} {name}: {args.streams} streams, gap p99 {r['gap_p99_us'] / 1000:.2f} ms, "
                          f"Envoy {r.get('envoy_cpu_us_per_chunk')} us/chunk, "
                          f"ext_proc {r.get('extproc_cpu_us_per_chunk')} us/chunk, errors {r['errors']}", flush=True)
                for name in rounds.order(["minimal", *gateways], i):
                    res = burst(minimal if name == "minimal" else gateways[name], bodies, args.seconds)
                    burst_runs.setdefault(name, []).append(res)
                    print(f"round {i + 1} {name}: burst {json.dumps(res)}", flush=True)
        finally:
            for stack in stacks:
                stack.stop()
    print(json.dumps({"rounds": args.rounds, "streams": args.streams, "long": summary(long_runs),
                      "burst": rounds.medians_vs_minimal(burst_runs)}))


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each system's medians over the rounds: gap p99, the p99 added over bare Envoy's of the same round
    (and its range), CPU per chunk, errors summed."""
    bare = runs["bare Envoy"]
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        added = [(r["gap_p99_us"] - b["gap_p99_us"]) / 1000 for r, b in zip(rs, bare)]
        row: dict[str, Any] = {"gap_p99_ms": round(statistics.median(r["gap_p99_us"] for r in rs) / 1000, 2),
                               "errors": sum(r["errors"] for r in rs)}
        if name != "bare Envoy":
            row["added_p99_ms"] = round(statistics.median(added), 2)
            row["added_p99_ms_range"] = [round(min(added), 2), round(max(added), 2)]
        for k in ("envoy_cpu_us_per_chunk", "extproc_cpu_us_per_chunk"):
            if k in rs[0]:
                row[k] = round(statistics.median(r[k] for r in rs), 1)
        out[name] = row
    return out


if __name__ == "__main__":
    main()
