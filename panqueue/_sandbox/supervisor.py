"""The worker's supervisor of sandboxed children: it decides the calls their filters hand over.

One daemon thread per worker process polls the seccomp listeners of every attached child,
receives each call handed over, and answers it with what the deciding module decides: a
connect, a bind or an addressed send by :mod:`~panqueue._sandbox.sockets` (performed by the
supervisor on a copy of the child's socket, with the address and data it read), a process start
or a change of scheduling by :mod:`~panqueue._sandbox.processes` (allowed to continue in the
child, or refused). What it holds of each child, and how it reaches into the child's processes:
:mod:`~panqueue._sandbox.reach`.

The thread never blocks on a child: a blocking socket's connect or send that would wait is
performed non-blocking and its answer sent when the socket is ready. It never dies either: an
unexpected error is logged at WARNING, the call is refused, and the loop goes on.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import select
import threading
from typing import Any

from panqueue._log import get_logger
from panqueue._sandbox import seccomp
from panqueue._sandbox.net import NetPolicy
from panqueue._sandbox.processes import process_start, scheduling_call, scheduling_calls
from panqueue._sandbox.reach import (
    Child,
    Process,
    Refuse,
    Reply,
    Waiting,
    close,
    pidfd_getfd,
)
from panqueue._sandbox.sockets import Sockets

__all__ = ["Supervisor", "supervisor"]

_log = get_logger("panqueue.sandbox")

_GONE_KEPT = 256


class Supervisor:
    """Decides the calls the filters of attached children hand over. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: dict[int, Child] = {}
        self._gone: collections.OrderedDict[int, list[str]] = collections.OrderedDict()
        self._sockets = Sockets()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread: threading.Thread | None = None
        self._numbers = {name: seccomp.syscall_number(name) for name in
                         ("connect", "bind", "sendto", "sendmsg", "sendmmsg", "clone", "fork",
                          "vfork")}
        # number -> (what it changes, the argument naming the process)
        self._scheduling = scheduling_calls()
        self._notif: Any = None
        self._resp: Any = None

    # -- the worker's side ------------------------------------------------------------------

    def attach(self, pid: int, child_fd: int, policy: NetPolicy, processes: int) -> None:
        """Take over child ``pid``'s listener (its descriptor ``child_fd``): from now on its
        handed-over calls are decided here. The child must close its own copy afterwards."""
        pidfd = os.pidfd_open(pid)
        opened = [pidfd]
        try:
            listener = pidfd_getfd(pidfd, child_fd)
            opened.append(listener)
            if "seccomp" not in os.readlink(f"/proc/self/fd/{listener}"):
                raise OSError(errno.EINVAL, f"descriptor {child_fd} of process {pid} is not "
                                            "a seccomp listener")
            mem = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        except BaseException:
            for fd in opened:
                close(fd)
            raise
        child = Child(pid, Process(pid, pidfd, mem), listener, policy, processes)
        with self._lock:
            try:
                self._start()
            except BaseException:
                child.close()
                raise
            old = self._children.pop(pid, None)
            if old is not None:
                self._forget(old)
            self._children[pid] = child
            self._gone.pop(pid, None)
        self._wake()

    def detach(self, pid: int) -> None:
        """Child ``pid`` is gone (or to be released): close everything held for it. Its
        denials stay readable for a while."""
        with self._lock:
            child = self._children.pop(pid, None)
            if child is not None:
                self._forget(child)
                self._gone[pid] = list(child.denials)
                while len(self._gone) > _GONE_KEPT:
                    self._gone.popitem(last=False)
        self._wake()

    def denials(self, pid: int) -> list[str]:
        """What was denied to child ``pid``, in order (the first hundred; the list only grows
        while the child is attached, and stays readable a while after :meth:`detach`)."""
        with self._lock:
            child = self._children.get(pid)
            if child is not None:
                return list(child.denials)
            return list(self._gone.get(pid, ()))

    def attached(self) -> list[int]:
        with self._lock:
            return list(self._children)

    def _forget(self, child: Child) -> None:
        self._sockets.forget(child)
        child.close()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass

    def _start(self) -> None:
        if self._notif is None:
            notif = ctypes.POINTER(seccomp.Notif)()
            resp = ctypes.POINTER(seccomp.NotifResp)()
            rc = seccomp.library().seccomp_notify_alloc(ctypes.byref(notif), ctypes.byref(resp))
            if rc != 0:
                raise OSError(-rc, "libseccomp cannot allocate notifications")
            self._notif, self._resp = notif, resp
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="panqueue-sandbox-supervisor",
                                            daemon=True)
            self._thread.start()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception as exc:  # never let the thread die: the children would hang
                _log.warning("sandbox supervisor error", error=f"{type(exc).__name__}: {exc}")

    def _turn(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        with self._lock:
            for child in self._children.values():
                if child.listening:
                    poller.register(child.listener, select.POLLIN)
            for sock in self._sockets.waiting:
                poller.register(sock, select.POLLOUT)
        ready = poller.poll()
        with self._lock:
            for fd, events in ready:
                if fd == self._wake_r:
                    try:
                        while os.read(self._wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                waiting = self._sockets.waiting.pop(fd, None)
                if waiting is not None:
                    self._resume(waiting)
                    continue
                found = next((c for c in self._children.values() if c.listener == fd), None)
                if found is None or not found.listening:
                    continue  # detached meanwhile
                if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) \
                        and not events & select.POLLIN:
                    found.listening = False  # every process of the child has exited
                    continue
                self._receive(found)

    def _receive(self, child: Child) -> None:
        # Look again, without waiting: a receive with nothing pending would block the thread.
        again = select.poll()
        again.register(child.listener, select.POLLIN)
        if not any(events & select.POLLIN for _, events in again.poll(0)):
            return
        lib = seccomp.library()
        ctypes.memset(self._notif, 0, ctypes.sizeof(seccomp.Notif))  # the kernel insists
        if lib.seccomp_notify_receive(child.listener, self._notif) != 0:
            return  # the calling thread was interrupted or died meanwhile
        request = self._notif.contents
        notif_id, tid, nr = int(request.id), int(request.pid), int(request.data.nr)
        args = [int(a) for a in request.data.args]
        try:
            reply = self._decide(child, notif_id, tid, nr, args)
        except Refuse as refusal:
            child.deny(refusal.denial)
            reply = Reply(error=-refusal.code)
        except Exception as exc:
            _log.warning("sandbox supervisor refused a call it could not decide", pid=child.pid,
                         syscall=nr, error=f"{type(exc).__name__}: {exc}")
            reply = Reply(error=-errno.EPERM)
        if reply is not None:
            self._respond(child, notif_id, reply)

    def _respond(self, child: Child, notif_id: int, reply: Reply) -> None:
        resp = self._resp.contents
        resp.id, resp.val, resp.error, resp.flags = notif_id, reply.val, reply.error, reply.flags
        # Fails when the calling thread was interrupted or died meanwhile: nothing to answer.
        seccomp.library().seccomp_notify_respond(child.listener, self._resp)

    def _resume(self, waiting: Waiting) -> None:
        try:
            reply = waiting.retry()
        except Refuse as refusal:
            reply = Reply(error=-refusal.code)
        except Exception as exc:
            _log.warning("sandbox supervisor error", pid=waiting.child.pid,
                         error=f"{type(exc).__name__}: {exc}")
            reply = Reply(error=-errno.EPERM)
        if reply is None:
            self._sockets.waiting[waiting.sock] = waiting
            return
        close(waiting.sock)
        self._respond(waiting.child, waiting.notif_id, reply)

    # -- deciding -------------------------------------------------------------------------------

    def _decide(self, child: Child, notif_id: int, tid: int, nr: int,
                args: list[int]) -> Reply | None:
        numbers = self._numbers
        if nr in (numbers["clone"], numbers["fork"], numbers["vfork"]):
            return process_start(child, tid)
        if nr in self._scheduling:
            return scheduling_call(child, self._scheduling[nr], args)
        process = child.process(tid, notif_id)
        sockets = self._sockets
        if nr == numbers["connect"]:
            return sockets.connect(child, process, notif_id, args)
        if nr == numbers["bind"]:
            return sockets.bind(child, process, notif_id, args)
        if nr == numbers["sendto"]:
            return sockets.sendto(child, process, notif_id, args)
        if nr == numbers["sendmsg"]:
            return sockets.sendmsg(child, process, notif_id, args)
        if nr == numbers["sendmmsg"]:
            return sockets.sendmmsg(child, process, notif_id, args)
        _log.warning("sandbox supervisor got a call it does not handle", pid=child.pid,
                     syscall=nr)
        raise Refuse(errno.EPERM)


_instance: Supervisor | None = None
_instance_lock = threading.Lock()


def supervisor() -> Supervisor:
    """This process's supervisor (its thread starts with the first attach)."""
    global _instance
    with _instance_lock:
        if _instance is None:
            _instance = Supervisor()
        return _instance


def _after_fork() -> None:
    global _instance, _instance_lock
    # Its thread did not survive the fork: a forked process starts afresh.
    _instance, _instance_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
