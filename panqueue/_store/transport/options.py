"""Redis URLs (their forms, redaction of passwords) and the options every connection gets:
timeouts, keepalive, one resend of a command whose pooled connection had died."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
from redis.backoff import NoBackoff

from panqueue.errors import ConfigError

_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")

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



_SECRET_PARAMS = re.compile(r"((?:^|&)(?:password|ssl_password)=)[^&]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL without its passwords (user:pass@ and ?password=), for messages and logs."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        netloc = f"{parts.username or ''}:***@{host}"
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
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"invalid Redis URL {redact_url(url)!r}: scheme must be one of {', '.join(_SCHEMES)}"
        )
    if scheme.endswith("+cluster"):
        return True, scheme.removesuffix("+cluster") + url[len(scheme) :]
    return False, url


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


def _node_url(redis_url: str, host: str, port: int) -> str:
    """``redis_url`` (credentials, TLS options and all) pointed at one cluster node."""
    parts = urlsplit(redis_url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{address}"))
