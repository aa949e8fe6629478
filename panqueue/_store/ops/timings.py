"""Wait and run times of the jobs a queue finished recently, read back from their job hashes.

Nothing is written for this on the job's path: the completed and failed sets are already scored
by finish time, and every job hash keeps when it was enqueued (``et``), when its last attempt
started (``st``) and when it finished (``ft``), all on the server's clock. A reader takes the
newest finished jobs of the last window and computes percentiles of their times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from panqueue._check import check_int
from panqueue._keys import QueueKeys
from panqueue._options import check_positive
from panqueue._store.ops.jobs import scored
from panqueue._store.transport import Batch, Command, Op

__all__ = ["Timings", "percentile", "recent_timings"]

# The newest finished jobs read per call, at most (a busy queue is sampled, not read whole).
DEFAULT_SAMPLE = 1000


@dataclass(frozen=True, slots=True)
class Timings:
    """Wait and run times of ``jobs`` jobs that finished in the last ``window`` seconds.

    ``wait_*``: from the job's enqueue to the start of its last attempt (so a delay asked at
    add time, and earlier attempts and their backoff, count as waiting). ``run_*``: from the
    start of the last attempt to the finish. Seconds; ``None`` when no job qualifies. ``jobs``
    is the sample size: at most the sample asked for, newest first, even if more finished.
    """

    window: float
    jobs: int
    wait_p50: float | None
    wait_p95: float | None
    run_p50: float | None
    run_p95: float | None


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile of ``values`` (``fraction`` in (0, 1]); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def recent_timings(keys: QueueKeys | Sequence[QueueKeys], window: float = 60.0,
                   sample: int = DEFAULT_SAMPLE) -> Op[Timings]:
    """Percentiles of the wait and run times of the queue's jobs that completed or failed for
    good in the last ``window`` seconds (the newest ``sample`` of them at most). ``keys``: the
    queue, or every partition of a partitioned one. Two round trips per partition: the
    finished sets' newest members with the server's clock, then the jobs' times. Jobs that
    never started (cancelled before they ran, failed by a dependency) and jobs removed in
    between are left out."""
    check_positive(window, "window")
    check_int(sample, "sample", low=1)
    finished: list[tuple[float, QueueKeys, bytes]] = []
    for part in [keys] if isinstance(keys, QueueKeys) else keys:
        now, completed, failed = yield Batch((
            Command(("TIME",)),
            Command(("ZREVRANGE", part.completed, 0, sample - 1, "WITHSCORES")),
            Command(("ZREVRANGE", part.failed, 0, sample - 1, "WITHSCORES")),
        ), route=part.prefix)
        since = int(now[0]) * 1000 + int(now[1]) // 1000 - window * 1000
        finished += [(score, part, member)
                     for member, score in (*scored(completed), *scored(failed))
                     if score >= since]
    finished = sorted(finished, key=lambda item: item[0], reverse=True)[:sample]
    waits: list[float] = []
    runs: list[float] = []
    if finished:
        replies = yield Batch(tuple(Command(("HMGET", part.job(member.decode()), "et", "st",
                                             "ft")) for _, part, member in finished))
        for enqueued, started, ended in replies:
            if enqueued is None or started is None or ended is None:
                continue
            start = int(started)
            waits.append(max(0, start - int(enqueued)) / 1000)
            runs.append(max(0, int(ended) - start) / 1000)
    return Timings(window, len(runs), percentile(waits, 0.5), percentile(waits, 0.95),
                   percentile(runs, 0.5), percentile(runs, 0.95))
