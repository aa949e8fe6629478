"""What this host can enforce of :class:`panqueue.Permissions`, asked of the kernel itself.

:func:`support` looks once per process: the platform, the Landlock ABI (6 or later: file
rules, TCP port rules, signal and abstract-socket scoping), libseccomp (2.5 or later, for user
notification), seccomp's user notification, ``pidfd_getfd``, and panqueue's own sandbox
modules. :meth:`Support.missing` names, one line each, what a given set of permissions needs
and this host lacks. Importable everywhere: off Linux everything is missing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib
import os
import platform
from dataclasses import dataclass

from panqueue._permissions import Permissions
from panqueue._sandbox import landlock

__all__ = ["REQUIRED_LANDLOCK_ABI", "Support", "support"]

REQUIRED_LANDLOCK_ABI = 6


@dataclass(frozen=True, slots=True)
class Support:
    """What this host offers; each ``*_problem`` is "" when that piece works, else why not."""

    linux: bool
    landlock_abi: int
    landlock_problem: str = ""
    seccomp_problem: str = ""
    notify_problem: str = ""
    pidfd_problem: str = ""
    modules_problem: str = ""
    supervisor_problem: str = ""

    def missing(self, permissions: Permissions | None = None) -> list[str]:
        """What ``permissions`` need that this host lacks (empty: all enforced)."""
        if not self.linux:
            return ["not Linux (the rules are Landlock and seccomp, Linux kernel features)"]
        lines = []
        if self.landlock_abi < REQUIRED_LANDLOCK_ABI:
            lines.append(self.landlock_problem or
                         f"Landlock ABI {self.landlock_abi} < {REQUIRED_LANDLOCK_ABI} "
                         "(TCP port rules need 4, signal and abstract-socket scoping 6)")
        for problem in (self.seccomp_problem, self.modules_problem):
            if problem:
                lines.append(problem)
        if permissions is None or permissions.net or permissions.listen \
                or permissions.processes:
            for problem in (self.notify_problem, self.pidfd_problem, self.supervisor_problem):
                if problem:
                    lines.append(problem)
        return lines


def _seccomp_problem() -> str:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return "libseccomp is not installed (libseccomp.so.2)"
    try:
        lib.seccomp_version.restype = ctypes.POINTER(ctypes.c_uint * 3)
        version = tuple(lib.seccomp_version().contents)
    except (AttributeError, ValueError):
        return "libseccomp is older than 2.5 (no seccomp_version)"
    if version < (2, 5, 0):
        return f"libseccomp {'.'.join(map(str, version))} < 2.5 (user notification)"
    return ""


def _notify_problem() -> str:
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as file:
            actions = file.read().split()
    except OSError:
        return "seccomp is not available (no /proc/sys/kernel/seccomp/actions_avail)"
    if "user_notif" not in actions:
        return "seccomp user notification is not available (kernel < 5.0)"
    return ""


def _pidfd_problem() -> str:
    from panqueue._sandbox.reach import pidfd_getfd

    try:
        pidfd = os.pidfd_open(os.getpid())
    except OSError as exc:
        return f"pidfd_open is not available ({exc.strerror})"
    try:
        os.close(pidfd_getfd(pidfd, 0))
        return ""
    except OSError as exc:
        return f"pidfd_getfd is not available ({exc.strerror})"
    finally:
        os.close(pidfd)


def _module_problem(*names: str) -> str:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return f"{name} is not available ({exc})"
    return ""


@functools.cache
def support() -> Support:
    """This host's :class:`Support` (looked up once per process)."""
    if platform.system() != "Linux":
        return Support(linux=False, landlock_abi=0, landlock_problem="not Linux")
    abi, why = landlock.abi_version()
    return Support(
        linux=True, landlock_abi=abi,
        landlock_problem=why or ("" if abi >= REQUIRED_LANDLOCK_ABI else
                                 f"Landlock ABI {abi} < {REQUIRED_LANDLOCK_ABI} (signal and "
                                 "abstract-socket scoping)"),
        seccomp_problem=_seccomp_problem(),
        notify_problem=_notify_problem(),
        pidfd_problem=_pidfd_problem(),
        modules_problem=_module_problem("panqueue._sandbox.seccomp", "panqueue._sandbox.net"),
        supervisor_problem=_module_problem("panqueue._sandbox.supervisor"),
    )
