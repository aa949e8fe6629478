"""The one door to Redis: typed operations on a queue's data, and the transports that run them.

Everything outside ``_store`` (the clients, the worker runtime, the CLI, Spark, the benchmarks)
imports from here: ``from panqueue._store import ops`` or the names re-exported below. Nothing
outside builds a script's ARGV, imports the script table or knows a hash field's letter.

- ``ops``: the clients' operations (add, read, cancel, retry, schedules, events, ...).
- ``transitions``: the worker's transitions (claim, complete a batch, fail, renew, release,
  sweep stalled jobs, promote, clean).
- ``transport``: the asyncio / thread / sync drivers that run an operation.
"""

from panqueue._store import ops
from panqueue._store.ops import (
    Event,
    NewJob,
    ScheduleInfo,
)

# The worker's transitions (``transitions.py``) are re-exported here next to ``ops``.

__all__ = [
    "Event",
    "NewJob",
    "ScheduleInfo",
    "ops",
]
