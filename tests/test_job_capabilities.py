"""Job capabilities a handler or a producer asks for: Snooze (run again later without using
an attempt), expiry (a deadline to start by) and RateLimited (pause a key or the queue), with
real workers (on every executor where the executor matters), and the scripts behind them on
their own."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from panqueue import (
    ConfigError,
    FlowJob,
    JobFailed,
    JobState,
    QueueClient,
    Registry,
    SyncQueueClient,
)
from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import server_time_ms
from panqueue._store.status import Status
from panqueue._store.transitions import parse_claim
from panqueue._store.transport import SyncTransport
from panqueue.testing import run_worker
from tests.helpers import APPS, async_wait_until, run_cli
from tests.store_fixtures import ScriptStore

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

        async def is_delayed() -> bool:
            return (await job.info()).state is JobState.DELAYED

        await async_wait_until(is_delayed, what="the job to be snoozed")
        explanation = await client.explain("cap-snooze-inline", job.id)
        await client.cancel("cap-snooze-inline", job.id)
    assert explanation.reason == "snoozed"
    assert "snoozed by its handler until" in explanation.detail


def test_max_snoozes_must_be_a_whole_number_or_none() -> None:
    registry = Registry()
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError, match="max_snoozes must be an int >= 0"):
            registry.handler("q", max_snoozes=bad)


# ----------------------------------------------------------------------------- expiry


async def server_ms(client: QueueClient) -> int:
    return await client._run(server_time_ms())


async def wait_past(client: QueueClient, deadline_ms: int) -> None:
    """Until the server's clock has passed ``deadline_ms``."""
    async def past() -> bool:
        return await server_ms(client) > deadline_ms

    await async_wait_until(past, what="the deadline to pass")


async def ended_expired(client: QueueClient, queue: str, job_id: str) -> Any:
    async def ended() -> bool:
        return (await client.get_job(queue, job_id)).state.is_final

    await async_wait_until(ended, what=f"job {job_id} to end")
    info = await client.get_job(queue, job_id)
    assert (info.state, info.failure_reason) == (JobState.CANCELLED, "expired"), info
    return info


def deadline_of(redis_client: redis.Redis, queue: str, job_id: str) -> int:
    raw = redis_client.hget(QueueKeys(queue).job(job_id), "x")
    assert raw is not None
    return int(raw)


async def test_a_waiting_job_past_its_deadline_is_ended_by_the_claim_which_takes_the_next(
        redis_url: str, redis_client: redis.Redis) -> None:
    capabilities_app.RAN.clear()
    async with QueueClient(redis_url) as client:
        queue = client.queue("cap-expiry")
        stale = await queue.add({}, expires=0.2)
        fresh = await queue.add({})
        await wait_past(client, deadline_of(redis_client, "cap-expiry", stale.id))
        # No worker ran meanwhile: the first claim meets the expired job.
        async with run_worker(capabilities_app.queues, "cap-expiry", redis_url,
                              stalled_interval=60):
            assert await fresh.result(timeout=10) == "ran"
            with pytest.raises(JobFailed) as failed:
                await stale.result(timeout=10)
        info = await ended_expired(client, "cap-expiry", stale.id)
        explanation = await client.explain("cap-expiry", stale.id)
    assert failed.value.state == "cancelled"
    assert [fresh.id] == capabilities_app.RAN and info.attempts == 0
    assert explanation.reason == "expired" and "never ran" in explanation.detail
    assert redis_client.zcard(QueueKeys("cap-expiry").expires) == 0


async def test_delayed_blocked_and_retrying_jobs_expire_and_their_dependents_fail(
        redis_url: str, redis_client: redis.Redis) -> None:
    capabilities_app.RAN.clear()
    async with run_worker(capabilities_app.queues, "cap-expiry", redis_url,
                          stalled_interval=0.05), QueueClient(redis_url) as client:
        queue = client.queue("cap-expiry")
        delayed = await queue.add({"kind": "delayed"}, delay=60, expires=0.3)
        anchor = await queue.add({"kind": "anchor"}, delay=60)  # no deadline: it stays
        blocked = await queue.add({"kind": "blocked"}, depends_on=[anchor.id], expires=0.3)
        dependent = await queue.add({"kind": "dependent"}, depends_on=[blocked.id])
        retrying = await queue.add({"retry_in": 60}, expires=0.5)

        async def ran_once() -> bool:
            return retrying.id in capabilities_app.RAN

        await async_wait_until(ran_once, what="the first attempt of the retrying job")
        for job in (delayed, blocked, retrying):
            await ended_expired(client, "cap-expiry", job.id)
        dependent_info = await client.get_job("cap-expiry", dependent.id)
        retried = await retrying.info()
    assert [retrying.id] == capabilities_app.RAN  # it ran once, and never after its deadline
    assert retried.attempts == 1
    assert dependent_info.state is JobState.FAILED
    assert dependent_info.failure_reason == "dependency_failed"
    assert redis_client.zcard(QueueKeys("cap-expiry").expires) == 0
    assert redis_client.zscore(QueueKeys("cap-expiry").delayed, anchor.id) is not None


async def test_a_deadline_already_past_at_add_ends_the_job_at_once(redis_url: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue("cap-expiry")
        job = await queue.add({}, expires=datetime.now(UTC) - timedelta(seconds=1))
        info = await job.info()
        counts = await client.counts("cap-expiry")
    assert (info.state, info.failure_reason) == (JobState.CANCELLED, "expired")
    assert counts[JobState.CANCELLED] == 1 and counts[JobState.WAITING] == 0


def test_expires_works_for_bulk_flows_and_the_sync_client(
        redis_url: str, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        handle = client.queue("cap-expiry", expires=30)
        bulk = handle.add_bulk([{}, {}])
        flow = handle.add_flow([FlowJob({}, options={"expires": 60}), FlowJob({},
                                                                        depends_on=[0])])
        at = datetime.now(UTC) + timedelta(minutes=5)
        single = client.queue("cap-expiry").add({}, expires=at)
        now = client._run(server_time_ms())
        info = client.get_job("cap-expiry", single.id)
    # Stored in whole ms, rounded up (a job is never dropped before its time).
    assert info.expires_at == at + timedelta(microseconds=-at.microsecond % 1000)
    assert info.to_dict()["expires_at"] == info.expires_at.isoformat()
    with SyncQueueClient(redis_url) as client:
        assert client.get_job("cap-expiry", bulk[0].id).expires_at is not None
    deadlines = {j.id: deadline_of(redis_client, "cap-expiry", j.id) for j in [*bulk, *flow]}
    assert all(29_000 < deadlines[j.id] - now <= 30_000 for j in bulk)
    assert 59_000 < deadlines[flow[0].id] - now <= 60_000
    whole_seconds_ms = int(at.replace(microsecond=0).timestamp()) * 1000
    assert deadline_of(redis_client, "cap-expiry", single.id) == (
        whole_seconds_ms + -(-at.microsecond // 1000))  # in ms, rounded up
    assert redis_client.zcard(QueueKeys("cap-expiry").expires) == 5


@pytest.mark.parametrize("bad", [-1, 0, float("nan"), float("inf"), "5", True,
                                 datetime(2030, 1, 1)],
                         ids=["negative", "zero", "nan", "inf", "str", "bool", "naive"])
def test_a_bad_expires_is_one_clear_error_and_nothing_is_written(
        redis_url: str, redis_client: redis.Redis, bad: Any) -> None:
    with SyncQueueClient(redis_url) as client:
        with pytest.raises(ConfigError, match="expires must be"):
            client.queue("cap-expiry").add({}, expires=bad)
        with pytest.raises(ConfigError, match="expires must be"):
            client.queue("cap-expiry", expires=bad).add_bulk([{}, {}])
    assert redis_client.dbsize() == 0


# ----------------------------------------------------------------------------- RateLimited


async def pause_ends(client: QueueClient, queue: str) -> list[int]:
    """The ends (ms) of the pauses RateLimited asked for, from the queue's events (which a
    test asks for, with :func:`watch_events`, before its jobs run)."""
    events, _ = await client.read_events(queue, "0-0")
    return [int(e.fields["until"]) for e in events if e.type == "rate_limited"]


async def watch_events(client: QueueClient, queue: str) -> None:
    """Ask the queue to write every event (``rate_limited`` is not a job's end)."""
    await client.read_events(queue)


def ms(when: datetime | None) -> int:
    assert when is not None
    return int(when.timestamp() * 1000)


@pytest.mark.parametrize("executor", EXECUTORS)
async def test_rate_limited_pauses_the_whole_queue_and_uses_no_attempt(
        redis_url: str, executor: str) -> None:
    queue = f"cap-throttle-{executor}"
    async with run_worker(capabilities_app.queues, queue, redis_url, concurrency=1), \
            QueueClient(redis_url) as client:
        await watch_events(client, queue)
        refused = await client.queue(queue).add(
            {"url": redis_url, "limited": 1, "retry_after": 0.4})
        behind = await client.queue(queue).add({"url": redis_url})
        assert await refused.result(timeout=20) == {"attempt": 1, "runs": 2}
        assert await behind.result(timeout=20) == {"attempt": 1, "runs": 1}
        [until] = await pause_ends(client, queue)
        first, second = await refused.info(), await behind.info()
    # No job of the queue started during the pause: the refused one went back to its place
    # at the front, and the one behind it waited too.
    assert ms(first.started_at) >= until and ms(second.started_at) >= until
    assert first.attempts == 1
    [entry] = first.history
    assert (entry["type"], entry["attempt"], entry["retry_after_ms"]) == ("RateLimited", 1, 400)


async def test_rate_limited_in_a_keyed_queue_pauses_only_that_key(redis_url: str) -> None:
    queue = "cap-throttle-keyed"
    async with run_worker(capabilities_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        await watch_events(client, queue)
        handle = client.queue(queue)
        refused = await handle.add({"url": redis_url, "limited": 1, "retry_after": 0.5},
                                   key="api-a")
        same_key = await handle.add({"url": redis_url}, key="api-a")
        await async_wait_until(lambda: _has_pause(client, queue), what="the key's pause")
        other_key = await handle.add({"url": redis_url}, key="api-b")
        for job in (refused, same_key, other_key):
            await job.result(timeout=20)
        [until] = await pause_ends(client, queue)
        infos = [await job.info() for job in (refused, same_key, other_key)]
    assert ms(infos[0].started_at) >= until and ms(infos[1].started_at) >= until
    assert ms(infos[2].started_at) < until  # another key ran during the pause
    assert infos[0].attempts == 1


async def _has_pause(client: QueueClient, queue: str) -> bool:
    return bool(await pause_ends(client, queue))


async def test_explain_names_a_handlers_pause_and_resume_ends_it(redis_url: str) -> None:
    queue = "cap-throttle-inline"
    async with run_worker(capabilities_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        await watch_events(client, queue)
        refused = await client.queue(queue).add(
            {"url": redis_url, "limited": 1, "retry_after": 600})
        await async_wait_until(lambda: _has_pause(client, queue), what="the queue's pause")
        waiting = await client.queue(queue).add({"url": redis_url})
        explanation = await client.explain(queue, waiting.id)
        await client.resume(queue)  # ends the pause at once
        assert await waiting.result(timeout=20) == {"attempt": 1, "runs": 1}
        assert (await refused.result(timeout=20))["runs"] == 2
    assert explanation.reason == "rate_limited"
    assert "raised RateLimited" in explanation.detail


@pytest.mark.parametrize("executor", ["inline", "subprocess"])
async def test_an_unusable_retry_after_fails_the_attempt(redis_url: str, executor: str) -> None:
    queue = f"cap-throttle-{executor}"
    async with run_worker(capabilities_app.queues, queue, redis_url), \
            QueueClient(redis_url) as client:
        await watch_events(client, queue)
        job = await client.queue(queue).add({"bad": "nan"})
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=20)
        assert not await pause_ends(client, queue)
    assert failed.value.error is not None and failed.value.error.type == "InvalidRateLimited"
    assert "got nan" in failed.value.error.message


# ----------------------------------------------------------------------------- the scripts


def test_snooze_script_delays_the_job_and_gives_back_its_attempt(store: ScriptStore) -> None:
    job_id = store.add_one()
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


def test_snooze_script_refuses_a_job_whose_lock_it_does_not_hold(store: ScriptStore) -> None:
    job_id = store.add_one()
    assert store.claim("w:1") == [job_id]
    assert store.snooze(job_id, "someone-else", 1_000) == [Status.LOCK_LOST]
    assert store.field(job_id, "s") == "active" and store.field(job_id, "sn") is None


def test_snooze_of_zero_puts_the_job_back_to_waiting(store: ScriptStore) -> None:
    job_id = store.add_one()
    store.claim("w:1")
    assert store.snooze(job_id, "w:1", 0)[0] == Status.SNOOZED
    assert store.field(job_id, "s") == "waiting"
    assert store.claim("w:2") == [job_id] and store.field(job_id, "a") == "1"


def test_snooze_script_fails_the_job_past_the_cap(store: ScriptStore) -> None:
    job_id = store.add_one()
    for n in (1, 2):
        assert store.claim(f"w:{n}") == [job_id]
        assert store.snooze(job_id, f"w:{n}", 0, cap=1)[0] == (
            Status.SNOOZED if n == 1 else Status.FAILED)
    assert store.field(job_id, "s") == "failed"
    assert store.field(job_id, "fr") == "max_snoozes_exceeded"
    assert store.t.client.zscore(store.keys.failed, job_id) is not None


def test_claim_ends_expired_jobs_and_takes_the_next_in_the_same_call(store: ScriptStore) -> None:
    expired = [store.add_one(expires_at_ms=1), store.add_one(expires_at_ms=1)]  # born past: at once
    assert [store.field(i, "fr") for i in expired] == ["expired", "expired"]
    soon = [store.add_one(expires_in_ms=60_000) for _ in range(2)]
    store.t.client.hset(store.keys.job(soon[0]), "x", 1)  # its deadline has passed
    later = store.add_one()
    jobs, _ = parse_claim(store.call(SCRIPTS.claim, "w:1", 30_000, 2))
    assert [j.id for j in jobs] == [soon[1], later]
    assert store.field(soon[0], "s") == "cancelled" and store.field(soon[0], "fr") == "expired"
    # A started job leaves the deadline set: it cannot expire while it runs.
    assert store.t.client.zrange(store.keys.expires, 0, -1) == []


def test_keyed_claim_skips_an_expired_job_of_a_key_for_its_next_one(
        redis_url: str, queue_name: str) -> None:
    transport = SyncTransport(redis_url)
    try:
        keys = QueueKeys(queue_name)
        store = ScriptStore(transport, keys)
        assert store.call(SCRIPTS.setup, "keyed", 1, 0, 0, 0, 1, -1, 0) == [b"ok"]
        first = store.add_one(key="a", expires_in_ms=60_000)
        second = store.add_one(key="a")
        transport.client.hset(keys.job(first), "x", 1)
        assert store.claim("w:1") == [second]
        assert store.field(first, "fr") == "expired"
        assert int(transport.client.hget(keys.key_active, "a") or 0) == 1
    finally:
        transport.close()


def test_expire_sweep_ends_waiting_jobs_past_their_deadline_and_leaves_running_ones(
        store: ScriptStore) -> None:
    running, waiting, kept = (store.add_one(expires_in_ms=60_000) for _ in range(3))
    assert store.claim("w:1") == [running]
    for job_id in (waiting, running):
        store.t.client.hset(store.keys.job(job_id), "x", 1)
        store.t.client.zadd(store.keys.expires, {job_id: 1})
    assert store.call(SCRIPTS.expire, 100) == 1
    assert store.field(waiting, "s") == "cancelled" and store.field(waiting, "fr") == "expired"
    assert store.field(running, "s") == "active" and store.field(kept, "s") == "waiting"
    assert store.t.client.zrange(store.keys.expires, 0, -1) == [kept.encode()]


def test_a_retried_job_is_back_under_its_deadline(store: ScriptStore) -> None:
    job_id = store.add_one(expires_in_ms=60_000)
    assert store.claim("w:1") == [job_id]
    assert store.t.client.zscore(store.keys.expires, job_id) is None
    entry = encode({"attempt": 1, "type": "ValueError", "message": "boom"})
    error = encode({"type": "ValueError", "message": "boom"})
    reply = store.call(SCRIPTS.fail, job_id, "w:1", error, entry, 3, 60_000, 0, "", -1, 0, "",
                       1000)
    assert reply[0] == Status.RETRY_DELAYED
    assert store.t.client.zscore(store.keys.expires, job_id) == int(store.field(job_id, "x"))


def rate_limit(store: ScriptStore, job_id: str, token: str, retry_after_ms: int,
               request: str = "") -> list[Any]:
    entry = encode({"attempt": 1, "type": "RateLimited", "retry_after_ms": retry_after_ms})
    return list(store.call(SCRIPTS.rate_limited, job_id, token, retry_after_ms, entry, -1, 0,
                           request, 30_000))


def test_rate_limited_script_requeues_at_the_front_and_pauses_the_queue(store: ScriptStore) -> None:
    first, second = store.add_one(), store.add_one()
    assert store.claim("w:1") == [first]
    assert rate_limit(store, first, "w:1", 60_000, request="w:2")[0] == Status.RATE_LIMITED
    assert store.field(first, "s") == "waiting" and store.field(first, "a") == "0"
    # Nothing starts while the pause lasts; the claim says how long it has to go.
    reply = store.call(SCRIPTS.claim, "w:3", 30_000, 2)
    assert reply[0] == 0 and 59_000 < reply[1] <= 60_000
    # A resend answers the same and changes nothing.
    pause = store.t.client.hget(store.keys.meta, "pu")
    assert rate_limit(store, first, "w:1", 60_000, request="w:2")[0] == Status.RATE_LIMITED
    assert store.t.client.hget(store.keys.meta, "pu") == pause and store.field(first, "a") == "0"
    store.t.client.hset(store.keys.meta, "pu", 1)  # the pause is over
    assert store.claim("w:4") == [first]  # back at its place, ahead of the second
    # Another job's shorter pause leaves the longer one as it is.
    store.t.client.hset(store.keys.meta, "pu", pause or 0)
    assert rate_limit(store, first, "w:4", 10)[0] == Status.RATE_LIMITED
    assert store.t.client.hget(store.keys.meta, "pu") == pause
    assert store.field(second, "s") == "waiting"


def test_rate_limited_script_refuses_a_job_whose_lock_it_does_not_hold(store: ScriptStore) -> None:
    job_id = store.add_one()
    store.claim("w:1")
    assert rate_limit(store, job_id, "not-mine", 60_000) == [Status.LOCK_LOST]
    assert store.t.client.hget(store.keys.meta, "pu") is None
    assert store.field(job_id, "s") == "active"


def test_rate_limited_script_pauses_only_the_key_in_keyed_mode(
        redis_url: str, queue_name: str) -> None:
    transport = SyncTransport(redis_url)
    try:
        keys = QueueKeys(queue_name)
        store = ScriptStore(transport, keys)
        assert store.call(SCRIPTS.setup, "keyed", 1, 0, 0, 0, 1, -1, 0) == [b"ok"]
        a1, a2, b1 = store.add_one(key="a"), store.add_one(key="a"), store.add_one(key="b")
        assert store.claim("w:1") == [a1]
        assert rate_limit(store, a1, "w:1", 60_000)[0] == Status.RATE_LIMITED
        assert transport.client.zscore(keys.limited, "a") is not None
        assert transport.client.hget(keys.meta, "pu") is None
        jobs, _ = parse_claim(store.call(SCRIPTS.claim, "w:2", 30_000, 3))
        assert [j.id for j in jobs] == [b1]  # key a waits out its pause, with a1 and a2
        assert {store.field(a1, "s"), store.field(a2, "s")} == {"waiting"}
    finally:
        transport.close()


def test_the_cli_explains_an_expired_job(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        job = client.queue("cap-expiry").add({}, expires=datetime.now(UTC) - timedelta(1))
    proc = run_cli("explain", "cap-expiry", job.id, "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    assert f"{job.id}: cancelled (expired): expired at" in proc.stdout
