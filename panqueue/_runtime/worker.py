"""The Worker: a small coordinator over the runtime's roles, for one queue.

- :mod:`claimer`: the single claim loop and its ``concurrency`` slots;
- :mod:`attempt`: one job on its executor, its outcome returned as a value;
- :mod:`recorder`: outcomes written to Redis (batched), retried through outages, releases;
- :mod:`locks` and :mod:`watchdog`: attempts by lock token, renewal, the blocked-loop watchdog;
- :mod:`wakeups`: the notify channel (work to do, cancel requests);
- :mod:`upkeep`: stalled sweep, promotion, cleaning, schedules;
- :mod:`heartbeat`: the worker's entry in the queue's worker registry.

:mod:`roles` builds them, in one place, for the kind of queue the worker serves (plain, a chunk
handler's, partitioned). The Worker starts them, runs each slot's job (attempt, then record),
and stops them in two phases on shutdown.

Longer than 400 lines by the start's wait for a server (``_when_served``) and the two-phase
stop; every role lives in a file of its own (``roles.py`` builds them).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import anyio.abc

from panqueue._codec import DEFAULT_MAX_PAYLOAD, check_max_payload
from panqueue._home import SERVED
from panqueue._keys import check_prefix, partition_keys, prefixed
from panqueue._log import JOBS_LOGGER, get_logger
from panqueue._registry import Registry
from panqueue._runtime.attempt import Ending, Outcome
from panqueue._runtime.failures import report_failure
from panqueue._runtime.heartbeat import BEATS_PER_TTL
from panqueue._runtime.hooks import MetricsHook
from panqueue._runtime.layout import settle_layout
from panqueue._runtime.locks import Attempts, Scope, Tokens
from panqueue._runtime.roles import CLOSE_WAIT, Roles, Shape
from panqueue._runtime.trouble import Trouble, episode_of
from panqueue._store import ops
from panqueue._store.status import Status
from panqueue._store.transitions import ClaimedJob
from panqueue._store.transport import AsyncSubscriber, AsyncTransport, open_async_transport
from panqueue._url import resolve_url
from panqueue.errors import ConfigError, ConnectionError, ServerUnavailable

__all__ = ["Worker"]

T = TypeVar("T")

# How long a start waits for a server it has not reached yet before it fails: long enough for
# a server that restarts or closes every connection for a moment (CLIENT KILL, a proxy in
# between dropping its links) to take connections again; short enough that a wrong URL is an
# error within seconds.
START_GRACE = 5.0


class _StoppedWhileStarting(Exception):
    """Stopped while the start waited for a server that could not serve: a clean stop."""

# A recorded failure's status, as the metrics' outcome.
_OUTCOME_NAMES = {Status.LOCK_LOST: "lock_lost", Status.RETRY_NOW: "retried",
                  Status.RETRY_DELAYED: "retried", Status.FAILED: "failed",
                  Status.CANCELLED: "cancelled", Status.COMPLETED: "completed",
                  Status.SNOOZED: "snoozed", Status.RATE_LIMITED: "rate_limited",
                  Status.SUSPENDED: "suspended"}


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
    :class:`panqueue.metrics.WorkerMetrics`); ``None`` for none. ``prefix``: the key namespace
    of the queue (as the clients that add to it name it; default: the registry's).
    ``max_payload_bytes``: the bound of a handler's encoded result (None: no bound); a result
    over it fails the attempt with a :class:`PayloadError` naming its size.
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
        prefix: str | None = None,
        max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        self.handler = registry.get(queue)
        self._registry = registry  # its failure callbacks, read at each failure
        self.schedules = {s.name: s for s in registry.schedules_for(queue)}
        self.prefix = check_prefix(prefix) if prefix is not None else registry.prefix
        if transport is not None and transport.prefix != self.prefix:
            raise ConfigError(f"the shared transport's prefix {transport.prefix!r} is not the "
                              f"worker's {self.prefix!r}")
        self.max_payload_bytes = check_max_payload(max_payload_bytes)
        # Every partition of the queue (one for most queues); the first is the queue's home.
        # Named as the queue stores them once run() has read its layout.
        with prefixed(self.prefix):
            self.parts = partition_keys(queue, self.handler.options.partitions)
        self.keys = self.parts[0]
        self.url = resolve_url(url if url is not None else registry.url)
        options = self.handler.options
        self._shape = Shape.of(options)  # plain, chunk or partitioned: decided here, once
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
        self.summary_interval = summary_interval
        self.metrics = metrics
        self._log = get_logger("panqueue.worker").bind(queue=queue, worker=self.name)
        self._jobs_log = get_logger(JOBS_LOGGER).bind(queue=queue, worker=self.name)
        # Its logger's own level check (a completed job's line costs one call when off).
        self._jobs_debug = logging.getLogger(JOBS_LOGGER).isEnabledFor
        self._tokens = Tokens(self.name)
        self._attempts = Attempts(self._log, self.lock_ttl, self._tokens)
        self._shared_transport = transport  # else run() opens its own
        self._roles: Roles | None = None  # built by run() once the start has read the layout
        # The run's state: begun (_done, set once stopped), its claim loop's scope, stopping,
        # past the grace period (_force), when running jobs stop getting time to finish.
        self._done: anyio.Event | None = None
        self._claim_scope: anyio.CancelScope | None = None
        self._stopping = False
        self._force = anyio.Event()
        self._drain_until = math.inf
        self._reached = False  # the server answered during this start (see _when_served)
        self._unreached_since: float | None = None  # when the start first failed to reach it
        self.processed = 0
        self.failed = 0

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run until :meth:`shutdown` (or cancellation). Raises ConnectionError if Redis stays
        unreachable for :data:`START_GRACE` seconds at start. With
        ``task_group.start(worker.run)`` it returns once the worker listens for work."""
        # Every key the worker's roles build (in this task and in the tasks it starts, which
        # copy its context) is the prefix's; a handler's enqueue adds where it is served.
        served = SERVED.set((self.url, self.prefix))
        try:
            with prefixed(self.prefix):
                await self._run(task_status)
        finally:
            SERVED.reset(served)

    async def _run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._claim_scope = claim_scope = anyio.CancelScope()
        self._done = done = anyio.Event()
        if self._stopping:  # shutdown() was called before run()
            claim_scope.cancel()
            self._drain_until = anyio.current_time() + self.grace
        transport = self._shared_transport or open_async_transport(self.url, self.prefix)
        try:
            roles, subscriber = await self._start(transport)
            async with anyio.create_task_group() as tg:
                for loop in roles.loops(subscriber):
                    tg.start_soon(loop)
                self._log.info("worker started", concurrency=self.concurrency,
                               executor=roles.executor.name)
                task_status.started()
                with claim_scope:
                    await roles.claimer.run(tg)
                # The idle registration is withdrawn while the running jobs drain.
                async with anyio.create_task_group() as stopping:
                    stopping.start_soon(roles.withdraw)
                    await roles.drain(self._drain_until, self._force)
                # The roles wind down (each bounds its own closing) while the last writes go
                # out: the two overlap, under one bound.
                tg.cancel_scope.cancel()
                roles.watchdog.stop()
                await roles.close()
        except _StoppedWhileStarting:
            task_status.started()
        finally:
            # Stopped first: with the loop's roles gone, nothing beats it any more, and it must
            # not write the registry entry again once close() has removed it.
            built = self._roles  # None if the start failed or stopped before the layout
            if built is not None:
                built.watchdog.stop()
            # Bounded: a network that drops every packet must not hold the shutdown.
            with anyio.CancelScope(shield=True):
                if built is not None:
                    await built.close()  # after an error or a cancellation: not done yet
                if self._shared_transport is None:
                    with anyio.move_on_after(CLOSE_WAIT):
                        await transport.aclose()
            self._stopping = True
            done.set()
            self._log.info("worker stopped", processed=self.processed, failed=self.failed)

    async def _start(self, transport: AsyncTransport
                     ) -> tuple[Roles, list[tuple[list[str], AsyncSubscriber]]]:
        """The start, in order: settle the layout (each partition set up), pause the partitions
        like the home, build the roles and start them (:meth:`Roles.start`: outside the task
        group, so that a refusal is raised as itself). Each step that talks to Redis waits out
        a server that cannot serve yet (:meth:`_when_served`)."""
        starting = Trouble(self._log, "starting the worker", episode_of(transport))
        # The partitions as the queue stores them (their names and layout version), changed
        # to this worker's count first if it differs and no partition holds a job.
        self.parts = parts = await settle_layout(
            transport, self.keys.name, self.handler.options.partitions,
            f"{self.name}:{uuid.uuid4().hex}", self._when_served, starting,
            lambda keys: transport.run(self._shape.setup(keys)),
            leave_wait=self.heartbeat_interval * BEATS_PER_TTL)
        self.keys = parts[0]
        if self._shape.partitioned:
            await self._when_served(starting, lambda: transport.run(ops.pause_like_home(parts)))
        self._roles = roles = Roles(
            self, self._shape, transport, parts, tokens=self._tokens, attempts=self._attempts,
            log=self._log, attempt=self._attempt, record=self._record, counted=self._counted,
            on_failure=lambda: self._registry.failure_callbacks,
            stopping=lambda: self._stopping, forced=self._force.is_set, stop=self._begin_stop)
        if self._stopping:  # since before the roles were built
            roles.claimer.stop(by=self._drain_until)
        return roles, await roles.start(self._when_served, starting)

    async def _when_served(self, trouble: Trouble, call: Callable[[], Awaitable[T]]) -> T:
        """One step of the start, sent again while Redis answers that it cannot serve now (it
        is loading, out of memory, failing over): a worker started during such an episode
        waits it out, unless it is stopped meanwhile. Once the server has been reached in this
        start, a lost connection is waited out the same way (the server was there a moment
        ago: it is restarting, or the network broke). A server that cannot be reached at all,
        from the first step on, is waited for :data:`START_GRACE` seconds (it may be
        restarting, or closing every new connection for a moment), and then fails the start."""
        while True:
            try:
                result = await call()
            except ConnectionError as exc:
                if not isinstance(exc, ServerUnavailable) and not self._reached:
                    if self._unreached_since is None:
                        self._unreached_since = anyio.current_time()
                    if anyio.current_time() - self._unreached_since >= START_GRACE:
                        raise
                else:
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
        stopping = self._stopping
        self._begin_stop()
        if self._done is None:
            return  # never ran
        if stopping and grace is not None and anyio.current_time() + grace < self._drain_until:
            # A stop begun before (a "stop" command, a signal) drains under its own grace: this
            # shorter one holds from now.
            self._drain_until = anyio.current_time() + grace
            if self._roles is not None:
                self._roles.claimer.stop(by=self._drain_until)
            with anyio.move_on_after(grace):
                await self._done.wait()
                return
            self.force()
        await self._done.wait()

    def force(self) -> None:
        """Skip the rest of the grace period (a second signal)."""
        self._begin_stop()
        if self._done is not None:
            self._force.set()
            if self._roles is not None:
                self._roles.claimer.stop(by=anyio.current_time())

    def _begin_stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._log.info("worker stopping", running=len(self._attempts), grace=self.grace)
            if self._done is not None:
                # The grace period counts from now, whatever the claim loop is doing.
                self._drain_until = anyio.current_time() + self.grace
            for attempt in self._attempts.by_lock.values():
                attempt.stopping = True
            if self._roles is not None:
                self._roles.executor.request_stop()
                self._roles.claimer.stop(by=self._drain_until)
        # Interrupts the claim loop wherever it waits (for a slot or for work); the claim call
        # itself is shielded, so jobs already claimed in Redis are never dropped while the
        # drain lasts.
        if self._claim_scope is not None:
            self._claim_scope.cancel()

    # ------------------------------------------------------------------ one slot's job

    # A slot's job uses the run's roles (it runs only while they exist): a recorder per
    # partition, the attempt runner, and pausing the other partitions.

    async def _pause_other_partitions(self, job: ClaimedJob, ms: int) -> None:
        assert self._roles is not None
        await self._roles.pause_others(job.partition, ms)

    async def _attempt(self, job: ClaimedJob, scope: Scope) -> Outcome | None:
        """Run one job's attempt inside ``scope``, which stops it (the slot task's: see
        :meth:`AttemptRunner.run`); None when the job was released before it ran."""
        roles = self._roles
        assert roles is not None
        if self._stopping and self._force.is_set():
            await roles.recorders[job.partition].release([(job.id, job.token)])
            return None
        previous = self._attempts.of_job(job.id)
        if previous is not None:
            # Claimed again while an earlier attempt still runs here: that attempt's lock
            # expired unseen. Stop it, and start this one only once it has ended, so that this
            # worker never runs two attempts of a job at once.
            self._attempts.lose(previous, "the job was claimed again")
            await previous.wait_ended()
        return await roles.runner.run(job, self._stopping, scope)

    async def _record(self, job: ClaimedJob, outcome: Outcome | None, stopped: bool
                      ) -> ClaimedJob | None:
        """Record the outcome of ``job``'s attempt; returns the job claimed next for the
        slot. ``stopped``: its scope stopped the attempt, and was left before this: if the
        whole worker is cancelled meanwhile, the job is given back."""
        following = None
        if outcome is not None:
            try:
                following = await self._recorded(job, outcome)
            except anyio.get_cancelled_exc_class():
                if stopped:
                    assert self._roles is not None
                    await self._roles.give_back([(job.id, job.token)], job.partition)
                raise
        if job.batch:  # its ending is relayed to its batch
            assert self._roles is not None
            self._roles.upkeep.batch_job_ended()
        return following

    async def _recorded(self, job: ClaimedJob, outcome: Outcome) -> ClaimedJob | None:
        roles = self._roles
        assert roles is not None
        # When the attempt ended: its wait is counted from the enqueue to its start, whatever
        # the recording and the failure callbacks take after.
        ended = time.time() if self.metrics is not None else 0.0
        recorder = roles.recorders[job.partition]
        if outcome.ending == Ending.COMPLETED:
            # The common path binds nothing: a per-job line costs one level check when off.
            status, following = await recorder.complete(job.id, job.token, outcome.result,
                                                        self._log)
            if self.metrics is not None:
                self._observe(job, "unrecorded" if status is None else _OUTCOME_NAMES[status],
                              outcome.duration, ended)
            if status == Status.COMPLETED:
                self.processed += 1
                if self._jobs_debug(logging.DEBUG):
                    self._jobs_log.debug("job completed", job_id=job.id, attempt=job.attempt,
                                         duration_ms=round(outcome.duration * 1000, 3))
            return following
        log = self._log.bind(job_id=job.id, attempt=job.attempt,
                             duration_ms=round(outcome.duration * 1000, 3))
        if outcome.ending == Ending.LOST:
            if self.metrics is not None:
                self._observe(job, "lock_lost", outcome.duration, ended)
            log.warning("attempt stopped: its lock was lost; outcome discarded")
            return None
        if outcome.ending == Ending.RELEASE:
            await recorder.release([(job.id, job.token)])
            if self.metrics is not None:
                self._observe(job, "released", outcome.duration, ended)
            log.warning("job released at forced shutdown")
            return None
        assert outcome.unfinished is not None  # failed, snoozed or rate limited
        # A failure the application's callbacks hear of claims no next job for the slot: a job
        # claimed now would wait, its lock renewed by nobody, for as long as they take.
        callbacks = self._registry.failure_callbacks
        status, following = await recorder.end_attempt(
            outcome.unfinished, log,
            claim_next=not (callbacks and outcome.ending == Ending.FAILED))
        if status is not None and (status == Status.FAILED or status.retried):
            await report_failure(callbacks, outcome.job, outcome.error,
                                 status == Status.FAILED, log)
        if outcome.ending == Ending.RATE_LIMITED and status in (Status.RATE_LIMITED,
                                                                Status.CANCELLED):
            # The script paused the job's partition whether or not the job was cancelled
            # meanwhile: the outside service's refusal holds for the whole queue either way.
            await self._pause_other_partitions(job, outcome.unfinished.delay_ms)
        if status == Status.FAILED:
            self.failed += 1
        if self.metrics is not None:  # None: Redis did not take the ending
            self._observe(job, "unrecorded" if status is None else _OUTCOME_NAMES[status],
                          outcome.duration, ended)
        return following

    def _counted(self, job: ClaimedJob, outcome: Status | str | None, run_s: float,
                 ended: float) -> None:
        """A chunk's job ended (``outcome``: its recorded status, or what happened instead)
        with its chunk's call, at ``ended`` (time.time())."""
        if outcome == Status.COMPLETED:
            self.processed += 1
        elif outcome == Status.FAILED:
            self.failed += 1
        if self.metrics is not None:  # None: Redis did not take the ending
            name = ("unrecorded" if outcome is None
                    else outcome if isinstance(outcome, str) else _OUTCOME_NAMES[outcome])
            self._observe(job, name, run_s, ended)

    def _observe(self, job: ClaimedJob, outcome: str, run_s: float, ended: float) -> None:
        assert self.metrics is not None
        wait_s = ended - run_s - job.enqueued_at_ms / 1000
        self.metrics.attempt_finished(self.keys.name, outcome, run_s, wait_s)

    @property
    def stopping(self) -> bool:
        """A stop has begun (shutdown(), a signal, an operator's stop command): the worker
        claims no more jobs and drains."""
        return self._stopping

    @property
    def claims_failing(self) -> BaseException | None:
        """The claim loop's last claim failed and none has worked since (readiness: a worker
        that cannot claim is not serving its queue, whatever else answers): the error, or None."""
        return None if self._roles is None else self._roles.claimer.failing

    @property
    def paused_by_command(self) -> bool:
        """An operator paused this worker (``client.control(name, "pause")``): it claims
        nothing until resumed (readiness: it does not serve its queue meanwhile)."""
        return self._roles is not None and self._roles.claimer.paused

    def blocking(self) -> str | None:
        """The handler of this worker whose code the event loop is executing right now, as
        ``module:function at file:line``, or None (called from another thread while the loop
        is blocked: see :meth:`LoopWatchdog.blocking`)."""
        return None if self._roles is None else self._roles.watchdog.blocking()

    def __repr__(self) -> str:
        return f"<Worker {self.name} queue={self.keys.name!r}>"
