"""What the peer benchmark's bulk enqueue costs: ``SyncQueueClient.queue(q).add_bulk`` of
1,000 empty dicts per call, 20 calls (20,000 jobs), against a private redis-server (appendonly
and RDB off), as ``../shared/bench/peers/adapters/peer_panqueue.py`` does. Per round: jobs/s
(wall clock of the add_bulk calls), the server's CPU per job (``INFO cpu`` delta) and the
commands per job the add script made (``INFO commandstats``).

    .venv/bin/python scripts/bulk_add_cost.py [--rounds 3] [--jobs 20000] [--profile]

``--profile``: one round under cProfile, its 30 costliest calls by cumulative time. Run it with
``PYTHONPATH=<another checkout>`` to measure that tree's code the same way.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

import redis

import panqueue as pq

CHUNK = 1000
_SKIPPED = ("info", "config", "config|resetstat", "flushall", "ping")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cpu(r: redis.Redis) -> float:
    info: dict[str, Any] = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def one_round(r: redis.Redis, url: str, jobs: int, profile: bool) -> None:
    r.flushall()
    with pq.SyncQueueClient(url) as client:
        queue = client.queue("bulk")
        queue.add_bulk([{}])  # the connection, the layout and the script, before the clock
        items = [{} for _ in range(jobs)]
        r.config_resetstat()
        cpu = _cpu(r)
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        start = time.perf_counter()
        for i in range(0, jobs, CHUNK):
            queue.add_bulk(items[i:i + CHUNK])
        wall = time.perf_counter() - start
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        cpu = _cpu(r) - cpu
        stats: dict[str, Any] = r.info("commandstats")
    commands = {name[len("cmdstat_"):]: value["calls"] / jobs for name, value in stats.items()}
    made = ", ".join(f"{name} {calls:.3g}" for name, calls in sorted(commands.items())
                     if name not in _SKIPPED and not name.startswith("eval"))
    print(f"{jobs / wall:9,.0f} jobs/s  wall {wall * 1000:5.0f} ms  server CPU "
          f"{cpu / jobs * 1e6:4.1f} µs/job  commands/job: {made}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    port = _free_port()
    folder = tempfile.mkdtemp()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "",
                               "--appendonly", "no", "--dir", folder],
                              stdout=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.025)
        print(f"panqueue from {pq.__file__}")
        for _ in range(1 if args.profile else args.rounds):
            one_round(r, f"redis://127.0.0.1:{port}", args.jobs, args.profile)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
