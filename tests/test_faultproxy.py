"""panqueue.testing.FaultProxy: network faults between a real client and the real server."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from panqueue import JobState, QueueClient
from panqueue.errors import TimeoutError as PanqueueTimeoutError
from panqueue.testing import FaultProxy
from tests.helpers import wait_until


def plain_client(url: str, *, socket_timeout: float = 5.0) -> redis.Redis:
    """redis-py without its automatic retries, so each fault shows as one error."""
    return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0),
                                socket_timeout=socket_timeout, socket_connect_timeout=5.0)


def test_commands_reach_the_database_named_in_the_url(
        proxy: FaultProxy, redis_url: str) -> None:
    with plain_client(proxy.url_for(db=3)) as client:
        client.set("through-proxy", "yes")
    with plain_client(redis_url.rsplit("/", 1)[0] + "/3") as direct:
        assert direct.get("through-proxy") == b"yes"
        direct.flushdb()
    assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"
    assert proxy.connections_accepted == 1


def test_url_for_keeps_credentials_database_and_options(proxy: FaultProxy) -> None:
    url = "redis://app:s3cret@localhost:6390/2?health_check_interval=5"
    assert proxy.url_for(url) == (
        f"redis://app:s3cret@127.0.0.1:{proxy.port}/2?health_check_interval=5")
    assert proxy.url_for(url, db=7) == (
        f"redis://app:s3cret@127.0.0.1:{proxy.port}/7?health_check_interval=5")


def test_cut_fails_commands_and_refuses_connections_until_restore(proxy: FaultProxy) -> None:
    with plain_client(proxy.url) as client:
        assert client.ping()
        proxy.cut()
        with pytest.raises(redis.ConnectionError):
            client.ping()  # its connection was closed under it
        with pytest.raises(redis.ConnectionError):
            client.ping()  # a new connection is accepted, then closed at once
        assert proxy.connections_refused >= 1
        proxy.restore()
        assert client.ping()
    assert proxy.connections_accepted == 2


def test_blackhole_makes_commands_time_out_and_restore_lets_them_through(
        proxy: FaultProxy) -> None:
    with plain_client(proxy.url, socket_timeout=0.3) as client:
        client.set("k", "before")
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.get("k")
        assert time.monotonic() - started >= 0.25
        with pytest.raises(redis.TimeoutError):
            client.get("k")  # a new connection is accepted but stays silent too
        assert proxy.active_connections >= 1
        proxy.restore()
        assert client.get("k") == b"before"


def test_held_bytes_are_delivered_after_the_blackhole(
        proxy: FaultProxy, redis_client: redis.Redis) -> None:
    """A blackhole delays rather than loses: a command sent during it runs on restore, as
    after a network partition heals while TCP keeps retransmitting."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"
        proxy.blackhole()
        sock.sendall(b"INCR held\r\n")
        sock.settimeout(0.2)
        with pytest.raises(socket.timeout):
            sock.recv(64)
        assert redis_client.get("held") is None  # not forwarded
        proxy.restore()
        sock.settimeout(5)
        assert sock.recv(64) == b":1\r\n"


def test_a_restore_releases_what_was_held_even_if_a_blackhole_follows_at_once(
        proxy: FaultProxy, redis_client: redis.Redis) -> None:
    """Bytes held by a blackhole flow on the restore that follows, even when the next blackhole
    comes before the proxy's thread has woken; the reply, sent under that blackhole, is held
    until the next restore."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"
        proxy.blackhole()
        sock.sendall(b"INCR held\r\n")
        proxy.wait_for_held_requests(1)
        proxy.restore()
        proxy.blackhole()
        wait_until(lambda: redis_client.get("held") == b"1", timeout=5,
                   what="the held command to reach the server")
        proxy.restore()
        assert sock.recv(64) == b":1\r\n"


def test_a_dropped_reply_is_a_connection_error_for_a_command_the_server_ran(
        proxy: FaultProxy, redis_client: redis.Redis) -> None:
    with plain_client(proxy.url) as client:
        client.ping()
        proxy.drop_next_reply()
        with pytest.raises(redis.ConnectionError):
            client.incr("counter")
        proxy.wait_for_dropped_replies(1)
        assert redis_client.get("counter") == b"1"  # it ran, the client never heard
        assert client.incr("counter") == 2  # the next command works on a new connection
    assert proxy.replies_dropped == 1
    assert proxy.connections_accepted == 2


def test_drop_next_reply_with_match_spares_other_commands(
        proxy: FaultProxy, redis_client: redis.Redis) -> None:
    with plain_client(proxy.url) as client:
        proxy.drop_next_reply(match=b"victim")
        client.set("bystander", 1)
        assert client.incr("bystander") == 2
        with pytest.raises(redis.ConnectionError):
            client.incr("victim")
        assert client.incr("victim") == 2  # the drop was used up
        assert client.get("bystander") == b"2"
    assert redis_client.get("victim") == b"2"
    assert proxy.replies_dropped == 1 and proxy.drops_pending == 0


def test_a_match_split_across_two_chunks_still_counts(
        proxy: FaultProxy, redis_client: redis.Redis) -> None:
    proxy.drop_next_reply(match=b"victim")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"*2\r\n$4\r\nINCR\r\n$6\r\nvic")
        time.sleep(0.1)  # the proxy forwards the first part on its own
        sock.sendall(b"tim\r\n")
        assert sock.recv(64) == b""  # the reply was dropped and the connection closed
    assert redis_client.get("victim") == b"1"


def test_a_client_that_resends_after_a_lost_reply_runs_the_command_twice(
        proxy: FaultProxy, redis_client: redis.Redis) -> None:
    """Why the lost reply matters: redis-py resends by default after a connection error."""
    client = redis.Redis.from_url(proxy.url, retry=Retry(NoBackoff(), 1),
                                  retry_on_error=[redis.ConnectionError])
    with client:
        proxy.drop_next_reply(match=b"INCR")
        assert client.incr("twice") == 2  # the caller asked for one increment
    assert redis_client.get("twice") == b"2"


def test_delay_adds_latency_to_each_round_trip(proxy: FaultProxy) -> None:
    with plain_client(proxy.url) as client:
        client.ping()
        proxy.delay(0.1)
        started = time.monotonic()
        client.ping()
        assert time.monotonic() - started >= 0.2  # the request and the reply, 0.1 s each
        proxy.delay(0)
        started = time.monotonic()
        client.ping()
        assert time.monotonic() - started < 0.1


def test_wait_for_connections_returns_when_they_are_open_and_times_out_otherwise(
        proxy: FaultProxy) -> None:
    with plain_client(proxy.url) as first, plain_client(proxy.url) as second:
        first.ping()
        second.ping()
        proxy.wait_for_connections(2, timeout=5, active=True)
        proxy.wait_for_connections(2, timeout=5)
        with pytest.raises(PanqueueTimeoutError, match="3 accepted connections"):
            proxy.wait_for_connections(3, timeout=0.1)


def test_stop_closes_connections_and_the_proxy_can_start_again(redis_url: str) -> None:
    proxy = FaultProxy(urlsplit(redis_url).port or 6379)
    with proxy, plain_client(proxy.url) as client:
        client.ping()
        proxy.stop()
        with pytest.raises(redis.ConnectionError):
            client.ping()
        proxy.start()
        proxy.wait_for_connections(1)
    assert proxy.active_connections == 0


@pytest.mark.anyio
async def test_async_clients_go_through_the_proxy_on_either_backend(
        proxy: FaultProxy, queue_name: str) -> None:
    async with QueueClient(proxy.url) as client:
        await client.queue(queue_name).add({"n": 1})
        proxy.cut()
        proxy.restore()  # the client's pooled connection is gone; it reconnects
        await client.queue(queue_name).add({"n": 2})
        assert (await client.counts(queue_name))[JobState.WAITING] == 2
