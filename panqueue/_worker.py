"""The Worker: one queue, one claim loop, a semaphore of ``concurrency`` slots.

The claim loop takes a slot (plus any other free ones), claims that many jobs in one script
call, and hands each to a slot task. A slot task runs its job, then finishes it with a script
that also claims the next job for the same slot; jobs that finish in the same event-loop tick
share that call, so a busy worker makes far fewer round trips than it runs jobs.
When nothing is claimable the slot goes back and the loop sleeps until the queue's notify
channel says there is work, the next delayed job is due, or the poll interval passes. No claimed
job ever waits locally. Locks of running jobs are renewed in one call per interval; the stalled
sweep and delayed promotion run on a timer.
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from panqueue._codec import check_json_compatible, decode, encode
from panqueue._job import ErrorInfo, Fail, Job, Retry
from panqueue._keys import QueueKeys
from panqueue._log import get_logger
from panqueue._options import Retention
from panqueue._registry import Registry
from panqueue._store import ops
from panqueue._store.ops import (
    ClaimedJob,
    NewJob,
    encode_error,
    parse_claim,
)
from panqueue._store.scripts import SCRIPTS, Script
from panqueue._store.transport import (
    AsyncSubscriber,
    AsyncTransport,
    open_async_transport,
)
from panqueue._url import resolve_url
from panqueue._watchdog import BEAT_INTERVAL, LoopWatchdog
from panqueue.errors import ConnectionError, LockLost, PanqueueError, PayloadError
from panqueue.executors import create_executor
from panqueue.executors.base import Executor, HandlerAborted, JobTimeout
from panqueue.executors.subprocess import ChildCrashed, RemoteError

__all__ = ["Worker"]

_MAX_CLAIM_BATCH = 100
_MAX_LOG_LINES = 1000
# The longest a retry delay may be (a year); a longer, negative or non-finite one is refused.
_MAX_RETRY_DELAY = 365 * 24 * 3600.0
# Bounds of the shutdown's forced phase: how long cancelled jobs get to stop and be released,
# and how long each closing step may take, so that shutdown(grace) returns within
# grace + _FORCE_WAIT + 2 * _CLOSE_WAIT seconds even when the network drops every packet.
_FORCE_WAIT = 5.0
_CLOSE_WAIT = 2.0
# One Redis call on a shielded path (a claim, a release) is abandoned after this long.
_CALL_BOUND = 10.0
_STALL_ERROR = encode_error(
    ErrorInfo("Stalled", "the job's lock expired too many times (its worker died or hung)")
)


@dataclass(slots=True)
class _Completion:
    """A successful job waiting to be recorded in a batch (see ``Worker._complete``)."""

    job_id: str
    token: str
    result: bytes
    fetch: int
    done: anyio.Event = field(default_factory=anyio.Event)
    status: int | None = None  # 1 recorded, -1 lock lost, None not recorded (Redis away)
    next_job: tuple[ClaimedJob, str] | None = None


class _Cancelled(Fail):
    """The handler was stopped because ``cancel(queue, id)`` was called for its job."""

    def __init__(self) -> None:
        super().__init__("cancelled")


@dataclass(slots=True, eq=False)
class _Running:
    """One attempt this worker is running, known by its lock token, and how to stop it.

    Attempts are keyed by token, not job id: when a lock expires unseen (a long network cut,
    a Redis restart, a clock step) the job can be claimed again, even by this same worker,
    while the first attempt still runs. The first attempt is then lost: told to stop,
    cancelled where the executor can, and its outcome discarded.
    """

    job_id: str
    token: str
    deadline: float  # local (monotonic) time by which the lock is surely expired unless renewed
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    ended: anyio.Event = field(default_factory=anyio.Event)  # the executor has returned
    lost: bool = False  # lock lost: another attempt may own the job now; do not finish it
    forced: bool = False  # forced shutdown: release the job back to waiting
    cancel_requested: bool = False  # cancel(queue, id) was called for this job
    stopping: bool = False  # the worker is shutting down

    def should_stop(self) -> bool:
        return self.stopping or self.cancel_requested or self.lost

    def lose(self) -> None:
        self.lost = True
        self.scope.cancel()


class _Trouble:
    """Redis failures of one activity (claiming, renewal, upkeep...), logged once per episode:
    the first failure as a warning, the recovery with how many calls failed in between."""

    __slots__ = ("_log", "_what", "count", "since")

    def __init__(self, log: Any, what: str) -> None:
        self._log = log
        self._what = what
        self.count = 0
        self.since = 0.0

    def failed(self, exc: BaseException) -> None:
        self.count += 1
        if self.count == 1:
            self.since = time.monotonic()
            self._log.warning(f"{self._what} failed; retrying until Redis answers",
                              error=str(exc))

    def ok(self) -> None:
        if self.count:
            self._log.info(f"{self._what} works again", failed_calls=self.count,
                           outage_s=round(time.monotonic() - self.since, 3))
            self.count = 0

    def backoff(self) -> float:
        """Seconds to wait before the next try: doubling from 50 ms up to 2 s."""
        return float(min(0.05 * 2 ** min(self.count, 6), 2.0))


def _retry_delay(error: Retry) -> float | str:
    """The delay a Retry asked for, or why it is unusable."""
    delay = error.delay
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        return f"Retry(delay=...) must be a number of seconds, got {delay!r}"
    if not math.isfinite(delay) or delay < 0 or delay > _MAX_RETRY_DELAY:
        return (f"Retry(delay=...) must be finite, >= 0 and at most {_MAX_RETRY_DELAY:g} s, "
                f"got {delay!r}")
    return float(delay)


class Worker:
    """Runs the jobs of one queue until :meth:`shutdown`.

    ``concurrency`` is used when the handler declares none. ``poll_interval`` bounds how long
    an idle worker sleeps if a wake-up message is lost. ``grace`` is the default time running
    jobs get to finish on shutdown before they are cancelled and released.
    """

    def __init__(
        self,
        registry: Registry,
        queue: str,
        *,
        url: str | None = None,
        concurrency: int | None = None,
        poll_interval: float = 2.0,
        grace: float = 30.0,
        stalled_interval: float | None = None,
        health_interval: float = 5.0,
        name: str | None = None,
        transport: AsyncTransport | None = None,
    ) -> None:
        self.handler = registry.get(queue)
        self.schedules = {s.name: s for s in registry.schedules_for(queue)}
        self.keys = QueueKeys(queue)
        self.url = resolve_url(url)
        options = self.handler.options
        self.concurrency = options.concurrency or concurrency or 1
        self.poll_interval = poll_interval
        self.grace = grace
        self.lock_ttl = options.lock_ttl
        self.stalled_interval = stalled_interval or min(max(self.lock_ttl / 2, 0.25), 15.0)
        self.health_interval = health_interval
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._shared_transport = transport
        self._transport: AsyncTransport | None = None
        self._executor: Executor | None = None
        self._watchdog: LoopWatchdog | None = None
        self._log = get_logger("panqueue.worker").bind(queue=queue, worker=self.name)
        self._running: dict[str, _Running] = {}  # by lock token
        self._by_job: dict[str, _Running] = {}  # the newest attempt of each job id
        self._busy_slots = 0
        self._stopping = False
        self._completions: list[_Completion] = []
        self._completion_leader = False
        # anyio primitives need a running event loop: they are made in run().
        self._slots: anyio.Semaphore
        self._idle: anyio.Event
        self._wake: anyio.Event
        self._force: anyio.Event
        self._claim_scope: anyio.CancelScope
        self._done: anyio.Event | None = None
        self._token_counter = 0
        # Tokens are unique per process and call, whatever name= the worker was given.
        self._token_prefix = f"{self.name}:{uuid.uuid4().hex[:12]}"
        self._claim_trouble = _Trouble(self._log, "claiming jobs")
        self._record_trouble = _Trouble(self._log, "recording outcomes")
        self._renew_trouble = _Trouble(self._log, "lock renewal")
        self._report_trouble = _Trouble(self._log, "progress reporting")
        self._upkeep_trouble = _Trouble(self._log, "upkeep (stalled sweep, promotion, cleaning)")
        self._schedule_trouble = _Trouble(self._log, "schedules")
        self._lock_ttl_ms = max(1, int(self.lock_ttl * 1000))
        self._keep_completed = options.retention.completed
        self._keep_failed = options.retention.failed
        self.processed = 0
        self.failed = 0

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run until :meth:`shutdown` (or cancellation). Raises ConnectionError if Redis is
        unreachable at start. With ``task_group.start(worker.run)`` it returns once the worker
        listens for work."""
        self._slots = anyio.Semaphore(self.concurrency)
        self._idle = anyio.Event()
        self._idle.set()
        self._wake = anyio.Event()
        self._force = anyio.Event()
        self._claim_scope = anyio.CancelScope()
        self._started = started = anyio.Event()
        self._done = done = anyio.Event()
        if self._stopping:  # shutdown() was called before run()
            self._claim_scope.cancel()
        transport = self._shared_transport or open_async_transport(self.url)
        self._transport = transport
        try:
            options = self.handler.options
            rate = options.rate_limit
            await transport.run(ops.setup_queue(
                self.keys, options.mode, options.key_concurrency,
                0 if rate is None else rate.max, 0 if rate is None else int(rate.per * 1000),
                rate is not None and rate.per_key, options.retention.failed))
            self._executor = create_executor(self.handler)
            await self._executor.start()
            # Subscribed before the first claim (no lost wake-up), and outside the task group so
            # that a refusal at start is raised as itself.
            subscriber = await transport.subscribe(self.keys.notify)
            watchdog = LoopWatchdog(
                url=self.url, prefix=self.keys.prefix, handler_name=self.handler.import_path,
                executor_name=self._executor.name, lock_ttl=self.lock_ttl,
                running=lambda: [(r.job_id, r.token) for r in list(self._running.values())],
                renewed=self._renewed, log=self._log)
            watchdog.start()
            self._watchdog = watchdog
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._heartbeat, watchdog)
                tg.start_soon(self._listen, subscriber)
                tg.start_soon(self._renew_loop)
                tg.start_soon(self._maintenance_loop)
                if self.schedules:
                    tg.start_soon(self._schedule_loop)
                self._log.info("worker started", concurrency=self.concurrency,
                               executor=self._executor.name)
                started.set()
                task_status.started()
                with self._claim_scope:
                    await self._claim_loop()
                await self._drain()
                tg.cancel_scope.cancel()
        finally:
            if self._watchdog is not None:
                self._watchdog.stop()
            # Bounded: a network that drops every packet must not hold the shutdown.
            with anyio.CancelScope(shield=True):
                if self._executor is not None:
                    with anyio.move_on_after(_CLOSE_WAIT):
                        await self._executor.aclose()
                if self._shared_transport is None:
                    with anyio.move_on_after(_CLOSE_WAIT):
                        await transport.aclose()
            self._stopping = True
            done.set()
            self._log.info("worker stopped", processed=self.processed, failed=self.failed)

    async def shutdown(self, grace: float | None = None) -> None:
        """Two-phase stop: claim nothing more and let running jobs finish for up to ``grace``
        seconds; then cancel the rest and release them to waiting. Returns once stopped, within
        ``grace`` + 9 s even when Redis stops answering (every step of the forced phase is
        bounded)."""
        if grace is not None:
            self.grace = grace
        self._begin_stop()
        if self._done is None:
            return  # never ran
        await self._done.wait()

    def force(self) -> None:
        """Skip the rest of the grace period (a second signal)."""
        self._begin_stop()
        if self._done is not None:
            self._force.set()

    def _begin_stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._log.info("worker stopping", running=len(self._running), grace=self.grace)
            for running in self._running.values():
                running.stopping = True
            if self._executor is not None:
                self._executor.request_stop()
        # Interrupts the claim loop wherever it waits (for a slot or for work); the claim call
        # itself is shielded, so jobs already claimed in Redis are never dropped.
        if self._done is not None:
            self._claim_scope.cancel()


    # ------------------------------------------------------------------ claiming

    def _new_token(self) -> str:
        self._token_counter += 1
        return f"{self._token_prefix}:{self._token_counter}"

    async def _claim_loop(self) -> None:
        transport = self._transport
        assert transport is not None
        keys = (self.keys.prefix,)
        while not self._stopping:
            await self._slots.acquire()
            free = 1
            while free < _MAX_CLAIM_BATCH:
                try:
                    self._slots.acquire_nowait()
                except anyio.WouldBlock:
                    break
                free += 1
            if self._stopping:
                self._release_slots(free)
                break
            # A fresh event before the claim: a wake-up published after the claim ran is
            # delivered to this event, so no wake-up is lost between claim and wait.
            wake = self._wake = anyio.Event()
            claimed = await self._claim(keys, free)
            if claimed is None:
                self._release_slots(free)
                with anyio.move_on_after(self._claim_trouble.backoff()):
                    await wake.wait()
                continue
            reply, token = claimed
            jobs, wake_in = parse_claim(reply)
            self._release_slots(free - len(jobs))
            for job in jobs:
                self._start_slot(job, token)
            if not jobs:
                timeout = self.poll_interval
                if wake_in >= 0:
                    timeout = min(timeout, wake_in / 1000)
                with anyio.move_on_after(timeout):
                    await wake.wait()

    async def _claim(self, keys: tuple[str], free: int) -> tuple[list[Any], str] | None:
        """One claim of up to ``free`` jobs: (reply, token), or None if Redis could not be
        asked.

        The call is shielded (jobs claimed in Redis are never dropped by a cancellation) and
        bounded. After a failure it is sent again with the same token, which is also its
        request id: if the first call ran and only its reply was lost, the resend answers the
        jobs it claimed (see _memo.lua), so none waits for the stalled sweep. It is given up
        once the claimed jobs' locks could have expired, or when the worker stops.
        """
        transport = self._transport
        assert transport is not None
        token = self._new_token()
        give_up = time.monotonic() + self.lock_ttl * 0.8
        while True:
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + _CALL_BOUND
                try:
                    reply: list[Any] = await transport.script(
                        SCRIPTS.claim, keys, (token, self._lock_ttl_ms, free))
                except PanqueueError as exc:
                    self._claim_trouble.failed(exc)
                else:
                    self._claim_trouble.ok()
                    return reply, token
            if scope.cancelled_caught:
                self._claim_trouble.failed(TimeoutError(f"no reply in {_CALL_BOUND:g} s"))
            if self._stopping or time.monotonic() >= give_up:
                return None
            await anyio.sleep(self._claim_trouble.backoff())

    def _start_slot(self, claimed: ClaimedJob, token: str) -> None:
        self._busy_slots += 1
        self._idle = anyio.Event() if self._busy_slots == 1 else self._idle
        self._tg.start_soon(self._run_slot, claimed, token)

    def _release_slots(self, n: int) -> None:
        for _ in range(n):
            self._slots.release()

    async def _run_slot(self, claimed: ClaimedJob, token: str) -> None:
        try:
            next_job: tuple[ClaimedJob, str] | None = (claimed, token)
            while next_job is not None:
                job, token = next_job
                if self._stopping and self._force.is_set():
                    await self._release([(job.id, token)])
                    break
                previous = self._by_job.get(job.id)
                if previous is not None:
                    # Claimed again while an earlier attempt still runs here: that attempt's
                    # lock expired unseen. Stop it, and start this one only once it has ended,
                    # so that this worker never runs two attempts of a job at once.
                    self._lose(previous, "the job was claimed again")
                    await previous.ended.wait()
                next_job = await self._process(job, token)
        finally:
            self._busy_slots -= 1
            if self._busy_slots == 0:
                self._idle.set()
            self._slots.release()

    # ------------------------------------------------------------------ running one job

    async def _process(self, claimed: ClaimedJob, token: str) -> tuple[ClaimedJob, str] | None:
        """Run one job and record the outcome; returns the next job claimed for this slot."""
        job_options = self.handler.options.job
        job_id = claimed.id
        started = time.monotonic()
        running = _Running(job_id, token, started + self.lock_ttl, stopping=self._stopping)
        self._running[token] = running
        self._by_job[job_id] = running
        outcome: Any = None
        error: BaseException | None = None
        try:
            if claimed.options:
                job_options = job_options.merged(decode(claimed.options))

            def sink(kind: str, value: Any) -> Awaitable[None]:
                return self._report(job_id, kind, value)

            job = Job(id=job_id, queue=self.keys.name, data=decode(claimed.data),
                      attempt=claimed.attempt, options=job_options,
                      enqueued_at_ms=claimed.enqueued_at_ms, sink=sink,
                      should_stop=running.should_stop)
            with running.scope:
                outcome = await self._executor.run(job, job_options.timeout)  # type: ignore[union-attr]
        except Exception as exc:
            error = exc
        except anyio.get_cancelled_exc_class():
            # The whole worker is being cancelled from outside: give the job back at once.
            self._forget(running)
            with anyio.CancelScope(shield=True):
                await self._release([(job_id, token)])
            raise
        except SystemExit as exc:  # sys.exit() in an inline handler ends the attempt only
            error = HandlerAborted(exc)
        finally:
            self._forget(running)
        duration = time.monotonic() - started
        log = self._log.bind(job_id=claimed.id, attempt=claimed.attempt,
                             duration_ms=round(duration * 1000, 3))

        if running.lost:
            log.warning("attempt stopped: its lock was lost; outcome discarded", error=str(
                LockLost(self.keys.name, claimed.id)))
            return None
        if running.forced and not running.cancel_requested:
            await self._release([(claimed.id, token)])
            log.warning("job released at forced shutdown")
            return None
        if running.cancel_requested and running.scope.cancelled_caught:
            error = _Cancelled()

        fetch = 0 if self._stopping else 1
        next_token = self._new_token()
        if error is None:
            try:
                check_json_compatible(outcome, "result")
                result_blob = encode(outcome)
            except PayloadError as exc:
                error = exc
        if error is None:
            completion = _Completion(claimed.id, token, result_blob, fetch)
            await self._complete(completion)
            if completion.status is None:
                return None
            if completion.status == -1:
                log.warning("lock lost before completion; result discarded",
                            error=str(LockLost(self.keys.name, claimed.id)))
                return None
            self.processed += 1
            log.debug("job completed")
            return completion.next_job
        else:
            reply = await self._fail(claimed, token, job_options.attempts, job_options.backoff,
                                     error, duration, fetch, next_token, log)
            if reply is None:
                return None
        jobs, _ = parse_claim(reply, 1)
        return (jobs[0], next_token) if jobs else None

    def _forget(self, running: _Running) -> None:
        """The attempt's executor has returned: it no longer runs here."""
        self._running.pop(running.token, None)
        if self._by_job.get(running.job_id) is running:
            del self._by_job[running.job_id]
        running.ended.set()

    def _lose(self, running: _Running, why: str) -> None:
        if not running.lost:
            self._log.warning("lock lost; stopping the attempt", job_id=running.job_id,
                              why=why)
            running.lose()

    async def _fail(self, claimed: ClaimedJob, token: str, attempts: int, backoff: Any,
                    error: BaseException, duration: float, fetch: int, next_token: str,
                    log: Any) -> list[Any] | None:
        final = 0
        reason = ""
        delay = 0.0
        asked: float | None = None  # the delay a Retry asked for
        note = ""
        if isinstance(error, JobTimeout):
            reason = "timeout"
        if isinstance(error, _Cancelled):
            final, reason = 1, "cancelled"
        elif isinstance(error, Fail):
            final, reason = 1, "explicit_fail"
        elif isinstance(error, Retry) and error.delay is not None:
            wanted = _retry_delay(error)
            if isinstance(wanted, str):  # unusable: recorded, and the backoff applies instead
                note = wanted
            else:
                asked = wanted
        if asked is not None:
            delay = asked
        elif not final and claimed.attempt < attempts:
            delay = backoff.delay_for(claimed.attempt)
        if isinstance(error, RemoteError):  # raised in a subprocess handler's child
            info = ErrorInfo(error.type_name, str(error), error.traceback)
        elif isinstance(error, HandlerAborted):  # a BaseException: SystemExit and the like
            info = ErrorInfo.from_exception(error.original)
        else:
            info = ErrorInfo.from_exception(error, with_traceback=not isinstance(
                error, (Fail, Retry, JobTimeout, ChildCrashed)))
        if note:
            info = ErrorInfo("InvalidRetry", note, info.traceback)
        entry = encode({"attempt": claimed.attempt, "type": info.type, "message": info.message,
                        "duration_ms": round(duration * 1000)})
        reply = await self._record(SCRIPTS.fail, (
            claimed.id, token, encode_error(info), entry, attempts, int(delay * 1000), final,
            reason, self._keep_failed, fetch, next_token, self._lock_ttl_ms), claimed.id)
        if reply is None:
            return None
        status = reply[0]
        if status == -1:
            log.warning("lock lost before failure was recorded",
                        error=str(LockLost(self.keys.name, claimed.id)))
            return None
        if status in (1, 2):
            log.warning("job attempt failed; will retry", error=info.message,
                        error_type=info.type, retry_in_s=round(delay, 3))
        elif status == 4:
            log.info("job cancelled")
        else:
            self.failed += 1
            log.error("job failed", error=info.message, error_type=info.type,
                      reason=reason or "max_attempts_exceeded")
        return reply

    async def _complete(self, completion: _Completion) -> None:
        """Record a successful job, batched with the others that finish in the same moment.

        The first job to finish becomes the batch's leader: it yields once, so that jobs
        finishing in the same event-loop tick can join, then sends them all in one script call
        (which also claims a next job for each freed slot). Jobs finishing meanwhile form the
        next batch. A busy worker so makes far fewer round trips than jobs.
        """
        self._completions.append(completion)
        if self._completion_leader:
            await completion.done.wait()
            return
        self._completion_leader = True
        try:
            await anyio.lowlevel.checkpoint()
        finally:
            batch, self._completions = self._completions, []
            self._completion_leader = False
        next_token = self._new_token()
        # Whether to claim successors is decided now, when the call is sent: a shutdown that
        # began while the batch was gathering claims nothing.
        claiming = not self._stopping
        args: list[Any] = [self._keep_completed, next_token, self._lock_ttl_ms, len(batch)]
        for item in batch:
            args += [item.job_id, item.token, item.result, item.fetch if claiming else 0]
        reply = await self._record(SCRIPTS.complete, tuple(args), batch[0].job_id)
        if reply is not None:
            jobs, _ = parse_claim(reply, len(batch))
            claimed = iter(jobs)
            for item, status in zip(batch, reply, strict=False):
                item.status = int(status)
                if item.status == 1 and item.fetch and claiming:
                    following = next(claimed, None)
                    item.next_job = None if following is None else (following, next_token)
        for item in batch:
            item.done.set()

    async def _record(self, script: Script, args: tuple[Any, ...], job_id: str
                      ) -> list[Any] | None:
        """Record a job's outcome, riding out a Redis outage for up to half the lock TTL.

        The same call is sent again after a failure: its fresh token is its request id, so a
        call that ran but whose reply was lost is answered from the script's memory instead of
        running twice (see _memo.lua). If Redis stays away longer, the outcome is dropped: the
        lock then expires and the stalled sweep runs the job again (at-least-once), which is
        the documented guarantee.
        """
        assert self._transport is not None
        trouble = self._record_trouble
        deadline = time.monotonic() + self.lock_ttl / 2
        while True:
            try:
                reply: list[Any] = await self._transport.script(script, (self.keys.prefix,), args)
            except PanqueueError as exc:
                trouble.failed(exc)
                if time.monotonic() + trouble.backoff() > deadline:
                    self._log.error("could not record a job's outcome; it will run again",
                                    job_id=job_id, error=str(exc))
                    return None
                await anyio.sleep(trouble.backoff())
            else:
                trouble.ok()
                return reply

    async def _report(self, job_id: str, kind: str, value: Any) -> None:
        """Progress and log lines from a running job (only while this worker holds the lock).

        A report is best effort: when Redis cannot take it (an outage, a full server), it is
        dropped with a warning once per outage, and the job goes on.
        """
        running = self._by_job.get(job_id)
        if running is None or running.lost or self._transport is None:
            return
        if kind == "p":
            check_json_compatible(value, "progress")  # a bad value is the handler's error
            payload: Any = encode(value)
        else:
            payload = value
        try:
            await self._transport.script(SCRIPTS.progress, (self.keys.prefix,),
                                         (job_id, running.token, kind, payload, _MAX_LOG_LINES))
        except PanqueueError as exc:
            self._report_trouble.failed(exc)
        else:
            self._report_trouble.ok()

    async def _release(self, pairs: list[tuple[str, str]]) -> None:
        """Give jobs back to waiting at once (bounded: the sweep covers a release that fails)."""
        if not pairs or self._transport is None:
            return
        flat = [item for pair in pairs for item in pair]
        error = f"no reply within {_CLOSE_WAIT:g} s"
        with anyio.move_on_after(_CLOSE_WAIT):
            try:
                await self._transport.script(SCRIPTS.release, (self.keys.prefix,), flat)
                return
            except PanqueueError as exc:
                error = str(exc)
        self._log.warning("could not release jobs; the stalled sweep will requeue them",
                          job_ids=[job_id for job_id, _ in pairs], error=error)

    # ------------------------------------------------------------------ shutdown

    async def _drain(self) -> None:
        if self._running or self._busy_slots:
            async with anyio.create_task_group() as tg:
                async def wait_force() -> None:
                    await self._force.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(wait_force)
                with anyio.move_on_after(self.grace):
                    await self._idle.wait()
                tg.cancel_scope.cancel()
        if self._busy_slots:
            self._force.set()
            self._log.warning("grace period over; cancelling running jobs",
                              running=len(self._running))
            for running in list(self._running.values()):
                running.forced = True
                running.scope.cancel()
            with anyio.move_on_after(_FORCE_WAIT):
                await self._idle.wait()

    # ------------------------------------------------------------------ background tasks

    async def _listen(self, first: AsyncSubscriber) -> None:
        """Wake-up listener. The subscription exists before the first claim, is pinged when
        quiet and replaced when it breaks or stops answering."""
        transport = self._transport
        assert transport is not None
        subscriber: AsyncSubscriber | None = first
        delay = 0.1
        while True:
            if subscriber is None:
                try:
                    subscriber = await transport.subscribe(self.keys.notify)
                except PanqueueError as exc:
                    if delay == 0.1:
                        self._log.warning("wake-up channel unavailable; polling",
                                          error=str(exc))
                    await anyio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                delay = 0.1
                self._log.info("wake-up channel re-established")
                self._wake.set()  # anything published while we were away: look now
            try:
                await self._listen_until_broken(subscriber)
            except PanqueueError as exc:
                self._log.warning("wake-up channel broken; reconnecting", error=str(exc))
            finally:
                with anyio.move_on_after(_CLOSE_WAIT, shield=True):
                    await subscriber.aclose()
            subscriber = None

    async def _listen_until_broken(self, subscriber: AsyncSubscriber) -> None:
        ping_sent: float | None = None
        while True:
            message = await subscriber.get(timeout=self.health_interval)
            now = time.monotonic()
            if message is None:
                if ping_sent is None:
                    await subscriber.ping()
                    ping_sent = now
                elif now - ping_sent > self.health_interval * 2:
                    raise ConnectionError("no answer to health-check ping")
                continue
            if message == b"":
                ping_sent = None
            elif message == b"w":
                self._wake.set()
            elif message.startswith(b"c:"):
                self._cancel_requested(message[2:].decode())

    def _cancel_requested(self, job_id: str) -> None:
        running = self._by_job.get(job_id)
        if running is not None:
            running.cancel_requested = True
            running.scope.cancel()

    async def _heartbeat(self, watchdog: LoopWatchdog) -> None:
        while True:
            watchdog.beat()
            await anyio.sleep(BEAT_INTERVAL)

    async def _renew_loop(self) -> None:
        interval = self.lock_ttl / 3
        while True:
            await anyio.sleep(interval)
            await self._renew()

    async def _renew(self) -> None:
        """Renew the locks of every running attempt in one call; stop the attempts whose lock
        is lost, and those whose lock surely expired because renewals kept failing (the job
        may already run elsewhere: finishing it here would be a double run)."""
        transport = self._transport
        assert transport is not None
        attempts = list(self._running.values())
        if not attempts:
            return
        sent = time.monotonic()
        flat = [item for r in attempts for item in (r.job_id, r.token)]
        try:
            lost = await transport.script(SCRIPTS.extend, (self.keys.prefix,),
                                          (self._lock_ttl_ms, *flat))
        except PanqueueError as exc:
            self._renew_trouble.failed(exc)
        else:
            self._renew_trouble.ok()
            lost_tokens = {raw.decode() for raw in lost}
            for running in attempts:
                if running.token in lost_tokens:
                    self._lose(running, "the lock had been taken away")
                else:
                    running.deadline = max(running.deadline, sent + self.lock_ttl)
        now = time.monotonic()
        for running in attempts:
            if running.deadline < now:
                self._lose(running, "no renewal reached Redis within the lock TTL")

    def _renewed(self, tokens: list[str], sent: float) -> None:
        """The watchdog renewed these locks (from its thread, while the loop was blocked)."""
        for token in tokens:
            running = self._running.get(token)
            if running is not None:
                running.deadline = max(running.deadline, sent + self.lock_ttl)

    async def _maintenance_loop(self) -> None:
        transport = self._transport
        assert transport is not None
        max_stalls = self.handler.options.max_stalls
        retention = self.handler.options.retention
        trouble = self._upkeep_trouble
        while True:
            await anyio.sleep(self.stalled_interval if not trouble.count
                              else max(self.stalled_interval, trouble.backoff()))
            try:
                requeued, failed = await transport.script(
                    SCRIPTS.stalled, (self.keys.prefix,),
                    (max_stalls, 1000, self._keep_failed, _STALL_ERROR))
                if requeued or failed:
                    self._log.warning("stalled jobs recovered", requeued=requeued, failed=failed)
                await transport.script(SCRIPTS.promote, (self.keys.prefix,), ())
                await transport.run(ops.clean(self.keys, Retention.age_ms(retention.completed_for),
                                              Retention.age_ms(retention.failed_for)))
            except PanqueueError as exc:
                trouble.failed(exc)
            else:
                trouble.ok()

    async def _schedule_loop(self) -> None:
        """Register this queue's schedules, then enqueue each tick when it is due. Every worker
        of the queue does this; the tick script lets exactly one of them enqueue each tick."""
        transport = self._transport
        assert transport is not None
        trouble = self._schedule_trouble
        while True:
            try:
                now = await transport.run(ops.server_time_ms())
                for definition in self.schedules.values():
                    if await transport.run(ops.schedule_set(
                            self.keys, definition.name, definition.definition(),
                            definition.next_after(now))):
                        self._log.info("schedule registered", schedule=definition.name)
                break
            except PanqueueError as exc:
                trouble.failed(exc)
                await anyio.sleep(max(1.0, trouble.backoff()))
        trouble.ok()
        while True:
            sleep_for = 1.0
            try:
                now, entries = await transport.run(ops.schedule_times(self.keys))
                for name, run_ms in entries:
                    schedule = self.schedules.get(name)
                    if schedule is None:
                        continue  # defined by another deployment sharing the queue
                    if run_ms > now:
                        sleep_for = min(sleep_for, (run_ms - now) / 1000)
                        continue
                    job = NewJob(schedule.job_id(run_ms), encode(schedule.data),
                                 schedule.priority, 0, 0,
                                 encode(schedule.options) if schedule.options else b"")
                    # Overdue ticks collapse into this one: the next run is after now.
                    following = schedule.next_after(max(run_ms, now))
                    if await transport.run(ops.schedule_tick(self.keys, name, run_ms,
                                                             following, job)):
                        self._log.info("schedule enqueued a job", schedule=name,
                                       job_id=job.job_id)
                    sleep_for = min(sleep_for, max(0.0, (following - now) / 1000))
            except PanqueueError as exc:
                trouble.failed(exc)
            else:
                trouble.ok()
            await anyio.sleep(max(0.005, sleep_for))
