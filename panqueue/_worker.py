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

import os
import socket
import time
import traceback
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
from panqueue._store import redis_store as ops
from panqueue._store.redis_store import (
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
from panqueue.executors.base import Executor, JobTimeout
from panqueue.executors.subprocess import ChildCrashed, RemoteError

__all__ = ["Worker"]

_MAX_CLAIM_BATCH = 100
_MAX_LOG_LINES = 1000
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


@dataclass(slots=True)
class _Running:
    """A job this worker is running, and how to stop it."""

    token: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    lost: bool = False  # lock lost: another worker may own the job now; do not finish it
    forced: bool = False  # forced shutdown: release the job back to waiting
    cancel_requested: bool = False  # cancel(queue, id) was called for this job
    stopping: bool = False  # the worker is shutting down

    def should_stop(self) -> bool:
        return self.stopping or self.cancel_requested or self.lost


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
        self._running: dict[str, _Running] = {}
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
                running=lambda: [(job_id, r.token) for job_id, r in list(self._running.items())],
                log=self._log)
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
            with anyio.CancelScope(shield=True):
                if self._executor is not None:
                    await self._executor.aclose()
                if self._shared_transport is None:
                    await transport.aclose()
            self._stopping = True
            done.set()
            self._log.info("worker stopped", processed=self.processed, failed=self.failed)

    async def shutdown(self, grace: float | None = None) -> None:
        """Two-phase stop: claim nothing more and let running jobs finish for up to ``grace``
        seconds; then cancel the rest and release them to waiting. Returns once stopped."""
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
        return f"{self.name}:{self._token_counter}"

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
            token = self._new_token()
            try:
                with anyio.CancelScope(shield=True):
                    reply = await transport.script(SCRIPTS.claim, keys,
                                                   (token, self._lock_ttl_ms, free))
            except ConnectionError as exc:
                self._release_slots(free)
                self._log.warning("claim failed; retrying", error=str(exc))
                with anyio.move_on_after(min(self.poll_interval, 1.0)):
                    await wake.wait()
                continue
            jobs, wake_in = parse_claim(reply)
            self._release_slots(free - len(jobs))
            for claimed in jobs:
                self._busy_slots += 1
                self._idle = anyio.Event() if self._busy_slots == 1 else self._idle
                self._tg.start_soon(self._run_slot, claimed, token)
            if not jobs:
                timeout = self.poll_interval
                if wake_in >= 0:
                    timeout = min(timeout, wake_in / 1000)
                with anyio.move_on_after(timeout):
                    await wake.wait()

    def _release_slots(self, n: int) -> None:
        for _ in range(n):
            self._slots.release()

    async def _run_slot(self, claimed: ClaimedJob, token: str) -> None:
        try:
            next_job: tuple[ClaimedJob, str] | None = (claimed, token)
            while next_job is not None:
                next_job = await self._process(*next_job)
        finally:
            self._busy_slots -= 1
            if self._busy_slots == 0:
                self._idle.set()
            self._slots.release()

    # ------------------------------------------------------------------ running one job

    async def _process(self, claimed: ClaimedJob, token: str) -> tuple[ClaimedJob, str] | None:
        """Run one job and record the outcome; returns the next job claimed for this slot."""
        handler_options = self.handler.options.job
        job_options = handler_options.merged(decode(claimed.options) if claimed.options else None)
        running = _Running(token, stopping=self._stopping)
        self._running[claimed.id] = running
        started = time.monotonic()
        outcome: Any = None
        error: BaseException | None = None
        try:
            job_id = claimed.id

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
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._release([(claimed.id, token)])
            raise
        finally:
            del self._running[claimed.id]
        duration = time.monotonic() - started
        log = self._log.bind(job_id=claimed.id, attempt=claimed.attempt,
                             duration_ms=round(duration * 1000, 3))

        if running.lost:
            log.warning("lock lost; job left to its new owner", error=str(LockLost(
                self.keys.name, claimed.id)))
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

    async def _fail(self, claimed: ClaimedJob, token: str, attempts: int, backoff: Any,
                    error: BaseException, duration: float, fetch: int, next_token: str,
                    log: Any) -> list[Any] | None:
        final = 0
        reason = ""
        delay = 0.0
        if isinstance(error, JobTimeout):
            reason = "timeout"
        if isinstance(error, _Cancelled):
            final, reason = 1, "cancelled"
        elif isinstance(error, Fail):
            final, reason = 1, "explicit_fail"
        elif isinstance(error, Retry) and error.delay is not None:
            delay = error.delay
        elif claimed.attempt < attempts:
            delay = backoff.delay_for(claimed.attempt)
        if isinstance(error, RemoteError):  # raised in a subprocess handler's child
            info = ErrorInfo(error.type_name, str(error), error.traceback)
        else:
            info = ErrorInfo(
                type=type(error).__name__,
                message=str(error),
                traceback=None if isinstance(error, (Fail, Retry, JobTimeout, ChildCrashed))
                else "".join(traceback.format_exception(error)),
            )
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
        args: list[Any] = [self._keep_completed, next_token, self._lock_ttl_ms, len(batch)]
        for item in batch:
            args += [item.job_id, item.token, item.result, item.fetch]
        reply = await self._record(SCRIPTS.complete, tuple(args), batch[0].job_id)
        if reply is not None:
            jobs, _ = parse_claim(reply, len(batch))
            claimed = iter(jobs)
            for item, status in zip(batch, reply, strict=False):
                item.status = int(status)
                if item.status == 1 and item.fetch:
                    following = next(claimed, None)
                    item.next_job = None if following is None else (following, next_token)
        for item in batch:
            item.done.set()

    async def _record(self, script: Script, args: tuple[Any, ...], job_id: str
                      ) -> list[Any] | None:
        """Record a job's outcome, riding out a Redis outage for up to half the lock TTL.

        If Redis stays away longer, the outcome is dropped: the lock then expires and the
        stalled sweep runs the job again (at-least-once), which is the documented guarantee.
        """
        assert self._transport is not None
        delay = 0.05
        deadline = time.monotonic() + self.lock_ttl / 2
        while True:
            try:
                reply: list[Any] = await self._transport.script(script, (self.keys.prefix,), args)
                return reply
            except ConnectionError as exc:
                if time.monotonic() + delay > deadline:
                    self._log.error("could not record a job's outcome; it will run again",
                                    job_id=job_id, error=str(exc))
                    return None
                await anyio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _report(self, job_id: str, kind: str, value: Any) -> None:
        """Progress and log lines from a running job (only while this worker holds the lock)."""
        running = self._running.get(job_id)
        if running is None or self._transport is None:
            return
        if kind == "p":
            check_json_compatible(value, "progress")
            payload: Any = encode(value)
        else:
            payload = value
        await self._transport.script(SCRIPTS.progress, (self.keys.prefix,),
                                     (job_id, running.token, kind, payload, _MAX_LOG_LINES))

    async def _release(self, pairs: list[tuple[str, str]]) -> None:
        if not pairs or self._transport is None:
            return
        flat = [item for pair in pairs for item in pair]
        try:
            await self._transport.script(SCRIPTS.release, (self.keys.prefix,), flat)
        except ConnectionError as exc:
            self._log.warning("could not release jobs; the stalled sweep will requeue them",
                              error=str(exc))

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
            self._log.warning("grace period over; cancelling running jobs",
                              running=len(self._running))
            for running in self._running.values():
                running.forced = True
                running.scope.cancel()
            with anyio.move_on_after(10):
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
                    self._log.warning("wake-up channel unavailable; polling", error=str(exc))
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
        running = self._running.get(job_id)
        if running is not None:
            running.cancel_requested = True
            running.scope.cancel()

    async def _heartbeat(self, watchdog: LoopWatchdog) -> None:
        while True:
            watchdog.beat()
            await anyio.sleep(BEAT_INTERVAL)

    async def _renew_loop(self) -> None:
        transport = self._transport
        assert transport is not None
        interval = self.lock_ttl / 3
        while True:
            await anyio.sleep(interval)
            if not self._running:
                continue
            snapshot = [(job_id, r.token) for job_id, r in self._running.items()]
            flat = [item for pair in snapshot for item in pair]
            try:
                lost = await transport.script(SCRIPTS.extend, (self.keys.prefix,),
                                              (self._lock_ttl_ms, *flat))
            except ConnectionError as exc:
                self._log.warning("lock renewal failed", error=str(exc))
                continue
            tokens = dict(snapshot)
            for raw in lost:
                job_id = raw.decode()
                running = self._running.get(job_id)
                if running is not None and running.token == tokens.get(job_id):
                    running.lost = True
                    running.scope.cancel()

    async def _maintenance_loop(self) -> None:
        transport = self._transport
        assert transport is not None
        max_stalls = self.handler.options.max_stalls
        retention = self.handler.options.retention
        while True:
            await anyio.sleep(self.stalled_interval)
            try:
                requeued, failed = await transport.script(
                    SCRIPTS.stalled, (self.keys.prefix,),
                    (max_stalls, 1000, self._keep_failed, _STALL_ERROR))
                if requeued or failed:
                    self._log.warning("stalled jobs recovered", requeued=requeued, failed=failed)
                await transport.script(SCRIPTS.promote, (self.keys.prefix,), ())
                await transport.run(ops.clean(self.keys, Retention.age_ms(retention.completed_for),
                                              Retention.age_ms(retention.failed_for)))
            except ConnectionError as exc:
                self._log.warning("maintenance failed", error=str(exc))

    async def _schedule_loop(self) -> None:
        """Register this queue's schedules, then enqueue each tick when it is due. Every worker
        of the queue does this; the tick script lets exactly one of them enqueue each tick."""
        transport = self._transport
        assert transport is not None
        while True:
            try:
                now = await transport.run(ops.server_time_ms())
                for definition in self.schedules.values():
                    if await transport.run(ops.schedule_set(
                            self.keys, definition.name, definition.definition(),
                            definition.next_after(now))):
                        self._log.info("schedule registered", schedule=definition.name)
                break
            except ConnectionError as exc:
                self._log.warning("could not register schedules; retrying", error=str(exc))
                await anyio.sleep(1.0)
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
            except ConnectionError as exc:
                self._log.warning("schedule check failed", error=str(exc))
            await anyio.sleep(max(0.005, sleep_for))

