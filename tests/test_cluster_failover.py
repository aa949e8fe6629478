"""Failovers under a running Redis Cluster: three masters, one replica each, ``appendonly yes``.

Worker processes run a batch of no-op jobs spread over six queues (so over every master). Mid-run
the test fails over the master of one queue twice: first with ``CLUSTER FAILOVER`` on its replica
(a coordinated switch: the replica catches up, then takes over), then by SIGKILL of the new
master (its replica, the old master, is elected after ``cluster-node-timeout``). During each
switch the workers meet ``MOVED`` answers, refused connections and ``CLUSTERDOWN``; they must
retry them all. Afterwards:

* no job is lost: every job added is ``completed``;
* none is completed twice: a live tail of every queue's event stream sees one ``completed``
  event per job (the tail would also see a completion that the kill then lost);
* every worker process is still alive, and serves a job added after the faults.

All jobs are added, and replicated (each replica's offset checked), before the workers start,
so the only writes in flight at the kill are the workers' own: claims and completions. On
loopback a replica receives each write within the same turn of the master's event loop, so the
kill loses none in practice; in general, asynchronous replication can lose the last writes a
master acknowledged (see docs/reliability.md), and a job whose completion was lost would run
and complete once more. The number of jobs is ``$PANQUEUE_FAILOVER_JOBS`` (default 6,000; the
figures for 20,000 are in docs/reliability.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
import redis
from redis.crc import key_slot

from panqueue import (
    ConnectionError,
    JobNotFound,
    JobState,
    QueueClient,
    ServerUnavailable,
    SyncQueueClient,
)
from panqueue._keys import QueueKeys
from panqueue._store.transport import translate_error
from panqueue._store.transport.errors import _translated
from panqueue.embedded import find_server_binary
from tests.apps.failover_app import CLUSTER_QUEUES
from tests.failover import journal_runs, tail_completions
from tests.helpers import APPS, WorkerProcess, ask_node, free_port, wait_until

pytestmark = pytest.mark.anyio

MASTERS = 3
NODES = 2 * MASTERS
QUEUES = [f"fo-cluster-{i}" for i in range(CLUSTER_QUEUES)]
JOBS = int(os.environ.get("PANQUEUE_FAILOVER_JOBS", "20000"))


@dataclass
class Cluster:
    ports: list[int]
    procs: dict[int, subprocess.Popen[bytes]]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def alive(self) -> list[int]:
        return [port for port in self.ports if self.procs[port].poll() is None]

    def owner(self, key: str, asking: int | None = None) -> int | None:
        """The port of the master that serves ``key``'s slot, per node ``asking``."""
        slot = key_slot(key.encode())
        for start, end, master, *_ in ask_node(asking or self.alive()[0], "CLUSTER", "SLOTS") or []:
            if start <= slot <= end:
                return int(master[1])
        return None

    def agreed_owner(self, key: str) -> int | None:
        """The slot's master if every live node names the same one, and it is up."""
        owners = {self.owner(key, port) for port in self.alive()}
        owner = owners.pop() if len(owners) == 1 else None
        return owner if owner in self.alive() else None

    def replica_of(self, master: int) -> int:
        master_id = ask_node(master, "CLUSTER", "MYID")
        for port in self.alive():
            if port != master and f"slave {master_id}" in _nodes_line(port):
                return port
        raise AssertionError(f"no replica of the master on port {master}")

    def healthy(self) -> bool:
        return all("cluster_state:ok" in str(ask_node(port, "CLUSTER", "INFO"))
                   for port in self.alive())

    def replicas_in_sync(self) -> bool:
        """Every live master's replicas have received all it wrote."""
        for port in self.alive():
            info = ask_node(port, "INFO", "replication") or {}
            if info.get("role") != "master":
                continue
            offset = info.get("master_repl_offset")
            replicas = [v for k, v in info.items() if k.startswith("slave") and k[5:].isdigit()]
            if not replicas or any(r.get("offset") != offset for r in replicas):
                return False
        return True


def _nodes_line(port: int) -> str:
    """The ``myself`` line of CLUSTER NODES on ``port``."""
    nodes = ask_node(port, "CLUSTER", "NODES")
    text = nodes if isinstance(nodes, str) else ""
    return next((line for line in text.splitlines() if "myself" in line), "")


@contextmanager
def _cluster_with_replicas(directory: Path) -> Iterator[Cluster]:
    binary = find_server_binary()
    cli = shutil.which("redis-cli")
    assert cli is not None, "redis-cli is needed to create the cluster"
    procs: dict[int, subprocess.Popen[bytes]] = {}
    ports: list[int] = []
    try:
        used: set[int] = set()
        while len(ports) < NODES:
            port, bus = free_port(), free_port()
            if port in used or bus in used or port == bus:
                continue
            used |= {port, bus}
            node_dir = directory / str(port)
            node_dir.mkdir()
            ports.append(port)
            procs[port] = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-port", str(bus),
                 "--cluster-config-file", str(node_dir / "nodes.conf"),
                 # A dead master is replaced within a few seconds.
                 "--cluster-node-timeout", "2000",
                 "--dir", str(node_dir), "--save", "", "--appendonly", "yes",
                 "--repl-diskless-sync-delay", "0",
                 "--daemonize", "no", "--logfile", str(node_dir / "server.log")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        for port in ports:
            wait_until(lambda p=port: procs[p].poll() is None and ask_node(p, "PING") is True,
                       10, f"cluster node on port {port} to answer PING")
        created = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert created.returncode == 0, created.stdout + created.stderr
        cluster = Cluster(ports, procs)
        wait_until(lambda: cluster.healthy() and all(
            f"cluster_known_nodes:{NODES}" in str(ask_node(p, "CLUSTER", "INFO")) for p in ports),
            30, "cluster_state:ok on every node")
        wait_until(cluster.replicas_in_sync, 30, "every replica to sync with its master")
        yield cluster
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    directory = Path(tempfile.mkdtemp(prefix="panqueue-cluster-failover-"))
    try:
        with _cluster_with_replicas(directory) as running:
            yield running
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _missing(cluster: Cluster, ids: dict[str, list[str]],
                   completed: dict[str, Counter[str]]) -> str:
    """The jobs not seen completing, with their state, for a failure message."""
    lines = []
    async with QueueClient(cluster.url) as client:
        for queue, job_ids in ids.items():
            missing = [i for i in job_ids if i not in completed[queue]]
            states: Counter[str] = Counter()
            for job_id in missing[:50]:
                try:
                    states[(await client.get_job(queue, job_id)).state.value] += 1
                except JobNotFound:
                    states["not found"] += 1
            lines.append(f"{queue}: {len(missing)} missing {dict(states)} {missing[:5]} "
                         f"counts {await client.counts(queue)}")
    return "; ".join(lines)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the worker processes run both backends
async def test_no_job_is_lost_or_completed_twice_across_two_failovers(
        cluster: Cluster, tmp_path: Path, anyio_backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    monkeypatch.setenv("FAILOVER_JOURNAL", str(journal))
    target_key = QueueKeys(QUEUES[0]).prefix
    first_master = cluster.owner(target_key)
    assert first_master is not None

    per_queue = {queue: len(range(n0, JOBS, len(QUEUES))) for n0, queue in enumerate(QUEUES)}

    def add_all() -> dict[str, list[str]]:
        added: dict[str, list[str]] = {queue: [] for queue in QUEUES}
        with SyncQueueClient(cluster.url) as client:
            for queue in QUEUES:  # every event is written from now: the tails count them
                client.read_events(queue)
            for queue, count in per_queue.items():
                for start in range(0, count, 1000):
                    batch = range(start, min(start + 1000, count))
                    handles = client.queue(queue).add_bulk([{"n": n} for n in batch])
                    added[queue] += [handle.id for handle in handles]
        return added

    ids = await anyio.to_thread.run_sync(add_all)
    await anyio.to_thread.run_sync(wait_until, cluster.replicas_in_sync, 30,
                                   "every job to reach the replicas")

    completed: dict[str, Counter[str]] = {queue: Counter() for queue in QUEUES}
    done = lambda: sum(sum(c.values()) for c in completed.values())  # noqa: E731
    for i in range(2):
        (tmp_path / f"w{i}").mkdir()
    workers = [WorkerProcess(tmp_path / f"w{i}", "--url", cluster.url, "--backend", backend,
                             app="failover_app:queues", path=APPS)
               for i, backend in enumerate(("asyncio", "trio"))]
    figures: dict[str, float] = {}
    try:
        async with anyio.create_task_group() as tg:
            for queue in QUEUES:
                tg.start_soon(tail_completions, cluster.url, queue, completed[queue])
            started = time.monotonic()

            # 1. CLUSTER FAILOVER on the replica of the first queue's master, a fifth in.
            await anyio.to_thread.run_sync(wait_until, lambda: done() >= JOBS // 5, 60,
                                           "a fifth of the jobs to complete")
            replica = cluster.replica_of(first_master)
            assert ask_node(replica, "CLUSTER", "FAILOVER") == "OK"
            switch = time.monotonic()
            await anyio.to_thread.run_sync(
                wait_until, lambda: cluster.agreed_owner(target_key) == replica, 30,
                "every node to name the replica as the slot's master")
            figures["manual_failover_s"] = time.monotonic() - switch
            figures["done_at_manual_failover"] = done()
            assert done() < JOBS, "the jobs ran out before the second fault"

            # 2. SIGKILL of the new master, once another tenth of the jobs has completed.
            second = figures["done_at_manual_failover"] + JOBS // 10
            await anyio.to_thread.run_sync(wait_until, lambda: done() >= second, 60,
                                           "another tenth of the jobs to complete")
            figures["done_at_kill"] = done()
            cluster.procs[replica].kill()
            cluster.procs[replica].wait()
            killed = time.monotonic()
            await anyio.to_thread.run_sync(
                wait_until, lambda: cluster.agreed_owner(target_key) == first_master, 30,
                "the old master to be elected again after the kill")
            await anyio.to_thread.run_sync(wait_until, cluster.healthy, 30,
                                           "cluster_state:ok on every live node")
            figures["kill_failover_s"] = time.monotonic() - killed
            assert figures["done_at_kill"] < JOBS, "the jobs ran out before the kill"

            try:
                await anyio.to_thread.run_sync(
                    wait_until, lambda: all(set(completed[q]) >= set(ids[q]) for q in QUEUES),
                    60, "every job to complete")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {await _missing(cluster, ids, completed)}; "
                                     f"worker logs: {[w.stderr[-3000:] for w in workers]}"
                                     ) from None
            figures["run_s"] = time.monotonic() - started
            for worker in workers:
                assert worker.alive(), worker.stderr

            # Still serving: one more job per queue, added after the faults, completes.
            async with QueueClient(cluster.url) as client:
                for queue in QUEUES:
                    handle = await client.queue(queue).add({}, job_id=f"{queue}-after")
                    assert await handle.result(timeout=30) == f"{queue}-after"
                counts = {queue: await client.counts(queue) for queue in QUEUES}
            tg.cancel_scope.cancel()

        runs = journal_runs(journal)
        # Completed once in the data: every job has exactly one completed record in its
        # queue's history stream on the masters that survived (a script's effects replicate
        # together, so a completion the failover lost took its record with it).
        twice = {}
        store = redis.RedisCluster.from_url(cluster.url.replace("redis+cluster://", "redis://"))
        try:
            for queue in QUEUES:
                records = store.xrange(QueueKeys(queue).history)
                done = Counter(fields[b"id"].decode() for _, fields in records
                               if fields[b"state"] == b"completed")
                twice.update({job: n for job, n in done.items() if n > 1})
                assert set(done) >= set(ids[queue]), queue
        finally:
            store.close()
        assert not twice, f"completed more than once: {sorted(twice)[:20]}"
        # The live tail of completion events may see a job complete twice: when the master it
        # read from acknowledged a completion and was killed before replicating it, the job
        # ran again (at-least-once). That is the loss docs/reliability.md describes under
        # asynchronous replication; it is counted, not hidden.
        figures["completions_seen_twice_live"] = sum(
            1 for queue in QUEUES for n in completed[queue].values() if n > 1)
        for queue in QUEUES:
            assert counts[queue][JobState.COMPLETED] == len(ids[queue]) + 1, queue
            assert all(runs[(queue, job_id)] >= 1 for job_id in ids[queue])
        reruns = sum(runs.values()) - JOBS - len(QUEUES)
        print(f"cluster failover: {JOBS} jobs, {reruns} re-runs, " +
              ", ".join(f"{k}={v:.1f}" for k, v in figures.items()))
        # The faults reached the workers: some call failed during a switch and was retried
        # until it worked again, or a wake-up subscription broke and was re-established.
        logs = "".join(worker.stderr for worker in workers)
        assert "works again" in logs or "wake-up channel re-established" in logs, logs[-3000:]
        for worker in workers:
            assert worker.alive(), worker.stderr
            assert await anyio.to_thread.run_sync(worker.stop) == 0, worker.stderr
    finally:
        for worker in workers:
            worker.kill()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_worker_started_while_a_master_fails_over_serves_once_its_replica_takes_over(
        cluster: Cluster, tmp_path: Path, backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL of a queue's master, then at once a worker for that queue: its first slot map
    names the dead master until the cluster notices (refused connections, then CLUSTERDOWN),
    then the replica. The worker retries its start throughout, and serves the queue."""
    monkeypatch.setenv("FAILOVER_JOURNAL", str(tmp_path))
    queue = QUEUES[0]
    key = QueueKeys(queue).prefix
    master = cluster.owner(key)
    assert master is not None
    replica = cluster.replica_of(master)
    seed = next(port for port in cluster.ports if port not in (master, replica))
    cluster.procs[master].kill()
    cluster.procs[master].wait()
    worker = WorkerProcess(tmp_path, "--url", f"redis+cluster://127.0.0.1:{seed}", "-q", queue,
                           "--backend", backend, "--poll-interval", "0.2",
                           app="failover_app:queues", path=APPS)
    try:
        wait_until(lambda: cluster.agreed_owner(key) == replica or not worker.alive(), 30,
                   "every node to name the replica as the slot's master")
        wait_until(cluster.healthy, 30, "cluster_state:ok on every live node")
        assert worker.alive(), worker.stderr
        with SyncQueueClient(cluster.url.replace(str(cluster.ports[0]), str(seed))) as client:
            handle = client.queue(queue).add({}, job_id=f"{queue}-after-failover")
            assert handle.result(timeout=30) == f"{queue}-after-failover", worker.stderr
        assert worker.alive(), worker.stderr
    finally:
        worker.kill()


def test_a_blocking_read_ended_by_a_failover_is_server_unavailable() -> None:
    """A master that turns into a replica ends its clients' blocking reads (the XREAD BLOCK of
    ``result()`` and ``events()``) with UNBLOCKED: nothing was read, so it is retried like any
    server that cannot serve now, not raised as a refused command."""
    url = "redis+cluster://127.0.0.1:7000"
    error = translate_error(url, redis.exceptions.ResponseError(
        "UNBLOCKED force unblock from blocking operation, instance state changed "
        "(master -> replica?)"))
    assert isinstance(error, ServerUnavailable)
    assert "UNBLOCKED" in str(error)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # redis.asyncio runs on asyncio only
async def test_a_connection_closed_under_a_call_is_a_connection_error(
        anyio_backend: str) -> None:
    """redis.asyncio's cluster client closes a node's connections when the topology changes,
    even one another task is sending on; that task gets an AttributeError from redis-py's
    connection code. It is a lost connection (retried), not a crash of the worker; an
    AttributeError anywhere else is still a bug and is raised as it is."""
    from redis.asyncio.connection import Connection

    closed = Connection(host="127.0.0.1", port=free_port())  # never connected: no writer
    url = "redis+cluster://127.0.0.1:7000"
    with pytest.raises(ConnectionError, match="connection was closed during the call"):
        with _translated(url):
            await closed._send_packed_command([b"PING\r\n"])
    with pytest.raises(AttributeError):
        with _translated(url):
            getattr(None, "writelines")  # noqa: B009
