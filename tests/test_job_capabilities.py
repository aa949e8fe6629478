"""Job capabilities a handler or a producer asks for: Snooze (run again later without using
an attempt), with real workers on every executor, and the scripts behind them on their own."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from panqueue import ConfigError, JobFailed, JobState, QueueClient, Registry
from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import NewJob, add_jobs
from panqueue._store.status import Status
from panqueue._store.transitions import parse_claim
from panqueue._store.transport import ScriptCall, SyncTransport
from panqueue.testing import run_worker
from tests.helpers import APPS

sys.path.insert(0, str(APPS))
import capabilities_app

pytestmark = pytest.mark.anyio

EXECUTORS = ["inline", "thread", "subprocess"]


def snoozed(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in history if entry.get("type") == "Snoozed"]


# ----------------------------------------------------------------------------- snooze


@pytest.mark.parametrize("executor", EXECUTORS)
async def test_snoozed_job_reruns_after_the_delay_with_its_attempt_unchanged(
        redis_url: str, executor: str) -> None:
    queue = f"cap-snooze-{executor}"
    async with run_worker(capabilities_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue(queue).add({"url": redis_url, "snoozes": 2, "step": 0.3})
        result = await job.result(timeout=20)
        info = await job.info()
    # The handler allows one attempt: had a snooze used one, the job would have failed.
    assert result == {"attempt": 1, "runs": 3}
    assert info.state is JobState.COMPLETED and info.attempts == 1
    entries = snoozed(info.history)
    assert [(e["attempt"], e["delay_ms"]) for e in entries] == [(1, 300), (1, 300)]
    assert info.finished_at is not None and info.enqueued_at is not None
    assert (info.finished_at - info.enqueued_at).total_seconds() >= 0.6  # both delays served


@pytest.mark.parametrize("executor", EXECUTORS)
async def test_an_unusable_snooze_fails_the_attempt_like_an_unusable_retry(
        redis_url: str, executor: str) -> None:
    queue = f"cap-snooze-{executor}"
    async with run_worker(capabilities_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        handles = [await client.queue(queue).add({"bad": bad}) for bad in (-1, "soon")]
        errors = []
        for handle in handles:
            with pytest.raises(JobFailed) as failed:
                await handle.result(timeout=20)
            errors.append(failed.value.error)
            info = await handle.info()
            assert info.failure_reason == "max_attempts_exceeded" and not snoozed(info.history)
    assert [e.type for e in errors if e] == ["InvalidSnooze", "InvalidSnooze"]
    assert "got -1" in errors[0].message and "got 'soon'" in errors[1].message  # type: ignore


async def test_a_job_that_snoozes_past_max_snoozes_fails(redis_url: str) -> None:
    queue = "cap-snooze-capped"
    async with run_worker(capabilities_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue(queue).add(None)
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=20)
        info = await job.info()
    assert info.state is JobState.FAILED and info.failure_reason == "max_snoozes_exceeded"
    assert failed.value.error is not None and failed.value.error.type == "MaxSnoozesExceeded"
    # Two snoozes allowed, the third ends it; its three attempts were never used.
    assert len(snoozed(info.history)) == 3 and info.attempts == 1


async def test_explain_says_a_job_is_snoozed_and_until_when(redis_url: str) -> None:
    async with run_worker(capabilities_app.queues, "cap-snooze-inline", redis_url), \
            QueueClient(redis_url) as client:
        job = await client.queue("cap-snooze-inline").add(
            {"url": redis_url, "snoozes": 1, "step": 60})
        deadline = time.monotonic() + 10
        while (await job.info()).state is not JobState.DELAYED:
            assert time.monotonic() < deadline, "the job was not snoozed"
            await client.get_job("cap-snooze-inline", job.id)  # a round trip, no sleep
        explanation = await client.explain("cap-snooze-inline", job.id)
        await client.cancel("cap-snooze-inline", job.id)
    assert explanation.reason == "snoozed"
    assert "snoozed by its handler until" in explanation.detail


def test_max_snoozes_must_be_a_whole_number_or_none() -> None:
    registry = Registry()
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError, match="max_snoozes must be an int >= 0"):
            registry.handler("q", max_snoozes=bad)


# ----------------------------------------------------------------------------- the scripts


class Store:
    def __init__(self, transport: SyncTransport, keys: QueueKeys) -> None:
        self.t = transport
        self.keys = keys

    def call(self, script: Any, *args: Any) -> Any:
        return self.t.execute(ScriptCall(script, (self.keys.prefix,), args))

    def add(self, **options: Any) -> str:
        [(job_id, _)] = self.t.run(add_jobs(self.keys, [NewJob(None, encode(1), **options)]))
        return job_id

    def claim(self, token: str) -> list[str]:
        jobs, _ = parse_claim(self.call(SCRIPTS.claim, token, 30_000, 1))
        return [j.id for j in jobs]

    def snooze(self, job_id: str, token: str, delay_ms: int, cap: int = -1,
               request: str = "") -> list[Any]:
        entry = encode({"attempt": 1, "type": "Snoozed", "delay_ms": delay_ms})
        return list(self.call(SCRIPTS.snooze, job_id, token, delay_ms, entry, cap, -1, 0,
                              request, 30_000))

    def field(self, job_id: str, name: str) -> str | None:
        raw = self.t.client.hget(self.keys.job(job_id), name)
        return None if raw is None else raw.decode()


@pytest.fixture
def store(redis_url: str, queue_name: str) -> Iterator[Store]:
    transport = SyncTransport(redis_url)
    yield Store(transport, QueueKeys(queue_name))
    transport.close()


def test_snooze_script_delays_the_job_and_gives_back_its_attempt(store: Store) -> None:
    job_id = store.add()
    assert store.claim("w:1") == [job_id] and store.field(job_id, "a") == "1"
    reply = store.snooze(job_id, "w:1", 5_000, request="w:2")
    assert reply[0] == Status.SNOOZED
    assert store.field(job_id, "s") == "delayed" and store.field(job_id, "a") == "0"
    assert store.field(job_id, "sn") == "1" and store.field(job_id, "tk") is None
    due = store.t.client.zscore(store.keys.delayed, job_id)
    assert due is not None and due - time.time() * 1000 > 4_000
    # A resend after a lost reply answers the same and changes nothing.
    assert store.snooze(job_id, "w:1", 5_000, request="w:2")[0] == Status.SNOOZED
    assert store.field(job_id, "sn") == "1"


def test_snooze_script_refuses_a_job_whose_lock_it_does_not_hold(store: Store) -> None:
    job_id = store.add()
    assert store.claim("w:1") == [job_id]
    assert store.snooze(job_id, "someone-else", 1_000) == [Status.LOCK_LOST]
    assert store.field(job_id, "s") == "active" and store.field(job_id, "sn") is None


def test_snooze_of_zero_puts_the_job_back_to_waiting(store: Store) -> None:
    job_id = store.add()
    store.claim("w:1")
    assert store.snooze(job_id, "w:1", 0)[0] == Status.SNOOZED
    assert store.field(job_id, "s") == "waiting"
    assert store.claim("w:2") == [job_id] and store.field(job_id, "a") == "1"


def test_snooze_script_fails_the_job_past_the_cap(store: Store) -> None:
    job_id = store.add()
    for n in (1, 2):
        assert store.claim(f"w:{n}") == [job_id]
        assert store.snooze(job_id, f"w:{n}", 0, cap=1)[0] == (
            Status.SNOOZED if n == 1 else Status.FAILED)
    assert store.field(job_id, "s") == "failed"
    assert store.field(job_id, "fr") == "max_snoozes_exceeded"
    assert store.t.client.zscore(store.keys.failed, job_id) is not None
