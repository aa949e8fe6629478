"""Repeatable jobs' schedules: registering one, its ticks (each enqueues one job, exactly
once), listing and removing them; and the server's clock they run on."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from panqueue._codec import decode
from panqueue._job import from_ms
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.base import script_call
from panqueue._store.transport import Batch, Command, Op

__all__ = ["ScheduleInfo", "list_schedules", "remove_schedule", "schedule_done",
           "schedule_pending", "schedule_set", "schedule_tick", "schedule_times",
           "server_time_ms", "tick_job_id", "tick_key"]


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule as stored in Redis."""

    name: str
    queue: str
    next_run: datetime
    definition: dict[str, Any]


def server_time_ms() -> Op[int]:
    seconds, micros = yield Command(("TIME",))
    return int(seconds) * 1000 + int(micros) // 1000


def schedule_set(keys: QueueKeys, name: str, definition: bytes, first_run_ms: int) -> Op[bool]:
    """Create or change a schedule; False if the same definition was already scheduled (its
    next run is then left as it was)."""
    reply = yield script_call(SCRIPTS.schedule_set, keys, name, definition, first_run_ms)
    return bool(reply)


def schedule_tick(keys: QueueKeys, name: str, ticks: list[int], far: list[bool], seen_ms: int,
                  next_ms: int, misfire: str, grace_ms: int, data: bytes, priority: int,
                  options: bytes) -> Op[tuple[bool, list[str], list[int]]]:
    """Take a schedule's due ``ticks`` (listed at the server time ``seen_ms``, the first being
    its next run as read), enqueue the jobs of those that run by the ``misfire`` policy, and
    move it to ``next_ms``. ``far``: per tick, whether its job belongs in another partition;
    such a tick that runs is left pending for the caller (:func:`schedule_done`). Whether this
    call took them (False: another worker did, or the server's clock stepped back since
    ``seen_ms``), the ids of the jobs it enqueued, and the ticks left to the caller."""
    reply = yield script_call(SCRIPTS.schedule_tick, keys, name, seen_ms, next_ms, misfire,
                              grace_ms, data, priority, options,
                              "".join("1" if f else "0" for f in far), *ticks)
    if not reply[0]:
        return False, [], []
    return True, [job_id.decode() for job_id in reply[1]], [int(tick) for tick in reply[2]]


def schedule_pending(keys: QueueKeys, taken_before_ms: int) -> Op[dict[str, list[int]]]:
    """The ticks whose jobs the schedules left to add in other partitions, by schedule: those
    of the schedules whose first pending tick was taken before ``taken_before_ms`` (server
    clock), which the worker that took it has had time to add."""
    names = yield Command(("ZRANGE", keys.schedules_pending, "-inf", f"({taken_before_ms}",
                           "BYSCORE"))
    if not names:
        return {}
    pending = yield Batch(tuple(Command(("HGET", keys.schedule(name.decode()), "pending"))
                                for name in names))
    return {name.decode(): [int(tick) for tick in (ticks or b"").split()]
            for name, ticks in zip(names, pending, strict=True)}


def schedule_done(keys: QueueKeys, name: str, ticks: list[int]) -> Op[int]:
    """The jobs of these pending ``ticks`` were added: they are pending no more. Returns how
    many of the schedule's ticks still are."""
    return int((yield script_call(SCRIPTS.schedule_done, keys, name, *ticks)))


def tick_job_id(name: str, tick_ms: int) -> str:
    """The id of the job a schedule's tick enqueues (lua/schedule_tick.lua makes the same)."""
    return f"schedule:{name}:{tick_ms}"


def tick_key(name: str) -> str:
    """The key of a keyed queue's tick jobs (lua/schedule_tick.lua gives them the same)."""
    return f"schedule:{name}"


def schedule_times(keys: QueueKeys) -> Op[tuple[int, list[tuple[str, int]]]]:
    """The server's time and every schedule's next run (ms)."""
    (seconds, micros), entries = yield Batch((
        Command(("TIME",)),
        Command(("ZRANGE", keys.schedules, 0, -1, "WITHSCORES")),
    ))
    now = int(seconds) * 1000 + int(micros) // 1000
    return now, [(name.decode(), int(float(score))) for name, score in entries]


def list_schedules(keys: QueueKeys) -> Op[list[ScheduleInfo]]:
    _, entries = yield from schedule_times(keys)
    if not entries:
        return []
    definitions = yield Batch(tuple(Command(("HGET", keys.schedule(name), "def"))
                                    for name, _ in entries))
    return [ScheduleInfo(name, keys.name, from_ms(ms) or datetime.now(UTC), decode(d) or {})
            for (name, ms), d in zip(entries, definitions, strict=True)]


def remove_schedule(keys: QueueKeys, name: str) -> Op[bool]:
    reply = yield script_call(SCRIPTS.schedule_remove, keys, name)
    return bool(reply)
