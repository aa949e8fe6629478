"""Connection forms end to end: TLS (rediss://), ACL users, unix sockets, on asyncio and trio.

Every server here is private to this module: started on a free port (or a socket path of its
own) and stopped by its PID. Each end-to-end test adds a job with QueueClient and one with
SyncQueueClient, lets a Worker run both, and reads the results back.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis
import redis.exceptions

import panqueue._runtime.worker
from panqueue import (
    ConfigError,
    ConnectionError,
    Job,
    JobFailed,
    JobState,
    PanqueueError,
    QueueClient,
    Registry,
    SyncQueueClient,
    Worker,
)
from panqueue._store.transport import Command, open_async_transport
from panqueue.embedded import RedisServer
from panqueue.testing import run_worker
from tests.helpers import async_wait_until, free_port

ACL_PASSWORD = "s3cret"
READER_PASSWORD = "r3ader-pw"  # distinctive enough to look for in messages
NOCHAN_PASSWORD = "n0chan-pw"
WRONG_PASSWORD = "wr0ng-pass-xyzzy"


class ProbedServer(RedisServer):
    """A RedisServer whose readiness check is a redis-py PING at ``probe_url``.

    The stock check speaks plain TCP to ``port``, which a TLS-only or unix-socket-only server
    (``--port 0``) does not serve.
    """

    def __init__(self, probe_url: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.probe_url = probe_url

    def _answers_ping(self) -> bool:
        client = redis.Redis.from_url(self.probe_url, socket_timeout=0.5,
                                      socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except (redis.exceptions.RedisError, OSError):
            return False
        finally:
            client.close()


@contextmanager
def _started(server: RedisServer) -> Iterator[RedisServer]:
    server.start()
    try:
        yield server
    finally:
        server.cleanup()  # SIGTERM by PID (SIGKILL if it lingers), then its directory


# --------------------------------------------------------------------------- servers


@dataclass(frozen=True)
class TLSServer:
    port: int
    ca: Path

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, f"openssl {args[0]} failed: {done.stderr}"


def _make_certificates(directory: Path) -> None:
    """A throwaway CA (ca.crt) and a server certificate for IP 127.0.0.1 it signed."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", "-new", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=panqueue test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    _openssl("req", "-new", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=directory)
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "2",
             "-extfile", "server.ext", cwd=directory)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    """A server that speaks TLS only (plain TCP disabled with ``--port 0``)."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make test certificates")
    certs = tmp_path_factory.mktemp("tls")
    _make_certificates(certs)
    tls = TLSServer(port=free_port(), ca=certs / "ca.crt")
    server = ProbedServer(
        tls.url, appendonly=False, log_to=str(certs / "redis.log"),
        extra_args=("--port", "0", "--tls-port", str(tls.port),
                    "--tls-cert-file", str(certs / "server.crt"),
                    "--tls-key-file", str(certs / "server.key"),
                    "--tls-ca-cert-file", str(certs / "ca.crt"),
                    "--tls-auth-clients", "no"))
    with _started(server):
        yield tls


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A server whose default user is disabled; ``worker`` may do anything, ``reader`` may only
    read (no scripts, no writes), ``nochan`` may run every command but use no pub/sub channel
    (what Redis 7 gives a new user unless ``&*`` is granted)."""
    with _started(RedisServer(appendonly=False)) as server:
        admin = redis.Redis.from_url(server.url)
        try:
            admin.execute_command("ACL", "SETUSER", "worker", "on", f">{ACL_PASSWORD}",
                                  "~*", "&*", "+@all")
            admin.execute_command("ACL", "SETUSER", "reader", "on", f">{READER_PASSWORD}",
                                  "~*", "&*", "+@read")
            admin.execute_command("ACL", "SETUSER", "nochan", "on", f">{NOCHAN_PASSWORD}",
                                  "~*", "resetchannels", "+@all")
            admin.execute_command("ACL", "SETUSER", "default", "off")
        finally:
            admin.close()
        yield server


def _acl_url(server: RedisServer, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


@pytest.fixture(scope="module")
def unix_socket() -> Iterator[Path]:
    """A server reachable through a unix socket only (plain TCP disabled with ``--port 0``).
    The default user is open; the ACL user ``worker`` exists too."""
    # Socket paths are limited to ~107 bytes: a short directory of our own, not tmp_path.
    directory = Path(tempfile.mkdtemp(prefix="pq-sock-"))
    path = directory / "redis.sock"
    server = ProbedServer(f"unix://{path}?db=0", appendonly=False,
                          extra_args=("--port", "0", "--unixsocket", str(path),
                                      "--unixsocketperm", "700"))
    try:
        with _started(server):
            admin = redis.Redis.from_url(server.probe_url)
            try:
                admin.execute_command("ACL", "SETUSER", "worker", "on", f">{ACL_PASSWORD}",
                                      "~*", "&*", "+@all")
            finally:
                admin.close()
            yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# --------------------------------------------------------------------------- helpers


async def assert_end_to_end(url: str, queue: str) -> None:
    """A job added with QueueClient and one added with SyncQueueClient both run on a Worker
    and their results come back through ``result()``, all over ``url``."""
    registry = Registry()

    @registry.handler(queue)
    async def double(job: Job) -> dict[str, int]:
        return {"value": job.data["n"] * 2}

    def add_and_wait_sync() -> tuple[Any, JobState]:
        with SyncQueueClient(url) as client:
            handle = client.queue(queue).add({"n": 5})
            return handle.result(timeout=10), handle.info().state

    with anyio.fail_after(30):
        async with QueueClient(url) as client:
            handle = await client.queue(queue).add({"n": 21})
            assert (await handle.info()).state is JobState.WAITING
            async with run_worker(registry, queue, url) as worker:
                assert await handle.result(timeout=10) == {"value": 42}
                sync_result, sync_state = await anyio.to_thread.run_sync(add_and_wait_sync)
            assert sync_result == {"value": 10}
            assert sync_state is JobState.COMPLETED
            assert (await handle.info()).state is JobState.COMPLETED
            assert worker.processed == 2


def _sync_add(url: str, queue: str) -> None:
    with SyncQueueClient(url) as client:
        client.queue(queue).add({"n": 1})


SHORT_START_GRACE = 0.5


async def failures_of_every_entry_point(url: str, queue: str) -> list[BaseException]:
    """The exceptions from adding a job (async and sync client) and from starting a worker at
    ``url``; each is expected to fail. A raw redis-py exception fails the test right here."""
    registry = Registry()

    @registry.handler(queue)
    async def noop(job: Job) -> None:
        return None

    errors: list[BaseException] = []
    # A worker waits START_GRACE (5 s) for a server it never reached before it fails its start
    # (the CLI's worker against a port where nothing listens waits it whole, tests/test_cli.py):
    # here the failure is what is looked at, and a shorter wait ends in the same one.
    with anyio.fail_after(30), pytest.MonkeyPatch.context() as patch:
        patch.setattr(panqueue._runtime.worker, "START_GRACE", SHORT_START_GRACE)
        with pytest.raises(PanqueueError) as info:
            async with QueueClient(url) as client:
                await client.queue(queue).add({"n": 1})
        errors.append(info.value)
        with pytest.raises(PanqueueError) as info:
            await anyio.to_thread.run_sync(_sync_add, url, queue)
        errors.append(info.value)
        with pytest.raises(PanqueueError) as info:
            await Worker(registry, queue, url=url).run()
        errors.append(info.value)
    return errors


def _full_text(exc: BaseException) -> str:
    """The message, repr and formatted traceback (with its causes), as a log would show it."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


# --------------------------------------------------------------------------- TLS


@pytest.mark.anyio
async def test_tls_end_to_end(anyio_backend: str, tls_server: TLSServer,
                              queue_name: str) -> None:
    await assert_end_to_end(tls_server.url, queue_name)


@pytest.mark.anyio
async def test_a_pooled_tls_connection_is_used_again_not_replaced(
        anyio_backend: str, tls_server: TLSServer) -> None:
    """A pooled connection is checked before each use for bytes waiting on its socket (the end
    of file of a server that closed it). Over TLS the server also sends records of its own
    after the handshake (session tickets); they must not count, or every call would open a
    new connection."""
    admin = redis.Redis.from_url(tls_server.url)
    try:
        opened = int(admin.info("stats")["total_connections_received"])
        transport = open_async_transport(tls_server.url)
        try:
            for _ in range(20):
                await transport.execute(Command(("PING",)))
        finally:
            await transport.aclose()
        assert int(admin.info("stats")["total_connections_received"]) == opened + 1
    finally:
        admin.close()


@pytest.mark.anyio
async def test_tls_without_the_ca_is_a_clear_connection_error(
        anyio_backend: str, tls_server: TLSServer, queue_name: str) -> None:
    url = f"rediss://127.0.0.1:{tls_server.port}/0"  # default verification, CA unknown
    for exc in await failures_of_every_entry_point(url, queue_name):
        assert isinstance(exc, ConnectionError), repr(exc)
        message = str(exc)
        assert f"cannot reach Redis at {url}" in message
        assert "certificate verify failed" in message.lower(), message


@pytest.mark.anyio
async def test_plain_tcp_to_a_tls_port_is_a_connection_error(
        anyio_backend: str, tls_server: TLSServer, queue_name: str) -> None:
    url = f"redis://127.0.0.1:{tls_server.port}/0"
    for exc in await failures_of_every_entry_point(url, queue_name):
        assert isinstance(exc, ConnectionError), repr(exc)
        assert f"cannot reach Redis at {url}" in str(exc)


# --------------------------------------------------------------------------- ACL


@pytest.mark.anyio
async def test_acl_user_end_to_end(anyio_backend: str, acl_server: RedisServer,
                                   queue_name: str) -> None:
    await assert_end_to_end(_acl_url(acl_server, "worker", ACL_PASSWORD), queue_name)


def test_acl_server_really_requires_credentials(acl_server: RedisServer) -> None:
    client = redis.Redis.from_url(acl_server.url)
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            client.ping()
    finally:
        client.close()


@pytest.mark.anyio
async def test_acl_wrong_password_is_a_connection_error_without_the_password(
        anyio_backend: str, acl_server: RedisServer, queue_name: str) -> None:
    url = _acl_url(acl_server, "worker", WRONG_PASSWORD)
    for exc in await failures_of_every_entry_point(url, queue_name):
        assert isinstance(exc, ConnectionError), repr(exc)
        message = str(exc)
        assert f"redis://worker:***@127.0.0.1:{acl_server.port}/0" in message
        assert "invalid username-password pair" in message.lower(), message
        assert WRONG_PASSWORD not in _full_text(exc)


@pytest.mark.anyio
async def test_acl_missing_credentials_is_a_connection_error(
        anyio_backend: str, acl_server: RedisServer, queue_name: str) -> None:
    url = acl_server.url  # the default user is disabled
    for exc in await failures_of_every_entry_point(url, queue_name):
        assert isinstance(exc, ConnectionError), repr(exc)
        assert f"cannot reach Redis at {url}" in str(exc)


@pytest.mark.anyio
async def test_a_user_that_may_only_read_reads_events_without_asking_for_more(
        anyio_backend: str, acl_server: RedisServer, queue_name: str) -> None:
    """The ask for every event is a write (ops/events.py watch): refused to a user that may
    only read, whose reads go on, and find the ends of jobs, which a user that may write asked
    for."""
    registry = Registry()

    @registry.handler(queue_name)
    async def echo(job: Job) -> int:
        return int(job.data)

    url = _acl_url(acl_server, "worker", ACL_PASSWORD)
    reader_url = _acl_url(acl_server, "reader", READER_PASSWORD)
    async with QueueClient(url) as client, QueueClient(reader_url) as reader:
        _, start = await reader.read_events(queue_name)
        await client.read_events(queue_name, watch=False)  # a user that may write asks for ends
        async with run_worker(registry, queue_name, url):
            handle = await client.queue(queue_name).add(3)
            assert await handle.result(timeout=10) == 3
        events, _ = await reader.read_events(queue_name, start)
        with anyio.fail_after(10):
            first = await reader.events(queue_name, after=start).__anext__()
    assert [(e.type, e.job_id) for e in events] == [("completed", handle.id)]
    assert (first.type, first.job_id) == ("completed", handle.id)
    admin = redis.Redis.from_url(url)
    try:
        assert not admin.exists(f"{{q:{queue_name}}}:events:read")
    finally:
        admin.close()


@pytest.mark.anyio
async def test_a_user_that_may_only_read_waits_on_a_result_without_asking_for_its_end(
        anyio_backend: str, acl_server: RedisServer, queue_name: str) -> None:
    """A wait on a result asks for the ends of jobs, a write: refused to a user that may only
    read, who waits all the same and finds the outcome in the job's state."""
    registry = Registry()

    @registry.handler(queue_name)
    async def echo(job: Job) -> int:
        if job.data == "fail":
            raise ValueError("no")
        return int(job.data)

    url = _acl_url(acl_server, "worker", ACL_PASSWORD)
    reader_url = _acl_url(acl_server, "reader", READER_PASSWORD)
    async with QueueClient(url) as client, QueueClient(reader_url) as reader:
        await client.pause(queue_name)
        done = await client.queue(queue_name).add(4)
        failing = await client.queue(queue_name).add("fail")
        outcomes: list[object] = []
        async with run_worker(registry, queue_name, url), anyio.create_task_group() as tg:

            async def wait(job_id: str) -> None:
                try:
                    outcomes.append(await reader.queue(queue_name).job(job_id).result(
                        timeout=10))
                except JobFailed as exc:
                    outcomes.append(type(exc))

            tg.start_soon(wait, done.id)
            tg.start_soon(wait, failing.id)
            admin = redis.Redis.from_url(url)
            try:

                async def waiting() -> bool:  # both blocked in the event stream's XREAD
                    return sum(c.get("cmd") == "xread" and c.get("user") == "reader"
                               for c in admin.client_list()) == 2

                await async_wait_until(waiting, what="the reader's two waits")
            finally:
                admin.close()
            await client.resume(queue_name)
    assert sorted(outcomes, key=repr) == sorted([4, JobFailed], key=repr)
    admin = redis.Redis.from_url(url)
    try:
        assert not admin.exists(f"{{q:{queue_name}}}:ends:read")
        assert admin.xlen(f"{{q:{queue_name}}}:events") == 0
    finally:
        admin.close()


@pytest.mark.anyio
async def test_acl_user_without_script_permission_gets_a_panqueue_error(
        anyio_backend: str, acl_server: RedisServer, queue_name: str) -> None:
    url = _acl_url(acl_server, "reader", READER_PASSWORD)
    add_error, sync_add_error, worker_error = await failures_of_every_entry_point(
        url, queue_name)
    for exc in (add_error, sync_add_error, worker_error):
        # Not a connection problem: the server answered and refused.
        assert not isinstance(exc, ConnectionError), repr(exc)
        message = str(exc)
        assert f"Redis at redis://reader:***@127.0.0.1:{acl_server.port}/0 refused" in message
        assert "no permissions" in message, message
        assert READER_PASSWORD not in _full_text(exc)
    # Adding runs a script, and so does a worker's first step (declaring the queue's mode).
    for exc in (add_error, sync_add_error, worker_error):
        assert "evalsha" in str(exc).lower()


@pytest.mark.anyio
async def test_acl_user_without_channel_permission_gets_a_panqueue_error(
        anyio_backend: str, acl_server: RedisServer, queue_name: str) -> None:
    """A worker needs the queue's wake-up channel; a user with every command but no channel
    (``&*`` missing) must get a PanqueueError naming the refusal, not a raw redis-py one."""
    url = _acl_url(acl_server, "nochan", NOCHAN_PASSWORD)
    registry = Registry()

    @registry.handler(queue_name)
    async def noop(job: Job) -> None:
        return None

    with anyio.fail_after(30):
        with pytest.raises(PanqueueError) as info:
            await Worker(registry, queue_name, url=url).run()
    message = str(info.value)
    assert "refused" in message and "no permissions" in message, message
    assert NOCHAN_PASSWORD not in _full_text(info.value)


# --------------------------------------------------------------------------- unix sockets


@pytest.mark.anyio
async def test_unix_socket_end_to_end(anyio_backend: str, unix_socket: Path,
                                      queue_name: str) -> None:
    await assert_end_to_end(f"unix://{unix_socket}?db=0", queue_name)


@pytest.mark.anyio
async def test_unix_socket_that_does_not_exist_is_a_connection_error(
        anyio_backend: str, unix_socket: Path, queue_name: str) -> None:
    url = f"unix://{unix_socket.parent / 'missing.sock'}?db=0"
    for exc in await failures_of_every_entry_point(url, queue_name):
        assert isinstance(exc, ConnectionError), repr(exc)
        assert f"cannot reach Redis at {url}" in str(exc)


@pytest.mark.anyio
async def test_unix_socket_with_acl_credentials_end_to_end(anyio_backend: str, unix_socket: Path,
                                                           queue_name: str) -> None:
    await assert_end_to_end(f"unix://worker:{ACL_PASSWORD}@{unix_socket}?db=0", queue_name)


@pytest.mark.anyio
async def test_unix_socket_wrong_password_is_a_connection_error_without_the_password(
        anyio_backend: str, unix_socket: Path, queue_name: str) -> None:
    url = f"unix://worker:{WRONG_PASSWORD}@{unix_socket}?db=0"
    for exc in await failures_of_every_entry_point(url, queue_name):
        assert isinstance(exc, ConnectionError), repr(exc)
        assert f"unix://worker:***@{unix_socket}?db=0" in str(exc)
        assert WRONG_PASSWORD not in _full_text(exc)


@pytest.mark.anyio
async def test_password_in_the_query_string_is_redacted_too(
        anyio_backend: str, unix_socket: Path, queue_name: str) -> None:
    """redis-py documents ``unix://[username@]/path/to/socket.sock?db=0[&password=password]``
    (and takes ``?password=`` on redis:// as well): such a password must not reach messages."""
    url = f"unix://{unix_socket}?db=0&username=worker&password={WRONG_PASSWORD}"
    for exc in await failures_of_every_entry_point(url, queue_name):
        assert isinstance(exc, ConnectionError), repr(exc)
        assert "invalid username-password pair" in str(exc).lower(), str(exc)
        assert WRONG_PASSWORD not in _full_text(exc)


def test_a_sync_client_shared_by_threads_makes_one_connection_pool(redis_url: str) -> None:
    """Threads that first use a fresh SyncQueueClient at the same moment (a web app's thread
    pool) share one transport: a second one would be dropped, and closed under the thread
    still using it."""
    import threading

    from panqueue import SyncQueueClient

    def first_use(client: SyncQueueClient, start: threading.Barrier, used: list[object]
                  ) -> None:
        start.wait()
        used.append(client.producer.connect())  # the transport this thread's call runs on

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as they can: the race shows
    try:
        for _ in range(20):
            client = SyncQueueClient(redis_url)
            start = threading.Barrier(16)
            used: list[object] = []
            threads = [threading.Thread(target=first_use, args=(client, start, used))
                       for _ in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            client.ping()  # the shared transport works
            client.close()
            assert len(used) == 16 and len({id(t) for t in used}) == 1
    finally:
        sys.setswitchinterval(switch)


def test_a_private_server_whose_picked_port_is_taken_starts_on_another(tmp_path: Path) -> None:
    """The port a RedisServer picks may be taken before the server binds it (another process's
    connection can get it as its local port): its first start moves to another free port; a
    restart keeps the port its URL named."""
    server = RedisServer(directory=tmp_path / "redis")
    taken = server.port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        try:
            server.start()
            assert server.port != taken
            port = server.port
            client = redis.Redis(port=port)
            assert client.ping()
            client.close()
            with pytest.raises(ConfigError, match="this server runs already"):
                server.start()  # a second process would go on unseen
            server.stop()
            server.start()
            assert server.port == port
        finally:
            server.cleanup()


# ----------------------------------------------------------------------------- many callers


@pytest.mark.anyio
async def test_more_callers_at_once_than_a_pool_had_wait_for_a_connection(
        redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    """One client shared by a web app's requests (or a Django process's threads), with more
    calls in flight than redis-py's default pool of 100 connections: the 101st was refused at
    once ("Too many connections", reported as Redis out of reach). They now wait for a
    connection. The server is held for a moment so that every call is in flight together."""
    import threading

    async with QueueClient(redis_url) as client:
        redis_client.execute_command("CLIENT", "PAUSE", 300, "WRITE")
        handles = []

        async def add(n: int) -> None:
            handles.append(await client.queue(queue_name).add(n))

        async with anyio.create_task_group() as group:
            for n in range(150):
                group.start_soon(add, n)
        assert len(handles) == 150
    with SyncQueueClient(redis_url) as sync_client:
        failed: list[BaseException] = []

        def add_sync(n: int) -> None:
            try:
                sync_client.queue(queue_name).add(n)
            except BaseException as exc:  # what the thread saw is the finding
                failed.append(exc)

        redis_client.execute_command("CLIENT", "PAUSE", 300, "WRITE")
        threads = [threading.Thread(target=add_sync, args=(n,)) for n in range(120)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failed == []
        assert sync_client.counts(queue_name)[JobState.WAITING] == 270


def test_a_pool_with_no_connection_free_says_so_not_that_redis_is_out_of_reach() -> None:
    from panqueue._store.transport.errors import translate_error

    for said in ("No connection available.", "Too many connections"):
        error = translate_error("redis://127.0.0.1:6379/0",
                                redis.exceptions.ConnectionError(said))
        assert str(error).startswith("no connection to Redis at redis://127.0.0.1:6379/0 came "
                                     "free: every one of the client's pool is in use"), error
