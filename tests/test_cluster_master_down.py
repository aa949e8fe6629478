"""A master of a Redis Cluster that dies under workers, at each moment of their life.

Three masters, no replicas, and a ``cluster-node-timeout`` longer than any test, so a killed
master stays the owner of its slots in every slot map until the test starts it again (on its
port, from its append-only file): the window in which a failover would promote a replica lasts
as long as the test wants. Clients meanwhile get "Error 111 connecting to" the dead master. The
cluster answers (the seed node is up), so this is a cluster that cannot serve now: workers
retry, whether they are starting (the first slot map names the dead master), running, or
setting up their wake-up subscription, and serve the queue once the master is back.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
import redis
from redis.crc import key_slot

from panqueue import ConnectionError, ServerUnavailable, SyncQueueClient, TimeoutError
from panqueue._keys import QueueKeys, partition_keys
from panqueue._store import ops
from panqueue._store.transport import open_async_transport, translate_error
from panqueue.embedded import find_server_binary
from panqueue.testing import FaultProxy
from tests.apps.outage_app import PARTITIONED
from tests.helpers import APPS, WorkerProcess, ask_node, free_port, wait_until
from tests.test_cli import ECHO

pytestmark = pytest.mark.anyio

MASTERS = 3


def _cluster_ok(info: Any) -> bool:
    """CLUSTER INFO says ok (redis-py parses the answer to a dict, or leaves it text)."""
    if isinstance(info, dict):
        return info.get("cluster_state") == "ok"
    return "cluster_state:ok" in str(info)


@dataclass
class Cluster:
    ports: list[int]
    directory: Path
    buses: dict[int, int] = field(default_factory=dict)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start_node(self, port: int) -> None:
        node_dir = self.directory / str(port)
        node_dir.mkdir(exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [find_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-port", str(self.buses[port]),
             "--cluster-config-file", str(node_dir / "nodes.conf"),
             # No node is ever marked failed during a test: a dead master keeps its slots.
             "--cluster-node-timeout", "600000",
             "--dir", str(node_dir), "--save", "", "--appendonly", "yes",
             "--daemonize", "no", "--logfile", str(node_dir / "server.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        wait_until(lambda: self.procs[port].poll() is None and ask_node(port, "PING") is True,
                   10, f"cluster node on port {port} to answer PING")

    def kill(self, port: int) -> None:
        self.procs[port].kill()
        self.procs[port].wait()

    def restart(self, port: int) -> None:
        self.start_node(port)
        wait_until(self.healthy, 30, "cluster_state:ok on every node after the restart")

    def healthy(self) -> bool:
        return all(_cluster_ok(ask_node(port, "CLUSTER", "INFO")) for port in self.ports)

    def owner(self, key: str) -> int | None:
        slot = key_slot(key.encode())
        for start, end, master, *_ in ask_node(self.ports[0], "CLUSTER", "SLOTS") or []:
            if start <= slot <= end:
                return int(master[1])
        return None

    def url_without(self, port: int) -> str:
        """A URL whose seed is a node other than ``port``."""
        seed = next(p for p in self.ports if p != port)
        return f"redis+cluster://127.0.0.1:{seed}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cli = shutil.which("redis-cli")
    assert cli is not None, "redis-cli is needed to create the cluster"
    running = Cluster([], Path(tempfile.mkdtemp(prefix="panqueue-cluster-down-")))
    try:
        used: set[int] = set()
        while len(running.ports) < MASTERS:
            port, bus = free_port(), free_port()
            if port in used or bus in used or port == bus:
                continue
            used |= {port, bus}
            running.ports.append(port)
            running.buses[port] = bus
            running.start_node(port)
        created = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in running.ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert created.returncode == 0, created.stdout + created.stderr
        wait_until(running.healthy, 30, "cluster_state:ok on every node")
        yield running
    finally:
        for proc in running.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in running.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(running.directory, ignore_errors=True)


@pytest.fixture
def echo_master(cluster: Cluster) -> Iterator[int]:
    """The port of the master that holds the echo queue; started again after the test if the
    test left it dead."""
    port = cluster.owner(QueueKeys(ECHO).prefix)
    assert port is not None
    yield port
    if cluster.procs[port].poll() is not None:
        cluster.restart(port)


def _echo_completes(url: str, n: int, worker: WorkerProcess) -> None:
    with SyncQueueClient(url) as client:
        handle = client.queue(ECHO).add({"n": n})
        try:
            result = handle.result(timeout=30)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; {client.explain(ECHO, handle.id)}; the worker's "
                                 f"log:\n{worker.stderr}") from None
        assert result == {"echo": {"n": n}}


def test_a_node_of_a_cluster_that_answered_is_failing_over_not_unreachable() -> None:
    """The classification: redis-py got the address it could not connect to from a slot map
    that a node gave it, so the cluster answered and one master cannot serve now. A cluster
    of which no node answers, and a login refused, stay plain connection errors."""
    url = "redis+cluster://127.0.0.1:7000"
    for error in (redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:7001."),
                  redis.exceptions.TimeoutError("Timeout connecting to server")):
        translated = translate_error(url, error)
        assert isinstance(translated, ServerUnavailable), error
        assert "a master of the cluster cannot be reached" in str(translated)
        assert str(error) in str(translated)
    disagree = translate_error(url, redis.exceptions.RedisClusterException(
        "startup_nodes could not agree on a valid slots cache: 127.0.0.1:7001 vs ..."))
    assert isinstance(disagree, ServerUnavailable)
    seed_loading = redis.exceptions.RedisClusterException(
        "Redis Cluster cannot be connected. Please provide at least one reachable node: "
        "Redis is loading the dataset in memory")
    seed_loading.__cause__ = redis.exceptions.BusyLoadingError(
        "Redis is loading the dataset in memory")
    assert isinstance(translate_error(url, seed_loading), ServerUnavailable)
    for plain in (redis.exceptions.RedisClusterException(
                      "Redis Cluster cannot be connected. Please provide at least one "
                      "reachable node: Error 111 connecting to 127.0.0.1:7000."),
                  redis.exceptions.AuthenticationError("invalid username-password pair")):
        translated = translate_error(url, plain)
        assert isinstance(translated, ConnectionError)
        assert not isinstance(translated, ServerUnavailable), plain
    standalone = translate_error("redis://127.0.0.1:7000/0",
                                 redis.exceptions.ConnectionError("Error 111 connecting"))
    assert not isinstance(standalone, ServerUnavailable)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_worker_started_while_its_master_is_dead_waits_and_serves_once_it_is_back(
        cluster: Cluster, echo_master: int, tmp_path: Path, backend: str) -> None:
    """Killed before the worker starts: the worker's first slot map (from the seed, alive)
    names the dead master, and every step of its start meets "Error 111 connecting to" it.
    The worker logs that it retries, stays up, and serves once the master is back."""
    url = cluster.url_without(echo_master)
    cluster.kill(echo_master)
    worker = _worker_retrying_its_start(tmp_path, url, backend)
    try:
        assert "cannot serve now" in worker.stderr, worker.stderr
        cluster.restart(echo_master)
        _echo_completes(url, 1, worker)
        assert worker.alive(), worker.stderr
    finally:
        worker.kill()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_partitioned_queues_worker_started_while_its_first_partitions_master_is_dead(
        cluster: Cluster, tmp_path: Path, backend: str) -> None:
    """A queue of three partitions, one per master; the master of its first partition (the
    first one a starting worker sets up) is dead: the worker retries its start, and once the
    master is back it serves every partition."""
    parts = partition_keys(PARTITIONED, 3)
    victim = cluster.owner(parts[0].prefix)
    assert victim is not None
    url = cluster.url_without(victim)
    cluster.kill(victim)
    # Debug: every activity's trouble is a line there (at info, only the outage's first).
    worker = WorkerProcess(tmp_path, "--url", url, "-q", PARTITIONED, "--backend", backend,
                           "--poll-interval", "0.2", "--log-level", "debug",
                           app="outage_app:queues", path=APPS)
    try:
        wait_until(lambda: "starting the worker failed; retrying until Redis answers"
                   in worker.stderr or not worker.alive(), 30, "the worker to retry its start")
        assert worker.alive(), worker.stderr
        cluster.restart(victim)
        # Started: the queue's layout (three partitions) is stored, which a producer naming
        # the queue by its name follows.
        wait_until(lambda: "worker started" in worker.stderr or not worker.alive(), 30,
                   "the worker to start")
        with SyncQueueClient(url) as client:
            handles = client.queue(PARTITIONED).add_bulk(list(range(6)))
            # A generated id names its partition (id % count): one job at least in each.
            assert {int(h.id) % 3 for h in handles} == {0, 1, 2}
            for n, handle in enumerate(handles):
                assert handle.result(timeout=30) == n, worker.stderr
        assert worker.alive(), worker.stderr
    finally:
        worker.kill()
        if cluster.procs[victim].poll() is not None:
            cluster.restart(victim)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_running_worker_rides_out_its_master_dying_and_serves_once_it_is_back(
        cluster: Cluster, echo_master: int, tmp_path: Path, backend: str) -> None:
    """Killed while the worker runs: its claims, its slot map's refreshes and its wake-up
    subscription all meet the dead master until it is back."""
    url = cluster.url_without(echo_master)
    worker = WorkerProcess(tmp_path, "--url", url, "-q", ECHO, "--backend", backend,
                           "--poll-interval", "0.2", "--log-level", "debug")
    try:
        # Started, and so registered idle: a job added before could go to the idle
        # registration the previous test's worker made just before it was killed.
        wait_until(lambda: "worker started" in worker.stderr or not worker.alive(), 30,
                   "the worker to start")
        _echo_completes(url, 1, worker)
        cluster.kill(echo_master)
        wait_until(lambda: "claiming jobs failed; retrying until Redis answers"
                   in worker.stderr or not worker.alive(), 30, "the worker to retry its claims")
        assert worker.alive(), worker.stderr
        cluster.restart(echo_master)
        _echo_completes(url, 2, worker)
        assert worker.alive(), worker.stderr
    finally:
        worker.kill()


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_subscription_on_a_dead_master_is_server_unavailable(
        cluster: Cluster, echo_master: int, anyio_backend: str) -> None:
    """The wake-up subscription goes to the channel's master, which is dead: the cluster
    cannot serve it now (retried at start and while running), on either transport."""
    url = cluster.url_without(echo_master)
    transport = open_async_transport(url)
    try:
        await transport.node_of(QueueKeys(ECHO).notify)  # the slot map, while all are up
        await anyio.to_thread.run_sync(cluster.kill, echo_master)
        with pytest.raises(ServerUnavailable, match="a master of the cluster cannot be reached"):
            await transport.subscribe(QueueKeys(ECHO).notify)
    finally:
        await transport.aclose()


@pytest.fixture
def unassigned_slot(cluster: Cluster) -> Iterator[tuple[int, int]]:
    """A slot that no node serves while the test runs ((slot, its owner before)): the cluster
    answers, with a slot map that leaves it out (a cluster being set up or repaired). Its
    owner takes it back at the end."""
    key = "{panqueue-unassigned}"
    slot, owner = key_slot(key.encode()), cluster.owner(key)
    assert owner is not None
    for port in cluster.ports:
        assert ask_node(port, "CLUSTER", "DELSLOTS", slot) == "OK"
    yield slot, owner
    if cluster.owner(key) is None:
        ask_node(owner, "CLUSTER", "ADDSLOTS", slot)
    wait_until(cluster.healthy, 30, "cluster_state:ok once the slot is served again")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_worker_started_while_the_slot_map_has_a_gap_waits_and_serves_once_it_is_whole(
        cluster: Cluster, unassigned_slot: tuple[int, int], tmp_path: Path,
        backend: str) -> None:
    """The first slot map a worker fetches leaves a slot out (redis-py refuses it: "All slots
    are not covered"): the cluster answered, so the worker waits, on either backend (on trio
    the slot map is fetched as the sync client is made), and serves once the slot has a master
    again."""
    slot, owner = unassigned_slot
    url = cluster.url_without(-1)
    worker = _worker_retrying_its_start(tmp_path, url, backend)
    try:
        assert ask_node(owner, "CLUSTER", "ADDSLOTS", slot) == "OK"
        wait_until(cluster.healthy, 30, "cluster_state:ok once the slot is served again")
        _echo_completes(url, 3, worker)
        assert worker.alive(), worker.stderr
    finally:
        worker.kill()


def _worker_retrying_its_start(tmp_path: Path, url: str, backend: str) -> WorkerProcess:
    """A worker process of the echo queue, once it says it retries its start (and is alive)."""
    worker = WorkerProcess(tmp_path, "--url", url, "-q", ECHO, "--backend", backend,
                           "--poll-interval", "0.2", "--log-level", "debug")
    try:
        wait_until(lambda: "starting the worker failed; retrying until Redis answers"
                   in worker.stderr or not worker.alive(), 30, "the worker to retry its start")
        assert worker.alive(), worker.stderr
    except BaseException:
        worker.kill()
        raise
    return worker


def _clients(cluster: Cluster) -> set[tuple[int, str]]:
    """The client connections of every node (node port, client id), but the one asking. A
    connection opened later has a new id, so earlier tests' connections closing meanwhile do
    not hide one."""
    return {(port, line.split()[0]) for port in cluster.ports
            for line in ask_node(port, "CLIENT", "LIST").splitlines() if "cmd=client" not in line}


@pytest.mark.parametrize("anyio_backend", ["trio"])  # the cluster client made by a call: trio's
async def test_a_cluster_client_made_by_a_call_abandoned_at_close_is_closed(
        cluster: Cluster, anyio_backend: str) -> None:
    """On trio the cluster client is made by the first call, in its thread. A call cancelled
    while the seed answers slowly leaves that thread running; the transport is closed
    meanwhile, so the client the thread then makes is closed too and sends nothing: no
    connection to any node is left open."""
    before = _clients(cluster)
    with FaultProxy(cluster.ports[0]) as proxy:
        proxy.delay(0.5)  # each chunk, both ways: making the client takes a few seconds
        transport = open_async_transport(f"redis+cluster://127.0.0.1:{proxy.port}")
        with anyio.move_on_after(0.2):
            await transport.run(ops.ping())
        await transport.aclose()
        await anyio.to_thread.run_sync(proxy.wait_for_connections, 1)
        await anyio.to_thread.run_sync(
            wait_until, lambda: proxy.active_connections == 0, 20,
            "the abandoned call's client to be made and closed")
        # Nothing can be awaited for what an abandoned thread does next (it would open a
        # connection to a node for the PING): give it a second, a hundred times what it needs.
        await anyio.sleep(1.0)
        assert _clients(cluster) - before == set()
