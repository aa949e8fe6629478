"""What an idle worker's wake-up subscription costs it per message: CPU per paced message.

    .venv/bin/python scripts/wakeup_cpu.py [--messages N] [--interval-ms MS]
                                           [--backend asyncio|trio]

Starts a private redis-server, subscribes to a queue's notify channel the way a worker does
(the async transport's ``subscribe``), and has another process publish N messages of 60 bytes
there, one every MS milliseconds, as the adds for an idle worker do. Prints this process's CPU
time per message, from the first message to the last: the subscription's read path, on a
process that sleeps between messages as an idle worker does. Run it from another checkout
(``PYTHONPATH=<checkout>``) to compare two versions.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

import anyio

from panqueue._keys import QueueKeys
from panqueue._store.transport import open_async_transport
from panqueue.embedded import RedisServer

_PUBLISHER = """
import sys, time
import redis
client = redis.Redis.from_url(sys.argv[1])
channel, count, pause = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
time.sleep(0.3)
for _ in range(count):
    client.spublish(channel, b"h" * 60)
    time.sleep(pause)
"""


async def _measure(url: str, count: int, interval_s: float) -> float:
    transport = open_async_transport(url)
    channel = QueueKeys("wakeup-cpu").notify
    subscriber = await transport.subscribe(channel)
    publisher = subprocess.Popen([sys.executable, "-c", _PUBLISHER, url, channel, str(count),
                                  str(interval_s)])
    try:
        got = 0
        first = 0.0
        while got < count:
            message = await subscriber.get(timeout=10)
            if message is None:
                raise RuntimeError(f"only {got} of {count} messages arrived")
            if len(message) == 60:
                got += 1
                if got == 1:
                    first = time.process_time()
        return (time.process_time() - first) / (count - 1)
    finally:
        publisher.wait(30)
        await subscriber.aclose()
        await transport.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, \
            RedisServer(directory=tmp, appendonly=False, extra_args=("--save", "")) as server:
        seconds = anyio.run(_measure, server.url, args.messages, args.interval_ms / 1000,
                            backend=args.backend)
    print(f"{args.backend}: {seconds * 1e6:.1f} µs of CPU per wake-up message "
          f"({args.messages} messages {args.interval_ms:g} ms apart)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
