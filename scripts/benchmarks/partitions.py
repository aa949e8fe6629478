"""Partitioned queues (``--partitions`` only; not part of the full run): what partitions cost
on one server, as the capacity model in docs/scaling.md uses it.

The scale-out drain (``scale``) of the same no-op jobs, on ``bench-noop`` (one partition) and
``bench-noop-p4`` (4 partitions on the same server), with 1 and 2 worker processes of
concurrency 50. Redis µs/job is the server's CPU per job (its core is full at 1 / µs/job); the
workers' µs/job is theirs. On a cluster each partition's share of that CPU lands on the master
that holds it (tests/test_cluster.py measures the spread), so Redis µs/job with partitions is
the figure one master's core pays per job of its partitions.

Each count runs on an emptied server after an unmeasured warm-up drain. N is 100,000
(``--quick``: 20,000).
"""

from __future__ import annotations

from typing import Any

from benchmarks import scale
from benchmarks.common import Bench, log, print_table
from benchmarks.process import NOOP_QUEUE
from panqueue._store.ops import partitions as parted

PARTITIONED_QUEUE = "bench-noop-p4"
PARTITIONS = 4
PROCESSES = (1, 2)


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    n = 20_000 if quick else 100_000
    log(f"partitions: warm-up, {scale.WARMUP_JOBS:,} jobs")
    bench.redis.flushdb()
    scale.drain(bench, 1, scale.WARMUP_JOBS)
    rows = []
    for queue, partitions in ((NOOP_QUEUE, 1), (PARTITIONED_QUEUE, PARTITIONS)):
        for k in PROCESSES:
            bench.redis.flushdb()
            # Declared before the benchmark's client pauses and fills it by name.
            bench.store.run(parted.PartitionCounts().parts(queue, partitions))
            log(f"partitions: {n:,} no-op jobs, {partitions} partition(s), {k} worker "
                f"process{'es' if k > 1 else ''}")
            rows.append({"partitions": partitions,
                         **scale.drain(bench, k, n, queue, partitions)})
    bench.redis.flushdb()
    return {"jobs": n, "concurrency": scale.CONCURRENCY, "runs": rows}


def report(figures: dict[str, Any]) -> None:
    print()
    print(f"partitions: {figures['jobs']:,} no-op jobs, one server, k worker processes of "
          f"concurrency {figures['concurrency']} (CPU: % of one core over the window)")
    print_table(
        ["partitions", "k", "jobs/s", "Redis CPU %", "Redis µs/job", "workers µs/job",
         "rate at 100 % Redis"],
        [[str(row["partitions"]), str(row["processes"]), f"{row['jobs_per_s']:,.0f}",
          f"{row['redis_cpu_utilisation']:.0%}", f"{row['redis_cpu_us_per_job']:.1f}",
          f"{row['workers_cpu_us_per_job']:.1f}",
          f"{1e6 / row['redis_cpu_us_per_job']:,.0f}/s" if row["redis_cpu_us_per_job"] else "-"]
         for row in figures["runs"]],
        [True] * 7)
