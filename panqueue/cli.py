"""The ``panqueue`` command line (also ``python -m panqueue``).

Every failure a user can cause (bad MODULE:ATTR, unreachable Redis, unknown queue, invalid
JSON) prints one line on stderr and exits non-zero; tracebacks are for bugs only. The commands
use the public client API only (``SyncQueueClient``, ``WorkerPool``), like any application.

Longer than our usual 300 lines: it holds every command and the parser that names their
options, each short; a reader looks for a command here, and finds all of them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import anyio

from panqueue._client import SyncQueueClient
from panqueue._job import JobState
from panqueue._log import configure_logging
from panqueue._pool import WorkerPool
from panqueue._registry import Registry
from panqueue._url import resolve_url
from panqueue.errors import ConfigError, PanqueueError

__all__ = ["main"]

EXIT_ERROR = 1
EXIT_USAGE = 2


class _UserError(Exception):
    """A problem with the command's input: printed as one line."""


def _fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    print(f"panqueue: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def load_registry(spec: str) -> Registry:
    """Import ``MODULE:ATTR`` (from the current directory too) and return the Registry."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise _UserError(f"expected MODULE:ATTR (for example app:queues), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _UserError(f"cannot import module {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _UserError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Registry):
        raise _UserError(f"{spec} is a {type(obj).__name__}, not a panqueue.Registry")
    return obj


def _client(args: argparse.Namespace) -> SyncQueueClient:
    client = SyncQueueClient(args.url)
    client.ping()  # fail fast and clearly
    return client


def _require_queue(client: SyncQueueClient, queue: str) -> None:
    if not client.queue_exists(queue):
        raise _UserError(f"unknown queue {queue!r} (no job or worker has used it)")


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


# --------------------------------------------------------------------------- commands


def cmd_worker(args: argparse.Namespace) -> int:
    registry = load_registry(args.app)
    if not len(registry):
        raise _UserError(f"{args.app} has no handlers")
    queues = args.queue or registry.queues
    for queue in queues:
        registry.get(queue)  # ConfigError names unknown queues
    configure_logging(args.log_format, args.log_level)
    if args.backend == "trio":
        try:
            import trio  # noqa: F401
        except ImportError:
            raise _UserError("--backend trio needs trio: pip install 'panqueue[trio]'") from None
    # An unreachable Redis is one error line, not worker start/stop logs followed by it.
    _client(args).close()
    pool = WorkerPool(registry, url=args.url, queues=queues, concurrency=args.concurrency,
                      grace=args.grace, poll_interval=args.poll_interval)
    anyio.run(_serve, pool, args.grace, backend=args.backend)
    return 0


async def _serve(pool: WorkerPool, grace: float) -> None:
    """Run the pool; the first SIGTERM/SIGINT starts the two-phase shutdown, a second one
    skips to the forced phase."""
    async with anyio.create_task_group() as tg:

        async def handle_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                stopping = False
                async for signum in signals:
                    if not stopping:
                        stopping = True
                        print(f"panqueue: {signal.Signals(signum).name} received; finishing "
                              f"running jobs (up to {grace:g} s; again to force)",
                              file=sys.stderr)
                        tg.start_soon(pool.shutdown, grace)
                    else:
                        print("panqueue: forcing shutdown", file=sys.stderr)
                        pool.force()

        tg.start_soon(handle_signals)
        await pool.run()
        tg.cancel_scope.cancel()


def cmd_enqueue(args: argparse.Namespace) -> int:
    try:
        data = json.loads(args.data)
    except json.JSONDecodeError as exc:
        raise _UserError(f"invalid JSON for the job data: {exc}") from None
    with _client(args) as client:
        handle = client.queue(args.queue).add(data, delay=args.delay, priority=args.priority,
                                              job_id=args.job_id)
    print(handle.id)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.queue:
            _require_queue(client, args.queue)
            queues = [args.queue]
        else:
            queues = client.queues()
        rows = []
        for queue in queues:
            counts = client.counts(queue)
            paused = client.is_paused(queue)
            rows.append((queue, counts, paused))
    if args.json:
        _print_json({q: {**{s.value: n for s, n in c.items()}, "paused": p} for q, c, p in rows})
        return 0
    if not rows:
        print("no queues")
        return 0
    states = [JobState.WAITING, JobState.DELAYED, JobState.BLOCKED, JobState.ACTIVE,
              JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED]
    width = max(5, *(len(q) for q, _, _ in rows))
    print(f"{'queue':<{width}}  " + "  ".join(f"{s.value:>9}" for s in states))
    for queue, counts, paused in rows:
        line = f"{queue:<{width}}  " + "  ".join(f"{counts[s]:>9}" for s in states)
        print(line + ("  (paused)" if paused else ""))
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    with _client(args) as client:
        info = client.get_job(args.queue, args.id)
    _print_json(info.to_dict())
    return 0


def cmd_dlq(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _require_queue(client, args.queue)
        if args.retry:
            moved = client.retry_failed(args.queue)
            print(f"{moved} job(s) moved back to waiting")
            return 0
        # The newest failures, printed oldest first.
        failed = client.list_jobs(args.queue, JobState.FAILED, limit=args.limit)
        entries = []
        for info in reversed(failed):
            entries.append({
                "id": info.id,
                "reason": info.failure_reason,
                "error": None if info.error is None else f"{info.error.type}: {info.error.message}",
                "attempts": info.attempts,
                "finished_at": None if info.finished_at is None else info.finished_at.isoformat(),
            })
    if args.json:
        _print_json(entries)
    elif not entries:
        print(f"dead-letter set of {args.queue!r} is empty")
    else:
        for e in entries:
            print(f"{e['id']}\t{e['reason']}\t{e['attempts']} attempt(s)\t{e['error']}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _require_queue(client, args.queue)
        if args.command == "pause":
            client.pause(args.queue)
        else:
            client.resume(args.queue)
    print(f"{args.queue}: {'paused' if args.command == 'pause' else 'resumed'}")
    return 0


def cmd_schedules(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.remove:
            if not args.queue:
                raise _UserError("--remove needs the QUEUE the schedule belongs to")
            if not client.remove_schedule(args.queue, args.remove):
                raise _UserError(f"no schedule {args.remove!r} in queue {args.queue!r}")
            print(f"schedule {args.remove!r} removed from {args.queue!r}")
            return 0
        queues = [args.queue] if args.queue else client.queues()
        if args.queue:
            _require_queue(client, args.queue)
        found = [info for queue in queues for info in client.schedules(queue)]
    if args.json:
        _print_json([{"name": i.name, "queue": i.queue, "next_run": i.next_run.isoformat(),
                      **i.definition} for i in found])
    elif not found:
        print("no schedules")
    else:
        for i in found:
            when = i.definition.get("cron") or f"every {i.definition.get('every')} s"
            print(f"{i.queue}\t{i.name}\t{when} ({i.definition.get('tz')})\t"
                  f"next {i.next_run.isoformat()}")
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    from panqueue.embedded import RedisServer

    directory = Path(args.dir)
    server = RedisServer(port=args.port, directory=directory,
                         log_to=str(directory.resolve() / "server.log"))

    async def serve() -> None:
        # Listen for signals before the server starts: a SIGTERM or Ctrl-C that arrives while
        # it starts is then queued instead of killing us, which would leave the server (in a
        # session of its own, out of the signal's reach) running with nobody to stop it.
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            server.start()
            try:
                print(f"panqueue: {Path(server.binary).name} listening on {server.url} "
                      f"(data in {directory}, append-only); Ctrl-C stops it", flush=True)
                async for _ in signals:
                    return
            finally:
                server.stop()
                print("panqueue: server stopped", file=sys.stderr)

    anyio.run(serve)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from panqueue._demo import run_demo

    return run_demo(url=args.url, jobs=args.jobs, workers=args.workers)


# --------------------------------------------------------------------------- parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="panqueue", description="Redis-backed job queue.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, *, url: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if url:
            p.add_argument("--url", default=None,
                           help="Redis URL (default: $PANQUEUE_URL, else redis://localhost:6379/0)")
        return p

    p = add("worker", "run workers for the queues of a registry")
    p.add_argument("app", metavar="MODULE:ATTR", help="the Registry, for example app:queues")
    p.add_argument("-q", "--queue", action="append", help="serve only this queue (repeatable)")
    p.add_argument("--concurrency", type=_positive_int, default=None,
                   help="concurrency of handlers that declare none (default 1)")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds running jobs get to finish on shutdown (default 30)")
    p.add_argument("--poll-interval", type=float, default=2.0,
                   help="idle polling fallback in seconds (default 2)")
    p.add_argument("--log-format", choices=("console", "json"), default="console")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=cmd_worker)

    p = add("enqueue", "add one job")
    p.add_argument("queue")
    p.add_argument("data", metavar="JSON", help="the job's data as JSON")
    p.add_argument("--delay", type=float, default=None, help="seconds before it may run")
    p.add_argument("--priority", type=int, default=None, help="higher runs first (default 0)")
    p.add_argument("--job-id", default=None, help="custom id (adding it twice is a no-op)")
    p.set_defaults(func=cmd_enqueue)

    p = add("stats", "job counts per state")
    p.add_argument("queue", nargs="?")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)

    p = add("job", "one job, as JSON")
    p.add_argument("queue")
    p.add_argument("id")
    p.set_defaults(func=cmd_job)

    p = add("dlq", "the dead-letter set (failed jobs) of a queue")
    p.add_argument("queue")
    p.add_argument("--retry", action="store_true", help="move every failed job back to waiting")
    p.add_argument("--limit", type=_positive_int, default=100)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_dlq)

    for name, text in (("pause", "stop workers from claiming jobs of a queue"),
                       ("resume", "let workers claim jobs of a paused queue again")):
        p = add(name, text)
        p.add_argument("queue")
        p.set_defaults(func=cmd_pause)

    p = add("schedules", "list schedules (repeatable and cron jobs), or remove one")
    p.add_argument("queue", nargs="?")
    p.add_argument("--remove", metavar="NAME", help="delete this schedule from Redis")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_schedules)

    p = add("server", "run a private Redis-compatible server for development", url=False)
    p.add_argument("--port", type=_positive_int, default=6390)
    p.add_argument("--dir", default=".panqueue/redis", help="data directory")
    p.set_defaults(func=cmd_server)

    p = add("demo", "start a private server, run jobs through workers, print a summary")
    p.add_argument("--jobs", type=_positive_int, default=300)
    p.add_argument("--workers", type=_positive_int, default=2)
    p.set_defaults(func=cmd_demo)
    return parser


def _find_error(exc: BaseException) -> BaseException | None:
    """The user-facing error inside an exception group raised by a task group."""
    if isinstance(exc, (PanqueueError, _UserError)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find_error(inner)
            if found is not None:
                return found
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        # The demo starts its own private server unless a URL is given explicitly.
        args.url = args.url or os.environ.get("PANQUEUE_URL")
    elif hasattr(args, "url"):
        args.url = resolve_url(args.url)
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        found = _find_error(exc)
        if found is None:
            raise
        if isinstance(found, ConfigError | _UserError):
            _fail(str(found), EXIT_USAGE)
        _fail(str(found))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
