"""The ``panqueue`` command line (also ``python -m panqueue``), built on click.

Every failure a user can cause prints one ``panqueue: error: ...`` line on stderr: exit 2 for
a usage or configuration error (bad option, bad MODULE:ATTR, unknown queue, a URL that is not
Redis), exit 1 for a runtime failure (Redis unreachable, job not found, port taken).
Tracebacks are for bugs only. The commands use the public client API only
(``SyncQueueClient``, ``WorkerPool``), like any application.

The commands live one group per module: ``_jobs`` (adding, listing and acting on jobs and
queues), ``_ops`` (info, workers, explain, purge, check), ``_top`` (the live
terminal view, the one command that needs textual), ``_worker`` (the worker), ``_metrics`` (the
Prometheus exporter), ``_dashboard`` (the web dashboard), ``_dev``
(the development server and the demo), ``_permissions`` (what sandboxed handlers are granted and
whether this host enforces it).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

import click

from panqueue._version import __version__
from panqueue.cli._common import (
    EXIT_ERROR,
    EXIT_USAGE,
    RuntimeFailure,
    UsageFailure,
    print_error,
)
from panqueue.errors import ConfigError, PanqueueError

__all__ = ["cli", "main"]


# Each command and the module that defines it. A command's module is imported when the command
# runs (or its help is shown), so `panqueue jobs` does not load the worker runtime, the executors
# or the dashboard: a command's start is mostly its imports.
_COMMANDS = {
    "worker": "_worker",
    **dict.fromkeys(("enqueue", "stats", "job", "jobs", "cancel", "signal", "remove", "dlq",
                     "pause", "resume", "schedules"), "_jobs"),
    **dict.fromkeys(("server", "demo"), "_dev"),
    **dict.fromkeys(("info", "workers", "explain", "purge", "check"), "_ops"),
    "top": "_top",
    "metrics": "_metrics",
    "dashboard": "_dashboard",
    "check-permissions": "_permissions",
}


class _Commands(click.Group):
    """The group of :data:`_COMMANDS`, each imported from its module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = _COMMANDS.get(cmd_name)
        if module is None:
            return None
        command: click.Command = getattr(importlib.import_module(f"panqueue.cli.{module}"),
                                         cmd_name.replace("-", "_"))
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="panqueue",
                      message="%(prog)s %(version)s", help="Print the version and exit.")
def cli() -> None:
    """Redis-backed job queue: run workers, add and inspect jobs, manage queues.

    Every command except server and check-permissions takes --url (default: $PANQUEUE_URL, else
    redis://localhost:6379/0). Exit codes: 0 success, 1 runtime failure, 2 usage or
    configuration error.
    """


def _find_error(exc: BaseException) -> BaseException | None:
    """The user-facing error inside an exception group raised by a task group."""
    if isinstance(exc, PanqueueError | UsageFailure | RuntimeFailure | click.ClickException):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find_error(inner)
            if found is not None:
                return found
    return None


def _fail(message: str, code: int) -> int:
    print_error(message)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args and "_PANQUEUE_COMPLETE" not in os.environ:
        # `panqueue` alone: the help (with its usage line), on stderr, as a usage error.
        with click.Context(cli, info_name="panqueue") as ctx:
            click.echo(ctx.get_help(), err=True)
        return EXIT_USAGE
    try:
        result = cli.main(args, prog_name="panqueue", standalone_mode=False)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "panqueue"
        return _fail(f"{exc.format_message()} (see '{command} --help')", EXIT_USAGE)
    except click.exceptions.Abort:
        return 130
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        found = _find_error(exc)
        if found is None:
            raise
        if isinstance(found, click.ClickException):
            return _fail(found.format_message(), found.exit_code)
        if isinstance(found, ConfigError | UsageFailure):
            return _fail(str(found), EXIT_USAGE)
        return _fail(str(found), EXIT_ERROR)
    return result if isinstance(result, int) else 0
