"""What every command shares: the ``--url`` option, the one-line user errors, the checked
option types, loading ``MODULE:ATTR`` and opening a client that has answered a PING."""

from __future__ import annotations

import importlib
import json
import math
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import click

from panqueue._client import SyncQueueClient
from panqueue._keys import check_prefix
from panqueue._store.transport import URL_SCHEMES, redact_url
from panqueue._store.transport import check_url as transport_check_url
from panqueue._url import resolve_url
from panqueue.errors import ConfigError, PanqueueError, ServerUnavailable
from panqueue.errors import ConnectionError as PanqueueConnectionError

if TYPE_CHECKING:
    from panqueue._registry import Registry

__all__ = [
    "EXIT_ERROR",
    "EXIT_USAGE",
    "FLOAT_NON_NEGATIVE",
    "FLOAT_POSITIVE",
    "PORT",
    "POSITIVE_INT",
    "RuntimeFailure",
    "UsageFailure",
    "check_url",
    "cli_prefix",
    "client_for",
    "load_registry",
    "print_error",
    "print_json",
    "require_queue",
    "traceback_option",
    "url_option",
    "writable_directory",
]

EXIT_ERROR = 1
EXIT_USAGE = 2

F = TypeVar("F", bound=Callable[..., Any])


class UsageFailure(Exception):
    """A problem with the command's input or configuration: one line, exit 2."""


class RuntimeFailure(Exception):
    """The command was right but could not be done (a port taken, a job that failed): exit 1."""


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def parse_json(text: str, what: str) -> Any:
    """The JSON value ``text`` (``what`` names it in the one line a bad one gets, exit 2).
    Python's parser takes NaN and Infinity too: they are not JSON, and refused here."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError as exc:  # json.JSONDecodeError is one
        raise UsageFailure(f"invalid JSON for {what}: {exc}") from None


# --------------------------------------------------------------------------- option types


class _Float(click.ParamType):  # type: ignore[type-arg]
    """A finite float, > 0 (``positive``) or >= 0."""

    def __init__(self, *, positive: bool) -> None:
        self.positive = positive
        self.name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"must be a finite number, got {value!r}", param, ctx)
        if self.positive and number <= 0:
            self.fail(f"must be > 0, got {value}", param, ctx)
        if not self.positive and number < 0:
            self.fail(f"must be >= 0, got {value}", param, ctx)
        return number


FLOAT_POSITIVE = _Float(positive=True)
FLOAT_NON_NEGATIVE = _Float(positive=False)
POSITIVE_INT = click.IntRange(min=1)
PORT = click.IntRange(min=1, max=65535)


def check_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """``--url`` or ``$PANQUEUE_URL`` or the default; an empty or malformed URL is refused
    before anything connects. The scheme is checked by the transport itself, so the CLI
    accepts exactly the URLs a client does (cluster ones included)."""
    return checked_url(value)


def checked_url(value: str | None) -> str:
    """:func:`check_url` outside an option's callback (``click.BadParameter`` when bad)."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty (give a URL such as redis://localhost:6379/0)")
    url = resolve_url(value)
    shown = redact_url(url)
    sentinel = url.split("://", 1)[0].lower().endswith("+sentinel")
    try:
        transport_check_url(url)
    except ConfigError as exc:
        if sentinel:  # the transport names what is wrong: an address, the service, the db
            raise click.BadParameter(str(exc)) from None
        raise click.BadParameter(
            f"{shown!r} is not a Redis URL (redis://HOST:PORT/DB; the scheme must be one of "
            f"{', '.join(URL_SCHEMES)})") from None
    parts = urlsplit(url)
    if parts.scheme != "unix" and not sentinel:
        try:
            port = parts.port
        except ValueError:
            raise click.BadParameter(f"{shown!r} has an invalid port (1-65535)") from None
        if port is not None and not 1 <= port <= 65535:
            raise click.BadParameter(f"{shown!r} has an invalid port (1-65535)")
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise click.BadParameter(f"{shown!r}: the database {db!r} is not a number")
    return url


_PREFIX_META = "panqueue.prefix"


def _check_prefix(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``--prefix`` or ``$PANQUEUE_PREFIX``, checked, kept for :func:`cli_prefix`."""
    if value is not None:
        try:
            check_prefix(value)
        except ConfigError as exc:
            raise click.BadParameter(str(exc)) from None
    ctx.meta[_PREFIX_META] = value


def cli_prefix() -> str | None:
    """The key prefix the command was given (``--prefix``, else ``$PANQUEUE_PREFIX``)."""
    value: str | None = click.get_current_context().meta.get(_PREFIX_META)
    return value


def prefix_option(func: F) -> F:
    """``--prefix PREFIX``: the key namespace of the queues (:func:`cli_prefix`)."""
    return click.option(
        "--prefix", default=None, envvar="PANQUEUE_PREFIX", callback=_check_prefix,
        expose_value=False, metavar="PREFIX",
        help="Key prefix of the application's queues, as its clients and workers name it "
             "(default: $PANQUEUE_PREFIX, else none).")(func)


def url_option(func: F) -> F:
    """``--url URL``: where Redis is; ``--prefix PREFIX``: the key namespace of the queues
    (:func:`cli_prefix`)."""
    func = prefix_option(func)
    return click.option(
        "--url", default=None, callback=check_url, metavar="URL",
        help="Redis URL (default: $PANQUEUE_URL, else redis://localhost:6379/0).")(func)


def writable_directory(value: str) -> Path:
    """``value`` as a directory we can create and write to, else a usage error."""
    path = Path(value)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageFailure(f"cannot create the directory {value!r}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageFailure(f"the directory {value!r} is not writable")
    return path


# --------------------------------------------------------------------------- helpers


def _import_failure(module_name: str, exc: BaseException, what: str, full: bool) -> str:
    """The one line for a module that failed to import, and with ``full`` the traceback of
    the whole chain after it."""
    line = f"importing {module_name!r} failed at {_user_frame(exc)}: {what}"
    chained = exc.__cause__ is not None or (
        exc.__context__ is not None and not exc.__suppress_context__)
    if not full:
        return line + (" (--traceback shows the exceptions that caused it)" if chained else "")
    report = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    pending = [report]
    while pending:  # every exception of the chain, without the import machinery's frames
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.stack = traceback.StackSummary.from_list(
            [frame for frame in current.stack if _is_users(frame.filename)])
        pending += [inner for inner in (current.__cause__, current.__context__) if inner]
    return line + "\n" + "".join(report.format()).rstrip()


def _is_users(filename: str) -> bool:
    """Whether a frame is the application's (or a library's it calls), not the import
    machinery's or the command line's."""
    return "importlib" not in filename and "/panqueue/cli/" not in filename


def _user_frame(exc: BaseException) -> str:
    """``file:line`` of the deepest frame outside the import machinery and panqueue."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_users(f.filename)]
    if not frames:
        return "?"
    return f"{frames[-1].filename}:{frames[-1].lineno}"


def traceback_option(fn: F) -> F:
    """``--traceback``: an app module that fails to import shows its whole traceback."""
    return click.option(
        "--traceback", "show_traceback", is_flag=True,
        help="If MODULE fails to import, print the whole traceback, with the exceptions "
             "that caused it (default: one line naming your file and line).")(fn)


def load_registry(spec: str, *, show_traceback: bool = False) -> Registry:
    """Import ``MODULE:ATTR`` (from the current directory too) and return the Registry.

    A module that does not import is a usage error naming the user's own file and line: the
    traceback of importlib is no help to someone who made a typo in app.py. With
    ``show_traceback`` the line is followed by the whole traceback, every exception of the
    chain (``raise ... from``, an exception during the handling of another), without the
    frames of the import machinery."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageFailure(f"expected MODULE:ATTR (for example app:queues), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise UsageFailure(f"cannot import module {module_name!r}: {exc}") from None
        raise UsageFailure(_import_failure(
            module_name, exc, f"{type(exc).__name__}: {exc}", show_traceback)) from None
    except SyntaxError as exc:
        raise UsageFailure(_import_failure(
            module_name, exc, f"SyntaxError: {exc.msg}", show_traceback)) from None
    except Exception as exc:
        raise UsageFailure(_import_failure(
            module_name, exc, f"{type(exc).__name__}: {exc}", show_traceback)) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageFailure(f"module {module_name!r} has no attribute {attr!r}") from None
    from panqueue._registry import Registry  # the worker's commands alone need the runtime

    if not isinstance(obj, Registry):
        raise UsageFailure(f"{spec} is a {type(obj).__name__}, not a panqueue.Registry")
    return obj


def _probe(url: str, timeout: float = 2.0) -> str:
    """What listens at the host and port of a plain ``redis://`` URL, asked with an inline PING
    (which every Redis answers, with PONG or an error such as NOAUTH): "closes" (it accepts a
    connection and closes it without a byte of answer), "answers", or "" (nothing listens, it
    is unreachable or silent, or the URL is not a plain redis:// one)."""
    parts = urlsplit(url)
    if parts.scheme != "redis" or not parts.hostname:
        return ""
    try:
        port = parts.port or 6379
        with socket.create_connection((parts.hostname, port), timeout=timeout) as probe:
            probe.sendall(b"PING\r\n")
            return "closes" if probe.recv(1) == b"" else "answers"
    except (ConnectionResetError, BrokenPipeError):
        return "closes"  # accepted, then reset: it hung up
    except (OSError, ValueError):  # refused, unreachable, silent (timeout), a bad port
        return ""


def _answers_within(client: SyncQueueClient, seconds: float) -> bool:
    """Whether ``client`` gets an answer to a PING within ``seconds`` (asked every 0.2 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            client.ping()
        except PanqueueConnectionError:
            continue
        except PanqueueError:  # it answers, not as Redis does
            return False
        return True
    return False


def client_for(url: str) -> SyncQueueClient:
    """A client (under the command's ``--prefix``) that has answered a PING (fail fast and
    clearly)."""
    client = SyncQueueClient(url, prefix=cli_prefix())
    try:
        client.ping()
    except PanqueueConnectionError as exc:
        found = "" if isinstance(exc, ServerUnavailable) else _probe(url)
        # Something listens there. If it hangs up on a PING, it is not a Redis server (or one
        # that speaks TLS only), or a Redis that closes every new connection for a moment (a
        # restart, CLIENT KILL, a proxy dropping its links): it is asked again for as long as
        # a worker's start waits for a server, and then the URL is the user's to fix (a usage
        # error). If it answers now, that moment has just passed.
        from panqueue._runtime.worker import START_GRACE

        if found and _answers_within(client, START_GRACE if found == "closes" else 1.0):
            return client
        if found == "closes":
            client.close()
            raise UsageFailure(
                f"{redact_url(url)} does not answer as a Redis server (it closed the "
                f"connection without answering a PING; a TLS-only server wants rediss://); "
                f"check the host and port") from None
        client.close()
        raise
    except ConfigError:
        client.close()
        raise
    except PanqueueError as exc:
        # Something answered, but not as Redis does (an HTTP server, a wrong port): the URL
        # is wrong, which is the user's to fix, not a failure of a running system.
        client.close()
        raise UsageFailure(f"{redact_url(url)} does not answer as a Redis server ({exc}); "
                           f"check the host and port") from None
    except BaseException:
        client.close()
        raise
    return client


def require_queue(client: SyncQueueClient, queue: str) -> None:
    if not client.queue_exists(queue):
        raise UsageFailure(f"unknown queue {queue!r} (no job or worker has used it)")


def print_error(message: str) -> None:
    """The one-line form of every error the command line reports, on stderr."""
    print(f"panqueue: error: {message}", file=sys.stderr)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False, default=str))
