"""Redis Sentinel: clients and workers find the master through the sentinels, and follow a
failover.

The example starts its own servers on loopback: a master, one replica, and three sentinels
(the server binary in sentinel mode, set to fail over one second after the master stops
answering). Then:

1. a client and a worker connect with ``redis+sentinel://host:port,host:port,.../service``;
2. the master is killed (SIGKILL); the sentinels promote the replica;
3. the same worker, without a restart, runs a job added after the failover, on the new master.

Everything it started is stopped by PID at the end. It takes about 10 seconds.

    python examples/sentinel.py
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import redis

from panqueue import ConnectionError, Job, QueueClient, Registry, Worker
from panqueue.embedded import RedisServer, find_server_binary, free_port

SERVICE = "orders"  # the name the sentinels know the master by

queues = Registry()


@queues.handler("invoices")
async def invoice(job: Job) -> str:
    return f"invoice {job.data['order']} sent"


def ask(port: int, *command: object) -> object:
    """One command to a server or sentinel on loopback; None if it does not answer."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, decode_responses=True)
    try:
        return client.execute_command(*command)
    except redis.RedisError:
        return None
    finally:
        client.close()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)


@contextmanager
def sentinel_setup(directory: Path) -> Iterator[tuple[RedisServer, RedisServer, list[int]]]:
    binary = find_server_binary()
    fast_sync = ("--repl-diskless-sync-delay", "0")  # sync the replica at once
    master = RedisServer(binary=binary, directory=directory / "master", appendonly=False,
                         extra_args=fast_sync)
    replica = RedisServer(binary=binary, directory=directory / "replica", appendonly=False,
                          extra_args=(*fast_sync, "--replicaof", "127.0.0.1",
                                      str(master.port)))
    sentinels: list[subprocess.Popen[bytes]] = []
    ports = [free_port() for _ in range(3)]
    try:
        master.start()
        replica.start()
        for port in ports:
            config = directory / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n")
            sentinels.append(subprocess.Popen(
                [binary, str(config), "--sentinel"], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))

        def ready() -> bool:
            for port in ports:
                state = ask(port, "SENTINEL", "MASTER", SERVICE)
                if not isinstance(state, dict) or int(state["num-other-sentinels"]) < 2 \
                        or int(state["num-slaves"]) < 1:
                    return False
            info = ask(replica.port, "INFO", "replication")
            return isinstance(info, dict) and info.get("master_link_status") == "up"

        wait_for(ready, "the sentinels to know the replica and each other")
        yield master, replica, ports
    finally:
        for process in sentinels:
            process.send_signal(signal.SIGTERM)
            process.wait(10)
        replica.cleanup()
        master.cleanup()


async def add_until_accepted(client: QueueClient, order: int) -> str:
    """Add with a job id, retrying while there is no master: the id makes a retry safe."""
    while True:
        try:
            handle = await client.queue("invoices").add({"order": order},
                                                        job_id=f"order-{order}")
            result = await handle.result(timeout=20)
            return str(result)
        except ConnectionError:
            await anyio.sleep(0.2)


async def main(master: RedisServer, replica: RedisServer, sentinel_ports: list[int]) -> None:
    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in sentinel_ports) + \
        f"/{SERVICE}"
    print(f"url: {url}")
    worker = Worker(queues, "invoices", url=url, grace=5.0)
    async with QueueClient(url) as client, anyio.create_task_group() as tg:
        await tg.start(worker.run)
        print(f"before the failover: {await add_until_accepted(client, 1)}"
              f" (master on port {master.port})")

        master.kill()  # SIGKILL
        killed = time.monotonic()
        print("master killed")
        # The worker and the client ride out the gap; this add is retried until a master
        # takes it, and the same worker runs it.
        result = await add_until_accepted(client, 2)
        promoted = ask(sentinel_ports[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        print(f"after the failover: {result} (master now on port {replica.port}: "
              f"{isinstance(promoted, list) and int(promoted[1]) == replica.port}), "
              f"{time.monotonic() - killed:.0f} s after the kill")
        await worker.shutdown(grace=5)
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    workdir = Path(tempfile.mkdtemp(prefix="panqueue-sentinel-example-"))
    try:
        with sentinel_setup(workdir) as (master, replica, sentinel_ports):
            anyio.run(main, master, replica, sentinel_ports)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("done")
