"""``panqueue worker``: serve the queues of a registry until a signal, until the queues are
empty (``--burst``), restarting when the code changes (``--reload``)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, TypeVar

import anyio
import click

from panqueue._client import QueueClient
from panqueue._health import HealthServer, HealthState
from panqueue._job import JobState
from panqueue._log import configure_logging, notice
from panqueue._pool import WorkerPool
from panqueue.cli._common import (
    FLOAT_NON_NEGATIVE,
    FLOAT_POSITIVE,
    PORT,
    POSITIVE_INT,
    RuntimeFailure,
    UsageFailure,
    check_url,
    checked_url,
    cli_prefix,
    client_for,
    load_registry,
    prefix_option,
    print_error,
    traceback_option,
)
from panqueue.cli._metrics import import_metrics
from panqueue.errors import ConfigError, ConnectionError, ServerUnavailable

__all__ = ["worker"]

T = TypeVar("T")


def _given_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--url``, checked, or None: the registry's URL comes before ``$PANQUEUE_URL``."""
    return None if value is None else check_url(ctx, param, value)


@click.command()
@click.argument("app", metavar="MODULE:ATTR")
@prefix_option
@click.option("--url", default=None, callback=_given_url, metavar="URL",
              help="Redis URL (default: the registry's, else $PANQUEUE_URL, else "
                   "redis://localhost:6379/0).")
@click.option("-q", "--queue", "queues", multiple=True, metavar="QUEUE",
              help="Serve only this queue (repeatable; default: every queue of the registry).")
@click.option("--concurrency", type=POSITIVE_INT, default=None, metavar="N",
              help="Concurrency of handlers that declare none (default 1).")
@click.option("--backend", type=click.Choice(["asyncio", "trio"]), default="asyncio",
              show_default=True, help="Event loop (trio needs the trio extra).")
@click.option("--grace", type=FLOAT_NON_NEGATIVE, default=30.0, show_default=True,
              metavar="SECONDS", help="Seconds running jobs get to finish on shutdown.")
@click.option("--poll-interval", type=FLOAT_POSITIVE, default=2.0, show_default=True,
              metavar="SECONDS", help="Longest idle sleep if a wake-up message is missed (> 0).")
@click.option("--log-format", type=click.Choice(["console", "json"]), default="console",
              show_default=True, help="console for people, json lines for log collectors.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True, help="Logs go to stderr.")
@click.option("--log-jobs", is_flag=True,
              help="Log a line for every completed job too (at debug level, shown whatever "
                   "--log-level is).")
@click.option("--name", default=None, metavar="NAME",
              help="The worker's name (default: host and process id).")
@click.option("--burst", is_flag=True,
              help="Exit 0 once the queues are empty (waiting, due delayed and active).")
@click.option("--reload", is_flag=True,
              help="Restart gracefully when a .py file under the current directory changes "
                   "(development; needs the reload extra).")
@click.option("--health-port", type=PORT, default=None, metavar="PORT",
              help="Serve GET /livez (the event loop turns) and /readyz (the worker claims "
                   "jobs and Redis answers; also /healthz) on this port (1-65535): 200, or "
                   "503 naming the cause.")
@click.option("--health-host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="Address the health endpoint listens on (0.0.0.0 to expose it).")
@click.option("--metrics-port", type=PORT, default=None, metavar="PORT",
              help="Serve Prometheus metrics at /metrics on this port (1-65535; needs the "
                   "metrics extra).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="Address the metrics endpoint listens on (0.0.0.0 to expose it).")
@traceback_option
def worker(app: str, url: str | None, queues: Sequence[str], concurrency: int | None, backend: str,
           grace: float, poll_interval: float, log_format: str, log_level: str, log_jobs: bool,
           name: str | None, burst: bool, reload: bool, health_port: int | None,
           health_host: str, metrics_port: int | None, metrics_host: str,
           show_traceback: bool) -> None:
    """Run workers for the queues of the registry MODULE:ATTR (for example app:queues), in this
    process, until SIGTERM or SIGINT.

    MODULE is imported with the current directory on sys.path. Shutdown: the first signal
    stops claiming and lets running jobs finish for up to --grace seconds; a second signal,
    or the end of the grace period, puts the jobs still running back to waiting at once.
    The exit code is then 0.

    --burst exits 0 once the queues have no waiting and no active job (a delayed job that
    falls due is moved to waiting first; one due later does not keep the worker running).
    --reload restarts the worker, gracefully, when a .py file under the current directory
    changes (pip install 'panqueue[reload]'). If MODULE then fails to import (a syntax error
    in the file being edited), the error is printed and the worker waits for the next change
    instead of exiting.

    --health-port serves GET /livez and GET /readyz (loopback only unless --health-host says
    otherwise), each a JSON body (queues, processed, failed). /livez is 200 while the event
    loop turns, 503 once it has been blocked for a second, naming the handler that blocks it.
    /readyz (and /healthz, the same) is 200 while the worker claims jobs and Redis has
    answered a PING in the last 3 seconds, 503 naming the cause: starting, stopping, the loop
    blocked, Redis unreachable (with the error), claims failing, every queue paused. Other
    paths are 404.

    --metrics-port serves this worker's Prometheus counters and histograms at /metrics
    (loopback only unless --metrics-host says otherwise; pip install 'panqueue[metrics]'):
    attempts by outcome, run, wait and claim times, lock renewals and losses, executor
    restarts.
    """
    if burst and reload:
        raise UsageFailure("--burst and --reload do not go together")
    if reload:
        try:
            import watchfiles  # noqa: F401
        except ImportError:
            raise UsageFailure("--reload needs watchfiles: pip install 'panqueue[reload]'"
                               ) from None
        # The application's modules are compiled from their source at every start: bytecode
        # cached by one start records only the source's size and modification time (in whole
        # seconds), so a save within the same second that keeps the size would start the old
        # code again.
        sys.dont_write_bytecode = True
    # --reload: the .py files as they are before the import, so that a save the watcher
    # cannot see (made before it runs) is found when the import fails.
    files = _python_files() if reload else {}
    try:
        registry = load_registry(app, show_traceback=show_traceback)
        if not len(registry):
            raise UsageFailure(f"{app} has no handlers")
        served = list(queues) or registry.queues
        for queue in served:
            registry.get(queue)  # ConfigError names unknown queues
    except (UsageFailure, ConfigError) as exc:
        if not reload:
            raise
        # The file being edited does not import (yet): the next save may fix it.
        print_error(str(exc))
        _wait_for_change(files)
        _restart()
    if url is None:  # the registry's, else $PANQUEUE_URL, else the default
        try:
            url = registry.url or checked_url(None)
        except click.BadParameter as exc:
            raise UsageFailure(f"$PANQUEUE_URL {exc.format_message()}") from None
    if backend == "trio":
        try:
            import trio  # noqa: F401
        except ImportError:
            raise UsageFailure("--backend trio needs trio: pip install 'panqueue[trio]'"
                               ) from None
    worker_metrics = None
    if metrics_port is not None:
        worker_metrics = import_metrics("--metrics-port").WorkerMetrics()
    configure_logging("json" if log_format == "json" else "console", log_level,
                      log_jobs=log_jobs)
    # An unreachable Redis is one error line, not worker start/stop logs followed by it. A server
    # that answers but cannot serve yet (loading its data, full) is waited out by the worker.
    try:
        client_for(url).close()
    except ServerUnavailable:
        pass
    options: dict[str, Any] = {} if name is None else {"name": name}
    if worker_metrics is not None:
        options["metrics"] = worker_metrics
    pool = WorkerPool(registry, url=url, queues=served, concurrency=concurrency, grace=grace,
                      poll_interval=poll_interval, prefix=cli_prefix(), **options)
    health = None
    if health_port is not None:
        state = HealthState(served, lambda: (sum(w.processed for w in pool.workers),
                                             sum(w.failed for w in pool.workers)),
                            claims_failing=lambda: _first(w.claims_failing for w in pool.workers),
                            blocked_by=lambda: _first(w.blocking() for w in pool.workers),
                            prefix=pool.prefix,
                            held=lambda: [w.keys.name for w in pool.workers
                                          if w.paused_by_command],
                            stopped=lambda: [w.keys.name for w in pool.workers if w.stopping])
        try:
            health = HealthServer(health_host, health_port, state)
        except OSError as exc:
            raise RuntimeFailure(f"cannot serve the health endpoint on "
                                 f"{health_host}:{health_port}: {exc.strerror or exc}"
                                 ) from None
        health.start()
    metrics_server = None
    if worker_metrics is not None:
        try:
            metrics_server = import_metrics("--metrics-port").serve(
                worker_metrics.registry, metrics_port, metrics_host)
        except OSError as exc:
            if health is not None:
                health.close()
            raise RuntimeFailure(f"cannot serve metrics on {metrics_host}:{metrics_port}: "
                                 f"{exc.strerror or exc}") from None
    try:
        restart = anyio.run(_serve, pool, url, served, grace, poll_interval, burst, reload,
                            None if health is None else health.state, backend=backend)
    finally:
        if health is not None:
            health.close()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
    if restart:
        _restart()


def _restart() -> NoReturn:
    """A fresh process imports the changed code; the same arguments serve the same queues."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "panqueue", *sys.argv[1:]])


def _wait_for_change(before: dict[str, tuple[int, int]]) -> None:
    """Block until a .py file under the current directory changes (--reload); SIGINT and
    SIGTERM end the command meanwhile. The watcher sees only what changes once it runs, so
    the files are then held to ``before`` (as they were when the failed import began): a
    save made in between counts too."""
    from watchfiles import PythonFilter, watch

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # The watcher runs from its first step on; an empty set says it ran a while and saw nothing.
    changes = watch(os.getcwd(), watch_filter=PythonFilter(), stop_event=stop, rust_timeout=100,
                    yield_on_timeout=True)
    first = next(changes, None)
    if first is None:  # stopped by a signal
        raise click.exceptions.Exit(0)
    if first or _python_files() != before:
        return
    click.echo("panqueue: waiting for a .py file to change (--reload)", err=True)
    for changed in changes:
        if changed:
            return
    raise click.exceptions.Exit(0)


def _python_files() -> dict[str, tuple[int, int]]:
    """The .py files under the current directory that --reload watches, each with its
    modification time (ns) and size."""
    from watchfiles import Change, PythonFilter

    python = PythonFilter()
    found = {}
    for root, dirs, names in os.walk(os.getcwd()):
        dirs[:] = [d for d in dirs if d not in python.ignore_dirs]
        for name in names:
            path = os.path.join(root, name)
            if python(Change.modified, path):
                try:
                    stat = os.stat(path)
                except OSError:
                    continue
                found[path] = (stat.st_mtime_ns, stat.st_size)
    return found


def _first(values: Iterable[T | None]) -> T | None:
    return next((value for value in values if value is not None), None)


async def _serve(pool: WorkerPool, url: str, queues: list[str], grace: float,
                 poll_interval: float, burst: bool, reload: bool,
                 health: HealthState | None) -> bool:
    """Run the pool; the first SIGTERM/SIGINT starts the two-phase shutdown, a second one
    skips to the forced phase. Returns True when the code changed and we should restart: never
    after a signal, even one that came while the restart drained the running jobs."""
    restart = signalled = False

    async def shutdown(why: str) -> None:
        if health is not None:
            health.stop_reason = why
            health.stopping = True
        await pool.shutdown(grace)

    async with anyio.create_task_group() as tg:

        async def handle_signals() -> None:
            nonlocal signalled
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                stopping = False
                async for signum in signals:
                    signalled = True
                    if not stopping:
                        stopping = True
                        name = signal.Signals(signum).name
                        notice(f"{name} received; finishing running jobs (up to {grace:g} s; "
                               f"again to force)", signal=name, grace=grace)
                        tg.start_soon(shutdown, f"{name} received; draining running jobs")
                    else:
                        notice("forcing shutdown", signal=signal.Signals(signum).name)
                        pool.force()

        async def stop_when_empty() -> None:
            await _wait_until_empty(url, pool.prefix, queues, poll_interval)
            notice("queues empty (--burst); stopping", queues=queues)
            await shutdown("queues empty, --burst")

        async def stop_on_change() -> None:
            nonlocal restart
            from watchfiles import PythonFilter, awatch

            async for changes in awatch(os.getcwd(), watch_filter=PythonFilter()):
                changed = sorted({os.path.relpath(path) for _, path in changes})
                notice(f"{', '.join(changed)} changed; restarting", changed=changed)
                restart = True
                await shutdown("code changed, --reload")
                return

        tg.start_soon(handle_signals)
        if burst:
            tg.start_soon(stop_when_empty)
        if reload:
            tg.start_soon(stop_on_change)
        if health is None:
            await pool.run()
        else:
            tg.start_soon(health.keep_turning)
            tg.start_soon(health.keep_pinging, url)
            await _run_reporting(pool, health)
        tg.cancel_scope.cancel()
    return restart and not signalled


async def _run_reporting(pool: WorkerPool, health: HealthState) -> None:
    """Run the pool, with ``health.claiming`` true from the moment every worker claims until
    the pool stops (a signal, --burst and --reload set ``health.stopping`` before that)."""
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        health.claiming = True
    health.claiming = False


async def _wait_until_empty(url: str, prefix: str | None, queues: list[str],
                            poll_interval: float) -> None:
    """Return once every queue has no waiting and no active job on two checks in a row.

    A delayed job that falls due is moved to waiting by the workers, so two empty checks a
    poll interval apart also mean no delayed job is due; one due later does not keep a burst
    worker alive."""
    interval = min(max(poll_interval, 0.1), 1.0)
    empty_checks = 0
    async with QueueClient(url, prefix=prefix) as client:
        while empty_checks < 2:
            await anyio.sleep(interval)
            busy = False
            try:
                for queue in queues:
                    counts = await client.counts(queue)
                    if counts[JobState.WAITING] or counts[JobState.ACTIVE]:
                        busy = True
                        break
            except ConnectionError:
                # Redis away: a check not answered is no empty check, and no reason to stop
                # (the workers ride the outage out; they log it).
                busy = True
            empty_checks = 0 if busy else empty_checks + 1
