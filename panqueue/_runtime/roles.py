"""The roles of one run of a worker, built in one place.

What kind of queue a worker serves is decided once, when the worker is made (:class:`Shape`):
a plain queue, a chunk handler's (one chunk per slot), or a partitioned one, whose global rate
limit is one window shared by its partitions. :class:`Roles` builds every role of a run from
that and from what the start found (the connection, the partitions as the queue stores them):
the executor, a recorder per partition, the attempt runner, the wake-ups, the claim loop, lock
renewal, upkeep, the heartbeat and the loop watchdog, with the metrics hooks of each. It starts
them, lists the loops that run beside the claim loop, and at the stop drains, withdraws and
closes them; the worker decides when (``Worker.run``, ``shutdown``, ``force``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import anyio

from panqueue._keys import QueueKeys
from panqueue._options import Chunk
from panqueue._registry import Handler, HandlerOptions
from panqueue._runtime.attempt import AttemptRunner
from panqueue._runtime.chunk_runner import ChunkRunner, Count
from panqueue._runtime.chunks import ChunkClaimer
from panqueue._runtime.claimer import Claimer, RecordJob, RunAttempt
from panqueue._runtime.failures import FailureCallback
from panqueue._runtime.heartbeat import Heartbeat
from panqueue._runtime.hooks import MetricsHook
from panqueue._runtime.layout import Served
from panqueue._runtime.locks import (
    Attempt,
    Attempts,
    Renewer,
    Tokens,
    native_events,
    native_scopes,
)
from panqueue._runtime.recorder import Recorder
from panqueue._runtime.stats import log_summary
from panqueue._runtime.trouble import Trouble
from panqueue._runtime.upkeep import Upkeep
from panqueue._runtime.wakeups import WakeUps
from panqueue._runtime.watchdog import BEAT_INTERVAL, LoopWatchdog
from panqueue._schedule import Schedule
from panqueue._store import ops, transitions
from panqueue._store.notify import Handoff
from panqueue._store.status import Status
from panqueue._store.transitions import ClaimedJob
from panqueue._store.transport import AsyncSubscriber, AsyncTransport, Op
from panqueue.errors import LockLost, PanqueueError
from panqueue.executors import create_executor

__all__ = ["CLOSE_WAIT", "FORCE_WAIT", "Roles", "Settings", "Shape"]

# Bounds of the shutdown's forced phase: how long cancelled jobs get to stop and be released,
# how long the last writes may take (together, see Roles.close), and closing the connection, so
# that Worker.shutdown(grace) returns within grace + FORCE_WAIT + 2 * CLOSE_WAIT seconds even
# when the network drops every packet (the drain ends grace seconds after the stop began).
FORCE_WAIT = 5.0
CLOSE_WAIT = 2.0


@dataclass(frozen=True)
class Shape:
    """The kind of queue a worker serves, decided from its handler's options."""

    options: HandlerOptions
    chunk: Chunk | None  # a chunk handler: its claim loop gathers chunks (never partitioned)
    partitioned: bool
    # A partitioned queue's global rate limit (max, window ms) is one window outside every
    # partition: the claim loop takes its starts, not the partitions' scripts, and the
    # recordings claim nothing.
    shared_rate: tuple[int, int] | None
    # A RateLimited pauses the whole queue: the script pauses the job's partition, the worker
    # the others (a partitioned queue in global mode).
    pauses_all: bool

    @classmethod
    def of(cls, options: HandlerOptions) -> Shape:
        partitioned = options.partitions > 1
        rate = options.rate_limit
        shared = partitioned and rate is not None and not rate.per_key
        return cls(options, options.chunk, partitioned,
                   (rate.max, int(rate.per * 1000)) if shared and rate is not None else None,
                   partitioned and options.mode == "global")

    def setup(self, keys: QueueKeys) -> Op[None]:
        """The settings of the queue (of one partition of it) that its scripts keep."""
        options = self.options
        rate = None if self.shared_rate is not None else options.rate_limit
        return ops.setup_queue(
            keys, options.mode, options.key_concurrency, 0 if rate is None else rate.max,
            0 if rate is None else int(rate.per * 1000), rate is not None and rate.per_key,
            options.retention.failed, options.retention.history,
            0 if rate is None else rate.recover_every_ms, options.retention.events,
            options.retention.events_always)


class Settings(Protocol):
    """What the roles read from their worker (:class:`~panqueue.Worker`'s attributes)."""

    handler: Handler[Any, Any]
    name: str
    url: str
    prefix: str | None
    max_payload_bytes: int | None
    concurrency: int
    lock_ttl: float
    poll_interval: float
    stalled_interval: float
    health_interval: float
    heartbeat_interval: float
    summary_interval: float | None
    schedules: dict[str, Schedule]
    metrics: MetricsHook | None
    processed: int  # the summary line's counts
    failed: int


class Roles:
    """Every role of one run, built by the constructor: then :meth:`start`, the :meth:`loops`
    beside the claim loop, and at the end :meth:`withdraw`, :meth:`drain` and :meth:`close`.

    From the worker: ``attempt`` runs one job's attempt on a slot and ``record`` records its
    outcome (a plain claim loop's, :class:`Claimer`), ``counted`` counts a chunk's job that
    ended, ``stopping`` and ``forced`` say whether the worker is
    stopping and whether its grace period is over."""

    def __init__(self, worker: Settings, shape: Shape, transport: AsyncTransport,
                 parts: list[QueueKeys], *, tokens: Tokens, attempts: Attempts, log: Any,
                 attempt: RunAttempt, record: RecordJob, counted: Count,
                 stopping: Callable[[], bool],
                 forced: Callable[[], bool],
                 on_failure: Callable[[], Sequence[FailureCallback]] = tuple,
                 stop: Callable[[], None] | None = None) -> None:
        options, queue = shape.options, parts[0].name
        self._worker, self._shape, self._transport, self._parts = worker, shape, transport, parts
        self._attempts, self._log = attempts, log
        self._stop = stop  # the worker's stop, for a "stop" command (client.control)
        self._joined = False  # the first beat was sent: the entry is removed at the end
        self._closed = False  # the last steps (close) have run
        self.executor = executor = create_executor(worker.handler)

        def claims_nothing(index: int) -> Callable[[], bool]:
            # A recording claims the slot's next job unless the worker stops or the claim loop
            # wants the slot back (ClaimLoop.keeps: paused, concurrency lowered, a shared rate
            # window, a partition's slots shared out again).
            return lambda: stopping() or not self.claimer.keeps(index)

        # The roles are built on the run's event loop: its own events, for those made per job.
        new_event = native_events()
        self.recorders = [Recorder(
            transport, keys, tokens, lock_ttl=worker.lock_ttl,
            keep_completed=options.retention.completed, keep_failed=options.retention.failed,
            concurrency=worker.concurrency,
            stopping=claims_nothing(index), log=log, new_event=new_event,
            max_snoozes=options.max_snoozes) for index, keys in enumerate(parts)]
        self.runner = AttemptRunner(executor, queue, options.job, attempts, self._report,
                                    self.give_back, durable=self,
                                    max_payload_bytes=worker.max_payload_bytes)
        self.wakeups = WakeUps(transport, parts, health_interval=worker.health_interval,
                               on_cancel=attempts.request_cancel, on_handoff=self._handed_over,
                               log=log)
        self.claimer: Claimer | ChunkClaimer
        if shape.chunk is not None:
            chunk_runner = ChunkRunner(
                executor, queue, options.job, attempts, self.recorders[0], stopping=stopping,
                forced=forced, count=self._relayed_count(counted), log=log,
                max_payload_bytes=worker.max_payload_bytes, on_failure=on_failure)
            self.claimer = ChunkClaimer(
                transport, parts[0], tokens, self.wakeups, concurrency=worker.concurrency,
                lock_ttl=worker.lock_ttl, poll_interval=worker.poll_interval, chunk=shape.chunk,
                attempts=attempts, run_chunk=chunk_runner.run, log=log)
        else:
            self.claimer = Claimer(
                transport, parts[0], tokens, self.wakeups, concurrency=worker.concurrency,
                lock_ttl=worker.lock_ttl, poll_interval=worker.poll_interval,
                attempt=attempt, record=record, log=log, parts=parts,
                shared_rate=shape.shared_rate, name=worker.name, new_event=new_event,
                new_scope=native_scopes())
        self.renewer = Renewer(transport, parts, attempts, log, waiting=self.claimer.waiting,
                               give_up=self.claimer.give_up)
        self.upkeep = Upkeep(
            transport, parts, interval=worker.stalled_interval, max_stalls=options.max_stalls,
            retention=options.retention, schedules=worker.schedules, mode=options.mode,
            log=log)
        self.beats = Heartbeat(
            transport, parts, name=worker.name, concurrency=lambda: self.claimer.declared,
            running=lambda: [job_id for job_id, _ in attempts.locks()],
            interval=worker.heartbeat_interval, log=log, on_commands=self.apply_commands)
        # The watchdog keeps the locks and the registry entry while the loop is blocked.
        self.watchdog = LoopWatchdog(
            url=worker.url, prefix=worker.prefix, parts=parts, handler=worker.handler,
            handler_name=worker.handler.import_path,
            executor_name=executor.name, lock_ttl=worker.lock_ttl, running=attempts.locks,
            renewed=attempts.renewed, log=log, partition_of=attempts.partition_of,
            registry=self.beats.writes, registry_every=self.beats.interval)
        if worker.metrics is not None:
            self._report_to(worker.metrics, queue, attempts)

    def _report_to(self, metrics: MetricsHook, queue: str, attempts: Attempts) -> None:
        """Every metrics hook of the run (without metrics, each is one ``is None`` check)."""
        name = self.executor.name
        self.executor.on_restart = lambda reason: metrics.executor_restarted(queue, name, reason)
        self.claimer.on_claim = lambda seconds: metrics.claim_finished(queue, seconds)
        self.renewer.on_renewed = lambda count: metrics.locks_renewed(queue, count)
        attempts.on_lost = lambda: metrics.lock_lost(queue)

    async def start(self, served: Served, trouble: Trouble
                    ) -> list[tuple[list[str], AsyncSubscriber]]:
        """Start the executor, subscribe to the wake-ups (before the first claim, so that none
        is lost), start the watchdog and write the first beat; returns the subscriptions.
        ``served`` sends each step to Redis (again while the server cannot serve yet)."""
        await self.executor.start()
        subscriber = await served(trouble, self.wakeups.subscribe)
        self.watchdog.start()
        self._joined = True
        await served(trouble, self.beats.beat)
        return subscriber

    def loops(self, subscriber: list[tuple[list[str], AsyncSubscriber]]
              ) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        """The loops that run beside the claim loop until it has drained, in the order they
        start: the heartbeat, the watchdog's beat, the wake-ups (on the subscriptions the start
        made), lock renewal, upkeep, the batch relay, schedules and the summary line, if any."""
        loops: list[Callable[[], Coroutine[Any, Any, None]]] = [
            self.beats.run, self._beat_watchdog, partial(self.wakeups.listen, subscriber),
            self.renewer.run, self.upkeep.run, self.upkeep.run_batches]
        if self.upkeep.schedules:
            loops.append(self.upkeep.run_schedules)
        if self._worker.summary_interval:
            loops.append(partial(log_summary, self._worker, self._worker.summary_interval,
                                 self._log))
        return loops

    async def apply_commands(self, commands: list[str]) -> None:
        """Apply the commands an operator queued for this worker (``client.control``), in
        order: stop (as on SIGTERM), pause (withdraw the idle registration, claim nothing),
        resume, or ``concurrency:<n>``. An unknown one is logged and skipped. Called at every
        beat: a paused worker withdraws a registration that a claim in flight when it paused
        made, and gives back what was handed to it, well before those jobs' locks expire."""
        for command in commands:
            name, _, value = command.partition(":")
            self._log.info("control command received", command=command)
            if name == "stop" and self._stop is not None:
                self._stop()
            elif name == "pause":
                self.claimer.pause()
                await self.withdraw()  # jobs handed to it meanwhile go back to waiting
            elif name == "resume":
                self.claimer.resume()
            elif name == "concurrency" and value.isdigit() and int(value) > 0:
                self.claimer.set_concurrency(int(value))
            else:
                self._log.warning("unknown control command ignored", command=command)
        if not commands and self.claimer.paused and self.claimer.registered:
            await self.withdraw()

    async def withdraw(self) -> None:
        """End the claim loop's idle registration and release the jobs handed to it that did
        not start (bounded: past that, their locks expire and the stalled sweep requeues them).
        """
        with anyio.move_on_after(CLOSE_WAIT, shield=True):
            try:
                handed = await self.claimer.withdraw()
            except PanqueueError as exc:
                self._log.warning("could not withdraw the idle registration", error=str(exc))
                return
            await self.recorders[0].release([(job.id, job.token) for job in handed])

    async def drain(self, until: float, force: anyio.Event) -> None:
        """Let the running jobs finish until ``until`` (or ``force``); then cancel those still
        running, set ``force``, and give them ``FORCE_WAIT`` seconds to stop and be released."""
        claimer, attempts = self.claimer, self._attempts
        if len(attempts) or claimer.busy:
            async with anyio.create_task_group() as tg:
                async def wait_force() -> None:
                    await force.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(wait_force)
                with anyio.CancelScope(deadline=until):
                    await claimer.wait_idle()
                tg.cancel_scope.cancel()
        if claimer.busy:
            force.set()
            self._log.warning("grace period over; cancelling running jobs",
                              running=len(attempts))
            for attempt in list(attempts.by_lock.values()):
                attempt.forced = True
                attempt.stop()
            with anyio.move_on_after(FORCE_WAIT):
                await claimer.wait_idle()

    async def close(self) -> None:
        """The last steps, once: leave the worker registry (if the start joined it) and close
        the executor, together under one bound, so that a network that drops every packet
        costs it once, not once per step (an entry that could not be removed expires by
        itself). A beat cancelled on its way was sent before the entry is removed, so none
        brings the entry back."""
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(CLOSE_WAIT, shield=True):
            async with anyio.create_task_group() as tg:
                if self._joined:
                    tg.start_soon(self.beats.leave)
                tg.start_soon(self.executor.aclose)

    async def pause_others(self, partition: int, ms: int) -> None:
        """A RateLimited of a queue whose shape pauses it all: the script paused the job's
        ``partition``, the others are paused here (best effort: a partition this cannot reach
        goes on until it can be told, or until the pause would have ended)."""
        if not self._shape.pauses_all:
            return
        for keys in self._parts:
            if keys.partition != partition:
                try:
                    await self._transport.run(transitions.pause_for(keys, ms))
                except PanqueueError as exc:
                    self._log.warning("could not pause a partition", partition=keys.partition,
                                      error=str(exc))

    async def _beat_watchdog(self) -> None:
        """Show the watchdog that the event loop runs."""
        while True:
            self.watchdog.beat()
            await anyio.sleep(BEAT_INTERVAL)

    def _relayed_count(self, counted: Count) -> Count:
        """``counted``; then, as for a plain job, a batch's job's ending is relayed."""
        def relayed(job: ClaimedJob, outcome: Status | str | None, run_s: float,
                    ended: float) -> None:
            counted(job, outcome, run_s, ended)
            if job.batch:
                self.upkeep.batch_job_ended()
        return relayed

    def _handed_over(self, handed: Handoff) -> None:
        self.claimer.handoff(handed)

    async def _report(self, attempt: Attempt, kind: str, value: Any) -> None:
        await self.recorders[attempt.partition].report(attempt, kind, value)

    # A durable job's record (panqueue/_durable.py, DurableStore): read and written on the
    # partition of its attempt; a write whose lock is lost stops the attempt.

    async def durable_load(self, attempt: Attempt) -> dict[bytes, bytes]:
        keys = self._parts[attempt.partition]
        if attempt.lost:
            raise LockLost(keys.name, attempt.job_id)
        return await self._transport.run(transitions.durable_record(keys, attempt.job_id))

    async def durable_step(self, attempt: Attempt, name: str, result: bytes) -> None:
        keys = self._parts[attempt.partition]
        if attempt.lost or not await self._transport.run(transitions.step_done(
                keys, attempt.job_id, attempt.token, name, result)):
            self._attempts.lose(attempt, f"step {name!r} found the lock lost")
            raise LockLost(keys.name, attempt.job_id)

    async def durable_take(self, attempt: Attempt, index: int, name: str) -> tuple[int, bytes]:
        keys = self._parts[attempt.partition]
        code, payload = (-1, b"") if attempt.lost else await self._transport.run(
            transitions.take_signal(keys, attempt.job_id, attempt.token, index, name))
        if code < 0:
            self._attempts.lose(attempt, f"wait_for({name!r}) found the lock lost")
            raise LockLost(keys.name, attempt.job_id)
        return code, payload

    async def give_back(self, locks: list[tuple[str, str]], partition: int) -> None:
        """Release ``locks`` (jobs back to waiting) while the whole worker is being
        cancelled: shielded, so the cancellation does not stop the release itself."""
        with anyio.CancelScope(shield=True):
            await self.recorders[partition].release(locks)
