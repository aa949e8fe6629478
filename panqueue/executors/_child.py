"""The child side of the subprocess executor (runs in the child process only).

Protocol: frames of a 4-byte big-endian length and a msgpack map, over the child's original
stdin/stdout (the handler's own prints go to stderr). The parent's first frame configures the
child; the child answers ``ready``. With permissions, the child confines itself (see
:mod:`panqueue._sandbox.confine`: a first layer before it imports the handler, the rest
after) and, when its policy needs the worker's supervisor, sends
``listener`` (the seccomp listener's descriptor number) and waits for ``attached`` before
closing it; a child that cannot confine itself sends ``refused`` and exits. Then, per job:
parent ``run`` -> child ``p``/``l`` (progress, log), ``d`` (a durable call: job.step, job.sleep,
job.wait_for; the parent answers ``dr``) ... ``done``. SIGUSR1 at any time makes
``job.should_stop()`` true. The handler is imported by its module path from the parent's
registry: no code ever travels through the frames or through Redis.
"""

from __future__ import annotations

import importlib
import inspect
import os
import queue
import resource
import signal
import struct
import sys
import threading
from typing import Any, BinaryIO

import msgpack

_HEADER = struct.Struct(">I")


class FrameIO:
    """Length-prefixed msgpack frames over two file objects."""

    def __init__(self, reader: BinaryIO, writer: BinaryIO) -> None:
        self._reader = reader
        self._writer = writer
        self._write_lock = threading.Lock()

    def read(self) -> dict[str, Any] | None:
        header = self._reader.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack(header)
        body = self._reader.read(size)
        frame: dict[str, Any] = msgpack.unpackb(body, raw=False)
        return frame

    def write(self, frame: dict[str, Any]) -> None:
        body = msgpack.packb(frame, use_bin_type=True)
        with self._write_lock:
            self._writer.write(_HEADER.pack(len(body)) + body)
            self._writer.flush()


def _apply_limits(limits: dict[str, Any]) -> None:
    if limits.get("memory_mb"):
        size = int(limits["memory_mb"]) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    if limits.get("open_files"):
        n = int(limits["open_files"])
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def _limit_cpu_for_next_job(cpu_seconds: int | None) -> None:
    """RLIMIT_CPU counts the child's whole life: give each job its own budget from now."""
    if not cpu_seconds:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + int(cpu_seconds)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _load_handler(path: str) -> Any:
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "fn", obj)  # a registered Handler wraps the function


def main() -> None:
    try:
        _serve()
    except BrokenPipeError:
        # The worker is gone (killed, or it stopped reading this child): there is no one left
        # to report to, and a traceback would only land in the worker's log.
        return


def _serve() -> None:
    # Keep the protocol's pipes private: fd 0 becomes /dev/null, fd 1 the same as stderr.
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    frames = FrameIO(proto_in, proto_out)

    config = frames.read()
    if config is None:
        return
    _apply_limits(config.get("limits") or {})
    from panqueue._codec import check_json_compatible
    from panqueue._job import DONE, Job
    from panqueue._options import JobOptions

    policy = config.get("permissions")
    keep = (proto_in.fileno(), proto_out.fileno())
    if policy is not None and not _prepare(policy, frames, keep):
        return
    fn = _load_handler(config["handler"])
    cpu_seconds = (config.get("limits") or {}).get("cpu_seconds")
    if policy is not None:
        _keep_source(config["handler"])
        if not _confine(policy, frames, keep):
            return
        cpu_seconds = None  # the worker sets each job's CPU budget (setrlimit is denied here)
    jobs: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
    answers: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()

    def bridge(op: str, *args: Any) -> Any:
        """A durable call (job.step, job.sleep, job.wait_for): made by the worker, which
        holds the job's lock, over the pipe; its answer (or its error) comes back."""
        if op == "end_step":
            check_json_compatible(args[1], f"step {args[0]!r} result")
        frames.write({"t": "d", "f": op, "a": list(args)})
        value = _durable_result(answers.get())
        return tuple(value) if op == "begin_step" else value  # (found, stored result)
    stop = threading.Event()
    # The worker's shutdown, phase one: SIGUSR1 makes job.should_stop() true.
    signal.signal(signal.SIGUSR1, lambda signum, frame: stop.set())
    frames.write({"t": "ready", "pid": os.getpid()})

    def read_frames() -> None:
        while True:
            frame = frames.read()
            if frame is None:
                jobs.put(None)
                return
            if frame.get("t") == "run":
                jobs.put(frame)
            elif frame.get("t") == "dr":
                answers.put(frame)

    threading.Thread(target=read_frames, daemon=True).start()

    while True:
        frame = jobs.get()
        if frame is None:
            return
        _limit_cpu_for_next_job(cpu_seconds)

        def sink(kind: str, value: Any) -> Any:
            if kind == "p":
                check_json_compatible(value, "progress")
            frames.write({"t": kind, "v": value})
            return DONE

        job = Job(id=frame["id"], queue=frame["queue"], data=frame["data"],
                  attempt=frame["attempt"], options=JobOptions().merged(frame.get("options")),
                  enqueued_at_ms=frame.get("enqueued_at"), sink=sink,
                  should_stop=stop.is_set, bridge=bridge)
        _write_outcome(frames, _run_one(fn, job, check_json_compatible))


def _durable_result(answer: dict[str, Any]) -> Any:
    """A durable call's answer from the worker: its value, or its error raised again."""
    if answer.get("ok"):
        return answer.get("v")
    from panqueue._durable import Suspend
    from panqueue.errors import ConfigError, PanqueueError, PayloadError, SignalTimeout

    kind, message = answer.get("type"), str(answer.get("m", ""))
    if kind == "Suspend":
        raise Suspend("in a child process")
    if kind == "SignalTimeout":
        raise SignalTimeout(str(answer.get("name")))
    if kind in ("ConfigError", "PayloadError"):
        raise (ConfigError if kind == "ConfigError" else PayloadError)(message)
    raise PanqueueError(f"{kind}: {message}")


def _keep_source(path: str) -> None:
    """Read the handler's module into linecache while it is readable: its tracebacks then
    show its lines although the rules deny reading it later."""
    import linecache

    module = sys.modules.get(path.partition(":")[0])
    filename = getattr(module, "__file__", None)
    if filename:
        linecache.getlines(filename)


def _prepare(policy: dict[str, Any], frames: FrameIO, keep: tuple[int, ...]) -> bool:
    """The rules' first layer, before the handler's module is imported (see
    :func:`panqueue._sandbox.confine.prepare`): False, after telling the worker why, when
    they cannot be applied."""
    from panqueue._sandbox.confine import ConfineError, adopt_orphans, prepare

    try:
        adopt_orphans()
        _attach(prepare(policy, keep=keep), frames)
    except ConfineError as exc:
        frames.write({"t": "refused", "why": str(exc)})
        return False
    return True


def _attach(listener: int, frames: FrameIO) -> None:
    """Hand the seccomp listener (if any) to the worker's supervisor, and close it here."""
    from panqueue._sandbox.confine import ConfineError

    if listener < 0:
        return
    frames.write({"t": "listener", "fd": listener, "pid": os.getpid()})
    answer = frames.read()
    os.close(listener)  # a child holding its own listener could approve its own calls
    if answer is None or answer.get("t") != "attached":
        raise ConfineError(f"the worker did not attach its supervisor ({answer!r})")


def _confine(policy: dict[str, Any], frames: FrameIO, keep: tuple[int, ...]) -> bool:
    """Apply the permissions (before any job; the handler is imported already): False, after
    telling the worker why, when they cannot be applied."""
    import asyncio  # noqa: F401 (imported while everything is readable: cheaper later)

    from panqueue._sandbox.confine import ConfineError, confine, install_audit_hook

    try:
        _attach(confine(policy, keep=keep), frames)
        install_audit_hook(policy)
    except ConfineError as exc:
        frames.write({"t": "refused", "why": str(exc)})
        return False
    return True


def _run_one(fn: Any, job: Any, check: Any) -> dict[str, Any]:
    from panqueue._job import ErrorInfo
    from panqueue.errors import Fail, RateLimited, Retry, Snooze

    try:
        if inspect.iscoroutinefunction(fn):
            import asyncio

            result = asyncio.run(fn(job))
        else:
            result = fn(job)
        check(result, "result")
        return {"t": "done", "ok": True, "r": result}
    except BaseException as exc:
        error = ErrorInfo.from_exception(exc).to_wire()
        frame: dict[str, Any] = {"t": "done", "ok": False, "e": error}
        if isinstance(exc, Retry | Fail) and exc.__cause__ is not None:
            # `raise Retry(...) from exc`: the worker records the cause, as for its own.
            frame["cause"] = ErrorInfo.from_exception(exc.__cause__).to_wire()
        if isinstance(exc, Retry):
            frame["retry"] = _wire_number(exc.delay)
        elif isinstance(exc, Fail):
            frame["fail"] = str(exc.reason)
        elif isinstance(exc, Snooze):
            frame["snooze"] = _wire_number(exc.seconds)
        elif isinstance(exc, RateLimited):
            frame["rate_limited"] = _wire_number(exc.retry_after)
        elif isinstance(exc, MemoryError):
            frame["recycle"] = True  # the interpreter may be in a bad state: use a fresh child
        return frame


def _write_outcome(frames: Any, frame: dict[str, Any]) -> None:
    """Send an attempt's outcome. One that cannot be packed (a value no check foresaw) fails
    the attempt with a message naming why, rather than the child and the attempt with it."""
    try:
        frames.write(frame)
    except (TypeError, ValueError, OverflowError) as exc:
        from panqueue._job import ErrorInfo
        from panqueue.errors import PayloadError

        problem = PayloadError(f"the attempt's outcome cannot be sent to the worker: {exc}")
        frames.write({"t": "done", "ok": False,
                      "e": ErrorInfo.from_exception(problem).to_wire()})


def _wire_number(value: Any) -> Any:
    """A signal's number as a frame carries it: a value msgpack cannot carry goes as its repr
    (the worker then records it as unusable, like any bad value)."""
    if value is None or isinstance(value, float | str) or (
            isinstance(value, int) and -(2**63) <= value < 2**64):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)  # out of msgpack's range: the worker names it as too large
        except OverflowError:
            pass
    return repr(value)


if __name__ == "__main__":
    main()
