"""Inject network faults between a client and the server with ``panqueue.testing.FaultProxy``.

The proxy listens on 127.0.0.1 and forwards to the server in threads of its own; clients connect
to ``proxy.url`` instead of the server. This script cuts the connections, blackholes them, and
loses the reply to a command the server ran, and shows what a client sees each time.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/fault_proxy.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from panqueue import ConnectionError, SyncQueueClient
from panqueue.embedded import url_or_private_server
from panqueue.testing import FaultProxy


def main(url: str) -> None:
    direct = redis.Redis.from_url(url)
    direct.delete("example:visits")
    with FaultProxy(urlsplit(url).port or 6379) as proxy:
        through = proxy.url_for(url)  # same credentials and database, the proxy's port
        print(f"proxy on 127.0.0.1:{proxy.port} in front of port {proxy.target_port}")

        # 1. cut(): every connection is closed, new ones are refused until restore().
        with SyncQueueClient(through) as client:
            queue = client.queue("example-faults")
            added = [queue.add({"n": 1})]
            proxy.cut()
            try:
                added.append(queue.add({"n": 2}))
            except ConnectionError:
                print("cut: add raised panqueue.ConnectionError")
            proxy.restore()
            added.append(queue.add({"n": 3}))
            print(f"restored: waiting jobs {client.counts('example-faults')['waiting']}")
            for handle in added:
                client.remove("example-faults", handle.id)

        # redis-py resends a command after a connection error by default; without retries
        # each fault shows as exactly one error.
        timeout = 0.5
        plain = redis.Redis.from_url(through, retry=Retry(NoBackoff(), 0), socket_timeout=timeout)

        # 2. blackhole(): connections stay open, nothing gets through, commands time out.
        plain.ping()
        proxy.blackhole()
        started = time.monotonic()
        try:
            plain.ping()
        except redis.TimeoutError:
            # The socket timeout ended the wait: never sooner, and on a busy machine a little
            # later.
            waited = time.monotonic() - started
            after = (f"its {timeout} s socket timeout" if waited >= timeout
                     else f"only {waited:.2f} s")
            print(f"blackhole: PING timed out after {after}")
        proxy.restore()
        print(f"restored: PING -> {plain.ping()}")

        # 3. drop_next_reply(): the server runs the command, its reply is lost.
        proxy.drop_next_reply(match=b"example:visits")
        try:
            plain.incr("example:visits")
        except redis.ConnectionError:
            print("lost reply: INCR raised ConnectionError")
        print(f"yet the server ran it: example:visits = {int(direct.get('example:visits') or 0)}")
        print(f"proxy counters: accepted {proxy.connections_accepted}, refused "
              f"{proxy.connections_refused}, replies dropped {proxy.replies_dropped}")
        plain.close()
    direct.delete("example:visits")
    direct.close()


if __name__ == "__main__":
    with url_or_private_server(announce=False) as url:
        if not os.environ.get("PANQUEUE_URL"):
            print(f"started a private server on {url}")
        main(url)
    print("done")
