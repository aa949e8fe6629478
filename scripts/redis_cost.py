"""What a plain no-op job costs Redis: server CPU and the commands its scripts make.

    .venv/bin/python scripts/redis_cost.py [--jobs N] [--tags T] [--partitions] [--workers W]
                                          [--no-events] [--direct] [--instructions]
                                          [--batch K] [--adds | --handed] [--json FILE]

Starts a private redis-server (appendonly off, RDB off), adds N no-op jobs to ``bench-noop``
with ``add_bulk`` (default settings), then lets ONE worker process (``bench_app:queues``,
concurrency 50) drain them. For each phase, add and process (claim and completion), it takes
the deltas of ``INFO commandstats`` (calls and µs per command, per job) and of ``INFO cpu``
(``used_cpu_user + used_cpu_sys`` of the server, per job). The process phase includes the
worker's start and its upkeep calls (heartbeats, the stalled sweep), a few calls in all.
With ``--tags T`` each job is added alone (``add``, one call per job) carrying T tags, so that
runs with T = 0, 1, 4 give what a tag costs, on adding and on the job's removal.
With ``--partitions`` the queue is ``bench-noop-p4`` (4 partitions on the one server), and with
``--workers W`` W worker processes drain it: the queue is paused while they start, and resumed
once all are registered and a second has passed (each claim loop has read the others, so the
partitions are shared out from the first claim).
With ``--no-events`` the queue is ``bench-noop-quiet``, which keeps no events
(``Retention(events=0)``): a worker sets it up (and stops) before the jobs are added, as in a
deployment whose workers run before its producers add.
With ``--direct`` no worker runs: this process drives the steady state's script itself (one
completion call of 25 jobs that claims the next 25, as a busy worker's slots do), in six
rounds, and prints the server CPU per job of each round: the scripts' own cost, without a
worker process sharing the machine's cores with the server. ``--instructions`` does the same
against a redis-server run under valgrind (callgrind) and prints the instructions it executed
per job: slow (2,000 jobs take about ten seconds), but the same figure on every run, so that two
versions of the scripts compare to the last percent on a busy host. With ``--adds`` both drive
single adds instead (one job per call, nobody idle); with ``--handed`` each of those adds hands
its job to an idle worker, whose registration a plain ``ZADD`` makes before each add (the add
of a pickup: ``scripts/pickup.py``).
The Redis on 6379 is never touched.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_app  # beside this script
import redis

import panqueue
from panqueue import JobState, SyncQueueClient
from panqueue._codec import encode
from panqueue._keys import partition_keys
from panqueue._runtime.shares import PEERS_EVERY
from panqueue._store.loader import SCRIPTS as LUA
from panqueue._store.ops import NewJob, add_jobs
from panqueue._store.transport import ScriptCall, SyncTransport
from panqueue.embedded import RedisServer

SCRIPTS = Path(__file__).resolve().parent
PANQUEUE_ROOT = Path(panqueue.__file__).resolve().parent.parent
QUEUE = "bench-noop"
BATCH = 1000


def snapshot(r: redis.Redis) -> tuple[dict[str, tuple[int, int]], float]:
    stats = r.info("commandstats")
    cpu = r.info("cpu")
    cmds = {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in stats.items()}
    return cmds, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def delta(before: tuple[dict[str, tuple[int, int]], float],
          after: tuple[dict[str, tuple[int, int]], float], n: int) -> dict[str, Any]:
    rows = {}
    for name, (calls, usec) in after[0].items():
        c0, u0 = before[0].get(name, (0, 0))
        if calls - c0 > 0 and name not in ("info",):
            rows[name] = {"calls_per_job": (calls - c0) / n, "usec_per_job": (usec - u0) / n}
    return {"cpu_us_per_job": (after[1] - before[1]) / n * 1e6, "commands": rows}


def waiting_and_active(client: Any, queue: str) -> int:
    counts = client.counts(queue)
    return counts[JobState.WAITING] + counts[JobState.ACTIVE]


def start_workers(url: str, name: str, count: int, log: Any) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SCRIPTS), str(PANQUEUE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return [subprocess.Popen(
        [sys.executable, "-m", "panqueue", "worker", "bench_app:queues", "-q", name,
         "--concurrency", "50", "--log-level", "warning", "--url", url],
        cwd=SCRIPTS, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        for _ in range(count)]


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(30)


def wait_registered(client: Any, name: str, count: int, deadline: float) -> None:
    while len(client.workers(name)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not start")
        time.sleep(0.02)


def run(n: int, tags: int | None = None, partitions: bool = False, workers: int = 1,
        events: bool = True) -> dict[str, Any]:
    name = QUEUE + "-p4" if partitions else QUEUE if events else QUEUE + "-quiet"
    with tempfile.TemporaryDirectory() as tmp, \
            RedisServer(directory=tmp, appendonly=False, extra_args=("--save", "")) as server:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        with SyncQueueClient(server.url) as client:
            queue = client.queue(bench_app.noop_partitioned) if partitions else client.queue(name)
            if not events:  # a worker sets the queue up (to keep no events) and stops
                with open(Path(tmp) / "setup.log", "wb") as log:
                    setup = start_workers(server.url, name, 1, log)
                    try:
                        wait_registered(client, name, 1, time.monotonic() + 60)
                    finally:
                        stop_workers(setup)
            queue.add({"warm": True})  # the scripts are loaded before the figures start
            gate = partitions or workers > 1
            if gate:
                client.pause(name)
            r.execute_command("CONFIG", "RESETSTAT")
            s0 = snapshot(r)
            if tags is None:
                for b in range(0, n, BATCH):
                    queue.add_bulk([{"i": i} for i in range(b, min(b + BATCH, n))])
            else:
                labels = [f"tag:{k}" for k in range(tags)] or None
                for i in range(n):
                    queue.add({"i": i}, tags=labels)
            s1 = snapshot(r)
            with open(Path(tmp) / "worker.log", "wb") as log:
                procs = start_workers(server.url, name, workers, log)
                try:
                    deadline = time.monotonic() + 600
                    if gate:
                        wait_registered(client, name, workers, deadline)
                        # Every claim loop has read the registry since all were in it.
                        time.sleep(PEERS_EVERY + 0.1)
                        client.resume(name)
                    while waiting_and_active(client, name) > 0:
                        if (any(p.poll() is not None for p in procs)
                                or time.monotonic() > deadline):
                            raise RuntimeError("a worker stopped or the queue did not drain")
                        time.sleep(0.02)
                    s2 = snapshot(r)
                finally:
                    stop_workers(procs)
        return {"jobs": n, "queue": name, "workers": workers, "add": delta(s0, s1, n),
                "process": delta(s1, s2, n + 1)}


class SteadyCalls:
    """The steady state's script driven from this process: completion calls of k jobs that
    claim the next k, on a queue of pre-added no-op jobs (retention keeps 1,000)."""

    def __init__(self, url: str, jobs: int, k: int = 25, functions: bool = True) -> None:
        # The keys a client's queue handle routes by: its calls declare the queue's layout
        # (one partition), which the add script checks and stores.
        self.k, [self.keys] = k, partition_keys(QUEUE, 1)
        self.transport = SyncTransport(url)
        self.transport._functions.on = functions
        for _ in range(0, jobs + 1000 + k, BATCH):
            self.transport.run(add_jobs(self.keys, [NewJob(None, encode({}))
                                                    for _ in range(BATCH)]))
        reply = self.call(LUA.claim, "w:1:0", 30_000, k)
        self.ids, self.token = reply[2::5][:reply[0]], 0
        self.run(1000)  # the completed set fills to what retention keeps

    def call(self, script: Any, *args: Any) -> Any:
        return self.transport.execute(ScriptCall(script, (self.keys.prefix,), args))

    def run(self, jobs: int) -> int:
        """Complete about ``jobs`` jobs; returns how many."""
        done = 0
        while done < jobs:
            self.token += 1
            args: list[Any] = [self.k]
            for job_id in self.ids:
                args += [job_id, f"w:1:{self.token - 1}", encode("ok"), 1]
            reply = self.call(LUA.complete, 1000, f"w:1:{self.token}", 30_000, *args)
            self.ids = reply[self.k + 2::5][:reply[self.k]]
            done += self.k
        return done

    def add(self, jobs: int) -> int:
        """Add ``jobs`` jobs one call each (``add()``, as a web request does); returns how
        many."""
        for _ in range(jobs):
            self.transport.run(add_jobs(self.keys, [NewJob(None, encode({}))]))
        return jobs

    def add_handed(self, jobs: int) -> int:
        """As :meth:`add`, each job handed to an idle worker: before each add, a registration
        as a worker's empty claim leaves it (a plain ``ZADD``, counted with the add)."""
        for _ in range(jobs):
            self.token += 1
            self.transport.client.zadd(self.keys.idle, {f"30000:idle:1:{self.token}": 2**50})
            self.transport.run(add_jobs(self.keys, [NewJob(None, encode({}))]))
        return jobs

    def driver(self, kind: str) -> Any:
        """The calls of ``kind``: "complete", "add" or "handed"."""
        return {"complete": self.run, "add": self.add, "handed": self.add_handed}[kind]


def run_direct(n: int, rounds: int = 6, k: int = 25, functions: bool = True,
               kind: str = "complete") -> list[float]:
    """Server CPU per job (µs) of each of ``rounds`` rounds of n / rounds jobs."""
    with tempfile.TemporaryDirectory() as tmp, \
            RedisServer(directory=tmp, appendonly=False, extra_args=("--save", "")) as server:
        steady = SteadyCalls(server.url, n, k, functions)
        try:
            figures = []
            for _ in range(rounds):
                before = snapshot(steady.transport.client)[1]
                done = steady.driver(kind)(n // rounds)
                figures.append((snapshot(steady.transport.client)[1] - before) * 1e6 / done)
            return figures
        finally:
            steady.transport.close()


class CallgrindServer:
    """Debian's redis-server (the one on ``PATH``) as a private server (``RedisServer``), run
    under valgrind's callgrind, which counts the instructions it executes: the same figure on
    every run and host load, so that two versions of the scripts compare to the last percent.
    Use with ``with``."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        self._out = Path(self._tmp.name) / "callgrind.out"
        wrapper = Path(self._tmp.name) / "redis-server-under-callgrind"
        wrapper.write_text(f"#!/bin/sh\nexec valgrind --tool=callgrind "
                           f"--callgrind-out-file={self._out} redis-server \"$@\"\n")
        wrapper.chmod(0o755)
        self.server = RedisServer(directory=self._tmp.name, binary=str(wrapper),
                                  appendonly=False)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def __enter__(self) -> CallgrindServer:
        try:
            self.server.start(timeout=60)  # valgrind takes seconds to start it
        except BaseException:
            self._tmp.cleanup()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self.server.stop(timeout=60)
        finally:
            self._tmp.cleanup()

    def _control(self, option: str) -> None:
        # callgrind_control returns once the server has done what it asks.
        subprocess.run(["callgrind_control", option, str(self.server.pid)], check=True,
                       capture_output=True)

    def zero(self) -> None:
        """Count from now."""
        self._control("-z")

    def counted(self) -> int:
        """The instructions executed since the last :meth:`zero`."""
        self._control("-d")
        dump = max(self._out.parent.glob(self._out.name + ".*"), key=lambda p: p.stat().st_mtime)
        for line in dump.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError("no totals in the callgrind dump")


def run_instructions(n: int, k: int = 25, functions: bool = True,
                     kind: str = "complete") -> float:
    """Instructions the server executes per job (:class:`CallgrindServer`)."""
    with CallgrindServer() as server:
        steady = SteadyCalls(server.url, n, k, functions)
        try:
            steady.driver(kind)(k)  # the library or the script loaded
            server.zero()
            done = steady.driver(kind)(n)
            return server.counted() / done
        finally:
            steady.transport.close()


def show(result: dict[str, Any]) -> None:
    total = 0.0
    for phase in ("add", "process"):
        d = result[phase]
        total += d["cpu_us_per_job"]
        cmd_total = sum(v["usec_per_job"] for k, v in d["commands"].items() if k != "evalsha")
        print(f"{phase}: Redis CPU {d['cpu_us_per_job']:.1f} µs/job; commands "
              f"(inside scripts and out, EVALSHA apart) {cmd_total:.1f} µs/job")
        for name, v in sorted(d["commands"].items(), key=lambda kv: -kv[1]["usec_per_job"]):
            print(f"  {name:<16} {v['calls_per_job']:8.3f} calls/job "
                  f"{v['usec_per_job']:8.2f} µs/job")
    print(f"total Redis CPU {total:.1f} µs/job")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--tags", type=int, metavar="T",
                        help="add each job alone, with T tags (0: alone, without tags)")
    parser.add_argument("--partitions", action="store_true",
                        help="the queue of 4 partitions (bench-noop-p4)")
    parser.add_argument("--workers", type=int, default=1, metavar="W")
    parser.add_argument("--no-events", action="store_true",
                        help="the queue that keeps no events (bench-noop-quiet)")
    parser.add_argument("--direct", action="store_true",
                        help="no worker: drive the completion script from this process")
    parser.add_argument("--instructions", action="store_true",
                        help="as --direct, counting the server's instructions under valgrind")
    parser.add_argument("--batch", type=int, default=25, metavar="K",
                        help="--direct, --instructions: jobs per completion call")
    parser.add_argument("--adds", action="store_true",
                        help="--direct, --instructions: single adds (one job per call) instead")
    parser.add_argument("--handed", action="store_true",
                        help="as --adds, each job handed to an idle worker")
    parser.add_argument("--evalsha", action="store_true",
                        help="--direct, --instructions: call the scripts with EVALSHA, not FCALL")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    kind = "handed" if args.handed else "add" if args.adds else "complete"
    what = {"handed": "single add handed to an idle worker", "add": "single add",
            "complete": f"completion + claim of the next ({args.batch} a call)"}[kind]
    what += ", EVALSHA" if args.evalsha else ""
    if args.instructions:
        count = run_instructions(args.jobs, args.batch, not args.evalsha, kind)
        print(f"{what}: {count:,.0f} instructions per job in redis-server")
        return
    if args.direct:
        figures = run_direct(args.jobs, k=args.batch, functions=not args.evalsha, kind=kind)
        print(f"{what}: Redis CPU µs/job per round: "
              + " ".join(f"{x:.2f}" for x in figures)
              + f"; median {sorted(figures)[len(figures) // 2]:.2f}")
        return
    result = run(args.jobs, args.tags, args.partitions, args.workers, not args.no_events)
    show(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
