"""trio's own connection to a standalone server (``panqueue/_store/transport/native.py``).

The operations were written against redis-py's replies and errors; this transport must give
the same, command by command, on a real server. It is also the one place that reads RESP
itself: its pure-Python reader must agree with hiredis' on every reply, however the bytes
arrive.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis

from panqueue import PanqueueError, QueueClient, WorkerPool
from panqueue._keys import QueueKeys
from panqueue._store.loader import Script
from panqueue._store.transport import (
    Batch,
    Command,
    Request,
    Scan,
    ScriptCall,
    SyncTransport,
    native,
    open_async_transport,
    resp,
)
from panqueue._store.transport.aio import _AsyncioTransport
from panqueue._store.transport.aio_subscriber import _ProtocolSubscriber
from panqueue._store.transport.thread import _ThreadTransport
from panqueue.embedded import RedisServer
from tests.helpers import async_wait_until, echo_registry

pytestmark = pytest.mark.anyio

# A script with every kind of reply: integers, strings, nil, nested tables, and an error
# status inside a table.
_SCRIPT = Script("replies", """
if ARGV[1] == 'fail' then return redis.error_reply('PANQUEUE no such thing') end
return {1, 'two', false, {KEYS[1], ARGV[1]}, redis.call('HGET', KEYS[1], 'a')}
""")


# The readers and packers a test runs with: the Python ones always, hiredis' where installed
# (the hiredis extra; the core-subset runs of scripts/test.sh go without it).
_READERS = ["python"] if resp.hiredis is None else ["hiredis", "python"]


@pytest.fixture(params=_READERS)
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a test with each reply reader and command packer."""
    if request.param == "python":
        monkeypatch.setattr(resp, "new_reader", resp.PyReader)
        monkeypatch.setattr(resp, "pack", resp.pack_py)
    yield str(request.param)


def _fill(client: redis.Redis, k: str) -> None:
    client.hset(f"{k}:h", mapping={"a": "1", "b": "2"})
    client.zadd(f"{k}:z", {"x": 1.5, "y": 2})
    client.rpush(f"{k}:l", "p", "q", "p")
    client.sadd(f"{k}:s", "m")
    client.set(f"{k}:g", "v")
    for i in range(3):
        client.xadd(f"{k}:x", {"n": str(i), "e": "é"}, id=f"1-{i + 1}")
    client.xgroup_create(f"{k}:x", "g", id="0")


def _requests(k: str) -> list[Request]:
    """One request of every command the operations send (and batches and scripts mixed)."""
    commands = [
        ("HGET", f"{k}:h", "a"), ("HGET", f"{k}:h", "zz"), ("HMGET", f"{k}:h", "a", "zz"),
        ("HGETALL", f"{k}:h"), ("HKEYS", f"{k}:h"), ("HEXISTS", f"{k}:h", "a"),
        ("HSETNX", f"{k}:h", "c", 3), ("ZRANGE", f"{k}:z", 0, -1),
        ("ZRANGE", f"{k}:z", 0, -1, "WITHSCORES"), ("ZREVRANGE", f"{k}:z", 0, -1, "WITHSCORES"),
        ("ZSCORE", f"{k}:z", "x"), ("ZSCORE", f"{k}:z", "none"), ("ZRANK", f"{k}:z", "y"),
        ("ZCOUNT", f"{k}:z", "-inf", "+inf"), ("ZCARD", f"{k}:z"), ("ZADD", f"{k}:z2", 1, "a"),
        ("ZREM", f"{k}:z2", "a"), ("LRANGE", f"{k}:l", 0, -1), ("LLEN", f"{k}:l"),
        ("LPOS", f"{k}:l", "p"), ("SMEMBERS", f"{k}:s"), ("EXISTS", f"{k}:g", f"{k}:h"),
        ("GET", f"{k}:g"), ("GET", f"{k}:none"), ("PING",), ("INFO", "memory"),
        ("XREVRANGE", f"{k}:x", "+", "-", "COUNT", 2), ("XREAD", "COUNT", 2, "STREAMS",
                                                        f"{k}:x", "0"),
        ("XREADGROUP", "GROUP", "g", "c", "COUNT", 2, "STREAMS", f"{k}:x", ">"),
        ("XINFO", "STREAM", f"{k}:x"), ("XINFO", "GROUPS", f"{k}:x"), ("WAIT", 0, 0),
    ]
    call = ScriptCall(_SCRIPT, (f"{k}:h",), ("x",))
    requests: list[Request] = [Command(c) for c in commands]
    requests += [call, Batch((*(Command(c) for c in commands[:12]), call)), Scan(f"{k}:*")]
    return requests


def _comparable(request: Request, reply: Any) -> Any:
    """What must be equal: INFO's fields (not their values, which move on between the calls)
    and SCAN's keys in any order (the order is the server's)."""
    if isinstance(request, Scan):
        return sorted(reply)
    if isinstance(reply, dict) and "used_memory" in reply:
        return sorted(reply)
    return reply


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize("protocol", [2, 3])
async def test_every_reply_is_shaped_as_redis_py_shapes_it(
        anyio_backend: str, reader: str, protocol: int, redis_url: str,
        redis_client: redis.Redis) -> None:
    """On either protocol: RESP3 answers maps and sets where RESP2 has lists, which redis-py
    shapes by protocol (XREAD's streams as a map on RESP3)."""
    k = "{eq}"
    redis_url = f"{redis_url}?protocol={protocol}"
    transport = open_async_transport(redis_url)
    assert isinstance(transport, native._NativeTransport)
    sync = SyncTransport(redis_url)
    try:
        for request in _requests(k):
            # The same data for both: each runs on a freshly filled server.
            redis_client.flushdb()
            _fill(redis_client, k)
            expected = await anyio.to_thread.run_sync(sync.execute, request)
            redis_client.flushdb()
            _fill(redis_client, k)
            got = await transport.execute(request)
            assert _comparable(request, got) == _comparable(request, expected), request
    finally:
        sync.close()
        await transport.aclose()


def _replies_read(reader: Any, data: bytes, *, piece: int) -> list[Any]:
    replies = []
    for i in range(0, len(data), piece):
        reader.feed(data[i:i + piece])
        while (reply := reader.gets()) is not resp.MORE:
            replies.append(reply)
    return replies


_WIRE = (b"+OK\r\n:-12\r\n$5\r\nhe\r\nl\r\n$-1\r\n*-1\r\n*0\r\n"
         b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n-ERR inner\r\n$0\r\n\r\n"
         b"-NOSCRIPT No matching script\r\n-WRONGTYPE Operation against a key\r\n"
         b"%2\r\n+k\r\n,1.5\r\n$1\r\nm\r\n~2\r\n:1\r\n:2\r\n"
         b",inf\r\n#t\r\n#f\r\n_\r\n=8\r\ntxt:abcd\r\n")


def _plain(reply: Any) -> Any:
    """Error replies as (class, message), so that two readers' replies compare."""
    if isinstance(reply, Exception):
        return (type(reply), str(reply))
    if isinstance(reply, list):
        return [_plain(r) for r in reply]
    if isinstance(reply, dict):
        return {k: _plain(v) for k, v in reply.items()}
    return reply


_READ = [b"OK", -12, b"he\r\nl", None, None, [],
         [1, [b"a", (redis.exceptions.ResponseError, "inner")], b""],
         (redis.exceptions.NoScriptError, "No matching script"),
         (redis.exceptions.ResponseError, "WRONGTYPE Operation against a key"),
         {b"k": 1.5, b"m": [1, 2]}, math.inf, True, False, None, b"abcd"]


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_the_python_reader_reads_every_kind_of_reply_in_any_pieces(piece: int) -> None:
    """Every RESP2 and RESP3 kind a command here can answer, fed whole or byte by byte; and
    what hiredis' reader reads from the same bytes, where hiredis is installed."""
    ours = _replies_read(resp.PyReader(), _WIRE, piece=piece)
    assert _plain(ours) == _READ
    if resp.hiredis is not None:
        assert _plain(_replies_read(resp.new_reader(), _WIRE, piece=piece)) == _READ


# Commands as the transports send them: a script call's arguments, a command of two words, text
# that is not ASCII, numbers of each kind, and a payload longer than redis-py's 6,000-byte chunk.
_COMMANDS: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 2, "{q:x}:meta", "{q:x}:wait", b"\x00\xff", -1, 2.5, 10**20),
    ("CONFIG GET", "maxmemory"), (b"CLIENT SETNAME", "w-1"),
    ("SET", "clé", "naïve ☃", "PX", 1500), ("HSET", "k", "d", b"x" * 10_000),
]


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0",
                                 "unix:///tmp/panqueue-none.sock"])
def test_the_asyncio_transport_packs_commands_as_redis_py_does(url: str) -> None:
    """With hiredis installed, the asyncio transport's connections (of every scheme) pack in C,
    byte for byte what redis-py's own connection writes; an argument of another type is
    redis-py's DataError either way. (The version legs run without hiredis.)"""
    connection = _AsyncioTransport(url).client.connection_pool.make_connection()
    packed = type(connection).__name__.startswith("_Packed")
    assert packed is (resp.hiredis is not None)  # without hiredis, redis-py's own packer
    plain = redis.asyncio.Connection()
    for command in _COMMANDS:
        assert b"".join(connection.pack_command(*command)) == b"".join(
            plain.pack_command(*command)), command
    assert b"".join(connection.pack_commands(_COMMANDS)) == b"".join(
        plain.pack_commands(_COMMANDS))
    for bad in (True, None, [1]):
        with pytest.raises(redis.exceptions.DataError):
            connection.pack_command("SET", "k", bad)
        with pytest.raises(redis.exceptions.DataError):
            plain.pack_command("SET", "k", bad)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_errors_are_the_errors_of_the_other_transports(
        anyio_backend: str, reader: str, redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.set("{e}:s", "v")
    failing: list[Request] = [
        Command(("LPUSH", "{e}:s", "x")),
        Command(("NOSUCHCOMMAND",)),
        ScriptCall(_SCRIPT, ("{e}:h",), ("fail",)),
        Batch((Command(("GET", "{e}:s")), Command(("LPUSH", "{e}:s", "x")),
               Command(("INCR", "{e}:s")))),
        Command(("SET", "{e}:b", True)),
    ]
    transport = open_async_transport(redis_url)
    sync = SyncTransport(redis_url)
    try:
        for request in failing:
            with pytest.raises(PanqueueError) as expected:
                await anyio.to_thread.run_sync(sync.execute, request)
            with pytest.raises(PanqueueError) as got:
                await transport.execute(request)
            assert type(got.value) is type(expected.value), request
            if reader == "hiredis" or request is not failing[-1]:
                # (redis-py words a bad argument as its packer does: hiredis' here.)
                assert str(got.value) == str(expected.value), request
        # Nothing above broke the connection it ran on.
        assert await transport.execute(Command(("GET", "{e}:s"))) == b"v"
    finally:
        sync.close()
        await transport.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_call_stopped_midway_never_hands_its_reply_to_the_next(
        anyio_backend: str, redis_url: str, redis_client: redis.Redis) -> None:
    """A cancelled call leaves its reply in flight: that connection must not be reused, or
    the next call would read the reply meant for the first."""
    transport = open_async_transport(redis_url)
    redis_client.set("{c}:g", "mine")
    try:
        with anyio.move_on_after(0.2) as scope:
            await transport.execute(Command(("BLPOP", "{c}:l", 5)))
        assert scope.cancelled_caught
        redis_client.rpush("{c}:l", "for the stopped call")
        assert await transport.execute(Command(("GET", "{c}:g"))) == b"mine"
        assert await transport.execute(Command(("GET", "{c}:g"))) == b"mine"
    finally:
        await transport.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_speaks_natively_to_one_server_and_through_threads_to_the_rest(
        anyio_backend: str, redis_url: str) -> None:
    """(Cluster URLs go through threads too; their client connects as it is made, so
    tests/test_cluster.py covers them.)"""
    chosen = {}
    for url in (redis_url, "unix:///tmp/panqueue-none.sock",
                "redis+sentinel://127.0.0.1:1/mymaster"):
        transport = open_async_transport(url)
        chosen[url.split(":")[0]] = type(transport)
        await transport.aclose()
    assert chosen == {"redis": native._NativeTransport, "unix": native._NativeTransport,
                      "redis+sentinel": _ThreadTransport}


async def test_asyncio_keeps_redis_py(anyio_backend: str, redis_url: str) -> None:
    if anyio_backend != "asyncio":
        return
    transport = open_async_transport(redis_url)
    try:
        assert isinstance(transport, _AsyncioTransport)
    finally:
        await transport.aclose()


def _feed_time(data: bytes, piece: int) -> tuple[float, list[Any]]:
    """The least time of three reads of ``data`` by the Python reader, fed ``piece`` bytes at
    a time, and the replies it read."""
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        replies = _replies_read(resp.PyReader(), data, piece=piece)
        best = min(best, time.perf_counter() - started)
    return best, replies


@pytest.mark.parametrize("shape", ["one long string", "many short strings", "nested arrays"])
def test_the_python_reader_takes_a_long_reply_in_time_linear_in_its_size(shape: str) -> None:
    """A reply of megabytes arrives in many pieces; reading it must not start over from its
    first byte at each piece. Measured as a ratio to reading the same bytes fed at once, so
    that the bound holds on a slow machine: re-reading from the start would cost about
    (pieces / 2) times as much, 64 here, where going on from where it stopped costs about the
    same as one piece. The replies are a few hundred kilobytes to 2 MiB: big enough that a
    read of them at once takes tens of milliseconds, far above the timer's noise."""
    if shape == "one long string":
        wire = b"$%d\r\n%s\r\n" % (2 << 20, b"x" * (2 << 20))
    elif shape == "many short strings":
        items = [b"$10\r\n%010d\r\n" % i for i in range(40_000)]
        wire = b"*%d\r\n%s" % (len(items), b"".join(items))
    else:
        rows = [b"*2\r\n:%d\r\n%%1\r\n+k\r\n$3\r\nabc\r\n" % i for i in range(20_000)]
        wire = b"*%d\r\n%s" % (len(rows), b"".join(rows))
    piece = len(wire) // 128 + 1
    at_once, expected = _feed_time(wire, len(wire))
    in_pieces, replies = _feed_time(wire, piece)
    assert replies == expected and len(replies) == 1
    if resp.hiredis is not None:
        assert _replies_read(resp.new_reader(), wire, piece=piece) == expected
    assert in_pieces < 8 * at_once + 0.05, (in_pieces, at_once)


async def _fill_the_pool(transport: Any, size: int) -> None:
    """Leave ``size`` connections in the transport's pool: calls at the same time each take
    one of their own."""
    async with anyio.create_task_group() as calls:
        for _ in range(size):
            calls.start_soon(transport.execute, Command(("BLPOP", "{p}:none", 0.05)))


def _server_clients(client: redis.Redis) -> int:
    """The connections the server has, besides ``client``'s own."""
    return len(client.client_list()) - 1


@pytest.mark.parametrize("drop", ["client kill", "idle timeout", "restart"])
async def test_a_call_after_the_server_dropped_every_pooled_connection_succeeds(
        anyio_backend: str, drop: str, private_redis: RedisServer) -> None:
    """A server restarted, clients killed, or idle ones closed by its ``timeout``: every
    connection in the pool is dead, and the next call must still get its answer, as redis-py's
    does on asyncio (the connections that wait in its pool are checked before use, and a retry
    opens a new one), rather than retrying once on the next dead connection of the pool."""
    transport = open_async_transport(private_redis.url)
    admin = redis.Redis.from_url(private_redis.url)
    try:
        admin.set("{p}:g", "kept")
        await _fill_the_pool(transport, 4)
        assert _server_clients(admin) == 4
        if drop == "client kill":
            assert admin.client_kill_filter(_type="normal", skipme=True) == 4
        elif drop == "idle timeout":
            admin.config_set("timeout", 1)
            with anyio.fail_after(10):
                while _server_clients(admin) > 0:
                    await anyio.sleep(0.05)
        else:
            private_redis.stop()
            private_redis.start()
            admin.set("{p}:g", "kept")
        for _ in range(6):
            assert await transport.execute(Command(("GET", "{p}:g"))) == b"kept"
        if drop == "idle timeout":  # what was dropped was replaced, and is dropped again
            await _fill_the_pool(transport, 4)
            with anyio.fail_after(10):
                while _server_clients(admin) > 0:
                    await anyio.sleep(0.05)
            assert await transport.execute(Command(("GET", "{p}:g"))) == b"kept"
    finally:
        admin.close()
        await transport.aclose()


# --------------------------------------------------------------------------- wake-up subscriptions


@pytest.mark.parametrize("protocol", [2, 3])
async def test_the_subscriber_of_one_server_reads_each_kind_of_reply_as_redis_sends_it(
        anyio_backend: str, reader: str, protocol: int, redis_url: str,
        redis_client: redis.Redis, queue_name: str) -> None:
    """On one server, a wake-up subscription is made on the event loop's own sockets (trio's,
    asyncio's protocol), not through redis-py: a health-check answer reports b"", a published
    message its data, a quiet channel None once the timeout passed, and a subscription the
    server ended raises (RESP2 and RESP3 alike)."""
    channel = QueueKeys(queue_name).notify
    transport = open_async_transport(f"{redis_url}?protocol={protocol}")
    subscriber = await transport.subscribe(channel)
    try:
        assert isinstance(subscriber, native._NativeSubscriber if anyio_backend == "trio"
                          else _ProtocolSubscriber)
        with anyio.fail_after(10):
            await subscriber.ping()
            assert await subscriber.get(timeout=5) == b""
            redis_client.spublish(channel, b"h\x00data")
            assert await subscriber.get(timeout=5) == b"h\x00data"
            assert await subscriber.get(timeout=0.05) is None
            await subscriber._send(resp.pack(("SUNSUBSCRIBE", channel)))
            with pytest.raises(PanqueueError, match="ended the wake-up subscription"):
                await subscriber.get(timeout=5)
    finally:
        await subscriber.aclose()
        await transport.aclose()


@pytest.mark.parametrize("protocol", [2, 3])
async def test_an_asyncio_subscriber_passes_each_message_on_as_it_arrives(
        anyio_backend: str, reader: str, protocol: int, redis_url: str,
        redis_client: redis.Redis, queue_name: str) -> None:
    """On asyncio, the subscriber hands each message to the worker where its bytes arrive,
    with no read pending (a handed job starts a turn of the loop sooner): get() still answers
    the health check and times out, a subscription the server ended still raises from it, and
    so does what the receiver raised. On trio, a task reads each message (get())."""
    channel = QueueKeys(queue_name).notify
    transport = open_async_transport(f"{redis_url}?protocol={protocol}")
    subscriber = await transport.subscribe(channel)
    heard: list[bytes] = []
    arrived = anyio.Event()
    if anyio_backend == "asyncio":
        protocol = subscriber._protocol  # type: ignore[attr-defined]
        received = protocol.data_received

        def data_received(data: bytes) -> None:
            received(data)
            arrived.set()

        protocol.data_received = data_received
    else:
        arrived.set()
    try:
        redis_client.spublish(channel, b"w")  # before: passed on once asked for
        with anyio.fail_after(10):
            await arrived.wait()
            delivers = subscriber.deliver_to(heard.append)
            assert delivers is (anyio_backend == "asyncio")
            if not delivers:
                assert await subscriber.get(timeout=5) == b"w"
                return
            assert heard == [b"w"]
            redis_client.spublish(channel, b"h\x00data")

            async def passed_on() -> bool:
                return len(heard) == 2

            await async_wait_until(passed_on, what="the message passed on")
            assert heard == [b"w", b"h\x00data"]
            await subscriber.ping()
            redis_client.spublish(channel, b"w")
            assert await subscriber.get(timeout=5) == b""  # the ping's answer, not a message
            assert await subscriber.get(timeout=0.05) is None
            assert heard[2:] == [b"w"]

            def broken(data: bytes) -> None:
                raise RuntimeError(f"receiver broke on {data!r}")

            subscriber.deliver_to(broken)
            redis_client.spublish(channel, b"x")
            with pytest.raises(RuntimeError, match="receiver broke on b'x'"):
                await subscriber.get(timeout=5)
    finally:
        await subscriber.aclose()
        await transport.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_an_idle_trio_worker_waits_for_its_wake_ups_without_a_thread(
        anyio_backend: str, redis_url: str, redis_client: redis.Redis) -> None:
    """A job handed to an idle worker reaches it from its subscription's socket, not from a
    thread that waited on it: no thread waits in a subscription while the workers are idle,
    and a job added then still starts at once."""
    registry, queues = echo_registry("idle", 3)
    before = {ident for ident, _ in _thread_frames()}  # others' threads: not this pool's
    async with QueueClient(redis_url) as client:
        with anyio.fail_after(30):
            async with WorkerPool(registry, url=redis_url, queues=queues, grace=2.0):
                async def every_worker_subscribed() -> bool:
                    return all(redis_client.pubsub_shardnumsub(QueueKeys(name).notify)[0][1]
                               for name in queues)

                await async_wait_until(every_worker_subscribed, what="the subscriptions")
                names = {t.ident: t.name for t in threading.enumerate()}
                waiting = [names.get(ident, str(ident)) for ident, frame in _thread_frames()
                           if ident not in before
                           and _in_code(frame, ("get_message", "parse_response"))]
                assert waiting == [], f"threads wait in a subscription: {waiting}"
                handle = await client.queue(queues[-1]).add("last")
                assert await handle.result(timeout=20) == f"{queues[-1]}:last"


def _thread_frames() -> list[tuple[int, Any]]:
    """Every other thread's id and current frame."""
    return [(ident, frame) for ident, frame in sys._current_frames().items()
            if ident != threading.get_ident()]


def _in_code(frame: Any, functions: tuple[str, ...]) -> bool:
    """Whether a function of these names is on the stack from ``frame`` down."""
    while frame is not None:
        if frame.f_code.co_name in functions:
            return True
        frame = frame.f_back
    return False
