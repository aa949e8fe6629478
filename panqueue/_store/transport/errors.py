"""redis-py's errors translated into panqueue's, in this one place: every call into redis-py runs
inside :func:`_translated`."""

from __future__ import annotations

import re
from types import TracebackType

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.exceptions
import redis.sentinel

from panqueue._store.transport.options import redact_url
from panqueue.errors import ConnectionError as PanqueueConnectionError
from panqueue.errors import PanqueueError, ServerUnavailable

_CONNECTION_ERRORS = (
    redis.exceptions.ConnectionError,  # includes AuthenticationError, AuthorizationError
    redis.exceptions.TimeoutError,
    redis.exceptions.RedisClusterException,  # no node of the cluster could be reached
    OSError,
)
# Answers of a server that is there but cannot serve now. redis-py gives some their own class
# (and strips the code from the message); the others are recognised by their error code, at
# the start of the message or after redis-py's "Command # n (...) of pipeline caused error: ".
_UNAVAILABLE_CLASSES: tuple[tuple[type[Exception], str], ...] = (
    (redis.exceptions.OutOfMemoryError, "OOM"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
)
# UNBLOCKED: the server ended a blocking read (XREAD BLOCK) because it turned into a replica
# (a failover) or the read's key moved to another node; nothing was read, so it is retried.
_UNAVAILABLE_CODE = re.compile(
    r"(?:^|caused error: )"
    r"(OOM|BUSY|LOADING|READONLY|MASTERDOWN|TRYAGAIN|CLUSTERDOWN|NOREPLICAS|UNBLOCKED)\b")


# redis-py's Sentinel clients turn a READONLY answer of a demoted master into a connection
# error with this message (after dropping the connection, so the next one asks the sentinels).
_DEMOTED_MASTER = "The previous master is now a slave"
_NO_MASTER = (redis.sentinel.MasterNotFoundError, redis.asyncio.sentinel.MasterNotFoundError)


def _unavailable_code(exc: BaseException) -> str | None:
    """The error code if ``exc`` says the server cannot serve now (OOM, BUSY, ...)."""
    for cls, code in _UNAVAILABLE_CLASSES:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, redis.exceptions.ConnectionError) and str(exc) == _DEMOTED_MASTER:
        return "READONLY"
    if isinstance(exc, _NO_MASTER) and " : " not in str(exc):
        # Every sentinel answered and none names a master that is up: a failover is under
        # way. (When sentinels could not be reached, their errors follow " : ", and the
        # error stays a plain ConnectionError: nothing answered.)
        return "MASTERDOWN"
    if isinstance(exc, redis.exceptions.ResponseError):
        match = _UNAVAILABLE_CODE.search(str(exc))
        if match is not None:
            return match.group(1)
    return None


# redis-py's cluster client gives up on its slot map with these while the nodes it asked leave
# slots without a master or do not agree on who serves them (they answered: the cluster is being
# set up, repaired, resharded or failed over).
_CLUSTER_IN_FLUX = ("startup_nodes could not agree", "All slots are not covered")


def _cluster_cannot_serve(url: str, exc: BaseException) -> str | None:
    """Why a cluster that answered cannot serve now, for an error of a Cluster URL's client;
    ``None`` when the error means something else.

    redis-py's cluster client sends a command to the master its slot map names, and it got
    that map from a node that answered (when no node answers, it raises "Redis Cluster cannot
    be connected", a plain lost connection). So a node it cannot connect to, or that times out,
    is a master of a running cluster that died or hangs: its replica takes over once the
    cluster notices, as with ``CLUSTERDOWN``, and the call is worth retrying even for a worker
    that has just started. A login refused by that node is not a failover."""
    if not url.split("://", 1)[0].lower().endswith("+cluster"):
        return None
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.AuthorizationError):
        return None
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return "a master of the cluster cannot be reached (failing over?)"
    if isinstance(exc, redis.exceptions.RedisClusterException) and str(exc).startswith(
            _CLUSTER_IN_FLUX):
        return "the cluster's slot map leaves slots out or its nodes disagree on it"
    if isinstance(exc, redis.exceptions.RedisClusterException) and exc.__cause__ is not None:
        # "Redis Cluster cannot be connected" with the seed's own answer as its cause: a seed
        # that answered LOADING (restarting) or the like is there, only not serving yet.
        code = _unavailable_code(exc.__cause__)
        if code is not None:
            return f"the seed answered {code}"
    return None


# What redis-py says when a client's pool has no connection to give: a blocking pool after its
# timeout, a plain one at once.
_POOL_FULL = ("No connection available", "Too many connections")


def _refused_under(exc: BaseException) -> str | None:
    """The ACL refusal under a cluster client's failure to connect, if that is what it was."""
    if not isinstance(exc, redis.exceptions.RedisClusterException):
        return None
    seen: set[int] = set()
    cause: BaseException | None = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, redis.exceptions.NoPermissionError):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    return None


def translate_error(url: str, exc: BaseException) -> PanqueueError:
    """The panqueue error for an error of redis-py or of the socket under it.

    * the server cannot serve now (OOM, BUSY, LOADING, READONLY, ..., or a master of a cluster
      that answered cannot be reached): ServerUnavailable, which is a ConnectionError, so every
      path that rides out a lost connection rides this out
    * the connection failed, timed out or was refused at login: ConnectionError
    * the server refused the command (ACL, a wrong type, a script error): PanqueueError
    """
    if isinstance(exc, PanqueueError):
        return exc
    where = redact_url(url)
    refused = _refused_under(exc)
    if refused is not None:
        # A cluster client that could not learn the slot map because the user may not ask
        # for it: a refusal (a missing ACL permission), not a server out of reach.
        return PanqueueError(f"Redis at {where} refused a command: {refused} (a cluster "
                             "client asks each node for the slot map: grant +cluster|slots)")
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, _NO_MASTER) and " : " in detail:
        # redis-py appends the repr of every sentinel client it could not reach: keep one line.
        detail = f"{detail.split(' : ', 1)[0]}: no sentinel could be reached"
    failing_over = _cluster_cannot_serve(url, exc)
    if failing_over is not None:
        return ServerUnavailable(f"Redis at {where} cannot serve now: {failing_over}: {detail}")
    code = _unavailable_code(exc)
    if code is not None:
        if not detail.startswith(code):
            detail = f"{code} {detail}"
        return ServerUnavailable(f"Redis at {where} cannot serve now: {detail}")
    if isinstance(exc, redis.exceptions.ConnectionError) and detail.startswith(_POOL_FULL):
        # The server was never asked: every connection of this client was busy.
        return PanqueueConnectionError(
            f"no connection to Redis at {where} came free: every one of the client's pool is "
            f"in use ({detail}); fewer calls at once, or a larger ?max_connections= in the "
            "URL")
    if isinstance(exc, _CONNECTION_ERRORS):
        return PanqueueConnectionError(f"cannot reach Redis at {where}: {detail}")
    if isinstance(exc, redis.exceptions.ResponseError):
        return PanqueueError(f"Redis at {where} refused a command: {detail}")
    return PanqueueError(f"Redis at {where}: {type(exc).__name__}: {detail}")


_REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)


def _connection_closed_under_a_call(exc: BaseException) -> bool:
    """``exc`` is redis.asyncio's cluster client finding its connection closed mid-call.

    When a failover changes the cluster's topology, redis.asyncio's cluster client closes the
    connections of the nodes whose role changed, including ones that another task is using at
    that moment; that task then fails inside redis-py's connection code with an AttributeError
    (the closed connection's reader or writer is None) instead of a ConnectionError. Only an
    AttributeError raised in redis-py's own ``connection`` module counts, so that a bug of
    panqueue's is never taken for a lost connection."""
    if not isinstance(exc, AttributeError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
    return "/redis/" in path and path.endswith("/connection.py")


class _translated:  # used as a function: ``with _translated(url):``
    """Raise redis-py's errors (and the socket's) inside the block as panqueue's: every call
    into redis-py runs in one of these blocks. A class, not a generator: each script call
    enters one."""

    __slots__ = ("_url",)

    def __init__(self, url: str) -> None:
        self._url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None or isinstance(exc, PanqueueError):
            return
        if isinstance(exc, _REDIS_ERRORS):
            raise translate_error(self._url, exc) from exc
        if _connection_closed_under_a_call(exc):
            raise PanqueueConnectionError(
                f"cannot reach Redis at {redact_url(self._url)}: the connection was closed "
                "during the call (the cluster's topology changed)") from exc
