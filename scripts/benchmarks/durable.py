"""Durable steps (``--durable`` only; not part of the full run): what a step costs a job, and
the Redis memory a stored step takes.

(a) Per-step overhead: N jobs, each run by an in-process worker (inline executor, the bench's
    backend) whose handler makes S steps (``await job.step(f"s{i}", fn)``, ``fn`` a plain
    function returning a small dict), for S = 0 (the no-op path: no durable call at all), 1 and
    10, at concurrency 1 (a job's latency: each step is a round trip) and 16 (throughput). The
    time from the first add to the last completion, per job; the per-step figure is
    (time(S) - time(0)) / (N * S). Redis CPU per step from the server process's utime + stime.
(b) Memory: ``MEMORY USAGE`` (``SAMPLES 0``) of the jobs' durable records after (a), for S = 1
    and 10 (small results), and for 10 steps of a 1 KiB string: per record, and per stored step
    as the difference between 10 steps and 1 over 9.

N = 2,000 per run (``--quick``: 500); three runs of each row alternated, the best kept.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import anyio

from benchmarks.common import Bench, log, print_table, proc_cpu_seconds
from panqueue import Job, QueueClient, Registry, Retention, Worker
from panqueue._keys import QueueKeys

ROUNDS = 3
STEPS = (0, 1, 10)
CONCURRENCY = (1, 16)


def _small(i: int) -> dict[str, Any]:
    return {"id": i, "ok": True}


def _kib(i: int) -> str:
    return "x" * 1024


def _registry(queue: str, steps: int, concurrency: int, fn: Any) -> Registry:
    queues = Registry()

    @queues.handler(queue, concurrency=concurrency, retention=Retention(completed=-1))
    async def handler(job: Job) -> int:
        for i in range(steps):
            await job.step(f"s{i}", fn, i)
        return steps

    return queues


async def _one_run(bench: Bench, steps: int, concurrency: int, n: int, fn: Any = _small
                   ) -> dict[str, Any]:
    queue = f"bench-durable-{uuid.uuid4().hex[:8]}"
    worker = Worker(_registry(queue, steps, concurrency, fn), queue, url=bench.url,
                    concurrency=concurrency)
    async with anyio.create_task_group() as tg, QueueClient(bench.url) as client:
        await tg.start(worker.run)
        await (await client.queue(queue).add({})).result(timeout=30)  # warm-up
        cpu = proc_cpu_seconds(bench.server_pid)
        start = time.perf_counter()
        handles = await client.queue(queue).add_bulk([{}] * n)
        for handle in handles:
            await handle.result(timeout=300)
        elapsed = time.perf_counter() - start
        cpu = proc_cpu_seconds(bench.server_pid) - cpu
        await worker.shutdown(grace=5.0)
        tg.cancel_scope.cancel()
    return {"steps": steps, "concurrency": concurrency, "queue": queue,
            "ids": [h.id for h in handles], "us_per_job": elapsed / n * 1e6,
            "redis_us_per_job": cpu / n * 1e6}


def _memory(bench: Bench, queue: str, ids: list[str]) -> float:
    keys = QueueKeys(queue)
    sample = ids[:200]
    total = sum(int(bench.redis.memory_usage(keys.durable(i), samples=0) or 0) for i in sample)
    return total / len(sample)


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    bench.redis.flushdb()
    n = 500 if quick else 2_000
    rows = []
    memory: dict[str, float] = {}
    for concurrency in CONCURRENCY:
        runs: dict[int, list[dict[str, Any]]] = {s: [] for s in STEPS}
        for rep in range(ROUNDS):
            for steps in STEPS:
                log(f"durable: {steps} steps, concurrency {concurrency}, run {rep + 1}")
                runs[steps].append(anyio.run(_one_run, bench, steps, concurrency, n,
                                             backend=bench.backend))
        for steps, measured in runs.items():
            best = min(measured, key=lambda r: r["us_per_job"])
            best["redis_us_per_job"] = min(r["redis_us_per_job"] for r in measured)
            rows.append(best)
            if concurrency == CONCURRENCY[0] and steps:
                memory[f"small_{steps}"] = _memory(bench, best["queue"], best["ids"])
    big = anyio.run(_one_run, bench, 10, CONCURRENCY[-1], min(n, 500), _kib,
                    backend=bench.backend)
    memory["kib_10"] = _memory(bench, big["queue"], big["ids"])
    bench.redis.flushdb()
    base = {r["concurrency"]: r for r in rows if r["steps"] == 0}
    for row in rows:
        if row["steps"]:
            zero = base[row["concurrency"]]
            row["us_per_step"] = (row["us_per_job"] - zero["us_per_job"]) / row["steps"]
            row["redis_us_per_step"] = (row["redis_us_per_job"]
                                        - zero["redis_us_per_job"]) / row["steps"]
    for row in rows:
        del row["ids"], row["queue"]
    return {"jobs": n, "rows": rows, "memory": memory}


def report(figures: dict[str, Any]) -> None:
    print(f"Durable steps ({figures['jobs']:,} jobs per run, best of {ROUNDS} alternated runs):")
    print_table(
        ["steps/job", "concurrency", "µs/job", "Redis µs/job", "µs/step", "Redis µs/step"],
        [[str(r["steps"]), str(r["concurrency"]), f"{r['us_per_job']:,.0f}",
          f"{r['redis_us_per_job']:,.1f}",
          f"{r['us_per_step']:,.0f}" if "us_per_step" in r else "-",
          f"{r['redis_us_per_step']:,.1f}" if "redis_us_per_step" in r else "-"]
         for r in figures["rows"]],
        [True] * 6)
    memory = figures["memory"]
    per_step = (memory["small_10"] - memory["small_1"]) / 9
    print(f"durable record: {memory['small_1']:,.0f} B with 1 small step, "
          f"{memory['small_10']:,.0f} B with 10 ({per_step:,.0f} B per further step); "
          f"{memory['kib_10']:,.0f} B with 10 steps of 1 KiB")
