"""A Redis primary, its replica and three sentinels on loopback for the tests: Debian's redis-server (and
``redis-server --sentinel``, the same package), the primary judged down after one second so that a
failover is over in a few.  ``redis_sentinels(tls=True)``: every server, sentinels too, speaks TLS only
(no plain port), replication and the sentinels' own connections included, with a certificate from a CA
made for the test (trustme)."""
from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import redis

from conftest import wait_for
from free_ports import free_port
from redis_cluster import PASSWORD, REDIS_SERVER, stop, tls_only

SERVICE = "gw-primary"


@dataclass
class Sentinels:
    redis_ports: list[int]  # the primary's first, then its replica's
    sentinel_ports: list[int]
    procs: dict[int, subprocess.Popen[bytes]]
    ca: Path | None = None  # TLS: the CA's certificate (PEM) every server's certificate is signed by

    @property
    def url(self) -> str:
        url = ("redis+sentinel://:cl%3Au%2Fst%40r@" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
               + f"/{SERVICE}")
        return url if self.ca is None else f"rediss{url[5:]}?ssl_ca_certs={self.ca}"

    def client(self, port: int, password: str | None = PASSWORD) -> redis.Redis:
        """A client of the Redis (or, ``password=None``, the sentinel) on ``port``."""
        tls = {} if self.ca is None else {"ssl": True, "ssl_ca_certs": str(self.ca)}
        return redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=2, **tls)

    def primary(self) -> int:
        """The primary's port, as the first sentinel that answers names it."""
        for port in self.sentinel_ports:
            if self.procs[port].poll() is None:
                with self.client(port, None) as s:
                    return int(s.sentinel_get_master_addr_by_name(SERVICE)[1])
        raise AssertionError("no sentinel answers")

    def kill(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait()


@contextlib.contextmanager
def redis_sentinels(tls: bool = False) -> Iterator[Sentinels]:
    d = Path(tempfile.mkdtemp(prefix="redis-sentinel-"))
    redis_ports, sentinel_ports = [free_port(), free_port()], [free_port() for _ in range(3)]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    ca: Path | None = None
    listen = "port {port}\n"
    if tls:
        ca, listen = tls_only(d)

    def start(port: int, conf: str, *extra: str) -> None:
        (d / str(port)).mkdir()
        (d / str(port) / "redis.conf").write_text(listen.format(port=port) + f"bind 127.0.0.1\ndir {d / str(port)}\n"
                                                  f"daemonize no\nloglevel notice\n{conf}")
        with (d / str(port) / "log").open("wb") as log:
            procs[port] = subprocess.Popen([str(REDIS_SERVER), str(d / str(port) / "redis.conf"), *extra],
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        auth = f"requirepass \"{PASSWORD}\"\nmasterauth \"{PASSWORD}\"\nsave \"\"\nappendonly no\n"
        start(redis_ports[0], auth)
        start(redis_ports[1], auth + f"replicaof 127.0.0.1 {redis_ports[0]}\n")
        for port in sentinel_ports:
            start(port, f"sentinel monitor {SERVICE} 127.0.0.1 {redis_ports[0]} 2\n"
                        f"sentinel auth-pass {SERVICE} {PASSWORD}\n"
                        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                        f"sentinel failover-timeout {SERVICE} 5000\n", "--sentinel")
        s = Sentinels(redis_ports, sentinel_ports, procs, ca)

        def ready() -> bool:
            try:
                with s.client(redis_ports[1]) as r:
                    if r.info("replication").get("master_link_status") != "up":
                        return False
                for port in sentinel_ports:  # each sentinel knows the replica and the other sentinels
                    with s.client(port, None) as r:
                        info = r.sentinel_master(SERVICE)
                        if int(info["num-slaves"]) < 1 or int(info["num-other-sentinels"]) < 2:
                            return False
                return True
            except redis.exceptions.ConnectionError:
                return False
        wait_for(ready, timeout=30, interval=0.1)
        yield s
    finally:
        stop(procs)
