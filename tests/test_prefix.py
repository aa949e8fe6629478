"""``prefix=``: several applications share one Redis, each in its own key namespace.

Two applications with different prefixes (and one with none) on one server never see each
other's queues, jobs or workers; a worker process run as a Redis ACL user that may touch only
its prefix's keys and channels runs jobs of every kind (plain, delayed, partitioned, batch,
flow, schedule) without one refusal, and leaves no key outside the prefix; a bad prefix is one
line.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from panqueue import (
    ConfigError,
    FlowJob,
    Job,
    JobState,
    PanqueueError,
    QueueClient,
    Registry,
    SyncQueueClient,
    Worker,
    WorkerPool,
)
from panqueue.embedded import RedisServer
from panqueue.testing import run_worker
from tests.helpers import (
    ROOT,
    WorkerProcess,
    async_wait_until,
    run_cli,
    subprocess_env,
    wait_until,
)

SHARED = "shared"


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b", "a:b", "a*", "a?", "a[b]", "has space",
                                    "q", "b", "-lead", "x" * 65, 7])
def test_a_bad_prefix_is_one_config_error(prefix: Any) -> None:
    for make in (lambda: QueueClient(prefix=prefix), lambda: SyncQueueClient(prefix=prefix),
                 lambda: Registry(prefix=prefix)):
        with pytest.raises(ConfigError) as caught:
            make()
        assert "prefix" in str(caught.value) and "\n" not in str(caught.value)


def test_the_cli_refuses_a_bad_prefix_in_one_line(redis_url: str) -> None:
    for args, env in ((["--prefix", "a:b"], {}), ([], {"PANQUEUE_PREFIX": "{app}"})):
        done = run_cli("stats", "--url", redis_url, *args, **env)
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert any("prefix" in line for line in lines), done.stderr
        assert "Traceback" not in done.stderr


def _isolation_registry(url: str | None = None, prefix: str | None = None) -> Registry:
    registry = Registry(url, prefix=prefix)

    @registry.handler(SHARED, concurrency=4)
    async def echo(job: Job) -> Any:
        return job.data

    return registry


@pytest.mark.anyio
async def test_two_prefixes_on_one_server_never_see_each_other(
        redis_url: str, redis_client: redis.Redis) -> None:
    registry = _isolation_registry()
    async with QueueClient(redis_url, prefix="one") as one, \
            QueueClient(redis_url, prefix="two") as two, QueueClient(redis_url) as bare:
        added = {name: [await client.queue(SHARED).add({"app": name, "n": n})
                        for n in range(3)]
                 for name, client in (("one", one), ("two", two), ("bare", bare))}
        # Each application sees its own queue, with its own three jobs, and nothing else.
        for name, client in (("one", one), ("two", two), ("bare", bare)):
            assert await client.queues() == [SHARED]
            assert (await client.counts(SHARED))[JobState.WAITING] == 3
            listed = await client.list_jobs(SHARED, JobState.WAITING)
            assert {job.data["app"] for job in listed} == {name}
        # The ids are per namespace: the same id names a different job in each.
        assert {h.id for h in added["one"]} == {h.id for h in added["two"]}

        # A worker of "one" runs "one"'s jobs only, and only "one" sees it.
        worker = Worker(registry, SHARED, url=redis_url, prefix="one", poll_interval=0.1)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)

            async def one_done() -> bool:
                return (await one.counts(SHARED))[JobState.COMPLETED] == 3

            await async_wait_until(one_done, what="the jobs of prefix one completed")
            assert [w.name for w in await one.workers(SHARED)] == [worker.name]
            assert await two.workers(SHARED) == [] and await bare.workers(SHARED) == []
            for handle in added["one"]:
                assert (await handle.result(timeout=5))["app"] == "one"
            await worker.shutdown()
        for client in (two, bare):
            counts = await client.counts(SHARED)
            assert counts[JobState.WAITING] == 3 and counts[JobState.COMPLETED] == 0

    keys = [key.decode() for key in redis_client.keys("*")]
    assert keys and all(key.startswith(("{one:q:shared", "{two:q:shared", "{q:shared"))
                        for key in keys), keys
    assert any(key.startswith("{one:") for key in keys)
    assert any(key.startswith("{two:") for key in keys)


@pytest.mark.anyio
async def test_a_pool_takes_its_registrys_url_and_prefix(redis_url: str,
                                                 redis_client: redis.Redis) -> None:
    confined = _isolation_registry(redis_url, prefix="reg")
    async with QueueClient(redis_url, prefix="reg") as client:
        handle = await client.queue(SHARED).add({"x": 1})
        # Its URL and prefix from the registry.
        async with WorkerPool(confined, poll_interval=0.1) as pool:
            assert pool.prefix == "reg" and pool.url == redis_url
            assert await handle.result(timeout=10) == {"x": 1}
    assert all(key.startswith(b"{reg:") for key in redis_client.keys("*"))


def test_the_cli_reads_only_its_prefixs_queues(redis_url: str) -> None:
    with SyncQueueClient(redis_url, prefix="cli") as mine, SyncQueueClient(redis_url) as bare:
        mine.queue("mine").add({"n": 1})
        bare.queue("theirs").add({"n": 2})
    for args, env in ((["--prefix", "cli"], {}), ([], {"PANQUEUE_PREFIX": "cli"})):
        done = run_cli("stats", "--url", redis_url, "--json", *args, **env)
        assert done.returncode == 0, done.stderr
        assert list(json.loads(done.stdout)) == ["mine"]
    done = run_cli("stats", "--url", redis_url, "--json")
    assert list(json.loads(done.stdout)) == ["theirs"]


# ----------------------------------------------------------------- a worker confined by ACL

ACL_USER, ACL_PASSWORD, PREFIX = "app", "app-secret", "app"


@pytest.fixture
def confined(private_redis: RedisServer) -> tuple[str, redis.Redis]:
    """The URL of an ACL user that may touch only the keys and channels of prefix ``app``, and
    an admin client of the same server."""
    admin = redis.Redis.from_url(private_redis.url)
    # The narrow form of docs/connections.md, confined to the prefix.
    admin.execute_command("ACL", "SETUSER", ACL_USER, "on", f">{ACL_PASSWORD}", "resetkeys",
                          "~{" + PREFIX + ":*", "resetchannels", "&{" + PREFIX + ":*", "-@all",
                          "+@read", "+@write", "+@scripting", "+@pubsub", "+@connection",
                          "+time", "+scan")
    admin.execute_command("ACL", "LOG", "RESET")
    host_port = private_redis.url.split("://", 1)[1]
    return f"redis://{ACL_USER}:{ACL_PASSWORD}@{host_port}", admin


def test_a_worker_confined_to_its_prefix_runs_every_kind_of_job(
        confined: tuple[str, redis.Redis], tmp_path: Path) -> None:
    url, admin = confined
    # Without the prefix the same user is refused: the ACL does confine it.
    with SyncQueueClient(url) as outside, pytest.raises(PanqueueError,
                                                        match=r"(?i)noperm|permission"):
        outside.queue("acl-plain").add({"n": 0})
    admin.execute_command("ACL", "LOG", "RESET")

    worker = WorkerProcess(tmp_path, "--url", url, "--prefix", PREFIX, "--poll-interval", "0.1",
                           app="prefix_app:queues")
    try:
        with SyncQueueClient(url, prefix=PREFIX) as client:
            wait_until(lambda: len(client.workers()) == 4, timeout=20,
                       what="the worker serving its four queues")
            plain = client.queue("acl-plain")
            handles = [plain.add({"kind": "plain"}),
                       plain.add({"kind": "delayed"}, delay=0.3)]
            handles += plain.add_bulk([{"kind": "bulk", "n": n} for n in range(5)])
            handles += plain.add_flow([FlowJob({"kind": "flow", "n": 0}),
                                       FlowJob({"kind": "flow", "n": 1}, depends_on=[0])])
            handles += client.queue("acl-parts").add_bulk(
                [{"kind": "partitioned", "n": n} for n in range(12)])
            batch = client.batch(on_complete=("acl-done", {"kind": "callback"}))
            handles += batch.add_bulk("acl-parts", [{"kind": "batch", "n": n}
                                                    for n in range(4)])
            batch.close()
            for handle in handles:
                assert handle.result(timeout=20)["kind"] in {
                    "plain", "delayed", "bulk", "flow", "partitioned", "batch"}
            wait_until(lambda: client.counts("acl-done")[JobState.COMPLETED] == 1, timeout=20,
                       what="the batch's callback")
            wait_until(lambda: client.counts("acl-sched")[JobState.COMPLETED] >= 2, timeout=20,
                       what="two ticks of the schedule")
            assert sorted(client.queues()) == ["acl-done", "acl-parts", "acl-plain",
                                               "acl-sched"]
    finally:
        code = worker.stop()
    assert code == 0, worker.stderr
    # No command, key or channel was refused, and every key is the prefix's.
    assert admin.execute_command("ACL", "LOG") == [], worker.stderr
    assert "NOPERM" not in worker.stderr and "permission" not in worker.stderr.lower()
    keys = [key.decode() for key in admin.keys("*")]
    assert keys and all(key.startswith("{" + PREFIX + ":") for key in keys), keys


# A WorkerPool without a name= serving two queues: one process, one worker (and one name) per
# queue, so its row in client.worker_processes() is named "host:pid". Beats every 0.3 s.
CONTROLLED = textwrap.dedent("""
    import sys

    import anyio

    from panqueue import Job, Registry, WorkerPool

    url, prefix = sys.argv[1:3]
    registry = Registry(prefix=prefix)


    @registry.handler("tagged", partitions=2)
    async def tagged(job: Job) -> None:
        pass


    @registry.handler("beside")
    async def beside(job: Job) -> None:
        pass


    anyio.run(WorkerPool(registry, url=url, heartbeat_interval=0.3).run)
    print("pool returned", flush=True)
""")


def test_tags_bulk_cancel_and_remote_control_touch_only_the_prefixs_keys(
        confined: tuple[str, redis.Redis], tmp_path: Path) -> None:
    """Run as the ACL user that may touch only prefix ``app``'s keys: tags (their indexes, in
    both partitions of a partitioned queue), a bulk cancel by tag (the client's and the CLI's)
    and remote control of a worker process by its row's name (the client's and the CLI's)
    meet no refusal and leave no key outside the prefix."""
    url, admin = confined
    registry = Registry(url, prefix=PREFIX)

    @registry.handler("tagged", partitions=2)
    async def tagged(job: Job) -> None:
        pass

    try:
        for n in range(6):  # delayed: the worker started below leaves them alone
            tagged.enqueue({"n": n}, delay=600, tags=["import", f"tenant:{n % 2}"])
    finally:
        registry.close()
    indexes = sorted(key.decode() for key in admin.scan_iter(match="*:tag:*"))
    assert all(key.startswith("{" + PREFIX + ":q:tagged") for key in indexes), indexes
    # Each partition indexes its own jobs' tags, under the prefix's hash tags.
    assert len({key.partition("}")[0] for key in indexes if key.endswith(":tag:import")}) == 2

    script = tmp_path / "controlled_pool.py"
    script.write_text(CONTROLLED)
    pool = subprocess.Popen([sys.executable, str(script), url, PREFIX], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=subprocess_env(), cwd=ROOT)
    try:
        with SyncQueueClient(url, prefix=PREFIX) as client:
            listed = client.list_jobs("tagged", JobState.DELAYED, tag="tenant:0")
            assert sorted(job.data["n"] for job in listed) == [0, 2, 4]
            assert all(job.tags == ["import", "tenant:0"] for job in listed)
            assert client.cancel_jobs("tagged", tag="tenant:0") == 3
            assert client.cancel_jobs("tagged", tag="tenant:0") == 0
            cancelled = run_cli("cancel", "tagged", "--tag", "tenant:1", "--url", url,
                                "--prefix", PREFIX)
            assert cancelled.returncode == 0, cancelled.stderr
            assert cancelled.stdout == "3 job(s) cancelled in 'tagged'\n"
            assert client.counts("tagged")[JobState.CANCELLED] == 6

            wait_until(lambda: [p.queues for p in client.worker_processes()]
                       == [["beside", "tagged"]], timeout=20, what="the pool's first beats")
            [row] = client.worker_processes()
            assert row.name == f"{row.host}:{row.pid}" == f"{row.host}:{pool.pid}"
            client.control(row.name, "pause")  # every worker of the process
            wait_until(lambda: [(p.paused, [w.paused for w in p.workers])
                                for p in client.worker_processes()] == [(True, [True, True])],
                       timeout=10, what="both of the pool's workers to pause")
            listed_rows = run_cli("workers", "--url", url, "--prefix", PREFIX)
            assert listed_rows.stdout.startswith(row.name + "\t"), listed_rows
            assert listed_rows.stdout.rstrip("\n").endswith("\tpaused"), listed_rows
            stopped = run_cli("workers", "--stop", row.name, "--url", url, "--prefix", PREFIX)
            assert stopped.returncode == 0, stopped.stderr
            assert pool.wait(timeout=15) == 0
            assert client.worker_processes() == []
    finally:
        if pool.poll() is None:
            pool.kill()
        out, err = pool.communicate()
    assert "pool returned" in out, err
    # No command, key or channel was refused, and every key is the prefix's.
    assert admin.execute_command("ACL", "LOG") == [], err
    keys = [key.decode() for key in admin.keys("*")]
    assert keys and all(key.startswith("{" + PREFIX + ":") for key in keys), keys


@pytest.mark.anyio
async def test_a_durable_job_under_a_prefix_keeps_every_key_inside_it(
        confined: tuple[str, redis.Redis]) -> None:
    """A step, a sleep and two waits (a signal kept before the job waits, one that wakes it),
    by a worker and a client confined by ACL to prefix ``app``: no refusal, and the durable
    record and every other key are the prefix's."""
    url, admin = confined
    registry = Registry()

    @registry.handler("acl-durable")
    async def signup(job: Job) -> Any:
        account = await job.step("create", lambda: {"account": job.data["n"]})
        await job.sleep(0.2)
        first = await job.wait_for("verified")  # kept before the job waits
        second = await job.wait_for("approved")  # wakes the waiting job
        return {"account": account, "first": first, "second": second}

    async with run_worker(registry, "acl-durable", url, prefix=PREFIX, poll_interval=0.1), \
            QueueClient(url, prefix=PREFIX) as client:
        job = await client.queue("acl-durable").add({"n": 7})
        assert await client.signal("acl-durable", job.id, "verified", {"by": "mail"}) is True

        async def waits() -> bool:
            return (await job.info()).waiting_for == "approved"

        await async_wait_until(waits, timeout=20, what="the job to wait for 'approved'")
        waiting = await job.info()
        explanation = await client.explain("acl-durable", job.id)
        listed = await client.list_jobs("acl-durable", JobState.DELAYED)
        record = admin.hgetall("{" + PREFIX + ":q:acl-durable}:job:" + job.id + ":durable")
        assert await client.signal("acl-durable", job.id, "approved", True) is True
        result = await job.result(timeout=20)
    assert result == {"account": {"account": 7}, "first": {"by": "mail"}, "second": True}
    assert waiting.steps == {"create": {"account": 7}} and waiting.state is JobState.DELAYED
    assert explanation.reason == "signal" and [j.id for j in listed] == [job.id]
    assert record[b"ws"] == b"approved" and b"s:create" in record
    # No command, key or channel was refused, and every key is the prefix's.
    assert admin.execute_command("ACL", "LOG") == []
    keys = [key.decode() for key in admin.keys("*")]
    assert keys and all(key.startswith("{" + PREFIX + ":") for key in keys), keys


def test_the_exporter_reads_only_its_prefixs_queues(redis_url: str) -> None:
    pytest.importorskip("prometheus_client")
    from panqueue.metrics import QueueCollector

    with SyncQueueClient(redis_url, prefix="m") as mine, SyncQueueClient(redis_url) as bare:
        mine.queue("mine").add_bulk([{"n": 1}, {"n": 2}])
        bare.queue("theirs").add({"n": 3})
    for prefix, expected in (("m", {("mine", 2.0)}), (None, {("theirs", 1.0)})):
        collector = QueueCollector(redis_url, prefix=prefix)
        try:
            waiting = {(s.labels["queue"], s.value) for family in collector.collect()
                       if family.name == "panqueue_jobs" for s in family.samples
                       if s.labels["state"] == "waiting"}
        finally:
            collector.close()
        assert waiting == expected


def test_explains_hints_under_a_prefix_name_the_commands_that_act_on_its_queues(
        redis_url: str) -> None:
    """A job of a prefixed application's paused queue: the command the hint names resumes that
    queue, not the unprefixed queue of the same name; the dashboard's and the terminal's
    commands are quoted for a shell."""
    name = "sign ups"
    with SyncQueueClient(redis_url, prefix="billing") as mine, SyncQueueClient(redis_url) as bare:
        bare.queue(name).add(0)
        job = mine.queue(name).add(1)
        mine.pause(name)
        bare.pause(name)
        said = mine.explain(name, job.id, tool="cli")
        assert said.reason == "paused" and "panqueue resume --prefix billing 'sign ups'" in \
            said.detail, said
        shown = mine.explain(name, job.id, tool="dashboard")
        assert shown.reason == "paused"
        hint = said.detail.split("(", 1)[1].split(")", 1)[0]
        done = run_cli(*shlex.split(hint)[1:], "--url", redis_url)
        assert done.returncode == 0, done.stderr
        assert not mine.is_paused(name) and bare.is_paused(name)
