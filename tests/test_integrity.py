"""Integrity of the queue's data under unusual but legal use: repeated and vanishing
dependencies, retention in the middle of a failure cascade, retries of dependency graphs, ids
reused after removal, a wait order past 2^32 enqueues, out-of-range options and partial job
hashes. Each test states the guarantee it holds."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panqueue import (
    Backoff,
    ConfigError,
    Dedup,
    FlowJob,
    Job,
    JobNotFound,
    JobState,
    QueueClient,
    Registry,
    Retention,
)
from panqueue._codec import encode
from panqueue._job import ErrorInfo
from panqueue._keys import QueueKeys
from panqueue._store import ops
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import NewJob, encode_error
from panqueue._store.status import Status
from panqueue._store.transitions import parse_claim
from panqueue._store.transport import ScriptCall, SyncTransport
from panqueue.testing import drain, run_worker
from tests.bounds import examples

pytestmark = pytest.mark.anyio


def echo_registry(queue: str, order: list[str] | None = None, **options: Any) -> Registry:
    """A handler that records the order it ran jobs in, returns their data, and fails the jobs
    whose data is "fail"."""
    registry = Registry()

    @registry.handler(queue, **options)
    async def echo(job: Job) -> Any:
        if order is not None:
            order.append(job.id)
        if job.data == "fail":
            raise RuntimeError("asked to fail")
        return job.data

    return registry


async def state_of(client: QueueClient, queue: str, job_id: str) -> JobState:
    return (await client.get_job(queue, job_id)).state


# ----------------------------------------------------------------------------- repeated ids


async def test_a_dependency_named_twice_releases_its_dependent(redis_url: str,
                                                               queue_name: str) -> None:
    order: list[str] = []
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = await queue.add("a", job_id="a")
        second = await queue.add("b", job_id="b", depends_on=["a", "a"])
        assert await state_of(client, queue_name, second.id) is JobState.BLOCKED
        async with run_worker(echo_registry(queue_name, order), queue_name, redis_url):
            assert await second.result(timeout=5) == "b"
        assert order == [first.id, second.id]


async def test_a_flow_item_depending_twice_on_the_same_item_runs(redis_url: str,
                                                                  queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        root, join = await client.queue(queue_name).add_flow([
            FlowJob("root"), FlowJob("join", depends_on=[0, 0])])
        async with run_worker(echo_registry(queue_name), queue_name, redis_url):
            assert await join.result(timeout=5) == "join"
        assert await state_of(client, queue_name, root.id) is JobState.COMPLETED


# ----------------------------------------------------------------------------- retention


async def test_a_failure_cascade_under_zero_failed_retention_strands_no_dependent(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = echo_registry(queue_name, retention=Retention(failed=0))
    async with QueueClient(redis_url) as client:
        a, b, c = await client.queue(queue_name).add_chain(["fail", "b", "c"])
        async with run_worker(registry, queue_name, redis_url):
            counts = await drain(redis_url, queue_name, timeout=5)
    assert counts[JobState.BLOCKED] == 0 and counts[JobState.FAILED] == 0  # trimmed at once
    failed = {entry[b"id"].decode(): entry.get(b"fr")
              for _, entry in redis_client.xrange(QueueKeys(queue_name).events)
              if entry[b"ev"] == b"failed"}
    assert failed == {a.id: b"max_attempts_exceeded", b.id: b"dependency_failed",
                      c.id: b"dependency_failed"}
    # Nothing of the three jobs is left behind: no hash, no dependency edge.
    assert [k for k in redis_client.scan_iter() if b"job:" in k or b"deps:" in k
            or b"needs:" in k] == []


# ----------------------------------------------------------------------------- retry


async def fail_a_then_b(redis_url: str, queue_name: str, client: QueueClient
                        ) -> tuple[str, str]:
    """A fails; B (depends on A) fails with dependency_failed. Returns their ids."""
    a = await client.queue(queue_name).add("fail", job_id="a")
    b = await client.queue(queue_name).add("b", job_id="b", depends_on=["a"])
    async with run_worker(echo_registry(queue_name), queue_name, redis_url):
        await drain(redis_url, queue_name, timeout=5)
    info = await client.get_job(queue_name, b.id)
    assert (info.state, info.failure_reason) == (JobState.FAILED, "dependency_failed")
    return a.id, b.id


def rewrite_data(redis_client: redis.Redis, queue: str, job_id: str, data: Any) -> None:
    """Make a failed job succeed on its next run."""
    redis_client.hset(QueueKeys(queue).job(job_id), "d", encode(data))


@pytest.mark.parametrize("ids", [["b", "a"], ["a", "b"], None])
async def test_retrying_a_dependency_with_its_dependent_blocks_the_dependent_until_it_completes(
        redis_url: str, queue_name: str, redis_client: redis.Redis,
        ids: list[str] | None) -> None:
    async with QueueClient(redis_url) as client:
        a, b = await fail_a_then_b(redis_url, queue_name, client)
        rewrite_data(redis_client, queue_name, a, "a")
        assert await client.retry_failed(queue_name, ids) == 2  # in any order, or all at once
        assert await state_of(client, queue_name, a) is JobState.WAITING
        assert await state_of(client, queue_name, b) is JobState.BLOCKED
        order: list[str] = []
        async with run_worker(echo_registry(queue_name, order), queue_name, redis_url):
            assert await client.queue(queue_name).job(b).result(timeout=5) == "b"
        assert order == [a, b]


async def test_retrying_a_dependent_alone_after_its_dependency_was_retried_blocks_it(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        a, b = await fail_a_then_b(redis_url, queue_name, client)
        rewrite_data(redis_client, queue_name, a, "a")
        assert await client.retry_failed(queue_name, [a]) == 1
        assert await client.retry_failed(queue_name, [b]) == 1
        assert await state_of(client, queue_name, b) is JobState.BLOCKED


async def test_retrying_a_dependent_whose_dependency_is_still_failed_leaves_it_failed(
        redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        a, b = await fail_a_then_b(redis_url, queue_name, client)
        assert await client.retry_failed(queue_name, [b]) == 0
        info = await client.get_job(queue_name, b)
        assert (info.state, info.failure_reason) == (JobState.FAILED, "dependency_failed")
        assert info.error is not None and f"dependency {a}" in info.error.message
        assert "failed" in info.error.message
        assert (await client.counts(queue_name))[JobState.WAITING] == 0


async def test_a_dependent_retried_after_its_retried_dependency_completed_and_was_trimmed_runs(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = echo_registry(queue_name, retention=Retention(completed=0))
    async with QueueClient(redis_url) as client:
        a, b = await fail_a_then_b(redis_url, queue_name, client)
        rewrite_data(redis_client, queue_name, a, "a")
        assert await client.retry_failed(queue_name, [a]) == 1
        async with run_worker(registry, queue_name, redis_url):
            await drain(redis_url, queue_name, timeout=5)
            with pytest.raises(JobNotFound):
                await client.get_job(queue_name, a)  # completed, then deleted by retention
            # B learned that A completed, so retrying it now runs it.
            assert await client.retry_failed(queue_name, [b]) == 1
            await drain(redis_url, queue_name, timeout=5)
        events = [entry[b"id"] for _, entry in redis_client.xrange(QueueKeys(queue_name).events)
                  if entry[b"ev"] == b"completed"]
        assert events == [a.encode(), b.encode()]


async def test_a_dependent_of_a_cancelled_job_cannot_be_retried(redis_url: str,
                                                                 queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        await queue.add("a", job_id="a", delay=60)
        await queue.add("b", job_id="b", depends_on=["a"])
        await client.cancel(queue_name, "a")
        assert await client.retry_failed(queue_name, ["b"]) == 0
        info = await client.get_job(queue_name, "b")
        assert info.state is JobState.FAILED and info.error is not None
        assert "dependency a" in info.error.message


# ----------------------------------------------------------------------------- edges


def keys_of(queue: str) -> QueueKeys:
    return QueueKeys(queue)


async def gone_by_remove(client: QueueClient, queue: str, r: redis.Redis) -> None:
    assert await client.remove(queue, "b")


async def gone_by_cancel_and_count_trim(client: QueueClient, queue: str, r: redis.Redis
                                        ) -> None:
    r.hset(keys_of(queue).meta, "kf", 0)  # the queue keeps no failed or cancelled job
    assert await client.cancel(queue, "b") is JobState.BLOCKED


async def gone_by_dependency_failure_and_count_trim(client: QueueClient, queue: str,
                                                    r: redis.Redis) -> None:
    r.hset(keys_of(queue).meta, "kf", 0)
    await client.cancel(queue, "f")  # b depends on f too: it fails, and is trimmed at once


async def gone_by_dependency_failure_and_age_trim(client: QueueClient, queue: str,
                                                  r: redis.Redis) -> None:
    await client.cancel(queue, "f")
    assert await state_of(client, queue, "b") is JobState.FAILED
    await anyio.sleep(0.01)
    assert await client._run(ops.clean(keys_of(queue), -1, 0)) == 2  # f and b


async def gone_by_dedup_replace(client: QueueClient, queue: str, r: redis.Redis) -> None:
    await client.queue(queue).add("c", job_id="c", dedup=Dedup("dk", strategy="replace"))


@pytest.mark.parametrize("make_b_gone", [
    gone_by_remove, gone_by_cancel_and_count_trim, gone_by_dependency_failure_and_count_trim,
    gone_by_dependency_failure_and_age_trim, gone_by_dedup_replace])
async def test_a_job_reusing_the_id_of_a_deleted_dependent_inherits_none_of_its_edges(
        redis_url: str, queue_name: str, redis_client: redis.Redis, make_b_gone: Any) -> None:
    keys = keys_of(queue_name)
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        await queue.add("a", job_id="a")
        await queue.add("f", job_id="f", delay=60)
        await queue.add("x", job_id="x", delay=60)
        await queue.add("b", job_id="b", depends_on=["a", "f"],
                        dedup=Dedup("dk", strategy="replace"))
        await make_b_gone(client, queue_name, redis_client)
        with pytest.raises(JobNotFound):
            await client.get_job(queue_name, "b")
        assert b"b" not in redis_client.smembers(keys.prefix + "deps:a")
        # A new "b" that waits for x only: a's completion must not release it.
        reused = await queue.add("new b", job_id="b", depends_on=["x"])
        assert reused.created
        async with run_worker(echo_registry(queue_name), queue_name, redis_url):
            await queue.job("a").result(timeout=5)
            await anyio.sleep(0.2)
        assert await state_of(client, queue_name, "b") is JobState.BLOCKED


async def test_cancelling_a_job_removes_its_dependency_edges(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    keys = keys_of(queue_name)
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        await queue.add("a", job_id="a", delay=60)
        await queue.add("b", job_id="b", depends_on=["a"])
        await queue.add("c", job_id="c", depends_on=["b"])
        assert await client.cancel(queue_name, "b") is JobState.BLOCKED
        assert await state_of(client, queue_name, "c") is JobState.FAILED
        # Neither the jobs waiting for b, nor b's place among the jobs waiting for a, remain.
        assert not redis_client.exists(keys.prefix + "deps:b")
        assert redis_client.smembers(keys.prefix + "deps:a") == set()


# ----------------------------------------------------------------------------- batches


async def test_a_dependency_on_a_batch_item_that_deduplicated_to_another_job_follows_that_job(
        redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        existing = await queue.add("existing", dedup=Dedup("dk"))
        kept, dependent = await queue.add_flow([
            FlowJob("x", job_id="x", options={"dedup": Dedup("dk")}),
            FlowJob("after x", depends_on=[0])])
        assert (kept.id, kept.created) == (existing.id, False)
        assert await state_of(client, queue_name, dependent.id) is JobState.BLOCKED
        order: list[str] = []
        async with run_worker(echo_registry(queue_name, order), queue_name, redis_url):
            assert await dependent.result(timeout=5) == "after x"
        assert order == [existing.id, dependent.id]


async def test_a_dependency_on_a_batch_item_replaced_later_in_the_batch_fails_the_dependent(
        redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        _, _, dependent = await client.queue(queue_name).add_flow([
            FlowJob("x", job_id="x", options={"dedup": Dedup("dk")}),
            FlowJob("y", job_id="y", options={"dedup": Dedup("dk", strategy="replace")}),
            FlowJob("after x", depends_on=[0])])
        with pytest.raises(JobNotFound):
            await client.get_job(queue_name, "x")
        info = await client.get_job(queue_name, dependent.id)
        assert (info.state, info.failure_reason) == (JobState.FAILED, "dependency_failed")
        assert info.error is not None and "dependency x" in info.error.message
        assert (await client.counts(queue_name))[JobState.BLOCKED] == 0


# ----------------------------------------------------------------------------- wait order


@pytest.fixture
def transport(redis_url: str) -> Iterator[SyncTransport]:
    t = SyncTransport(redis_url)
    yield t
    t.close()


def claim_ids(t: SyncTransport, keys: QueueKeys, token: str, n: int) -> list[str]:
    jobs, _ = parse_claim(t.execute(ScriptCall(SCRIPTS.claim, (keys.prefix,),
                                               (token, 30_000, n))))
    return [job.id for job in jobs]


def add_one(t: SyncTransport, keys: QueueKeys, job_id: str, priority: int = 0) -> None:
    t.run(ops.add_jobs(keys, [NewJob(job_id, encode(job_id), priority=priority)]))


def test_fifo_within_a_priority_holds_past_2_to_the_32_enqueues(
        transport: SyncTransport, queue_name: str, redis_client: redis.Redis) -> None:
    keys = keys_of(queue_name)
    redis_client.hset(keys.meta, "seq", 2**32 - 3)
    for job_id in ("j1", "j2", "j3", "j4"):  # a priority of their own: the sorted set's order
        add_one(transport, keys, job_id, priority=1)
    add_one(transport, keys, "urgent", priority=5)
    assert claim_ids(transport, keys, "t1", 10) == ["urgent", "j1", "j2", "j3", "j4"]
    # The counter restarted low: scores stay exact integers in a double.
    assert int(redis_client.hget(keys.meta, "seq") or 0) < 2**32


def test_a_job_requeued_after_the_wait_order_was_renumbered_goes_before_later_arrivals(
        transport: SyncTransport, queue_name: str, redis_client: redis.Redis) -> None:
    keys = keys_of(queue_name)
    redis_client.hset(keys.meta, "seq", 2**32 - 3)
    add_one(transport, keys, "j1", priority=1)  # not the default: it keeps its place
    add_one(transport, keys, "j2", priority=1)
    assert claim_ids(transport, keys, "t1", 1) == ["j1"]
    add_one(transport, keys, "j3", priority=1)  # passes 2^32: the wait order is renumbered
    add_one(transport, keys, "j4", priority=1)
    redis_client.zadd(keys.active, {"j1": 0})  # j1's lock expired: its worker is gone
    stall = encode_error(ErrorInfo("Stalled", "stalled"))
    assert transport.execute(ScriptCall(SCRIPTS.stalled, (keys.prefix,),
                                        (1, 1000, -1, stall))) == [1, 0]
    assert claim_ids(transport, keys, "t2", 10) == ["j1", "j2", "j3", "j4"]


# ----------------------------------------------------------------------------- validation


def assert_no_job_written(r: redis.Redis) -> None:
    assert [k for k in r.scan_iter()
            if b"job:" in k or k.endswith((b":wait", b":wl", b":delayed"))] == []


# Built inside the test: some of these objects refuse to be constructed at all.
OUT_OF_RANGE: list[tuple[str, Any]] = [
    ("Dedup.ttl", lambda: {"dedup": Dedup("k", ttl=1e14)}),
    ("delay", lambda: {"delay": 1e300}),
    ("delay", lambda: {"delay": float("inf")}),
    ("run_at", lambda: {"run_at": datetime(9999, 1, 1, tzinfo=UTC)}),
    ("priority", lambda: {"priority": 10**7}),
    ("timeout", lambda: {"timeout": float("inf")}),
    ("timeout", lambda: {"timeout": 1e300}),
    ("attempts", lambda: {"attempts": 10**20}),
    ("backoff delay", lambda: {"backoff": Backoff.fixed(1e300)}),
    ("backoff max", lambda: {"backoff": Backoff.exponential(1.0, max=float("inf"))}),
]


@pytest.mark.parametrize(("problem", "options"), OUT_OF_RANGE)
async def test_out_of_range_options_are_refused_before_anything_is_written(
        redis_url: str, queue_name: str, redis_client: redis.Redis, problem: str,
        options: Any) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        with pytest.raises(ConfigError, match=problem):
            await queue.add("x", **options())
        with pytest.raises(ConfigError, match=problem):
            await queue.add_flow([FlowJob("ok"), FlowJob("bad", options=options())])
    assert_no_job_written(redis_client)


@pytest.mark.parametrize(("defaults", "problem"), [
    ({"delay": 1e300}, "delay"), ({"timeout": 1e300}, "timeout"),
    ({"priority": -10**7}, "priority")])
async def test_add_bulk_with_out_of_range_queue_defaults_writes_nothing(
        redis_url: str, queue_name: str, redis_client: redis.Redis, defaults: dict[str, Any],
        problem: str) -> None:
    async with QueueClient(redis_url) as client:
        with pytest.raises(ConfigError, match=problem):
            await client.queue(queue_name, **defaults).add_bulk([1, 2, 3])
    assert_no_job_written(redis_client)


def test_a_handler_with_an_out_of_range_lock_ttl_is_refused() -> None:
    with pytest.raises(ConfigError, match="lock_ttl"):
        echo_registry("q", lock_ttl=1e300)


@pytest.mark.parametrize(("bad", "problem"), [
    ({"dedup_key": "k", "dedup_ttl_ms": 10**17, "dedup_strategy": "keep"}, "dedup ttl"),
    ({"dedup_key": "k", "dedup_ttl_ms": 1000, "dedup_strategy": "merge"}, "dedup strategy"),
    ({"delay_ms": 10**17}, "delay"),
    ({"run_at_ms": 10**17}, "run_at"),
    ({"priority": 10**7}, "priority"),
])
def test_the_add_script_refuses_a_batch_with_one_bad_item_and_writes_nothing(
        transport: SyncTransport, queue_name: str, redis_client: redis.Redis,
        bad: dict[str, Any], problem: str) -> None:
    """The script checks every item before it writes any: a producer that skipped the Python
    checks still cannot leave half a batch behind."""
    keys = keys_of(queue_name)
    good = NewJob("good", encode(1), dedup_key="other", dedup_ttl_ms=1000,
                  dedup_strategy="keep")
    with pytest.raises(ConfigError, match=f"item 1: {problem}"):
        transport.run(ops.add_jobs(keys, [good, NewJob("bad", encode(2), **bad)]))
    assert redis_client.keys() == []


# ----------------------------------------------------------------------------- partial hashes


async def test_a_job_hash_without_a_state_is_not_reported_as_a_job(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    keys = keys_of(queue_name)
    redis_client.hset(keys.job("ghost"), mapping={"d": encode("left over"), "a": 1})
    async with QueueClient(redis_url) as client:
        with pytest.raises(JobNotFound):
            await client.get_job(queue_name, "ghost")
        with pytest.raises(JobNotFound):
            await client.queue(queue_name).job("ghost").info()


# ----------------------------------------------------------------------------- the graph


ID_POOL = [f"j{i}" for i in range(6)]  # few ids, so that ids are reused after deletions
PENDING = {b"waiting", b"delayed", b"blocked", b"active"}
STATE_SETS = {b"waiting": "wait", b"delayed": "delayed", b"blocked": "blocked",
              b"active": "active", b"completed": "completed", b"failed": "failed",
              b"cancelled": "cancelled"}

# add: the id, dependencies (indexes into the jobs that exist, so repeats happen), delayed?
ADD = st.tuples(st.just("add"), st.integers(0, 5), st.lists(st.integers(0, 5), max_size=3),
                st.sampled_from([False, False, True]))
CLAIM = st.tuples(st.just("claim"), st.integers(1, 3))
FINISH = st.tuples(st.sampled_from(["complete", "fail"]), st.integers(0, 10),
                   st.sampled_from([-1, 0, 2]))  # the finished set's retention
GRAPH_OPS = st.lists(
    st.one_of(
        ADD, ADD, ADD, CLAIM, CLAIM, FINISH, FINISH, FINISH,
        st.tuples(st.just("cancel"), st.integers(0, 5)),
        st.tuples(st.just("remove"), st.integers(0, 5)),
        st.tuples(st.just("retry"), st.lists(st.integers(0, 5), max_size=3)),
        st.tuples(st.just("retry"), st.lists(st.integers(0, 5), max_size=3)),
        st.tuples(st.just("clean"),),
        st.tuples(st.just("expire_and_sweep"),),
        st.tuples(st.just("promote_all"),),
    ),
    min_size=10,
    max_size=50,
)


def check_graph(r: redis.Redis, keys: QueueKeys) -> None:
    """Each job is in exactly the state set its state names; every dependency edge is
    recorded on both sides, between two jobs that exist, and only while the dependency may
    still complete; a blocked job waits only for jobs that may still complete."""
    jobs = {i: h for i in ID_POOL if (h := r.hgetall(keys.job(i)))}
    members: dict[str, list[bytes]] = {}
    for state, attr in STATE_SETS.items():
        for member in r.zrange(getattr(keys, attr), 0, -1):
            members.setdefault(member.decode(), []).append(state)
    for member in r.lrange(keys.wait_list, 0, -1):  # the default priority's waiting jobs
        members.setdefault(member.decode(), []).append(b"waiting")
    assert set(members) == set(jobs)
    states = {i: h[b"s"] for i, h in jobs.items()}
    for job_id, state in states.items():
        assert members[job_id] == [state], (job_id, members[job_id], state)

    def edge_set(kind: str, job_id: str) -> set[str]:
        return {m.decode() for m in r.smembers(f"{keys.prefix}{kind}:{job_id}")}

    for job_id in ID_POOL:
        dependents, needs = edge_set("deps", job_id), edge_set("needs", job_id)
        if job_id not in jobs:
            assert not dependents and not needs, f"edges of deleted job {job_id}"
            continue
        for dependent in dependents:
            assert job_id in edge_set("needs", dependent)
        for dep in needs:
            assert dep in jobs and job_id in edge_set("deps", dep)
            assert states[dep] not in (b"completed", b"cancelled")
        if states[job_id] == b"blocked":
            assert needs and all(states[dep] in PENDING for dep in needs), job_id


@settings(max_examples=examples(50, 150), deadline=None,  # 150 with --long
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=GRAPH_OPS)
def test_dependency_graph_invariants_under_any_interleaving(
        redis_url: str, steps: list[tuple[Any, ...]]) -> None:
    """Random adds with dependencies (repeated, on reused ids), completions, failures with and
    without retention, cancels, removes, retries and cleans: the invariants of check_graph
    hold after every step, and no job ever starts before the jobs it was added to wait for
    (those very jobs, not later ones reusing their ids) have completed."""
    t = SyncTransport(redis_url)
    t.client.flushdb()
    keys = QueueKeys("graph")
    stall = encode_error(ErrorInfo("Stalled", "stalled"))
    entry = encode({"attempt": 1, "type": "ValueError", "message": "boom"})

    def call(script: Any, *args: Any) -> Any:
        return t.execute(ScriptCall(script, (keys.prefix,), args))

    serial: dict[str, int] = {}  # id -> the serial of the job that holds it now
    waits_for: dict[int, set[int]] = {}  # job serial -> serials of its dependencies
    completed: set[int] = set()
    active: list[tuple[str, str]] = []
    tokens = 0
    try:
        for op in steps:
            kind = op[0]
            if kind == "add":
                _, target, dep_idx, delayed = op
                job_id = ID_POOL[target]
                others = [i for i in ID_POOL if i != job_id and t.client.exists(keys.job(i))]
                existing = [others[d % len(others)] for d in dep_idx] if others else []
                [(_, created)] = t.run(ops.add_jobs(keys, [NewJob(
                    job_id, encode(job_id), depends_on=tuple(existing),
                    delay_ms=60_000 if delayed else 0)]))
                if created:
                    serial[job_id] = len(waits_for)
                    waits_for[serial[job_id]] = {serial[d] for d in existing}
            elif kind == "claim":
                tokens += 1
                token = f"w:{tokens}"
                for job_id in claim_ids(t, keys, token, op[1]):
                    started = serial[job_id]
                    assert waits_for[started] <= completed, f"{job_id} started too early"
                    active.append((job_id, token))
            elif kind in ("complete", "fail") and active:
                job_id, token = active.pop(op[1] % len(active))
                if kind == "complete":
                    reply = call(SCRIPTS.complete, op[2], "", 1000, 1, job_id, token,
                                 encode("ok"), 0)
                    if reply[0] == Status.COMPLETED:
                        assert serial[job_id] not in completed
                        completed.add(serial[job_id])
                else:
                    call(SCRIPTS.fail, job_id, token, encode_error(ErrorInfo("E", "boom")),
                         entry, 1, 0, 0, "", op[2], 0, "", 1000)
            elif kind == "cancel":
                call(SCRIPTS.cancel, ID_POOL[op[1]], -1)
            elif kind == "remove":
                call(SCRIPTS.remove, ID_POOL[op[1]], "")
            elif kind == "retry":
                call(SCRIPTS.retry, 1000, *(ID_POOL[i] for i in op[1]))
            elif kind == "clean":
                call(SCRIPTS.clean, 0, 0, 1000)
            elif kind == "expire_and_sweep":
                for member in t.client.zrange(keys.active, 0, -1):
                    t.client.zadd(keys.active, {member: 0})
                call(SCRIPTS.stalled, 1, 1000, -1, stall)
                active = []
            elif kind == "promote_all":
                for member in t.client.zrange(keys.delayed, 0, -1):
                    t.client.zadd(keys.delayed, {member: 0})
                call(SCRIPTS.promote)
            check_graph(t.client, keys)
    finally:
        t.close()
