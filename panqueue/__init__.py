"""panqueue: a Redis-backed job queue and worker runtime for asyncio and trio.

Everything public is importable from here; other modules are private.
"""

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
