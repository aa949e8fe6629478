"""The one door to Redis: typed operations on a queue's data, and the transports that run them.

Everything outside ``_store`` (the clients, the worker runtime, the CLI, Spark, the benchmarks)
imports from here: the ``ops`` namespace and the names re-exported below. Nothing outside
builds a script's ARGV, imports the script table, knows a job hash's field letters or reads a
stored form.

- ``ops``: the clients' operations (add, read and list jobs, cancel, retry, schedules,
  events, which queues exist, ...), by concern in ``ops/*.py``.
- ``transitions``: the worker's transitions (claim, complete a batch, fail, renew, release,
  sweep stalled jobs, promote, clean); a claim answers typed jobs.
- ``notify``: the notify channel's messages, read into typed values; ``tokens``: lock tokens,
  made and read.
- ``transport``: the asyncio / thread / sync drivers that run an operation.
"""

from panqueue._store import ops, transitions
from panqueue._store.ops import (
    Event,
    Explanation,
    NewJob,
    ScheduleInfo,
    WorkerInfo,
    WorkerProcess,
)
from panqueue._store.transport import (
    AsyncTransport,
    Op,
    SyncTransport,
    check_url,
    open_async_transport,
)

__all__ = [
    "AsyncTransport",
    "Event",
    "Explanation",
    "NewJob",
    "Op",
    "ScheduleInfo",
    "SyncTransport",
    "WorkerInfo",
    "WorkerProcess",
    "check_url",
    "open_async_transport",
    "ops",
    "transitions",
]
