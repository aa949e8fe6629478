"""Operations on one queue's Redis data, written once for the sync and the async clients.

Each operation is a generator that yields requests (script calls, commands, batches) and
returns a Python value; a transport drives it (``transport.run(op)``). Only these modules build
a script's ARGV, read its reply or know a job hash's field letters. By concern:

- ``add``: validating a producer's arguments into a :class:`NewJob`, and adding jobs.
- ``queue``: which queues exist, a queue's settings, pausing, changes to one job, purging.
- ``jobs``: reading jobs back (one, many, a state's listing, counts); ``results``: waiting
  for a job's result.
- ``events``: the event stream.
- ``schedules``: repeatable jobs' schedules and the server's clock.
- ``workers``: the worker registry; ``explain``: why a job is where it is.
- ``flow``: the graph of a job's dependencies and dependents, for the dashboard.
- ``timings``: wait and run time percentiles of the jobs finished in the last minute.
- ``history``: the history stream of finished jobs, read and acknowledged by exports.

The worker's transitions (claim, complete, fail, renew...) are in ``panqueue._store.transitions``.
"""

from panqueue._store.ops.add import (
    ADD_OPTIONS,
    NewJob,
    add_call,
    add_jobs,
    job_alike,
    new_job,
    parse_added,
)
from panqueue._store.ops.base import (
    DEFAULT_KEEP_COMPLETED,
    DEFAULT_KEEP_EVENTS,
    DEFAULT_KEEP_FAILED,
    DEFAULT_KEEP_HISTORY,
    SCHEMA_VERSION,
    encode_error,
    script_call,
)
from panqueue._store.ops.events import Event, events_now, last_event_id, read_events
from panqueue._store.ops.explain import Explanation, explain
from panqueue._store.ops.flow import FLOW_LOOK, FLOW_NODES, Flow, FlowNode, read_flow
from panqueue._store.ops.history import (
    HISTORY_FIELDS,
    HistoryBatch,
    HistoryRecord,
    acknowledge_history,
    open_history_export,
    read_history,
)
from panqueue._store.ops.jobs import (
    STATE_SETS,
    counts,
    get_job,
    list_ids,
    list_jobs,
    parse_job,
    read_jobs,
    state_set,
)
from panqueue._store.ops.queue import (
    cancel,
    clean,
    events_written,
    is_paused,
    known_queue,
    pause,
    pause_like_home,
    ping,
    purge,
    queues,
    remove,
    retry_failed,
    setup_queue,
    signal,
)
from panqueue._store.ops.results import wait_result
from panqueue._store.ops.schedules import (
    ScheduleInfo,
    list_schedules,
    remove_schedule,
    schedule_set,
    schedule_tick,
    schedule_times,
    server_time_ms,
)
from panqueue._store.ops.timings import Timings, recent_timings
from panqueue._store.ops.workers import (
    WorkerInfo,
    WorkerProcess,
    control,
    control_command,
    control_targets,
    merge_workers,
    worker_processes,
    workers,
)

__all__ = [
    "ADD_OPTIONS",
    "DEFAULT_KEEP_COMPLETED",
    "DEFAULT_KEEP_EVENTS",
    "DEFAULT_KEEP_FAILED",
    "DEFAULT_KEEP_HISTORY",
    "FLOW_LOOK",
    "FLOW_NODES",
    "HISTORY_FIELDS",
    "SCHEMA_VERSION",
    "STATE_SETS",
    "Event",
    "Explanation",
    "Flow",
    "FlowNode",
    "HistoryBatch",
    "HistoryRecord",
    "NewJob",
    "ScheduleInfo",
    "Timings",
    "WorkerInfo",
    "WorkerProcess",
    "acknowledge_history",
    "add_call",
    "add_jobs",
    "cancel",
    "clean",
    "control",
    "control_command",
    "control_targets",
    "counts",
    "encode_error",
    "events_now",
    "events_written",
    "explain",
    "get_job",
    "is_paused",
    "job_alike",
    "known_queue",
    "last_event_id",
    "list_ids",
    "list_jobs",
    "list_schedules",
    "merge_workers",
    "new_job",
    "open_history_export",
    "parse_added",
    "parse_job",
    "pause",
    "pause_like_home",
    "ping",
    "purge",
    "queues",
    "read_events",
    "read_flow",
    "read_history",
    "read_jobs",
    "recent_timings",
    "remove",
    "remove_schedule",
    "retry_failed",
    "schedule_set",
    "schedule_tick",
    "schedule_times",
    "script_call",
    "server_time_ms",
    "setup_queue",
    "signal",
    "state_set",
    "wait_result",
    "worker_processes",
    "workers",
]
