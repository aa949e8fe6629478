"""Handlers for scripts/torture.py (loaded by its worker processes as ``torture_app:queues``).

One queue per executor: ``torture-inline`` (async), ``torture-thread`` (blocking, thread pool)
and ``torture-subprocess`` (blocking, child processes), and ``torture-partitioned`` (async, three
partitions, or ``$TORTURE_PARTITIONS``); ``torture-callbacks`` runs the callbacks of the batches
some jobs are added in.
Every handler sleeps for the time the job asks for (a quarter of the blocking jobs ignore
``should_stop()``) and writes each run to a journal: one append-only file per process in
``$TORTURE_JOURNAL_DIR``, one line per event, written with a single ``write`` so a line is
never torn even when the process is killed:

    S <run> <job id> <attempt> <worker> <pid> <monotonic ns>      a run started
    E <run> <monotonic ns> <outcome>                              it ended (ok, or the exception)

``worker`` is the process group id: the worker process's pid (torture.py starts each worker in a
session of its own, and the subprocess children stay in their worker's group), so a run in a
child is attributed to its worker even after that worker was killed. Monotonic clocks are
system-wide on Linux, so torture.py compares these times with its own (kill times).

Completed jobs are all kept (``Retention(completed=-1)``) so the final count sees every one;
stalls are tolerated many times over (a job may be abandoned by every worker that is killed).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import anyio

from panqueue import Backoff, Job, Registry, Retention

queues = Registry()

_COMMON = dict(lock_ttl=3.0, max_stalls=1000, attempts=25, backoff=Backoff.fixed(0.1),
               retention=Retention(completed=-1, failed=-1, failed_for=None))
_journal_fd: int | None = None


def _write(line: str) -> None:
    global _journal_fd
    if _journal_fd is None:
        path = os.path.join(os.environ["TORTURE_JOURNAL_DIR"], f"journal-{os.getpid()}.log")
        _journal_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_journal_fd, (line + "\n").encode())


def _start(job: Job) -> str:
    run = uuid.uuid4().hex[:12]
    _write(f"S {run} {job.id} {job.attempt} {os.getpgrp()} {os.getpid()} {time.monotonic_ns()}")
    return run


def _end(run: str, outcome: str) -> None:
    _write(f"E {run} {time.monotonic_ns()} {outcome}")


async def _inline(job: Job) -> int:
    run = _start(job)
    outcome = "ok"
    try:
        await anyio.sleep(job.data["ms"] / 1000)
        return int(job.data["i"])
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        _end(run, outcome)


inline = queues.handler("torture-inline", concurrency=10, **_COMMON)(_inline)
# A partitioned queue: its jobs carry flows (depends_on) and dedup keys, whose identities live
# in a home partition apart from the job. Three partitions, or the count torture.py redeploys it
# with ($TORTURE_PARTITIONS): the first worker of a new count changes the queue's layout.
partitioned = queues.handler("torture-partitioned", concurrency=10,
                             partitions=int(os.environ.get("TORTURE_PARTITIONS", "3")),
                             **_COMMON)(_inline)


@queues.handler("torture-callbacks", concurrency=4, **_COMMON)
async def batch_done(job: Job) -> str:
    """The callback of a batch of torture.py's jobs: journals its run, returns the batch id."""
    run = _start(job)
    _end(run, "ok")
    return str(job.data["batch"]["id"])


def _blocking(job: Job) -> int:
    return _sleep_blocking(job, _start(job))


def _sleep_blocking(job: Job, run: str) -> int:
    outcome = "ok"
    try:
        deadline = time.monotonic() + job.data["ms"] / 1000
        # Sleep in small steps and stop when asked (shutdown, cancel, lock lost), as a
        # well-behaved blocking handler does; a "stubborn" job never asks, as much real
        # blocking code does not (a thread cannot be stopped from outside).
        while (left := deadline - time.monotonic()) > 0:
            if not job.data.get("stubborn") and job.should_stop():
                outcome = "stopped"
                raise InterruptedError("asked to stop")
            time.sleep(min(left, 0.05))
        return int(job.data["i"])
    except BaseException as exc:
        if outcome == "ok":
            outcome = type(exc).__name__
        raise
    finally:
        _end(run, outcome)


thread = queues.handler("torture-thread", executor="thread", concurrency=4, **_COMMON)(_blocking)


# The run under way in this child process, for _on_sigterm.
_child_run: str | None = None


def _on_sigterm(signum: int, frame: object) -> None:
    """A child the executor ends (an attempt stopped: lock lost, timeout, cancel) gets SIGTERM
    first: its run's end is journaled before it exits, so that the run is not taken to have
    lasted until its worker was gone. (SIGKILL, after the executor's grace, leaves no line.)"""
    if _child_run is not None:
        _end(_child_run, "SIGTERM")
    os._exit(128 + signum)


@queues.handler("torture-subprocess", executor="subprocess", concurrency=2, new_session=False,
                env=["PATH", "TORTURE_JOURNAL_DIR"], **_COMMON)
def in_child(job: Job) -> int:
    global _child_run
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    run = _start(job)
    _child_run = run
    try:
        return _sleep_blocking(job, run)
    finally:
        _child_run = None
