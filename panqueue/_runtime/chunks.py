"""The claim loop of a chunk handler (``chunk=Chunk(size, wait)``): each slot runs one chunk.

The loop takes a slot and gathers a chunk for it: it claims up to ``size`` jobs and, while
fewer arrived, takes what a wake-up brings (a job handed over, or a claim after a ``w``
message) until the chunk is full or ``wait`` seconds have passed since its first job arrived.
Each job's attempt starts as it joins, so lock renewal covers it while it waits for company.

A slot's recording claims the next chunk for it (a next job per finished one, as for plain
handlers): a full chunk runs at once; a partial one goes back to the loop, which gathers
more for it. Only the loop gathers, so jobs trickling in join one chunk instead of being
spread over several.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from panqueue._keys import QueueKeys
from panqueue._options import Chunk
from panqueue._runtime.claimer import ClaimLoop
from panqueue._runtime.locks import Attempt, Attempts, Tokens
from panqueue._runtime.wakeups import WakeUps
from panqueue._store import transitions
from panqueue._store.transitions import Claimed, ClaimedJob
from panqueue._store.transport import AsyncTransport
from panqueue.errors import PanqueueError

__all__ = ["ChunkClaimer", "Held", "RunChunk"]


@dataclass(slots=True, eq=False)
class Held:
    """A job of a chunk, its attempt started (its lock is renewed from then on)."""

    job: ClaimedJob
    attempt: Attempt
    # An earlier attempt of the same job still running here (its lock expired unseen and the
    # job was claimed again): it was told to stop, and this one runs once it has ended.
    previous: Attempt | None


# Runs one chunk and records it; returns the jobs claimed next for the slot.
RunChunk = Callable[[list[Held]], Awaitable[list[ClaimedJob]]]


class ChunkClaimer(ClaimLoop):
    def __init__(self, transport: AsyncTransport, keys: QueueKeys, tokens: Tokens,
                 wakeups: WakeUps, *, concurrency: int, lock_ttl: float, poll_interval: float,
                 chunk: Chunk, attempts: Attempts, run_chunk: RunChunk, log: Any) -> None:
        super().__init__(transport, keys, tokens, wakeups, concurrency=concurrency,
                         lock_ttl=lock_ttl, poll_interval=poll_interval, log=log)
        self._size = chunk.size
        self._wait = chunk.wait
        self._attempts = attempts
        self._run_chunk = run_chunk

    async def run(self, tg: anyio.abc.TaskGroup) -> None:
        """Gather chunks until ``stopping`` (or cancellation); each runs on a slot task in
        ``tg``."""
        self._group = tg
        while not self.stopping:
            await self._slots.acquire()
            try:
                chunk = await self._gather()
            except BaseException:
                self._free_slot()
                raise
            if not chunk:  # stopping
                self._free_slot()
                break
            self._slot_started()
            tg.start_soon(self._run_slot, chunk)

    async def _gather(self) -> list[Held]:
        """A chunk for the slot just taken: up to ``size`` jobs, fewer once ``wait`` seconds
        have passed since the first joined. Empty only when the worker stops; a chunk being
        gathered then goes back to ``_handed``, which the stopping worker releases."""
        chunk: list[Held] = []
        deadline = math.inf
        wake: anyio.Event | None = None  # armed before a claim, waited for after it
        timeout = self._poll_interval
        waited = 0  # the chunk's first jobs, which waited for a claim or a wake-up
        try:
            while not self.stopping:
                self._join(chunk)
                now = anyio.current_time()
                if chunk and deadline == math.inf:
                    deadline = now + self._wait
                if len(chunk) >= self._size:
                    await self._confirm(chunk[:waited])
                    return chunk
                if wake is None:
                    # Armed before the claim: a wake-up published after it ran is not lost.
                    wake = self._wakeups.arm()
                    waited = len(chunk)
                    claimed = await self._claim(self._size - len(chunk))
                    timeout = self._next_look(claimed)
                    if claimed is not None:
                        self._handed[:0] = claimed.jobs  # joined at the top of the loop
                    continue
                if now >= deadline:  # checked after a claim: what is there now still joins
                    await self._confirm(chunk[:waited])
                    return chunk
                with anyio.move_on_after(min(timeout, deadline - now)):
                    await wake.wait()
                wake = None
        except BaseException:
            self._put_back(chunk)
            raise
        self._put_back(chunk)
        return []

    async def _confirm(self, waited: list[Held]) -> None:
        """Ask Redis whether jobs that waited for company were cancelled meanwhile: the
        notify message may still be on its way when the claim (or the hand-over) that
        completes their chunk arrives, since they travel on different connections. One round
        trip, only for a chunk that was not filled at once; if Redis cannot be asked, the
        cancels heard so far stand."""
        if not waited:
            return
        try:
            flags = await self._transport.run(
                transitions.cancels_requested(self._keys, [held.job.id for held in waited]))
        except PanqueueError:
            return
        for held, cancelled in zip(waited, flags, strict=True):
            if cancelled:
                self._attempts.cancel(held.attempt)

    def _next_look(self, claimed: Claimed | None) -> float:
        """How long to wait for a wake-up after a claim before claiming again."""
        if claimed is None:
            return self._trouble.backoff()
        if not claimed.jobs and claimed.wake_in_ms >= 0:
            return min(self._poll_interval, claimed.wake_in_ms / 1000)
        return self._poll_interval

    def _join(self, chunk: list[Held]) -> None:
        """Move jobs from ``_handed`` into ``chunk`` while it has room, starting their
        attempts; the rest stay for the next chunk."""
        room = self._size - len(chunk)
        joining, self._handed = self._handed[:room], self._handed[room:]
        chunk.extend(self._hold(job) for job in joining)

    def _hold(self, job: ClaimedJob) -> Held:
        previous = self._attempts.of_job(job.id)
        if previous is not None:
            self._attempts.lose(previous, "the job was claimed again")
        return Held(job, self._attempts.start(job.id, job.token, self.stopping,
                                              number=job.attempt), previous)

    def _put_back(self, chunk: list[Held]) -> None:
        """A chunk that will not run: its jobs wait in ``_handed`` again (released if the
        worker stops)."""
        for held in chunk:
            self._attempts.end(held.attempt)
        self._handed[:0] = [held.job for held in chunk]
        chunk.clear()

    async def _run_slot(self, chunk: list[Held]) -> None:
        """Run chunks on one slot: this one, then each full chunk its recording claimed. A
        partial one goes back to the loop to gather more, unless the worker stops (then it
        runs as it is: stopping runs what was claimed, like a plain handler's next job)."""
        following: list[ClaimedJob] = []
        try:
            while True:
                following = await self._run_chunk(chunk)
                if not following or (len(following) < self._size and not self.stopping):
                    break
                chunk = [self._hold(job) for job in following]
                following = []
        finally:
            if following:
                self._handed.extend(following)
                self._wakeups.wake()
            self._slot_ended()
