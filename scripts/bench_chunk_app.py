"""Handlers for ``scripts/bench.py --chunk`` (loaded by the worker process as
``bench_chunk_app:queues``): the same no-op as a plain handler and as a chunk handler.

* ``bench-chunk-plain``: an async no-op.
* ``bench-chunk-100``: an async no-op chunk handler, ``Chunk(size=100, wait=0.05)``.

Neither declares a concurrency: the benchmark sets it with the worker's ``--concurrency`` (for
the chunk handler it counts chunks). Both keep the default retention (1000 completed jobs), as
a real deployment would.
"""

from __future__ import annotations

from panqueue import Chunk, Job, Registry

queues = Registry()


@queues.handler("bench-chunk-plain")
async def noop(job: Job) -> None:
    return None


@queues.handler("bench-chunk-100", chunk=Chunk(size=100, wait=0.05))
async def noop_chunk(jobs: list[Job]) -> list[None]:
    return [None] * len(jobs)
