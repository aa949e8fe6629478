"""Handlers for the executor tests. Subprocess handlers must be module-level functions: the
child process imports them by name."""

from __future__ import annotations

import os
import signal
import sys
import time

import redis

from panqueue import Fail, Job, Limits, Registry, Retry

queues = Registry()


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ.get("EXEC_APP_URL", "redis://127.0.0.1:1/0"))


def _gauge(name: str) -> None:
    """Count concurrently running handlers in Redis (peak kept in <name>:peak)."""
    r = _redis()
    n = r.incr(name)
    r.eval("if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
           "redis.call('SET', KEYS[1], ARGV[1]) end", 1, f"{name}:peak", n)


@queues.handler("t-parallel", executor="thread", concurrency=4)
def parallel(job: Job) -> int:
    _gauge("t-parallel")
    time.sleep(0.3)
    _redis().decr("t-parallel")
    return job.attempt


@queues.handler("t-report", executor="thread")
def thread_reports(job: Job) -> str:
    job.progress(40)
    job.log("from a thread")
    return "ok"


@queues.handler("t-timeout", executor="thread", timeout=0.2)
def thread_sleeps(job: Job) -> None:
    time.sleep(3)


@queues.handler("t-stuck", executor="thread", lock_ttl=60)
def thread_stuck(job: Job) -> None:
    _redis().rpush("t-stuck:started", job.id)
    time.sleep(30)


@queues.handler("t-cooperative", executor="thread")
def thread_cooperative(job: Job) -> str:
    _redis().rpush("t-cooperative:started", job.id)
    while not job.should_stop():
        time.sleep(0.01)
    return "stopped cleanly"


@queues.handler("t-cpu", executor="thread", lock_ttl=2)
def thread_cpu(job: Job) -> int:
    _redis().hincrby("cpu-runs", job.id, 1)
    return _burn(job.data["seconds"])


def _burn(seconds: float) -> int:
    """Pure-Python CPU work that never yields to anything, for ``seconds`` of wall-clock time
    (what a lock TTL counts; CPU time would stretch on a busy machine, where this thread gets
    a fraction of a core)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


@queues.handler("s-env", executor="subprocess", env=["PATH", "EXEC_APP_URL", "PANQUEUE_VISIBLE"])
def child_env(job: Job) -> dict[str, str | None]:
    return {"secret": os.environ.get("PANQUEUE_TEST_SECRET"),
            "visible": os.environ.get("PANQUEUE_VISIBLE"), "pid": str(os.getpid())}


@queues.handler("s-enqueued")
async def enqueued_by_a_child(job: Job) -> None:
    return None


@queues.handler("s-enqueue", executor="subprocess", env=["PATH", "PANQUEUE_URL"])
def child_enqueues(job: Job) -> dict[str, object]:
    """Adds a job from the child through another handler (the child loads the producer side on
    this first enqueue: importing the handlers did not)."""
    loaded_before = "panqueue._producer" in sys.modules
    handle = enqueued_by_a_child.enqueue({"from": os.getpid()})
    return {"id": handle.id, "loaded_before": loaded_before}


@queues.handler("s-report", executor="subprocess", env=["PATH"])
def child_reports(job: Job) -> int:
    job.progress({"step": 1})
    job.log("from a child")
    print("a print in the child goes to stderr, not into the protocol")
    return os.getpid()


@queues.handler("s-memory", executor="subprocess", limits=Limits(memory_mb=256))
def child_memory(job: Job) -> int:
    block = bytearray(512 * 1024 * 1024)
    return len(block)


@queues.handler("s-cpu-limit", executor="subprocess", limits=Limits(cpu_seconds=1))
def child_cpu_limit(job: Job) -> int:
    return _burn(30)


@queues.handler("s-crash", executor="subprocess", attempts=1)
def child_crash(job: Job) -> int:
    how = job.data["how"]
    if how == "exit":
        os._exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getpid()


@queues.handler("s-ignore-term", executor="subprocess", lock_ttl=60,
                env=["PATH", "EXEC_APP_URL"])
def child_ignores_sigterm(job: Job) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _redis().rpush("s-ignore-term:started", os.getpid())
    while True:
        time.sleep(0.05)


@queues.handler("s-timeout", executor="subprocess", timeout=0.3)
def child_sleeps(job: Job) -> None:
    time.sleep(600)  # only the timeout's kill ends it in time for the test's 30 s wait


@queues.handler("s-recycle", executor="subprocess", max_jobs_per_child=2)
def child_pid(job: Job) -> int:
    return os.getpid()


@queues.handler("s-cpu", executor="subprocess", lock_ttl=2, env=["PATH", "EXEC_APP_URL"])
def child_cpu(job: Job) -> int:
    _redis().hincrby("cpu-runs", job.id, 1)
    return _burn(job.data["seconds"])


@queues.handler("s-cooperative", executor="subprocess", env=["PATH", "EXEC_APP_URL"])
def child_cooperative(job: Job) -> str:
    _redis().rpush("s-cooperative:started", os.getpid())
    while not job.should_stop():
        time.sleep(0.01)
    return "stopped cleanly"


@queues.handler("s-async", executor="subprocess")
async def child_async(job: Job) -> str:
    return f"async in child {job.data}"


@queues.handler("t-cancel", executor="thread", lock_ttl=60)
def thread_until_cancelled(job: Job) -> str:
    _redis().rpush("t-cancel:started", job.id)
    while not job.should_stop():
        time.sleep(0.01)
    return "saw should_stop"


@queues.handler("s-cancel", executor="subprocess", lock_ttl=60, env=["PATH", "EXEC_APP_URL"])
def child_until_cancelled(job: Job) -> None:
    _redis().rpush("s-cancel:started", os.getpid())
    time.sleep(60)


@queues.handler("s-options", executor="subprocess")
def child_sees_options(job: Job) -> dict[str, object]:
    return {"attempts": job.options.attempts, "timeout": job.options.timeout,
            "enqueued_at": None if job.enqueued_at is None else job.enqueued_at.isoformat()}


@queues.handler("s-retry-from", executor="subprocess", attempts=3)
def child_retries_from_an_error(job: Job) -> None:
    try:
        {}["missing"]
    except KeyError as exc:
        if job.attempt == 1:
            raise Retry(delay=0.01) from exc
        raise Fail("giving up") from ValueError(f"bad input on attempt {job.attempt}")
