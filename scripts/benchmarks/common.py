"""What every benchmark shares: the run's context, reads of a queue's state, worker processes,
CPU readings from /proc, waiting, percentiles, the machine description and table printing."""

from __future__ import annotations

import datetime as dt
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import redis

import panqueue
from panqueue import JobNotFound, JobState
from panqueue._store import SyncTransport, ops
from panqueue._store.ops import partitions as parted
from panqueue.embedded import RedisServer

SCRIPTS = Path(__file__).resolve().parent.parent
# The worker processes import the same panqueue as this process (a PYTHONPATH checkout too).
PANQUEUE_ROOT = Path(panqueue.__file__).resolve().parent.parent
# Jobs per add_bulk call (and per add script call where the benchmark fills a queue itself).
BATCH = 1000
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Bench:
    """One benchmark run: the private server; a plain redis-py client on it for the server's
    own figures and housekeeping (INFO, FLUSHDB), never for a queue's keys; the transport that
    runs the store's typed operations; the worker processes' event loop and their log file."""

    url: str
    redis: redis.Redis
    store: SyncTransport
    server_pid: int
    backend: str
    log_file: IO[bytes]


# --------------------------------------------------------------------------- queue state


def counts(bench: Bench, queue: str) -> dict[JobState, int]:
    """Jobs per state (keyed mode's per-key waiting lists included in WAITING; every partition
    of a partitioned queue)."""
    return bench.store.run(parted.PartitionCounts().on_all(queue, parted.all_counts))


def started_ms(bench: Bench, queue: str, job_id: str) -> int:
    """When the job started (server clock, ms); 0 if it has not, or retention removed it."""
    try:
        info = bench.store.run(parted.PartitionCounts().on_job(queue, job_id, ops.get_job))
    except JobNotFound:
        return 0
    return 0 if info.started_at is None else round(info.started_at.timestamp() * 1000)


def last_finished_ms(bench: Bench, queue: str) -> int:
    """When the queue's most recently completed job finished (server clock, ms)."""
    [info] = bench.store.run(parted.PartitionCounts().on_all(  # newest first
        queue, parted.all_list_jobs, JobState.COMPLETED, 1, 0))
    assert info.finished_at is not None
    return round(info.finished_at.timestamp() * 1000)


def log(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- CPU from /proc


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # fields[0] is field 3 (state)


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def child_pids(pid: int) -> list[int]:
    """The live children of a process (of any of its threads)."""
    pids: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                pids.extend(int(p) for p in f.read().split())
        except OSError:
            pass  # the thread is gone
    return pids


def tree_cpu_seconds(pid: int) -> tuple[float, float, int]:
    """(the process's own CPU, its children's CPU, live children): the children's figure is
    the live children's utime + stime plus the reaped children's (cutime + cstime)."""
    fields = _stat_fields(pid)
    own = (int(fields[11]) + int(fields[12])) / CLK_TCK
    children = (int(fields[13]) + int(fields[14])) / CLK_TCK
    live = child_pids(pid)
    for child in live:
        try:
            children += proc_cpu_seconds(child)
        except OSError:  # exited in between: counted in cutime/cstime next time
            pass
    return own, children, len(live)


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100)
    return ordered[int(rank) - 1]


# --------------------------------------------------------------------------- worker processes


def start_worker(bench: Bench, queue: str, concurrency: int,
                 app: str = "bench_app:queues") -> subprocess.Popen[bytes]:
    """``python -m panqueue worker APP -q QUEUE`` with ``scripts/`` on its PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SCRIPTS), str(PANQUEUE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    args = [sys.executable, "-m", "panqueue", "worker", app, "-q", queue,
            "--concurrency", str(concurrency), "--log-level", "warning", "--url", bench.url,
            "--backend", bench.backend]
    return subprocess.Popen(args, cwd=SCRIPTS, env=env, stdin=subprocess.DEVNULL,
                            stdout=bench.log_file, stderr=bench.log_file)


def stop_worker(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM (the two-phase shutdown), SIGKILL after 30 s; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float, what: str,
             proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``predicate`` every ``interval`` s; fail if ``proc`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"worker exited with code {proc.returncode} while waiting for "
                               f"{what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- the machine


def machine_info(server: RedisServer) -> dict[str, Any]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    version = subprocess.run([server.binary, "--version"], capture_output=True, text=True,
                             check=False).stdout.strip()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "redis_server": version,
        "redis_py": redis.__version__,
        "hiredis": _hiredis_version(),
        "panqueue": f"{panqueue.__version__} from {PANQUEUE_ROOT}{_git_state()}",
    }


def _git_state() -> str:
    """The commit of the checkout being measured (and whether it has local changes)."""
    try:
        head = subprocess.run(["git", "-C", str(PANQUEUE_ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(PANQUEUE_ROOT), "status", "--porcelain",
                                "--", "panqueue"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f" (git {head}{', modified' if dirty else ''})"


def _hiredis_version() -> str | None:
    try:
        import hiredis
    except ImportError:
        return None
    return str(getattr(hiredis, "__version__", "installed"))


# --------------------------------------------------------------------------- printing


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                right: Sequence[bool]) -> None:
    """Columns as wide as their widest cell; ``right``: which columns are right-aligned."""
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(f"{c:>{w}}" if r else f"{c:<{w}}"
                         for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

    print(fmt(header))
    print("-" * len(fmt(header)))
    for row in rows:
        print(fmt(row))
