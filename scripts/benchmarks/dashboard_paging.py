"""The dashboard on a big queue (``--dashboard`` only; not part of the full run; needs the
``dashboard`` extra).

Fills one queue's WAITING state with N jobs (``SyncQueueClient.add_bulk`` in batches of 1000,
small dicts as data), then renders the jobs page of that state, 50 jobs a page, through the
dashboard's ASGI app in this process (httpx's ASGITransport: no network, no server process):
the first page (offset 0), a middle page (offset N/2) and the last page (offset N - 50). Each
page is asked for 10 times unmeasured, then ``REPEAT`` times measured; the figure is the wall
time of one request, from the call to the complete response, so it includes everything the
server does for the page: the counts, the page's ids by rank (one ZRANGE), the 50 job hashes
and their logs, the paused flag and the template. ``list_jobs`` alone (the Redis part of it)
is timed the same way, and so is the live overview's endpoint (``/api/overview``: counts,
lag, rates and workers of every queue) on that Redis.

Then a keyed queue (``mode="keyed"``) with K keys of 100 waiting jobs each: its waiting jobs
page through the claim's turns over keys, so a page past the first reads each key's length
too. ``list_jobs`` of 50 jobs at the first, middle and last offset is timed as above.

N is 1,000,000 and K 1,000 (``--quick``: 100,000 and 100).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks.common import BATCH, Bench, log, percentile, print_table
from panqueue import JobState, SyncQueueClient

QUEUE = "bench-dashboard"
KEYED_QUEUE = "bench-dashboard-keyed"
KEYED_DEPTH = 100  # waiting jobs per key
PAGE = 50
WARM = 10
REPEAT = 100


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    bench.redis.flushdb()
    n = 100_000 if quick else 1_000_000
    fill(bench, n)
    figures = measure(bench, n)
    bench.redis.flushdb()
    keys = 100 if quick else 1000
    fill_keyed(bench, keys)
    figures["keyed"] = {"keys": keys, "jobs_per_key": KEYED_DEPTH,
                        "pages": time_list_jobs(bench, KEYED_QUEUE, keys * KEYED_DEPTH)}
    bench.redis.flushdb()
    return figures


def fill(bench: Bench, n: int) -> None:
    log(f"dashboard: adding {n:,} waiting jobs")
    started = time.monotonic()
    with SyncQueueClient(bench.url) as client:
        queue = client.queue(QUEUE)
        for first in range(0, n, BATCH):
            queue.add_bulk([{"order": i, "customer": f"customer-{i % 5000}"}
                            for i in range(first, min(n, first + BATCH))])
        assert client.counts(QUEUE)[JobState.WAITING] == n
    log(f"dashboard: filled in {time.monotonic() - started:.0f} s")


def fill_keyed(bench: Bench, keys: int) -> None:
    log(f"dashboard: adding {keys * KEYED_DEPTH:,} jobs over {keys:,} keys")
    with SyncQueueClient(bench.url) as client:
        queue = client.queue(KEYED_QUEUE, mode="keyed")
        for turn in range(KEYED_DEPTH):
            for key in range(keys):
                queue.add({"turn": turn}, key=f"customer-{key}")


def offsets_of(n: int) -> dict[str, int]:
    return {"first": 0, "middle": n // 2, "last": n - PAGE}


def time_list_jobs(bench: Bench, queue: str, n: int) -> dict[str, Any]:
    """``list_jobs`` of one page at each offset: p50 and p95, ms."""
    rows: dict[str, Any] = {}
    with SyncQueueClient(bench.url) as client:
        for name, offset in offsets_of(n).items():
            times = []
            for i in range(WARM + REPEAT):
                started = time.perf_counter()
                jobs = client.list_jobs(queue, JobState.WAITING, limit=PAGE, offset=offset)
                elapsed = time.perf_counter() - started
                assert len(jobs) == PAGE
                if i >= WARM:
                    times.append(elapsed * 1000)
            rows[name] = {"offset": offset, "list_ms_p50": percentile(times, 50),
                          "list_ms_p95": percentile(times, 95)}
    return rows


def measure(bench: Bench, n: int) -> dict[str, Any]:
    import httpx

    from panqueue.dashboard import create_app

    offsets = offsets_of(n)
    rows: dict[str, Any] = {}
    overview: dict[str, float] = {}

    async def pages() -> None:
        app = create_app(bench.url)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            for name, offset in offsets.items():
                params = {"q": QUEUE, "state": "waiting", "offset": offset, "limit": PAGE}
                times = []
                for i in range(WARM + REPEAT):
                    started = time.perf_counter()
                    response = await http.get("/queue", params=params)
                    elapsed = time.perf_counter() - started
                    assert response.status_code == 200, response.text[:300]
                    assert response.text.count("<tr data-job=") == PAGE
                    if i >= WARM:
                        times.append(elapsed * 1000)
                rows[name] = {"offset": offset, "page_ms_p50": percentile(times, 50),
                              "page_ms_p95": percentile(times, 95)}
            times = []
            for i in range(WARM + REPEAT):
                started = time.perf_counter()
                response = await http.get("/api/overview")
                elapsed = time.perf_counter() - started
                assert response.status_code == 200
                if i >= WARM:
                    times.append(elapsed * 1000)
            overview.update(p50=percentile(times, 50), p95=percentile(times, 95))

    asyncio.run(pages())
    for name, timed in time_list_jobs(bench, QUEUE, n).items():
        rows[name].update(list_ms_p50=timed["list_ms_p50"], list_ms_p95=timed["list_ms_p95"])
    return {"jobs": n, "page_size": PAGE, "repeat": REPEAT, "pages": rows,
            "overview_ms": overview}


def report(figures: dict[str, Any]) -> None:
    print()
    print(f"dashboard: the jobs page of a state holding {figures['jobs']:,} jobs, "
          f"{figures['page_size']} a page, {figures['repeat']} requests each "
          "(in-process ASGI, ms)")
    print_table(
        ["page", "offset", "page p50", "page p95", "list_jobs p50", "list_jobs p95"],
        [[name, f"{row['offset']:,}", f"{row['page_ms_p50']:.1f}", f"{row['page_ms_p95']:.1f}",
          f"{row['list_ms_p50']:.1f}", f"{row['list_ms_p95']:.1f}"]
         for name, row in figures["pages"].items()],
        [False, True, True, True, True, True])
    overview = figures["overview_ms"]
    print(f"the live overview (/api/overview) on the same Redis: p50 {overview['p50']:.1f} ms, "
          f"p95 {overview['p95']:.1f} ms")
    keyed = figures["keyed"]
    print()
    print(f"dashboard: list_jobs of a keyed queue's waiting jobs, {keyed['keys']:,} keys of "
          f"{keyed['jobs_per_key']} jobs, {figures['page_size']} a page (ms)")
    print_table(
        ["page", "offset", "list_jobs p50", "list_jobs p95"],
        [[name, f"{row['offset']:,}", f"{row['list_ms_p50']:.1f}", f"{row['list_ms_p95']:.1f}"]
         for name, row in keyed["pages"].items()],
        [False, True, True, True])
