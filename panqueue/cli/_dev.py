"""Development commands: ``server`` (a private Redis-compatible server) and ``demo``."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import anyio
import click

from panqueue._log import configure_logging, notice
from panqueue.cli._common import (
    PORT,
    POSITIVE_INT,
    RuntimeFailure,
    check_url,
    cli_prefix,
    prefix_option,
    writable_directory,
)

__all__ = ["demo", "server"]


def _port_taken(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (or we may not bind it).

    A server started on a taken port exits at once, but the one already there answers PING:
    without this check we would report success and leave the user on someone else's server.

    The probe binds with ``SO_REUSEADDR``, as the server itself does: a server just stopped
    leaves its closed connections in TIME_WAIT on the port for about a minute, which the server
    may bind over but a plain bind may not. A socket that listens on the port still refuses
    the bind (Linux and macOS); on Windows the option would let us bind over a listener, so
    there the probe binds plainly."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if os.name != "nt":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@click.command()
@click.option("--port", type=PORT, default=6390, show_default=True,
              help="TCP port (1-65535); the server listens on 127.0.0.1 only.")
@click.option("--dir", "directory", default=".panqueue/redis", show_default=True,
              metavar="DIR", help="Data directory (append-only persistence and server.log).")
def server(port: int, directory: str) -> None:
    """Run a private Redis-compatible server for development, until Ctrl-C or SIGTERM.

    It uses redis-server or valkey-server from PATH, else the Valkey binary of the embedded
    extra, and prints the URL and a ready-to-paste `export PANQUEUE_URL=...` line. A port
    already in use is refused (exit 1); the port of a server just stopped can be used again at
    once.
    """
    from panqueue.embedded import RedisServer

    if _port_taken(port):
        raise RuntimeFailure(f"port {port} on 127.0.0.1 is already in use; pick another "
                             f"with --port")
    data = writable_directory(directory)
    configure_logging("console", "info")
    redis_server = RedisServer(port=port, directory=data,
                               log_to=str(data.resolve() / "server.log"))

    async def serve() -> None:
        # Listen for signals before the server starts: a SIGTERM or Ctrl-C that arrives while
        # it starts is then queued instead of killing us, which would leave the server (in a
        # session of its own, out of the signal's reach) running with nobody to stop it.
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            redis_server.start()
            try:
                print(f"panqueue: {Path(redis_server.binary).name} listening on "
                      f"{redis_server.url} (data in {data}, append-only); Ctrl-C stops it\n"
                      f"In another shell:\n"
                      f"export PANQUEUE_URL={redis_server.url}", flush=True)
                async for _ in signals:
                    return
            finally:
                redis_server.stop()
                notice("server stopped", url=redis_server.url)

    anyio.run(serve)


def _demo_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--url, else $PANQUEUE_URL, else None (a private server)."""
    if value is None and not os.environ.get("PANQUEUE_URL"):
        return None
    return check_url(ctx, param, value)


@click.command()
@click.option("--url", default=None, metavar="URL", callback=_demo_url,
              help="Run on this Redis (default: $PANQUEUE_URL, else a private server "
                   "started for the demo).")
@click.option("--jobs", type=POSITIVE_INT, default=300, show_default=True, metavar="N",
              help="How many jobs to add.")
@click.option("--workers", type=POSITIVE_INT, default=2, show_default=True, metavar="N",
              help="How many worker processes to start (concurrency 20 each).")
@prefix_option
def demo(url: str | None, jobs: int, workers: int) -> int:
    """Run jobs through worker processes and print a summary.

    Starts --workers worker processes and says how long they took to serve the queue
    `demo`, then adds --jobs jobs, shows live progress (about one job in ten fails its first
    attempt and is retried), stops the workers with SIGTERM and prints jobs completed, failed
    and retried, the time from the first add to the last finish and the throughput, the
    queue latency (add to start of first attempts, the workers already running) and the
    workers' exit codes. It always says which server it uses: without --url or
    $PANQUEUE_URL it starts a private one in .panqueue/demo-redis and stops it at the end; on
    a given server it removes the jobs it added. Exit 0 when every job completed and every
    worker exited 0, else 1.
    """
    from panqueue._demo import run_demo

    return run_demo(url=url, jobs=jobs, workers=workers, prefix=cli_prefix())
