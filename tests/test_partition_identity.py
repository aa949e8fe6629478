"""Idempotency across the partitions of a partitioned queue: a custom id and a dedup key name one
job wherever its key, its dependencies or its flow placed it (docs/scaling.md, "Idempotency"),
under concurrent producers, and after an add that stopped half-way."""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    ConfigError,
    Dedup,
    FlowJob,
    Job,
    JobState,
    QueueClient,
    Registry,
    Retention,
)
from panqueue._store.ops import identity
from panqueue.testing import drain, run_worker

pytestmark = pytest.mark.anyio

N = 4


def _home(name: str) -> int:
    """The partition a custom id (or ``"dd:" + dedup key``, or a concurrency key) routes to."""
    return zlib.crc32(name.encode()) % N


def _name_in(partition: int, prefix: str) -> str:
    """A custom id or a concurrency key that routes to ``partition``."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if _home(name) == partition:
            return name
    raise AssertionError("no name found")


def _dedup_in(partition: int, prefix: str) -> str:
    """A dedup key whose home is ``partition`` (it routes by ``"dd:" + key``)."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if _home("dd:" + name) == partition:
            return name
    raise AssertionError("no name found")


async def _where(client: QueueClient, queue: str, job_id: str) -> list[int]:
    """The partitions that hold a job with this id (exactly one, for a sound queue)."""
    parts = await client._run(client.producer.layouts.parts(queue))
    found = []
    for part in parts:
        if await client._run(_exists(part.job(job_id))):
            found.append(part.partition)
    return found


def _exists(key: str) -> Any:
    from panqueue._store.transport import Command

    return (yield Command(("EXISTS", key)))


def _keyed(registry: Registry, queue: str, ran: Counter[str]) -> Any:
    @registry.handler(queue, partitions=N, mode="keyed", concurrency=8)
    async def work(job: Job[Any]) -> None:
        ran[job.id] += 1

    return work


async def test_a_custom_id_placed_by_its_key_is_found_by_every_later_add(
        redis_url: str, queue_name: str) -> None:
    """job_id X first added with key K, which routes it away from X's home; adds of X with
    keys routing to X's home and to a third partition return the same job, get_job finds it,
    and it runs once."""
    registry = Registry()
    ran: Counter[str] = Counter()
    work = _keyed(registry, queue_name, ran)
    job_id = _name_in(0, "order")
    key = _name_in(1, "tenant")
    at_home = _name_in(0, "tenant")
    elsewhere = _name_in(2, "tenant")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        first = await queue.add("first", job_id=job_id, key=key)
        assert first.created and await _where(client, queue_name, job_id) == [1]
        for other in (at_home, elsewhere, key):
            again = await queue.add("again", job_id=job_id, key=other)
            assert (again.id, again.created) == (job_id, False), other
        assert await _where(client, queue_name, job_id) == [1]
        info = await client.get_job(queue_name, job_id)
        assert info.data == "first" and info.state == JobState.WAITING
        async with run_worker(registry, queue_name, redis_url):
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 1 and ran == {job_id: 1}


async def test_a_custom_id_placed_by_its_dependency_or_its_flow_is_found(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()
    ran: Counter[str] = Counter()

    @registry.handler(queue_name, partitions=N, concurrency=8)
    async def work(job: Job[Any]) -> None:
        ran[job.id] += 1

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        parent = (await queue.add_bulk(range(N)))[1]  # a generated id: in partition 1
        assert int(parent.id) % N == 1
        child_id = _name_in(3, "child")
        child = await queue.add("child", job_id=child_id, depends_on=[parent])
        assert child.created and await _where(client, queue_name, child_id) == [1]
        again = await queue.add("again", job_id=child_id)  # no dependency: routed to 3
        assert (again.id, again.created) == (child_id, False)
        # A flow goes where its first job's id routes it (2); its second job's id routes to 0.
        head_id, member_id = _name_in(2, "head"), _name_in(0, "member")
        flow = await queue.add_flow([FlowJob("head", job_id=head_id),
                                     FlowJob("member", depends_on=[0], job_id=member_id)])
        assert [h.created for h in flow] == [True, True]
        assert await _where(client, queue_name, member_id) == [2]
        again = await queue.add("again", job_id=member_id)
        assert (again.id, again.created) == (member_id, False)
        assert (await client.get_job(queue_name, member_id)).data == "member"
        async with run_worker(registry, queue_name, redis_url):
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == N + 3
        assert ran[child_id] == ran[member_id] == 1


async def test_a_dedup_key_returns_the_first_job_whatever_else_the_add_carries(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()
    ran: Counter[str] = Counter()
    work = _keyed(registry, queue_name, ran)
    dedup = Dedup(_dedup_in(0, "reindex"), ttl=60)
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        first = await queue.add("first", key=_name_in(1, "tenant"), dedup=dedup)
        assert first.created
        for index, key in enumerate(_name_in(p, f"k{p}") for p in range(N)):
            again = await queue.add("again", key=key, dedup=dedup,
                                    job_id=_name_in(index, f"id{index}"))
            assert (again.id, again.created) == (first.id, False), key
        # A custom id and a dedup key: the id is looked at first, then the dedup key.
        by_id = await queue.add("by id", key=_name_in(2, "t"), job_id=_name_in(3, "solo"))
        both = await queue.add("both", key=_name_in(1, "t"), job_id=by_id.id,
                               dedup=Dedup(_dedup_in(2, "other"), ttl=60))
        assert (both.id, both.created) == (by_id.id, False)
        fresh = await queue.add("fresh", key=_name_in(1, "t"), dedup=Dedup(
            _dedup_in(2, "other"), ttl=60))
        assert fresh.created and fresh.id != by_id.id
        assert (await client.counts(queue_name))[JobState.WAITING] == 3
        async with run_worker(registry, queue_name, redis_url):
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 3 and set(ran.values()) == {1}


async def test_a_dedup_replace_across_partitions_replaces_the_waiting_job(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()
    work = _keyed(registry, queue_name, Counter())
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        first = await queue.add("first", key=_name_in(1, "t"),
                                dedup=Dedup(_dedup_in(0, "r"), ttl=60, strategy="replace"))
        second = await queue.add("second", key=_name_in(2, "t"),
                                 dedup=Dedup(_dedup_in(0, "r"), ttl=60, strategy="replace"))
        assert second.created and second.id != first.id
        assert [j.id for j in await client.list_jobs(queue_name, JobState.WAITING)] == [second.id]
        third = await queue.add("third", key=_name_in(3, "t"),
                                dedup=Dedup(_dedup_in(0, "r"), ttl=60))
        assert (third.id, third.created) == (second.id, False)


async def test_racing_producers_create_one_job_per_identity(redis_url: str,
                                                           queue_name: str) -> None:
    """Sixteen producers, each on its own connection, add the same custom id (then the same
    dedup key) at once, with keys that route to every partition: one job each, and every
    producer gets its id."""
    registry = Registry()
    work = _keyed(registry, queue_name, Counter())
    job_id = _name_in(0, "race")
    dedup = Dedup(_dedup_in(3, "race"), ttl=60)
    by_id: list[tuple[str, bool]] = []
    by_dedup: list[tuple[str, bool]] = []

    async def produce(index: int) -> None:
        async with QueueClient(redis_url) as client:
            queue = client.queue(work)
            key = f"tenant-{index}"
            handle = await queue.add(index, job_id=job_id, key=key)
            by_id.append((handle.id, handle.created))
            handle = await queue.add(index, key=key, dedup=dedup)
            by_dedup.append((handle.id, handle.created))

    async with anyio.create_task_group() as tg:
        for index in range(16):
            tg.start_soon(produce, index)
    assert {i for i, _ in by_id} == {job_id} and sum(c for _, c in by_id) == 1
    assert len({i for i, _ in by_dedup}) == 1 and sum(c for _, c in by_dedup) == 1
    async with QueueClient(redis_url) as client:
        assert await _where(client, queue_name, job_id) in ([p] for p in range(N))
        assert (await client.counts(queue_name))[JobState.WAITING] == 2


async def test_an_add_stopped_between_its_steps_blocks_no_later_add(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """A producer that wrote the identity's pointer and died before adding the job: a later add
    creates the job (after the grace). A job removed, and a dedup key expired, leave nothing
    that blocks a new add either."""
    registry = Registry()
    work = _keyed(registry, queue_name, Counter())
    job_id = _name_in(0, "lost")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        await queue.add("declare", key="any")
        parts = await client._run(client.producer.layouts.parts(queue_name))
        reply = await client._run(identity.reserve_identity(parts[0], "id", job_id,
                                                          "2\tdead-producer\t0"))
        assert reply[0] == "won"
        with anyio.fail_after(10):
            revived = await queue.add("revived", job_id=job_id, key=_name_in(1, "t"))
        assert revived.created and await _where(client, queue_name, job_id) == [1]
        # A pointer left by a layout of more partitions names none of these: it is stale.
        other = _name_in(0, "older-layout")
        await client._run(identity.reserve_identity(parts[0], "id", other, "9\told\t0"))
        with anyio.fail_after(10):
            assert (await queue.add("new", job_id=other, key=_name_in(2, "t"))).created
        assert await client.remove(queue_name, job_id)
        again = await queue.add("again", job_id=job_id, key=_name_in(3, "t"))
        assert again.created and await _where(client, queue_name, job_id) == [3]
        assert (await client.get_job(queue_name, job_id)).data == "again"
        short = Dedup(_dedup_in(0, "brief"), ttl=0.2)
        first = await queue.add("first", key=_name_in(2, "t"), dedup=short)
        assert not (await queue.add("dup", key=_name_in(1, "t"), dedup=short)).created
        with anyio.fail_after(5):
            while redis_client.exists(parts[0].prefix + "dd:" + short.key):
                await anyio.sleep(0.05)
        later = await queue.add("later", key=_name_in(1, "t"), dedup=short)
        assert later.created and later.id != first.id


async def test_the_job_id_is_looked_at_before_the_dedup_key(redis_url: str,
                                                           queue_name: str) -> None:
    """As docs/flow-control.md says: an existing id is returned and its add leaves the dedup
    key alone (a replace deletes nothing, the key stays free)."""
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        waiting = await queue.add("waiting", dedup=Dedup("k", ttl=60, strategy="replace"))
        first = await queue.add("first", job_id="order-1")
        again = await queue.add("again", job_id="order-1",
                                dedup=Dedup("k", ttl=60, strategy="replace"))
        assert (again.id, again.created) == ("order-1", False)
        assert (await waiting.info()).state == JobState.WAITING
        kept = await queue.add("kept", dedup=Dedup("k", ttl=60))
        assert (kept.id, kept.created) == (waiting.id, False)
        assert first.created


async def test_a_refused_add_leaves_no_pointer(redis_url: str, queue_name: str,
                                               redis_client: redis.Redis) -> None:
    """An add whose identity was decided in its home and which its partition then refused (a
    dependency of another partition) takes its pointer back: the next add of that id is not
    held up by it."""
    registry = Registry()
    work = _keyed(registry, queue_name, Counter())
    job_id = _name_in(0, "refused")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        parent = await queue.add("parent", key=_name_in(2, "t"))
        with pytest.raises(ConfigError, match="is not a job of this queue"):
            await queue.add("child", job_id=job_id, key=_name_in(1, "t"), depends_on=[parent])
        parts = await client._run(client.producer.layouts.parts(queue_name))
        assert not redis_client.exists(parts[0].id_pointer(job_id))
        added = await queue.add("again", job_id=job_id, key=_name_in(1, "t"))
        assert added.created and await _where(client, queue_name, job_id) == [1]


async def test_deleted_jobs_leave_no_pointer_behind(redis_url: str, queue_name: str,
                                                    redis_client: redis.Redis) -> None:
    """The pointers in their ids' homes to jobs that retention trimmed or remove() deleted are
    cleared by the workers' upkeep; the pointer of a job still kept stays."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N, mode="keyed", retention=Retention(completed=1))
    async def work(job: Job[Any]) -> None: ...

    ids = [_name_in(0, f"kept{i}") for i in range(3)]
    removed = _name_in(0, "removed")
    key = _name_in(1, "t")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        parts = await client._run(client.producer.layouts.parts(queue_name))
        for job_id in ids:
            assert (await queue.add(job_id, job_id=job_id, key=key)).created
        assert (await queue.add("gone", job_id=removed, key=_name_in(2, "t"),
                                delay=60)).created
        pointers = [parts[0].id_pointer(i) for i in [*ids, removed]]
        assert redis_client.exists(*pointers) == 4
        assert await client.remove(queue_name, removed)
        with anyio.fail_after(15):
            async with run_worker(registry, queue_name, redis_url, stalled_interval=0.1):
                await drain(redis_url, queue_name)
                # Retention keeps the newest completed job of partition 1: the last added.
                while redis_client.exists(*pointers) != 1:
                    await anyio.sleep(0.05)
        assert redis_client.exists(parts[0].id_pointer(ids[-1]))
        again = await queue.add("again", job_id=removed, key=_name_in(3, "t"))
        assert again.created


async def test_an_existing_id_is_returned_before_a_dedup_key_of_another_partition(
        redis_url: str, queue_name: str) -> None:
    """The dedup key's record (in the same partition as the job id) points to a job elsewhere:
    an add naming an existing id returns that id's job, and does not look at the key."""
    registry = Registry()
    work = _keyed(registry, queue_name, Counter())
    dedup = Dedup(_dedup_in(0, "shared"), ttl=60)
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        elsewhere = await queue.add("by key", key=_name_in(1, "t"), dedup=dedup)
        by_id = await queue.add("by id", job_id=_name_in(0, "own"), key=_name_in(0, "t"))
        both = await queue.add("both", job_id=by_id.id, key=_name_in(0, "t"), dedup=dedup)
        assert (both.id, both.created) == (by_id.id, False)
        assert elsewhere.id != by_id.id


async def test_an_existing_id_is_returned_before_a_dedup_key_homed_elsewhere(
        redis_url: str, queue_name: str) -> None:
    """The job goes to its id's home, its dedup key's home is another partition, where the key
    names a live job: the existing id's job is returned, not the key's."""
    registry = Registry()
    work = _keyed(registry, queue_name, Counter())
    dedup = Dedup(_dedup_in(2, "other-home"), ttl=60)
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        keyed = await queue.add("by key", key=_name_in(2, "t"), dedup=dedup)
        by_id = await queue.add("by id", job_id=_name_in(0, "mine"), key=_name_in(0, "t"))
        both = await queue.add("both", job_id=by_id.id, key=_name_in(0, "t"), dedup=dedup)
        assert (both.id, both.created) == (by_id.id, False)
        fresh = await queue.add("fresh", job_id=_name_in(0, "new"), key=_name_in(0, "t"),
                                dedup=dedup)
        assert (fresh.id, fresh.created) == (keyed.id, False)


async def _placed_by_its_dependency(queue: Any, job_id: str) -> str:
    """Add job ``job_id`` depending on a job of another partition than its id's home (on a
    one-partition queue, on any job); returns the dependency's id."""
    parent = (await queue.add_bulk(range(N)))[1]  # generated: partition 1 of N
    child = await queue.add("child", job_id=job_id, depends_on=[parent])
    assert child.created
    return parent.id


@pytest.mark.parametrize("partitions", [N, 1])
async def test_a_batch_add_of_an_id_placed_by_its_dependency_returns_the_job(
        redis_url: str, queue_name: str, partitions: int) -> None:
    """A batch add under a taken id returns the existing job, as a plain add does, on a
    partitioned queue too, where the id's home only points to the partition holding the job;
    the batch does not count it."""
    registry = Registry()

    @registry.handler(queue_name, partitions=partitions)
    async def work(job: Job[Any]) -> None:
        pass

    job_id = _name_in(3, "member")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        await _placed_by_its_dependency(queue, job_id)
        batch = await client.batch(on_complete=(f"{queue_name}-done", None))
        again = await batch.add(work, "again", job_id=job_id)
        assert (again.id, again.created) == (job_id, False)
        assert (await batch.info()).total == 0
        assert (await client.get_job(queue_name, job_id)).data == "child"
        if partitions == N:
            assert await _where(client, queue_name, job_id) == [1]


@pytest.mark.parametrize("partitions", [N, 1])
@pytest.mark.parametrize("by", ["id", "dedup"])
async def test_an_add_naming_a_taken_identity_and_an_unknown_dependency_is_refused(
        redis_url: str, queue_name: str, partitions: int, by: str) -> None:
    """An unknown dependency is refused whatever the add's id or dedup key names, on any number
    of partitions: the input is checked before the identity is decided."""
    registry = Registry()

    @registry.handler(queue_name, partitions=partitions)
    async def work(job: Job[Any]) -> None:
        pass

    job_id, dedup = _name_in(3, "taken"), _dedup_in(2, "taken")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        first = await queue.add("first", job_id=job_id, dedup=Dedup(dedup, ttl=60))
        assert first.created
        names = {"job_id": job_id} if by == "id" else {"dedup": Dedup(dedup, ttl=60)}
        with pytest.raises(ConfigError, match="dependency nowhere is not a job of this queue"):
            await queue.add("again", depends_on=["nowhere"], **names)
        assert (await client.get_job(queue_name, job_id)).data == "first"


async def test_a_flow_item_naming_a_job_of_another_partition_says_so(
        redis_url: str, queue_name: str) -> None:
    """A flow whose item names an existing job of another partition, with a later item
    depending on it, is refused naming that item (its dependents cannot wait across
    partitions), and nothing of the flow is added."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[Any]) -> None:
        pass

    taken = _name_in(3, "taken")
    head_id = _name_in(2, "head")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        await _placed_by_its_dependency(queue, taken)  # in partition 1
        with pytest.raises(ConfigError, match=f"item 1: job_id {taken!r} names a job of "
                                              "partition 1, not of this flow's partition 2"):
            await queue.add_flow([FlowJob("head", job_id=head_id),
                                  FlowJob("taken", depends_on=[0], job_id=taken),
                                  FlowJob("after", depends_on=[1])])
        assert await _where(client, queue_name, head_id) == []
        assert (await client.get_job(queue_name, taken)).data == "child"


@pytest.mark.parametrize("token", ["0123abcd", f"{identity.HELD_TOKEN_MARK}0123abcd"])
async def test_a_dedup_pointer_of_an_earlier_version_still_names_the_job_under_its_id(
        redis_url: str, queue_name: str, redis_client: redis.Redis, token: str) -> None:
    """A dedup key whose pointer (in the key's home) names a job that does not carry the key.
    An earlier version wrote such pointers for every job it placed away from the key's home
    (hex tokens): the job is taken as the key's, as it was then, so a rolling deploy makes no
    duplicate. This version's pointers (a marked token) name a job that carries its key: a job
    that does not is another one, and the key is free."""
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[Any]) -> None: ...

    job_id, key = _name_in(1, "j"), _dedup_in(2, "d")
    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        job = await queue.add("placed without its key", job_id=job_id)
        parts = await client._run(client.producer.layouts.parts(queue_name))
        redis_client.set(parts[2].prefix + "dd:" + key, f"{job_id}\t1\t{token}\t0", px=60_000)
        again = await queue.add("dup", dedup=Dedup(key, ttl=60))
    if token.startswith(identity.HELD_TOKEN_MARK):
        assert again.created and again.id != job.id
    else:
        assert (again.id, again.created) == (job.id, False)


# -------------------------------------------------------- refusals that must change nothing


def _handler(queue: str, mode: str = "global") -> Any:
    registry = Registry()

    @registry.handler(queue, partitions=N, mode=mode)
    async def handle(job: Job) -> None: ...

    return handle


async def test_a_refused_add_deletes_no_job_by_its_far_dedup_replace(
        redis_url: str, queue_name: str) -> None:
    """A dedup replace whose key's home is another partition than the job's (placed by its
    key): the add is refused (a key on a global queue), and the job it would have replaced
    was gone, deleted in the key's home before the add script refused."""
    key = _name_in(1, "k")
    dedup = next(_dedup_in(p, "d") for p in range(N) if p != 1)
    async with QueueClient(redis_url) as client:
        queue = client.queue(_handler(queue_name))
        old = await queue.add({"n": 1}, dedup=Dedup(dedup))
        with pytest.raises(ConfigError, match="key= needs a keyed queue"):
            await queue.add({"n": 2}, key=key, dedup=Dedup(dedup, strategy="replace"))
        assert (await old.info()).state is JobState.WAITING


async def test_a_producer_naming_no_mode_adds_in_the_mode_a_keyed_producer_stored(
        redis_url: str, queue_name: str) -> None:
    """A keyed handler's producer stored the layout with its first job; a producer that names
    no mode (client.queue(name)) then added a bulk over the partitions: those not written yet
    took 'global' and their jobs, the keyed one refused, a ConfigError after a partial write,
    and a queue whose partitions disagree on its mode. It now adds in the home's mode: refused
    everywhere alike, nothing written."""
    async with QueueClient(redis_url) as client:
        await client.queue(_handler(queue_name, "keyed")).add({"first": True}, key="k")
        with pytest.raises(ConfigError, match="queue is keyed"):
            await client.queue(queue_name).add_bulk([{"n": i} for i in range(8)])
        assert sum((await client.counts(queue_name)).values()) == 1
        assert (await client.queue(queue_name).add({"n": 9}, key="k2")).created
