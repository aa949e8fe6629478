"""Keyed mode (``--keyed`` only; not part of the full run): claim cost against the number of
distinct concurrency keys.

For a global queue and keyed queues (key_concurrency 1) with 10, 1,000 and 100,000 keys:
pre-fill 2M + 2K + 2,000 jobs with the add script directly (M jobs per phase), then

(a) claim (n=50) + complete M jobs from this process, reading redis-server's main-thread CPU
    (INFO cpu) around each script call, and
(b) claim M with ONE worker process (``bench_app:keyed``, concurrency 50).

M is 20,000; ``--keyed --quick``: 5,000 jobs per phase, 10,000 keys at most.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator
from typing import Any, TypeVar

import redis

from benchmarks.common import (
    BATCH,
    Bench,
    counts,
    log,
    print_table,
    proc_cpu_seconds,
    start_worker,
    stop_worker,
    wait_for,
)
from panqueue import JobState
from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._store import ops, transitions
from panqueue._store.status import Status
from panqueue._store.transitions import Completion

T = TypeVar("T")

APP = "bench_app:keyed"
# Jobs one claim script call asks for, in phase (a).
CLAIM_N = 50


def jobs_per_phase(quick: bool) -> int:
    return 5_000 if quick else 20_000


def run(bench: Bench, quick: bool) -> list[dict[str, Any]]:
    """A warm-up, then one case per key count (None: the global queue)."""
    m = jobs_per_phase(quick)
    # A fresh redis-server is measurably slower for its first ~10,000 script calls (the first
    # keyed case came out 1.5x dearer on the server than the same case repeated): warm it up
    # with an unmeasured keyed fill and claim phase.
    log("keyed: warm-up (not measured)")
    bench.redis.flushdb()
    keyed_fill(bench.redis, "bench-keyed", "keyed", 2 * m, 10)
    keyed_raw(bench.redis, "bench-keyed", "keyed", m)
    key_counts: list[int | None] = [None, 10, 1_000, 10_000 if quick else 100_000]
    return [keyed_case(bench, n_keys, m) for n_keys in key_counts]


# --------------------------------------------------------------------------- pipelined operations
#
# Phase (a) reads the server's CPU right before and after each script call, in the same
# pipeline, and the fill sends ten add calls per round trip. The store's transport sends a
# batch's scripts with EVAL (their whole body, hashed again by the server on every call), so
# here each typed operation's single script call is queued on a redis-py pipeline with EVALSHA
# and its reply handed back to the operation, which parses it as usual.

_loaded: set[str] = set()


def _queue(r: redis.Redis, pipe: Any, op: Generator[Any, Any, T]) -> Generator[Any, Any, T]:
    """Queue ``op``'s script call on ``pipe``; finish it with :func:`_finish` and the reply."""
    call = next(op)
    if call.script.sha not in _loaded:  # EVALSHA in a pipeline cannot fall back to EVAL
        r.script_load(call.script.body)
        _loaded.add(call.script.sha)
    pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
    return op


def _finish(op: Generator[Any, Any, T], reply: Any) -> T:
    """What the operation makes of its call's reply."""
    try:
        op.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
    raise RuntimeError("an operation of the keyed benchmark made more than one call")


def _main_thread_cpu(info: dict[str, Any]) -> float:
    """redis-server's main-thread CPU (user + sys, s) from an ``INFO cpu`` reply: getrusage
    with µs resolution, where /proc/<pid>/stat only counts 10 ms ticks."""
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


# --------------------------------------------------------------------------- the phases


def keyed_fill(r: redis.Redis, name: str, mode: str, n: int, n_keys: int) -> float:
    """Add ``n`` no-op jobs to queue ``name`` (keys ``key-<i mod n_keys>``, round robin, in
    keyed mode): the add script with 1000 jobs per call, 10 calls per pipeline. Returns s."""
    keys = QueueKeys(name)
    data = encode({"i": 0})
    start = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    pending = []
    for b in range(0, n, BATCH):
        jobs = [ops.NewJob(None, data, key=f"key-{i % n_keys}" if mode == "keyed" else "")
                for i in range(b, min(b + BATCH, n))]
        pending.append(_queue(r, pipe, ops.add_jobs(keys, jobs, mode)))
        if len(pending) == 10 or b + BATCH >= n:
            for op, reply in zip(pending, pipe.execute(), strict=True):
                _finish(op, reply)  # raises on a refused batch
            pending = []
    return time.perf_counter() - start


def keyed_raw(r: redis.Redis, name: str, mode: str, m: int) -> dict[str, Any]:
    """Claim and complete ``m`` jobs from this process, calling the scripts directly: one claim
    call for up to CLAIM_N jobs, then one complete call per job (no claim in it), all the
    completes of a round in one pipeline. The server's main-thread CPU is read with ``INFO
    cpu`` right before and after each claim call (and each completion pipeline), in the same
    pipeline, so it covers that script work alone (minus a calibrated INFO overhead)."""
    keys = QueueKeys(name)
    result_blob = encode(None)
    ttl = 30_000

    pipe = r.pipeline(transaction=False)
    for _ in range(200):  # INFO's own CPU, seen by two back-to-back reads
        pipe.info("cpu")
        pipe.info("cpu")
    infos = pipe.execute()
    overhead = sum(_main_thread_cpu(b) - _main_thread_cpu(a)
                   for a, b in zip(infos[::2], infos[1::2], strict=True)) / 200

    claimed = rounds = 0
    claim_cpu = complete_cpu = 0.0
    # Each claim and complete call takes a fresh token: it is also the call's request id.
    tokens = (f"bench-{seq}" for seq in itertools.count(1))

    def one_round() -> tuple[int, float, float]:
        pipe = r.pipeline(transaction=False)
        pipe.info("cpu")
        claim = _queue(r, pipe, transitions.claim(keys, next(tokens), ttl, CLAIM_N))
        pipe.info("cpu")
        a, reply, b = pipe.execute()
        jobs = _finish(claim, reply).jobs
        if not jobs:
            raise RuntimeError(f"{name}: the claim found nothing")
        pipe = r.pipeline(transaction=False)
        pipe.info("cpu")
        completes = [_queue(r, pipe, transitions.complete_batch(
            keys, [Completion(job.id, job.token, result_blob)], claim_next=False,
            keep=ops.DEFAULT_KEEP_COMPLETED, token=next(tokens), ttl_ms=ttl)) for job in jobs]
        pipe.info("cpu")
        replies = pipe.execute()
        for op, done in zip(completes, replies[1:-1], strict=True):
            if _finish(op, done).statuses != [Status.COMPLETED]:
                raise RuntimeError(f"{name}: a completion lost its lock")
        return (len(jobs), _main_thread_cpu(b) - _main_thread_cpu(a) - overhead,
                _main_thread_cpu(replies[-1]) - _main_thread_cpu(replies[0]) - overhead)

    for _ in range(5):  # warm-up
        one_round()
    r.config_resetstat()
    start = time.perf_counter()
    while claimed < m:
        jobs, c1, c2 = one_round()
        claimed += jobs
        claim_cpu += c1
        complete_cpu += c2
        rounds += 1
    elapsed = time.perf_counter() - start
    stats = r.info("commandstats")

    def per_call(command: str) -> float | None:
        entry = stats.get(f"cmdstat_{command}")
        return None if entry is None else float(entry["usec_per_call"])

    return {
        "jobs": claimed,
        "jobs_per_claim": claimed / rounds,
        "jobs_per_s": claimed / elapsed,
        "claim_server_us_per_job": claim_cpu / claimed * 1e6,
        "complete_server_us_per_job": complete_cpu / claimed * 1e6,
        "server_us_per_job": (claim_cpu + complete_cpu) / claimed * 1e6,
        "info_overhead_us": overhead * 1e6,
        "commandstats_us_per_call": {c: per_call(c) for c in
                                     ("zpopmin", "zadd", "zrem", "zscore", "lpop", "hincrby",
                                      "xadd", "hset")},
    }


def keyed_worker(bench: Bench, name: str, mode: str, m: int) -> dict[str, Any]:
    """ONE worker process (bench_app:keyed, concurrency 50) claims from the pre-filled queue;
    the window opens at its first claim and closes once ``m`` more jobs were claimed (polled
    every 5 ms from the waiting count); then the worker is stopped, jobs are left over."""
    r = bench.redis

    def waiting() -> int:
        return counts(bench, name)[JobState.WAITING]

    waiting0 = waiting()
    proc = start_worker(bench, name, 50, app=APP)
    try:
        wait_for(lambda: waiting() < waiting0, 60, 0.0005, "the first claim", proc)
        cpu0, server0, t0 = (proc_cpu_seconds(proc.pid), _main_thread_cpu(r.info("cpu")),
                             time.monotonic())
        waiting_a = waiting()
        wait_for(lambda: waiting_a - waiting() >= m, 300, 0.005, f"{m} claims", proc)
        cpu1, server1, t1 = (proc_cpu_seconds(proc.pid), _main_thread_cpu(r.info("cpu")),
                             time.monotonic())
        jobs = waiting_a - waiting()
        failed = counts(bench, name)[JobState.FAILED]
    finally:
        code = stop_worker(proc)
    if failed:
        raise RuntimeError(f"{failed} jobs of {name} failed")
    return {
        "jobs": jobs,
        "jobs_per_s": jobs / (t1 - t0),
        "worker_cpu_us_per_job": (cpu1 - cpu0) / jobs * 1e6,
        "server_us_per_job": (server1 - server0) / jobs * 1e6,
        "worker_exit_code": code,
    }


def keyed_case(bench: Bench, n_keys: int | None, m: int) -> dict[str, Any]:
    """One row: a global queue (``n_keys`` None) or a keyed queue with ``n_keys`` keys."""
    r = bench.redis
    mode = "global" if n_keys is None else "keyed"
    name = "bench-keyed-global" if n_keys is None else "bench-keyed"
    # Enough jobs that every key still has waiting jobs after both phases (2 * m claims): the
    # ready set keeps its size, and each completion puts its key back into it.
    n = 2 * m + 2 * (n_keys or 0) + 2_000
    r.flushdb()
    # The worker's own setup call: mode, key concurrency 1.
    bench.store.run(ops.setup_queue(QueueKeys(name), mode, 1, 0, 0, False))
    label = "global" if n_keys is None else f"{n_keys:,} keys"
    log(f"keyed: {label}: filling {n:,} jobs")
    fill_s = keyed_fill(r, name, mode, n, n_keys or 1)
    if mode == "keyed":
        # The one read below the store's door: keyed mode's set of keys with a job ready.
        ready = int(r.zcard(QueueKeys(name).prefix + "k:ready"))
        if ready != n_keys:
            raise RuntimeError(f"{name}: {ready} ready keys after the fill, expected {n_keys}")
    log(f"keyed: {label}: {m:,} claims + completions from this process")
    raw = keyed_raw(r, name, mode, m)
    log(f"keyed: {label}: {m:,} jobs, one worker process, concurrency 50")
    worker = keyed_worker(bench, name, mode, m)
    return {"mode": mode, "keys": n_keys, "jobs_filled": n, "fill_s": fill_s,
            "fill_jobs_per_s": n / fill_s, "raw": raw, "worker": worker}


def report(results: list[dict[str, Any]], quick: bool) -> None:
    print(f"keyed mode: key_concurrency 1, keys round robin; {jobs_per_phase(quick):,} jobs per "
          f"phase. 'this process': claim {CLAIM_N} + complete each (pipelined), scripts "
          "called directly; server µs = redis-server main-thread CPU per job (INFO cpu); "
          "'worker': ONE worker process (bench_app:keyed), concurrency 50")
    rows = []
    for res in results:
        raw, worker = res["raw"], res["worker"]
        zpopmin = raw["commandstats_us_per_call"]["zpopmin"]
        rows.append((
            "global" if res["keys"] is None else f"keyed, {res['keys']:,} keys",
            f"{res['jobs_filled']:,} in {res['fill_s']:.1f} s",
            f"{raw['jobs_per_claim']:.0f}",
            f"{raw['jobs_per_s']:,.0f}",
            f"{raw['claim_server_us_per_job']:.1f}",
            f"{raw['complete_server_us_per_job']:.1f}",
            "-" if zpopmin is None else f"{zpopmin:.2f}",
            f"{worker['jobs_per_s']:,.0f}",
            f"{worker['server_us_per_job']:.0f}",
            f"{worker['worker_cpu_us_per_job']:.0f}",
        ))
    print_table(
        ("queue", "filled", "jobs/claim", "claims/s", "claim µs", "complete µs",
         "ZPOPMIN µs/call", "worker jobs/s", "server µs", "worker µs"),
        rows,
        (False, True, True, True, True, True, True, True, True, True))
