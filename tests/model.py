"""The reference model of tests/test_model.py: what a user of panqueue can observe, in plain
Python, with no Redis and no clock.

It knows every job the test added (by queue and id), the state each must be in, which
dependencies each still needs, the dedup keys and what they point to, and each batch's members
and their first endings. Transitions are methods named after what happened (a job was added,
cancelled, removed, retried, started, ended); each returns what the real system must answer.
The model knows nothing of partitions: everything it predicts must hold whatever partition a
job lives in.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

WAITING, DELAYED, BLOCKED, ACTIVE = "waiting", "delayed", "blocked", "active"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
STATES = (WAITING, DELAYED, BLOCKED, ACTIVE, COMPLETED, FAILED, CANCELLED)
FINAL = frozenset({COMPLETED, FAILED, CANCELLED})
NOT_STARTED = frozenset({WAITING, DELAYED, BLOCKED})

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
    deps: tuple[str, ...] = ()
    needs: set[str] = field(default_factory=set)  # dependencies not completed yet
    dep_lost: bool = False  # a dependency was cancelled or deleted before completing
    tried: int = 0  # attempts started in this round
    seq: int = 0  # its turn among the waiting jobs of its priority (ties: released together)
    batch: str | None = None


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
        add creates a job. A dedup ``replace`` of a job that has not started deletes it here."""
        if job_id is not None and (queue, job_id) in self.jobs:
            return Added(job_id, False)
        if dedup is not None:
            key, strategy = dedup
            holder = self.dedup.get((queue, key))
            existing = None if holder is None else self.job(queue, holder)
            if existing is not None:
                if strategy != "replace":
                    return Added(existing.id, False)
                if existing.state in NOT_STARTED:
                    self.delete(existing, lost=True)
        return None

    def create(self, queue: str, job_id: str, data: dict[str, object], *, priority: int = 0,
               attempts: int = 1, fail_first: int = 0, delayed: bool = False,
               deps: tuple[str, ...] = (), dedup: str | None = None,
               batch: str | None = None) -> ModelJob:
        job = ModelJob(queue, job_id, WAITING, data, priority, attempts, fail_first, delayed,
                       deps, batch=batch)
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
            self._end(job, FAILED)
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
            if job.needs:
                job.state = BLOCKED
            else:
                job.state = WAITING  # a retried job runs now, whatever delay it was added with
                job.seq = seq
        return len(moving)

    # ------------------------------------------------------------------ a worker's run

    def start(self, job: ModelJob) -> None:
        job.state = ACTIVE
        job.tried += 1

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
            self._end(job, FAILED)
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

    def _end(self, job: ModelJob, state: str) -> None:
        job.state = state
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
                self._end(other, FAILED)
                self._fail_dependents(other, lost=False)
