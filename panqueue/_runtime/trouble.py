"""Redis failures, logged once per episode (not once per call, nor once per activity).

Every activity of a worker that talks to Redis (claiming, renewal, upkeep, the heartbeat,
recording outcomes...) has a :class:`Trouble` that counts its failures and says how long to
wait before the next try. When Redis goes away they all fail, in every worker of the process:
the activities that share a connection share one :class:`Episode` (:func:`episode_of` the
transport; a :class:`~panqueue.WorkerPool`'s workers share theirs), which logs the first
failure of an episode as one warning, naming the activity that met it first, and its end, once
every activity works again, as one line with how long it lasted and how many calls failed. The
other activities' failures and recoveries are DEBUG lines.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

__all__ = ["RETRY_CAP", "STALE", "Episode", "Trouble", "episode_of"]

# The longest wait between two tries of a failing call: however long Redis was away, a worker
# works again within about this long of its return (plus the call itself).
RETRY_CAP = 1.0
# Seconds after its last failure that an activity no longer counts in an episode (see Episode).
STALE = 30.0


class Episode:
    """The activities failing now, of every worker that shares one connection.

    An activity counts as failing from a failure until it works again, or until it has not
    failed for :data:`STALE` seconds: one that is not retried (a progress report dropped, a
    worker that stopped meanwhile) must neither hold the episode open for good nor keep the
    next one from being logged. The activities that are retried while Redis is away (claims,
    heartbeats: at least every :data:`RETRY_CAP`; renewal and upkeep on their interval) keep
    theirs alive."""

    __slots__ = ("__weakref__", "_stale", "calls", "failing", "since")

    def __init__(self, stale: float = STALE) -> None:
        self._stale = stale
        self.failing: dict[Trouble, float] = {}  # activity -> time of its last failure
        self.since = 0.0  # time.monotonic() of the episode's first failure
        self.calls = 0  # failed calls in the episode, over every activity

    def _live(self, now: float) -> bool:
        for trouble, last in list(self.failing.items()):
            if now - last > self._stale:
                del self.failing[trouble]
        return bool(self.failing)

    def failed(self, trouble: Trouble) -> bool:
        """``trouble`` failed a call; True if that begins a new episode."""
        now = time.monotonic()
        first = not self._live(now)
        if first:
            self.since = now
            self.calls = 0
        self.calls += 1
        self.failing[trouble] = now
        return first

    def works(self, trouble: Trouble) -> bool:
        """``trouble`` works again; True if it was the last failing one (the episode ends)."""
        if self.failing.pop(trouble, None) is None:
            return False  # not part of the episode (any more)
        return not self._live(time.monotonic())


_EPISODES: weakref.WeakKeyDictionary[Any, Episode] = weakref.WeakKeyDictionary()


def episode_of(transport: Any) -> Episode:
    """The episode of everything that talks to Redis over ``transport``."""
    episode = _EPISODES.get(transport)
    if episode is None:
        episode = _EPISODES[transport] = Episode()
    return episode


class Trouble:
    """The failures of one activity (claiming, renewal, upkeep...), within its ``episode``
    (one of its own if none is given). :meth:`backoff` says how long to wait before the next
    try."""

    __slots__ = ("_episode", "_log", "_what", "count", "error", "since")

    def __init__(self, log: Any, what: str, episode: Episode | None = None) -> None:
        self._log = log
        self._what = what
        self._episode = episode if episode is not None else Episode()
        self.count = 0
        self.since = 0.0
        self.error: BaseException | None = None  # the last failure

    def failed(self, exc: BaseException) -> None:
        self.count += 1
        self.error = exc
        began = self._episode.failed(self)
        if self.count == 1:
            self.since = time.monotonic()
        if began or self.count == 1:
            (self._log.warning if began else self._log.debug)(
                f"{self._what} failed; retrying until Redis answers", error=str(exc))

    def ok(self) -> None:
        if not self.count:
            return
        now = time.monotonic()
        self._log.debug(f"{self._what} works again", failed_calls=self.count,
                        outage_s=round(now - self.since, 3))
        self.count = 0
        episode = self._episode
        if episode.works(self):
            self._log.info(f"every Redis call works again after {now - episode.since:.1f} s",
                           failed_calls=episode.calls, outage_s=round(now - episode.since, 3))

    def backoff(self) -> float:
        """Seconds to wait before the next try: doubling from 100 ms up to :data:`RETRY_CAP`."""
        return float(min(0.05 * 2 ** min(self.count, 6), RETRY_CAP))
