"""panqueue: a Redis-backed job queue and worker runtime for asyncio and trio.

Everything public is importable from here; other modules are private.

The names are imported on first use (PEP 562): ``import panqueue`` alone loads nothing else, so
a command that needs the client does not load the worker runtime, the executors or logging, and
a Spark task that decodes job rows loads only the modules that needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from panqueue._batch import Batch, BatchInfo, SyncBatch
    from panqueue._client import QueueClient, SyncQueueClient
    from panqueue._job import ChunkFailure, ErrorInfo, Job, JobInfo, JobState
    from panqueue._log import configure_logging
    from panqueue._options import (
        Backoff,
        Chunk,
        Dedup,
        JobOptions,
        Limits,
        RateLimit,
        Retention,
    )
    from panqueue._permissions import Permissions
    from panqueue._pool import WorkerPool
    from panqueue._producer import FlowJob, JobHandle, SyncJobHandle
    from panqueue._queue import Queue, SyncQueue
    from panqueue._registry import Handler, Registry
    from panqueue._runtime.worker import Worker
    from panqueue._schedule import Schedule
    from panqueue._store import Event, Explanation, ScheduleInfo, WorkerInfo, WorkerProcess
    from panqueue._store.ops import Timings
    from panqueue._version import __version__
    from panqueue.errors import (
        ConfigError,
        ConnectionError,
        Fail,
        JobFailed,
        JobNotFound,
        LockLost,
        PanqueueError,
        PayloadError,
        RateLimited,
        Retry,
        ServerUnavailable,
        SignalTimeout,
        Snooze,
        TimeoutError,
    )
    from panqueue.executors import Executor

# Each public name and the module it comes from.
_MODULES = {
    "Backoff": "panqueue._options",
    "Batch": "panqueue._batch",
    "BatchInfo": "panqueue._batch",
    "Chunk": "panqueue._options",
    "ChunkFailure": "panqueue._job",
    "ConfigError": "panqueue.errors",
    "ConnectionError": "panqueue.errors",
    "Dedup": "panqueue._options",
    "ErrorInfo": "panqueue._job",
    "Event": "panqueue._store",
    "Executor": "panqueue.executors",
    "Explanation": "panqueue._store",
    "Fail": "panqueue.errors",
    "FlowJob": "panqueue._producer",
    "Handler": "panqueue._registry",
    "Job": "panqueue._job",
    "JobFailed": "panqueue.errors",
    "JobHandle": "panqueue._producer",
    "JobInfo": "panqueue._job",
    "JobNotFound": "panqueue.errors",
    "JobOptions": "panqueue._options",
    "JobState": "panqueue._job",
    "Limits": "panqueue._options",
    "LockLost": "panqueue.errors",
    "PanqueueError": "panqueue.errors",
    "PayloadError": "panqueue.errors",
    "Permissions": "panqueue._permissions",
    "Queue": "panqueue._queue",
    "QueueClient": "panqueue._client",
    "RateLimit": "panqueue._options",
    "RateLimited": "panqueue.errors",
    "Registry": "panqueue._registry",
    "Retention": "panqueue._options",
    "Retry": "panqueue.errors",
    "Schedule": "panqueue._schedule",
    "ScheduleInfo": "panqueue._store",
    "ServerUnavailable": "panqueue.errors",
    "SignalTimeout": "panqueue.errors",
    "Snooze": "panqueue.errors",
    "SyncBatch": "panqueue._batch",
    "SyncJobHandle": "panqueue._producer",
    "SyncQueue": "panqueue._queue",
    "SyncQueueClient": "panqueue._client",
    "TimeoutError": "panqueue.errors",
    "Timings": "panqueue._store.ops",
    "Worker": "panqueue._runtime.worker",
    "WorkerInfo": "panqueue._store",
    "WorkerPool": "panqueue._pool",
    "WorkerProcess": "panqueue._store",
    "__version__": "panqueue._version",
    "configure_logging": "panqueue._log",
}

__all__ = [
    "Backoff",
    "Batch",
    "BatchInfo",
    "Chunk",
    "ChunkFailure",
    "ConfigError",
    "ConnectionError",
    "Dedup",
    "ErrorInfo",
    "Event",
    "Executor",
    "Explanation",
    "Fail",
    "FlowJob",
    "Handler",
    "Job",
    "JobFailed",
    "JobHandle",
    "JobInfo",
    "JobNotFound",
    "JobOptions",
    "JobState",
    "Limits",
    "LockLost",
    "PanqueueError",
    "PayloadError",
    "Permissions",
    "Queue",
    "QueueClient",
    "RateLimit",
    "RateLimited",
    "Registry",
    "Retention",
    "Retry",
    "Schedule",
    "ScheduleInfo",
    "ServerUnavailable",
    "SignalTimeout",
    "Snooze",
    "SyncBatch",
    "SyncJobHandle",
    "SyncQueue",
    "SyncQueueClient",
    "TimeoutError",
    "Timings",
    "Worker",
    "WorkerInfo",
    "WorkerPool",
    "WorkerProcess",
    "__version__",
    "configure_logging",
]

# The public modules, each loaded when first named as an attribute of the package.
_SUBMODULES = frozenset({"cli", "dashboard", "django", "embedded", "errors", "executors",
                         "metrics", "spark", "spark_sources", "testing"})


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif name in _SUBMODULES:  # panqueue.errors.X, panqueue.spark.X after import panqueue
        value = importlib.import_module(f"panqueue.{name}")
    else:
        raise AttributeError(f"module 'panqueue' has no attribute {name!r}")
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
