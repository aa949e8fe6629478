"""Redis URLs (their forms, redaction of passwords; a Sentinel URL taken apart into its
sentinels, service and connection options) and the options every connection gets: timeouts,
keepalive, one resend of a command whose pooled connection had died."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
from redis.backoff import NoBackoff
from redis.connection import parse_url

from panqueue.errors import ConfigError

URL_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel",
            "rediss+sentinel")
_SENTINEL_FORM = "redis+sentinel://[user:pass@]host:port[,host:port...]/service_name[/db]"
# Sentinel's own port, for an address given without one.
_SENTINEL_PORT = 26379

# Every connection gets both timeouts (a URL's query string may override them, for example
# ?socket_timeout=30): a network that silently drops packets must end a call with an error,
# not hang it. The socket timeout must exceed the longest wait a request asks the server for:
# WAITAOF in durable adds (10 s) and the 1 s XREAD BLOCKs of result() and events().
CONNECT_TIMEOUT = 5.0
# Closing a connection is shielded from cancellation but bounded, so that a shutdown on a network
# that drops every packet still ends.
_CLOSE_TIMEOUT = 2.0
SOCKET_TIMEOUT = 15.0
# Keys asked for per SCAN call (a hint to the server).
_SCAN_COUNT = 1000



_SECRET_PARAMS = re.compile(r"((?:^|&)(?:password|ssl_password|sentinel_password)=)[^&]*",
                            re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL without its passwords (user:pass@ and ?password=), for messages and logs."""
    parts = urlsplit(url)
    netloc = parts.netloc
    # Split by hand rather than through parts.port: a Sentinel URL names several addresses.
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hosts}"
    query = _SECRET_PARAMS.sub(r"\1***", parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url  # nothing to hide
    redacted = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    if not netloc:  # unix:///path: urlunsplit would drop the empty authority
        redacted = redacted.replace(":", "://", 1)
    return redacted


def check_url(url: str) -> str:
    """Validate a URL's form (without connecting); returns it."""
    _parse(url)
    return url


def _parse(url: str) -> tuple[bool, str]:
    """Return (is_cluster, URL as redis-py understands it)."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"invalid Redis URL {url!r}: expected redis://host:port/db and friends")
    scheme = url.split("://", 1)[0].lower()
    if scheme not in URL_SCHEMES:
        raise ConfigError(
            f"invalid Redis URL {redact_url(url)!r}: scheme must be one of {', '.join(URL_SCHEMES)}"
        )
    if scheme.endswith("+cluster"):
        return True, scheme.removesuffix("+cluster") + url[len(scheme) :]
    if scheme.endswith("+sentinel"):
        _sentinel_target(url)  # checks the form
    return False, url


@dataclass(frozen=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names: the sentinels to ask, the master's service name,
    and the options of the connections to the master (credentials, db, TLS, query string) and
    to the sentinels (timeouts, TLS, ``sentinel_username``/``sentinel_password``)."""

    sentinels: list[tuple[str, int]]
    service: str
    connection: dict[str, Any] = field(default_factory=dict)
    sentinel: dict[str, Any] = field(default_factory=dict)


def _sentinel_address(url: str, address: str) -> tuple[str, int]:
    host, port_text = address, ""
    if address.startswith("["):  # [IPv6]:port
        host, _, rest = address[1:].partition("]")
        if rest and not rest.startswith(":"):
            host = ""
        port_text = rest[1:]
    elif ":" in address:
        host, _, port_text = address.rpartition(":")
    if not host:
        raise ConfigError(f"invalid Sentinel URL {redact_url(url)!r}: the sentinel address "
                          f"{address!r} has no host; expected {_SENTINEL_FORM}")
    if not port_text:
        return host, _SENTINEL_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"invalid Sentinel URL {redact_url(url)!r}: the sentinel address "
                          f"{address!r} has an invalid port (1-65535)")
    return host, int(port_text)


def _sentinel_target(url: str) -> SentinelTarget | None:
    """The sentinels, service and options a ``redis+sentinel://`` (or ``rediss+sentinel://``)
    URL names; ``None`` for any other URL. A malformed one raises :class:`ConfigError` naming
    what is wrong."""
    scheme, _, rest = url.partition("://")
    if not scheme.lower().endswith("+sentinel"):
        return None
    shown = redact_url(url)
    authority, slash, path_query = rest.partition("/")
    path, _, query = path_query.partition("?")
    if "?" in authority:  # no path at all: "host:port?x=y"
        authority, _, query = authority.partition("?")
    userinfo, at, hosts = authority.rpartition("@")
    addresses = [a.strip() for a in hosts.split(",")]
    if not hosts.strip() or any(not a for a in addresses):
        raise ConfigError(f"invalid Sentinel URL {shown!r}: it names no sentinel address "
                          f"(or an empty one between commas); expected {_SENTINEL_FORM}")
    sentinels = [_sentinel_address(url, a) for a in addresses]
    segments = path.split("/") if slash else []
    if segments and segments[-1] == "":  # a trailing slash
        segments.pop()
    if not segments or not segments[0]:
        raise ConfigError(f"invalid Sentinel URL {shown!r}: it names no service (the master's "
                          f"name in the sentinels' configuration); expected {_SENTINEL_FORM}")
    if len(segments) > 2:
        raise ConfigError(f"invalid Sentinel URL {shown!r}: the path has more than "
                          f"/service_name/db; expected {_SENTINEL_FORM}")
    service = unquote(segments[0])
    db = segments[1] if len(segments) == 2 else "0"
    if not db.isdigit():
        raise ConfigError(f"invalid Sentinel URL {shown!r}: the database {db!r} is not a "
                          f"number; expected {_SENTINEL_FORM}")
    # redis-py reads the credentials, db and query string (types and all) as for a plain URL.
    tls = scheme.lower().startswith("rediss")
    plain = f"{'rediss' if tls else 'redis'}://{userinfo}{at}sentinel/{db}"
    try:
        connection: dict[str, Any] = parse_url(  # type: ignore[no-untyped-call]
            f"{plain}?{query}" if query else plain)
    except ValueError as exc:
        raise ConfigError(f"invalid Sentinel URL {shown!r}: {exc}") from exc
    connection.pop("host", None)
    connection.pop("port", None)
    sentinel: dict[str, Any] = {}
    for name in ("username", "password"):
        value = connection.pop(f"sentinel_{name}", None)
        if value is not None:
            sentinel[name] = value
    if connection.pop("connection_class", None) is not None:  # rediss: redis-py's SSLConnection
        connection["ssl"] = True
    # The sentinels get the master's socket and TLS options, not its credentials or db.
    sentinel.update({k: v for k, v in connection.items()
                     if k.startswith(("socket_", "ssl"))})
    return SentinelTarget(sentinels, service, connection, sentinel)


# The most connections one client opens to a server. Callers past it wait for one to be free,
# up to the socket timeout: redis-py's own default (100, refusing the next caller at once with
# "Too many connections") failed a web app's 101st concurrent request. A URL's
# ``?max_connections=`` sets it. (Redis serves 10,000 clients by default.)
POOL_SIZE = 1000


def _pooled_client(pool_class: Any, client_class: Any, url: str, retry_class: Any) -> Any:
    """A client of a standalone server on a pool that makes callers wait for a connection
    rather than refusing them (:data:`POOL_SIZE`); redis-py's own ``from_url`` otherwise."""
    pool = pool_class.from_url(url, max_connections=POOL_SIZE, timeout=SOCKET_TIMEOUT,
                               **_standalone_options(url, retry_class))
    client = client_class(connection_pool=pool)
    client.auto_close_connection_pool = True  # closing the client closes its pool
    return client


def _timeouts() -> dict[str, Any]:
    return {"socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": SOCKET_TIMEOUT}


def _standalone_options(url: str, retry_class: Any) -> dict[str, Any]:
    """Connection options for standalone servers (a URL's query string may override them).

    A pooled connection the server closed while it sat idle (restart, CLIENT KILL, idle
    timeout) is replaced and the command sent again, once. The rare command that reached the
    server before its connection broke may so run twice: workers tolerate that (at-least-once,
    lock tokens), and producers that need exactly-once adds pass a ``job_id``. A timeout is
    not retried: the server may still be running the command, and the call is already late.
    """
    options: dict[str, Any] = {
        "retry": retry_class(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
        "retry_on_error": [redis.exceptions.ConnectionError],
        "health_check_interval": 30,
        **_timeouts(),
    }
    if not url.startswith("unix:"):
        options["socket_keepalive"] = True  # TCP only: unix sockets reject the option
    return options


def _sentinel_clients(target: SentinelTarget, sentinel_class: Any, retry_class: Any,
                      url: str) -> tuple[Any, Any]:
    """(the sentinels' client, a client of the master they name) of redis-py's ``sentinel``
    module (sync or asyncio, by ``sentinel_class``). The master client asks the sentinels where
    the master is whenever it opens a connection, so it follows a promotion: a connection
    that breaks, or that a demoted master answers with READONLY, is dropped, and the next one
    goes to the address the sentinels give then."""
    # One try per sentinel: asking the next sentinel is the retry (redis-py's default would
    # retry an unreachable one with backoff for seconds before trying the next).
    no_retry = retry_class(NoBackoff(), 0)
    manager = sentinel_class(target.sentinels,
                             sentinel_kwargs={**_timeouts(), "retry": no_retry,
                                              **target.sentinel})
    options = {**_standalone_options(url, retry_class), "max_connections": POOL_SIZE,
               **target.connection}
    return manager, manager.master_for(target.service, **options)


def _node_url(redis_url: str, host: str, port: int) -> str:
    """``redis_url`` (credentials, TLS options and all) pointed at one cluster node."""
    parts = urlsplit(redis_url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{address}"))
