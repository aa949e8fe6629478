"""Handlers that misbehave, for the fault tests. Subprocess handlers must be module-level: the
child process imports them by name."""

from __future__ import annotations

import sys
from typing import Any

import anyio

from panqueue import Backoff, Job, Registry, Retry

queues = Registry()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Custom(BaseException):
    """A BaseException that is not an Exception."""


def misbehave(job: Job) -> Any:
    """What the job's data names: raise or return something nasty, or succeed with "ok"."""
    what = job.data
    if what == "system-exit":
        raise SystemExit(3)
    if what == "keyboard-interrupt":
        raise KeyboardInterrupt
    if what == "base-exception":
        raise Custom("custom base exception")
    if what == "unprintable":
        raise Unprintable
    if what == "retry-inf":
        raise Retry(delay=float("inf"))
    if what == "retry-nan":
        raise Retry(delay=float("nan"))
    if what == "surrogate-result":  # UTF-8 cannot encode it (JSON's "\\ud800" makes one)
        return "x\ud800"
    if what == "surrogate-error":
        raise ValueError("bad \ud800")
    if what == "retry-huge":  # more than msgpack carries: a child sent it as it was, and died
        raise Retry(delay=10**30)
    if what == "retry-huger":  # more than a float holds
        raise Retry(delay=10**400)
    return "ok"


@queues.handler("f-thread", executor="thread", attempts=1)
def in_thread(job: Job) -> Any:
    return misbehave(job)


@queues.handler("f-subprocess", executor="subprocess", attempts=1)
def in_child(job: Job) -> Any:
    return misbehave(job)


@queues.handler("f-inline", attempts=1)
async def inline(job: Job) -> Any:
    if job.data == "task-group-exit":  # sys.exit() in a task of the handler's own task group
        async def exits() -> None:
            sys.exit(3)

        async with anyio.create_task_group() as group:
            group.start_soon(exits)
    return misbehave(job)


@queues.handler("f-inline-retry", attempts=2)
async def inline_retry(job: Job) -> Any:
    if job.attempt == 1:
        return misbehave(job)
    return "ok"


def misbehave_once(job: Job) -> Any:
    """The first attempt misbehaves as the data names; the second returns "second"."""
    if job.attempt == 1:
        return misbehave(job)
    return "second"


@queues.handler("f-retry-inline", attempts=2, backoff=Backoff.fixed(0.01))
async def retry_inline(job: Job) -> Any:
    return misbehave_once(job)


@queues.handler("f-retry-thread", executor="thread", attempts=2, backoff=Backoff.fixed(0.01))
def retry_in_thread(job: Job) -> Any:
    return misbehave_once(job)


@queues.handler("f-retry-subprocess", executor="subprocess", attempts=2,
                backoff=Backoff.fixed(0.01))
def retry_in_child(job: Job) -> Any:
    return misbehave_once(job)
