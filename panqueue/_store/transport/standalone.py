"""One standalone server as redis-py would connect to it, for the transports that speak
Redis' protocol over their event loop's own sockets (:mod:`.native` on trio, and the asyncio
wake-up subscriptions of :mod:`.aio_subscriber`): the connection options read from redis-py's
own reading of the URL (:func:`settings_for`), the commands a new connection sends first
(:func:`hello_commands`) and the message of a failed connect."""

from __future__ import annotations

import errno
import ssl
from typing import Any

import redis
import redis.connection
from redis.retry import Retry

from panqueue._store.transport.options import _standalone_options


class Settings:
    """Where and how to connect, read from redis-py's own connection object for the URL.
    :func:`settings_for` returns ``None`` when the URL asks for what only redis-py does."""

    def __init__(self, connection: Any, callbacks: Any) -> None:
        self.protocol = int(getattr(connection, "protocol", None) or 2)
        #: redis-py's response callbacks for this protocol, by command name.
        self.callbacks = callbacks
        self.path: str | None = getattr(connection, "path", None)
        self.host: str = getattr(connection, "host", "")
        self.port: int = int(getattr(connection, "port", 0) or 0)
        self.db = int(connection.db or 0)
        self.username: str | None = connection.username
        self.password: str | None = connection.password
        self.client_name: str | None = connection.client_name
        self.timeout: float | None = connection.socket_timeout
        self.connect_timeout: float | None = getattr(connection, "socket_connect_timeout",
                                                     self.timeout)
        self.keepalive = bool(getattr(connection, "socket_keepalive", False))
        self.keepalive_options: dict[int, Any] = dict(
            getattr(connection, "socket_keepalive_options", None) or {})
        self.tls: ssl.SSLContext | None = None
        if isinstance(connection, redis.connection.SSLConnection):
            self.tls = _tls_context(connection)

    @property
    def address(self) -> str:
        return self.path or f"{self.host}:{self.port}"


def _tls_context(c: Any) -> ssl.SSLContext:
    """The TLS context redis-py would build from the same options."""
    context = ssl.create_default_context()
    context.check_hostname = bool(c.check_hostname)
    context.verify_mode = c.cert_reqs
    for flag in c.ssl_include_verify_flags or ():
        context.verify_flags |= flag
    for flag in c.ssl_exclude_verify_flags or ():
        context.verify_flags &= ~flag
    if c.certfile or c.keyfile:
        context.load_cert_chain(certfile=c.certfile, keyfile=c.keyfile,
                                password=c.certificate_password)
    if c.ca_certs is not None or c.ca_path is not None or c.ca_data is not None:
        context.load_verify_locations(cafile=c.ca_certs, capath=c.ca_path, cadata=c.ca_data)
    if c.ssl_min_version is not None:
        context.minimum_version = c.ssl_min_version
    if c.ssl_ciphers:
        context.set_ciphers(c.ssl_ciphers)
    return context


_KNOWN_CLASSES = (redis.connection.Connection, redis.connection.SSLConnection,
                  redis.connection.UnixDomainSocketConnection)


def settings_for(url: str) -> Settings | None:
    """The settings for a standalone ``redis://``, ``rediss://`` or ``unix://`` URL, or
    ``None`` if it asks for something this transport leaves to redis-py."""
    client = redis.Redis.from_url(url, **_standalone_options(url, Retry))
    try:
        connection = client.connection_pool.make_connection()
    finally:
        client.close()
    if type(connection) not in _KNOWN_CLASSES or \
            getattr(connection, "credential_provider", None) is not None:
        return None
    if getattr(connection, "ssl_validate_ocsp", False) or \
            getattr(connection, "ssl_validate_ocsp_stapled", False):
        return None
    return Settings(connection, client.response_callbacks)


def hello_commands(settings: Settings) -> list[tuple[Any, ...]]:
    """What redis-py sends on a new connection: HELLO (RESP3) with the credentials and name, or
    AUTH (RESP2); then SELECT. Without credentials on RESP2 a PING asks whether the server
    wants some: a server that does answers NOAUTH (a connection error), where the first real
    command might instead be refused as a protocol error (a long command from a client that
    has not logged in)."""
    commands: list[tuple[Any, ...]] = []
    login: tuple[Any, ...] = ()
    if settings.password is not None:
        login = (settings.username or "default", settings.password)
    if settings.protocol == 3:
        commands.append(("HELLO", 3, *(("AUTH", *login) if login else ()),
                         *(("SETNAME", settings.client_name) if settings.client_name
                           else ())))
    else:
        commands.append(("AUTH", *login) if login else ("PING",))
        if settings.client_name:
            commands.append(("CLIENT", "SETNAME", settings.client_name))
    if settings.db:
        commands.append(("SELECT", settings.db))
    return commands


def connect_error(settings: Settings, exc: OSError) -> str:
    """The message redis-py gives a connect that failed with ``exc``."""
    code = exc.errno if exc.errno is not None else errno.ECONNREFUSED
    reason = exc.strerror or str(exc)
    return f"Error {code} connecting to {settings.address}. {reason}."
