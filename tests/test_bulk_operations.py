"""Tags and bulk operations by filter: jobs added with tags, listed by tag or error type a page
at a time on the server, and cancelled, retried and removed by filter (safe to run again),
with each tag's index kept to exactly the jobs stored, on plain and partitioned queues."""

from __future__ import annotations

import json
import uuid

import anyio
import pytest
import redis

from panqueue import (
    ConfigError,
    FlowJob,
    Job,
    JobState,
    QueueClient,
    Registry,
    Retention,
    SyncQueueClient,
)
from panqueue._job import ErrorInfo
from panqueue._store import transitions
from panqueue._store.ops import encode_error, select
from panqueue._store.transport import Batch
from panqueue.testing import drain, run_worker
from tests.helpers import run_cli
from tests.store_fixtures import ScriptStore
from tests.test_cli import assert_user_error

pytestmark = pytest.mark.anyio


def _tag_index(redis_client: redis.Redis, queue: str, tag: str) -> set[str]:
    """Every partition's index of ``tag`` (the keys "{q:<queue>...}:tag:<tag>")."""
    members: set[str] = set()
    for key in redis_client.scan_iter(match=f"{{q:{queue}*}}:tag:{tag}"):
        members |= {m.decode() for m in redis_client.zrange(key, 0, -1)}
    return members


async def test_tags_are_stored_with_the_job_from_every_way_to_add(
        redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        one = await queue.add({"n": 1}, tags=["tenant:42", "import"])
        bulk = await client.queue(queue_name, tags=["bulk"]).add_bulk([1, 2])
        flow = await queue.add_flow([FlowJob(1, options={"tags": ["flow"]}),
                                     FlowJob(2, depends_on=(0,))])
        batch = await client.batch(on_complete=(queue_name, {}))
        member = await batch.add(queue_name, 3, tags=["batch"])
        assert (await one.info()).tags == ["tenant:42", "import"]
        assert [(await h.info()).tags for h in bulk] == [["bulk"], ["bulk"]]
        assert (await flow[0].info()).tags == ["flow"]
        assert (await flow[1].info()).tags == []
        assert (await member.info()).tags == ["batch"]
        assert (await one.info()).to_dict()["tags"] == ["tenant:42", "import"]
    with SyncQueueClient(redis_url) as sync:
        handle = sync.queue(queue_name).add(4, tags=["sync", "sync"])  # once each
        assert sync.get_job(queue_name, handle.id).tags == ["sync"]
        assert [j.id for j in sync.list_jobs(queue_name, "waiting", tag="sync")] == [handle.id]


@pytest.mark.parametrize(("tags", "message"), [
    ([f"t{i}" for i in range(17)], "at most 16 tags, got 17"),
    (["ok", "bad\nline"], "contains control characters"),
    ("tenant:42", "tags must be a list of str"),
    ([""], "must be a non-empty str"),
    (["x" * 201], "longer than 200 characters"),
])
async def test_bad_tags_are_refused_and_nothing_is_written(
        redis_url: str, queue_name: str, tags: object, message: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        with pytest.raises(ConfigError, match=message):
            await queue.add(1, tags=tags)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=message):
            await queue.add_flow([FlowJob(1), FlowJob(2, options={"tags": tags})])
        with pytest.raises(ConfigError, match=message):
            await client.queue(queue_name, tags=tags).add_bulk([1, 2])
        assert not await client.queue_exists(queue_name)


async def test_list_jobs_by_tag_pages_on_the_server(redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        tagged = []
        for n in range(2500):  # more than one read of the server's budget (2,000 members)
            handle = await queue.add(n, tags=["even"] if n % 2 == 0 else ["odd"])
            if n % 2 == 0:
                tagged.append(handle.id)
        await queue.add("late", delay=60, tags=["even"])
        page = await client.list_jobs(queue_name, "waiting", tag="even", limit=100, offset=0)
        assert [j.id for j in page] == tagged[:100]
        deep = await client.list_jobs(queue_name, "waiting", tag="even", limit=7, offset=1200)
        assert [j.id for j in deep] == tagged[1200:1207]
        last = await client.list_jobs(queue_name, "waiting", tag="even", limit=100, offset=1240)
        assert [j.id for j in last] == tagged[1240:]
        delayed = await client.list_jobs(queue_name, JobState.DELAYED, tag="even")
        assert [j.data for j in delayed] == ["late"]
        assert await client.list_jobs(queue_name, "waiting", tag="none") == []


async def test_failed_jobs_are_listed_and_retried_by_error_type(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()
    attempts: dict[int, int] = {}

    @registry.handler(queue_name, attempts=1)
    async def work(job: Job[int]) -> int:
        attempts[job.data] = attempts.get(job.data, 0) + 1
        if attempts[job.data] == 1:
            raise (TimeoutError if job.data % 3 == 0 else ValueError)(f"job {job.data}")
        return job.data

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        await queue.add_bulk(range(9))
        async with run_worker(registry, queue_name, redis_url, concurrency=4):
            counts = await drain(redis_url, queue_name)
            assert counts[JobState.FAILED] == 9
            timeouts = await client.list_jobs(queue_name, "failed", error_type="TimeoutError")
            assert sorted(j.data for j in timeouts) == [0, 3, 6]
            assert all(j.error is not None and j.error.type == "TimeoutError" for j in timeouts)
            with pytest.raises(ConfigError, match="ids or a filter"):
                await client.retry_failed(queue_name, [timeouts[0].id],
                                          error_type="TimeoutError")
            assert await client.retry_failed(queue_name, error_type="TimeoutError") == 3
            counts = await drain(redis_url, queue_name)
            assert counts[JobState.COMPLETED] == 3 and counts[JobState.FAILED] == 6
            # Again: nothing of that type is left failed.
            assert await client.retry_failed(queue_name, error_type="TimeoutError") == 0
            left = await client.list_jobs(queue_name, "failed", error_type="ValueError")
            assert len(left) == 6


async def test_cancel_jobs_by_tag_counts_once_and_is_safe_to_rerun(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        ids = [(await queue.add(n, tags=["tenant:7"])).id for n in range(1200)]
        await queue.add("delayed", delay=60, tags=["tenant:7"])
        await queue.add("other", tags=["tenant:8"])
        assert await client.cancel_jobs(queue_name, tag="tenant:7") == 1201
        assert await client.cancel_jobs(queue_name, tag="tenant:7") == 0
        counts = await client.counts(queue_name)
        assert counts[JobState.CANCELLED] == 1201 and counts[JobState.WAITING] == 1
        assert (await client.get_job(queue_name, ids[0])).state == JobState.CANCELLED
        # Cancelled jobs keep their tag: they are still there to be found and removed.
        assert _tag_index(redis_client, queue_name, "tenant:7") >= set(ids)
        with pytest.raises(ConfigError, match="needs a filter"):
            await client.cancel_jobs(queue_name)
        with pytest.raises(ConfigError, match="finished"):
            await client.cancel_jobs(queue_name, tag="tenant:7", state="completed")


async def test_cancel_jobs_by_state_reaches_a_keyed_queues_waiting_jobs(
        redis_url: str, queue_name: str) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name, mode="keyed")
        for n in range(10):
            await queue.add(n, key=f"k{n % 3}")
        await queue.add("later", key="k0", delay=60)
        assert await client.cancel_jobs(queue_name, state="waiting") == 10
        counts = await client.counts(queue_name)
        assert counts[JobState.WAITING] == 0 and counts[JobState.DELAYED] == 1


async def test_remove_jobs_by_tag_and_state_empties_the_tag_index(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        for n in range(5):
            await queue.add(n, tags=["import"])
        keep = await queue.add("delayed", delay=60, tags=["import"])
        assert await client.remove_jobs(queue_name, tag="import", state="waiting") == 5
        assert await client.remove_jobs(queue_name, tag="import", state="waiting") == 0
        assert _tag_index(redis_client, queue_name, "import") == {keep.id}
        assert await client.remove_jobs(queue_name, tag="import") == 1
        assert _tag_index(redis_client, queue_name, "import") == set()
        with pytest.raises(ConfigError, match="cannot be removed"):
            await client.remove_jobs(queue_name, tag="import", state="active")


async def test_remove_jobs_by_state_leaves_a_job_that_left_the_state_during_the_call(
        redis_url: str, queue_name: str) -> None:
    """Found by the model: removing a blocked job fails its blocked dependent, picked in the
    same call as blocked. The dependent is failed now, not blocked: it is left (failed, with
    its error) and not counted, as a job finished meanwhile by a worker would be."""
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        first = await queue.add("first", delay=60, tags=["t"])
        second = await queue.add("second", depends_on=[first.id], tags=["t"])
        third = await queue.add("third", depends_on=[second.id], tags=["t"])
        assert await client.remove_jobs(queue_name, tag="t", state="blocked") == 1
        info = await client.get_job(queue_name, third.id)
        assert info.state == JobState.FAILED and info.error is not None
        assert info.error.type == "DependencyFailed"
        assert await client.remove_jobs(queue_name, tag="t", state="blocked") == 0
        assert (await client.get_job(queue_name, first.id)).state == JobState.DELAYED


async def test_every_deletion_takes_the_job_out_of_its_tags_index(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    """Retention, purge and remove each delete jobs: none leaves an id in a tag's index."""
    registry = Registry()

    @registry.handler(queue_name, retention=Retention(completed=2))
    async def work(job: Job[int]) -> int:
        return job.data

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        handles = [await queue.add(n, tags=["kept", f"n{n}"]) for n in range(6)]
        async with run_worker(registry, queue_name, redis_url):
            await drain(redis_url, queue_name)
        completed = {j.id for j in await client.list_jobs(queue_name, "completed")}
        assert len(completed) == 2
        assert _tag_index(redis_client, queue_name, "kept") == completed
        assert _tag_index(redis_client, queue_name, "n0") == set()
        assert await client.remove(queue_name, sorted(completed)[0])
        assert len(_tag_index(redis_client, queue_name, "kept")) == 1
        await queue.add("waits", tags=["kept"])
        await client.purge(queue_name)
        assert _tag_index(redis_client, queue_name, "kept") == set()
        assert not list(redis_client.scan_iter(match=f"{{q:{queue_name}*}}:tag:*"))
        assert handles


async def test_a_partitioned_queue_keeps_an_index_per_partition_and_merges_the_views(
        redis_url: str, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()

    @registry.handler(queue_name, partitions=3)
    async def work(job: Job[int]) -> int:
        return job.data

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        handles = [await queue.add(n, tags=["spread"] if n % 2 else ["other"])
                   for n in range(30)]
        indexes = list(redis_client.scan_iter(match=f"{{q:{queue_name}*}}:tag:spread"))
        assert len(indexes) == 3  # each partition holds its own
        spread = [h.id for h in handles if int((await h.info()).data) % 2]
        listed = await client.list_jobs(queue_name, "waiting", tag="spread", limit=100)
        assert sorted(j.id for j in listed) == sorted(spread)
        page = await client.list_jobs(queue_name, "waiting", tag="spread", limit=4, offset=3)
        assert [j.id for j in page] == [j.id for j in listed[3:7]]
        assert await client.cancel_jobs(queue_name, tag="spread") == 15
        assert await client.remove_jobs(queue_name, tag="spread", state="cancelled") == 15
        assert _tag_index(redis_client, queue_name, "spread") == set()
        counts = await client.counts(queue_name)
        assert counts[JobState.WAITING] == 15 and counts[JobState.CANCELLED] == 0


async def test_retry_failed_by_tag_on_the_sync_client(redis_url: str, queue_name: str) -> None:
    registry = Registry()
    failing = {"yes": True}

    @registry.handler(queue_name, attempts=1)
    async def work(job: Job[int]) -> int:
        if failing["yes"]:
            raise RuntimeError("down")
        return job.data

    async with QueueClient(redis_url) as client:
        queue = client.queue(work)
        for n in range(4):
            await queue.add(n, tags=["retry-me"] if n < 3 else ["leave"])
        async with run_worker(registry, queue_name, redis_url):
            await drain(redis_url, queue_name)
            failing["yes"] = False
            with SyncQueueClient(redis_url) as sync:
                moved = await anyio.to_thread.run_sync(
                    lambda: sync.retry_failed(queue_name, tag="retry-me"))
            assert moved == 3
            counts = await drain(redis_url, queue_name)
        assert counts[JobState.COMPLETED] == 3 and counts[JobState.FAILED] == 1


# --------------------------------------------------------------------------- the command line


def _failed_with(store: ScriptStore, error_type: str, tags: list[str]) -> str:
    """A job of the store's queue, added with ``tags``, that failed with ``error_type``."""
    with SyncQueueClient(store.t.url) as client:
        job_id = client.queue(store.keys.name).add({}, tags=tags).id
    token = uuid.uuid4().hex
    assert store.claim(token) == [job_id]
    store.fail(job_id, token, error=encode_error(ErrorInfo(error_type, "it broke")))
    return job_id


def test_cli_lists_cancels_and_retries_by_tag_and_error_type(store: ScriptStore) -> None:
    queue, url = store.keys.name, store.t.url
    timeouts = [_failed_with(store, "TimeoutError", ["tenant:1"]) for _ in range(3)]
    _failed_with(store, "ValueError", ["tenant:1"])
    added = run_cli("enqueue", queue, "{}", "--tag", "tenant:2", "--tag", "import", "--url", url)
    assert added.returncode == 0, added.stderr
    waiting_id = added.stdout.strip()
    listed = run_cli("jobs", queue, "--tag", "tenant:2", "--url", url)
    heading, *rows = listed.stdout.splitlines()
    assert listed.returncode == 0 and heading.startswith("id\t"), listed
    assert [row.split("\t")[0] for row in rows] == [waiting_id], listed
    dead = run_cli("dlq", queue, "--error-type", "TimeoutError", "--json", "--url", url)
    assert sorted(e["id"] for e in json.loads(dead.stdout)) == sorted(timeouts)
    retried = run_cli("dlq", queue, "--retry", "--error-type", "TimeoutError", "--url", url)
    assert retried.returncode == 0 and retried.stdout == "3 job(s) moved back to waiting\n"
    again = run_cli("dlq", queue, "--retry", "--error-type", "TimeoutError", "--url", url)
    assert again.stdout == "0 job(s) moved back to waiting\n"
    cancelled = run_cli("cancel", queue, "--tag", "tenant:1", "--url", url)
    assert cancelled.returncode == 0 and cancelled.stdout == f"3 job(s) cancelled in {queue!r}\n"
    assert run_cli("cancel", queue, "--tag", "tenant:1", "--url", url).stdout.startswith("0 job")
    with SyncQueueClient(url) as client:
        counts = client.counts(queue)
    assert counts[JobState.CANCELLED] == 3 and counts[JobState.FAILED] == 1
    assert counts[JobState.WAITING] == 1


@pytest.mark.parametrize(("args", "fragment"), [
    (("cancel", "Q"), "give a job ID, or --tag"),
    (("cancel", "Q", "7", "--tag", "t"), "not both"),
    (("dlq", "Q", "--retry", "7", "--error-type", "E"), "not both"),
    (("enqueue", "Q", "{}", "--tag", "bad\ttag"), "control characters"),
])
def test_cli_bulk_misuse_is_one_line_exit_2(store: ScriptStore, args: tuple[str, ...],
                                            fragment: str) -> None:
    store.add_one()
    queue = store.keys.name
    proc = run_cli(*(queue if a == "Q" else a for a in args), "--url", store.t.url)
    assert_user_error(proc, fragment)
    assert proc.returncode == 2
    with SyncQueueClient(store.t.url) as client:
        assert client.counts(queue)[JobState.WAITING] == 1


@pytest.mark.parametrize("moved_to", ["waiting", "active"])
def test_cancel_jobs_leaves_a_job_that_left_the_state_it_was_picked_in(
        store: ScriptStore, moved_to: str) -> None:
    """cancel_jobs(state="delayed") picks the delayed jobs, then cancels them: one that came
    due (or even started) between the two is left as it is, and not counted."""
    job = store.add_one(delay_ms=60_000, tags=("t",))
    op = select.cancel_jobs(store.keys, "t", JobState.DELAYED)
    request = op.send(None)
    while True:
        if isinstance(request, Batch):  # the cancels: the job moves on first
            store.redis.zadd(store.keys.delayed, {job: 0})
            store.t.run(transitions.promote(store.keys))
            if moved_to == "active":
                assert store.claim(uuid.uuid4().hex) == [job]
        try:
            request = op.send(store.t.execute(request))
        except StopIteration as done:
            cancelled = done.value
            break
    assert cancelled == 0
    assert store.state(job) == moved_to
    assert not store.redis.hexists(store.keys.job(job), "cx")  # no cancel asked of its worker
