"""``panqueue metrics``: the Prometheus exporter of queue gauges, read from Redis at scrape time
(the one command that needs prometheus-client, besides ``worker --metrics-port``)."""

from __future__ import annotations

import signal
import threading
from types import ModuleType

import click

from panqueue.cli._common import (
    PORT,
    RuntimeFailure,
    UsageFailure,
    cli_prefix,
    client_for,
    url_option,
)

__all__ = ["import_metrics", "metrics"]


def import_metrics(option: str) -> ModuleType:
    """``panqueue.metrics``, or a usage error naming the extra."""
    try:
        import panqueue.metrics as module
    except ImportError:
        raise UsageFailure(f"{option} needs prometheus-client: pip install 'panqueue[metrics]'"
                           ) from None
    return module


@click.command()
@click.option("--port", type=PORT, default=9808, show_default=True, metavar="PORT",
              help="Port of the /metrics endpoint (1-65535).")
@click.option("--host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="Address to listen on (0.0.0.0 to expose it).")
@url_option
def metrics(port: int, host: str, url: str) -> None:
    """Serve Prometheus metrics of every queue at http://HOST:PORT/metrics until SIGTERM or
    SIGINT (needs pip install 'panqueue[metrics]').

    Read from Redis at each scrape: panqueue_jobs{queue,state}, panqueue_queue_lag_seconds
    (age of the oldest waiting job), panqueue_queue_paused, panqueue_workers (live workers
    per queue) and panqueue_up. Run one per Redis deployment, not one per worker; worker
    counters and histograms come from `panqueue worker --metrics-port`.
    """
    module = import_metrics("panqueue metrics")
    client_for(url).close()  # an unreachable Redis is one error line
    try:
        server, collector = module.serve_queues(url, port, host, prefix=cli_prefix())
    except OSError as exc:
        raise RuntimeFailure(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
                             ) from None
    click.echo(f"serving metrics on http://{host}:{port}/metrics", err=True)
    stop = threading.Event()

    def handle(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.shutdown()
        collector.close()
