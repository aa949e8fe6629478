"""The claim loop and its slots: one loop per worker, a semaphore of ``concurrency`` slots.

The loop takes a slot (plus any other free ones), claims that many jobs in one call, and hands
each to a slot task. A slot task runs its job, whose recording claims the next job for the same
slot, so a busy worker claims mostly through its completions. When nothing is claimable the
slots go back and the loop sleeps until a wake-up, the next delayed job, or the poll interval.
No claimed job ever waits locally. A slot task whose jobs ran out parks, and the next job is
started on it rather than on a new task (:meth:`Claimer._park`).

An empty claim also registers the worker as idle (lua/lib/handoff.lua): the next add claims a
job for it and hands it over in the wake-up message itself, so an idle worker starts a new job
without a claim of its own. The next claim withdraws the registration and takes over a job
whose message went missing; a stopping worker withdraws it and releases what it was handed.

A partitioned queue (``partitions=N``) has one loop all the same, and its workers share the
partitions out (``shares.py``): a claim asks this worker's partitions for the free slots,
those where it runs the fewest jobs first, and only then the others, and a recording claims the
slot's next job only where :meth:`ClaimLoop.keeps` says. Its idle workers do not register (a
job handed over in one partition could not be withdrawn from the others); a wake-up from any
partition wakes the loop. Its global rate limit is one window in a slot of its own: before each
partition's claim the loop takes starts from it, and gives back those no job used
(lua/rate_take.lua); its jobs' recordings then claim nothing, so every start goes through it.
The starts carry a deadline: a claim that runs after it (the worker stalled between the two
calls) claims nothing and answers wake_in 0, its starts go back, and the loop takes fresh
ones.

Longer than 400 lines because the slots, the claim loop, hand-offs and the concurrency a remote
command changes share one semaphore and one set of counters: they are one mechanism.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from panqueue._keys import QueueKeys
from panqueue._runtime.locks import Event, Scope, Tokens
from panqueue._runtime.shares import Shares
from panqueue._runtime.trouble import Trouble, episode_of
from panqueue._runtime.wakeups import WakeUps
from panqueue._store import transitions
from panqueue._store.notify import Handoff
from panqueue._store.transitions import Claimed, ClaimedJob
from panqueue._store.transport import AsyncTransport
from panqueue.errors import PanqueueError

__all__ = ["ClaimLoop", "Claimer"]

_MAX_CLAIM_BATCH = 100
# One claim is abandoned after this long (it is shielded: jobs it claimed are never dropped by a
# cancellation, but a network that drops every packet must not hold the loop).
_CLAIM_BOUND = 10.0

# Runs one job's attempt on a slot, inside the scope given (which stops the attempt), and
# returns its outcome (passed on to RecordJob as it is).
RunAttempt = Callable[[ClaimedJob, Scope], Awaitable[Any]]
# Records a job's outcome (True: the scope stopped the attempt, and was left before this) and
# returns the job claimed next for its slot, if any.
RecordJob = Callable[[ClaimedJob, Any, bool], Awaitable[ClaimedJob | None]]


class ClaimLoop:
    """What every claim loop shares: the slots, claim calls sent again after a lost reply, the
    idle registration and the jobs handed over to it. :class:`Claimer` runs one job per slot;
    chunk handlers have a loop of their own (``chunks.py``)."""

    def __init__(self, transport: AsyncTransport, keys: QueueKeys, tokens: Tokens,
                 wakeups: WakeUps, *, concurrency: int, lock_ttl: float, poll_interval: float,
                 log: Any, parts: list[QueueKeys] | None = None,
                 shared_rate: tuple[int, int] | None = None, name: str = "") -> None:
        self._transport = transport
        self._keys = keys
        self._parts = parts or [keys]
        self._turn = 0  # the partition the next claim asks first (of each group)
        self._shares = Shares(self._parts, name, wakeups.heard)  # a partitioned queue's share-out
        self._shared_rate = shared_rate  # (max, window ms): a partitioned queue's rate limit
        self._tokens = tokens
        self._wakeups = wakeups
        self._lock_ttl = lock_ttl
        self._ttl_ms = max(1, int(lock_ttl * 1000))
        self._poll_interval = poll_interval
        self._trouble = Trouble(log, "claiming jobs", episode_of(transport))
        self._slots = anyio.Semaphore(concurrency)
        # Slots to take back as they come free, after a command lowered the concurrency (or
        # paused the worker: no slot at all); the concurrency to return to on resume.
        self.concurrency = concurrency
        self._owed = 0
        self.paused = False
        self._resume_to = concurrency
        # How long an idle registration lasts: the loop claims again within the poll interval.
        self._idle_ms = max(1, int(poll_interval * 1000))
        # Tokens of idle registrations still to withdraw, and jobs handed over, not yet started.
        self._registered: list[str] = []
        self._handed: list[ClaimedJob] = []
        # The token of the claim being sent, and the ids of the jobs a message handed to it
        # while it was out: a resend of that claim answers them again, and they must not start
        # twice.
        self._sending = ""
        self._delivered: set[str] = set()
        self._group: anyio.abc.TaskGroup | None = None  # where slot tasks run, once running
        self.on_claim: Callable[[float], None] | None = None  # metrics: a claim's round trip
        self.busy = 0
        # Made only while someone waits for the slots to go idle (wait_idle): an idle worker's
        # every job would otherwise make one on the way from its hand-over to its start.
        self._idle: anyio.Event | None = None
        self.stopping = False
        # The claim call out now (shielded), and when a stopping worker stops waiting for it.
        self._call_scope: anyio.CancelScope | None = None
        self._stop_by = math.inf

    @property
    def failing(self) -> BaseException | None:
        """Why its last claim failed (Redis unreachable, or unable to serve), from the first
        failure of an episode until a claim works again; None while claims work."""
        return self._trouble.error if self._trouble.count > 0 else None

    def stop(self, by: float) -> None:
        """Claim nothing more. A claim call still out is waited for until ``by`` (on the event
        loop's clock) at the latest: the shutdown's drain ends then, and a network that drops
        every packet must not hold it for the whole claim bound. Jobs such a call did claim
        stay locked by its token, which the stopping worker withdraws (:meth:`withdraw`), or
        else the stalled sweep requeues them."""
        self.stopping = True
        self._stop_by = min(self._stop_by, by)
        if self._call_scope is not None:
            self._call_scope.deadline = min(self._call_scope.deadline, self._stop_by)

    @property
    def holding_back(self) -> bool:
        """Paused, or owed slots after the concurrency was lowered: a finished job frees its
        slot instead of claiming the next one with its recording."""
        return self.paused or self._owed > 0

    def keeps(self, index: int) -> bool:
        """Whether a recording in partition ``index`` claims its slots' next jobs there (else
        the slots go back to the loop): not while holding back, nor through a shared rate
        window (every start goes through the loop); on a partitioned queue, as the share-out
        says (:meth:`Shares.keeps`: in this worker's partitions, all but the first recording
        after each second; where it helps, until the help ends)."""
        if self.holding_back or self._shared_rate is not None:
            return False
        return self._shares.keeps(index)

    @property
    def registered(self) -> bool:
        """An idle registration is live, or jobs handed to one wait for a slot."""
        return bool(self._registered or self._handed)

    @property
    def declared(self) -> tuple[int, bool]:
        """The concurrency to report in the worker's entry, and whether it is paused."""
        return (self._resume_to if self.paused else self.concurrency), self.paused

    def set_concurrency(self, n: int) -> None:
        """Run up to ``n`` jobs at once from now on (a paused loop keeps it for its resume).
        Running jobs are never stopped: above ``n``, slots are taken back as they free."""
        if self.paused:
            self._resume_to = n
        else:
            self._resize(n)

    def pause(self) -> None:
        """Claim nothing (the running jobs go on) until :meth:`resume`."""
        if not self.paused:
            self._resume_to = self.concurrency
            self._resize(0)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self._resize(self._resume_to)
            self._wakeups.wake()

    def _resize(self, n: int) -> None:
        change, self.concurrency = n - self.concurrency, n
        if change >= 0:
            repaid = min(self._owed, change)
            self._owed -= repaid
            for _ in range(change - repaid):
                self._slots.release()
            return
        self._owed -= change
        while self._owed:
            try:
                self._slots.acquire_nowait()
            except anyio.WouldBlock:
                break
            self._owed -= 1

    def _free_slot(self) -> None:
        if self._owed:
            self._owed -= 1
        else:
            self._slots.release()

    def _start_handed(self) -> None:
        """Jobs were just handed over (they are in ``_handed``). Default: the loop takes
        them."""

    def handoff(self, handed: Handoff) -> None:
        """A job handed over in a wake-up message. It is this worker's when it was handed to
        the registration it is waiting on; any other (another worker's, or one this worker has
        since withdrawn and so takes over through its claim) is ignored."""
        if self.stopping or not self._registered:
            return
        token, jobs = handed.token, handed.jobs
        if token != self._registered[-1] or len(self._registered) > 1:
            # Only the newest registration's message is taken as is; with older ones still to
            # withdraw, the next claim collects everything in one step.
            if token in self._registered:
                self._wakeups.wake()
            return
        self._registered.clear()
        if token == self._sending:
            self._delivered.update(job.id for job in jobs)
        self._handed.extend(jobs)
        self._start_handed()
        self._wakeups.wake()

    def waiting(self) -> list[ClaimedJob]:
        """The jobs claimed for this worker that wait for a slot (their locks are renewed with
        the running attempts')."""
        return list(self._handed)

    def give_up(self, lost: set[tuple[str, str]]) -> None:
        """Waiting jobs whose locks were taken away (their renewal found them lost): they
        are another worker's now, and never start here."""
        self._handed = [job for job in self._handed if (job.id, job.token) not in lost]

    async def withdraw(self) -> list[ClaimedJob]:
        """On stopping: end this worker's idle registrations; returns the jobs it was handed
        and did not start (to be released)."""
        handed, self._handed = self._handed, []
        if self._registered:
            token = self._tokens.new()
            claimed = await self._transport.run(transitions.claim(
                self._keys, token, self._ttl_ms, 0, withdraw=self._registered))
            self._registered = []
            handed += claimed.jobs
        return handed

    async def _claim(self, free: int) -> Claimed | None:
        """One claim of up to ``free`` jobs; None if Redis could not be asked.

        After a failure the same call is sent again with the same token, which is also its
        request id: if the first call ran and only its reply was lost, the resend answers the
        jobs it claimed (see lua/lib/memo.lua), so none waits for the stalled sweep. It is given
        up once the claimed jobs' locks could have expired, or when the worker stops.
        """
        if len(self._parts) > 1:
            return await self._claim_partitions(free)
        token = self._tokens.new()
        withdraw = self._registered
        # Registered before the call is sent: a call whose reply is lost may still register it.
        self._registered = [*withdraw, token]
        self._sending = token
        self._delivered.clear()
        try:
            return await self._send_claim(token, free, withdraw)
        finally:
            self._sending = ""
            self._delivered.clear()

    async def _claim_partitions(self, free: int) -> Claimed | None:
        """Claim up to ``free`` jobs from this worker's partitions, then from the others
        (see the module docstring); None if no partition could be asked.

        Within each group the free slots are shared out: each partition is asked for its share
        first, and only then the partitions that filled theirs for what is left. A slot's
        completions claim its next job from the same partition, so the slots stay spread as
        this claim spread them, instead of one partition taking every slot until it is
        empty."""
        turn, self._turn = self._turn, self._turn + 1
        jobs: list[ClaimedJob] = []
        wake_in = -1
        answered = False
        own, others = await self._shares.groups(self._transport)
        busy = self._shares.busy
        for group in (own, others):
            n = len(group)
            share = -(-(free - len(jobs)) // n) if n else 0
            more: list[QueueKeys] = []  # partitions that gave their whole share: ask again
            # Those where this worker runs the fewest jobs first (a partition that filled while
            # the slots were busy in the others is asked before them), in turn among equals.
            order = sorted((group[(turn + step) % n] for step in range(n)),
                           key=lambda keys: busy[keys.partition])
            for step in range(2 * n):
                if len(jobs) >= free:
                    break
                if step < n:
                    keys = order[step]
                    wanted = min(share, free - len(jobs))
                elif more:
                    keys = more.pop(0)
                    wanted = free - len(jobs)
                else:
                    break
                claimed, waits = await self._claim_from(keys, wanted)
                if waits is not None:  # the rate window is full: no partition may start a job
                    wake_in = waits if wake_in < 0 else min(wake_in, waits)
                    return Claimed(jobs, wake_in)
                if claimed is None:
                    continue
                answered = True
                jobs += claimed.jobs
                if claimed.jobs and group is others:
                    self._shares.helping(keys)
                if step < n and len(claimed.jobs) == wanted:
                    more.append(keys)
                if claimed.wake_in_ms >= 0:
                    wake_in = (claimed.wake_in_ms if wake_in < 0
                               else min(wake_in, claimed.wake_in_ms))
        return Claimed(jobs, wake_in) if answered else None

    async def _claim_from(self, keys: QueueKeys, wanted: int
                          ) -> tuple[Claimed | None, int | None]:
        """One partition's claim of up to ``wanted`` jobs, through the shared rate window when
        the queue has one: (what was claimed, or None; ms until the window has room when it
        had none)."""
        token = self._tokens.new()
        start_by = 0
        if self._shared_rate is not None:
            taken = await self._take_starts(keys, wanted, token)
            if taken is None:
                return None, None
            wanted, until_free, start_by = taken
            if wanted == 0:
                return None, until_free
        claimed = await self._send_claim(token, wanted, [], keys, start_by)
        got = 0 if claimed is None else len(claimed.jobs)
        if self._shared_rate is not None and got < wanted:
            await self._give_back_starts(keys, token, got + 1, wanted)
        return claimed, None

    async def _take_starts(self, keys: QueueKeys, wanted: int, name: str
                           ) -> tuple[int, int, int] | None:
        assert self._shared_rate is not None
        limit, per_ms = self._shared_rate
        try:
            return await self._transport.run(transitions.take_starts(keys, wanted, limit,
                                                                     per_ms, name))
        except PanqueueError as exc:
            self._trouble.failed(exc)
            return None

    async def _give_back_starts(self, keys: QueueKeys, name: str, first: int, last: int
                                ) -> None:
        """Starts no job used go back (if this fails, they only leave the window less full
        until they age out of it)."""
        try:
            await self._transport.run(transitions.give_back_starts(keys, name, first, last))
        except PanqueueError as exc:
            self._trouble.failed(exc)

    async def _send_claim(self, token: str, free: int, withdraw: list[str],
                          keys: QueueKeys | None = None, start_by: int = 0) -> Claimed | None:
        registering = keys is None
        give_up = time.monotonic() + self._lock_ttl * 0.8
        while True:
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = min(anyio.current_time() + _CLAIM_BOUND, self._stop_by)
                self._call_scope = scope
                try:
                    sent = time.monotonic()
                    claimed = await self._transport.run(transitions.claim(
                        keys or self._keys, token, self._ttl_ms, free, withdraw=withdraw,
                        idle_ms=self._idle_ms if registering else 0, start_by_ms=start_by))
                    if self.on_claim is not None:
                        self.on_claim(time.monotonic() - sent)
                except PanqueueError as exc:
                    self._trouble.failed(exc)
                else:
                    self._trouble.ok()
                    if not registering:
                        return claimed
                    # The withdrawn registrations are over; this call's stands if it was empty
                    # and no job was handed to it yet. If one was, and its message came first,
                    # a resent call answers that same job again: it runs once, from the message.
                    consumed = token not in self._registered
                    if self._delivered:
                        claimed.jobs = [job for job in claimed.jobs
                                        if job.id not in self._delivered]
                    self._registered = [] if claimed.jobs or consumed else [token]
                    return claimed
                finally:
                    self._call_scope = None
            if scope.cancelled_caught and not self.stopping:
                self._trouble.failed(TimeoutError(f"no reply in {_CLAIM_BOUND:g} s"))
            if self.stopping or time.monotonic() >= give_up:
                return None
            await anyio.sleep(self._trouble.backoff())

    def _release_slots(self, n: int) -> None:
        for _ in range(n):
            self._free_slot()

    def _slot_started(self, partition: int = 0) -> None:
        # A slot's jobs all come from one partition: a recording claims the next one in the
        # partition of the job it records.
        self.busy += 1
        self._shares.busy[partition] += 1

    def _slot_ended(self, partition: int = 0) -> None:
        self.busy -= 1
        self._shares.busy[partition] -= 1
        if self.busy == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None
        self._free_slot()

    async def wait_idle(self) -> None:
        """Until no slot runs a job."""
        while self.busy:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()


class Claimer(ClaimLoop):
    """The claim loop of a handler that runs one job per slot."""

    def __init__(self, transport: AsyncTransport, keys: QueueKeys, tokens: Tokens,
                 wakeups: WakeUps, *, concurrency: int, lock_ttl: float, poll_interval: float,
                 attempt: RunAttempt, record: RecordJob, log: Any,
                 parts: list[QueueKeys] | None = None,
                 shared_rate: tuple[int, int] | None = None, name: str = "",
                 new_event: Callable[[], Event], new_scope: Callable[[], Scope]) -> None:
        super().__init__(transport, keys, tokens, wakeups, concurrency=concurrency,
                         lock_ttl=lock_ttl, poll_interval=poll_interval, log=log, parts=parts,
                         shared_rate=shared_rate, name=name)
        self._attempt = attempt
        self._record = record
        # Slot tasks whose jobs ran out, waiting for the next job to start on them.
        self._parked: list[_Parked] = []
        self._new_event = new_event  # the loop's own events (locks.native_events)
        self._new_scope = new_scope  # and cancel scopes (locks.native_scopes)

    def stop(self, by: float) -> None:
        super().stop(by)
        parked, self._parked = self._parked, []
        for slot in parked:
            slot.ready.set()  # no job: the task ends

    async def run(self, tg: anyio.abc.TaskGroup) -> None:
        """Claim until ``stopping`` (or cancellation); slot tasks are started in ``tg``."""
        self._group = tg
        while not self.stopping:
            await self._slots.acquire()
            free = 1
            while free < _MAX_CLAIM_BATCH:
                try:
                    self._slots.acquire_nowait()
                except anyio.WouldBlock:
                    break
                free += 1
            if self.stopping:
                self._release_slots(free)
                break
            if self._handed:
                handed, self._handed = self._handed[:free], self._handed[free:]
                free -= len(handed)
                self._start(tg, handed)
                del handed  # the loop keeps no job while it waits (their data may be large)
                if free == 0:
                    continue
            # A fresh event before the claim: a wake-up published after the claim ran is
            # delivered to this event, so no wake-up is lost between claim and wait.
            wake = self._wakeups.arm()
            claimed = await self._claim(free)
            if claimed is None:
                self._release_slots(free)
                with anyio.move_on_after(self._trouble.backoff()):
                    await wake.wait()
                continue
            jobs = claimed.jobs
            if len(jobs) > free:
                # Jobs handed to registrations this worker could not withdraw earlier (their
                # claims failed), taken over now: each waits for a slot of its own.
                for _ in range(len(jobs) - free):
                    await self._slots.acquire()
                free = len(jobs)
            self._release_slots(free - len(jobs))
            self._start(tg, jobs)
            took, wake_in_ms = len(jobs), claimed.wake_in_ms
            del jobs, claimed  # nor the jobs it claimed
            if not took and not self._handed:
                timeout = self._poll_interval
                if wake_in_ms >= 0:
                    timeout = min(timeout, wake_in_ms / 1000)
                with anyio.move_on_after(timeout):
                    await wake.wait()

    def _start(self, tg: anyio.abc.TaskGroup, jobs: list[ClaimedJob]) -> None:
        """Run each job on a slot of its own (taken already): on a parked slot task, else on
        a new one."""
        for job in jobs:
            self._slot_started(job.partition)
            if self._parked:
                slot = self._parked.pop()
                slot.job = job
                slot.ready.set()
            else:
                tg.start_soon(self._run_slot, job)

    def _start_handed(self) -> None:
        # Start them at once on parked slot tasks, where a slot is free; the loop (woken by
        # handoff) starts the rest, then claims for the remaining free slots and registers
        # again. A new slot task is started by the loop only: this may run where the message's
        # bytes arrive, outside any task (AsyncSubscriber.deliver_to), where anyio cannot tell
        # which event loop runs unless anyio.run started it.
        if self._group is not None:
            while self._handed and self._parked:
                try:
                    self._slots.acquire_nowait()
                except anyio.WouldBlock:
                    break
                self._start(self._group, [self._handed.pop(0)])

    async def _run_slot(self, job: ClaimedJob | None) -> None:
        """Run ``job`` and the jobs claimed next for its slot; then park until a job is started
        on this task again, or the loop stops. Waking a parked task costs a fraction of
        starting one (anyio's ``start_soon``), which an idle worker would otherwise pay between
        a job's hand-over and its start (docs/performance.md)."""
        while job is not None:
            await self._run_chain(job)
            del job  # a parked task holds no job: its data is not kept while it waits
            job = await self._park()

    async def _run_chain(self, job: ClaimedJob) -> None:
        """Run ``job`` and the jobs claimed next for its slot (all of its partition).

        The attempts run inside one cancel scope, which a stopped attempt (a cancel request, a
        lost lock, a forced shutdown: :meth:`Attempt.stop`) cancels, and the next attempts get
        a new one: a scope entered and left per job was a tenth of a no-op job's CPU. Only a
        running attempt is stopped, and while one runs this task awaits only inside it, so a
        cancellation reaches that attempt alone; its outcome is recorded once the scope is
        left, since a cancelled scope cancels every await inside it."""
        partition = job.partition
        try:
            following: ClaimedJob | None = job
            while following is not None:
                scope = self._new_scope()
                with scope:
                    while following is not None and not scope.cancel_called:
                        job = following
                        outcome = await self._attempt(job, scope)
                        if not scope.cancel_called:
                            following = await self._record(job, outcome, False)
                if scope.cancel_called:
                    following = await self._record(job, outcome, True)
        finally:
            self._slot_ended(partition)

    async def _park(self) -> ClaimedJob | None:
        """The next job started on this slot task; None when the loop stops."""
        if self.stopping:
            return None
        slot = _Parked(self._new_event())
        self._parked.append(slot)
        try:
            await slot.ready.wait()
        finally:
            if slot in self._parked:  # cancelled while parked
                self._parked.remove(slot)
        return slot.job


class _Parked:
    """A slot task waiting for its next job (:meth:`Claimer._park`)."""

    __slots__ = ("job", "ready")

    def __init__(self, ready: Event) -> None:
        self.job: ClaimedJob | None = None
        self.ready = ready
