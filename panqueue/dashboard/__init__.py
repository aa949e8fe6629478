"""The web dashboard (extra ``panqueue[dashboard]``): ``panqueue dashboard`` serves it, and
:func:`create_app` returns it as an ASGI app to mount in an application's own server.

Pages: every queue with counts, rates and lag (updating live); a queue's jobs by state with
paging and a search by id; one job (data, result, error and traceback, progress, logs, attempt
history); the live workers; the schedules; a queue's event stream. Actions: retry (one failed
job or all), cancel, remove, pause, resume, purge (behind a confirmation), each a POST carrying
the session's CSRF token.

This package is the only one that imports starlette and jinja2. It reads and acts through the
public client (a :class:`~panqueue.SyncQueueClient`), and computes lag as ``panqueue info``
does.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.applications import Starlette

from panqueue.dashboard._app import build_app

__all__ = ["create_app"]


def create_app(url: str | None = None, read_only: bool = False,
               token: str | None = None, allowed_hosts: Iterable[str] | None = None, *,
               prefix: str | None = None) -> Starlette:
    """The dashboard as an ASGI app.

    ``url``: the Redis URL (default: ``$PANQUEUE_URL``, else ``redis://localhost:6379/0``).
    ``read_only``: no action is shown, and every action POST is refused with 403.
    ``token``: every request must then carry ``Authorization: Bearer <token>``, or come from a
    browser that logged in with it on the login form (a signed, HttpOnly cookie); others get
    401 (a page asked for by a browser: a redirect to the login form).

    ``allowed_hosts``: the host names (``"dash.example"``, or with a port,
    ``"dash.example:8443"``) it answers to besides the address it is served on (that IP and
    port, and ``localhost`` with the port on loopback); a request naming another host in its
    ``Host`` header gets 421, which stops DNS rebinding. Behind a reverse proxy that passes the
    public name on, list that name. An action (a POST) must also come from a page of the
    dashboard: its ``Origin`` (or ``Referer``) must name the same host, or it gets 403.

    ``prefix``: the key namespace of the queues it shows (``QueueClient``'s ``prefix``).

    Mount it under any prefix (``app.mount("/queues", create_app(...))``): its links and
    cookies follow the prefix. Nothing connects until the first request. A bad ``url``, an
    empty ``token`` or an entry of ``allowed_hosts`` that is not a host name raises
    :class:`~panqueue.ConfigError` here.
    """
    return build_app(url, read_only, token, allowed_hosts, prefix)
