"""Landlock through its three system calls (ctypes): the ABI this kernel offers, and a ruleset
of path and TCP port rules applied to the calling thread (and everything it starts later).

Only the rights the running ABI knows are handled (asking for more fails with EINVAL); a right
that is handled and not granted by a rule is denied. Rules on a file (rather than a directory)
carry only the rights that apply to files.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterable

__all__ = [
    "FS_READ",
    "FS_WRITE",
    "Ruleset",
    "abi_version",
]

# Same numbers on x86_64 and aarch64 (syscalls added after 424 share one table).
_SYSCALLS = {
    "x86_64": (444, 445, 446),
    "aarch64": (444, 445, 446),
    "arm64": (444, 445, 446),
}
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2

ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13  # ABI 2
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5

ACCESS_NET_BIND_TCP = 1 << 0  # ABI 4
ACCESS_NET_CONNECT_TCP = 1 << 1

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

# Every filesystem right of each ABI (index = ABI version).
_FS_BY_ABI = [0, (1 << 13) - 1, (1 << 14) - 1, (1 << 15) - 1, (1 << 15) - 1, (1 << 16) - 1,
              (1 << 16) - 1, (1 << 16) - 1]
# Rights that mean something on a file (a rule on a file may carry only these).
_FILE_RIGHTS = (ACCESS_FS_EXECUTE | ACCESS_FS_WRITE_FILE | ACCESS_FS_READ_FILE
                | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV)

FS_READ = ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR
FS_EXECUTE = ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE
FS_WRITE = (FS_READ | ACCESS_FS_WRITE_FILE | ACCESS_FS_TRUNCATE | ACCESS_FS_REMOVE_FILE
            | ACCESS_FS_REMOVE_DIR | ACCESS_FS_MAKE_REG | ACCESS_FS_MAKE_DIR
            | ACCESS_FS_MAKE_SYM | ACCESS_FS_REFER)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_libc: ctypes.CDLL | None = None


def _syscall(index: int, *args: object) -> int:
    global _libc
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(errno.ENOSYS, f"Landlock is not known on {platform.machine()}")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    result: int = _libc.syscall(ctypes.c_long(numbers[index]), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def abi_version() -> tuple[int, str]:
    """The Landlock ABI of this kernel, and why it is 0 when it is ("not Linux", "disabled at
    boot", "not in this kernel")."""
    if platform.system() != "Linux":
        return 0, "not Linux"
    try:
        return _syscall(0, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)), ""
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            return 0, "Landlock is disabled (not in the kernel's lsm= list)"
        if exc.errno == errno.ENOSYS:
            return 0, "Landlock is not available (ENOSYS)"
        return 0, f"Landlock is not available ({exc})"


class Ruleset:
    """A Landlock ruleset being built: handle every right of ``abi``, add rules, apply."""

    def __init__(self, abi: int, *, net: bool = True, scoped: bool = True) -> None:
        self.abi = abi
        self.fs = _FS_BY_ABI[min(abi, len(_FS_BY_ABI) - 1)]
        self.net = ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP if net and abi >= 4 else 0
        self.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if scoped and abi >= 6 else 0
        attr = _RulesetAttr(self.fs, self.net, self.scoped)
        # Older kernels accept the larger struct as long as the fields they lack are zero.
        self.fd = _syscall(0, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                           ctypes.c_uint32(0))

    def allow_path(self, path: str, access: int) -> bool:
        """Grant ``access`` beneath ``path`` (a directory, or the file itself); False when the
        path does not exist (nothing to grant)."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return False
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                access &= _FILE_RIGHTS
            access &= self.fs
            if not access:
                return False
            attr = _PathBeneathAttr(access, fd)
            _syscall(1, self.fd, _RULE_PATH_BENEATH, ctypes.byref(attr), ctypes.c_uint32(0))
            return True
        finally:
            os.close(fd)

    def allow_paths(self, paths: Iterable[str], access: int) -> None:
        for path in paths:
            self.allow_path(path, access)

    def allow_port(self, port: int, access: int) -> None:
        access &= self.net
        if access:
            attr = _NetPortAttr(access, port)
            _syscall(1, self.fd, _RULE_NET_PORT, ctypes.byref(attr), ctypes.c_uint32(0))

    def restrict_self(self) -> None:
        """Apply the ruleset to the calling thread (no_new_privs must be set already)."""
        try:
            _syscall(2, self.fd, ctypes.c_uint32(0))
        finally:
            os.close(self.fd)
