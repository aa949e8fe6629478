"""What an idle worker's wake-up subscription costs it per message: CPU per paced message.

    .venv/bin/python scripts/wakeup_cpu.py [--messages N] [--interval-ms MS]
                                           [--backend asyncio|trio]

Starts a private redis-server, subscribes to a queue's notify channel the way a worker does
(the async transport's ``subscribe``), and has another process publish N messages of 60 bytes
there, one every MS milliseconds, as the adds for an idle worker do. Prints this process's CPU
time per message, from the first message to the last: the subscription's read path, on a
process that sleeps between messages as an idle worker does (messages passed on as they
arrive where the subscriber does so, as a worker has them). Run it from another checkout
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
    got = 0
    first = last = 0.0

    def heard(message: bytes) -> None:
        nonlocal got, first, last
        if len(message) == 60:
            got += 1
            if got == 1:
                first = time.process_time()
            elif got == count:
                last = time.process_time()

    try:
        # As a worker reads it: where the subscriber passes messages on as they arrive, the
        # task waits in get() for the health check's answers alone.
        deliver_to = getattr(subscriber, "deliver_to", None)  # (earlier versions lack it)
        delivers = deliver_to is not None and deliver_to(heard)
        quiet = 0
        while got < count:
            message = await subscriber.get(timeout=0.5 if delivers else 10)
            if message is None:
                quiet += 1
                if not delivers or quiet > 20:
                    raise RuntimeError(f"only {got} of {count} messages arrived")
                continue
            quiet = 0
            heard(message)
        return (last - first) / (count - 1)
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
