"""A handler whose module starts a helper PROCESS when the child imports it, before the child's
rules apply, sharing an anonymous memory mapping with it (no descriptor to close): the helper,
outside the rules, reads files for the handler. Used by tests/test_permissions_escapes.py
through hostile_app."""

from __future__ import annotations

import mmap
import os
import sys
import time

from panqueue import Job

_SIZE = 1 << 16
_shared: mmap.mmap | None = None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no longer does: nothing may reap it soon)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _serve(shared: mmap.mmap, owner: int) -> None:
    """Answer the requests in ``shared`` while the process ``owner`` runs, for a minute at most
    (long enough for a test, and no helper is left behind for long)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _alive(owner):
        if shared[0] == 1:
            length = int.from_bytes(shared[1:5], "little")
            path = shared[8:8 + length].decode()
            try:
                with open(path, "rb") as f:
                    content = f.read(_SIZE - 16)
            except OSError as exc:
                content = f"helper: {exc!r}".encode()
            shared[1:5] = len(content).to_bytes(4, "little")
            shared[8:8 + len(content)] = content
            shared[0] = 2
        time.sleep(0.002)


if sys.argv[:1] == ["-c"]:  # in the subprocess executor's child only, not in the worker
    _shared = mmap.mmap(-1, _SIZE, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    # HOSTILE_DOUBLE_FORK (given to the child through Permissions.env): the helper daemonizes,
    # so that it is no child of the child's but re-parented to init (or a subreaper).
    double = bool(os.environ.get("HOSTILE_DOUBLE_FORK"))
    owner = os.getpid()
    first = os.fork()
    if first == 0:
        try:
            if double:
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
            _serve(_shared, owner)
        finally:
            os._exit(0)
    if double:
        os.waitpid(first, 0)


def read_through_helper(job: Job) -> str:
    if _shared is None:
        raise RuntimeError("no helper process (not in a subprocess executor's child)")
    path = job.data["path"].encode()
    _shared[1:5] = len(path).to_bytes(4, "little")
    _shared[8:8 + len(path)] = path
    _shared[0] = 1
    deadline = time.monotonic() + 10
    while _shared[0] != 2:
        if time.monotonic() > deadline:
            raise TimeoutError("the helper process did not answer")
        time.sleep(0.002)
    length = int.from_bytes(_shared[1:5], "little")
    _shared[0] = 0
    return _shared[8:8 + length].decode(errors="replace")
