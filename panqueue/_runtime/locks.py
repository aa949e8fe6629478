"""Locks: the attempts a worker runs, known by their lock tokens, and the renewal of their locks.

Attempts are keyed by token, not by job id: when a lock expires unseen (a long network cut, a
Redis restart, a clock step) the job can be claimed again, even by this same worker, while the
first attempt still runs. The first attempt is then *lost*: told to stop (``should_stop()``),
cancelled where its executor can, and its outcome discarded; the new attempt starts only once
it has ended, so one worker never runs two attempts of a job at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import anyio

from panqueue._keys import QueueKeys
from panqueue._runtime.trouble import Trouble, episode_of
from panqueue._store import transitions
from panqueue._store.notify import CancelRequest
from panqueue._store.tokens import lock_token, parse_lock_token
from panqueue._store.transitions import ClaimedJob
from panqueue._store.transport import AsyncTransport
from panqueue.errors import PanqueueError

__all__ = ["Attempt", "Attempts", "Renewer", "Tokens"]

# A cancel request heard before the attempt of the run it is for started is kept until that
# attempt starts, however long the job waits for a slot (its lock names one run only). At most
# this many are kept, the oldest going first (requests for runs that ended here meanwhile,
# a cancel that crossed a completion, wait among them until then).
_EARLY_CANCELS_KEPT = 10_000


class Tokens:
    """Lock tokens (``_store/tokens.py``), unique per process and call whatever ``name=`` the
    worker was given; each claim-bearing call gets a fresh one, which is also that call's
    request id."""

    def __init__(self, worker_name: str) -> None:
        self._worker = worker_name
        self._process = uuid.uuid4().hex[:12]
        self._counter = 0

    def new(self) -> str:
        self._counter += 1
        return lock_token(self._worker, self._process, self._counter)

    def made_here(self, token: str) -> bool:
        """Whether ``token`` is one of these (a lock of this worker's)."""
        parsed = parse_lock_token(token)
        return parsed is not None and parsed.process == self._process \
            and parsed.worker == self._worker


class Scope(Protocol):
    """What an attempt needs of a cancel scope: anyio's, or the event loop's own (which anyio's
    is on asyncio, and which it wraps on trio)."""

    def cancel(self) -> None: ...

    @property
    def cancel_called(self) -> bool: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None: ...


def native_scopes() -> Callable[[], Scope]:
    """The class of the running event loop's own cancel scopes, called with no argument.

    ``anyio.CancelScope()`` finds the running event loop on every call (and on trio wraps
    trio's scope in one of its own): called once per attempt, that lookup and wrapper were a
    tenth of a no-op job's CPU on trio. Both kinds nest with anyio's task groups and scopes
    (anyio's asyncio scopes are that class itself; on trio, anyio's scopes are trio's)."""
    if _on_trio():
        import trio  # only on trio, which is then installed

        return trio.CancelScope
    return type(anyio.CancelScope())


def _on_trio() -> bool:
    return type(anyio.CancelScope()).__module__.endswith("_trio")


class Event(Protocol):
    """An event of the running event loop's own (:func:`native_events`)."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


def native_events() -> Callable[[], Event]:
    """The class of the running event loop's own events (``asyncio.Event``, ``trio.Event``),
    called with no argument: for the events a busy worker makes and waits on for every job (a
    batch of completions answered, a parked slot given a job). ``anyio.Event()`` finds the
    running event loop on every call and wraps the loop's own event, whose ``wait`` then
    costs a frame and two calls more. They are set and waited on by the worker's own tasks
    only (never from another thread)."""
    if _on_trio():
        import trio  # only on trio, which is then installed

        return trio.Event
    import asyncio

    return asyncio.Event


@dataclass(slots=True, eq=False)
class Attempt:
    """One attempt this worker runs, and how to stop it."""

    job_id: str
    token: str
    deadline: float  # local (monotonic) time by which the lock is surely expired unless renewed
    # Stops the attempt (a lost lock, a cancel request, a forced shutdown): the scope of its
    # slot task's run of attempts, which no attempt that has ended stops (:meth:`stop`).
    scope: Scope
    done: bool = False  # the executor has returned
    _ended: anyio.Event | None = None  # made only when someone waits for the end (rare)
    lost: bool = False  # lock lost: another attempt may own the job now; do not finish it
    forced: bool = False  # forced shutdown: release the job back to waiting
    cancel_requested: bool = False  # cancel(queue, id) was called for this job
    stopping: bool = False  # the worker is shutting down
    partition: int = 0  # the partition of a partitioned queue that holds the job
    number: int = 0  # the job's attempt number (1 for its first run): stamped on its log lines

    def should_stop(self) -> bool:
        return self.stopping or self.cancel_requested or self.lost

    def stop(self) -> None:
        """Cancel the attempt's scope, if the attempt still runs: the scope outlives it (a
        slot task's attempts share one until one of them is stopped)."""
        if not self.done:
            self.scope.cancel()

    async def wait_ended(self) -> None:
        """Until the executor has returned."""
        if not self.done:
            if self._ended is None:
                self._ended = anyio.Event()
            await self._ended.wait()

    @property
    def lock(self) -> tuple[str, str]:
        """(job id, token): what identifies this attempt's lock. The token alone does not: the
        jobs one claim took share its token."""
        return (self.job_id, self.token)


class Attempts:
    """The attempts running on one worker, by lock (job id, token) and (the newest) by job id."""

    def __init__(self, log: Any, lock_ttl: float, tokens: Tokens) -> None:
        self._log = log
        self._tokens = tokens
        self.lock_ttl = lock_ttl
        self.by_lock: dict[tuple[str, str], Attempt] = {}
        self._by_job: dict[str, Attempt] = {}
        self.on_lost: Callable[[], None] | None = None  # metrics: an attempt's lock was lost
        self._new_scope: Callable[[], Scope] | None = None  # read on the first start
        # Cancel requests heard before the attempt of their run started: lock -> when.
        self._early_cancels: dict[tuple[str, str], float] = {}

    def __len__(self) -> int:
        return len(self.by_lock)

    def start(self, job_id: str, token: str, stopping: bool, partition: int = 0,
              number: int = 0, scope: Scope | None = None) -> Attempt:
        """An attempt that ``scope`` stops (the caller's, entered around the attempt), or a
        scope of its own when none is given."""
        now = time.monotonic()
        if scope is None:
            new_scope = self._new_scope
            if new_scope is None:
                new_scope = self._new_scope = native_scopes()
            scope = new_scope()
        attempt = Attempt(job_id, token, now + self.lock_ttl, scope, stopping=stopping,
                          partition=partition, number=number)
        self.by_lock[(job_id, token)] = attempt
        self._by_job[job_id] = attempt
        # The request names the run by its lock, so it applies only to the attempt of the
        # claim that made that run active; the same id claimed under another lock (the job
        # added again, or retried) is another run.
        if self._early_cancels and self._early_cancels.pop(attempt.lock, None) is not None:
            self.cancel(attempt)
        return attempt

    def cancel(self, attempt: Attempt) -> None:
        """Stop ``attempt``: ``cancel(queue, id)`` was called for its run."""
        attempt.cancel_requested = True
        attempt.stop()

    def request_cancel(self, request: CancelRequest) -> None:
        """``cancel(queue, id)`` was called for an active job (every worker of the queue
        hears it). The attempt of the run it names is stopped. If that run is locked by this
        worker and has no attempt yet, the request is kept until that attempt starts, which
        then begins cancelled: the reply of the claim that made the job active may not have
        arrived, or the job waits for a slot. A request for another worker's run is not
        kept."""
        if not request.token:  # it does not say which run: the one running here, if any
            attempt = self._by_job.get(request.job_id)
        else:
            attempt = self.by_lock.get((request.job_id, request.token))
        if attempt is not None:
            self.cancel(attempt)
            return
        if not self._tokens.made_here(request.token):
            return
        if len(self._early_cancels) >= _EARLY_CANCELS_KEPT:  # the oldest goes: O(1)
            self._early_cancels.pop(next(iter(self._early_cancels)))
        self._early_cancels[(request.job_id, request.token)] = time.monotonic()

    def of_job(self, job_id: str) -> Attempt | None:
        """The newest attempt of ``job_id`` running here, if any."""
        return self._by_job.get(job_id)

    def end(self, attempt: Attempt) -> None:
        """The attempt's executor has returned: it no longer runs here."""
        self.by_lock.pop((attempt.job_id, attempt.token), None)
        if self._by_job.get(attempt.job_id) is attempt:
            del self._by_job[attempt.job_id]
        attempt.done = True
        if attempt._ended is not None:
            attempt._ended.set()

    def lose(self, attempt: Attempt, why: str) -> None:
        if not attempt.lost:
            if self.on_lost is not None:
                self.on_lost()
            self._log.warning("lock lost; stopping the attempt", job_id=attempt.job_id, why=why)
            attempt.lost = True
            attempt.stop()

    def partition_of(self, lock: tuple[str, str]) -> int:
        attempt = self.by_lock.get(lock)
        return 0 if attempt is None else attempt.partition

    def locks(self) -> list[tuple[str, str]]:
        """(job id, token) of every running attempt (safe to call from another thread)."""
        return list(self.by_lock)

    def renewed(self, locks: list[tuple[str, str]], sent: float) -> None:
        """These locks were renewed by a call sent at ``sent`` (monotonic)."""
        for lock in locks:
            attempt = self.by_lock.get(lock)
            if attempt is not None:
                attempt.deadline = max(attempt.deadline, sent + self.lock_ttl)


def by_partition(running: list[Attempt]) -> dict[int, list[tuple[str, str]]]:
    """The locks of ``running`` attempts, by the partition that holds their job."""
    found: dict[int, list[tuple[str, str]]] = {}
    for attempt in running:
        found.setdefault(attempt.partition, []).append(attempt.lock)
    return found


class Renewer:
    """Renews the locks of every running attempt in one call every ``lock_ttl / 3``, and stops
    the attempts whose lock is lost, or surely expired because renewals kept failing (the job
    may already run elsewhere: finishing it here would be a double run). The jobs claimed for
    this worker that wait for a slot (``waiting``: handed over, or claimed by a recording, while
    every slot is taken) are renewed too; one whose lock was taken away is given up
    (``give_up``)."""

    def __init__(self, transport: AsyncTransport, parts: list[QueueKeys], attempts: Attempts,
                 log: Any, waiting: Callable[[], list[ClaimedJob]] = list,
                 give_up: Callable[[set[tuple[str, str]]], None] = lambda lost: None) -> None:
        self._transport = transport
        self._parts = parts
        self._attempts = attempts
        self._waiting = waiting
        self._give_up = give_up
        self._ttl_ms = max(1, int(attempts.lock_ttl * 1000))
        self._trouble = Trouble(log, "lock renewal", episode_of(transport))
        self.on_renewed: Callable[[int], None] | None = None  # metrics: locks renewed

    async def run(self) -> None:
        while True:
            await anyio.sleep(self._attempts.lock_ttl / 3)
            await self.renew()

    async def renew(self) -> None:
        running = list(self._attempts.by_lock.values())
        waiting = self._waiting()
        if not running and not waiting:
            return
        sent = time.monotonic()
        locks_of = by_partition(running)
        for job in waiting:
            locks_of.setdefault(job.partition, []).append((job.id, job.token))
        try:
            lost: set[tuple[str, str]] = set()
            for partition, locks in locks_of.items():
                lost |= set(await self._transport.run(transitions.extend(
                    self._parts[partition], self._ttl_ms, locks)))
        except PanqueueError as exc:
            self._trouble.failed(exc)
        else:
            self._trouble.ok()
            gone = {(job.id, job.token) for job in waiting} & lost
            if gone:
                self._give_up(gone)
            if self.on_renewed is not None:
                self.on_renewed(sum(a.lock not in lost for a in running))
            for attempt in running:
                if attempt.lock in lost:
                    self._attempts.lose(attempt, "the lock had been taken away")
            self._attempts.renewed([a.lock for a in running if a.lock not in lost], sent)
        now = time.monotonic()
        for attempt in running:
            if attempt.deadline < now:
                self._attempts.lose(attempt, "no renewal reached Redis within the lock TTL")
