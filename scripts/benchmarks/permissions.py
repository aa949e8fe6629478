"""What kernel-enforced permissions cost (``--permissions``, only on request): the same
subprocess handlers without ``Permissions`` (``plain``), with file grants (``files``: Landlock
and the seccomp filter) and with file and net grants (``net``: also the supervisor, attached to
every child), from ``bench_permissions_app:queues``; each case drained by ONE worker process.

* child start: a no-op with ``max_jobs_per_child=1`` at concurrency 1, so every job starts a
  child (and then stops it); each job's time from its claim to its recorded outcome (server
  clock, ms) is then mostly the child's start: an interpreter, the handler's import, and with
  permissions the rules (Landlock, the seccomp filter, the supervisor's attach). Two rounds,
  the variants alternating; the median job and the children's CPU per job are reported.
* per job: a no-op at concurrency 2 and 10 ms of CPU at concurrency 2, long-lived children,
  measured as in ``executors`` (warm-up jobs start the children before the window opens):
  jobs/s and CPU µs per job of the worker and of its children.
* the rules alone: a fresh interpreter times ``panqueue._sandbox.confine.confine`` on the
  policy the worker would send (Landlock ruleset, capabilities, the seccomp filter) and
  ``install_audit_hook``: what a child pays once, on top of the interpreter's start and the
  handler's import; and, in that child before and after, what a system call (``getppid``)
  and an open + close of a granted file cost: what the filter and Landlock add to each call.
* per connect: a handler that connects to (and closes) a local listener ``n`` times and
  returns the mean µs per connect, timed inside the child; with permissions each connect is a
  seccomp notification that the worker's supervisor thread checks and performs.

Rules are applied once per child, before it answers ``ready``: the per-job figures with
permissions should match those without, and the cost should show in the child start only.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks.common import (
    BATCH,
    Bench,
    counts,
    last_finished_ms,
    log,
    print_table,
    start_worker,
    started_ms,
    stop_worker,
    tree_cpu_seconds,
    wait_for,
)
from panqueue import JobState, Permissions, SyncQueueClient
from panqueue._store.ops import partitions as parted

APP = "bench_permissions_app:queues"
VARIANTS = ("plain", "files", "net")


class Listener:
    """A TCP listener on 127.0.0.1 that accepts and closes every connection, in a thread."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.port: int = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    listener = Listener()
    scratch = tempfile.mkdtemp(prefix="panqueue-bench-permissions-")
    saved = {k: os.environ.get(k) for k in ("PANQUEUE_BENCH_CONNECT_PORT", "PANQUEUE_BENCH_DIR")}
    # The worker processes inherit these; their children get them through env=.
    os.environ["PANQUEUE_BENCH_CONNECT_PORT"] = str(listener.port)
    os.environ["PANQUEUE_BENCH_DIR"] = scratch
    try:
        return _run(bench, quick)
    finally:
        listener.close()
        os.rmdir(scratch)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run(bench: Bench, quick: bool) -> dict[str, Any]:
    starts = 20 if quick else 50
    sizes = {"noop": (1_000, 200) if quick else (10_000, 1_000),
             "cpu": (100, 10) if quick else (500, 20)}
    connects = 200 if quick else 1_000
    figures: dict[str, Any] = {"start": [], "jobs": [], "connect": [], "rules": []}
    scratch = os.environ["PANQUEUE_BENCH_DIR"]
    port = int(os.environ["PANQUEUE_BENCH_CONNECT_PORT"])
    log(f"permissions: the rules alone, {starts} fresh interpreters each, files and net")
    figures["rules"] = rules_cost({
        "files": Permissions(read=[scratch], write=[scratch]),
        "net": Permissions(read=[scratch], write=[scratch], net=[f"127.0.0.1:{port}"])}, starts)
    rounds = 2  # the variants alternate, so a change in the machine's load hits all alike
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    for round_ in range(rounds):
        for variant in VARIANTS:
            bench.redis.flushdb()
            log(f"permissions: {starts // rounds} jobs, a fresh child each, {variant} "
                f"(round {round_ + 1} of {rounds})")
            runs[variant].append(queue_rate(bench, f"bench-p-start-{variant}", 1,
                                            starts // rounds, 1, durations=True))
    for variant, parts in runs.items():
        durations = [d for part in parts for d in part["durations_ms"]]
        figures["start"].append({
            "variant": variant, "jobs": len(durations),
            "median_job_ms": statistics.median(durations),
            "children_cpu_us_per_job": statistics.mean(
                part["children_cpu_us_per_job"] for part in parts),
            "worker_cpu_us_per_job": statistics.mean(
                part["worker_cpu_us_per_job"] for part in parts),
            "rounds": parts})
    for kind in ("noop", "cpu"):
        n, warmup = sizes[kind]
        for round_ in range(rounds):
            for variant in VARIANTS:
                bench.redis.flushdb()
                log(f"permissions: {n} {kind} jobs (+{warmup} warm-up), {variant}, "
                    f"concurrency 2 (round {round_ + 1} of {rounds})")
                figures["jobs"].append({"variant": variant, "handler": kind,
                                        "round": round_ + 1,
                                        **queue_rate(bench, f"bench-p-{kind}-{variant}", 2, n,
                                                     warmup)})
    for variant in ("plain", "net"):
        bench.redis.flushdb()
        log(f"permissions: 5 jobs of {connects} connects each, {variant}")
        figures["connect"].append({"variant": variant,
                                   **connect_cost(bench, f"bench-p-connect-{variant}",
                                                  connects)})
    return figures


def queue_rate(bench: Bench, name: str, concurrency: int, n: int, warmup: int,
               durations: bool = False) -> dict[str, Any]:
    """ONE worker process drains ``warmup`` + ``n`` pre-filled no-data jobs of ``name``; the
    window opens once the first measured job has started, as in ``executors``. With
    ``durations``, also each measured job's finished_at - started_at (ms, server clock: from
    the claim to the recorded outcome, so with a fresh child per job, the child's start and
    the job; the stopping of the previous child falls between jobs)."""
    total = warmup + n
    with SyncQueueClient(bench.url) as client:
        queue = client.queue(name)
        ids: list[str] = []
        for b in range(0, total, BATCH):
            ids += [h.id for h in queue.add_bulk([{"i": i}
                                                   for i in range(b, min(b + BATCH, total))])]
    first_id = ids[warmup]

    def waiting_active() -> tuple[int, int]:
        now = counts(bench, name)
        return now[JobState.WAITING], now[JobState.ACTIVE]

    proc = start_worker(bench, name, concurrency, app=APP)
    try:
        wait_for(lambda: waiting_active()[0] < n, 120, 0.0005, "the warm-up jobs", proc)
        (own0, kids0, _), t0 = tree_cpu_seconds(proc.pid), time.monotonic()
        waiting0, active0 = waiting_active()
        first_started = started_ms(bench, name, first_id)
        wait_for(lambda: sum(waiting_active()) == 0, 600, 0.002, "the queue to drain", proc)
        (own1, kids1, _), t1 = tree_cpu_seconds(proc.pid), time.monotonic()
        last_finished = last_finished_ms(bench, name)
        failed = counts(bench, name)[JobState.FAILED]
        spans = _durations_ms(bench, name, set(ids[warmup:])) if durations else []
    finally:
        stop_worker(proc)
    if failed:
        raise RuntimeError(f"{failed} jobs of {name} failed")
    if not first_started:
        raise RuntimeError(f"{name}: the first measured job's start time was already trimmed")
    jobs = waiting0 + active0
    span_s = (last_finished - first_started) / 1000
    return {
        "queue": name,
        "concurrency": concurrency,
        "jobs": n,
        "warmup_jobs": warmup,
        "jobs_per_s": n / span_s,
        "ms_per_job": span_s / n * 1000,
        "worker_cpu_us_per_job": (own1 - own0) / jobs * 1e6,
        "children_cpu_us_per_job": (kids1 - kids0) / jobs * 1e6,
        "cpu_window_s": t1 - t0,
        "durations_ms": spans,
    }


def _durations_ms(bench: Bench, name: str, measured: set[str]) -> list[float]:
    infos = bench.store.run(parted.PartitionCounts().on_all(
        name, parted.all_list_jobs, JobState.COMPLETED, len(measured) + 10, 0))
    return [(info.finished_at - info.started_at).total_seconds() * 1000 for info in infos
            if info.id in measured and info.started_at and info.finished_at]


# Run in a fresh interpreter: read the policy, confine, say how long it took.
_RULES_SCRIPT = """
import json, os, sys, time
policy = json.loads(sys.stdin.readline())
scratch = policy["write"][0]
target = os.path.join(scratch, "f-%d" % os.getpid())
open(target, "w").close()
from panqueue._sandbox.confine import confine, install_audit_hook

def calls():
    started = time.perf_counter()
    for _ in range(20000):
        os.getppid()
    syscall = (time.perf_counter() - started) / 20000
    started = time.perf_counter()
    for _ in range(5000):
        os.close(os.open(target, os.O_RDONLY))
    opened = (time.perf_counter() - started) / 5000
    return syscall, opened

before = calls()
started = time.perf_counter()
confine(policy)
confined = time.perf_counter()
install_audit_hook(policy)
hooked = time.perf_counter()
after = calls()
os.unlink(target)
print(json.dumps([confined - started, hooked - confined, *before, *after]), flush=True)
"""


def rules_cost(variants: dict[str, Permissions], repeats: int) -> list[dict[str, Any]]:
    """Median ms ``confine`` and ``install_audit_hook`` take in a fresh interpreter, for each
    variant, the variants alternating."""
    from panqueue._sandbox.policy import to_wire

    policies = {}
    for variant, permissions in variants.items():
        started = time.perf_counter()
        policies[variant] = (json.dumps(to_wire(permissions)),
                             (time.perf_counter() - started) * 1000)
    taken: dict[str, list[list[float]]] = {variant: [] for variant in variants}
    for _ in range(repeats):
        for variant, (policy, _) in policies.items():
            proc = subprocess.run([sys.executable, "-c", _RULES_SCRIPT], input=policy + "\n",
                                  capture_output=True, text=True, check=True, timeout=60)
            taken[variant].append(json.loads(proc.stdout))
    results = []
    for variant, rows in taken.items():
        column = list(zip(*rows, strict=True))
        results.append({
            "variant": variant, "repeats": repeats, "policy_ms": policies[variant][1],
            "confine_ms": statistics.median(column[0]) * 1000,
            "confine_ms_all": [v * 1000 for v in column[0]],
            "audit_hook_ms": statistics.median(column[1]) * 1000,
            "syscall_us_before": statistics.median(column[2]) * 1e6,
            "open_close_us_before": statistics.median(column[3]) * 1e6,
            "syscall_us_after": statistics.median(column[4]) * 1e6,
            "open_close_us_after": statistics.median(column[5]) * 1e6,
        })
    return results


def connect_cost(bench: Bench, name: str, n: int, jobs: int = 5) -> dict[str, Any]:
    """``jobs`` jobs of ``n`` connects each, one after the other in one child; the first
    (which pays for the child's start and warms the caches) is left out of the figure."""
    proc = start_worker(bench, name, 1, app=APP)
    try:
        with SyncQueueClient(bench.url) as client:
            queue = client.queue(name)
            per_connect = [queue.add({"n": n}).result(timeout=120) for _ in range(jobs)]
    finally:
        stop_worker(proc)
    measured = per_connect[1:]
    return {"queue": name, "connects_per_job": n, "us_per_connect": per_connect,
            "median_us_per_connect": statistics.median(measured)}


def report(figures: dict[str, Any]) -> None:
    print("permissions: ONE worker process (bench_permissions_app:queues), subprocess "
          "executor; plain: no permissions, files: read/write grants, net: also a net grant "
          "(supervisor attached)")
    labels = {"noop": "no-op, conc. 2", "cpu": "10 ms CPU, conc. 2"}
    rows = [("fresh child per job", r["variant"], f"{r['jobs']:,}", "-",
             f"{r['median_job_ms']:.1f}", f"{r['worker_cpu_us_per_job']:,.0f}",
             f"{r['children_cpu_us_per_job']:,.0f}") for r in figures["start"]]
    rows += [(f"{labels[r['handler']]}, round {r['round']}", r["variant"], f"{r['jobs']:,}",
              f"{r['jobs_per_s']:,.0f}",
              f"{r['ms_per_job']:.2f}", f"{r['worker_cpu_us_per_job']:,.0f}",
              f"{r['children_cpu_us_per_job']:,.0f}") for r in figures["jobs"]]
    print("ms/job: for a fresh child, the median job's claim-to-outcome time; otherwise "
          "1000 / jobs/s")
    print_table(
        ("case", "variant", "jobs", "jobs/s", "ms/job", "worker µs/job", "children µs/job"),
        rows, (False, False, True, True, True, True, True))
    start = {r["variant"]: r for r in figures["start"]}
    for variant in VARIANTS[1:]:
        extra = start[variant]["median_job_ms"] - start["plain"]["median_job_ms"]
        cpu = (start[variant]["children_cpu_us_per_job"]
               - start["plain"]["children_cpu_us_per_job"]) / 1000
        print(f"child start, {variant}: {extra:+.1f} ms (median job with a fresh child), "
              f"{cpu:+.1f} ms of the child's CPU, against plain")
    for kind in ("noop", "cpu"):
        for round_ in sorted({r["round"] for r in figures["jobs"]}):
            jobs = {r["variant"]: r for r in figures["jobs"]
                    if r["handler"] == kind and r["round"] == round_}
            base = jobs["plain"]["jobs_per_s"]
            ratios = ", ".join(f"{variant} {jobs[variant]['jobs_per_s'] / base:.2f}"
                               for variant in VARIANTS[1:])
            print(f"{labels[kind]}, round {round_}: jobs/s against plain: {ratios}")
    for r in figures["rules"]:
        print(f"the rules alone, {r['variant']}: confine {r['confine_ms']:.2f} ms, audit hook "
              f"{r['audit_hook_ms']:.2f} ms (medians of {r['repeats']} children; the policy, "
              f"built once per worker: {r['policy_ms']:.1f} ms)")
        print(f"  in the same child before / after: getppid() {r['syscall_us_before']:.2f} / "
              f"{r['syscall_us_after']:.2f} µs, open + close of a granted file "
              f"{r['open_close_us_before']:.2f} / {r['open_close_us_after']:.2f} µs")
    conn = {r["variant"]: r for r in figures["connect"]}
    print(f"connect + close to 127.0.0.1: {conn['plain']['median_us_per_connect']:,.1f} µs "
          f"plain, {conn['net']['median_us_per_connect']:,.1f} µs net (median of "
          f"{len(conn['plain']['us_per_connect']) - 1} jobs of "
          f"{conn['plain']['connects_per_job']:,} connects)")
