"""``panqueue top``: the live terminal view. Needs the ``tui`` extra (textual); without it
the command prints one line naming ``panqueue[tui]`` and exits 2."""

from __future__ import annotations

import click

from panqueue.cli._common import FLOAT_POSITIVE, UsageFailure, client_for, url_option

__all__ = ["top"]


@click.command()
@click.option("--interval", type=FLOAT_POSITIVE, default=1.0, show_default=True,
              metavar="SECONDS", help="Refresh every SECONDS (> 0).")
@url_option
def top(interval: float, url: str) -> None:
    """Live terminal view of every queue and the live workers.

    Per queue: waiting, delayed, active and failed counts, completed and failed jobs per
    second (with a sparkline of the last minutes), lag (age of the oldest waiting job), wait
    and run time p50/p95 of the jobs finished in the last minute, paused, live workers; and
    the live workers (name, host, queues, running jobs, heartbeat age). Keys: arrows or j/k
    pick a queue, f shows its failed jobs with their errors, q quits. Needs the tui extra:
    pip install 'panqueue[tui]'.
    """
    try:
        from panqueue._tui import TopApp
    except ImportError as exc:
        raise UsageFailure(f"panqueue top needs textual: pip install 'panqueue[tui]' "
                           f"({exc})") from None
    with client_for(url) as client:
        TopApp(client, interval).run()
