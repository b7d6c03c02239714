"""A Redis Cluster on loopback for the tests: Debian's redis-server, three primaries and a replica of each
(``redis-cli --cluster create``, redis-tools comes with redis-server), a node timeout of one second so that
a killed primary's replica takes over within a few seconds.  ``redis_cluster(tls=True)``: as a managed
cluster with encryption in transit has it, TLS only (no plain port) for clients, the cluster bus and
replication, the nodes' certificate from a CA made for the test (trustme)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import redis
import trustme

from conftest import wait_for
from free_ports import free_port

REDIS_SERVER = Path("/usr/bin/redis-server")
REDIS_CLI = Path("/usr/bin/redis-cli")
PASSWORD = "cl:u/st@r"


def missing() -> str:
    return ", ".join(str(p) for p in (REDIS_SERVER, REDIS_CLI) if not os.access(p, os.X_OK))


def require_redis_server() -> None:
    """At a test module's collection: Debian's redis-server and redis-cli are there, or the module is
    skipped saying why, and under CI=true that is a collection error (CI must not pass without it)."""
    if missing():
        why = f"Debian's redis-server / redis-cli missing ({missing()}): run 'make services'"
        if os.environ.get("CI", "").lower() == "true":
            raise RuntimeError(why)
        pytest.skip(why, allow_module_level=True)


@dataclass
class Cluster:
    ports: list[int]
    procs: dict[int, subprocess.Popen[bytes]]
    ca: Path | None = None  # TLS: the CA's certificate (PEM) the nodes' certificate is signed by

    @property
    def url(self) -> str:
        seeds = "redis+cluster://:cl%3Au%2Fst%40r@" + ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return seeds if self.ca is None else f"rediss{seeds[5:]}?ssl_ca_certs={self.ca}"

    def client(self, port: int) -> redis.Redis:
        tls = {} if self.ca is None else {"ssl": True, "ssl_ca_certs": str(self.ca)}
        return redis.Redis(host="127.0.0.1", port=port, password=PASSWORD, socket_timeout=2, **tls)

    def info(self, port: int) -> dict[str, str]:
        with self.client(port) as r:
            text = r.execute_command("CLUSTER", "INFO").decode()
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def primary_of(self, slot: int) -> int:
        """The port of the primary that serves ``slot`` (as a live node sees it)."""
        live = next(p for p in self.ports if self.procs[p].poll() is None)
        with self.client(live) as r:
            for start, end, primary, *_ in r.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(primary[1])
        raise AssertionError(f"no node serves slot {slot}")

    def healthy(self) -> bool:
        return all(self.info(p).get("cluster_state") == "ok" for p in self.ports if self.procs[p].poll() is None)

    def kill(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait()


def tls_only(d: Path) -> tuple[Path, str]:
    """A CA made for the test (trustme) and a certificate of its for 127.0.0.1, written to ``d``: the CA's
    file, and the lines of a server's configuration (its port as ``{port}``) that make it speak only TLS,
    to its replicas too, without asking clients for a certificate."""
    authority = trustme.CA()
    ca = d / "ca.pem"
    authority.cert_pem.write_to_path(str(ca))
    server = authority.issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(d / "server.key"))
    server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    return ca, (f"port 0\ntls-port {{port}}\ntls-replication yes\ntls-auth-clients no\n"
                f"tls-cert-file {d / 'server.pem'}\ntls-key-file {d / 'server.key'}\ntls-ca-cert-file {ca}\n")


@contextlib.contextmanager
def redis_cluster(tls: bool = False) -> Iterator[Cluster]:
    d = Path(tempfile.mkdtemp(prefix="redis-cluster-"))
    ports = [free_port() for _ in range(6)]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    ca: Path | None = None
    listen, cli_tls = "port {port}\n", []
    if tls:
        ca, listen = tls_only(d)
        listen += "tls-cluster yes\n"
        cli_tls = ["--tls", "--cacert", str(ca)]
    try:
        for port in ports:
            (d / str(port)).mkdir()
            (d / str(port) / "redis.conf").write_text(
                listen.format(port=port)
                + f"bind 127.0.0.1\ndir {d / str(port)}\nsave \"\"\nappendonly no\ndaemonize no\n"
                f"cluster-enabled yes\ncluster-port {free_port()}\ncluster-config-file nodes.conf\n"
                f"cluster-node-timeout 1000\n"
                f"requirepass \"{PASSWORD}\"\nmasterauth \"{PASSWORD}\"\nloglevel warning\n")
            with (d / str(port) / "log").open("wb") as log:
                procs[port] = subprocess.Popen([str(REDIS_SERVER), str(d / str(port) / "redis.conf")], stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        cluster = Cluster(ports, procs, ca)
        wait_for(lambda: all(_answers(cluster, p) for p in ports), timeout=20)
        subprocess.run([str(REDIS_CLI), *cli_tls, "-a", PASSWORD, "--no-auth-warning", "--cluster", "create",
                        *(f"127.0.0.1:{p}" for p in ports), "--cluster-replicas", "1", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        wait_for(cluster.healthy, timeout=30, interval=0.1)
        # every replica in sync with its primary: a failover has something to take over
        wait_for(lambda: all(_synced(cluster, p) for p in ports), timeout=30, interval=0.1)
        yield cluster
    finally:
        stop(procs)


def _answers(cluster: Cluster, port: int) -> bool:
    try:
        with cluster.client(port) as r:
            return bool(r.ping())
    except redis.exceptions.ConnectionError:
        return False


def _synced(cluster: Cluster, port: int) -> bool:
    with cluster.client(port) as r:
        info = r.info("replication")
    return bool(info["role"] == "master" or info.get("master_link_status") == "up")


def stop(procs: dict[int, subprocess.Popen[bytes]]) -> None:
    """Every server of ``procs`` ended (SIGTERM, SIGKILL after 10 s).  Their directory, with each server's
    log, stays in the run's temporary directory, which goes when the run passed (conftest)."""
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
