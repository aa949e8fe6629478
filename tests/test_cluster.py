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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis
from redis.crc import key_slot

from panqueue import Job, JobState, QueueClient, Registry, SyncQueueClient, Worker, WorkerPool
from panqueue._keys import QueueKeys
from panqueue._store.scripts import SCRIPTS
from panqueue.embedded import find_server_binary, free_port
from tests.helpers import run_cli

pytestmark = pytest.mark.anyio

MASTERS = 3


def wait_until(condition: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.05) -> None:
    """Poll ``condition`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


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


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    binary = find_server_binary()
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
                 "--dir", str(directory), "--save", "", "--appendonly", "no",
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


def _script_calls(port: int) -> int:
    """How many EVALSHA calls the node has executed."""
    stats = redis.Redis(host="127.0.0.1", port=port)
    try:
        info = stats.info("commandstats")
    finally:
        stats.close()
    return int(info.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_idle_worker_is_woken_through_sharded_pubsub(cluster: Cluster) -> None:
    name = f"cl-wake-{uuid.uuid4().hex[:8]}"
    port = cluster.owner_port(QueueKeys(name).prefix)
    registry = Registry()

    @registry.handler(name)
    async def double(job: Job) -> int:
        return int(job.data) * 2

    # Load the claim script first so the worker's first claim is one EVALSHA (no NOSCRIPT
    # retry): then one more EVALSHA on the queue's node means the first claim has run.
    node = cluster.node_client(port)
    try:
        node.script_load(SCRIPTS.claim.body)
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
