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

__all__ = ["RETRY_CAP", "Episode", "Trouble", "episode_of"]

# The longest wait between two tries of a failing call: however long Redis was away, a worker
# works again within about this long of its return (plus the call itself).
RETRY_CAP = 1.0


class Episode:
    """The activities failing now, of every worker that shares one connection."""

    __slots__ = ("__weakref__", "calls", "failing", "since")

    def __init__(self) -> None:
        self.failing: set[Trouble] = set()
        self.since = 0.0  # time.monotonic() of the episode's first failure
        self.calls = 0  # failed calls in the episode, over every activity

    def begin(self, trouble: Trouble) -> bool:
        """``trouble`` starts failing; True if it is the first of a new episode."""
        first = not self.failing
        if first:
            self.since = time.monotonic()
            self.calls = 0
        self.failing.add(trouble)
        return first

    def end(self, trouble: Trouble) -> bool:
        """``trouble`` works again; True if it was the last failing one (the episode ends)."""
        self.failing.discard(trouble)
        return not self.failing


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
        self._episode.calls += 1
        if self.count == 1:
            self.since = time.monotonic()
            first = self._episode.begin(self)
            (self._log.warning if first else self._log.debug)(
                f"{self._what} failed; retrying until Redis answers", error=str(exc))

    def ok(self) -> None:
        if not self.count:
            return
        now = time.monotonic()
        self._log.debug(f"{self._what} works again", failed_calls=self.count,
                        outage_s=round(now - self.since, 3))
        self.count = 0
        episode = self._episode
        if episode.end(self):
            self._log.info(f"every Redis call works again after {now - episode.since:.1f} s",
                           failed_calls=episode.calls, outage_s=round(now - episode.since, 3))

    def backoff(self) -> float:
        """Seconds to wait before the next try: doubling from 100 ms up to :data:`RETRY_CAP`."""
        return float(min(0.05 * 2 ** min(self.count, 6), RETRY_CAP))
