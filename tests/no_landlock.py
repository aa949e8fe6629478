"""Run a command on a kernel that seems to have no Landlock:

    python tests/no_landlock.py PROGRAM [ARG]...

installs a seccomp filter that makes the three Landlock system calls fail with ENOSYS (what a
kernel built without Landlock answers), then execs PROGRAM. The filter is inherited by
everything PROGRAM starts, so a worker, its children and ``panqueue check-permissions`` all
see a host without Landlock: a real route to the "not enforced" paths, without pretending in
panqueue's own code. Uses the system's libseccomp through ctypes; Linux only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO_BASE = 0x00050000
LANDLOCK_CALLS = ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self")


def install() -> None:
    """The filter, on this process and whatever it execs or forks from now on."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.c_void_p]
    lib.seccomp_load.restype = ctypes.c_int
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        for call in LANDLOCK_CALLS:
            number = lib.seccomp_syscall_resolve_name(call.encode())
            if number < 0:
                raise OSError(f"libseccomp does not know {call}")
            rc = lib.seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO_BASE | errno.ENOSYS, number,
                                            0, None)
            if rc < 0:
                raise OSError(-rc, f"seccomp_rule_add({call}): {os.strerror(-rc)}")
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")
    finally:
        lib.seccomp_release(ctx)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: no_landlock.py PROGRAM [ARG]...")
    install()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
