"""Repeatable jobs: ``Registry.schedule(name, queue, cron=... | every=...)``.

Definitions come from code; their next run times live in Redis (``{q:X}:schedules``). Every
worker of the queue looks for due schedules; the tick script lets exactly one of them enqueue
each tick. Run times are computed here (cron arithmetic in Python, with croniter and zoneinfo),
from the server's clock.

Missed ticks (no worker ran): when a worker finds a schedule overdue it enqueues one job for the
overdue tick and moves the schedule to its first tick after now; it does not replay every tick
that was missed.

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

from croniter import CroniterBadCronError, CroniterBadDateError, croniter

from panqueue._codec import check_json_compatible, encode
from panqueue._keys import check_queue_name
from panqueue._options import Backoff, check_positive, check_priority, options_to_wire
from panqueue.errors import ConfigError

__all__ = ["Schedule"]

_MIN_EVERY = 0.1


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

    @classmethod
    def create(cls, name: str, queue: str, *, cron: str | None, every: float | None, tz: str,
               data: Any, priority: int, attempts: int | None, backoff: Backoff | None,
               timeout: float | None) -> Schedule:
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
        check_json_compatible(data, f"schedule {name!r}: data")
        return cls(name, queue, cron, every, tz, data, check_priority(priority),
                   options_to_wire(attempts, backoff, timeout))

    def definition(self) -> bytes:
        """The stored form; a change of any part resets the schedule's next run."""
        return encode({"cron": self.cron, "every": self.every, "tz": self.tz, "data": self.data,
                       "priority": self.priority, "options": self.options})

    def next_after(self, ms: int) -> int:
        """The first run time strictly after ``ms`` (epoch milliseconds)."""
        if self.every is not None:
            step = max(1, round(self.every * 1000))
            return (ms // step + 1) * step
        assert self.cron is not None
        start = datetime.fromtimestamp(ms / 1000, ZoneInfo(self.tz))
        ticks = croniter(self.cron, start)
        every_hour = ticks.expanded[1] == ["*"]
        while True:
            following: datetime = ticks.get_next(datetime)
            # croniter offers a repeated wall-clock time twice; see the module's docstring.
            if every_hour or not _second_occurrence(following):
                return int(following.timestamp() * 1000)

    def job_id(self, run_ms: int) -> str:
        """The tick's job id: the same for every worker that sees this tick."""
        return f"schedule:{self.name}:{run_ms}"


def _second_occurrence(moment: datetime) -> bool:
    """Whether ``moment``'s wall-clock time already happened an hour (or so) earlier: the
    repeated hour after clocks go back."""
    wall = moment.replace(tzinfo=None)
    first = wall.replace(tzinfo=moment.tzinfo, fold=0).timestamp()
    second = wall.replace(tzinfo=moment.tzinfo, fold=1).timestamp()
    return first < second and moment.timestamp() == second
