"""Server instructions per job of a peer of the shared benchmark: its enqueue and its drain,
counted by valgrind (callgrind) on a redis-server of this script's own.

Each run adds N jobs with the peer's adapter (``enqueue --n N``), then starts its worker
(``worker --c 50 --profile default``) until the N jobs are done, counting the server's
instructions over each phase. Two runs, at N and 4 N, give the work per job without what a run
does once (loading scripts, a worker's start):

    .venv/bin/python scripts/peer_instructions.py bullmq_node panqueue --jobs 2000

(docs/performance.md, "BullMQ's work, counted the same way"). The adapters are those of
../shared/bench/peers, with the environments its run.sh made there (node_modules for BullMQ,
.venv-panqueue for panqueue).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import redis
from redis_cost import CallgrindServer  # beside this script

PEERS = Path(__file__).resolve().parent.parent.parent / "shared" / "bench" / "peers"
COMMANDS = {
    "bullmq_node": ["node", "adapters/peer_bullmq_node.js"],
    "panqueue": [str(PEERS / ".venv-panqueue" / "bin" / "python"), "adapters/peer_panqueue.py"],
}


def run(peer: str, n: int) -> tuple[int, int]:
    """(enqueue, drain) instructions of ``n`` jobs of ``peer``."""
    with CallgrindServer() as server, contextlib.closing(redis.Redis(port=server.port)) as client:
        env = dict(os.environ, BENCH_REDIS_HOST="127.0.0.1", BENCH_REDIS_PORT=str(server.port),
                   BENCH_REDIS_URL=server.url)
        command = COMMANDS[peer]
        server.zero()
        subprocess.run([*command, "enqueue", "--n", str(n)], cwd=PEERS, env=env, check=True,
                       capture_output=True)
        enqueue = server.counted()
        server.zero()
        worker = subprocess.Popen([*command, "worker", "--c", "50", "--profile", "default"],
                                  cwd=PEERS, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while int(client.get("bench:done") or 0) < n:
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError(f"{peer}'s worker did not finish {n} jobs")
                time.sleep(0.5)
            drain = server.counted()
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
        return enqueue, drain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("peers", nargs="+", choices=sorted(COMMANDS))
    parser.add_argument("--jobs", type=int, default=2000, help="N: the runs add N and 4 N jobs")
    args = parser.parse_args()
    n = args.jobs
    for peer in args.peers:
        small, large = run(peer, n), run(peer, 4 * n)
        enqueue, drain = ((b - a) / (3 * n) for a, b in zip(small, large, strict=True))
        print(f"{peer}: enqueue {enqueue:,.0f}, drain {drain:,.0f} instructions per job")


if __name__ == "__main__":
    main()
