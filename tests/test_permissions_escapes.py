"""A sandboxed handler cannot get out (issue 24): each test has the hostile handler of
tests/apps/hostile_app.py try one way out of its grants, through one real ``panqueue worker``
process and a real server, and checks that the attempt failed with the kernel's refusal inside the
handler and that nothing got through (no contents returned, nothing changed on disk, no connection
reached the listener, no signal arrived). The allowed side is checked too: what is granted works.

The grants: read ``in/``, write ``out/``, connect to 127.0.0.1:<port> (a listener of this module);
the second queue connects to ``localhost:<port2>`` only. An attempt that gets through completes
its job with what it obtained, which the failing assertion shows. The hostile handler speaks
x86_64 Linux (system call numbers, machine code): elsewhere the module is skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from panqueue import JobInfo, JobState, SyncQueueClient
from panqueue.embedded import RedisServer
from panqueue.errors import JobFailed
from tests.helpers import APPS, ROOT, free_port, panqueue_command, subprocess_env, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                                reason="the hostile handler is written for x86_64 Linux")

SECRET = f"top-secret-{uuid.uuid4().hex}"
DENIED = ("PermissionError",)


def _listener_pair() -> tuple[int, socket.socket, socket.socket, socket.socket]:
    """Two TCP listeners on one port, 127.0.0.1 (the grant) and 127.0.0.2 (not granted), and a
    UDP socket on 127.0.0.1 with the same port number."""
    for _ in range(50):
        sockets = [socket.socket(), socket.socket(),
                   socket.socket(socket.AF_INET, socket.SOCK_DGRAM)]
        try:
            sockets[0].bind(("127.0.0.1", 0))
            port = sockets[0].getsockname()[1]
            sockets[1].bind(("127.0.0.2", port))
            sockets[2].bind(("127.0.0.1", port))
        except OSError:
            for sock in sockets:
                sock.close()
            continue
        for sock in sockets:
            if sock.type == socket.SOCK_STREAM:
                sock.listen(16)
            sock.setblocking(False)
        return port, sockets[0], sockets[1], sockets[2]
    raise AssertionError("no port free on both 127.0.0.1 and 127.0.0.2")


def _drain(listener: socket.socket) -> list[bytes]:
    """What every connection waiting on ``listener`` sent (each accepted, read to its end and
    closed); [] when nothing connected. A connect the kernel completed is already queued here
    when the job that made it has ended."""
    received = []
    while select.select([listener], [], [], 0)[0]:
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(5)
            chunks = []
            with contextlib.suppress(OSError):
                while chunk := connection.recv(4096):
                    chunks.append(chunk)
            received.append(b"".join(chunks))
    return received


@dataclass
class Sandbox:
    client: SyncQueueClient
    worker: subprocess.Popen[bytes]
    stderr_path: Path
    queue: str
    host_queue: str
    thread_queue: str
    fork_queue: str
    daemon_queue: str
    process_queue: str
    redis: RedisServer
    base: Path
    in_dir: Path
    out_dir: Path
    secret_dir: Path
    secret_file: Path
    ssh_file: Path
    port: int
    host_port: int
    granted: socket.socket
    other_address: socket.socket
    host_granted: socket.socket
    host_other_address: socket.socket
    udp: socket.socket
    udp_granted: socket.socket
    abstract: socket.socket
    abstract_name: str
    unix_path: Path
    unix_listener: socket.socket
    datagram_sockets: dict[str, tuple[str, socket.socket]]
    dev_shm: Path

    @property
    def worker_pid(self) -> int:
        return self.worker.pid

    def add(self, attempt: str, *, queue: str | None = None, **data: Any) -> Any:
        return self.client.queue(queue or self.queue).add({"attempt": attempt, **data})

    def wait(self, handle: Any, timeout: float = 40.0) -> JobInfo:
        """The job once it has ended (waiting on its events); fails if the worker died."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                handle.result(timeout=0.5)
                break
            except JobFailed:
                break
            except TimeoutError:
                if self.worker.poll() is not None:
                    raise AssertionError(f"the worker exited with code {self.worker.returncode}:"
                                         f"\n{self.stderr_tail()}") from None
                if time.monotonic() > deadline:
                    raise AssertionError(f"job {handle.id} did not end in {timeout} s:\n"
                                         f"{self.stderr_tail()}") from None
        info: JobInfo = self.client.get_job(handle.queue, handle.id)
        return info

    def attempt(self, attempt: str, *, queue: str | None = None, **data: Any) -> JobInfo:
        return self.wait(self.add(attempt, queue=queue, **data))

    def stderr_tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def file(self, directory: Path, content: str = "original") -> Path:
        """A fresh file of this test's own in ``directory``."""
        path = directory / f"f-{uuid.uuid4().hex[:8]}"
        path.write_text(content)
        return path


@pytest.fixture(scope="module")
def sandbox(panqueue_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Sandbox]:
    base = tmp_path_factory.mktemp("permissions")
    in_dir, out_dir, secret_dir = base / "in", base / "out", base / "secret"
    for directory in (in_dir, out_dir, secret_dir):
        directory.mkdir()
    (in_dir / "granted.txt").write_text("granted content")
    secret_file = secret_dir / "secret.txt"
    secret_file.write_text(SECRET)
    # A link made beforehand, inside the read grant, to a file outside it.
    (in_dir / "link-sym").symlink_to(secret_file)
    ssh_dir = Path.home() / ".ssh"
    made_ssh_dir = not ssh_dir.exists()
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    ssh_file = ssh_dir / f"panqueue-test-{uuid.uuid4().hex[:8]}"
    ssh_file.write_text(SECRET)
    dev_shm = Path("/dev/shm") / f"panqueue-test-{uuid.uuid4().hex[:8]}"
    dev_shm.write_text(SECRET)

    port, granted, other_address, udp_granted = _listener_pair()
    host_port, host_granted, host_other_address, host_udp = _listener_pair()
    host_udp.close()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    abstract_name = f"\0panqueue-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(abstract_name)
    unix_path = in_dir / "unix.sock"
    unix_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_listener.bind(str(unix_path))
    for listener in (abstract, unix_listener):
        listener.listen(16)
        listener.setblocking(False)
    datagram_sockets = {}
    for kind, address in (("abstract", f"\0panqueue-test-dgram-{uuid.uuid4().hex[:8]}"),
                          ("path in the read grant", str(in_dir / "dgram.sock"))):
        datagram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        datagram.bind(address)
        datagram.setblocking(False)
        datagram_sockets[kind] = (address, datagram)

    queue, host_queue = f"hostile-{uuid.uuid4().hex[:8]}", f"hostile-host-{uuid.uuid4().hex[:8]}"
    thread_queue = f"hostile-thread-{uuid.uuid4().hex[:8]}"
    fork_queue = f"hostile-fork-{uuid.uuid4().hex[:8]}"
    daemon_queue = f"hostile-daemon-{uuid.uuid4().hex[:8]}"
    process_queue = f"hostile-process-{uuid.uuid4().hex[:8]}"
    env = subprocess_env(HOSTILE_IN=str(in_dir), HOSTILE_OUT=str(out_dir),
                         HOSTILE_PORT=str(port), HOSTILE_HOST_PORT=str(host_port),
                         HOSTILE_QUEUE=queue, HOSTILE_HOST_QUEUE=host_queue,
                         HOSTILE_THREAD_QUEUE=thread_queue, HOSTILE_FORK_QUEUE=fork_queue,
                         HOSTILE_DAEMON_QUEUE=daemon_queue, HOSTILE_DOUBLE_FORK="1",
                         HOSTILE_PROCESS_QUEUE=process_queue,
                         HOSTILE_SECRET=SECRET, PANQUEUE_URL=panqueue_server.url)
    stderr_path = base / "worker.err"
    with (base / "worker.out").open("wb") as out, stderr_path.open("wb") as err:
        worker = subprocess.Popen(
            panqueue_command("worker", "hostile_app:queues", "--url", panqueue_server.url,
                             "--poll-interval", "0.05"),
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=ROOT)
    client = SyncQueueClient(panqueue_server.url)
    sandbox = Sandbox(
        client=client, worker=worker, stderr_path=stderr_path, queue=queue,
        host_queue=host_queue, thread_queue=thread_queue, fork_queue=fork_queue,
        daemon_queue=daemon_queue, process_queue=process_queue, redis=panqueue_server,
        base=base, in_dir=in_dir,
        out_dir=out_dir, secret_dir=secret_dir, secret_file=secret_file, ssh_file=ssh_file,
        port=port, host_port=host_port, granted=granted, other_address=other_address,
        host_granted=host_granted, host_other_address=host_other_address, udp=udp,
        udp_granted=udp_granted, abstract=abstract, abstract_name=abstract_name,
        unix_path=unix_path, unix_listener=unix_listener, datagram_sockets=datagram_sockets,
        dev_shm=dev_shm)
    try:
        started = sandbox.attempt("benign")  # the worker serves: its child started, confined
        assert started.state is JobState.COMPLETED, (started.error, sandbox.stderr_tail())
        yield sandbox
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        client.close()
        for sock in (granted, other_address, host_granted, host_other_address, udp, udp_granted,
                     abstract, unix_listener, *(d for _, d in datagram_sockets.values())):
            sock.close()
        ssh_file.unlink(missing_ok=True)
        dev_shm.unlink(missing_ok=True)
        if made_ssh_dir:
            with contextlib.suppress(OSError):
                ssh_dir.rmdir()  # only if nothing else was put there meanwhile


@pytest.fixture(autouse=True)
def _quiet(sandbox: Sandbox) -> None:
    """Each test starts with nothing waiting on the module's sockets (an escape that worked in
    an earlier test must not show up in this one)."""
    for listener in (sandbox.granted, sandbox.other_address, sandbox.host_granted,
                     sandbox.host_other_address, sandbox.abstract, sandbox.unix_listener):
        _drain(listener)
    for datagram in (sandbox.udp, sandbox.udp_granted,
                     *(d for _, d in sandbox.datagram_sockets.values())):
        with contextlib.suppress(BlockingIOError):
            while True:
                datagram.recv(65536)


def assert_denied(info: JobInfo, *names: str, errors: tuple[str, ...] = DENIED,
                  codes: tuple[int, ...] = ()) -> None:
    """The job failed with the kernel's refusal (``errors``; or an OSError with one of
    ``codes``), its error names each of ``names``, and nothing secret came back."""
    assert info.state is JobState.FAILED, (
        f"the escape worked: job {info.state.name} with result {repr(info.result)[:300]}")
    error = info.error
    assert error is not None
    own_error = error.type == "OSError" and any(f"[Errno {code}]" in error.message
                                                for code in codes)
    assert error.type in errors or own_error, (
        f"not a refusal: {error.type}: {error.message}\n{error.traceback}")
    for name in names:
        assert name in error.message, f"the error does not name {name!r}: {error.message}"
    assert SECRET not in f"{info.result!r} {error.message}"


def assert_nothing_reached(listener: socket.socket) -> None:
    assert _drain(listener) == [], "a connection reached the listener"


# ---- the allowed side


def test_a_granted_read_works(sandbox: Sandbox) -> None:
    info = sandbox.attempt("read", path=str(sandbox.in_dir / "granted.txt"))
    assert info.state is JobState.COMPLETED, info.error
    assert info.result == "granted content"


def test_a_granted_write_works(sandbox: Sandbox) -> None:
    path = sandbox.out_dir / f"made-{uuid.uuid4().hex[:8]}"
    info = sandbox.attempt("create", path=str(path), content="written by the child")
    assert info.state is JobState.COMPLETED, info.error
    assert path.read_text() == "written by the child"


def test_a_granted_connect_works(sandbox: Sandbox) -> None:
    payload = f"hello {uuid.uuid4().hex}"
    info = sandbox.attempt("connect", host="127.0.0.1", port=sandbox.port, payload=payload)
    assert info.state is JobState.COMPLETED, info.error
    assert _drain(sandbox.granted) == [payload.encode()]


def test_a_host_grant_reaches_the_address_the_name_resolves_to(sandbox: Sandbox) -> None:
    payload = f"hello {uuid.uuid4().hex}"
    info = sandbox.attempt("connect", queue=sandbox.host_queue, host="localhost",
                           port=sandbox.host_port, payload=payload)
    assert info.state is JobState.COMPLETED, info.error
    assert _drain(sandbox.host_granted) == [payload.encode()]


# ---- files


READ_OUTSIDE: dict[str, Callable[[Sandbox], Path]] = {
    "the app's own source": lambda s: APPS / "hostile_app.py",
    "the project's config next to it": lambda s: ROOT / "pyproject.toml",
    "a file in ~/.ssh": lambda s: s.ssh_file,
    "/etc/shadow": lambda s: Path("/etc/shadow"),
    "a file beside the grants": lambda s: s.secret_file,
    "a path through .. out of the read grant": lambda s: s.in_dir / ".." / "secret" / "secret.txt",
    "/etc/shadow through /proc/self/root": lambda s: Path("/proc/self/root/etc/shadow"),
    "a POSIX shared memory object (/dev/shm)": lambda s: s.dev_shm,
    "the worker's stderr file through /proc/<worker>/fd": lambda s: Path(
        f"/proc/{s.worker_pid}/fd/2"),
    "the project's config through /proc/self/cwd": lambda s: Path("/proc/self/cwd/pyproject.toml"),
}


@pytest.mark.parametrize("what", list(READ_OUTSIDE))
def test_reading_outside_the_grants_is_denied(sandbox: Sandbox, what: str) -> None:
    path = READ_OUTSIDE[what](sandbox)
    assert_denied(sandbox.attempt("read", path=str(path)), str(path))


@pytest.mark.parametrize("where", ["secret dir", "/etc", "home", "/proc"])
def test_listing_a_directory_outside_the_grants_is_denied(sandbox: Sandbox, where: str) -> None:
    """(/proc's listing is every process of the host.)"""
    path = {"secret dir": sandbox.secret_dir, "/etc": Path("/etc"), "home": Path.home(),
            "/proc": Path("/proc")}[where]
    assert_denied(sandbox.attempt("list_dir", path=str(path)), str(path))


@pytest.mark.parametrize("where", ["read grant", "outside"])
def test_writing_outside_the_write_grant_is_denied(sandbox: Sandbox, where: str) -> None:
    victim = sandbox.file(sandbox.in_dir if where == "read grant" else sandbox.secret_dir)
    assert_denied(sandbox.attempt("write", path=str(victim)), str(victim))
    assert victim.read_text() == "original"


@pytest.mark.parametrize("where", ["read grant", "outside"])
def test_creating_outside_the_write_grant_is_denied(sandbox: Sandbox, where: str) -> None:
    path = (sandbox.in_dir if where == "read grant" else sandbox.secret_dir) / "created"
    assert_denied(sandbox.attempt("create", path=str(path)), str(path))
    assert not path.exists()


@pytest.mark.parametrize("where", ["read grant", "outside"])
def test_making_a_directory_outside_the_write_grant_is_denied(sandbox: Sandbox,
                                                               where: str) -> None:
    path = (sandbox.in_dir if where == "read grant" else sandbox.secret_dir) / "made-dir"
    assert_denied(sandbox.attempt("make_dir", path=str(path)), str(path))
    assert not path.exists()


@pytest.mark.parametrize("where", ["read grant", "outside"])
def test_deleting_outside_the_write_grant_is_denied(sandbox: Sandbox, where: str) -> None:
    victim = sandbox.file(sandbox.in_dir if where == "read grant" else sandbox.secret_dir)
    assert_denied(sandbox.attempt("delete", path=str(victim)), str(victim))
    assert victim.read_text() == "original"


@pytest.mark.parametrize("where", ["read grant", "outside"])
def test_truncating_outside_the_write_grant_is_denied(sandbox: Sandbox, where: str) -> None:
    victim = sandbox.file(sandbox.in_dir if where == "read grant" else sandbox.secret_dir)
    assert_denied(sandbox.attempt("truncate", path=str(victim)), str(victim))
    assert victim.read_text() == "original"


METADATA = ["chmod", "utime", "setxattr", "chown"]


@pytest.mark.parametrize("code", ["Python", "C"])
@pytest.mark.parametrize("where", ["read grant", "outside"])
@pytest.mark.parametrize("how", METADATA)
def test_changing_metadata_outside_the_write_grant_is_denied(sandbox: Sandbox, how: str,
                                                             where: str, code: str) -> None:
    """Mode, times, extended attributes, owner: writes too. The file is root's, like the
    child (whose capabilities are gone, but an owner needs none to chmod or set times).
    From C (libc through ctypes) no Python-level check sees the call: the kernel must."""
    victim = sandbox.file(sandbox.in_dir if where == "read grant" else sandbox.secret_dir)
    victim.chmod(0o600)
    before = victim.stat()
    if code == "Python":
        assert_denied(sandbox.attempt(how, path=str(victim)), str(victim))
    else:
        assert_denied(sandbox.attempt("libc_call", name=how, path=str(victim)))
    after = victim.stat()
    assert (after.st_mode, after.st_mtime_ns, after.st_uid) == (
        before.st_mode, before.st_mtime_ns, before.st_uid)
    assert os.listxattr(victim) == []


def test_watching_a_directory_outside_the_grants_is_denied(sandbox: Sandbox) -> None:
    """inotify would tell the names created in it: a listing by other means."""
    release = sandbox.out_dir / f"release-{uuid.uuid4().hex[:8]}"
    watching = sandbox.add("inotify", path=str(sandbox.secret_dir), release=str(release))

    def state() -> tuple[JobState, Any]:
        assert sandbox.worker.poll() is None, sandbox.stderr_tail()
        info = sandbox.client.get_job(sandbox.queue, watching.id)
        return info.state, info.progress

    wait_until(lambda: state()[0] is JobState.FAILED or state()[1] == "watching", timeout=20,
               what="the watch to be refused or set")
    made = sandbox.file(sandbox.secret_dir)
    release.touch()
    info = sandbox.wait(watching)
    assert_denied(info)
    assert made.name not in repr(info.result)


@pytest.mark.parametrize("move", ["within the read grant", "out of the write grant",
                                  "a secret into the write grant"])
def test_renaming_outside_the_write_grant_is_denied(sandbox: Sandbox, move: str) -> None:
    if move == "within the read grant":
        source, target = sandbox.file(sandbox.in_dir), sandbox.in_dir / "renamed"
    elif move == "out of the write grant":
        source, target = sandbox.file(sandbox.out_dir), sandbox.secret_dir / "moved-out"
    else:
        source, target = sandbox.file(sandbox.secret_dir, SECRET), sandbox.out_dir / "stolen"
    # Landlock refuses a move between differently granted places with EXDEV.
    assert_denied(sandbox.attempt("rename", path=str(source), to=str(target)), str(source),
                  codes=(errno.EXDEV,))
    assert source.exists()
    assert not target.exists()


def test_a_symlink_made_beforehand_out_of_the_read_grant_is_not_followed(sandbox: Sandbox
                                                                          ) -> None:
    """A hard link made beforehand is not tested: it is the file itself, entered in the
    granted directory (Landlock's rules follow paths; docs/executors.md says so). A hard link
    the handler makes is refused (test_a_hard_link_the_handler_makes_to_a_secret_is_refused)."""
    link = "link-sym"
    path = sandbox.in_dir / link
    assert_denied(sandbox.attempt("read", path=str(path)), str(path))


def test_a_symlink_the_handler_makes_to_a_secret_is_not_followed(sandbox: Sandbox) -> None:
    link = sandbox.out_dir / f"sym-{uuid.uuid4().hex[:8]}"
    info = sandbox.attempt("symlink_then_read", path=str(sandbox.secret_file), to=str(link))
    assert_denied(info, str(link))


def test_a_hard_link_the_handler_makes_to_a_secret_is_refused(sandbox: Sandbox) -> None:
    link = sandbox.out_dir / f"hard-{uuid.uuid4().hex[:8]}"
    info = sandbox.attempt("hard_link_then_read", path=str(sandbox.secret_file), to=str(link))
    assert_denied(info, str(sandbox.secret_file), codes=(errno.EXDEV,))
    assert not link.exists()


def test_c_code_reading_outside_the_grants_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("libc_read", path="/etc/shadow"))


def test_a_thread_started_before_the_rules_apply_does_not_read_for_the_handler(
        sandbox: Sandbox) -> None:
    """The handler's module starts a thread when the child imports it (before the rules
    apply, and rules hold per thread unless synchronised): the child must refuse to serve
    rather than leave that thread free to read /etc/shadow for the handler."""
    info = sandbox.attempt("read", queue=sandbox.thread_queue, path="/etc/shadow")
    assert info.state is JobState.FAILED, f"the escape worked: {repr(info.result)[:300]}"
    assert info.error is not None
    assert "root:" not in info.error.message
    assert "thread" in info.error.message, info.error


@pytest.mark.parametrize("helper", ["a child", "a daemon"])
def test_a_process_started_before_the_rules_apply_does_not_read_for_the_handler(
        sandbox: Sandbox, helper: str) -> None:
    """The handler's module forks a helper when the child imports it, sharing anonymous
    memory with it (no descriptor for the child to close): the helper, never confined, would
    read /etc/shadow for the handler. The child must refuse to serve (or have no such helper).
    "a daemon": the helper forks again and its parent exits, so it is no child of the child."""
    queue = sandbox.fork_queue if helper == "a child" else sandbox.daemon_queue
    info = sandbox.attempt("read", queue=queue, path="/etc/shadow")
    assert info.state is JobState.FAILED, f"the escape worked: {repr(info.result)[:300]}"
    assert info.error is not None
    assert "root:" not in info.error.message


# ---- descriptors and other processes


def test_the_child_holds_no_descriptor_of_the_worker(sandbox: Sandbox) -> None:
    info = sandbox.attempt("descriptors")
    assert info.state is JobState.COMPLETED, info.error
    listed, kinds = info.result["listed"], info.result["fstat"]
    assert listed is not None, f"the child cannot list its own descriptors: {info.result}"
    # Its own pipes to the worker and /dev/null: no socket (the worker's Redis connections),
    # no file of the worker's (its stderr), no epoll or other kernel object of the worker's.
    foreign = {fd: target for fd, target in listed.items()
               if not (target.startswith("pipe:") or target in ("/dev/null", "/dev/urandom"))}
    assert foreign == {}, f"descriptors that are not the child's own: {foreign} (all: {listed})"
    assert set(kinds.values()) <= {"pipe", "chr"}, kinds
    assert str(sandbox.stderr_path) not in listed.values()


def test_the_child_runs_without_capabilities_under_no_new_privs_and_a_filter(sandbox: Sandbox
                                                                           ) -> None:
    info = sandbox.attempt("status")
    assert info.state is JobState.COMPLETED, info.error
    none = "0000000000000000"
    assert info.result == {"CapInh": none, "CapPrm": none, "CapEff": none, "CapBnd": none,
                           "CapAmb": none, "NoNewPrivs": "1", "Seccomp": "2"}


def test_the_child_inherits_none_of_the_workers_environment(sandbox: Sandbox) -> None:
    info = sandbox.attempt("environment")
    assert info.state is JobState.COMPLETED, info.error
    leaked = {name for name in info.result if name.startswith(("HOSTILE_", "PANQUEUE"))}
    assert leaked == set(), info.result
    assert SECRET not in repr(info.result)


@pytest.mark.parametrize("table", ["tcp", "unix"])
def test_the_hosts_sockets_are_not_listed_through_proc_self_net(sandbox: Sandbox,
                                                                 table: str) -> None:
    """/proc/self/net/* lists every socket of the network namespace: the worker's Redis
    connections and the host's unix sockets (abstract names included)."""
    path = f"/proc/self/net/{table}"
    info = sandbox.attempt("read", path=path)
    assert_denied(info, path)


def test_taking_a_descriptor_of_the_worker_with_pidfd_getfd_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("steal_fd", pid=sandbox.worker_pid))


def test_reading_the_workers_environment_is_denied(sandbox: Sandbox) -> None:
    path = f"/proc/{sandbox.worker_pid}/environ"
    assert_denied(sandbox.attempt("read", path=path), path)


def test_reading_the_workers_memory_is_denied(sandbox: Sandbox) -> None:
    path = f"/proc/{sandbox.worker_pid}/mem"
    assert_denied(sandbox.attempt("read_mem", pid=sandbox.worker_pid), path)


def test_reading_the_workers_memory_with_process_vm_readv_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("vm_read", pid=sandbox.worker_pid))


@pytest.mark.parametrize("whose", ["the worker", "the test", "the server", "init"])
def test_reading_the_command_line_of_another_process_is_denied(sandbox: Sandbox,
                                                                whose: str) -> None:
    pid = {"the worker": sandbox.worker_pid, "the test": os.getpid(),
           "the server": sandbox.redis.pid, "init": 1}[whose]
    path = f"/proc/{pid}/cmdline"
    assert_denied(sandbox.attempt("read", path=path), path)


OTHER_CHILD: dict[str, tuple[str, dict[str, Any]]] = {
    "signal 0": ("kill", {"signal": 0}),
    "SIGUSR2": ("kill", {"signal": int(signal.SIGUSR2)}),
    "SIGUSR2 through a pidfd": ("pidfd_signal", {"signal": int(signal.SIGUSR2)}),
    "ptrace": ("ptrace", {}),
    "its memory": ("vm_read", {}),
    "its priority": ("schedule", {"how": "nice"}),
    "its CPU affinity": ("schedule", {"how": "affinity"}),
    "its scheduling policy": ("schedule", {"how": "policy"}),
    "its I/O priority": ("schedule", {"how": "io priority"}),
}


@pytest.mark.parametrize("how", list(OTHER_CHILD))
def test_reaching_another_child_is_denied(sandbox: Sandbox, how: str) -> None:
    """A second child of the same queue, busy with a job that counts the SIGUSR2s it gets."""
    attempt, data = OTHER_CHILD[how]
    with other_child(sandbox) as pid:
        assert_denied(sandbox.attempt(attempt, pid=pid, **data))


@pytest.mark.parametrize("what", ["environ", "cmdline"])
def test_reading_another_childs_proc_files_is_denied(sandbox: Sandbox, what: str) -> None:
    with other_child(sandbox) as pid:
        path = f"/proc/{pid}/{what}"
        assert_denied(sandbox.attempt("read", path=path), path)


def test_the_kernel_sends_no_signal_to_another_child_for_the_handler(sandbox: Sandbox) -> None:
    """F_SETOWN + O_ASYNC: the kernel itself would send the signal (SIGIO, here SIGUSR2)."""
    with other_child(sandbox) as pid:
        sandbox.attempt("sigio", pid=pid, signal=int(signal.SIGUSR2))  # may succeed: no signal


@contextlib.contextmanager
def other_child(sandbox: Sandbox) -> Iterator[int]:
    """The pid of another child, busy with a job that counts the SIGUSR2s it gets; on leaving,
    its job is released and must have got none."""
    release = sandbox.out_dir / f"release-{uuid.uuid4().hex[:8]}"
    waiting = sandbox.add("wait", release=str(release))

    def pid() -> int | None:
        assert sandbox.worker.poll() is None, sandbox.stderr_tail()
        progress = sandbox.client.get_job(sandbox.queue, waiting.id).progress
        return progress.get("pid") if isinstance(progress, dict) else None

    wait_until(pid, timeout=20, what="the other child to report its pid")
    try:
        yield int(pid() or 0)
    finally:
        release.touch()
        other = sandbox.wait(waiting)
    assert other.state is JobState.COMPLETED, other.error
    assert other.result == {"signals": 0, "released": True}, "a signal reached the other child"


# ---- network


def test_connecting_to_redis_is_denied(sandbox: Sandbox) -> None:
    address = f"127.0.0.1:{sandbox.redis.port}"
    info = sandbox.attempt("connect", host="127.0.0.1", port=sandbox.redis.port, reply=True)
    assert_denied(info, address)


def test_a_redis_client_cannot_reach_redis(sandbox: Sandbox) -> None:
    info = sandbox.attempt("redis_ping", host="127.0.0.1", port=sandbox.redis.port)
    # redis-py wraps the refusal ("Error 1 connecting to 127.0.0.1:P. Operation not permitted.")
    assert_denied(info, f"127.0.0.1:{sandbox.redis.port}",
                  errors=("PermissionError", "ConnectionError"))
    assert info.error is not None
    message = info.error.message.lower()
    assert "error 1 " in message or "error 13 " in message or "permission" in message, message


def test_tcp_fast_open_to_redis_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("fastopen", host="127.0.0.1", port=sandbox.redis.port),
                  f"127.0.0.1:{sandbox.redis.port}")


def test_c_code_connecting_to_redis_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("libc_connect", host="127.0.0.1", port=sandbox.redis.port),
                  f"127.0.0.1:{sandbox.redis.port}")


def test_multipath_tcp_to_redis_is_denied(sandbox: Sandbox) -> None:
    # Refused when the socket is made (no address yet), or when it connects.
    assert_denied(sandbox.attempt("mptcp", host="127.0.0.1", port=sandbox.redis.port))


SOCKET_OPTIONS: dict[str, tuple[int, int, Any]] = {
    "TCP_FASTOPEN_CONNECT": (socket.IPPROTO_TCP, 30, 1),
    # IP_OPTIONS, loose source route through 127.0.0.2
    "IP_OPTIONS (source route)": (socket.IPPROTO_IP, 4, [0x83, 7, 4, 127, 0, 0, 2, 0]),
    "IPV6_RTHDR": (socket.IPPROTO_IPV6, 57, [0, 2, 0, 1, 0, 0, 0, 0] + [0] * 16),
    "IPV6_2292RTHDR": (socket.IPPROTO_IPV6, 5, [0, 2, 0, 1, 0, 0, 0, 0] + [0] * 16),
}


@pytest.mark.parametrize("option", list(SOCKET_OPTIONS))
def test_a_socket_option_that_reroutes_or_connects_is_denied(sandbox: Sandbox,
                                                             option: str) -> None:
    level, number, value = SOCKET_OPTIONS[option]
    assert_denied(sandbox.attempt("sockopt", level=level, option=number, value=value))


SOCKET_KINDS = {
    "raw IPv4": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
    "packet": (socket.AF_PACKET, socket.SOCK_RAW, 0),
    "netlink": (socket.AF_NETLINK, socket.SOCK_RAW, 0),
    "vsock": (40, socket.SOCK_STREAM, 0),  # AF_VSOCK: the way out of a virtual machine
}


@pytest.mark.parametrize("kind", list(SOCKET_KINDS))
def test_a_socket_of_another_kind_is_denied(sandbox: Sandbox, kind: str) -> None:
    family, kind_type, proto = SOCKET_KINDS[kind]
    assert_denied(sandbox.attempt("socket_kind", family=family, type=kind_type, proto=proto))


@pytest.mark.parametrize("how", ["sendto", "sendmsg", "sendmmsg", "connect"])
def test_a_udp_datagram_to_a_port_not_granted_is_denied(sandbox: Sandbox, how: str) -> None:
    port = sandbox.udp.getsockname()[1]
    info = sandbox.attempt("udp", host="127.0.0.1", port=port, how=how)
    if how == "sendmmsg":  # C code: the supervisor's record is what names the address
        assert_denied(info)
    else:
        assert_denied(info, f"127.0.0.1:{port}")
    with pytest.raises(BlockingIOError):
        sandbox.udp.recv(100)


@pytest.mark.parametrize("how", ["sendto", "connect"])
def test_udp_to_the_granted_tcp_port_is_denied(sandbox: Sandbox, how: str) -> None:
    """Grants are for TCP: UDP goes to the resolver only."""
    info = sandbox.attempt("udp", host="127.0.0.1", port=sandbox.port, connect=how == "connect")
    assert_denied(info, f"127.0.0.1:{sandbox.port}")
    with pytest.raises(BlockingIOError):
        sandbox.udp_granted.recv(100)


def test_a_udp_datagram_addressed_as_af_unspec_is_denied(sandbox: Sandbox) -> None:
    """The kernel sends a UDP datagram addressed with family AF_UNSPEC as if it were IPv4."""
    port = sandbox.udp.getsockname()[1]
    assert_denied(sandbox.attempt("udp_unspec", host="127.0.0.1", port=port))
    with pytest.raises(BlockingIOError):
        sandbox.udp.recv(100)


def test_a_udp_server_on_a_port_is_denied(sandbox: Sandbox) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert_denied(sandbox.attempt("udp_bind", port=port))


def test_the_granted_port_on_another_address_is_denied(sandbox: Sandbox) -> None:
    info = sandbox.attempt("connect", host="127.0.0.2", port=sandbox.port, payload="escape")
    assert_denied(info, f"127.0.0.2:{sandbox.port}")
    assert_nothing_reached(sandbox.other_address)


def test_the_granted_port_on_ipv6_loopback_is_denied(sandbox: Sandbox) -> None:
    """[::1] is another address than the granted 127.0.0.1, though the same host."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as listener:
        try:
            listener.bind(("::1", sandbox.port))
        except OSError as exc:
            pytest.skip(f"cannot listen on [::1]:{sandbox.port} here: {exc}")
        listener.listen(16)
        listener.setblocking(False)
        info = sandbox.attempt("connect", host="::1", port=sandbox.port, payload="escape")
        assert_denied(info, str(sandbox.port))
        assert_nothing_reached(listener)


def test_the_granted_port_on_another_address_mapped_into_ipv6_is_denied(sandbox: Sandbox
                                                                        ) -> None:
    info = sandbox.attempt("connect", host="::ffff:127.0.0.2", port=sandbox.port,
                           payload="escape")
    assert_denied(info, str(sandbox.port))
    assert_nothing_reached(sandbox.other_address)


def test_a_host_grant_holds_by_address_not_by_port(sandbox: Sandbox) -> None:
    info = sandbox.attempt("connect", queue=sandbox.host_queue, host="127.0.0.2",
                           port=sandbox.host_port, payload="escape")
    assert_denied(info, f"127.0.0.2:{sandbox.host_port}")
    assert_nothing_reached(sandbox.host_other_address)


def test_listening_on_a_port_is_denied(sandbox: Sandbox) -> None:
    port = free_port()
    assert_denied(sandbox.attempt("listen", port=port))
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass


def test_an_abstract_unix_socket_of_the_host_is_unreachable(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("unix", address=sandbox.abstract_name))
    assert_nothing_reached(sandbox.abstract)


def test_a_unix_socket_file_in_the_read_grant_is_unreachable(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("unix", address=str(sandbox.unix_path)))
    assert_nothing_reached(sandbox.unix_listener)


@pytest.mark.parametrize("kind", ["abstract", "path in the read grant"])
def test_a_datagram_to_a_unix_socket_of_the_host_is_denied(sandbox: Sandbox, kind: str) -> None:
    address, datagram = sandbox.datagram_sockets[kind]
    assert_denied(sandbox.attempt("unix_datagram", address=address))
    with pytest.raises(BlockingIOError):
        datagram.recv(100)


@pytest.mark.parametrize("kind", ["abstract", "path in the write grant"])
def test_binding_a_unix_name_is_denied(sandbox: Sandbox, kind: str) -> None:
    """A server the host's processes could reach, under a name a host service may expect."""
    address = (f"\0panqueue-squat-{uuid.uuid4().hex[:8]}" if kind == "abstract"
               else str(sandbox.out_dir / f"squat-{uuid.uuid4().hex[:8]}.sock"))
    assert_denied(sandbox.attempt("unix_bind", address=address))
    if kind != "abstract":
        assert not Path(address).exists()


def test_a_named_pipe_in_the_write_grant_is_denied(sandbox: Sandbox) -> None:
    """Named pipes, sockets and devices are never granted (a host process opening the pipe
    would block on the child)."""
    path = sandbox.out_dir / f"fifo-{uuid.uuid4().hex[:8]}"
    # (os.mkfifo's errors never carry the path, denied or not.)
    assert_denied(sandbox.attempt("mkfifo", path=str(path)))
    assert not path.exists()


# ---- programs and processes


@pytest.mark.parametrize("how", ["run", "execv", "posix_spawn"])
def test_running_a_program_is_denied(sandbox: Sandbox, how: str) -> None:
    assert_denied(sandbox.attempt(how, program="/bin/sh"), "/bin/sh")


def test_c_code_running_a_program_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("libc_call", name="execve", path="/bin/sh"))


def test_fork_beyond_processes_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("fork"))


I386 = {"fork": (2, ()), "unshare": (310, (0x10000000 | 0x40000000,))}


@pytest.mark.parametrize("name", list(I386))
def test_a_32_bit_system_call_is_denied(sandbox: Sandbox, name: str) -> None:
    """int 0x80 reaches the i386 system calls (this kernel has the 32-bit ABI): a filter that
    matches x86_64 numbers only must refuse them, or kill the child (SIGSYS)."""
    number, args = I386[name]
    info = sandbox.attempt("i386", name=name, number=number, args=list(args))
    assert info.error is not None, f"the escape worked: {info.result!r}"
    assert "imeout" not in info.error.type + info.error.message, (
        "the child hung (its calling thread killed, the process left alive?): "
        f"{info.error.type}: {info.error.message}")
    if info.error.type != "ChildCrashed" or "SIGSYS" not in info.error.message:
        assert_denied(info, codes=(errno.ENOSYS,))


# A queue granted processes=2 and run=["/usr/bin/true"].
PROCESSES = 2


def test_a_granted_program_runs(sandbox: Sandbox) -> None:
    info = sandbox.attempt("run_exit_code", queue=sandbox.process_queue,
                           program="/usr/bin/true")
    assert info.state is JobState.COMPLETED, info.error
    assert info.result == 0


def test_a_program_not_granted_is_denied_where_others_are(sandbox: Sandbox) -> None:
    info = sandbox.attempt("run", queue=sandbox.process_queue, program="/bin/sh")
    assert_denied(info, "/bin/sh")


def test_a_program_run_through_the_dynamic_loader_is_held_by_the_same_rules(
        sandbox: Sandbox) -> None:
    """The loader must be executable for any granted dynamic program; executed itself, it maps
    and runs any program it can read (here git, readable as part of /usr/lib). That is no way
    out: the child can run any code it can read already (Python, ctypes), and the program runs
    under the child's rules (docs/executors.md, "What run= is")."""
    program = "/usr/lib/git-core/git"
    if not os.path.exists(program):
        pytest.skip(f"{program} is not installed here")
    info = sandbox.attempt("loader_exec", queue=sandbox.process_queue,
                           loader=os.path.realpath("/lib64/ld-linux-x86-64.so.2"),
                           program=program, args=["--no-pager", "diff", "--no-index",
                                                  str(sandbox.secret_file), "/dev/null"])
    assert info.state is JobState.COMPLETED, info.error
    assert SECRET not in repr(info.result)
    assert "Permission denied" in str(info.result), info.result


@pytest.mark.parametrize("via", ["execveat", "/proc/self/fd"])
def test_a_program_not_granted_does_not_run_from_a_memory_file(sandbox: Sandbox,
                                                               via: str) -> None:
    """A copy of a readable program in a memfd, executed with execveat(AT_EMPTY_PATH) or as
    /proc/self/fd/N: the memory file's filesystem is none that Landlock rules name."""
    program = "/usr/lib/git-core/git"
    if not os.path.exists(program):
        pytest.skip(f"{program} is not installed here")
    info = sandbox.attempt("memfd_exec", queue=sandbox.process_queue, program=program,
                           args=["--version"], via=via)
    assert_denied(info)


def test_a_process_beyond_the_granted_count_is_denied(sandbox: Sandbox) -> None:
    info = sandbox.attempt("fork_beyond", queue=sandbox.process_queue, hold=PROCESSES)
    # The supervisor answers EAGAIN (BlockingIOError), as the kernel does past RLIMIT_NPROC.
    assert_denied(info, errors=("PermissionError", "BlockingIOError"))


def test_processes_started_at_the_same_moment_stay_within_the_count(sandbox: Sandbox) -> None:
    info = sandbox.attempt("fork_race", queue=sandbox.process_queue, threads=16)
    assert info.state is JobState.COMPLETED, info.error
    assert info.result <= PROCESSES, f"{info.result} processes ran at once (processes={PROCESSES})"


def test_a_daemonized_grandchild_still_counts(sandbox: Sandbox) -> None:
    info = sandbox.attempt("daemon_then_fork", queue=sandbox.process_queue, hold=PROCESSES)
    assert_denied(info, errors=("PermissionError", "BlockingIOError"))


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def test_a_process_the_child_started_ends_with_the_child(sandbox: Sandbox) -> None:
    """A detached process (its parent exited) must not outlive the child that started it: it
    would go on with the queue's grants, beyond any count, after the worker replaced the
    child."""
    info = sandbox.attempt("leave_behind", queue=sandbox.process_queue)
    assert isinstance(info.progress, dict) and "pid" in info.progress, info
    pid, child = info.progress["pid"], info.progress["child"]
    try:
        wait_until(lambda: _gone(child), timeout=10, what=f"the replaced child {child} to end")
        wait_until(lambda: _gone(pid), timeout=3,
                   what=f"process {pid}, started by the child {child} (which has ended), to end")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_process_the_child_starts_is_held_by_the_same_rules(sandbox: Sandbox) -> None:
    info = sandbox.attempt("fork_and_read", queue=sandbox.process_queue, path="/etc/shadow")
    assert info.state is JobState.COMPLETED, info.error
    assert info.result == "refused: PermissionError"


def test_a_raw_clone3_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("clone3"), codes=(errno.ENOSYS,))


# ---- undoing the rules


@pytest.mark.parametrize("call", ["setrlimit", "prlimit"])
@pytest.mark.parametrize("limit", ["cpu", "open files"])
def test_raising_a_limit_the_worker_set_is_denied(sandbox: Sandbox, call: str,
                                                   limit: str) -> None:
    """The soft CPU limit is the job's CPU budget (any process may raise a soft limit up to its
    hard one); the hard open-files limit needs CAP_SYS_RESOURCE (which this host's root may
    lack: then the kernel refuses it unconfined too)."""
    info = sandbox.attempt("raise_rlimit", call=call, limit=limit)
    # Python's setrlimit reports EPERM as ValueError("not allowed to raise maximum limit").
    assert_denied(info, errors=("PermissionError", "ValueError"))
    assert info.error is not None
    assert info.error.type == "PermissionError" or \
        info.error.message == "not allowed to raise maximum limit", info.error


UNDO = ["prctl_seccomp", "prctl_dumpable", "seccomp", "unshare", "setns", "init_module",
        "finit_module", "io_uring"]


@pytest.mark.parametrize("how", UNDO)
def test_undoing_the_rules_is_denied(sandbox: Sandbox, how: str) -> None:
    assert_denied(sandbox.attempt(how, path=str(sandbox.in_dir / "granted.txt")))


def test_a_landlock_layer_of_the_handlers_own_only_narrows(sandbox: Sandbox) -> None:
    """Landlock's calls go through (the child adds its last layer with them after the
    handler's module is imported, under the seccomp filter that holds from before): a layer
    that grants reading everything still reads nothing the rules deny."""
    assert_denied(sandbox.attempt("landlock_wider", path=str(sandbox.secret_file)),
                  str(sandbox.secret_file))


@pytest.mark.parametrize("name", ["userfaultfd", "bpf", "perf_event_open", "keyctl", "add_key",
                                  "mount", "pivot_root", "open_by_handle_at", "kexec_load",
                                  "syslog"])
def test_a_system_call_that_reaches_past_the_sandbox_is_denied(sandbox: Sandbox,
                                                               name: str) -> None:
    assert_denied(sandbox.attempt("raw_syscall", name=name))


def test_chroot_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("chroot", path=str(sandbox.out_dir)))


# ---- the host's shared memory and message queues (not paths: Landlock does not see them)

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.shmat.restype = ctypes.c_void_p


@pytest.fixture
def ipc_key() -> int:
    return int.from_bytes(os.urandom(3), "big") + 0x50510000


def test_a_system_v_shared_memory_segment_of_the_host_is_unreachable(sandbox: Sandbox,
                                                                     ipc_key: int) -> None:
    segment = _LIBC.shmget(ipc_key, 4096, 0o3000 | 0o600)  # IPC_CREAT | IPC_EXCL
    assert segment >= 0, os.strerror(ctypes.get_errno())
    try:
        address = _LIBC.shmat(segment, None, 0)
        ctypes.memmove(address, SECRET.encode(), len(SECRET))
        _LIBC.shmdt(ctypes.c_void_p(address))
        assert_denied(sandbox.attempt("sysv_shm", key=ipc_key))
    finally:
        _LIBC.shmctl(segment, 0, None)  # IPC_RMID


def test_a_system_v_message_queue_of_the_host_is_unreachable(sandbox: Sandbox,
                                                             ipc_key: int) -> None:
    queue = _LIBC.msgget(ipc_key, 0o3000 | 0o600)
    assert queue >= 0, os.strerror(ctypes.get_errno())
    try:
        message = (1).to_bytes(8, "little") + SECRET.encode()
        assert _LIBC.msgsnd(queue, message, len(SECRET), 0) == 0
        assert_denied(sandbox.attempt("sysv_msg", key=ipc_key))
    finally:
        _LIBC.msgctl(queue, 0, None)


def test_a_system_v_semaphore_of_the_host_is_unreachable(sandbox: Sandbox, ipc_key: int) -> None:
    semaphores = _LIBC.semget(ipc_key, 1, 0o3000 | 0o600)
    assert semaphores >= 0, os.strerror(ctypes.get_errno())
    try:
        assert _LIBC.semctl(semaphores, 0, 16, 7) == 0  # SETVAL
        assert_denied(sandbox.attempt("sysv_sem", key=ipc_key))
        assert _LIBC.semctl(semaphores, 0, 12) == 7  # GETVAL
    finally:
        _LIBC.semctl(semaphores, 0, 0)  # IPC_RMID


def test_a_posix_message_queue_of_the_host_is_unreachable(sandbox: Sandbox) -> None:
    name = f"/panqueue-test-{uuid.uuid4().hex[:8]}"
    queue = _LIBC.mq_open(name.encode(), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600, None)
    assert queue >= 0, os.strerror(ctypes.get_errno())
    try:
        assert _LIBC.mq_send(queue, SECRET.encode(), len(SECRET), 0) == 0
        assert_denied(sandbox.attempt("posix_mq", name=name))
    finally:
        _LIBC.mq_close(queue)
        _LIBC.mq_unlink(name.encode())


@pytest.mark.parametrize("frame", ["garbage", "not a map", "ext result", "bytes result",
                                   "deep progress", "huge length"])
def test_forged_frames_from_a_child_do_not_stop_the_worker(sandbox: Sandbox, frame: str) -> None:
    """The child owns its end of the protocol pipe: whatever it writes there, the worker goes
    on serving (the job fails or completes, the child is replaced). A forged "done" is taken
    as the job's answer, and the child, which then exits, may be handed the next job before the
    worker has seen it go: that one job fails with "child exited" (a gap of the executor's idle
    pool, not of the sandbox); the one after must complete."""
    info = sandbox.attempt("forge", frame=frame)
    assert info.state in (JobState.FAILED, JobState.COMPLETED), info
    after = sandbox.attempt("benign")
    if after.state is JobState.FAILED and after.error is not None and \
            after.error.message == "child exited with code 0":
        after = sandbox.attempt("benign")
    assert after.state is JobState.COMPLETED, after.error
    assert sandbox.worker.poll() is None


# ---- the worker itself (last: an escape here can stop or kill the worker)


def test_ptrace_of_the_worker_is_denied(sandbox: Sandbox) -> None:
    assert_denied(sandbox.attempt("ptrace", pid=sandbox.worker_pid))
    assert sandbox.worker.poll() is None


WORKER_SIGNALS: dict[str, tuple[str, Callable[[Sandbox], dict[str, Any]]]] = {
    "signal 0": ("kill", lambda s: {"pid": s.worker_pid, "signal": 0}),
    "signal 0 through a pidfd": ("pidfd_signal", lambda s: {"pid": s.worker_pid, "signal": 0}),
    "signal 0 to its process group": ("killpg", lambda s: {"pgid": os.getpgid(s.worker_pid),
                                                            "signal": 0}),
    "SIGUSR2": ("kill", lambda s: {"pid": s.worker_pid, "signal": int(signal.SIGUSR2)}),
}


@pytest.mark.parametrize("how", list(WORKER_SIGNALS))
def test_signalling_the_worker_is_denied(sandbox: Sandbox, how: str) -> None:
    attempt, data = WORKER_SIGNALS[how]
    assert_denied(sandbox.attempt(attempt, **data(sandbox)))
    assert sandbox.worker.poll() is None


@pytest.mark.parametrize("how", ["nice", "affinity", "policy", "io priority"])
def test_changing_how_the_worker_is_scheduled_is_denied(sandbox: Sandbox, how: str) -> None:
    pid = sandbox.worker_pid
    state = (os.getpriority(os.PRIO_PROCESS, pid), os.sched_getaffinity(pid),
             os.sched_getscheduler(pid))
    try:
        assert_denied(sandbox.attempt("schedule", pid=pid, how=how))
        assert (os.getpriority(os.PRIO_PROCESS, pid), os.sched_getaffinity(pid),
                os.sched_getscheduler(pid)) == state
    finally:  # put the worker back as it was, should the child have changed it
        os.setpriority(os.PRIO_PROCESS, pid, state[0])
        os.sched_setaffinity(pid, state[1])
        os.sched_setscheduler(pid, state[2], os.sched_param(0))


# ---- and after all of that


def test_the_worker_still_serves_after_every_escape(sandbox: Sandbox) -> None:
    info = sandbox.attempt("benign")
    assert info.state is JobState.COMPLETED, info.error
    assert info.result == "fine"
    assert sandbox.worker.poll() is None
