"""The reference model of tests/test_model.py: what a user of panqueue can observe, in plain
Python, with no Redis and no clock.

It knows every job the test added (by queue and id), the state each must be in, which
dependencies each still needs, the dedup keys and what they point to, and each batch's members
and their first endings, each job's tags, the type of a failed job's last error, and a durable
job's progress (its step stored, its brief sleep recorded, the signals kept for it, whether it
waits for one). Transitions are methods named after what happened (a job was added,
cancelled, removed, retried, started, ended); each returns what the real system must answer.
The model knows nothing of partitions: everything it predicts must hold whatever partition a
job lives in.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime

WAITING, DELAYED, BLOCKED, ACTIVE = "waiting", "delayed", "blocked", "active"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
STATES = (WAITING, DELAYED, BLOCKED, ACTIVE, COMPLETED, FAILED, CANCELLED)
FINAL = frozenset({COMPLETED, FAILED, CANCELLED})
NOT_STARTED = frozenset({WAITING, DELAYED, BLOCKED})
UNFINISHED = frozenset({WAITING, DELAYED, BLOCKED, ACTIVE})
HANDLER_ERROR = "ValueError"  # what a failing handler raises
DEPENDENCY_FAILED = "DependencyFailed"

JobKey = tuple[str, str]  # (queue, job id)


class ModelMismatch(AssertionError):
    """The real system did something the model says it must not."""


@dataclass
class ModelJob:
    queue: str
    id: str
    state: str
    data: dict[str, object]
    priority: int = 0
    attempts: int = 1  # allowed per round (a retry from the dead-letter set starts a new one)
    fail_first: int = 0  # the handler fails attempts 1..fail_first
    delayed: bool = False  # far in the future: never due while the test runs
    # The delay given as an absolute time (add's run_at, inside a millisecond), else None.
    run_at: datetime | None = None
    deps: tuple[str, ...] = ()
    needs: set[str] = field(default_factory=set)  # dependencies not completed yet
    dep_lost: bool = False  # a dependency was cancelled or deleted before completing
    tried: int = 0  # attempts started in this round
    seq: int = 0  # its turn among the waiting jobs of its priority (ties: released together)
    batch: str | None = None
    tags: tuple[str, ...] = ()
    dedup: str | None = None  # the dedup key it was added with
    born: int = 0  # the order of adds: a tag's jobs are listed (and picked in bulk) in it
    error: str | None = None  # the type of a FAILED job's last error
    # Durable jobs (data["durable"]: "nap" sleeps briefly, "sleep" for an hour, "wait" for the
    # signal "go"): each run takes the step "effect" first, then sleeps or waits.
    stepped: bool = False  # the step ran and was stored (a run started)
    napped: bool = False  # its brief sleep was recorded: a later run passes it
    waiting: bool = False  # DELAYED until its signal comes
    signals: int = 0  # signals kept for it, not taken yet
    got: bool = False  # its wait took a signal (a later run replays it)
    will_suspend: bool = False  # the run started last must end by sleeping or waiting

    @property
    def durable(self) -> str | None:
        kind = self.data.get("durable")
        return None if kind is None else str(kind)


@dataclass
class ModelBatch:
    id: str
    on_success: bool
    members: list[JobKey] = field(default_factory=list)
    endings: dict[JobKey, str] = field(default_factory=dict)  # first ending: completed | failed
    closed: bool = False

    def info(self) -> dict[str, object]:
        completed = sum(1 for e in self.endings.values() if e == COMPLETED)
        failed = len(self.endings) - completed
        return {"id": self.id, "total": len(self.members),
                "pending": len(self.members) - len(self.endings), "completed": completed,
                "failed": failed, "closed": self.closed}

    @property
    def fired(self) -> bool:
        return self.closed and len(self.endings) == len(self.members)


@dataclass
class Added:
    """What an add must answer: the job's id, and whether this add created it."""

    id: str
    created: bool


class Model:
    def __init__(self) -> None:
        self.jobs: dict[JobKey, ModelJob] = {}
        self.dedup: dict[tuple[str, str], str] = {}  # (queue, dedup key) -> job id
        self.batches: dict[str, ModelBatch] = {}
        self.gone: set[JobKey] = set()  # ids that existed and were deleted
        self._seq = itertools.count(1)
        self._born = itertools.count(1)

    # ------------------------------------------------------------------ reading

    def job(self, queue: str, job_id: str) -> ModelJob | None:
        return self.jobs.get((queue, job_id))

    def in_queue(self, queue: str) -> list[ModelJob]:
        return [job for job in self.jobs.values() if job.queue == queue]

    def counts(self, queue: str) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        for job in self.in_queue(queue):
            counts[job.state] += 1
        return counts

    def ready(self, queue: str) -> list[ModelJob]:
        return [job for job in self.in_queue(queue) if job.state == WAITING]

    # ------------------------------------------------------------------ adding

    def dependency_problem(self, queue: str, deps: tuple[str, ...]) -> str | None:
        for dep in deps:
            if (queue, dep) not in self.jobs:
                return f"dependency {dep!r} is not a job of the queue"
        return None

    def resolve_add(self, queue: str, job_id: str | None, dedup: tuple[str, str] | None
                    ) -> Added | None:
        """The existing job an add returns (the id first, then the dedup key), or None when the
        add creates a job. A dedup ``replace`` of a job that has not started deletes it here.
        The key names the job it was added with, not a later job that took that job's id once
        it was deleted."""
        if job_id is not None and (queue, job_id) in self.jobs:
            return Added(job_id, False)
        if dedup is not None:
            key, strategy = dedup
            holder = self.dedup.get((queue, key))
            existing = None if holder is None else self.job(queue, holder)
            if existing is not None and existing.dedup == key:
                if strategy != "replace":
                    return Added(existing.id, False)
                if existing.state in NOT_STARTED:
                    self.delete(existing, lost=True)
        return None

    def create(self, queue: str, job_id: str, data: dict[str, object], *, priority: int = 0,
               attempts: int = 1, fail_first: int = 0, delayed: bool = False,
               deps: tuple[str, ...] = (), dedup: str | None = None,
               batch: str | None = None, tags: tuple[str, ...] = (),
               run_at: datetime | None = None) -> ModelJob:
        job = ModelJob(queue, job_id, WAITING, data, priority, attempts, fail_first, delayed,
                       run_at, deps, batch=batch, tags=tags, dedup=dedup, born=next(self._born))
        self.jobs[(queue, job_id)] = job
        self.gone.discard((queue, job_id))
        if dedup is not None:
            self.dedup[(queue, dedup)] = job_id
        if batch is not None:
            self.batches[batch].members.append((queue, job_id))
        lost = False
        failed_deps = False
        for dep in deps:
            dependency = self.jobs.get((queue, dep))  # None: this add's dedup replaced it
            if dependency is not None and dependency.state == COMPLETED:
                continue
            job.needs.add(dep)
            if dependency is None or dependency.state == CANCELLED:
                lost = True
            failed_deps = failed_deps or dependency is None or dependency.state in (FAILED,
                                                                                 CANCELLED)
        if failed_deps:
            job.dep_lost = lost
            self._end(job, FAILED, DEPENDENCY_FAILED)
        elif job.needs:
            job.state = BLOCKED
        else:
            self._make_ready(job, next(self._seq))
        return job

    # ------------------------------------------------------------------ admin

    def cancel(self, job: ModelJob) -> str:
        before = job.state
        if before in NOT_STARTED:
            self._end(job, CANCELLED)
            self._fail_dependents(job, lost=True)
        return before

    def delete(self, job: ModelJob, *, lost: bool) -> None:
        """remove(), a dedup replace, or retention: the job is gone."""
        del self.jobs[(job.queue, job.id)]
        self.gone.add((job.queue, job.id))
        if job.batch is not None and job.state not in FINAL:
            self._record_ending(job, FAILED)
        if job.state != COMPLETED:
            self._fail_dependents(job, lost=lost)
        for other in self.in_queue(job.queue):
            if job.id in other.needs and other.state == FAILED:
                other.dep_lost = True  # whatever it waited for is gone: never retried

    def retry_failed(self, queue: str, ids: list[str] | None) -> int:
        asked = [j for j in self.in_queue(queue) if j.state == FAILED
                 and (ids is None or j.id in ids)]
        moving = {j.id for j in asked if not j.dep_lost}
        changed = True
        while changed:  # the greatest set whose needs can all still complete
            changed = False
            for job_id in sorted(moving):
                job = self.jobs[(queue, job_id)]
                for dep in job.needs:
                    dependency = self.job(queue, dep)
                    if dependency is None or dependency.state == CANCELLED or (
                            dependency.state == FAILED and dep not in moving):
                        moving.discard(job_id)
                        changed = True
                        break
        seq = next(self._seq)
        for job_id in sorted(moving):
            job = self.jobs[(queue, job_id)]
            job.tried = 0
            job.error = None
            if job.needs:
                job.state = BLOCKED
            else:
                job.state = WAITING  # a retried job runs now, whatever delay it was added with
                job.seq = seq
        return len(moving)

    # ------------------------------------------------------------------ by filter

    def tagged(self, queue: str, tag: str, states: frozenset[str] | tuple[str, ...]
               ) -> list[ModelJob]:
        """The jobs a bulk operation picks: those with the tag in one of ``states``, in the
        order they were added."""
        return sorted((j for j in self.in_queue(queue) if tag in j.tags and j.state in states),
                      key=lambda j: j.born)

    def cancel_jobs(self, queue: str, tag: str, state: str | None) -> int:
        """Each picked job is cancelled if it has not finished by its turn (a dependency
        cancelled before it may have failed it): an active one counts (its worker is told)."""
        picked = self.tagged(queue, tag, UNFINISHED if state is None else (state,))
        return sum(1 for job in picked if self.cancel(job) in UNFINISHED)

    def remove_jobs(self, queue: str, tag: str, state: str) -> int:
        """Each picked job is deleted if it is still in ``state`` by its turn."""
        removed = 0
        for job in self.tagged(queue, tag, (state,)):
            if self.job(queue, job.id) is job and job.state == state:
                self.delete(job, lost=True)
                removed += 1
        return removed

    def retry_matching(self, queue: str, tag: str | None, error_type: str | None) -> int:
        ids = [j.id for j in self.in_queue(queue) if j.state == FAILED
               and (tag is None or tag in j.tags)
               and (error_type is None or j.error == error_type)]
        return self.retry_failed(queue, ids)

    # ------------------------------------------------------------------ durable jobs

    def signal(self, job: ModelJob) -> bool:
        """client.signal(..., "go"): kept with an unfinished job, which wakes if it waits."""
        if job.state in FINAL:
            return False
        job.signals += 1
        if job.waiting:
            job.waiting = False
            job.state = WAITING
            job.seq = next(self._seq)
        return True

    def suspend(self, job: ModelJob) -> None:
        """The run ended by a sleep or a wait: DELAYED, and the attempt given back."""
        job.tried -= 1
        job.state = DELAYED
        job.will_suspend = False
        if job.durable == "nap":
            job.napped = True
        elif job.durable == "wait":
            job.waiting = True

    # ------------------------------------------------------------------ a worker's run

    def start(self, job: ModelJob) -> None:
        job.state = ACTIVE
        job.tried += 1
        if job.durable is not None:
            job.stepped = True
            if job.durable == "wait" and not job.got and job.signals:
                job.got = True  # the wait takes the oldest kept signal, in this run
                job.signals -= 1
            job.will_suspend = (job.durable == "sleep" or (job.durable == "nap"
                                                           and not job.napped)
                                or (job.durable == "wait" and not job.got))

    def end(self, job: ModelJob, ok: bool) -> None:
        if ok:
            self._end(job, COMPLETED)
            seq = next(self._seq)
            for other in self.in_queue(job.queue):
                if job.id in other.needs:
                    other.needs.discard(job.id)
                    if other.state == BLOCKED and not other.needs:
                        self._make_ready(other, seq)
        elif job.tried < job.attempts:
            job.state = WAITING
            job.seq = next(self._seq)
        else:
            self._end(job, FAILED, HANDLER_ERROR)
            self._fail_dependents(job, lost=False)

    def stopped(self, job: ModelJob) -> None:
        """A running job that was cancelled ends CANCELLED when its handler stops."""
        self._end(job, CANCELLED)
        self._fail_dependents(job, lost=True)

    # ------------------------------------------------------------------ batches

    def open_batch(self, batch_id: str, on_success: bool) -> None:
        self.batches[batch_id] = ModelBatch(batch_id, on_success)

    # ------------------------------------------------------------------ internals

    def _make_ready(self, job: ModelJob, seq: int) -> None:
        job.state = DELAYED if job.delayed else WAITING
        job.seq = seq

    def _end(self, job: ModelJob, state: str, error: str | None = None) -> None:
        job.state = state
        job.error = error
        job.waiting = False
        if job.batch is not None:
            self._record_ending(job, COMPLETED if state == COMPLETED else FAILED)

    def _record_ending(self, job: ModelJob, ending: str) -> None:
        assert job.batch is not None
        batch = self.batches[job.batch]
        batch.endings.setdefault((job.queue, job.id), ending)

    def _fail_dependents(self, job: ModelJob, *, lost: bool) -> None:
        for other in self.in_queue(job.queue):
            if job.id in other.needs and other.state == BLOCKED:
                other.dep_lost = other.dep_lost or lost
                self._end(other, FAILED, DEPENDENCY_FAILED)
                self._fail_dependents(other, lost=False)
