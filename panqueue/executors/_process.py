"""A child process of the subprocess executor, as the worker holds it: its frames, its stop
request and its end (SIGTERM, then SIGKILL; with its process group when confined), a confined
child's stderr relayed to the worker's and its CPU time. What runs in the child is ``_child.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import sys
from typing import Any

import anyio
import anyio.abc
import msgpack
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ["MAX_FRAME", "TERM_GRACE", "Child", "FrameRefused", "cpu_used", "relay_stderr"]

_HEADER = struct.Struct(">I")

# The largest frame the worker takes from a child: a result, a progress report, an error with
# its traceback, a durable step's value (each bounded by max_payload_bytes, 1 MiB by default)
# fit in it many times over. A child may run hostile code: what it announces is not buffered
# past this, and a frame that is not msgpack is refused too.
MAX_FRAME = 64 * 1024 * 1024


class FrameRefused(Exception):
    """The child broke the protocol (a frame too large, or not msgpack): it is killed, and the
    attempt fails naming why."""
# Seconds a child gets between SIGTERM and SIGKILL when it has to go.
TERM_GRACE = 1.0


def relay_stderr(fd: int) -> None:
    """Copy a confined child's stderr to the worker's until the child closes it."""
    try:
        while chunk := os.read(fd, 65536):
            stream = sys.stderr
            try:
                buffer = getattr(stream, "buffer", None)
                if buffer is not None:
                    buffer.write(chunk)
                else:
                    stream.write(chunk.decode(errors="replace"))
                stream.flush()
            except (OSError, ValueError):
                pass  # the worker's stderr is closed: keep draining so the child never blocks
    except OSError:
        pass
    finally:
        os.close(fd)


def cpu_used(pid: int) -> int:
    """Whole CPU seconds process ``pid`` has used (/proc/<pid>/stat utime + stime)."""
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) // os.sysconf("SC_CLK_TCK")


class Child:
    """One child process and the pipes the worker speaks to it through (length-prefixed
    msgpack frames, the protocol of ``_child.py``)."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        assert process.stdout is not None and process.stdin is not None
        self._reader = BufferedByteReceiveStream(process.stdout)
        self._writer = process.stdin
        self.jobs = 0
        self.supervised = False  # attached to the worker's supervisor: detach when it ends
        # Confined: the child leads a process group that nothing it starts may leave (its
        # filter refuses setsid and setpgid), killed whole when the child ends.
        self.group = False
        self.denied = 0  # the supervisor's denials of this child reported so far

    async def send(self, frame: dict[str, Any]) -> None:
        body = msgpack.packb(frame, use_bin_type=True)
        await self._writer.send(_HEADER.pack(len(body)) + body)

    async def receive(self) -> dict[str, Any]:
        (size,) = _HEADER.unpack(await self._reader.receive_exactly(_HEADER.size))
        if size > MAX_FRAME:
            raise FrameRefused(f"the child announced a frame of {size:,} bytes, over the "
                               f"worker's limit of {MAX_FRAME:,}")
        body = await self._reader.receive_exactly(size)
        try:
            frame = msgpack.unpackb(body, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise FrameRefused(f"the child sent a frame that is not msgpack ({exc})") from None
        if not isinstance(frame, dict):
            raise FrameRefused(f"the child sent a frame that is not a map ({type(frame).__name__})")
        return frame

    def request_stop(self) -> None:
        """Make ``job.should_stop()`` true in the child (SIGUSR1: synchronous, no frame)."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGUSR1)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def terminate(self) -> None:
        """SIGTERM, then SIGKILL after a short grace; always reaps the process."""
        with anyio.CancelScope(shield=True):
            if self.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self.process.terminate()
                with anyio.move_on_after(TERM_GRACE):
                    await self.process.wait()
                if self.process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        self.process.kill()
                    await self.process.wait()
            if self.group:
                # What the child started, detached or not, ends with it: no process goes on
                # with the queue's grants after the worker replaced the child.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.aclose()
            if self.supervised:
                self.supervised = False
                from panqueue._sandbox.supervisor import supervisor

                supervisor().detach(self.process.pid)

    def new_denials(self) -> list[str]:
        """What the supervisor denied this child since the last call."""
        if not self.supervised:
            return []
        from panqueue._sandbox.supervisor import supervisor

        denials = supervisor().denials(self.process.pid)
        fresh, self.denied = denials[self.denied:], len(denials)
        return fresh
