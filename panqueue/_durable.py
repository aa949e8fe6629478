"""Durable jobs: the run-side state of ``job.step``, ``job.sleep`` and ``job.wait_for``.

A durable handler runs from the top every time its job runs (a retry, a resume after a sleep
or a signal, a recovery after a crash). What it did before is read back from the job's durable
record (one read, on the first durable call of a run; a handler that makes none pays nothing,
and neither does the job's first run, which the claim tells apart: nothing ran before it):

* a step whose result is stored returns it without running again;
* the run's k-th sleep whose wake time is stored and passed returns at once;
* the run's k-th wait for a signal returns the payload it got (or raises ``SignalTimeout``
  again when it timed out).

A sleep or a wait that must wait raises :class:`Suspend` and records the :class:`Suspension`
on the run: the attempt then ends as a suspension (``transitions.Suspended``), whatever the
handler did with the exception. The store behind a run (:class:`DurableStore`) is the worker's:
every write checks the attempt's lock.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from panqueue._check import is_number
from panqueue._codec import DEFAULT_MAX_PAYLOAD, check_json_compatible, check_size, decode, encode
from panqueue._options import epoch_ms
from panqueue.errors import ConfigError, SignalTimeout

__all__ = ["FOREVER_MS", "DurableRun", "DurableStore", "Suspend", "Suspension", "sleep_spec",
           "steps_of", "wait_timeout"]

# The longest a durable sleep or a wait's timeout may be (ten years).
MAX_WAIT_S = 10 * 365 * 24 * 3600.0
# The delayed set's score of a job that waits for a signal with no timeout (suspend.lua's
# FOREVER_MS): far beyond any real time, and beyond what a datetime can hold, so it is never
# shown as a time (JobInfo.run_at, Explanation.due_at: None).
FOREVER_MS = 1125899906842624


class Suspend(Exception):
    """Raised by ``job.sleep`` / ``job.wait_for`` when the job must wait: let it propagate.
    The attempt ends as a suspension even if the handler catches it."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the job suspends ({what}); the handler runs again when it resumes")


@dataclass(frozen=True, slots=True)
class Suspension:
    """Why a run stops: a sleep (``kind`` "sleep": until ``at_ms``, or ``delay_ms`` from now
    when that is 0) or a wait for signal ``name`` ("signal", ``timeout_ms`` -1: none); ``index``
    is its order among the run's sleeps or waits."""

    kind: str
    index: int
    at_ms: int = 0
    delay_ms: int = 0
    timeout_ms: int = -1
    name: str = ""


class DurableStore(Protocol):
    """The worker's side of a durable run; ``attempt`` is the run's, passed back as given. A
    write whose lock is lost raises ``LockLost`` (the attempt is marked lost first), and so does
    a take (never code -1)."""

    async def durable_load(self, attempt: Any) -> dict[bytes, bytes]: ...

    async def durable_step(self, attempt: Any, name: str, result: bytes) -> None: ...

    async def durable_take(self, attempt: Any, index: int, name: str) -> tuple[int, bytes]: ...


def _seconds(what: str, value: object) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    # The range first: math.isfinite raises on an int past a float's range.
    if not is_number(value) or not 0 <= value <= MAX_WAIT_S or not math.isfinite(value):
        raise ConfigError(f"{what} must be a number of seconds or a timedelta, >= 0 and at "
                          f"most {MAX_WAIT_S:g} s, got {value!r}")
    return float(value)


def sleep_spec(seconds: float | timedelta | None, until: datetime | None) -> tuple[int, int]:
    """(wake time in ms since the epoch, 0) for ``until``, or (0, delay in ms) for
    ``seconds``."""
    if (seconds is None) == (until is None):
        raise ConfigError("job.sleep() takes seconds (a number or a timedelta) or until=, "
                          "one of the two")
    if until is not None:
        if not isinstance(until, datetime) or until.tzinfo is None:
            raise ConfigError(f"job.sleep(until=) must be a timezone-aware datetime, got "
                              f"{until!r}")
        return max(1, epoch_ms(until)), 0
    return 0, int(_seconds("job.sleep(seconds)", seconds) * 1000)


def wait_timeout(timeout: float | timedelta | None) -> int:
    """A wait's timeout in ms (-1: none)."""
    if timeout is None:
        return -1
    return int(_seconds("job.wait_for(timeout=)", timeout) * 1000)


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ConfigError(f"{what} name must be a non-empty string of at most 200 characters, "
                          f"got {name!r}")
    return name


class DurableRun:
    """One attempt's durable state: the record read back, the names and orders seen so far."""

    __slots__ = ("_attempt", "_max_payload_bytes", "_record", "_sleeps", "_steps", "_store",
                 "_waits", "suspension")

    def __init__(self, store: DurableStore, attempt: Any,
                 max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD, *,
                 first_run: bool = False) -> None:
        self._store = store
        self._attempt = attempt
        # A stored step result is bounded like a handler's result (the worker's
        # max_payload_bytes): the record is read whole by the first durable call of a run.
        self._max_payload_bytes = max_payload_bytes
        # The job's first run (the claim said so) starts from an empty record without reading
        # it: only a run writes steps, sleeps and waits' results, and none ran before. Signals
        # kept for it are not read from the record: wait_for takes them (signal_take.lua).
        self._record: dict[bytes, bytes] | None = {} if first_run else None
        self._steps: set[str] = set()
        self._sleeps = 0
        self._waits = 0
        self.suspension: Suspension | None = None

    async def _loaded(self) -> dict[bytes, bytes]:
        if self.suspension is not None:  # the handler caught the Suspend and went on
            raise Suspend("already suspended")
        if self._record is None:
            self._record = await self._store.durable_load(self._attempt)
        return self._record

    # ------------------------------------------------------------------ steps

    async def begin_step(self, name: str) -> tuple[bool, Any]:
        """(True, the stored result) when the step ran before, else (False, None)."""
        _check_name("job.step()", name)
        if name in self._steps:
            raise ConfigError(f"step {name!r} ran twice in one run of the job; step names "
                              "must be unique within a job")
        record = await self._loaded()
        self._steps.add(name)
        stored = record.get(b"s:" + name.encode())
        if stored is None:
            return False, None
        return True, decode(stored)

    async def end_step(self, name: str, value: Any) -> None:
        """Store a step's result (checked JSON-compatible: a bad one fails the attempt)."""
        what = f"step {name!r} result"
        check_json_compatible(value, what)
        payload = encode(value)
        check_size(len(payload), self._max_payload_bytes, what)
        await self._store.durable_step(self._attempt, name, payload)
        assert self._record is not None
        self._record[b"s:" + name.encode()] = payload

    async def step(self, name: str, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        found, value = await self.begin_step(name)
        if found:
            return value
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value
        await self.end_step(name, value)
        return value

    # ------------------------------------------------------------------ sleeps

    async def sleep(self, at_ms: int, delay_ms: int) -> None:
        record = await self._loaded()
        index = self._sleeps
        self._sleeps += 1
        stored = record.get(f"z:{index}".encode())
        if stored is not None:
            if f"zp:{index}".encode() in record or time.time() * 1000 >= int(stored):
                return
        elif (at_ms == 0 and delay_ms == 0) or (at_ms and at_ms <= time.time() * 1000):
            return  # nothing to wait for
        self.suspension = Suspension("sleep", index, at_ms=at_ms, delay_ms=delay_ms)
        raise Suspend("job.sleep")

    # ------------------------------------------------------------------ signals

    async def wait_for(self, name: str, timeout_ms: int) -> Any:
        _check_name("job.wait_for()", name)
        record = await self._loaded()
        index = self._waits
        self._waits += 1
        got = record.get(f"w:{index}".encode())
        if got is not None:
            waited = record.get(f"wn:{index}".encode(), b"").decode()
            if waited != name:
                raise ConfigError(
                    f"wait {index} of this job waited for signal {waited!r} when it first "
                    f"ran, and for {name!r} now: what a durable handler waits for must not "
                    "change between runs")
            if got[:1] == b"1":
                return decode(got[1:])
            raise SignalTimeout(name)
        code, payload = await self._store.durable_take(self._attempt, index, name)
        if code == 1:
            record[f"w:{index}".encode()] = b"1" + payload
            record[f"wn:{index}".encode()] = name.encode()
            return decode(payload)
        if code == 2:
            record[f"w:{index}".encode()] = b"0"
            record[f"wn:{index}".encode()] = name.encode()
            raise SignalTimeout(name)
        self.suspension = Suspension("signal", index, timeout_ms=timeout_ms, name=name)
        raise Suspend(f"job.wait_for({name!r})")


def steps_of(record: dict[bytes, bytes]) -> tuple[dict[str, Any], dict[str, int]]:
    """A durable record's steps, in the order they were stored: (name -> result, name -> when
    it was stored, ms)."""
    found: list[tuple[int, str, Any, int]] = []
    for field, value in record.items():
        if field.startswith(b"s:"):
            name = field[2:].decode(errors="replace")
            order, _, at = record.get(b"t:" + field[2:], b"0:0").partition(b":")
            try:
                result = decode(value)
            except Exception:  # an unreadable stored value: shown as missing
                result = None
            found.append((int(order or 0), name, result, int(at or 0)))
    found.sort()
    return ({name: result for _, name, result, _ in found},
            {name: at for _, name, _, at in found})
