"""The thread executor: plain (blocking) handlers in a pool of threads, off the event loop.

A sync handler registered with ``executor="thread"`` runs in a daemon thread, so blocking calls
(``time.sleep``, a blocking HTTP client, image libraries) never stall the worker's event loop,
and up to ``concurrency`` jobs run at once. ``job.progress()`` and ``job.log()`` are plain calls
there (no ``await``). See docs/executors.md.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/executor_thread.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import threading
import time

import anyio

from panqueue import Job, QueueClient, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()

# How many handlers run at this moment, and the most seen at once (the handlers run in threads
# of this process, so a lock-protected counter is enough to observe the parallelism).
_lock = threading.Lock()
_gauge = {"now": 0, "peak": 0}


@queues.handler("thumbnails", executor="thread", concurrency=4)
def thumbnail(job: Job) -> dict[str, object]:
    """A sync handler: blocking work is fine here, it runs in its own thread."""
    with _lock:
        _gauge["now"] += 1
        _gauge["peak"] = max(_gauge["peak"], _gauge["now"])
    try:
        job.log(f"resizing {job.data['image']} in {threading.current_thread().name}")
        for step in range(1, 5):
            time.sleep(0.05)           # blocking I/O or CPU work in a real handler
            job.progress(step * 25)    # a plain call in a thread: no await
        return {"image": job.data["image"], "size": "128x128"}
    finally:
        with _lock:
            _gauge["now"] -= 1


async def main(url: str) -> None:
    worker = Worker(queues, "thumbnails", url=url)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        print(f"worker started (executor thread, concurrency {worker.concurrency})")

        async with QueueClient(url) as client:
            images = [f"photo-{i}.jpg" for i in range(1, 9)]
            started = time.monotonic()
            handles = await client.queue("thumbnails").add_bulk([{"image": i} for i in images])
            print(f"added {len(handles)} jobs of about 0.2 s each")
            results = [await handle.result(timeout=20.0) for handle in handles]
            elapsed = time.monotonic() - started
            print(f"all {len(results)} thumbnails done: {results[0]} ...")
            print(f"at most {_gauge['peak']} handlers ran at once "
                  f"({elapsed:.1f} s in all, not {0.2 * len(images):.1f} s one after another)")
            info = await handles[0].info()
            print(f"job {info.id}: {info.state.value}, progress {info.progress}, "
                  f"log {info.logs[0].split(' in ')[0]!r}")

        await worker.shutdown(grace=5.0)
    print(f"worker stopped after {worker.processed} jobs")


if __name__ == "__main__":
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
