"""The transport under faults: server refusals, silent networks, and many subscriptions on trio.

Every server here is real: the session server, or a private one started (and stopped by its
PID) for a test that changes the server's configuration.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis
import redis.exceptions

from panqueue import (
    ConnectionError,
    Job,
    JobState,
    PanqueueError,
    QueueClient,
    Registry,
    ServerUnavailable,
    SyncQueueClient,
    WorkerPool,
)
from panqueue._keys import QueueKeys
from panqueue._store import transport
from panqueue._store.ops import NewJob, add_call
from panqueue._store.transport import (
    AsyncTransport,
    Batch,
    Command,
    SyncTransport,
    open_async_transport,
    translate_error,
)
from panqueue.embedded import RedisServer
from panqueue.testing import SCRIPT_CALLS, FaultProxy, run_worker
from tests.helpers import async_wait_until, echo_registry, free_port

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """A server of this module alone: tests here change its configuration (and restore it)."""
    with RedisServer(appendonly=False) as server:
        yield server


@pytest.fixture
def own_client(own_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_server.url)
    client.flushall()
    yield client
    client.close()


def _add_request(queue: str) -> Any:
    return add_call(QueueKeys(queue), [NewJob(None, b"\xc0")])


async def _each_transport(url: str, request: Any) -> list[BaseException]:
    """What the sync transport and the event loop's async transport raise for ``request``."""
    errors: list[BaseException] = []

    def sync_call() -> None:
        sync = SyncTransport(url)
        try:
            sync.execute(request)
        finally:
            sync.close()

    async_transport: AsyncTransport = open_async_transport(url)
    for call in (lambda: anyio.to_thread.run_sync(sync_call),
                 lambda: async_transport.execute(request)):
        try:
            await call()
        except BaseException as exc:
            errors.append(exc)
        else:
            errors.append(AssertionError(f"{request!r} did not fail"))
    await async_transport.aclose()
    return errors


# --------------------------------------------------------------------------- server refusals


@pytest.fixture
def out_of_memory(own_client: redis.Redis) -> Iterator[None]:
    """The server refuses every write that needs memory (maxmemory 1 byte, no eviction)."""
    policy = own_client.config_get("maxmemory-policy")["maxmemory-policy"]
    own_client.config_set("maxmemory-policy", "noeviction")
    own_client.config_set("maxmemory", "1")
    try:
        yield
    finally:
        own_client.config_set("maxmemory", "0")
        own_client.config_set("maxmemory-policy", policy)


async def test_an_out_of_memory_server_is_unavailable_not_a_refusal(
        anyio_backend: str, own_server: RedisServer, out_of_memory: None) -> None:
    requests = [Command(("SET", "k", "v")), _add_request("oom"),
                Batch((Command(("GET", "k")), Command(("SET", "k", "v"))))]
    for request in requests:
        for exc in await _each_transport(own_server.url, request):
            assert isinstance(exc, ServerUnavailable), repr(exc)
            assert isinstance(exc, ConnectionError)
            assert "cannot serve now: OOM" in str(exc), str(exc)


async def test_a_server_busy_running_a_script_is_unavailable(
        anyio_backend: str, own_server: RedisServer, own_client: redis.Redis) -> None:
    # A script that spins for 1.5 s by the server's clock; after 100 ms the server answers
    # every other client BUSY (and still lets the script end by itself).
    spin = ("local t0 = redis.call('TIME') local t repeat t = redis.call('TIME') "
            "until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 1500000 return 1")
    def run_spin() -> None:
        client = redis.Redis.from_url(own_server.url)
        try:
            client.eval(spin, 0)
        finally:
            client.close()

    own_client.config_set("busy-reply-threshold", "100")
    spinner = threading.Thread(target=run_spin)
    spinner.start()
    try:
        await anyio.sleep(0.3)
        errors = await _each_transport(own_server.url, Command(("GET", "k")))
    finally:
        spinner.join()
        own_client.config_set("busy-reply-threshold", "5000")
    for exc in errors:
        assert isinstance(exc, ServerUnavailable), repr(exc)
        assert "cannot serve now: BUSY" in str(exc), str(exc)


async def test_a_replica_refusing_writes_is_unavailable(
        anyio_backend: str, own_server: RedisServer, own_client: redis.Redis) -> None:
    """What a client that still writes to a demoted master gets after a failover."""
    own_client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # nobody there
    try:
        errors = await _each_transport(own_server.url, _add_request("readonly"))
    finally:
        own_client.execute_command("REPLICAOF", "NO", "ONE")
    for exc in errors:
        assert isinstance(exc, ServerUnavailable), repr(exc)
        assert "cannot serve now: READONLY" in str(exc), str(exc)


@pytest.mark.parametrize("error", [
    redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
    redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    redis.exceptions.MasterDownError("Link with MASTER is down and replica-serve-stale-data is "
                                     "set to 'no'."),
    redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
    redis.exceptions.ClusterDownError("The cluster is down"),
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    redis.exceptions.ResponseError("BUSY Redis is busy running a script."),
    redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
    redis.exceptions.ResponseError("Command # 2 (EVAL ...) of pipeline caused error: BUSY Redis "
                                   "is busy running a script."),
], ids=lambda e: str(e)[:20])
def test_every_cannot_serve_now_answer_is_server_unavailable(error: Exception) -> None:
    translated = translate_error("redis://u:secret@127.0.0.1:1/0", error)
    assert isinstance(translated, ServerUnavailable), repr(translated)
    assert "secret" not in str(translated)


@pytest.mark.parametrize("error", [
    redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
    redis.exceptions.NoPermissionError("this user has no permissions to run the 'eval' command"),
    redis.exceptions.ResponseError("ERR Error running script: BUSY is just a word here"),
], ids=lambda e: str(e)[:20])
def test_other_refusals_stay_plain_panqueue_errors(error: Exception) -> None:
    translated = translate_error("redis://127.0.0.1:1/0", error)
    assert type(translated) is PanqueueError
    assert "refused a command" in str(translated)


async def test_a_worker_rides_out_an_out_of_memory_server(
        anyio_backend: str, own_server: RedisServer, own_client: redis.Redis,
        queue_name: str) -> None:
    """The completion of a job cannot be recorded while the server is out of memory; the
    worker keeps it and records it once memory is back, and goes on working."""
    registry = Registry()
    gate = anyio.Event()

    @registry.handler(queue_name)
    async def gated(job: Job) -> str:
        if job.data == "first":
            await gate.wait()
        return f"done {job.data}"

    with anyio.fail_after(30):
        async with QueueClient(own_server.url) as client:
            first = await client.queue(queue_name).add("first")
            async with run_worker(registry, queue_name, own_server.url) as worker:
                await async_wait_until(lambda: _is_active(client, queue_name, first.id))
                own_client.config_set("maxmemory-policy", "noeviction")
                own_client.config_set("maxmemory", "1")
                try:
                    gate.set()
                    await anyio.sleep(1.5)  # the worker's first attempts meet OOM
                finally:
                    own_client.config_set("maxmemory", "0")
                assert await first.result(timeout=10) == "done first"
                second = await client.queue(queue_name).add("second")
                assert await second.result(timeout=10) == "done second"
    assert worker.processed == 2


async def _is_active(client: QueueClient, queue: str, job_id: str) -> bool:
    return (await client.get_job(queue, job_id)).state is JobState.ACTIVE


# --------------------------------------------------------------------------- scripts


async def test_a_script_the_server_forgot_is_sent_in_full_alone_or_in_a_batch(
        anyio_backend: str, redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    """After SCRIPT FLUSH (or a restart, or a failover to a node that never saw the script),
    EVALSHA answers NOSCRIPT: a script call falls back to EVAL, and a batch sends EVAL. (A
    transport that calls scripts with EVALSHA: one whose server or user refused functions;
    tests/test_functions.py has the same for a server without a library.)"""
    alone, in_batch = _add_request(queue_name), _add_request(queue_name)
    batch = Batch((Command(("INCR", f"{{q:{queue_name}}}:n")), in_batch))

    def sync_calls() -> None:
        sync = SyncTransport(redis_url)
        sync._functions.on = False
        try:
            redis_client.script_flush()
            sync.execute(alone)
            redis_client.script_flush()
            sync.execute(batch)
        finally:
            sync.close()

    await anyio.to_thread.run_sync(sync_calls)
    async_transport = open_async_transport(redis_url)
    async_transport._functions.on = False  # type: ignore[attr-defined]
    try:
        redis_client.script_flush()
        await async_transport.execute(alone)
        redis_client.script_flush()
        counter, added = await async_transport.execute(batch)
    finally:
        await async_transport.aclose()
    assert counter == 2
    assert len(added) == 2  # one job id, and whether it was created
    assert redis_client.llen(QueueKeys(queue_name).wait_list) == 4


# --------------------------------------------------------------------------- silent networks


class Blackhole:
    """A TCP listener on 127.0.0.1 that accepts connections and never answers."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._held.append(connection)

    def close(self) -> None:
        self._closing.set()
        self._thread.join(5)
        self._listener.close()
        for connection in self._held:
            connection.close()


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    hole = Blackhole()
    yield hole
    hole.close()  # also ends calls of a transport that would hang forever


async def _fails_within(seconds: float, call: Callable[[], Any]) -> BaseException:
    started = time.monotonic()
    with anyio.fail_after(seconds):
        try:
            await call()
        except PanqueueError as exc:
            assert time.monotonic() - started < seconds
            return exc
    raise AssertionError("the call succeeded against a server that never answers")


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
async def test_a_server_that_never_answers_ends_calls_with_a_connection_error(
        anyio_backend: str, blackhole: Blackhole, scheme: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every client (sync, asyncio or trio; standalone or cluster) bounds its calls with the
    transport's socket timeouts. Shortened here; the defaults are seconds long."""
    monkeypatch.setattr(transport.options, "CONNECT_TIMEOUT", 0.3)
    monkeypatch.setattr(transport.options, "SOCKET_TIMEOUT", 0.3)
    url = f"{scheme}://127.0.0.1:{blackhole.port}/0"

    def sync_call() -> None:
        sync = SyncTransport(url)
        try:
            sync.execute(Command(("PING",)))
        finally:
            sync.close()

    async def async_call() -> None:
        client = open_async_transport(url)
        try:
            await client.execute(Command(("PING",)))
        finally:
            with anyio.move_on_after(1, shield=True):
                await client.aclose()

    for call in (lambda: anyio.to_thread.run_sync(sync_call, abandon_on_cancel=True),
                 async_call):
        exc = await _fails_within(5, call)
        assert isinstance(exc, ConnectionError), repr(exc)
        assert f"127.0.0.1:{blackhole.port}" in str(exc)


async def test_the_url_may_set_the_socket_timeout(anyio_backend: str,
                                                  blackhole: Blackhole) -> None:
    url = f"redis://127.0.0.1:{blackhole.port}/0?socket_timeout=0.3"
    client = open_async_transport(url)
    try:
        exc = await _fails_within(5, lambda: client.execute(Command(("PING",))))
    finally:
        with anyio.move_on_after(1, shield=True):
            await client.aclose()
    assert isinstance(exc, ConnectionError), repr(exc)


def test_the_socket_timeout_outlasts_every_server_side_wait() -> None:
    from panqueue._producer import DURABLE_TIMEOUT_MS, EVENTS_BLOCK_MS
    from panqueue._store.ops.results import _RESULT_POLL_CHUNK

    longest = max(DURABLE_TIMEOUT_MS / 1000, EVENTS_BLOCK_MS / 1000, _RESULT_POLL_CHUNK)
    assert longest + 2 <= transport.SOCKET_TIMEOUT


# --------------------------------------------------------------------------- threads on trio


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_pool_of_many_queues_on_trio_claims_promptly(anyio_backend: str,
                                                              redis_url: str) -> None:
    """On trio each idle worker's wake-up subscriber holds a thread while it waits (and on
    Cluster and Sentinel every command runs in one too). 45 queues (more than anyio's default
    40 threads) must not leave subscriptions or claims queueing for a thread until a
    subscriber's wait ends."""
    registry, queues = echo_registry("many", 45)
    async with QueueClient(redis_url) as client:
        with anyio.fail_after(60):
            async with WorkerPool(registry, url=redis_url, queues=queues, grace=2.0):
                await anyio.sleep(0.5)  # every worker waits for wake-ups now
                started = time.monotonic()
                handle = await client.queue(queues[-1]).add("last")
                assert await handle.result(timeout=20) == f"{queues[-1]}:last"
                elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"the job waited {elapsed:.1f} s for a thread"


# --------------------------------------------------------------------------- closing


async def test_a_client_of_a_sentinel_url_closes_on_every_supported_redis_py(
        anyio_backend: str) -> None:
    """Closing closes each sentinel's client: redis-py 8.0 (the oldest supported) has no
    ``Sentinel.close()`` or ``aclose()``. Nothing here connects."""
    url = "redis+sentinel://127.0.0.1:1/mymaster"
    async_transport = open_async_transport(url)
    await async_transport.aclose()
    SyncTransport(url).close()


@pytest.mark.parametrize("drop", ["client kill", "idle timeout", "restart"])
def test_a_sync_add_after_the_server_dropped_its_pooled_connections_succeeds(
        drop: str, private_redis: RedisServer, queue_name: str) -> None:
    """The sync transport sends script calls on the pool's connections itself
    (``SyncTransport._send``): a connection the server closed while it sat in the pool (killed,
    idle timeout, restart) is replaced and the call sent again, as redis-py's own commands
    are, so the add after the drop answers and its job is there."""
    admin = redis.Redis.from_url(private_redis.url)
    try:
        with SyncQueueClient(private_redis.url) as client:
            queue = client.queue(queue_name)
            queue.add(1)
            assert len(admin.client_list()) == 2  # the client's pooled connection, and admin's
            if drop == "client kill":
                assert admin.client_kill_filter(_type="normal", skipme=True) == 1
            elif drop == "idle timeout":
                admin.config_set("timeout", 1)
                deadline = time.monotonic() + 10
                while len(admin.client_list()) > 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            else:
                private_redis.stop()
                private_redis.start()
            handle = queue.add(2)
            assert handle.created
            assert admin.exists(QueueKeys(queue_name).job(handle.id)) == 1
    finally:
        admin.close()


@pytest.mark.parametrize("drop", ["client kill", "restart"])
async def test_an_async_add_after_the_server_dropped_its_connections_succeeds(
        anyio_backend: str, drop: str, private_redis: RedisServer, queue_name: str) -> None:
    """The async transports keep the connections their script calls used (asyncio:
    ``_AsyncioTransport._send``; trio: its own pool): a kept connection the server closed
    (killed, restarted) is replaced and the call sent again, so the add after the drop answers
    and its job is there."""
    admin = redis.Redis.from_url(private_redis.url)
    try:
        async with QueueClient(private_redis.url) as client:
            queue = client.queue(queue_name)
            await queue.add(1)
            await queue.add(2)  # past the first add's layout reads: script calls alone
            if drop == "client kill":
                assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
            else:
                private_redis.stop()
                private_redis.start()
            handle = await queue.add(3)
            assert handle.created
            assert admin.exists(QueueKeys(queue_name).job(handle.id)) == 1
    finally:
        admin.close()


def test_a_sync_client_used_before_a_fork_gives_the_child_a_connection_of_its_own(
        private_redis: RedisServer, queue_name: str) -> None:
    """The sync transport keeps the connections its script calls used (``SyncTransport._send``)
    instead of handing each back to the pool: a process forked after an add (a web server's
    pre-forked workers) must not write on its parent's socket. The child's add opens a
    connection of its own, and the parent's next add still answers on the parent's."""
    admin = redis.Redis.from_url(private_redis.url)
    try:
        with SyncQueueClient(private_redis.url) as client:
            queue = client.queue(queue_name)
            queue.add(1)  # the first add stores the queue's layout, which the second reads
            queue.add(2)
            opened = admin.info("stats")["total_connections_received"]
            assert queue.add(3).created  # now one script call, on the connection kept
            assert admin.info("stats")["total_connections_received"] == opened
            pid = os.fork()
            if pid == 0:  # the child: report through the exit status only
                try:
                    code = 0 if queue.add(4).created else 3
                except BaseException:
                    code = 4
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            # The child's connection; the parent's was not used by it.
            assert admin.info("stats")["total_connections_received"] == opened + 1
            assert queue.add(5).created
            assert admin.info("stats")["total_connections_received"] == opened + 1
            assert admin.llen(QueueKeys(queue_name).wait_list) == 5
    finally:
        admin.close()


def test_threads_adding_through_one_sync_client_each_get_their_own_jobs_answered(
        redis_url: str, queue_name: str) -> None:
    """Script calls from many threads at once each take a connection of their own, kept or
    from the pool (``SyncTransport._send``): every add answers the job it added (its custom
    id), none another thread's reply, and the client opens no more connections than
    threads."""
    admin = redis.Redis.from_url(redis_url)
    threads_n, adds = 8, 150
    answered: list[tuple[str, str]] = []
    failed: list[BaseException] = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as they can
    try:
        # Named, so that only its own connections are counted: the session's server may hold
        # connections of earlier tests that the server has not seen closed yet.
        sep = "&" if "?" in redis_url else "?"
        with SyncQueueClient(f"{redis_url}{sep}client_name={queue_name}") as client:
            queue = client.queue(queue_name)
            queue.add(0)
            start = threading.Barrier(threads_n)

            def adder(n: int) -> None:
                try:
                    start.wait()
                    for i in range(adds):
                        wanted = f"t{n}-{i}"
                        answered.append((wanted, queue.add(i, job_id=wanted).id))
                except BaseException as exc:
                    failed.append(exc)

            threads = [threading.Thread(target=adder, args=(n,)) for n in range(threads_n)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert failed == []
            assert len(answered) == threads_n * adds
            assert all(wanted == got for wanted, got in answered)
            assert admin.llen(QueueKeys(queue_name).wait_list) == threads_n * adds + 1
            own = [c for c in admin.client_list() if c.get("name") == queue_name]
            assert 1 <= len(own) <= threads_n
    finally:
        sys.setswitchinterval(switch)
        admin.close()


def test_a_sync_script_call_whose_connection_broke_is_sent_again(
        private_redis: RedisServer, queue_name: str) -> None:
    """A pooled connection that breaks under the call (here: the server ran the add, and the
    connection was closed before its reply) is replaced and the call sent once more, as the
    pool's retry policy says for redis-py's own commands: an add with a custom id answers with
    its job, added once."""
    admin = redis.Redis.from_url(private_redis.url)
    with FaultProxy(private_redis.port) as proxy, SyncQueueClient(proxy.url) as client:
        queue = client.queue(queue_name)
        queue.add(1)
        proxy.drop_next_reply(match=SCRIPT_CALLS)
        handle = queue.add(2, job_id="once")
        assert proxy.replies_dropped == 1
        assert handle.id == "once"
        assert admin.llen(QueueKeys(queue_name).wait_list) == 2
    admin.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # redis.asyncio runs on asyncio only
async def test_the_asyncio_subscriber_reads_each_kind_of_reply_as_redis_sends_it(
        own_server: RedisServer, queue_name: str) -> None:
    """The asyncio subscriber reads pub/sub replies as they come (``PubSub.parse_response``),
    not through ``get_message``: a subscription confirmed and a health-check answer report
    b"", a published message its data, and a subscription the server ended raises (RESP2 and
    RESP3 alike)."""
    channel = QueueKeys(queue_name).notify
    publisher = redis.Redis.from_url(own_server.url)
    for protocol in (2, 3):
        client = redis.asyncio.Redis.from_url(own_server.url, protocol=protocol)
        pubsub = client.pubsub()
        try:
            await pubsub.ssubscribe(channel)

            assert await _read_payload(pubsub, own_server.url) == b""  # subscription confirmed
            await pubsub.ping()
            assert await _read_payload(pubsub, own_server.url) == b""  # health-check answer
            publisher.spublish(channel, b"h\x00data")
            assert await _read_payload(pubsub, own_server.url) == b"h\x00data"
            assert await pubsub.parse_response(block=False, timeout=0.05) is None
            await pubsub.sunsubscribe(channel)
            with pytest.raises(ConnectionError, match="ended the wake-up subscription"):
                await _read_payload(pubsub, own_server.url)
        finally:
            await pubsub.aclose()
            await client.aclose()
    publisher.close()


async def _read_payload(pubsub: Any, url: str) -> bytes | None:
    """The next reply of ``pubsub`` as the asyncio subscriber reads it."""
    from panqueue._store.transport.base import _reply_payload

    return _reply_payload(await pubsub.parse_response(block=False, timeout=5), url)
