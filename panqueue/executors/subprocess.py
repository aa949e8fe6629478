"""The subprocess executor: handlers in long-lived child processes, isolated per handler.

Isolation (the Python counterpart of Deno's permission scoping): the child inherits only the
environment variables named in ``env`` (default: PATH, LANG, LC_*, TZ), starts in ``cwd``, runs
under ``resource.setrlimit`` limits (memory, CPU seconds per job, open files) and, by default,
in a session of its own. Children start on demand, one per running job at most, and are replaced
after ``max_jobs_per_child`` jobs or any crash. A child that dies mid-job fails the attempt with
a message naming what happened; the retry policy then applies.

With ``permissions=Permissions(...)`` the child also confines itself before its first job
(:mod:`panqueue._sandbox`): the kernel then denies whatever was not granted. Its environment
comes from ``Permissions.env``, its stderr is a pipe relayed to the worker's (never the
worker's own descriptor), and a worker on a host that cannot enforce the rules refuses the
queue (``on_unsupported="warn"``: runs unconfined, with one WARNING per child).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import anyio

from panqueue._job import Job
from panqueue._log import get_logger
from panqueue._options import Isolation
from panqueue.errors import ConfigError, Fail, RateLimited, Retry, Snooze
from panqueue.executors._process import (
    TERM_GRACE,
    Child,
    FrameRefused,
    cpu_used,
    relay_stderr,
)
from panqueue.executors.base import ChildCrashed, Executor, JobTimeout, RemoteError

__all__ = ["ChildCrashed", "RemoteError", "SubprocessExecutor"]

# The child's bootstrap: it needs panqueue and the handler's module importable without any
# inherited PYTHONPATH, so the parent's sys.path travels as an argument.
_BOOTSTRAP = (
    "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
    "from panqueue.executors._child import main; main()"
)


def describe_exit(returncode: int, isolation: Isolation) -> str:
    limits = isolation.limits
    if returncode < 0:
        signum = -returncode
        if signum == signal.SIGXCPU and limits is not None and limits.cpu_seconds:
            return f"child exceeded CPU limit {limits.cpu_seconds} s (SIGXCPU)"
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"child killed by {name}"
    return f"child exited with code {returncode}"


class SubprocessExecutor(Executor):
    """Runs each job in a child process; see the module docstring for the isolation model."""

    name = "subprocess"
    isolates = True

    @classmethod
    def check_handler(cls, fn: Any, queue: str) -> None:
        if "<locals>" in getattr(fn, "__qualname__", "<locals>") or \
                getattr(fn, "__module__", "__main__") == "__main__":
            raise ConfigError(
                f"handler for queue {queue!r} must be a module-level function of an importable "
                "module for executor='subprocess' (the child imports it by name; a script's "
                "__main__ cannot be imported again)")

    def __init__(self, handler: Any) -> None:
        super().__init__(handler)
        self.isolation: Isolation = handler.options.isolation or Isolation()
        self._idle: list[Child] = []
        self._busy: set[Child] = set()
        self._stopping = False
        self.permissions = getattr(handler.options, "permissions", None)
        # The config frame's policy when the children are confined; None without permissions
        # or, under on_unsupported="warn", on a host that cannot enforce them.
        self._policy: dict[str, Any] | None = None
        self._unenforced: str | None = None  # what this host lacks, under "warn"

    async def start(self) -> None:
        """With permissions: refuse the queue (ConfigError) where they cannot be enforced,
        unless they say ``on_unsupported="warn"``."""
        permissions = self.permissions
        if permissions is None:
            return
        from panqueue._sandbox.probe import support

        missing = support().missing(permissions)
        if not missing:
            from panqueue._sandbox.policy import to_wire

            try:
                self._policy = to_wire(permissions)
            except ValueError as exc:
                raise ConfigError(f"queue {self.handler.queue!r}: {exc}") from None
            absent = [path for path in (*permissions.read, *permissions.write)
                      if not os.path.exists(path)]
            if absent:  # granted nothing: the kernel needs the path to exist when rules apply
                get_logger("panqueue.worker").warning(
                    "permissions grant paths that do not exist (nothing is granted there)",
                    queue=self.handler.queue, paths=absent)
        elif permissions.on_unsupported == "warn":
            self._unenforced = "; ".join(missing)
        else:
            raise ConfigError(
                f"queue {self.handler.queue!r}: its permissions cannot be enforced on this host: "
                f"{'; '.join(missing)} (Permissions(on_unsupported='warn') runs it unconfined)")

    def _env(self) -> dict[str, str]:
        if self.permissions is not None:
            from panqueue._sandbox.policy import child_env

            return child_env(self.permissions)
        return {name: os.environ[name] for name in self.isolation.env if name in os.environ}

    async def _spawn(self) -> Child:
        stderr: int | None = None
        if self.permissions is not None:
            if self._policy is None and self._unenforced is None:
                await self.start()  # never an unconfined child because start() was skipped
            relay_fd, stderr = os.pipe()
        try:
            process = await anyio.open_process(
                [sys.executable, "-c", _BOOTSTRAP, json.dumps(sys.path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                env=self._env(), cwd=self.isolation.cwd,
                start_new_session=self.isolation.new_session)
        except BaseException:
            if stderr is not None:
                os.close(relay_fd)
            raise
        finally:
            if stderr is not None:
                os.close(stderr)
        if stderr is not None:
            threading.Thread(target=relay_stderr, args=(relay_fd,), daemon=True,
                             name=f"panqueue-stderr-{process.pid}").start()
        if self._unenforced is not None:
            get_logger("panqueue.worker").warning(
                "permissions not enforced: child runs unconfined", queue=self.handler.queue,
                pid=process.pid, missing=self._unenforced)
        child = Child(process)
        child.group = self._policy is not None
        limits = self.isolation.limits
        try:
            config: dict[str, Any] = {
                "handler": self.handler.import_path,
                "limits": None if limits is None else {
                    "memory_mb": limits.memory_mb, "cpu_seconds": limits.cpu_seconds,
                    "open_files": limits.open_files},
            }
            if self._policy is not None:
                config["permissions"] = self._policy
            await child.send(config)
            ready = await child.receive()
            if ready.get("t") == "listener" and self._policy is not None:
                await self._attach(child, int(ready["fd"]))
                ready = await child.receive()
        except FrameRefused as exc:
            await child.terminate()
            self.restarted("crashed")
            raise ChildCrashed(f"child could not start: {exc}") from None
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.IncompleteRead):
            with anyio.CancelScope(shield=True), anyio.move_on_after(TERM_GRACE):
                await process.wait()  # it exited: report how, rather than our own SIGTERM
            returncode = process.returncode
            await child.terminate()
            how = "did not answer" if returncode is None else describe_exit(returncode,
                                                                             self.isolation)
            self.restarted("crashed")
            raise ChildCrashed(f"child could not start: {how} (is {self.handler.import_path} "
                               "importable? its traceback is on the worker's stderr)") from None
        except BaseException:
            await child.terminate()  # cancelled while starting: never leave a child behind
            raise
        if ready.get("t") == "refused":
            await child.terminate()
            self.restarted("crashed")
            raise ChildCrashed(f"child could not apply its permissions: {ready.get('why')}")
        if ready.get("t") != "ready":
            await child.terminate()
            self.restarted("crashed")
            raise ChildCrashed(f"child sent {ready!r} instead of 'ready'")
        return child

    async def _attach(self, child: Child, fd: int) -> None:
        """Hand the child's seccomp listener to the worker's supervisor, then say so."""
        from panqueue._sandbox.net import NetPolicy
        from panqueue._sandbox.supervisor import supervisor

        assert self._policy is not None and self.permissions is not None
        supervisor().attach(child.process.pid, fd, NetPolicy.from_wire(self._policy["net"]),
                            self.permissions.processes)
        child.supervised = True
        await child.send({"t": "attached"})

    def _limit_cpu(self, child: Child) -> None:
        """A confined child cannot raise its own CPU limit: give its next job a budget."""
        limits = self.isolation.limits
        if self._policy is None or limits is None or not limits.cpu_seconds:
            return
        import resource

        pid = child.process.pid
        with contextlib.suppress(OSError, ValueError):
            _, hard = resource.prlimit(pid, resource.RLIMIT_CPU)
            soft = cpu_used(pid) + 1 + limits.cpu_seconds
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.prlimit(pid, resource.RLIMIT_CPU, (soft, hard))

    async def _take(self) -> Child:
        """An idle child still alive, else a new one: a child that ended while idle (it
        exited after its last job) is no reason to fail the next job."""
        while self._idle:
            child = self._idle.pop()
            if child.alive:
                return child
            await child.terminate()
            self.restarted("crashed")
        return await self._spawn()

    async def run(self, job: Job, timeout: float | None) -> Any:
        child = await self._take()
        healthy = False
        # Why the child is replaced if this ends unhealthy; "stopped" unless found otherwise:
        # the attempt was cancelled (cancel request, lost lock, forced shutdown).
        restart: str | None = "stopped"
        try:
            options = job.options
            self._limit_cpu(child)
            await child.send({
                "t": "run", "id": job.id, "queue": job.queue, "data": job.data,
                "attempt": job.attempt,
                "options": {"attempts": options.attempts, "backoff": options.backoff.to_wire(),
                            "timeout": options.timeout},
                "enqueued_at": job.enqueued_at_ms,
            })
            self._busy.add(child)
            if self._stopping:
                child.request_stop()
            with anyio.move_on_after(timeout) as scope:
                frame = await self._until_done(child, job)
            if scope.cancelled_caught:
                restart = "timeout"
                raise JobTimeout(timeout or 0)
            child.jobs += 1
            restart = None  # a child that asks to be recycled is replaced as planned
            healthy = not frame.get("recycle")
            return self._outcome(frame, child)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.IncompleteRead):
            restart = "crashed"
            with anyio.CancelScope(shield=True):
                returncode = await child.process.wait()
            raise ChildCrashed(describe_exit(returncode, self.isolation)
                               + _denied(child.new_denials())) from None
        except FrameRefused as exc:  # killed in finally, as an unhealthy child is
            restart = "crashed"
            raise ChildCrashed(f"{exc}: the child was killed") from None
        finally:
            self._busy.discard(child)
            limit = self.isolation.max_jobs_per_child
            if healthy and child.alive and (limit is None or child.jobs < limit):
                self._idle.append(child)
            else:
                # Cancelled (forced shutdown, cancel request), timed out, crashed or used up.
                await child.terminate()
                if restart is not None:  # not a planned recycle
                    self.restarted(restart)

    async def _until_done(self, child: Child, job: Job) -> dict[str, Any]:
        while True:
            frame = await child.receive()
            kind = frame.get("t")
            if kind == "done":
                return frame
            if kind == "p":
                await job.progress(frame.get("v"))
            elif kind == "l":
                await job.log(str(frame.get("v")))
            elif kind == "d":  # a durable call (job.step, job.sleep, job.wait_for)
                await child.send(await _durable_answer(job, frame))

    def _outcome(self, frame: dict[str, Any], child: Child) -> Any:
        if frame.get("ok"):
            return frame.get("r")
        cause = _remote_error(frame["cause"]) if "cause" in frame else None
        if "retry" in frame:
            raise Retry(frame["retry"]) from cause
        if "fail" in frame:
            raise Fail(str(frame["fail"])) from cause
        if "snooze" in frame:
            raise Snooze(frame["snooze"])
        if "rate_limited" in frame:
            raise RateLimited(frame["rate_limited"])
        remote = _remote_error(frame.get("e"))
        type_name, message = remote.type_name, str(remote)
        limits = self.isolation.limits
        if type_name == "MemoryError" and limits is not None and limits.memory_mb:
            message = f"child exceeded memory limit {limits.memory_mb} MB"
        denials = child.new_denials()
        if denials and not any(denial in message for denial in denials):
            message += _denied(denials)
        raise RemoteError(type_name, message, remote.traceback)

    def request_stop(self) -> None:
        """Phase one: tell every busy child that its job should stop (``job.should_stop()``)."""
        self._stopping = True
        for child in list(self._busy):
            child.request_stop()

    async def aclose(self) -> None:
        children, self._idle = self._idle, []
        for child in children:
            await child.terminate()


async def _durable_answer(job: Job, frame: dict[str, Any]) -> dict[str, Any]:
    """The answer to a child's durable call: its result, or the error it raised (type,
    message, and a signal's name), which the child raises again in the handler."""
    try:
        value = await job.relay_durable(str(frame.get("f")), *(frame.get("a") or ()))
    except Exception as exc:
        return {"t": "dr", "ok": False, "type": type(exc).__name__, "m": str(exc),
                "name": getattr(exc, "name", None)}
    return {"t": "dr", "ok": True, "v": value}


def _denied(denials: list[str]) -> str:
    """What the supervisor denied, as a suffix for an error message."""
    return f" (permissions denied: {'; '.join(denials)})" if denials else ""


def _remote_error(wire: Any) -> RemoteError:
    """The exception a child reported (a frame's ``e`` or ``cause``), as the worker raises it."""
    error = wire if isinstance(wire, dict) else {}
    traceback = error.get("traceback")
    return RemoteError(str(error.get("type", "Exception")), str(error.get("message", "")),
                       traceback if isinstance(traceback, str) else None)
