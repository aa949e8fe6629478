"""An application embedding a WorkerPool, for tests/test_logging.py.

``python log_app.py MODE URL``: runs one job that succeeds and one that fails twice, then
exits. MODE says how the application sets up logging: ``none`` (not at all), ``basic``
(``logging.basicConfig`` at INFO) or ``json`` (``configure_logging("json", log_jobs=True)``,
plus an operator notice). ``idle``: JSON lines, the pool idle for a second, then one job.
``handlers`` (``handlers-trio``: on trio): as ``none``, then prints (JSON) the loggers that
have handlers other than a ``NullHandler``: the application set up none."""

from __future__ import annotations

import logging
import sys

import anyio

from panqueue import Backoff, Job, QueueClient, Registry, WorkerPool, configure_logging
from panqueue._log import notice
from panqueue.testing import drain

registry = Registry()


@registry.handler("logged", attempts=2, backoff=Backoff("fixed", 0.01))
async def logged(job: Job) -> str:
    if job.data.get("fail"):
        raise ValueError("the payment service said no")
    return "ok"


# Queues that stay idle (mode ``idle``).
for _idle in ("idle-1", "idle-2"):
    registry.handler(_idle)(logged)


async def main(mode: str, url: str) -> None:
    if mode == "basic":
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(name)s %(levelname)s %(message)s")
    elif mode == "idle":
        configure_logging("json")
        async with WorkerPool(registry, url=url, summary_interval=0.05):
            await anyio.sleep(1.0)  # about 60 summary intervals with nothing to say
            notice("idle second over")
            async with QueueClient(url) as client:
                await client.queue("logged").add({"fail": False})
            await drain(url, "logged")
            await anyio.sleep(0.3)  # room for the summary line
        return
    elif mode == "json":
        configure_logging("json", log_jobs=True)
        notice("SIGTERM received; finishing running jobs", signal="SIGTERM")
    async with QueueClient(url) as client:
        queue = client.queue("logged")
        await queue.add({"fail": False})
        await queue.add({"fail": True})
        async with WorkerPool(registry, url=url, summary_interval=0.05):
            await drain(url, "logged")
            await anyio.sleep(0.2)  # room for a summary line


if __name__ == "__main__":
    listing = sys.argv[1].startswith("handlers")  # "handlers" or "handlers-trio"
    anyio.run(main, "none" if listing else sys.argv[1], sys.argv[2],
              backend="trio" if sys.argv[1] == "handlers-trio" else "asyncio")
    if listing:
        import json

        loggers = [logging.getLogger(), *(logger for logger in
                                          logging.root.manager.loggerDict.values()
                                          if isinstance(logger, logging.Logger))]
        print(json.dumps(sorted(
            logger.name for logger in loggers
            if any(not isinstance(h, logging.NullHandler) for h in logger.handlers))))
