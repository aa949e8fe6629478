"""``panqueue dashboard``: the web dashboard, served by uvicorn (the one command that needs
the ``dashboard`` extra). Loopback unless ``--host`` says otherwise."""

from __future__ import annotations

import signal
import socket

import click

from panqueue.cli._common import (
    PORT,
    RuntimeFailure,
    UsageFailure,
    cli_prefix,
    client_for,
    url_option,
)

__all__ = ["dashboard"]

_EXTRA = "pip install 'panqueue[dashboard]'"


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``: a host that is no address of this machine is a
    usage error, a port taken a runtime failure, each one line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageFailure(f"--host {host!r} is not an address: {exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise RuntimeFailure(f"cannot serve the dashboard on {host}:{port}: "
                             f"{exc.strerror or exc}") from None
    return sock


@click.command()
@click.option("--port", type=PORT, default=8080, show_default=True, metavar="PORT",
              help="Port to listen on (1-65535).")
@click.option("--host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="Address to listen on (0.0.0.0 exposes it: use --token then).")
@click.option("--read-only", is_flag=True,
              help="Show everything, act on nothing: no action is offered and every action "
                   "request is refused (403).")
@click.option("--token", default=None, metavar="T", envvar="PANQUEUE_DASHBOARD_TOKEN",
              help="Require this token: an 'Authorization: Bearer T' header or the login "
                   "form (default: $PANQUEUE_DASHBOARD_TOKEN, else none).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Also answer requests for this host name (NAME or NAME:PORT; repeat for "
                   "more), as behind a reverse proxy. Other names than the address served "
                   "(and localhost on loopback) get 421: no DNS rebinding.")
@url_option
def dashboard(port: int, host: str, read_only: bool, token: str | None,
              allowed_hosts: tuple[str, ...], url: str) -> None:
    """Serve the web dashboard at http://HOST:PORT/ until SIGTERM or SIGINT (needs pip
    install 'panqueue[dashboard]').

    Pages: every queue with counts, completed and failed per second and lag, updating live;
    a queue's jobs by state with paging and a search by id; one job with its data, result,
    error and traceback, progress, logs and attempt history; the live workers; the
    schedules; a queue's event stream. Actions: retry (one failed job or all), cancel,
    remove, pause, resume and purge (after typing the queue's name), each a POST with a
    CSRF token. Job data is always shown as text.
    """
    try:
        import uvicorn

        from panqueue.dashboard import create_app
        from panqueue.dashboard._security import host_names
    except ImportError as exc:
        raise UsageFailure(f"panqueue dashboard needs starlette, jinja2 and uvicorn: {_EXTRA} "
                           f"({exc})") from None
    if token is not None and not token.strip():
        raise UsageFailure("--token is empty (give a secret, or leave the option out)")
    try:
        host_names(allowed_hosts)
    except ValueError as exc:
        raise UsageFailure(f"--allowed-host {exc}") from None
    client_for(url).close()  # an unreachable Redis is one error line, before we listen
    sock = _bind(host, port)
    app = create_app(url, read_only=read_only, token=token, allowed_hosts=allowed_hosts,
                     prefix=cli_prefix())
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"serving the dashboard on http://{shown}:{sock.getsockname()[1]}/"
               + (" (read-only)" if read_only else ""), err=True)
    if token is None and host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: {host} is not loopback and no --token is set: anyone who can "
                   f"reach it can act on your queues", err=True)
    # uvicorn shuts down gracefully on SIGTERM or SIGINT, then raises the signal again with
    # the handler that was there before it started: this one, so the command exits 0 (and a
    # signal that comes before uvicorn listens ends it at once).
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_quietly)
    with sock:
        uvicorn.Server(config).run(sockets=[sock])


def _exit_quietly(signum: int, frame: object) -> None:
    raise SystemExit(0)
