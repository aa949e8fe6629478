"""Redis failures of one activity, logged once per episode (not once per call)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["RETRY_CAP", "Trouble"]

# The longest wait between two tries of a failing call: however long Redis was away, a worker
# works again within about this long of its return (plus the call itself).
RETRY_CAP = 1.0


class Trouble:
    """The failures of one activity (claiming, renewal, upkeep...): the first failure of an
    episode is logged as a warning, the recovery as one line with how many calls failed in
    between. :meth:`backoff` says how long to wait before the next try."""

    __slots__ = ("_log", "_what", "count", "error", "since")

    def __init__(self, log: Any, what: str) -> None:
        self._log = log
        self._what = what
        self.count = 0
        self.since = 0.0
        self.error: BaseException | None = None  # the last failure

    def failed(self, exc: BaseException) -> None:
        self.count += 1
        self.error = exc
        if self.count == 1:
            self.since = time.monotonic()
            self._log.warning(f"{self._what} failed; retrying until Redis answers",
                              error=str(exc))

    def ok(self) -> None:
        if self.count:
            self._log.info(f"{self._what} works again", failed_calls=self.count,
                           outage_s=round(time.monotonic() - self.since, 3))
            self.count = 0

    def backoff(self) -> float:
        """Seconds to wait before the next try: doubling from 100 ms up to :data:`RETRY_CAP`."""
        return float(min(0.05 * 2 ** min(self.count, 6), RETRY_CAP))
