"""The supervisor's decisions on process starts (clone, fork, vfork) and on changes to a
process's scheduling: a child may start processes up to its ``processes`` grant, counted in
``/proc``, and change the scheduling of its own processes and threads only.

Both calls continue in the child when allowed: their other arguments are registers the filter
already checked, so nothing read from the child's memory is at stake.
"""

from __future__ import annotations

import errno
import os
import time

from panqueue._sandbox import seccomp
from panqueue._sandbox.reach import Child, Refuse, Reply, int32, tgid

__all__ = ["process_start", "scheduling_call", "scheduling_calls"]

_IN_FLIGHT = 1.0  # seconds a continued fork counts before /proc shows its process


def scheduling_calls() -> dict[int, tuple[str, int]]:
    """The calls that change a process's scheduling, by number: (what they change, the
    argument naming the process). Those this system's libseccomp does not know are left out."""
    return {
        seccomp.syscall_number(name): (what, arg) for name, what, arg in (
            ("sched_setaffinity", "CPU affinity", 0), ("sched_setscheduler", "scheduling", 0),
            ("sched_setparam", "scheduling", 0), ("sched_setattr", "scheduling", 0),
            ("setpriority", "priority", 1), ("ioprio_set", "I/O priority", 1))
        if seccomp.syscall_number(name) >= 0}


def process_start(child: Child, tid: int) -> Reply:
    live = _descendants(child.pid)
    now = time.monotonic()
    # A start let through a moment ago may not show in /proc yet: it counts until its
    # thread asks again (its clone has returned by then), a new process shows, or a
    # second has gone by; so two threads' quick starts are not both let through on the
    # same count.
    in_flight = child.in_flight
    in_flight.pop(tid, None)
    for caller, until in sorted(in_flight.items(), key=lambda item: item[1]):
        if until <= now:
            del in_flight[caller]
    for caller in sorted(in_flight, key=in_flight.__getitem__)[:len(live - child.known)]:
        del in_flight[caller]
    child.known = live
    if len(live) + len(in_flight) >= child.processes:
        raise Refuse(errno.EAGAIN, f"start a process (processes={child.processes})")
    in_flight[tid] = now + _IN_FLIGHT
    return Reply(flags=seccomp.NOTIF_FLAG_CONTINUE)


def scheduling_call(child: Child, call: tuple[str, int], args: list[int]) -> Reply:
    """A change to the scheduling of a process named by pid: the child's own processes and
    threads may be changed (the pid is a register: the call continues), no other."""
    what, arg = call
    target = int32(args[arg])
    try:
        group = tgid(target) if target > 0 else -1
    except Refuse:
        raise Refuse(errno.ESRCH) from None
    if group == child.pid or group in _descendants(child.pid):
        return Reply(flags=seccomp.NOTIF_FLAG_CONTINUE)
    raise Refuse(errno.EPERM, f"change the {what} of process {target} (not one of its own)")


def _descendants(root: int) -> set[int]:
    """The processes (zombies included) that descend from ``root``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                stat = file.read()
            parent = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        below = children.get(todo.pop(), [])
        found.update(below)
        todo.extend(below)
    return found
