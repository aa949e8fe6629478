"""Handlers for the durable-job tests (steps, sleeps, signals), on each executor. Module-level,
so a subprocess child imports them. Side effects are counted in Redis at ``job.data["url"]``
(``runs:<job>:<what>``), so that a test counts them whichever process ran the step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio.to_thread
import redis

from panqueue import Backoff, Job, Permissions, Registry, SignalTimeout

queues = Registry()
FAST = Backoff("fixed", 0.01)


def count(job: Job, what: str) -> int:
    """The side effect of a step: counted once per call."""
    return int(redis.Redis.from_url(job.data["url"]).incr(f"runs:{job.id}:{what}"))


def _fails(job: Job) -> bool:
    """The first ``fail_runs`` runs of the handler fail after step "b"."""
    runs = count(job, "handler")
    return runs <= job.data.get("fail_runs", 0)


async def _steps(job: Job) -> dict[str, Any]:
    a = await job.step("a", count, job, "a")
    b = await job.step("b", _async_count, job, "b")
    if _fails(job):
        raise RuntimeError("after b")
    return {"a": a, "b": b, "attempt": job.attempt}


async def _async_count(job: Job, what: str) -> int:
    return count(job, what)


@queues.handler("dur-steps", attempts=3, backoff=FAST)
async def steps_inline(job: Job) -> dict[str, Any]:
    return await _steps(job)


@queues.handler("dur-steps-thread", attempts=3, backoff=FAST, executor="thread")
def steps_thread(job: Job) -> dict[str, Any]:
    a = job.step("a", count, job, "a")
    b = job.step("b", count, job, "b")
    if _fails(job):
        raise RuntimeError("after b")
    return {"a": a, "b": b, "attempt": job.attempt}


@queues.handler("dur-steps-subprocess", attempts=3, backoff=FAST, executor="subprocess")
def steps_subprocess(job: Job) -> dict[str, Any]:
    return steps_thread.fn(job)


@queues.handler("dur-sleep-subprocess", attempts=1, executor="subprocess")
def sleeper_subprocess(job: Job) -> dict[str, Any]:
    return sleeper_thread.fn(job)


@queues.handler("dur-signal-subprocess", attempts=1, executor="subprocess")
def waiter_subprocess(job: Job) -> dict[str, Any]:
    return waiter_thread.fn(job)


def _double(n: int) -> int:
    return 2 * n


@queues.handler("dur-sandboxed", attempts=1, executor="subprocess",
                permissions=Permissions(on_unsupported="warn"))
def sandboxed(job: Job) -> dict[str, Any]:
    """Confined with no grant at all: its durable calls go over the child's pipe."""
    doubled = job.step("double", _double, job.data["n"])
    job.sleep(0.2)
    return {"doubled": doubled, "got": job.wait_for("approved")}


async def _double_later(n: int) -> int:
    return 2 * n


@queues.handler("dur-async-step-thread", attempts=1, executor="thread")
def async_step_thread(job: Job) -> int:
    """A thread handler calls its steps plainly: an async step function is refused."""
    return int(job.step("double", _double_later, 21))


@queues.handler("dur-async-step-subprocess", attempts=1, executor="subprocess")
def async_step_subprocess(job: Job) -> int:
    return int(job.step("double", _double_later, 21))


@queues.handler("dur-misuse", attempts=1)
async def misuse(job: Job) -> None:
    if job.data["how"] == "twice":
        await job.step("x", count, job, "x")
        await job.step("x", count, job, "x")
    elif job.data["how"] == "not-json":
        await job.step("bad", lambda: {"when": datetime.now(UTC)})
    elif job.data["how"] == "big":
        await job.step("big", lambda: "x" * (2 * 1024 * 1024))
    elif job.data["how"] == "raises":
        await job.step("boom", _boom, job)
    elif job.data["how"] == "sleep-huge":  # past a float's range
        await job.sleep(10**400)


def _boom(job: Job) -> None:
    count(job, "boom")
    raise ValueError("boom")


@queues.handler("dur-sleep", attempts=1)
async def sleeper(job: Job) -> dict[str, Any]:
    a = await job.step("a", count, job, "a")
    if "until_s" in job.data:
        await job.sleep(until=datetime.now(UTC) + timedelta(seconds=job.data["until_s"]))
    else:
        await job.sleep(timedelta(seconds=job.data["sleep"]))
    b = await job.step("b", count, job, "b")
    return {"a": a, "b": b, "runs": count(job, "handler")}


@queues.handler("dur-sleep-thread", attempts=1, executor="thread")
def sleeper_thread(job: Job) -> dict[str, Any]:
    a = job.step("a", count, job, "a")
    job.sleep(job.data["sleep"])
    b = job.step("b", count, job, "b")
    return {"a": a, "b": b, "runs": count(job, "handler")}


@queues.handler("dur-signal", attempts=2, backoff=FAST)
async def waiter(job: Job) -> dict[str, Any]:
    a = await job.step("a", count, job, "a")
    timeout = job.data.get("timeout")
    try:
        first = await job.wait_for("approved", timeout=timeout)
    except SignalTimeout:
        if not job.data.get("catch"):
            raise
        first = "timed out"
    second = await job.wait_for("approved", timeout=timeout) if job.data.get("two") else None
    b = await job.step("b", count, job, "b")
    if job.data.get("fail_once") and count(job, "failed") == 1:
        raise RuntimeError("after b, once")  # the retry replays the waits
    return {"a": a, "b": b, "first": first, "second": second}


@queues.handler("dur-signal-thread", attempts=1, executor="thread")
def waiter_thread(job: Job) -> dict[str, Any]:
    a = job.step("a", count, job, "a")
    got = job.wait_for("approved", timeout=job.data.get("timeout"))
    b = job.step("b", count, job, "b")
    return {"a": a, "b": b, "first": got}


@queues.handler("dur-mixed", concurrency=2)
async def mixed(job: Job) -> str:
    """Sleeps ``sleep`` seconds when asked, else returns at once."""
    if job.data.get("sleep"):
        await job.sleep(job.data["sleep"])
        return "slept"
    return "done"


@queues.handler("dur-parted", partitions=2, concurrency=4)
async def parted(job: Job) -> Any:
    return await job.wait_for("go")


@queues.handler("dur-keyed", mode="keyed", key_concurrency=1, concurrency=4)
async def keyed(job: Job) -> str:
    """Sleeps ``sleep`` seconds when asked: the sleep does not hold its key."""
    if job.data.get("sleep"):
        await job.sleep(job.data["sleep"])
    return "done"


@queues.handler("dur-big-steps")
async def big_steps(job: Job) -> Any:
    """Steps whose results are large (within max_payload_bytes), then a wait."""
    for n in range(job.data["steps"]):
        await job.step(f"big-{n}", lambda: "s" * job.data["size"])
    return await job.wait_for("never")


MARKUP = "<script>window.__pwned = 1</script>"


@queues.handler("dur-markup")
async def markup(job: Job) -> Any:
    """A step and a signal named with markup, and a step result holding it."""
    await job.step(MARKUP, lambda: {"html": MARKUP})
    return await job.wait_for(MARKUP)


def _blocked_until_go(job: Job) -> int:
    """A step that runs until the test lets it go (a blocking pop, in a thread)."""
    client = redis.Redis.from_url(job.data["url"])
    client.incr(f"runs:{job.id}:a")
    client.blpop([f"go:{job.id}"], timeout=30)
    return 1


@queues.handler("dur-signal-mid")
async def waiter_mid(job: Job) -> Any:
    await job.step("a", anyio.to_thread.run_sync, _blocked_until_go, job)
    return await job.wait_for("approved")


def _calls(url: str) -> dict[str, int]:
    """The server's counts so far (INFO commandstats): script calls, and HGETALLs."""
    stats = redis.Redis.from_url(url).info("commandstats")

    def calls(command: str) -> int:
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    return {"scripts": calls("fcall") + calls("evalsha") + calls("eval"),
            "hgetall": calls("hgetall")}


def _since(before: dict[str, int], url: str) -> dict[str, int]:
    after = _calls(url)
    return {what: after[what] - n for what, n in before.items()}


@queues.handler("dur-count", attempts=2, backoff=FAST)
async def counted(job: Job) -> dict[str, int]:
    """What one step costs the server: the calls made from just before it to just after it
    (the first attempt fails after the step when ``fail`` is set)."""
    before = _calls(job.data["url"])
    await job.step("a", count, job, "a")
    calls = _since(before, job.data["url"])
    if job.data.get("fail") and job.attempt == 1:
        raise RuntimeError("after the step")
    return calls


@queues.handler("dur-count-thread", attempts=2, backoff=FAST, executor="thread")
def counted_thread(job: Job) -> dict[str, int]:
    before = _calls(job.data["url"])
    job.step("a", count, job, "a")
    calls = _since(before, job.data["url"])
    if job.data.get("fail") and job.attempt == 1:
        raise RuntimeError("after the step")
    return calls


@queues.handler("dur-count-subprocess", attempts=2, backoff=FAST, executor="subprocess")
def counted_subprocess(job: Job) -> dict[str, int]:
    return counted_thread.fn(job)
