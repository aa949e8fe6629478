"""The Worker: a small coordinator over the runtime's roles, for one queue.

- :mod:`claimer`: the single claim loop and its ``concurrency`` slots;
- :mod:`attempt`: one job on its executor, its outcome returned as a value;
- :mod:`recorder`: outcomes written to Redis (batched), retried through outages, releases;
- :mod:`locks` and :mod:`watchdog`: attempts by lock token, renewal, the blocked-loop watchdog;
- :mod:`wakeups`: the notify channel (work to do, cancel requests);
- :mod:`upkeep`: stalled sweep, promotion, cleaning, schedules;
- :mod:`heartbeat`: the worker's entry in the queue's worker registry.

The Worker starts them, runs each slot's job (attempt, then record), and stops them in two
phases on shutdown. A chunk handler's slots run in :mod:`chunks` instead; a partitioned queue
has a recorder per partition, and each job is recorded by its partition's.

Past our usual 400 lines: the start sequence and one slot's job are the two halves of the
coordination; one slot's job (``_process`` and the partition dispatch around it) is the part
to move into a module of its own when this grows again.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc

from panqueue._keys import QueueKeys, partition_keys
from panqueue._log import JOBS_LOGGER, get_logger
from panqueue._registry import Registry
from panqueue._runtime.attempt import AttemptRunner, Ending
from panqueue._runtime.chunk_runner import ChunkRunner
from panqueue._runtime.chunks import ChunkClaimer
from panqueue._runtime.claimer import Claimer, ClaimLoop
from panqueue._runtime.heartbeat import BEATS_PER_TTL, Heartbeat
from panqueue._runtime.hooks import MetricsHook
from panqueue._runtime.layout import settle_layout
from panqueue._runtime.locks import Attempt, Attempts, Renewer, Tokens
from panqueue._runtime.recorder import Recorder
from panqueue._runtime.stats import log_summary
from panqueue._runtime.trouble import Trouble
from panqueue._runtime.upkeep import Upkeep
from panqueue._runtime.wakeups import WakeUps
from panqueue._runtime.watchdog import BEAT_INTERVAL, LoopWatchdog
from panqueue._store import ops, transitions
from panqueue._store.notify import Handoff
from panqueue._store.status import Status
from panqueue._store.transitions import ClaimedJob
from panqueue._store.transport import AsyncTransport, open_async_transport
from panqueue._url import resolve_url
from panqueue.errors import ConfigError, ConnectionError, PanqueueError, ServerUnavailable
from panqueue.executors import create_executor
from panqueue.executors.base import Executor

__all__ = ["Worker"]

T = TypeVar("T")


class _StoppedWhileStarting(Exception):
    """Stopped while the start waited for a server that could not serve: a clean stop."""

# Bounds of the shutdown's forced phase: how long cancelled jobs get to stop and be released,
# how long the last writes may take (together, see _close), and closing the connection, so
# that shutdown(grace) returns within grace + _FORCE_WAIT + 2 * _CLOSE_WAIT seconds even when
# the network drops every packet (the drain ends grace seconds after the stop began).
_FORCE_WAIT = 5.0
_CLOSE_WAIT = 2.0
# A recorded failure's status, as the metrics' outcome.
_OUTCOME_NAMES = {Status.LOCK_LOST: "lock_lost", Status.RETRY_NOW: "retried",
                  Status.RETRY_DELAYED: "retried", Status.FAILED: "failed",
                  Status.CANCELLED: "cancelled", Status.COMPLETED: "completed",
                  Status.SNOOZED: "snoozed", Status.RATE_LIMITED: "rate_limited"}


class Worker:
    """Runs the jobs of one queue until :meth:`shutdown`.

    ``concurrency`` is used when the handler declares none. ``poll_interval`` bounds how long
    an idle worker sleeps if a wake-up message is lost. ``grace`` is the default time running
    jobs get to finish on shutdown before they are cancelled and released. ``transport``: a
    connection shared with other workers (a :class:`~panqueue.WorkerPool` passes its own).
    ``heartbeat_interval``: how often the worker writes its entry in the worker registry
    (``client.workers()``); the entry lives for three beats after the last one.
    ``summary_interval``: seconds between the worker's summary lines (jobs processed and failed,
    rate) on the ``panqueue.worker`` logger; ``None`` for none. ``metrics``: an object the
    worker reports attempts, claims and lock renewals to (a
    :class:`panqueue.metrics.WorkerMetrics`); ``None`` for none.
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
        heartbeat_interval: float = 5.0,
        summary_interval: float | None = 60.0,
        metrics: MetricsHook | None = None,
    ) -> None:
        self.handler = registry.get(queue)
        self.schedules = {s.name: s for s in registry.schedules_for(queue)}
        # Every partition of the queue (one for most queues); the first is the queue's home.
        # Named as the queue stores them once run() has read its layout.
        self.parts = partition_keys(queue, self.handler.options.partitions)
        self.keys = self.parts[0]
        self.url = resolve_url(url)
        options = self.handler.options
        self.concurrency = options.concurrency or concurrency or 1
        self.poll_interval = poll_interval
        self.grace = grace
        self.lock_ttl = options.lock_ttl
        self.stalled_interval = stalled_interval or min(max(self.lock_ttl / 2, 0.25), 15.0)
        self.health_interval = health_interval
        if not heartbeat_interval > 0:
            raise ConfigError(
                f"heartbeat_interval must be > 0 seconds, got {heartbeat_interval!r}")
        self.heartbeat_interval = heartbeat_interval
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._shared_transport = transport
        self.summary_interval = summary_interval
        self.metrics = metrics
        self._log = get_logger("panqueue.worker").bind(queue=queue, worker=self.name)
        self._jobs_log = get_logger(JOBS_LOGGER).bind(queue=queue, worker=self.name)
        self._tokens = Tokens(self.name)
        self._attempts = Attempts(self._log, self.lock_ttl, self._tokens)
        if metrics is not None:
            self._attempts.on_lost = lambda: metrics.lock_lost(queue)
        self._executor: Executor | None = None
        self._claimer: ClaimLoop | None = None
        self._upkeep: Upkeep | None = None
        self._stopping = False
        self._reached = False  # the server answered during this start (see _when_served)
        self._done: anyio.Event | None = None
        self._drain_until = math.inf  # when running jobs stop getting time to finish
        self._closed = False  # the last steps (_close) have run
        self.processed = 0
        self.failed = 0

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run until :meth:`shutdown` (or cancellation). Raises ConnectionError if Redis is
        unreachable at start. With ``task_group.start(worker.run)`` it returns once the worker
        listens for work."""
        self._force = anyio.Event()
        self._claim_scope = anyio.CancelScope()
        self._done = done = anyio.Event()
        if self._stopping:  # shutdown() was called before run()
            self._claim_scope.cancel()
            self._drain_until = anyio.current_time() + self.grace
        self._transport = transport = self._shared_transport or open_async_transport(self.url)
        watchdog: LoopWatchdog | None = None
        beats: Heartbeat | None = None
        try:
            options = self.handler.options
            rate = options.rate_limit
            # A partitioned queue's global rate limit is one window outside every partition:
            # the claim loop takes its starts (Claimer), not the partitions' scripts.
            shared_rate = None
            if rate is not None and not rate.per_key and len(self.parts) > 1:
                shared_rate, rate = (rate.max, int(rate.per * 1000)), None
            starting = Trouble(self._log, "starting the worker")

            def setup(keys: QueueKeys) -> Awaitable[None]:
                return transport.run(ops.setup_queue(
                    keys, options.mode, options.key_concurrency,
                    0 if rate is None else rate.max,
                    0 if rate is None else int(rate.per * 1000),
                    rate is not None and rate.per_key, options.retention.failed,
                    options.retention.history, 0 if rate is None else rate.recover_every_ms))

            # The partitions as the queue stores them (their names and layout version), changed
            # to this worker's count first if it differs and no partition holds a job.
            self.parts = await settle_layout(
                transport, self.keys.name, options.partitions, f"{self.name}:{uuid.uuid4().hex}",
                self._when_served, starting, setup,
                leave_wait=self.heartbeat_interval * BEATS_PER_TTL)
            self.keys = self.parts[0]
            if len(self.parts) > 1:
                await self._when_served(starting, lambda: transport.run(
                    ops.pause_like_home(self.parts)))
            self._executor = executor = create_executor(self.handler)
            if self.metrics is not None:
                executor.on_restart = (lambda reason, m=self.metrics, e=executor.name:
                                       m.executor_restarted(self.keys.name, e, reason))
            await executor.start()
            log = self._log
            self._recorders = [Recorder(
                transport, keys, self._tokens, lock_ttl=self.lock_ttl,
                keep_completed=options.retention.completed, keep_failed=options.retention.failed,
                concurrency=self.concurrency,
                # With a shared rate window, recordings claim nothing: every start is taken
                # through it by the claim loop.
                stopping=lambda: self._stopping or shared_rate is not None, log=log,
                max_snoozes=options.max_snoozes) for keys in self.parts]
            self._runner = AttemptRunner(executor, self.keys.name, options.job, self._attempts,
                                         self._report, self._release)
            wakeups = WakeUps(transport, self.parts, health_interval=self.health_interval,
                              on_cancel=self._attempts.request_cancel,
                              on_handoff=self._handed_over, log=log)
            # Subscribed before the first claim (no lost wake-up), and outside the task group so
            # that a refusal at start is raised as itself.
            subscriber = await self._when_served(starting, wakeups.subscribe)
            self._claimer = claimer = self._chunk_loop(transport, wakeups, executor,
                                                       self._recorders[0]) \
                if options.chunk is not None else Claimer(
                transport, self.keys, self._tokens, wakeups, concurrency=self.concurrency,
                lock_ttl=self.lock_ttl, poll_interval=self.poll_interval,
                process=self._process_and_relay,
                log=log, parts=self.parts, shared_rate=shared_rate)
            if self._stopping:
                claimer.stop(by=self._drain_until)
            if self.metrics is not None:
                claimer.on_claim = lambda s, m=self.metrics: m.claim_finished(self.keys.name, s)
            self._upkeep = upkeep = Upkeep(
                transport, self.parts, interval=self.stalled_interval,
                max_stalls=options.max_stalls, retention=options.retention,
                schedules=self.schedules, log=log)
            beats = Heartbeat(
                transport, self.parts, name=self.name, concurrency=self.concurrency,
                running=lambda: [job_id for job_id, _ in self._attempts.locks()],
                interval=self.heartbeat_interval, log=log)
            # The watchdog keeps the locks and the registry entry while the loop is blocked.
            watchdog = LoopWatchdog(
                url=self.url, parts=self.parts, handler_name=self.handler.import_path,
                executor_name=executor.name, lock_ttl=self.lock_ttl,
                running=self._attempts.locks, renewed=self._attempts.renewed, log=log,
                partition_of=self._attempts.partition_of, registry=beats.writes,
                registry_every=beats.interval)
            watchdog.start()
            await self._when_served(starting, beats.beat)
            async with anyio.create_task_group() as tg:
                tg.start_soon(beats.run)
                tg.start_soon(self._heartbeat, watchdog)
                tg.start_soon(wakeups.listen, subscriber)
                renewer = Renewer(transport, self.parts, self._attempts, log)
                if self.metrics is not None:
                    renewer.on_renewed = (
                        lambda n, m=self.metrics: m.locks_renewed(self.keys.name, n))
                tg.start_soon(renewer.run)
                tg.start_soon(upkeep.run)
                tg.start_soon(upkeep.run_batches)
                if self.schedules:
                    tg.start_soon(upkeep.run_schedules)
                if self.summary_interval:
                    tg.start_soon(log_summary, self, self.summary_interval, log)
                log.info("worker started", concurrency=self.concurrency, executor=executor.name)
                task_status.started()
                with self._claim_scope:
                    await claimer.run(tg)
                # The idle registration is withdrawn while the running jobs drain.
                async with anyio.create_task_group() as stopping:
                    stopping.start_soon(self._withdraw, claimer)
                    await self._drain(claimer)
                # The roles wind down (each bounds its own closing) while the last writes go
                # out: the two overlap, under one bound.
                tg.cancel_scope.cancel()
                watchdog.stop()
                await self._close(beats)
        except _StoppedWhileStarting:
            task_status.started()
        finally:
            # Stopped first: with the loop's roles gone, nothing beats it any more, and it must
            # not write the registry entry again once _close has removed it.
            if watchdog is not None:
                watchdog.stop()
            # Bounded: a network that drops every packet must not hold the shutdown.
            with anyio.CancelScope(shield=True):
                await self._close(beats)  # after an error or a cancellation: not done yet
                if self._shared_transport is None:
                    with anyio.move_on_after(_CLOSE_WAIT):
                        await transport.aclose()
            self._stopping = True
            done.set()
            self._log.info("worker stopped", processed=self.processed, failed=self.failed)

    async def _close(self, beats: Heartbeat | None) -> None:
        """The last steps, once: leave the worker registry and close the executor, together
        under one bound, so that a network that drops every packet costs it once, not once
        per step (an entry that could not be removed expires by itself). A beat cancelled on
        its way was sent before the entry is removed, so none brings the entry back."""
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(_CLOSE_WAIT, shield=True):
            async with anyio.create_task_group() as tg:
                if beats is not None:
                    tg.start_soon(beats.leave)
                if self._executor is not None:
                    tg.start_soon(self._executor.aclose)

    def _chunk_loop(self, transport: AsyncTransport, wakeups: WakeUps, executor: Executor,
                    recorder: Recorder) -> ChunkClaimer:
        """The claim loop of a chunk handler: one chunk per slot (see chunks.py)."""
        chunk = self.handler.options.chunk
        assert chunk is not None
        runner = ChunkRunner(executor, self.keys.name, self.handler.options.job, self._attempts,
                             recorder, stopping=lambda: self._stopping,
                             forced=self._force.is_set, count=self._counted, log=self._log)
        return ChunkClaimer(transport, self.keys, self._tokens, wakeups,
                            concurrency=self.concurrency, lock_ttl=self.lock_ttl,
                            poll_interval=self.poll_interval, chunk=chunk,
                            attempts=self._attempts, run_chunk=runner.run, log=self._log)

    def _counted(self, job: ClaimedJob, outcome: Status | str | None, run_s: float) -> None:
        """A chunk's job ended (``outcome``: its recorded status, or what happened instead)."""
        if outcome == Status.COMPLETED:
            self.processed += 1
        elif outcome == Status.FAILED:
            self.failed += 1
        if self.metrics is not None and outcome is not None:
            self._observe(job, outcome if isinstance(outcome, str) else _OUTCOME_NAMES[outcome],
                          run_s)
        if self._upkeep is not None and job.batch:
            self._upkeep.batch_job_ended()  # as _process_and_relay does for a plain job

    async def _when_served(self, trouble: Trouble, call: Callable[[], Awaitable[T]]) -> T:
        """One step of the start, sent again while Redis answers that it cannot serve now (it
        is loading, out of memory, failing over): a worker started during such an episode
        waits it out, unless it is stopped meanwhile. Once the server has been reached in this
        start, a lost connection is waited out the same way (the server was there a moment
        ago: it is restarting, or the network broke). A server that cannot be reached at all,
        from the first step on, fails the start at once."""
        while True:
            try:
                result = await call()
            except ConnectionError as exc:
                if not isinstance(exc, ServerUnavailable) and not self._reached:
                    raise
                self._reached = True
                if self._stopping:
                    raise _StoppedWhileStarting from exc
                trouble.failed(exc)
                await anyio.sleep(trouble.backoff())
            else:
                self._reached = True
                trouble.ok()
                return result

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
            if self._claimer is not None:
                self._claimer.stop(by=anyio.current_time())

    def _begin_stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._log.info("worker stopping", running=len(self._attempts), grace=self.grace)
            if self._done is not None:
                # The grace period counts from now, whatever the claim loop is doing.
                self._drain_until = anyio.current_time() + self.grace
            for attempt in self._attempts.by_lock.values():
                attempt.stopping = True
            if self._executor is not None:
                self._executor.request_stop()
            if self._claimer is not None:
                self._claimer.stop(by=self._drain_until)
        # Interrupts the claim loop wherever it waits (for a slot or for work); the claim call
        # itself is shielded, so jobs already claimed in Redis are never dropped while the
        # drain lasts.
        if self._done is not None:
            self._claim_scope.cancel()

    async def _drain(self, claimer: ClaimLoop) -> None:
        if len(self._attempts) or claimer.busy:
            async with anyio.create_task_group() as tg:
                async def wait_force() -> None:
                    await self._force.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(wait_force)
                with anyio.CancelScope(deadline=self._drain_until):
                    await claimer.idle.wait()
                tg.cancel_scope.cancel()
        if claimer.busy:
            self._force.set()
            self._log.warning("grace period over; cancelling running jobs",
                              running=len(self._attempts))
            for attempt in list(self._attempts.by_lock.values()):
                attempt.forced = True
                attempt.scope.cancel()
            with anyio.move_on_after(_FORCE_WAIT):
                await claimer.idle.wait()

    # ------------------------------------------------------------------ one slot's job

    async def _process_and_relay(self, job: ClaimedJob) -> ClaimedJob | None:
        """:meth:`_process`; then, for a job of a batch, its ending is relayed to the batch."""
        following = await self._process(job)
        if self._upkeep is not None and job.batch:
            self._upkeep.batch_job_ended()
        return following

    async def _process(self, job: ClaimedJob) -> ClaimedJob | None:
        """Run one job and record its outcome; returns the job claimed next for the slot."""
        recorder = self._recorders[job.partition]
        if self._stopping and self._force.is_set():
            await recorder.release([(job.id, job.token)])
            return None
        previous = self._attempts.of_job(job.id)
        if previous is not None:
            # Claimed again while an earlier attempt still runs here: that attempt's lock
            # expired unseen. Stop it, and start this one only once it has ended, so that this
            # worker never runs two attempts of a job at once.
            self._attempts.lose(previous, "the job was claimed again")
            await previous.wait_ended()
        outcome = await self._runner.run(job, self._stopping)
        if outcome.ending == Ending.COMPLETED:
            # The common path binds nothing: a per-job line costs one level check when off.
            recorded, following = await recorder.complete(job.id, job.token, outcome.result,
                                                          self._log)
            if self.metrics is not None:
                self._observe(job, "completed" if recorded else "lock_lost", outcome.duration)
            if recorded:
                self.processed += 1
                if self._jobs_log.isEnabledFor(logging.DEBUG):
                    self._jobs_log.debug("job completed", job_id=job.id, attempt=job.attempt,
                                         duration_ms=round(outcome.duration * 1000, 3))
            return following
        log = self._log.bind(job_id=job.id, attempt=job.attempt,
                             duration_ms=round(outcome.duration * 1000, 3))
        if outcome.ending == Ending.LOST:
            if self.metrics is not None:
                self._observe(job, "lock_lost", outcome.duration)
            log.warning("attempt stopped: its lock was lost; outcome discarded")
            return None
        if outcome.ending == Ending.RELEASE:
            await recorder.release([(job.id, job.token)])
            if self.metrics is not None:
                self._observe(job, "released", outcome.duration)
            log.warning("job released at forced shutdown")
            return None
        assert outcome.unfinished is not None  # failed, snoozed or rate limited
        status, following = await recorder.end_attempt(outcome.unfinished, log)
        if status == Status.RATE_LIMITED:
            await self._pause_other_partitions(job, outcome.unfinished.delay_ms)
        if status == Status.FAILED:
            self.failed += 1
        if self.metrics is not None and status is not None:
            self._observe(job, _OUTCOME_NAMES[status], outcome.duration)
        return following

    def _observe(self, job: ClaimedJob, outcome: str, run_s: float) -> None:
        assert self.metrics is not None
        wait_s = time.time() - run_s - job.enqueued_at_ms / 1000
        self.metrics.attempt_finished(self.keys.name, outcome, run_s, wait_s)

    def _handed_over(self, handed: Handoff) -> None:
        if self._claimer is not None:
            self._claimer.handoff(handed)

    async def _withdraw(self, claimer: ClaimLoop) -> None:
        """End the claim loop's idle registration and release the jobs handed to it that did
        not start (bounded: past that, their locks expire and the stalled sweep requeues them).
        """
        with anyio.move_on_after(_CLOSE_WAIT, shield=True):
            try:
                handed = await claimer.withdraw()
            except PanqueueError as exc:
                self._log.warning("could not withdraw the idle registration", error=str(exc))
                return
            await self._recorders[0].release([(job.id, job.token) for job in handed])

    async def _pause_other_partitions(self, job: ClaimedJob, ms: int) -> None:
        """A global-mode queue's RateLimited pauses the whole queue: the script paused the
        job's partition, the others are paused here (best effort: a partition this cannot
        reach goes on until it can be told, or until the pause would have ended)."""
        if len(self.parts) == 1 or self.handler.options.mode != "global":
            return
        for keys in self.parts:
            if keys.partition != job.partition:
                try:
                    await self._transport.run(transitions.pause_for(keys, ms))
                except PanqueueError as exc:
                    self._log.warning("could not pause a partition", partition=keys.partition,
                                      error=str(exc))

    async def _report(self, attempt: Attempt, kind: str, value: Any) -> None:
        await self._recorders[attempt.partition].report(attempt, kind, value)

    async def _release(self, locks: list[tuple[str, str]], partition: int) -> None:
        await self._recorders[partition].release(locks)


    async def _heartbeat(self, watchdog: LoopWatchdog) -> None:
        while True:
            watchdog.beat()
            await anyio.sleep(BEAT_INTERVAL)

    @property
    def claims_failing(self) -> bool:
        """The claim loop's last claim failed and none has worked since (readiness: a worker
        that cannot claim is not serving its queue, whatever else answers)."""
        return self._claimer is not None and self._claimer.failing

    def __repr__(self) -> str:
        return f"<Worker {self.name} queue={self.keys.name!r}>"
