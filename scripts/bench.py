"""panqueue baseline benchmark: enqueue rate, process rate, pickup latency.

    .venv/bin/python scripts/bench.py [--quick] [--executors | --keyed | --spark | --dashboard
                                      | --memory | --scale | --history | --chunk | --batch
                                      | --partitions | --permissions | --durable]
                                      [--backend asyncio|trio]
                                      [--json FILE]

Starts a private redis-server on a free loopback port (append-only persistence OFF, RDB
snapshots off, no maxmemory), runs every measurement against it, and stops it. The Redis on
6379 is never touched. What each figure means is written up in docs/performance.md; how each is
measured, in the docstring of its module under ``scripts/benchmarks/``:

* the default run: ``enqueue`` (single adds on both clients, ``add_bulk``), ``process`` (ONE
  worker process draining no-op jobs) and ``latency`` (pickup by an idle worker), tabled by
  ``baseline``; then ``executors`` (inline / thread / subprocess), which ``--quick`` alone
  skips.
* ``--executors``: that comparison only (smaller N with ``--quick``).
* ``--keyed``: ``keyed``, claim cost against the number of distinct keys (only on request).
* ``--spark``: ``spark``, enqueue_dataframe and read_jobs against add_bulk (only on request;
  needs the ``spark`` extra and Java 17).
* ``--dashboard``: ``dashboard_paging``, the dashboard's jobs page of a state holding
  1,000,000 jobs (only on request; needs the ``dashboard`` extra).
* ``--memory``: ``memory``, Redis memory per waiting job, panqueue against BullMQ (only on
  request; the BullMQ row needs node and bullmq, see the module).
* ``--scale``: ``scale``, 1, 2 and 4 worker processes draining one queue (only on request).
* ``--history``: ``history``, what the history record costs a completion, the history stream's
  memory per record, and export_history of 1,000,000 records on local[2] (only on request;
  the export needs the ``spark`` extra and Java 17).
* ``--chunk``: ``chunk``, a no-op plain handler against a no-op chunk handler of 100, and the
  ratio of their process rates (only on request).
* ``--batch``: ``batch``, 100,000 jobs added through ``batch.add_bulk`` against plain
  ``add_bulk`` (only on request).
* ``--durable``: ``durable``, what a durable step costs a job (0, 1 and 10 steps, concurrency 1
  and 16) and the Redis memory of a stored step (only on request).
* ``--partitions``: ``partitions``, one queue of 1 and of 4 partitions on one server, 1 and 2
  worker processes: jobs/s and Redis µs/job, for docs/scaling.md (only on request).
* ``--permissions``: ``permissions``, subprocess handlers without and with ``Permissions``:
  child start, per-job cost (no-op and 10 ms CPU) and per-connect cost (only on request;
  Linux with Landlock and seccomp).

``--backend trio`` runs the worker processes with ``--backend trio`` and the benchmark's own
async client on trio too. The sync client is the same in both modes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from benchmarks import (
    baseline,
    batch,
    chunk,
    dashboard_paging,
    durable,
    executors,
    history,
    keyed,
    memory,
    partitions,
    permissions,
    scale,
    spark,
)
from benchmarks.common import Bench, log, machine_info

from panqueue._store import SyncTransport
from panqueue.embedded import RedisServer


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller N everywhere (and no executor comparison unless "
                             "--executors is given too)")
    parser.add_argument("--executors", action="store_true",
                        help="only the executor comparison (inline / thread / subprocess)")
    parser.add_argument("--keyed", action="store_true",
                        help="only the keyed-mode comparison: claim cost against the number of "
                             "distinct keys (not part of the full run)")
    parser.add_argument("--spark", action="store_true",
                        help="only the Spark figures: enqueue_dataframe and read_jobs on "
                             "local[2] against add_bulk, 1,000,000 rows (not part of the full "
                             "run; needs the spark extra and Java 17)")
    parser.add_argument("--dashboard", action="store_true",
                        help="only the dashboard's paging figures: the jobs page of a state "
                             "holding 1,000,000 jobs, first, middle and last page (not part "
                             "of the full run; needs the dashboard extra)")
    parser.add_argument("--memory", action="store_true",
                        help="only Redis memory per waiting job: 100,000 waiting jobs of 100 "
                             "bytes, panqueue against BullMQ (not part of the full run; "
                             "BullMQ's row needs node and bullmq, found through "
                             "BULLMQ_PACKAGE_JSON)")
    parser.add_argument("--scale", action="store_true",
                        help="only the scale-out curve: 1, 2 and 4 worker processes draining "
                             "one queue, jobs/s and Redis CPU (not part of the full run)")
    parser.add_argument("--history", action="store_true",
                        help="only the job history figures: the record's cost per completion, "
                             "stream memory per record, export_history of 1,000,000 records "
                             "on local[2] (not part of the full run; needs the spark extra)")
    parser.add_argument("--batch", action="store_true",
                        help="only the batch figures: 100,000 jobs through batch.add_bulk "
                             "against client add_bulk, jobs/s and their ratio (not part of "
                             "the full run)")
    parser.add_argument("--durable", action="store_true",
                        help="only the durable-step figures: per-step overhead and Redis "
                             "memory per stored step (not part of the full run)")
    parser.add_argument("--chunk", action="store_true",
                        help="only the chunk handler figures: a no-op plain handler against a "
                             "no-op chunk handler of 100, jobs/s and their ratio (not part of "
                             "the full run)")
    parser.add_argument("--partitions", action="store_true",
                        help="only the partitioned-queue figures: 1 and 4 partitions on one "
                             "server, 1 and 2 worker processes (not part of the full run)")
    parser.add_argument("--permissions", action="store_true",
                        help="only the permissions figures: subprocess handlers without and "
                             "with Permissions, child start, no-op and 10 ms CPU jobs, "
                             "connects (not part of the full run)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio",
                        help="event loop for the worker processes and the async client")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    return parser.parse_args(argv)


def sections(args: argparse.Namespace) -> tuple[list[str], str]:
    """The sections to run, in order, and the mode named in the output. ``--executors``,
    ``--keyed`` and ``--spark`` each select their section; together they run together."""
    only = (args.executors or args.keyed or args.spark or args.dashboard or args.memory
            or args.scale or args.history or args.chunk or args.batch or args.partitions
            or args.permissions or args.durable)
    todo = [name for name, wanted in (
        ("baseline", not only),
        ("executors", args.executors or (not args.quick and not only)),
        ("keyed", args.keyed),
        ("spark", args.spark),
        ("dashboard", args.dashboard),
        ("memory", args.memory),
        ("scale", args.scale),
        ("history", args.history),
        ("chunk", args.chunk),
        ("batch", args.batch),
        ("durable", args.durable),
        ("partitions", args.partitions),
        ("permissions", args.permissions),
    ) if wanted]
    mode = "quick" if args.quick else "full"
    if args.permissions:
        mode += ", permissions only"
    elif args.partitions:
        mode += ", partitions only"
    elif args.chunk:
        mode += ", chunk handlers only"
    elif args.batch:
        mode += ", batches only"
    elif args.durable:
        mode += ", durable steps only"
    elif args.history:
        mode += ", history only"
    elif args.scale:
        mode += ", scale-out only"
    elif args.memory:
        mode += ", memory only"
    elif args.dashboard:
        mode += ", dashboard only"
    elif args.spark:
        mode += ", spark only"
    elif args.keyed:
        mode += ", keyed mode only"
    elif args.executors:
        mode += ", executors only"
    return todo, mode


def print_header(machine: dict[str, Any], mode: str, backend: str, port: int) -> None:
    print(f"panqueue benchmark, {machine['date']}  (mode: {mode}, backend: {backend})")
    print(f"machine: {machine['nproc']} CPUs, {machine['cpu_model']}, Linux "
          f"{machine['kernel']}; Python {machine['python']}; redis-py {machine['redis_py']}"
          f" (hiredis {machine['hiredis'] or 'not installed'})")
    print(f"panqueue {machine['panqueue']}")
    print(f"server:  {machine['redis_server']}")
    print(f"         private instance on 127.0.0.1:{port}, appendonly OFF, "
          "RDB snapshots off (figures exclude persistence cost)")
    print()


def measure(bench: Bench, todo: list[str], quick: bool) -> dict[str, Any]:
    """Run the sections; the result is keyed as in the JSON output."""
    figures: dict[str, Any] = {}
    if "baseline" in todo:
        figures.update(baseline.run(bench, quick))
    if "executors" in todo:
        figures["executors"] = executors.run(bench, quick)
    if "keyed" in todo:
        figures["keyed"] = keyed.run(bench, quick)
    if "spark" in todo:
        figures["spark"] = spark.run(bench, quick)
    if "dashboard" in todo:
        figures["dashboard"] = dashboard_paging.run(bench, quick)
    if "memory" in todo:
        figures["memory"] = memory.run(bench, quick)
    if "scale" in todo:
        figures["scale"] = scale.run(bench, quick)
    if "history" in todo:
        figures["history"] = history.run(bench, quick)
    if "chunk" in todo:
        figures["chunk"] = chunk.run(bench, quick)
    if "batch" in todo:
        figures["batch"] = batch.run(bench, quick)
    if "durable" in todo:
        figures["durable"] = durable.run(bench, quick)
    if "partitions" in todo:
        figures["partitions"] = partitions.run(bench, quick)
    if "permissions" in todo:
        figures["permissions"] = permissions.run(bench, quick)
    return figures


def report(figures: dict[str, Any], quick: bool, backend: str, worker_log: str) -> None:
    if "enqueue" in figures:
        baseline.report(figures, backend)
    if figures.get("executors"):
        if "enqueue" in figures:
            print()
        executors.report(figures["executors"])
    if figures.get("keyed"):
        keyed.report(figures["keyed"], quick)
    if "spark" in figures:
        spark.report(figures["spark"])
    if "dashboard" in figures:
        dashboard_paging.report(figures["dashboard"])
    if "memory" in figures:
        memory.report(figures["memory"])
    if "scale" in figures:
        scale.report(figures["scale"])
    if "history" in figures:
        history.report(figures["history"])
    if "chunk" in figures:
        chunk.report(figures["chunk"])
    if "batch" in figures:
        batch.report(figures["batch"])
    if "durable" in figures:
        durable.report(figures["durable"])
    if "partitions" in figures:
        partitions.report(figures["partitions"])
    if "permissions" in figures:
        permissions.report(figures["permissions"])
    if worker_log:
        print()
        print("worker output (warnings and errors):")
        print(worker_log)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    todo, mode = sections(args)
    server = RedisServer(appendonly=False, extra_args=("--maxmemory", "0"))
    server.start()
    log_path = Path(tempfile.mkstemp(prefix="panqueue-bench-worker-", suffix=".log")[1])
    started = time.monotonic()
    try:
        assert server.pid is not None
        machine = machine_info(server)
        print_header(machine, mode, args.backend, server.port)
        store = SyncTransport(server.url)
        with open(log_path, "ab") as log_file, contextlib.closing(store):
            bench = Bench(server.url, redis.Redis.from_url(server.url), store, server.pid,
                          args.backend, log_file)
            figures = measure(bench, todo, args.quick)
    except BaseException:
        sys.stderr.write(f"worker log ({log_path}):\n{log_path.read_text()}\n")
        raise
    finally:
        server.cleanup()
    # The shutdown notice every worker prints on the benchmark's SIGTERM is not news.
    worker_log = "\n".join(line for line in log_path.read_text().splitlines()
                           if "SIGTERM received; finishing running jobs" not in line).strip()
    log_path.unlink()
    log(f"done in {time.monotonic() - started:.0f} s")
    report(figures, args.quick, args.backend, worker_log)

    if args.json:
        payload: dict[str, Any] = {
            "machine": machine,
            "mode": mode,
            "backend": args.backend,
            "appendonly": False,
            "command": " ".join([".venv/bin/python", "scripts/bench.py",
                                 *(sys.argv[1:] if argv is None else argv)]),
            **figures,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
