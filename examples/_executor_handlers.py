"""Handlers for examples/executor_subprocess.py (a module, not an example: it is not run).

A subprocess handler runs in a child process, which imports it by ``module:qualname``. A script
run as ``python examples/x.py`` is the module ``__main__``, which a child cannot import, so the
handler lives here and the example imports it. The child receives the worker's ``sys.path``
(which starts with the script's directory, ``examples/``), so ``_executor_handlers`` is
importable there too.
"""

from __future__ import annotations

import os
import time

from panqueue import Job, Limits, Registry

queues = Registry()


# The child inherits PATH and REPORT_LOCALE from the worker's environment, nothing else (env=
# replaces the default allow-list). Limits apply to the child: 256 MB of address space and
# 2 s of CPU per job.
@queues.handler("reports", executor="subprocess", concurrency=2,
                env=["PATH", "REPORT_LOCALE"], limits=Limits(memory_mb=256, cpu_seconds=2))
def build_report(job: Job) -> dict[str, object]:
    task = job.data["task"]
    if task == "environment":
        job.log("reading the environment")  # a plain call in a child process: no await
        return {"pid": os.getpid(),
                "REPORT_LOCALE": os.environ.get("REPORT_LOCALE"),
                "EXAMPLE_API_TOKEN": os.environ.get("EXAMPLE_API_TOKEN"),
                "variables": sorted(os.environ)}
    if task == "huge":
        table = bytearray(1024 * 1024 * 1024)  # 1 GiB: far beyond the 256 MB limit
        return {"size": len(table)}
    if task == "spin":
        end = time.monotonic() + 30
        while time.monotonic() < end:  # burns CPU; the kernel stops it after 2 s of CPU
            pass
        return {"spun": True}
    rows = job.data["rows"]
    for done in range(1, rows + 1):
        job.progress(round(100 * done / rows))
    print(f"report {job.id}: {rows} rows")  # a print in the child goes to stderr
    return {"pid": os.getpid(), "rows": rows}
