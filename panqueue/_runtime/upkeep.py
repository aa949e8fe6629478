"""Upkeep every worker of a queue does on a timer: the stalled sweep, promotion of due delayed
jobs, the sweep of jobs past their deadline to start, age-based cleaning (and on a partitioned
queue, clearing the pointers in other partitions to the jobs it deleted), schedules, and
batches (relaying the endings of batch jobs, adding the callbacks of batches that fired). Each
is a script that any number of workers may run at once (a tick is enqueued by exactly one of
them)."""

from __future__ import annotations

from typing import Any

import anyio

from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._options import Retention
from panqueue._runtime.trouble import Trouble, episode_of
from panqueue._schedule import Schedule
from panqueue._store import ops, transitions
from panqueue._store.ops.add import NewJob
from panqueue._store.ops.batches import relay, sweep_batches
from panqueue._store.ops.identity import forget_deleted
from panqueue._store.ops.routing import add_routed, identity_home
from panqueue._store.ops.schedules import (
    schedule_done,
    schedule_pending,
    tick_job_id,
    tick_key,
)
from panqueue._store.transport import AsyncTransport
from panqueue.errors import PanqueueError

__all__ = ["Upkeep"]

# How long a tick whose job belongs in another partition may stay pending before any worker adds
# its job: the worker that took it adds it at once, and the others leave it that long.
PENDING_GRACE_MS = 5_000


class Upkeep:
    def __init__(self, transport: AsyncTransport, parts: list[QueueKeys], *, interval: float,
                 max_stalls: int, retention: Retention, schedules: dict[str, Schedule],
                 mode: str, log: Any) -> None:
        self._transport = transport
        self._parts = parts
        self._keys = parts[0]  # a partitioned queue's schedules live in its first partition
        self._mode = mode
        self._interval = interval
        self._max_stalls = max_stalls
        self._retention = retention
        self.schedules = schedules
        self._log = log
        episode = episode_of(transport)  # shared with the worker's other activities
        self._trouble = Trouble(log, "upkeep (stalled sweep, promotion, cleaning)", episode)
        self._schedule_trouble = Trouble(log, "schedules", episode)
        self._batch_trouble = Trouble(log, "batches", episode)
        self._relay_due: anyio.Event | None = None

    async def run(self) -> None:
        """The stalled sweep, promotion, expiry and cleaning, every ``interval`` seconds."""
        trouble = self._trouble
        while True:
            await anyio.sleep(self._interval if not trouble.count
                              else max(self._interval, trouble.backoff()))
            try:
                for keys in self._parts:
                    await self._sweep(keys)
            except PanqueueError as exc:
                trouble.failed(exc)
            else:
                trouble.ok()

    async def _sweep(self, keys: QueueKeys) -> None:
        transport, retention = self._transport, self._retention
        requeued, failed = await transport.run(transitions.sweep_stalled(
            keys, self._max_stalls, retention.failed))
        if requeued or failed:
            self._log.warning("stalled jobs recovered", requeued=requeued, failed=failed)
        await transport.run(transitions.promote(keys))
        await transport.run(transitions.expire_due(keys))
        await transport.run(ops.clean(keys, Retention.age_ms(retention.completed_for),
                                      Retention.age_ms(retention.failed_for)))
        if len(self._parts) > 1:
            # Deleted jobs whose custom ids' homes, in other partitions, still point to them.
            await transport.run(forget_deleted(self._parts, keys))

    def batch_job_ended(self) -> None:
        """A job of a batch ended in this worker: relay its ending now, not at the next tick
        (the last job of a batch is then followed by its callback at once)."""
        if self._relay_due is not None:
            self._relay_due.set()

    async def run_batches(self) -> None:
        """Relay this queue's batch outbox when a batch job ended here, and every ``interval``
        (the endings no worker relayed: a worker that died after ending a job, a cancel or an
        expiry), and look at the batches whose callbacks go to this queue."""
        transport, trouble = self._transport, self._batch_trouble
        self._relay_due = anyio.Event()
        swept_at = anyio.current_time()
        while True:
            with anyio.move_on_after(self._interval if not trouble.count
                                     else max(self._interval, trouble.backoff())):
                await self._relay_due.wait()
            # An ending signalled from here on is relayed by the next round, not lost.
            self._relay_due = anyio.Event()
            try:
                for keys in self._parts:
                    await transport.run(relay(keys))
                if anyio.current_time() - swept_at >= self._interval:
                    swept_at = anyio.current_time()
                    for keys in self._parts:
                        await transport.run(sweep_batches(keys))
            except PanqueueError as exc:
                trouble.failed(exc)
            else:
                trouble.ok()

    async def run_schedules(self) -> None:
        """Register this queue's schedules, then enqueue each tick when it is due. Every worker
        of the queue does this; the tick script lets exactly one of them enqueue each tick."""
        transport, keys, trouble = self._transport, self._keys, self._schedule_trouble
        while True:
            try:
                now = await transport.run(ops.server_time_ms())
                for definition in self.schedules.values():
                    if await transport.run(ops.schedule_set(
                            keys, definition.name, definition.definition(),
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
                now, entries = await transport.run(ops.schedule_times(keys))
                if len(self._parts) > 1:
                    await self._add_left_pending(now)
                for name, run_ms in entries:
                    schedule = self.schedules.get(name)
                    if schedule is None:
                        continue  # defined by another deployment sharing the queue
                    if run_ms > now:
                        sleep_for = min(sleep_for, (run_ms - now) / 1000)
                        continue
                    # The script decides which of the due ticks run (misfire, grace), on the
                    # server's clock; the next run is the first tick after now.
                    ticks, following = schedule.due_ticks(run_ms, now)
                    grace_ms = round(schedule.grace * 1000)
                    taken, job_ids, left = await transport.run(ops.schedule_tick(
                        keys, name, ticks, [self._elsewhere(schedule, tick) for tick in ticks],
                        now,
                        following, schedule.misfire, grace_ms, encode(schedule.data),
                        schedule.priority,
                        encode(schedule.options) if schedule.options else b""))
                    if left:
                        job_ids += await self._add_elsewhere(schedule, left)
                    if taken and now - run_ms > grace_ms:
                        self._log.warning("schedule missed ticks", schedule=name,
                                          misfire=schedule.misfire, since_ms=run_ms,
                                          jobs=len(job_ids))
                    for job_id in job_ids:
                        self._log.info("schedule enqueued a job", schedule=name, job_id=job_id)
                    sleep_for = min(sleep_for, max(0.0, (following - now) / 1000))
            except PanqueueError as exc:
                trouble.failed(exc)
            else:
                trouble.ok()
            await anyio.sleep(max(0.005, sleep_for))

    async def _add_left_pending(self, now: int) -> None:
        """Ticks taken whose jobs the worker that took them did not add (it died, or its add
        failed) within PENDING_GRACE_MS: added here, under their ids (no second job while the
        first exists). A schedule whose jobs cannot be added now is logged and left for the next
        pass; the others' ticks go on."""
        pending = await self._transport.run(schedule_pending(self._keys,
                                                             now - PENDING_GRACE_MS))
        for name, ticks in pending.items():
            if name not in self.schedules or not ticks:
                continue  # another deployment's schedule: its workers add them
            try:
                added = await self._add_elsewhere(self.schedules[name], ticks)
            except PanqueueError as exc:
                self._log.warning("schedule could not add a pending tick's job", schedule=name,
                                  error=str(exc))
                continue
            for job_id in added:
                self._log.info("schedule enqueued a job", schedule=name, job_id=job_id,
                               pending=True)

    def _tick_job(self, schedule: Schedule, tick_ms: int) -> NewJob:
        """The job of a tick, as the tick script makes it (lua/schedule_tick.lua)."""
        return NewJob(tick_job_id(schedule.name, tick_ms), encode(schedule.data),
                      priority=schedule.priority,
                      options=encode(schedule.options) if schedule.options else b"",
                      key=tick_key(schedule.name) if self._mode == "keyed" else "")

    def _elsewhere(self, schedule: Schedule, tick_ms: int) -> bool:
        """Whether the job of a tick belongs in another partition than the schedules': where a
        producer's add of it would go (its key's, a keyed queue's ticks share one, or its
        id's)."""
        home = identity_home(len(self._parts), self._tick_job(schedule, tick_ms))
        return home != self._keys.partition

    async def _add_elsewhere(self, schedule: Schedule, ticks: list[int]) -> list[str]:
        """Add the jobs of ``ticks`` the tick script left pending, each where it routes (under
        its id: adding one again makes no second job), then mark them added. Returns the ids
        of the jobs made."""
        jobs = [self._tick_job(schedule, tick) for tick in ticks]
        added = await self._transport.run(add_routed(self._parts, jobs, self._mode, 0))
        await self._transport.run(schedule_done(self._keys, schedule.name, ticks))
        return [job_id for job_id, created in added if created]
