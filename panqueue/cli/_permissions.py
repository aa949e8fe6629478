"""``panqueue check-permissions``: what each sandboxed queue of a registry is granted, and
whether this host's kernel enforces it. Needs no Redis: it reads the registry and asks the
kernel (``panqueue._sandbox.probe``), as a worker does before it serves such a queue."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click

from panqueue.cli._common import EXIT_ERROR, UsageFailure, load_registry, traceback_option

__all__ = ["check_permissions"]

_GRANTS = ("read", "write", "net", "listen", "env", "run")


def _listed(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in values) or "none"


def _describe(queue: str, import_path: str, permissions: Any, missing: list[str]) -> list[str]:
    lines = [f"{queue} ({import_path})"]
    width = max(len(name) for name in (*_GRANTS, "processes"))
    for name in _GRANTS:
        lines.append(f"  {name:<{width}}  {_listed(getattr(permissions, name))}")
    lines.append(f"  {'processes':<{width}}  {permissions.processes}")
    if not missing:
        lines.append("  enforced")
    else:
        consequence = ("the worker runs it unsandboxed, with a warning"
                       if permissions.on_unsupported == "warn"
                       else "the worker refuses to serve it")
        lines.append(f"  NOT enforced: {'; '.join(missing)} ({consequence})")
    return lines


@click.command("check-permissions")
@click.argument("app", metavar="MODULE:ATTR")
@click.option("-q", "--queue", "queues", multiple=True, metavar="QUEUE",
              help="Check only this queue (repeatable; default: every queue of the registry "
                   "whose handler has permissions).")
@traceback_option
def check_permissions(app: str, queues: tuple[str, ...], show_traceback: bool) -> int:
    """What each queue of MODULE:ATTR with permissions= is granted, and whether this host
    enforces it.

    For each such queue: its grants (read, write, net, listen, env, run, processes), then
    `enforced`, or `NOT enforced:` and what this host lacks (Landlock or one of its ABI
    versions, seccomp user notification, pidfd_getfd, Linux itself), which the worker checks
    the same way before it serves the queue. Exit 0 when every queue checked is enforced, 1
    when one is not, 2 for an unknown queue or a QUEUE without permissions. Needs no Redis.
    """
    registry = load_registry(app, show_traceback=show_traceback)
    handlers = {handler.queue: handler for handler in registry}
    for queue in queues:
        if queue not in handlers:
            known = ", ".join(sorted(handlers)) or "none"
            raise UsageFailure(f"unknown queue {queue!r} (queues of {app}: {known})")
        if getattr(handlers[queue].options, "permissions", None) is None:
            raise UsageFailure(f"queue {queue!r} has no permissions (its handler is not "
                               f"given permissions=Permissions(...))")
    checked = [handlers[q] for q in dict.fromkeys(queues)] if queues else [
        h for h in handlers.values() if getattr(h.options, "permissions", None) is not None]
    if not checked:
        click.echo(f"no queue of {app} has permissions")
        return 0
    from panqueue._sandbox.probe import support

    host = support()
    blocks = []
    failures = 0
    for handler in checked:
        permissions = handler.options.permissions
        missing = list(host.missing(permissions))
        failures += bool(missing)
        blocks.append("\n".join(_describe(handler.queue, handler.import_path, permissions,
                                          missing)))
    click.echo("\n\n".join(blocks))
    return EXIT_ERROR if failures else 0
