"""Pickup latency: how soon an idle worker starts a job that was just added.

An idle worker process (concurrency 1, ``bench_app:queues``); one job at a time, each awaited
with ``handle.result()`` and followed by a 20 ms idle gap; 10 warm-up jobs are not counted.
Three figures per job: started_at - enqueued_at as Redis recorded them (millisecond resolution),
the handler's own start time (ns, it returns ``time.time_ns()``) against the moment ``add`` was
called, and the add -> result round trip.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from benchmarks.common import Bench, percentile, start_worker, stop_worker, wait_for
from panqueue import QueueClient
from panqueue._keys import QueueKeys

LATENCY_QUEUE = "bench-latency"


async def latency_run(url: str, n: int, gap: float) -> dict[str, list[float]]:
    server_ms: list[float] = []
    handler_ms: list[float] = []
    roundtrip_ms: list[float] = []
    async with QueueClient(url) as client:
        queue = client.queue(LATENCY_QUEUE)
        for i in range(n + 10):  # the first 10 are warm-up
            await anyio.sleep(gap)  # let the worker go idle again
            t_add = time.time_ns()
            handle = await queue.add({"i": i})
            started_ns = await handle.result(timeout=10)
            t_done = time.time_ns()
            info = await handle.info()
            if i < 10:
                continue
            assert info.started_at is not None and info.enqueued_at is not None
            server_ms.append((info.started_at - info.enqueued_at).total_seconds() * 1000)
            handler_ms.append((started_ns - t_add) / 1e6)
            roundtrip_ms.append((t_done - t_add) / 1e6)
    return {"server": server_ms, "handler": handler_ms, "roundtrip": roundtrip_ms}


def pickup_latency(bench: Bench, n: int) -> dict[str, Any]:
    channel = QueueKeys(LATENCY_QUEUE).notify
    proc = start_worker(bench, LATENCY_QUEUE, 1)
    try:
        def subscribed() -> bool:
            reply = bench.redis.execute_command(  # type: ignore[no-untyped-call]
                "PUBSUB", "SHARDNUMSUB", channel)
            return int(reply[1]) > 0

        wait_for(subscribed, 60, 0.01, "the worker to subscribe", proc)
        time.sleep(0.5)  # its first claim finds nothing: the worker is idle
        samples = anyio.run(latency_run, bench.url, n, 0.02, backend=bench.backend)
    finally:
        code = stop_worker(proc)

    def summary(values: list[float]) -> dict[str, float]:
        return {"p50": percentile(values, 50), "p95": percentile(values, 95),
                "p99": percentile(values, 99), "max": max(values)}

    return {
        "jobs": n,
        "server_ms": summary(samples["server"]),
        "handler_ms": summary(samples["handler"]),
        "roundtrip_ms": summary(samples["roundtrip"]),
        "worker_exit_code": code,
    }
