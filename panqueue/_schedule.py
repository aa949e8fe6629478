"""Repeatable jobs: ``Registry.schedule(name, queue, cron=... | every=...)``.

Definitions come from code; their next run times live in Redis (``{q:X}:schedules``). Every
worker of the queue looks for due schedules; the tick script lets exactly one of them enqueue
each tick. Run times are computed here (cron arithmetic in Python, with croniter and zoneinfo),
from the server's clock.

Late and missed ticks: a due tick runs if it is at most ``grace`` seconds late by the server's
clock when a worker takes it. Ticks later than that (no worker ran, Redis was unreachable) are
missed, and the schedule's ``misfire`` policy says what they become: ``"skip"`` (none runs),
``"once"`` (one job, for the first of them: the default) or ``"all"`` (each runs, at most
:data:`MAX_CATCH_UP` of them). Either way the schedule then moves to its first tick after now.
The tick script decides, on the server's clock, so the workers racing for a tick agree; it also
keeps the last tick that ran and never runs a tick at or before it, so a server clock that steps
back cannot run a tick twice.

Daylight saving time (cron in a zone that has it), as classic cron does it:

* a wall-clock time that happens twice (clocks go back) runs once, at its first occurrence;
  an expression whose hour field is ``*`` runs by real time instead, so an hourly job runs in
  both of the repeated hours;
* a wall-clock time that does not exist (clocks go forward) runs once, when the gap ends
  (``30 2 * * *`` runs at 03:00 that day).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from panqueue._check import check_one_of
from panqueue._codec import check_json_compatible, encode
from panqueue._keys import check_queue_name
from panqueue._options import Backoff, check_positive, check_priority, options_to_wire
from panqueue.errors import ConfigError

__all__ = ["DEFAULT_GRACE", "MAX_CATCH_UP", "MISFIRE_POLICIES", "Schedule"]

_MIN_EVERY = 0.1

#: What happens to the ticks a schedule missed by more than its grace.
MISFIRE_POLICIES = ("skip", "once", "all")

#: Seconds a tick may be late and still run as on time. A minute covers what delays a worker
#: without being an outage: a worker restarting, a Redis failover, a loop busy for a while.
DEFAULT_GRACE = 60.0

#: The most jobs one catch-up enqueues for a schedule (``misfire="all"``).
MAX_CATCH_UP = 1000


@dataclass(frozen=True, slots=True)
class Schedule:
    """One repeatable job definition."""

    name: str
    queue: str
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    data: Any = None
    priority: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    misfire: str = "once"
    grace: float = DEFAULT_GRACE

    @classmethod
    def create(cls, name: str, queue: str, *, cron: str | None, every: float | None, tz: str,
               data: Any, priority: int, attempts: int | None, backoff: Backoff | None,
               timeout: float | None, misfire: str = "once",
               grace: float = DEFAULT_GRACE) -> Schedule:
        if not isinstance(name, str) or not name or ":" in name or not name.isprintable():
            raise ConfigError(f"schedule name must be a non-empty printable str without ':', "
                              f"got {name!r}")
        check_queue_name(queue)
        if (cron is None) == (every is None):
            raise ConfigError(f"schedule {name!r}: give exactly one of cron= or every=")
        if every is not None:
            every = check_positive(every, f"schedule {name!r}: every")
            if every < _MIN_EVERY:
                raise ConfigError(f"schedule {name!r}: every must be >= {_MIN_EVERY} s")
        try:
            zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigError(f"schedule {name!r}: unknown time zone {tz!r}") from None
        if cron is not None:
            if not isinstance(cron, str):
                raise ConfigError(f"schedule {name!r}: cron must be a str, got {cron!r}")
            # croniter is imported where a cron expression is read: most processes (every CLI
            # command, workers without schedules) never need it.
            from croniter import CroniterBadCronError, CroniterBadDateError, croniter

            try:
                ticks = croniter(cron, datetime.now(zone))
            except (CroniterBadCronError, CroniterBadDateError, ValueError, KeyError) as exc:
                raise ConfigError(f"schedule {name!r}: invalid cron expression {cron!r}: "
                                  f"{exc}") from None
            try:
                # croniter accepts days no month has; it notices only when asked for a run
                # (and gives up after searching some fifty years ahead).
                ticks.get_next(datetime)
            except CroniterBadDateError:
                raise ConfigError(f"schedule {name!r}: cron expression {cron!r} never matches "
                                  f"a date (check the day of month against the months)"
                                  ) from None
        check_one_of(misfire, f"schedule {name!r}: misfire", MISFIRE_POLICIES)
        grace = check_positive(grace, f"schedule {name!r}: grace")
        check_json_compatible(data, f"schedule {name!r}: data")
        return cls(name, queue, cron, every, tz, data, check_priority(priority),
                   options_to_wire(attempts, backoff, timeout), misfire, grace)

    def definition(self) -> bytes:
        """The stored form; a change of any part resets the schedule's next run. The misfire
        policy and grace are not part of it: they say how a worker catches up, and changing
        them moves no tick."""
        return encode({"cron": self.cron, "every": self.every, "tz": self.tz, "data": self.data,
                       "priority": self.priority, "options": self.options})

    def next_after(self, ms: int) -> int:
        """The first run time strictly after ``ms`` (epoch milliseconds)."""
        if self.every is not None:
            step = max(1, round(self.every * 1000))
            return (ms // step + 1) * step
        assert self.cron is not None
        from croniter import croniter

        start = datetime.fromtimestamp(ms / 1000, ZoneInfo(self.tz))
        ticks = croniter(self.cron, start)
        every_hour = ticks.expanded[1] == ["*"]
        while True:
            following: datetime = ticks.get_next(datetime)
            # croniter offers a repeated wall-clock time twice; see the module's docstring.
            if every_hour or not _second_occurrence(following):
                return int(following.timestamp() * 1000)

    def due_ticks(self, first: int, now: int) -> tuple[list[int], int]:
        """The due ticks to offer the tick script, oldest first, when the schedule's next run
        ``first`` is due at ``now`` (ms, the server's clock); and the schedule's next run once
        they are taken: its first tick after ``now``.

        ``"all"``: every due tick, at most :data:`MAX_CATCH_UP` (the later ones are skipped).
        ``"skip"`` and ``"once"``: ``first`` (the tick ``"once"`` runs if it was missed) and the
        ticks within grace of ``now``. The ticks between are missed whatever the script's clock
        says (it refuses a ``now`` ahead of its own), and not listing them spares walking a long
        outage tick by tick."""
        ticks = [first]
        tick = first
        if self.misfire != "all":
            tick = max(first, now - round(self.grace * 1000) - 1)
        while len(ticks) < MAX_CATCH_UP:
            tick = self.next_after(tick)
            if tick > now:
                return ticks, tick
            ticks.append(tick)
        return ticks, self.next_after(now)


def _second_occurrence(moment: datetime) -> bool:
    """Whether ``moment``'s wall-clock time already happened an hour (or so) earlier: the
    repeated hour after clocks go back."""
    wall = moment.replace(tzinfo=None)
    first = wall.replace(tzinfo=moment.tzinfo, fold=0).timestamp()
    second = wall.replace(tzinfo=moment.tzinfo, fold=1).timestamp()
    return first < second and moment.timestamp() == second
