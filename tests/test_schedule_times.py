"""Run times of cron schedules: expressions that can never match, and daylight saving time.

``Schedule.next_after`` is pure arithmetic (the server's clock only supplies "now"), so these
tests call it directly over the days the clocks change.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from panqueue import ConfigError, Schedule

NEW_YORK = "America/New_York"  # 2024: clocks forward on 10 March 02:00, back on 3 November 02:00
BERLIN = "Europe/Berlin"  # 2024: clocks forward on 31 March 02:00, back on 27 October 03:00


def _schedule(cron: str, tz: str = "UTC") -> Schedule:
    return Schedule.create("s", "q", cron=cron, every=None, tz=tz, data=None, priority=0,
                           attempts=None, backoff=None, timeout=None)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _ticks(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The run times in [start, end), following next_after from one to the next."""
    ticks: list[datetime] = []
    ms = _ms(start) - 1
    while True:
        following = schedule.next_after(ms)
        assert following > ms, "next_after must move forward"
        if following >= _ms(end):
            return ticks
        ticks.append(datetime.fromtimestamp(following / 1000, ZoneInfo(schedule.tz)))
        ms = following


def _day(tz: str, year: int, month: int, day: int) -> tuple[datetime, datetime]:
    """Midnight to midnight, local time (23, 24 or 25 hours)."""
    start = datetime(year, month, day, tzinfo=ZoneInfo(tz))
    following = start.date() + timedelta(days=1)
    end = datetime(following.year, following.month, following.day, tzinfo=ZoneInfo(tz))
    return start, end


def _wall(ticks: list[datetime]) -> list[str]:
    return [tick.strftime("%H:%M %Z") for tick in ticks]


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 0 31 4 *", "15 10 31 6,9,11 *"])
def test_a_cron_that_can_never_match_is_refused(cron: str) -> None:
    with pytest.raises(ConfigError, match="never matches"):
        _schedule(cron)


def test_a_cron_that_matches_only_in_leap_years_is_accepted() -> None:
    schedule = _schedule("0 0 29 2 *")
    following = schedule.next_after(_ms(datetime(2025, 1, 1, tzinfo=UTC)))
    assert datetime.fromtimestamp(following / 1000, UTC) == datetime(2028, 2, 29, tzinfo=UTC)


# --------------------------------------------------------------------------- clocks go back


@pytest.mark.parametrize(("tz", "cron", "date", "expected"), [
    (NEW_YORK, "30 1 * * *", (2024, 11, 3), ["01:30 EDT"]),
    (BERLIN, "30 2 * * *", (2024, 10, 27), ["02:30 CEST"]),
    (NEW_YORK, "*/20 1 * * *", (2024, 11, 3), ["01:00 EDT", "01:20 EDT", "01:40 EDT"]),
])
def test_a_wall_clock_time_that_happens_twice_runs_once(
        tz: str, cron: str, date: tuple[int, int, int], expected: list[str]) -> None:
    schedule = _schedule(cron, tz)
    assert _wall(_ticks(schedule, *_day(tz, *date))) == expected
    # The days around it are ordinary.
    before = datetime(*date, tzinfo=ZoneInfo(tz)) - timedelta(days=1)
    assert len(_ticks(schedule, before, before + timedelta(days=1))) == len(expected)


def test_an_every_hour_cron_runs_every_real_hour_when_clocks_go_back() -> None:
    schedule = _schedule("30 * * * *", NEW_YORK)
    ticks = _ticks(schedule, *_day(NEW_YORK, 2024, 11, 3))
    assert _wall(ticks[:4]) == ["00:30 EDT", "01:30 EDT", "01:30 EST", "02:30 EST"]
    assert len(ticks) == 25  # the day has 25 hours
    gaps = {b.timestamp() - a.timestamp() for a, b in itertools.pairwise(ticks)}
    assert gaps == {3600.0}


def test_next_after_never_goes_back_from_any_moment_of_the_fall_back_day() -> None:
    """From every minute of the day (real time), the next run is never earlier than the next
    run seen from an earlier minute, and the day has one run."""
    schedule = _schedule("30 1 * * *", NEW_YORK)
    start, end = _day(NEW_YORK, 2024, 11, 3)
    seen: list[int] = []
    for minute in range(0, int((end - start).total_seconds()) // 60):
        seen.append(schedule.next_after(_ms(start) + minute * 60_000))
    assert seen == sorted(seen)
    runs_that_day = {ms for ms in seen if ms < _ms(end)}
    assert [datetime.fromtimestamp(ms / 1000, ZoneInfo(NEW_YORK)).strftime("%H:%M %Z")
            for ms in runs_that_day] == ["01:30 EDT"]


# --------------------------------------------------------------------------- clocks go forward


@pytest.mark.parametrize(("tz", "cron", "date", "expected"), [
    (NEW_YORK, "30 2 * * *", (2024, 3, 10), ["03:00 EDT"]),
    (BERLIN, "30 2 * * *", (2024, 3, 31), ["03:00 CEST"]),
    (NEW_YORK, "0 2 * * *", (2024, 3, 10), ["03:00 EDT"]),
    (NEW_YORK, "*/20 2 * * *", (2024, 3, 10), ["03:00 EDT"]),
])
def test_a_wall_clock_time_that_is_skipped_runs_once_when_the_gap_ends(
        tz: str, cron: str, date: tuple[int, int, int], expected: list[str]) -> None:
    schedule = _schedule(cron, tz)
    assert _wall(_ticks(schedule, *_day(tz, *date))) == expected


def test_an_every_hour_cron_runs_every_real_hour_when_clocks_go_forward() -> None:
    schedule = _schedule("30 * * * *", NEW_YORK)
    ticks = _ticks(schedule, *_day(NEW_YORK, 2024, 3, 10))
    assert _wall(ticks[:3]) == ["00:30 EST", "01:30 EST", "03:30 EDT"]
    assert len(ticks) == 23  # the day has 23 hours
