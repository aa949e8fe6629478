"""The subprocess executor: handlers in child processes, with an environment allow-list and
resource limits.

The handler (in examples/_executor_handlers.py) runs in a long-lived child process that
inherits only the environment variables named in ``env=``, runs under ``Limits`` (memory, CPU
seconds per job, open files) and sits in a session of its own. A job that exceeds a limit fails
with a clear message, and the next job gets a fresh child. Without permissions= this is
isolation against accidents, not a security sandbox: see docs/executors.md, and
examples/permissions.py for a child the kernel holds to its grants.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/executor_subprocess.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import os

import anyio

# The handlers live in an importable module: a child process cannot import `__main__`.
from _executor_handlers import build_report, queues

from panqueue import JobFailed, QueueClient, Worker, configure_logging
from panqueue.embedded import url_or_private_server


async def main(url: str) -> None:
    # Something the worker process knows but the handler's child must not see.
    os.environ["EXAMPLE_API_TOKEN"] = "s3cr3t-token"
    os.environ["REPORT_LOCALE"] = "en_GB"
    print(f"the worker's environment has EXAMPLE_API_TOKEN={os.environ['EXAMPLE_API_TOKEN']!r}")

    worker = Worker(queues, "reports", url=url)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        print(f"worker started (executor subprocess, handler {build_report.import_path})")

        async with QueueClient(url) as client:
            reports = client.queue("reports")

            seen = await (await reports.add({"task": "environment"})).result(timeout=30.0)
            print(f"the child (pid {seen['pid']}, worker pid {os.getpid()}) sees "
                  f"REPORT_LOCALE={seen['REPORT_LOCALE']!r} and "
                  f"EXAMPLE_API_TOKEN={seen['EXAMPLE_API_TOKEN']!r}")
            # PATH and REPORT_LOCALE were passed on; LC_CTYPE, if listed, is set by the child's
            # Python itself when no locale variable is present (PEP 538), not inherited.
            print(f"all the child's variables: {seen['variables']}")

            handle = await reports.add({"task": "rows", "rows": 40})
            done = await handle.result(timeout=30.0)
            info = await handle.info()
            same = "the same" if done["pid"] == seen["pid"] else "another"
            print(f"report: {done['rows']} rows, progress {info.progress}, in {same} child")

            for task in ("huge", "spin"):
                try:
                    await (await reports.add({"task": task})).result(timeout=30.0)
                except JobFailed as exc:
                    assert exc.error is not None
                    print(f"{task}: failed: {exc.error.type}: {exc.error.message}")

            after = await (await reports.add({"task": "rows", "rows": 3})).result(timeout=30.0)
            print(f"after the failures: {after['rows']} rows in a fresh child "
                  f"({'new pid' if after['pid'] != seen['pid'] else 'same pid'})")

        await worker.shutdown(grace=5.0)
    print(f"worker stopped: {worker.processed} completed, {worker.failed} failed")


if __name__ == "__main__":
    # Errors only: the two failing jobs are logged by the worker as errors on stderr.
    configure_logging(level="error")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
