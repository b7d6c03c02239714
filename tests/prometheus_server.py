"""Debian's Prometheus (/usr/bin/prometheus) scraping a running stack the way production does
(deploy/k8s: every ext_proc worker's metrics port, where Envoy's own statistics are served beside the
ext_proc's, and the usage writer's), with the alert rules of deploy/prometheus/alerts.yaml loaded.  Runs
as any user: its configuration and storage are in a temporary directory, its listener on a free port."""
from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import yaml

from conftest import process
from control import ports
from control.settings import Settings
from free_ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = Path("/usr/bin/prometheus")
PROMTOOL = Path("/usr/bin/promtool")
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
SCRAPE_CONFIG = ALERTS.with_name("prometheus.yml")
SCRAPE_S = 1.0
MISSING = (f"{PROMETHEUS} or {PROMTOOL} is missing (Debian's prometheus package; `make prometheus`, which "
           "`make test` runs, installs it where apt-get is available)")


def installed() -> bool:
    return PROMETHEUS.exists() and PROMTOOL.exists()


def scrape_config(s: Settings) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with its targets moved to the stack's metrics endpoints, scraped
    every second (its jobs and rules as they are)."""
    doc = dict(yaml.safe_load(SCRAPE_CONFIG.read_text()))
    targets = {"gateway": [f"127.0.0.1:{metrics}" for _, _, metrics in ports.extproc_workers(s)],
               "usage-writer": [f"127.0.0.1:{s.writer_metrics_http_port}"]}
    assert [j["job_name"] for j in doc["scrape_configs"]] == list(targets), "the jobs the rules name"
    for job in doc["scrape_configs"]:
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
    interval = f"{SCRAPE_S:g}s"
    doc["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
    doc["rule_files"] = [str(SCRAPE_CONFIG.parent / f) for f in doc["rule_files"]]
    assert doc["rule_files"] == [str(ALERTS)]
    return doc


class Prometheus:
    """Prometheus' HTTP API (/api/v1) of a running server."""

    def __init__(self, url: str, jobs: list[str]) -> None:
        self.url = url
        self.jobs = jobs
        self.http = httpx.Client(base_url=url + "/api/v1", timeout=10)

    def _get(self, path: str, **params: Any) -> Any:
        r = self.http.get(path, params=params)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path} {params}: {r.status_code} {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        data = self._get("/query", query=expr)
        assert data["resultType"] == "vector", data["resultType"]
        return list(data["result"])

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self._get("/rules")["groups"] for r in g["rules"]]

    def scrapes_of(self, job: str) -> float:
        """How many times every target of ``job`` has been scraped so far (the least of them)."""
        found = self.query(f'min(count_over_time(up{{job="{job}"}}[1h]))')
        return float(found[0]["value"][1]) if found else 0.0

    def wait_scrapes(self, n: int, timeout: float = 30.0) -> None:
        """Until every target of every job has been scraped ``n`` more times, and successfully (``up``
        is 1).  Prometheus starts scraping some seconds after it starts (its target discovery)."""
        start = {job: self.scrapes_of(job) for job in self.jobs}
        deadline = time.monotonic() + timeout
        while any(self.scrapes_of(job) < start[job] + n for job in self.jobs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prometheus did not scrape {self.jobs} {n} times in {timeout} s")
            time.sleep(SCRAPE_S / 4)
        down = self.query("up == 0")
        assert not down, f"targets down: {[d['metric'] for d in down]}"


def finite(samples: list[dict[str, Any]]) -> list[float]:
    """The finite values of an instant-query result (histogram_quantile of no observations is NaN)."""
    values = [float(s["value"][1]) for s in samples]
    return [v for v in values if math.isfinite(v)]



def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def running_prometheus(s: Settings) -> Iterator[Prometheus]:
    """A Prometheus of its own scraping the stack of ``s``, stopped on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="prometheus-"))
    doc = scrape_config(s)
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(doc))
    url = f"http://127.0.0.1:{free_port()}"
    argv = [str(PROMETHEUS), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address={url.removeprefix('http://')}", "--log.level=warn"]
    try:
        with process(argv, tmp / "log", lambda: _ready(url)):
            prom = Prometheus(url, [job["job_name"] for job in doc["scrape_configs"]])
            try:
                yield prom
            finally:
                prom.http.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
