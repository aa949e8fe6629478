"""The store driven directly: one queue's Lua scripts called as a worker calls them, without a
worker, for the tests of the scripts themselves (test_scripts, test_history, test_adaptive_rate,
test_job_capabilities). Each script's argument list is written here once, so a script whose
ARGV changes is followed in one place.

A plugin of tests/conftest.py: the fixture ``store`` is a :class:`ScriptStore` for the test's
queue on the test's server. A test file that needs more calls subclasses it and overrides
``store`` with :func:`open_store`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

from panqueue._codec import encode
from panqueue._job import ErrorInfo
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS, Script
from panqueue._store.ops import NewJob, add_jobs, encode_error
from panqueue._store.status import Status
from panqueue._store.transitions import parse_claim
from panqueue._store.transport import ScriptCall, SyncTransport

#: The error a failed attempt records, and the one the stalled sweep records.
ERR = encode_error(ErrorInfo("ValueError", "boom"))
STALL_ERR = encode_error(ErrorInfo("Stalled", "stalled"))

LOCK_TTL_MS = 30_000


class ScriptStore:
    """Direct script calls for one queue: ``t`` the transport, ``keys`` the queue's keys,
    ``redis`` the transport's plain client (for reading and arranging the raw data).

    ``request`` is the fresh token a finishing call carries, also its request id (lib/memo.lua);
    empty: no request id, and a next claim needs one."""

    def __init__(self, transport: SyncTransport, keys: QueueKeys) -> None:
        self.t = transport
        self.keys = keys
        self.redis = transport.client

    def call(self, script: Script, *args: Any) -> Any:
        return self.t.execute(ScriptCall(script, (self.keys.prefix,), args))

    def add(self, n: int = 1, **options: Any) -> list[str]:
        """``n`` jobs with the same ``NewJob`` options; their ids, in order."""
        jobs = [NewJob(None, encode(i), **options) for i in range(n)]
        return [job_id for job_id, _ in self.t.run(add_jobs(self.keys, jobs))]

    def add_one(self, **options: Any) -> str:
        [job_id] = self.add(1, **options)
        return job_id

    def claim(self, token: str, n: int = 1, ttl_ms: int = LOCK_TTL_MS) -> list[str]:
        jobs, _ = parse_claim(self.call(SCRIPTS.claim, token, ttl_ms, n))
        return [j.id for j in jobs]

    def complete(self, job_id: str, token: str, *, request: str = "") -> Status:
        reply = self.call(SCRIPTS.complete, -1, request, 1000, 1, job_id, token, encode("ok"), 0)
        return Status(reply[0])

    def fail(self, job_id: str, token: str, max_attempts: int = 1, delay_ms: int = 0, *,
             error: bytes = ERR, request: str = "") -> Status:
        entry = encode({"attempt": 1, "type": "ValueError", "message": "boom"})
        reply = self.call(SCRIPTS.fail, job_id, token, error, entry, max_attempts, delay_ms, 0,
                          "", -1, 0, request, 1000)
        return Status(reply[0])

    def snooze(self, job_id: str, token: str, delay_ms: int, cap: int = -1,
               request: str = "") -> list[Any]:
        entry = encode({"attempt": 1, "type": "Snoozed", "delay_ms": delay_ms})
        return list(self.call(SCRIPTS.snooze, job_id, token, delay_ms, entry, cap, -1, 0,
                              request, LOCK_TTL_MS))

    def rate_limited(self, job_id: str, token: str, retry_after_ms: int = 0,
                     request: str = "") -> int:
        entry = encode({"attempt": 1, "type": "RateLimited", "retry_after_ms": retry_after_ms})
        reply = self.call(SCRIPTS.rate_limited, job_id, token, retry_after_ms, entry, -1, 0,
                          request, LOCK_TTL_MS)
        return int(reply[0])

    def extend(self, ttl_ms: int, *pairs: str) -> list[str]:
        """Renew locks (job id, token pairs); the pairs whose lock was lost."""
        return [x.decode() for x in self.call(SCRIPTS.extend, ttl_ms, *pairs)]

    def sweep(self, max_stalls: int = 1, error: bytes = STALL_ERR) -> tuple[int, int]:
        """The stalled sweep: (requeued, failed)."""
        requeued, failed = self.call(SCRIPTS.stalled, max_stalls, 1000, -1, error)
        return int(requeued), int(failed)

    def field(self, job_id: str, name: str) -> str | None:
        raw = self.redis.hget(self.keys.job(job_id), name)
        return None if raw is None else raw.decode()

    def state(self, job_id: str) -> str | None:
        return self.field(job_id, "s")

    def expire_locks(self) -> None:
        """Make every lock deadline past (as if the lock TTL elapsed)."""
        for member in self.redis.zrange(self.keys.active, 0, -1):
            self.redis.zadd(self.keys.active, {member: 0})

    def history(self) -> list[dict[str, str]]:
        """The queue's history stream, each record's fields decoded."""
        return [{k.decode(): v.decode() for k, v in fields.items()}
                for _, fields in self.redis.xrange(self.keys.history)]


S = TypeVar("S", bound=ScriptStore)


_claims = itertools.count(1)


def run_first(store: ScriptStore, n: int, *, fail: tuple[str, ...] = ()) -> list[str]:
    """Claim the next ``n`` jobs and end each: those named in ``fail`` fail, the rest
    complete. (Each claim has a token of its own: a token is also its call's request id.)"""
    token = f"w:1:{next(_claims)}"
    claimed = store.claim(token, n)
    for job_id in claimed:
        if job_id in fail:
            store.fail(job_id, token)
        else:
            store.complete(job_id, token)
    return claimed


@contextmanager
def open_store(url: str, queue: str, kind: type[S]) -> Iterator[S]:
    """A ``kind`` store for ``queue`` on ``url``, its transport closed at the end."""
    transport = SyncTransport(url)
    try:
        yield kind(transport, QueueKeys(queue))
    finally:
        transport.close()


@pytest.fixture
def store(redis_url: str, queue_name: str) -> Iterator[ScriptStore]:
    with open_store(redis_url, queue_name, ScriptStore) as opened:
        yield opened
