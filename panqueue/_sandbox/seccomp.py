"""The seccomp filter a sandboxed child installs on itself, through the system's libseccomp.

System calls that could undo or step around the other rules (ptrace, namespaces, mounts, module
loading, a new filter or Landlock layer, raising limits, io_uring, System V IPC, ...) fail with
EPERM, and so do sockets other than IPv4/IPv6 TCP and UDP and socketpair's; those whose
arguments in memory decide (connect, bind, addressed sends, process starts) go to the worker's
supervisor (:mod:`panqueue._sandbox.supervisor`) through seccomp's user notification. A call of
another ABI (int 0x80, x32) kills the process. Also the ctypes binding of libseccomp's
notification calls, which the supervisor uses.

Every system call is named and resolved by libseccomp for this architecture (a name it does not
know here is skipped). A filter whose default is "allow" cannot hold "allow" rules (libseccomp
refuses them), so an allow-list of argument values is written as deny rules covering every
other value (:func:`outside`).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FilterSpec", "Notif", "NotifResp", "install_filter", "library", "syscall_number"]

ACT_ALLOW = 0x7FFF0000
ACT_NOTIFY = 0x7FC00000
ACT_KILL_PROCESS = 0x80000000


def act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


ACT_EPERM = act_errno(errno.EPERM)

_CMP_NE = 1
_CMP_EQ = 4
_CMP_MASKED_EQ = 7
_FLTATR_ACT_BADARCH = 2  # enum scmp_filter_attr
_FLTATR_CTL_OPTIMIZE = 8  # libseccomp >= 2.5

NOTIF_FLAG_CONTINUE = 1  # SECCOMP_USER_NOTIF_FLAG_CONTINUE

# clone(2) flags
CLONE_THREAD = 0x00010000
CLONE_PARENT = 0x00008000
_CLONE_NEW = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
              | 0x40000000)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
MSG_FASTOPEN = 0x20000000
_PR_SET_CHILD_SUBREAPER = 36

# prctl options a handler may use: every PR_GET_* (and PR_CAPBSET_READ), and the harmless sets.
_PRCTL_ALLOWED = frozenset({
    1,   # PR_SET_PDEATHSIG
    2, 3, 5, 7, 9, 11, 13,  # PR_GET_PDEATHSIG, DUMPABLE, UNALIGN, KEEPCAPS, FPEMU, FPEXC, TIMING
    15,  # PR_SET_NAME
    16, 19, 21, 23, 25, 27,  # PR_GET_NAME, ENDIAN, SECCOMP, PR_CAPBSET_READ, GET_TSC, SECUREBITS
    29,  # PR_SET_TIMERSLACK
    38,  # PR_SET_NO_NEW_PRIVS (it is set already, and cannot be unset)
    30, 34, 37,  # PR_GET_TIMERSLACK, PR_MCE_KILL_GET, PR_GET_CHILD_SUBREAPER
    39, 40,  # PR_GET_NO_NEW_PRIVS, PR_GET_TID_ADDRESS
    41,  # PR_SET_THP_DISABLE
    47,  # PR_CAP_AMBIENT (no capability is left to raise; programs clear them at start)
    42, 46, 52,  # PR_GET_THP_DISABLE, PR_GET_FP_MODE, PR_GET_SPECULATION_CTRL
    56, 58,  # PR_GET_TAGGED_ADDR_CTRL, PR_GET_IO_FLUSHER
    0x53564D41,  # PR_SET_VMA (glibc names anonymous mappings)
})
_AF_INET, _AF_INET6 = 2, 10
_SOCK_STREAM, _SOCK_DGRAM = 1, 2
_SOCK_FLAGS = 0o4000 | 0o2000000  # SOCK_NONBLOCK | SOCK_CLOEXEC
_PROTOCOLS = frozenset({0, 6, 17})  # default, IPPROTO_TCP, IPPROTO_UDP (no SCTP, MPTCP, ICMP)
# (level, option): TCP_FASTOPEN_CONNECT, IP_OPTIONS, IPV6_2292RTHDR, IPV6_RTHDR
_SOCKOPTS_DENIED = ((6, 30), (0, 4), (41, 5), (41, 57))

# Calls whose first argument names the process whose scheduling they change.
SCHEDULING_CALLS = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")
_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1
_MFD_NOEXEC_SEAL = 0x0008

# Refused outright: they could undo the rules, reach other processes or the kernel's state.
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "process_madvise", "process_mrelease", "migrate_pages", "move_pages",
    "mount", "umount2", "umount", "pivot_root", "chroot", "unshare", "setns",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "syslog", "acct", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "seccomp",
    "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
    "setrlimit", "settimeofday", "clock_settime", "adjtimex", "clock_adjtime",
    "open_by_handle_at", "name_to_handle_at", "quotactl", "quotactl_fd", "lookup_dcookie",
    "fanotify_init", "mknod", "mknodat", "iopl", "ioperm", "vhangup", "uselib", "nfsservctl",
    "socketcall",  # where it exists, it would step around the socket rules
    # System V IPC and POSIX message queues: named by keys and names outside Landlock, in
    # the host's IPC namespace, open to anyone with the same user id.
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semtimedop", "semtimedop_time64", "semctl", "ipc",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    "mq_timedsend_time64", "mq_timedreceive_time64",
    # A new session or process group would take a process out of the child's group, which
    # the worker kills whole when the child ends: nothing the child starts outlives it.
    "setsid", "setpgid",
)


@dataclass(frozen=True)
class FilterSpec:
    """What the filter lets through. ``run``: programs may be executed (Landlock says which);
    ``processes``: how many live descendants (0: none; more: the supervisor counts);
    ``inet``: IPv4/IPv6 sockets may be made (net or listen grants); ``listen``: TCP listen."""

    run: bool
    processes: int
    inet: bool
    listen: bool
    # A further Landlock layer may still be added (the one that takes the import paths away,
    # after the handler's module is imported under this filter): Landlock only ever narrows
    # what a process may do, so letting its calls through undoes nothing.
    landlock_after: bool = False

    @property
    def supervised(self) -> bool:
        """Whether some rule hands a call to the supervisor (a listener is then returned)."""
        return self.inet or self.listen or self.processes > 0


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class SeccompData(ctypes.Structure):
    _fields_ = [("nr", ctypes.c_int), ("arch", ctypes.c_uint32),
                ("instruction_pointer", ctypes.c_uint64), ("args", ctypes.c_uint64 * 6)]


class Notif(ctypes.Structure):
    """struct seccomp_notif: one call waiting for the supervisor."""

    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("data", SeccompData)]


class NotifResp(ctypes.Structure):
    """struct seccomp_notif_resp: the supervisor's answer (a result, an errno, or CONTINUE)."""

    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32),
                ("flags", ctypes.c_uint32)]


@functools.lru_cache(maxsize=1)
@functools.cache
def library() -> ctypes.CDLL:
    """libseccomp, its functions typed (loaded once). OSError when it is not installed."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_notify_fd.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_version.restype = ctypes.POINTER(ctypes.c_uint * 3)
    lib.seccomp_notify_alloc.argtypes = [ctypes.POINTER(ctypes.POINTER(Notif)),
                                         ctypes.POINTER(ctypes.POINTER(NotifResp))]
    lib.seccomp_notify_free.argtypes = [ctypes.POINTER(Notif), ctypes.POINTER(NotifResp)]
    lib.seccomp_notify_free.restype = None
    lib.seccomp_notify_receive.argtypes = [ctypes.c_int, ctypes.POINTER(Notif)]
    lib.seccomp_notify_respond.argtypes = [ctypes.c_int, ctypes.POINTER(NotifResp)]
    lib.seccomp_notify_id_valid.argtypes = [ctypes.c_int, ctypes.c_uint64]
    return lib


def version() -> tuple[int, int, int]:
    """libseccomp's version."""
    major, minor, micro = library().seccomp_version().contents
    return int(major), int(minor), int(micro)


@functools.cache
def syscall_number(name: str) -> int:
    """This architecture's number for system call ``name``; negative when it has none."""
    return int(library().seccomp_syscall_resolve_name(name.encode()))


def outside(allowed: Iterable[int], care: int = 0xFFFFFFFF) -> list[tuple[int, int]]:
    """(mask, value) pairs such that ``x & mask == value`` for some pair exactly when ``x``,
    looking only at the bits in ``care``, is none of ``allowed``.

    The classes are the subtrees of a binary trie over the ``care`` bits (high to low) that hold
    no allowed value: at most one per bit per allowed value. 32-bit masks also hold for a
    kernel that reads an ``int`` argument from the low half of a 64-bit register.
    """
    bits = [1 << b for b in range(63, -1, -1) if care >> b & 1]
    values = {v & care for v in allowed}
    classes: list[tuple[int, int]] = []

    def split(depth: int, mask: int, value: int, inside: set[int]) -> None:
        if depth == len(bits):
            return
        bit = bits[depth]
        for side in (0, bit):
            branch = {v for v in inside if v & bit == side}
            if branch:
                split(depth + 1, mask | bit, value | side, branch)
            else:
                classes.append((mask | bit, value | side))

    if not values:
        return [(0, 0)]
    split(0, 0, 0, values)
    return classes


class _Rules:
    """A libseccomp filter being built; raises OSError naming the rule libseccomp refused."""

    def __init__(self, default: int) -> None:
        self._lib = library()
        self.ctx = self._lib.seccomp_init(default)
        if not self.ctx:
            raise OSError("libseccomp: seccomp_init failed")

    def add(self, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        number = syscall_number(name)
        if number < 0:
            return  # not a system call of this architecture
        array = (_ArgCmp * max(1, len(cmps)))(*(_ArgCmp(*c) for c in cmps))
        rc = self._lib.seccomp_rule_add_array(self.ctx, action, number, len(cmps), array)
        if rc < 0:
            code = errno.errorcode.get(-rc, str(rc))
            raise OSError(-rc, f"libseccomp refused the rule for {name}: {code}")

    def add_outside(self, action: int, name: str, arg: int, allowed: Iterable[int],
                    care: int = 0xFFFFFFFF) -> None:
        """``action`` when argument ``arg`` is none of ``allowed``."""
        for mask, value in outside(allowed, care):
            self.add(action, name, (arg, _CMP_MASKED_EQ, mask, value))

    def release(self) -> None:
        self._lib.seccomp_release(self.ctx)


def _rules(spec: FilterSpec) -> _Rules:
    rules = _Rules(ACT_ALLOW)
    try:
        for name in DENIED:
            if not (spec.landlock_after and name.startswith("landlock_")):
                rules.add(ACT_EPERM, name)
        # prlimit64(pid, resource, new, old): reading is fine, setting is not.
        rules.add(ACT_EPERM, "prlimit64", (2, _CMP_NE, 0, 0))
        # personality(0xffffffff) only reads the persona.
        rules.add(ACT_EPERM, "personality", (0, _CMP_NE, 0xFFFFFFFF, 0))
        rules.add_outside(ACT_EPERM, "prctl", 0, _PRCTL_ALLOWED)
        # clone3's flags are in memory the filter cannot read: glibc falls back to clone.
        rules.add(act_errno(errno.ENOSYS), "clone3")
        # No new namespace; no sibling process (CLONE_PARENT: outside the counted tree).
        flags_arg = _clone_flags_arg()
        for flag in _bits(_CLONE_NEW | CLONE_PARENT):
            rules.add(ACT_EPERM, "clone", (flags_arg, _CMP_MASKED_EQ, flag, flag))
        process_action = ACT_NOTIFY if spec.processes > 0 else ACT_EPERM
        rules.add(process_action, "clone",
                  (flags_arg, _CMP_MASKED_EQ, CLONE_THREAD | _CLONE_NEW | CLONE_PARENT, 0))
        rules.add(process_action, "fork")
        rules.add(process_action, "vfork")
        if not spec.run:
            rules.add(ACT_EPERM, "execve")
            rules.add(ACT_EPERM, "execveat")
        else:
            # A memory file is on no path a Landlock rule names, so Landlock lets it execute:
            # one may be made only sealed against execution.
            rules.add(ACT_EPERM, "memfd_create",
                      (1, _CMP_MASKED_EQ, _MFD_NOEXEC_SEAL, 0))
        _scheduling_rules(rules, spec)
        _socket_rules(rules, spec)
    except BaseException:
        rules.release()
        raise
    return rules


def _scheduling_rules(rules: _Rules, spec: FilterSpec) -> None:
    # Calls that change another process's priority, CPU affinity or scheduling (the worker's,
    # another child's: same user, so the kernel lets them) name it by a pid in a register.
    # This process (0 or its pid) may; for any other pid the supervisor lets the child's own
    # threads and processes through, or, without a supervisor, no other.
    others = ACT_NOTIFY if spec.supervised else ACT_EPERM
    own = (0, os.getpid())
    for name in SCHEDULING_CALLS:
        rules.add_outside(others, name, 0, own)
    # setpriority and ioprio_set: only a process (not a process group, not every process of
    # the user), named in their second argument.
    for name, process in (("setpriority", _PRIO_PROCESS), ("ioprio_set", _IOPRIO_WHO_PROCESS)):
        rules.add_outside(ACT_EPERM, name, 0, (process,))
        for mask, value in outside(own):
            rules.add(others, name, (0, _CMP_MASKED_EQ, 0xFFFFFFFF, process),
                      (1, _CMP_MASKED_EQ, mask, value))


def _socket_rules(rules: _Rules, spec: FilterSpec) -> None:
    # Pathname unix sockets are outside Landlock (and abstract ones are scoped): no AF_UNIX
    # socket but socketpair's; no other family but IPv4/IPv6 TCP and UDP, and those only with
    # a grant.
    families = (_AF_INET, _AF_INET6) if spec.inet or spec.listen else ()
    rules.add_outside(ACT_EPERM, "socket", 0, families)
    if families:
        rules.add_outside(ACT_EPERM, "socket", 1, (_SOCK_STREAM, _SOCK_DGRAM),
                          care=0xFFFFFFFF & ~_SOCK_FLAGS)
        rules.add_outside(ACT_EPERM, "socket", 2, _PROTOCOLS)
    if not spec.listen:
        rules.add(ACT_EPERM, "listen")
    # Socket options that send packets elsewhere than the checked address: TCP fast open
    # (connects from a send, to the send's address) and source routes (IPv4 options, IPv6
    # routing headers: the packet goes to the route's first hop).
    for level, option in _SOCKOPTS_DENIED:
        rules.add(ACT_EPERM, "setsockopt", (1, _CMP_MASKED_EQ, 0xFFFFFFFF, level),
                  (2, _CMP_MASKED_EQ, 0xFFFFFFFF, option))
    if spec.supervised:
        # The supervisor checks the address and performs the call on a copy of the socket (a
        # TCP fast open send it refuses, naming the address it would have connected to).
        rules.add(ACT_NOTIFY, "connect")
        rules.add(ACT_NOTIFY, "bind")
        rules.add(ACT_NOTIFY, "sendto", (4, _CMP_NE, 0, 0))
        rules.add(ACT_EPERM, "sendto", (3, _CMP_MASKED_EQ, MSG_FASTOPEN, MSG_FASTOPEN),
                  (4, _CMP_EQ, 0, 0))
        rules.add(ACT_NOTIFY, "sendmsg")
        rules.add(ACT_NOTIFY, "sendmmsg")
    else:
        # No inet socket can exist, but a socketpair's unix socket could bind an abstract name
        # or send to a pathname socket of the host, and no one could read the address.
        for name in ("connect", "bind", "sendmsg", "sendmmsg"):
            rules.add(ACT_EPERM, name)
        rules.add(ACT_EPERM, "sendto", (4, _CMP_NE, 0, 0))
        rules.add(ACT_EPERM, "sendto", (3, _CMP_MASKED_EQ, MSG_FASTOPEN, MSG_FASTOPEN))


def _clone_flags_arg() -> int:
    """clone's flags are its first argument, but its second on s390."""
    lib = library()
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    return 1 if lib.seccomp_arch_native() in (0x00000016, 0x80000016) else 0  # S390, S390X


def _bits(flags: int) -> list[int]:
    return [1 << b for b in range(64) if flags >> b & 1]


def install_filter(spec: FilterSpec) -> int:
    """Install the filter on this (single-threaded, no_new_privs) process, for good.

    Returns the listener's descriptor, for the worker's supervisor to copy (the child must then
    close it), or -1 when ``spec`` hands nothing to a supervisor. With ``processes`` > 0 this
    process becomes its descendants' subreaper first, so an orphaned grandchild still counts.
    """
    rules = _rules(spec)
    try:
        lib = library()
        lib.seccomp_attr_set(rules.ctx, _FLTATR_CTL_OPTIMIZE, 2)  # binary tree; best effort
        # A call of another ABI (int 0x80, x32) kills the whole process, not only its thread:
        # a handler's thread killed alone would leave the child hanging.
        rc = lib.seccomp_attr_set(rules.ctx, _FLTATR_ACT_BADARCH, ACT_KILL_PROCESS)
        if rc < 0:
            raise OSError(-rc, "libseccomp cannot kill the process on a foreign ABI")
        if spec.processes > 0:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"prctl(PR_SET_CHILD_SUBREAPER): {errno.errorcode.get(code)}")
        rc = lib.seccomp_load(rules.ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load failed: {errno.errorcode.get(-rc, rc)}")
        if not spec.supervised:
            return -1
        fd = int(lib.seccomp_notify_fd(rules.ctx))
        if fd < 0:
            raise OSError(-fd, "seccomp_notify_fd: the filter has no listener")
        return fd
    finally:
        rules.release()
