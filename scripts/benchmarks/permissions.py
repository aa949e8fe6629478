"""What kernel-enforced permissions cost (``--permissions``, only on request): the same
subprocess handlers without ``Permissions`` (``plain``), with file grants (``files``: Landlock
and the seccomp filter) and with file and net grants (``net``: also the supervisor, attached to
every child), from ``bench_permissions_app:queues``; each case drained by ONE worker process.

* child start: a no-op with ``max_jobs_per_child=1`` at concurrency 1, so every job stops one
  child and starts the next; ms per job (1000 / jobs/s) is mostly the child's start (an
  interpreter, the handler's import, and with permissions the rules: Landlock, the seccomp
  filter, the supervisor's attach).
* per job: a no-op at concurrency 2 and 10 ms of CPU at concurrency 2, long-lived children,
  measured as in ``executors`` (warm-up jobs start the children before the window opens):
  jobs/s and CPU µs per job of the worker and of its children.
* the rules alone: a fresh interpreter builds nothing but times
  ``panqueue._sandbox.confine.confine`` on the policy the worker would send (Landlock ruleset,
  capabilities, the seccomp filter), and ``install_audit_hook``: what a child pays once, on top
  of the interpreter's start and the handler's import.
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
    starts = 20 if quick else 100
    sizes = {"noop": (1_000, 200) if quick else (10_000, 1_000),
             "cpu": (100, 10) if quick else (500, 20)}
    connects = 200 if quick else 1_000
    figures: dict[str, Any] = {"start": [], "jobs": [], "connect": [], "rules": []}
    scratch = os.environ["PANQUEUE_BENCH_DIR"]
    port = int(os.environ["PANQUEUE_BENCH_CONNECT_PORT"])
    for variant, permissions in (
            ("files", Permissions(read=[scratch], write=[scratch])),
            ("net", Permissions(read=[scratch], write=[scratch], net=[f"127.0.0.1:{port}"]))):
        log(f"permissions: the rules alone, {starts} fresh interpreters, {variant}")
        figures["rules"].append({"variant": variant, **rules_cost(permissions, starts)})
    for variant in VARIANTS:
        bench.redis.flushdb()
        log(f"permissions: {starts} jobs, a fresh child each, {variant}")
        figures["start"].append({"variant": variant,
                                 **queue_rate(bench, f"bench-p-start-{variant}", 1, starts, 2)})
    for kind in ("noop", "cpu"):
        n, warmup = sizes[kind]
        for variant in VARIANTS:
            bench.redis.flushdb()
            log(f"permissions: {n} {kind} jobs (+{warmup} warm-up), {variant}, concurrency 2")
            figures["jobs"].append({"variant": variant, "handler": kind,
                                    **queue_rate(bench, f"bench-p-{kind}-{variant}", 2, n,
                                                 warmup)})
    for variant in ("plain", "net"):
        bench.redis.flushdb()
        log(f"permissions: 5 jobs of {connects} connects each, {variant}")
        figures["connect"].append({"variant": variant,
                                   **connect_cost(bench, f"bench-p-connect-{variant}",
                                                  connects)})
    return figures


def queue_rate(bench: Bench, name: str, concurrency: int, n: int,
               warmup: int) -> dict[str, Any]:
    """ONE worker process drains ``warmup`` + ``n`` pre-filled no-data jobs of ``name``; the
    window opens once the first measured job has started, as in ``executors``."""
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
    }


# Run in a fresh interpreter: read the policy, confine, say how long it took.
_RULES_SCRIPT = """
import json, sys, time
policy = json.loads(sys.stdin.readline())
from panqueue._sandbox.confine import confine, install_audit_hook
started = time.perf_counter()
confine(policy)
confined = time.perf_counter()
install_audit_hook(policy)
hooked = time.perf_counter()
print(json.dumps([confined - started, hooked - confined]), flush=True)
"""


def rules_cost(permissions: Permissions, repeats: int) -> dict[str, Any]:
    """Median ms ``confine`` and ``install_audit_hook`` take, each in a fresh interpreter."""
    from panqueue._sandbox.policy import to_wire

    started = time.perf_counter()
    policy = json.dumps(to_wire(permissions))
    wire_ms = (time.perf_counter() - started) * 1000
    confine_ms, hook_ms = [], []
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, "-c", _RULES_SCRIPT], input=policy + "\n",
                              capture_output=True, text=True, check=True, timeout=60)
        confine_s, hook_s = json.loads(proc.stdout)
        confine_ms.append(confine_s * 1000)
        hook_ms.append(hook_s * 1000)
    return {"repeats": repeats, "policy_ms": wire_ms,
            "confine_ms": statistics.median(confine_ms), "confine_ms_all": confine_ms,
            "audit_hook_ms": statistics.median(hook_ms)}


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
    rows = [("fresh child per job", r["variant"], f"{r['jobs']:,}", f"{r['jobs_per_s']:,.1f}",
             f"{r['ms_per_job']:.1f}", f"{r['worker_cpu_us_per_job']:,.0f}",
             f"{r['children_cpu_us_per_job']:,.0f}") for r in figures["start"]]
    rows += [(labels[r["handler"]], r["variant"], f"{r['jobs']:,}", f"{r['jobs_per_s']:,.0f}",
              f"{r['ms_per_job']:.2f}", f"{r['worker_cpu_us_per_job']:,.0f}",
              f"{r['children_cpu_us_per_job']:,.0f}") for r in figures["jobs"]]
    print_table(
        ("case", "variant", "jobs", "jobs/s", "ms/job", "worker µs/job", "children µs/job"),
        rows, (False, False, True, True, True, True, True))
    start = {r["variant"]: r for r in figures["start"]}
    for variant in VARIANTS[1:]:
        extra = start[variant]["ms_per_job"] - start["plain"]["ms_per_job"]
        print(f"child start, {variant}: {extra:+.1f} ms against plain "
              f"({start[variant]['ms_per_job'] / start['plain']['ms_per_job']:.2f}x)")
    jobs = {(r["handler"], r["variant"]): r for r in figures["jobs"]}
    for kind in ("noop", "cpu"):
        base = jobs[(kind, "plain")]["jobs_per_s"]
        ratios = ", ".join(f"{variant} {jobs[(kind, variant)]['jobs_per_s'] / base:.2f}"
                           for variant in VARIANTS[1:])
        print(f"{labels[kind]}: jobs/s against plain: {ratios}")
    for r in figures["rules"]:
        print(f"the rules alone, {r['variant']}: confine {r['confine_ms']:.2f} ms, audit hook "
              f"{r['audit_hook_ms']:.2f} ms (medians of {r['repeats']} children; the policy, "
              f"built once per worker: {r['policy_ms']:.1f} ms)")
    conn = {r["variant"]: r for r in figures["connect"]}
    print(f"connect + close to 127.0.0.1: {conn['plain']['median_us_per_connect']:,.1f} µs "
          f"plain, {conn['net']['median_us_per_connect']:,.1f} µs net (median of "
          f"{len(conn['plain']['us_per_connect']) - 1} jobs of "
          f"{conn['plain']['connects_per_job']:,} connects)")
