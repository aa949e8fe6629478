"""Chunk handlers (``--chunk`` only; not part of the full run): the same no-op as a plain
handler and as a chunk handler of 100 (``bench_chunk_app.py``), on the same server in the
same run.

Each case drains a pre-filled queue of N no-op jobs with ONE worker process, measured as the
baseline's process rate (``process.py``: jobs / (last finished_at - first started_at), server
clock). Cases: both handlers at the same concurrency (1: one handler call at a time, the
default), then each at a concurrency that keeps its worker busy (plain 50, as the baseline;
chunk 2: one chunk runs while the other is recorded). N is 20,000 (``--quick``: 5,000). The
ratios are the figures to read; absolute rates depend on the machine and on what else runs.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import Bench, log, print_table
from benchmarks.process import process_rate

APP = "bench_chunk_app:queues"
# (name in the output, queue, worker --concurrency)
CASES = [
    ("plain, concurrency 1", "bench-chunk-plain", 1),
    ("Chunk(size=100), concurrency 1", "bench-chunk-100", 1),
    ("plain, concurrency 50", "bench-chunk-plain", 50),
    ("Chunk(size=100), concurrency 2", "bench-chunk-100", 2),
]


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    n = 5_000 if quick else 20_000
    rows = []
    for name, queue, concurrency in CASES:
        bench.redis.flushdb()
        log(f"chunk: {n} no-op jobs, {name}")
        rows.append({"case": name, "concurrency": concurrency,
                     **process_rate(bench, n, queue, concurrency, APP)})
    bench.redis.flushdb()
    rate = [row["jobs_per_s"] for row in rows]
    return {"jobs": n, "runs": rows, "ratio_same_concurrency": rate[1] / rate[0],
            "ratio_busy": rate[3] / rate[2]}


def report(figures: dict[str, Any]) -> None:
    print()
    print(f"chunk handlers: {figures['jobs']:,} no-op jobs per case, one worker process")
    print_table(
        ["handler", "jobs/s", "polled", "worker µs/job", "Redis µs/job"],
        [[row["case"], f"{row['jobs_per_s']:,.0f}", f"{row['jobs_per_s_polled']:,.0f}",
          f"{row['worker_cpu_us_per_job']:.1f}", f"{row['redis_cpu_us_per_job']:.1f}"]
         for row in figures["runs"]],
        [False, True, True, True, True])
    print(f"chunked / plain at the same concurrency (1): {figures['ratio_same_concurrency']:.1f}x")
    print(f"chunked (2) / plain (50), each at a busy concurrency: {figures['ratio_busy']:.1f}x")
