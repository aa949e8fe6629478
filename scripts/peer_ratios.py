"""panqueue against BullMQ-on-Node in runs of the shared peer benchmark, as issue targets read.

    python scripts/peer_ratios.py [RUN.json ...]

Each argument is a JSON file that ``../shared/bench/peers/run.sh --only bullmq_node,panqueue``
wrote (``results/run-*.json``; by default ``results/latest.json``). For each run, and as the
median over the runs, it prints panqueue's default profile against BullMQ's in that same run:
the steady rate, worker and Redis CPU per job, pickup p50 and p99 and the bulk enqueue rate.
It also prints Redis CPU per job against the cost of one empty script call, the same run's
``redis-benchmark`` ceiling for ``EVALSHA return 1`` at ``-P 1`` (50 clients: one call per
round trip, as a server that one script call per job would keep busy), taken as one second
over its rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1].parent / "shared" / "bench" / "peers" / "results"
COLUMNS = ("steady rate", "worker CPU", "Redis CPU", "pickup p50", "pickup p99", "bulk enqueue",
           "Redis CPU / empty EVALSHA")


def ratios(run: dict[str, Any]) -> tuple[str, list[float]]:
    """(when the run started, its ratios in the order of COLUMNS)."""
    peers = {(p["id"], p["profile"]): p for p in run["peers"]}
    ours, theirs = peers[("panqueue", "default")], peers[("bullmq_node", "default")]
    a, b = ours["throughput"], theirs["throughput"]
    evalsha = run["redis_ceiling"]["runs"]["P1"]["EVALSHA return 1"]["rps"]
    return run["meta"]["started"], [
        a["steady_rate"] / b["steady_rate"],
        a["worker_cpu_us_per_job"] / b["worker_cpu_us_per_job"],
        a["redis_cpu_us_per_job"] / b["redis_cpu_us_per_job"],
        ours["latency"]["p50_ms"] / theirs["latency"]["p50_ms"],
        ours["latency"]["p99_ms"] / theirs["latency"]["p99_ms"],
        a["enqueue_rate"] / b["enqueue_rate"],
        a["redis_cpu_us_per_job"] / (1e6 / evalsha),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("runs", nargs="*", metavar="RUN.json",
                        help="runs of run.sh --only bullmq_node,panqueue (default: "
                             "results/latest.json)")
    files = [Path(p) for p in parser.parse_args(argv).runs] or [RESULTS / "latest.json"]
    rows = []
    for path in files:
        try:
            rows.append(ratios(json.loads(path.read_text())))
        except OSError as exc:
            return _refuse(f"{path}: {exc.strerror}")
        except ValueError as exc:
            return _refuse(f"{path}: not JSON ({exc})")
        except KeyError as exc:
            return _refuse(f"{path}: no run of bullmq_node and panqueue (missing {exc})")
    print("| run | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for started, values in rows:
        print(f"| {started} | " + " | ".join(f"{v:.2f}x" for v in values) + " |")
    if len(rows) > 1:
        medians = [statistics.median(column) for column in zip(*(v for _, v in rows), strict=True)]
        print(f"| median of {len(rows)} | " + " | ".join(f"**{v:.2f}x**" for v in medians)
              + " |")
    return 0


def _refuse(problem: str) -> int:
    print(f"peer_ratios: {problem}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
