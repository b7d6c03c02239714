"""Service URLs: REDIS_URL read the way redis-py reads it, and passwords masked for messages.

``parse_redis`` gives the request path's own client (core/resp.py) exactly what redis-py's
``from_url`` gives the rest of the processes, so that every process honours the same URL:

    redis://[[user]:password@]host[:port][/db][?query]      plain TCP
    rediss://[[user]:password@]host[:port][/db][?query]     TLS
    unix://[[user]:password@]/path/to/redis.sock[?db=N&password=...]
    redis+cluster://[[user]:password@]host:port[,host:port...][?query]   a Redis Cluster (its seeds)
    rediss+cluster://...                                                  the same over TLS
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?sentinel_password=...]
    rediss+sentinel://...                                                 the sentinels and the primary over TLS

A cluster's seeds are any of its nodes: the client asks one of them for the cluster's slots
(``CLUSTER SLOTS``) and follows the cluster from there.  A cluster has no database number.  A
Sentinel URL names the sentinels and the service they watch (``sentinel monitor <service> ...``); the
user and password are the Redis's, the sentinels are asked with ``sentinel_password`` when given.

User names and passwords are percent-decoded; ``?db=`` wins over the path's number; ``?username=`` and
``?password=`` are taken when the URL's authority has none.  TLS is set by redis-py's parameter names
(the defaults are redis-py's too: the certificate is verified against the system's CAs plus
``ssl_ca_certs``, and its host name checked):

    ssl_ca_certs=/ca.pem  ssl_ca_path=/dir  ssl_certfile=/client.pem  ssl_keyfile=/client.key
    ssl_password=...  ssl_cert_reqs=none|optional|required  ssl_check_hostname=true|false

Any other query parameter is refused (redis-py would let it override the gateway's own timeouts and
pool settings), as is a TLS parameter on a plain redis:// or unix:// URL.
"""
from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote, unquote, urlsplit

_TLS_PARAMS = frozenset({"ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_password",
                         "ssl_cert_reqs", "ssl_check_hostname"})
_PARAMS = frozenset({"db", "username", "password"}) | _TLS_PARAMS
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_FALSE = ("0", "F", "FALSE", "N", "NO")  # redis-py's to_bool


def mask(url: str) -> str:
    """``url`` with its password (in the authority, or a ``password``/``ssl_password`` query value)
    replaced by ``***``: for log lines and error messages.  Malformed URLs too: a password with an
    unescaped ``@``, ``/``, ``?`` or ``#`` is hidden up to the last ``@`` (more rather than less), and a
    URL whose scheme is misspelt (``postgres//user:password@host``) is masked all the same."""
    at = url.rfind("@")
    if at >= 0:
        sep = url.find("://")
        start = sep + 3 if 0 <= sep < at else 0
        colon = url.find(":", start, at)  # user:password@ (everything from the first colon on is hidden)
        if colon >= 0:
            url = url[:colon + 1] + "***" + url[at:]
    return re.sub(r"([?&\s](?:ssl_|sentinel_)?password=)[^&#\s]*", r"\1***", url)


class RedisUrlError(ValueError):
    """REDIS_URL cannot be used: the message says why (with the password masked)."""


@dataclass(frozen=True)
class Tls:
    ca_certs: str | None = None
    ca_path: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    password: str | None = field(default=None, repr=False)
    cert_reqs: ssl.VerifyMode = ssl.CERT_REQUIRED
    check_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        """Built as redis-py's SSLConnection builds it."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = self.check_hostname and self.cert_reqs != ssl.CERT_NONE
        ctx.verify_mode = self.cert_reqs
        if self.certfile or self.keyfile:
            ctx.load_cert_chain(certfile=self.certfile or "", keyfile=self.keyfile, password=self.password)
        if self.ca_certs or self.ca_path:
            ctx.load_verify_locations(cafile=self.ca_certs, capath=self.ca_path)
        return ctx


@dataclass(frozen=True)
class RedisTarget:
    """Where a Redis is and how to log in to it."""
    url: str = field(repr=False)
    host: str = "127.0.0.1"
    port: int = 6379
    unix_path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: Tls | None = None
    seeds: tuple[tuple[str, int], ...] = ()  # a cluster's nodes to start from, or the sentinels
    service: str = ""  # the service the sentinels watch ("": no Sentinel)
    sentinel_password: str | None = field(default=None, repr=False)

    @property
    def cluster(self) -> bool:
        return bool(self.seeds) and not self.service

    @property
    def sentinel(self) -> bool:
        return bool(self.service)


def _seeds(url: str, netloc: str) -> tuple[tuple[str, int], ...]:
    """host:port[,host:port...] of a cluster URL's authority (after any user:password@)."""
    out = []
    for part in netloc.rpartition("@")[2].split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = port, "6379"
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RedisUrlError(f"REDIS_URL {mask(url)}: a cluster's seeds are host:port[,host:port...]")
        out.append((host, int(port)))
    return tuple(out)


def _read_as(url: str, plain: str) -> RedisTarget:
    """``plain`` (a redis(s):// URL made of ``url``) read; an error names ``url``."""
    try:
        return parse_redis(plain)
    except RedisUrlError as e:
        raise RedisUrlError(str(e).replace(mask(plain), mask(url))) from None


def _cluster(url: str, scheme: str) -> RedisTarget:
    """A cluster URL: its seeds, and the login and TLS read as for its first seed's redis(s):// URL."""
    parts = urlsplit(url)
    seeds = _seeds(url, parts.netloc)
    if parts.path.strip("/") or "db" in parse_qs(parts.query):
        raise RedisUrlError(f"REDIS_URL {mask(url)}: a cluster has no database number")
    login = parts.netloc.rpartition("@")[0]
    host = f"[{seeds[0][0]}]" if ":" in seeds[0][0] else seeds[0][0]
    first = _read_as(url, f"{scheme}://{login + '@' if login else ''}{host}:{seeds[0][1]}"
                     + (f"?{parts.query}" if parts.query else ""))
    return RedisTarget(url, host=first.host, port=first.port, username=first.username, password=first.password,
                       tls=first.tls, seeds=seeds)


def _sentinel(url: str, scheme: str) -> RedisTarget:
    """A Sentinel URL: the sentinels, the service (the path's first part), and the login, database and TLS
    read as for a redis(s):// URL of the first sentinel with the rest of the path."""
    parts = urlsplit(url)
    sentinels = _seeds(url, parts.netloc)
    service, _, db = parts.path.strip("/").partition("/")
    if not service:
        raise RedisUrlError(f"REDIS_URL {mask(url)}: a Sentinel URL names its service: "
                            "redis+sentinel://host:port[,host:port]/service")
    query = parse_qs(parts.query, keep_blank_values=True)
    sentinel_password = query.pop("sentinel_password", [""])[0] or None
    login = parts.netloc.rpartition("@")[0]
    host = f"[{sentinels[0][0]}]" if ":" in sentinels[0][0] else sentinels[0][0]
    rest = "&".join(f"{k}={quote(v[0])}" for k, v in query.items())
    first = _read_as(url, f"{scheme}://{login + '@' if login else ''}{host}:{sentinels[0][1]}/{db}"
                     + (f"?{rest}" if rest else ""))
    return RedisTarget(url, host=first.host, port=first.port, db=first.db, username=first.username,
                       password=first.password, tls=first.tls, seeds=sentinels, service=unquote(service),
                       sentinel_password=sentinel_password)


def _bool(name: str, value: str) -> bool:
    if value == "":
        raise RedisUrlError(f"REDIS_URL: {name} has no value")
    return value.upper() not in _FALSE


def parse_redis(url: str) -> RedisTarget:
    scheme = url.partition("://")[0]
    if scheme in ("redis+cluster", "rediss+cluster"):
        return _cluster(url, scheme.partition("+")[0])
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        return _sentinel(url, scheme.partition("+")[0])
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise RedisUrlError(f"REDIS_URL {mask(url)} is not a URL: {e}") from None
    if scheme not in ("redis", "rediss", "unix"):
        raise RedisUrlError(f"REDIS_URL {mask(url)} must start with redis://, rediss://, unix:// or "
                            "redis+cluster://")
    query: dict[str, str] = {}
    for name, values in parse_qs(parts.query, keep_blank_values=True).items():
        if name not in _PARAMS:
            raise RedisUrlError(f"REDIS_URL {mask(url)}: unsupported parameter {name!r} "
                                f"(accepted: {', '.join(sorted(_PARAMS))})")
        query[name] = values[0]  # parse_qs has percent-decoded it already
    tls_given = _TLS_PARAMS & query.keys()
    if tls_given and scheme != "rediss":
        raise RedisUrlError(f"REDIS_URL {mask(url)}: {', '.join(sorted(tls_given))} needs rediss://")
    username = unquote(parts.username) if parts.username else query.get("username") or None
    password = unquote(parts.password) if parts.password else query.get("password") or None
    db = 0
    try:
        if "db" in query:
            db = int(query["db"])
        elif scheme != "unix" and parts.path.strip("/"):
            db = int(unquote(parts.path).replace("/", ""))
    except ValueError:
        raise RedisUrlError(f"REDIS_URL {mask(url)}: the database must be a number") from None
    tls = None
    if scheme == "rediss":
        reqs = query.get("ssl_cert_reqs", "required").lower()
        if reqs not in _CERT_REQS:
            raise RedisUrlError(f"REDIS_URL {mask(url)}: ssl_cert_reqs must be none, optional or required")
        tls = Tls(ca_certs=query.get("ssl_ca_certs") or None, ca_path=query.get("ssl_ca_path") or None,
                  certfile=query.get("ssl_certfile") or None, keyfile=query.get("ssl_keyfile") or None,
                  password=query.get("ssl_password") or None, cert_reqs=_CERT_REQS[reqs],
                  check_hostname=_bool("ssl_check_hostname", query.get("ssl_check_hostname", "true")))
    if scheme == "unix":
        path = unquote(parts.path)
        if not path:
            raise RedisUrlError(f"REDIS_URL {mask(url)}: unix:// needs the socket's path")
        return RedisTarget(url, unix_path=path, db=db, username=username, password=password)
    host = unquote(parts.hostname) if parts.hostname else "localhost"
    return RedisTarget(url, host=host, port=port or 6379, db=db, username=username, password=password, tls=tls)
