"""The seccomp filter of a sandboxed child and the worker's supervisor that decides its calls.

Each test starts a real Python process (tests/apps/seccomp_app.py) that installs the filter on
itself and hands its listener to this process's supervisor, then tries what the test names and
reports the outcome. Connects go to real listening sockets of the test; the Redis server is the
suite's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from panqueue._sandbox.net import NetPolicy
from panqueue._sandbox.seccomp import outside, syscall_number
from panqueue._sandbox.supervisor import supervisor
from tests.helpers import APPS, ROOT, subprocess_env, wait_until


def _libseccomp_problem() -> str:
    if not sys.platform.startswith("linux"):
        return "Linux only"
    try:
        from panqueue._sandbox.seccomp import library
        library()
    except OSError as exc:
        return f"no libseccomp ({exc})"
    return ""


pytestmark = pytest.mark.skipif(bool(_libseccomp_problem()), reason=_libseccomp_problem())

APP = str(APPS / "seccomp_app.py")
NET = {"run": False, "processes": 0, "inet": True, "listen": False}
BARE = {"run": False, "processes": 0, "inet": False, "listen": False}


@dataclass
class Listener:
    """A TCP listener that answers each connection's first four bytes with the same four."""

    host: str
    port: int
    sock: socket.socket

    @property
    def grant(self) -> str:
        return f"{self.host}:{self.port}"


def _serve(sock: socket.socket) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            with contextlib.suppress(OSError):
                conn.settimeout(5)
                data = b""
                while len(data) < 4:
                    more = conn.recv(4 - len(data))
                    if not more:
                        break
                    data += more
                conn.sendall(data)


@contextlib.contextmanager
def _listening(host: str, port: int = 0) -> Iterator[Listener]:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    thread = threading.Thread(target=_serve, args=(sock,), daemon=True)
    thread.start()
    try:
        yield Listener(host, sock.getsockname()[1], sock)
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        thread.join(5)


@pytest.fixture
def granted() -> Iterator[Listener]:
    with _listening("127.0.0.1") as listener:
        yield listener


@pytest.fixture
def other_address(granted: Listener) -> Iterator[Listener]:
    """A listener on 127.0.0.2, the granted listener's port."""
    with _listening("127.0.0.2", granted.port) as listener:
        yield listener


@pytest.fixture
def resolver() -> Iterator[socket.socket]:
    """A UDP socket standing for the host's nameserver (127.0.0.3:53)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.3", 53))
    except OSError as exc:
        pytest.skip(f"cannot bind 127.0.0.3:53 ({exc})")
    sock.settimeout(5)
    with sock:
        yield sock


def run_app(spec: dict[str, Any], checks: list[list[Any]], policy: NetPolicy | None = None,
            processes: int = 0) -> dict[str, Any]:
    """Run the app; its checks' outcomes by name: the value returned, or the errno's name."""
    process = subprocess.Popen([sys.executable, APP, json.dumps(spec), json.dumps(checks)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=subprocess_env(), cwd=ROOT)
    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    # stdout is read through its buffer only (communicate would skip what readline buffered)
    killer = threading.Timer(60, process.kill)
    killer.start()
    try:
        hello = json.loads(process.stdout.readline())
        if hello["fd"] >= 0:
            supervisor().attach(hello["pid"], hello["fd"],
                                policy or NetPolicy.from_grants([]), processes)
        process.stdin.write("attached\n")
        process.stdin.close()
        out, err = process.stdout.read(), process.stderr.read()
        process.wait()
    finally:
        killer.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
        supervisor().detach(process.pid)
    results: dict[str, Any] = {}
    for line in out.splitlines():
        result = json.loads(line)
        if "check" in result:
            results[result["check"]] = result.get("ok", result.get("errno"))
    assert out.endswith('{"done": true}\n'), (out, err, process.returncode)
    return results


def policy(*grants: str) -> NetPolicy:
    return NetPolicy.from_grants(list(grants))


# -- connects: by address, not by port ----------------------------------------------------------

def test_connect_to_a_granted_address_works(granted: Listener) -> None:
    results = run_app(NET, [["connect", granted.host, granted.port]], policy(granted.grant))
    assert results == {"connect": "ping"}


def test_connect_to_another_address_on_the_granted_port_is_denied(
        granted: Listener, other_address: Listener) -> None:
    checks = [["connect", other_address.host, other_address.port],
              ["connect_ctypes", other_address.host, other_address.port]]
    results = run_app(NET, checks, policy(granted.grant))
    assert results == {"connect": "EPERM", "connect_ctypes": "EPERM"}


def test_connect_to_redis_is_denied(granted: Listener, redis_url: str) -> None:
    port = urllib.parse.urlsplit(redis_url).port or 6379
    checks = [["connect", "127.0.0.1", port], ["connect_ctypes", "127.0.0.1", port]]
    results = run_app(NET, checks, policy(granted.grant))
    assert results == {"connect": "EPERM", "connect_ctypes": "EPERM"}


def test_denied_connects_are_recorded_for_the_child(granted: Listener,
                                                    other_address: Listener) -> None:
    process = subprocess.Popen(
        [sys.executable, APP, json.dumps(NET),
         json.dumps([["connect", other_address.host, other_address.port]])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=subprocess_env(), cwd=ROOT)
    assert process.stdin is not None and process.stdout is not None
    hello = json.loads(process.stdout.readline())
    supervisor().attach(hello["pid"], hello["fd"], policy(granted.grant), 0)
    try:
        process.stdin.write("attached\n")
        process.stdin.flush()
        process.communicate(timeout=60)
        assert supervisor().denials(process.pid) == [f"connect to 127.0.0.2:{granted.port}"]
    finally:
        supervisor().detach(process.pid)
    assert supervisor().denials(process.pid) == [f"connect to 127.0.0.2:{granted.port}"]


def test_non_blocking_connects_work(granted: Listener) -> None:
    checks = [["connect_asyncio", granted.host, granted.port],
              ["connect_timeout", granted.host, granted.port]]
    results = run_app(NET, checks, policy(granted.grant))
    assert results == {"connect_asyncio": "ping", "connect_timeout": "ping"}


def test_ipv6_connects_hold_by_address_too() -> None:
    try:
        listener = _listening("::1")
        ipv6 = listener.__enter__()
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback ({exc})")
    try:
        checks = [["connect", "::1", ipv6.port], ["connect", "127.0.0.1", ipv6.port]]
        assert run_app(NET, checks[:1], policy(f"[::1]:{ipv6.port}")) == {"connect": "ping"}
        assert run_app(NET, checks[1:], policy(f"[::1]:{ipv6.port}")) == {"connect": "EPERM"}
    finally:
        listener.__exit__(None, None, None)


def test_connects_from_many_threads_at_once_all_work(granted: Listener) -> None:
    results = run_app(NET, [["parallel_connects", granted.host, granted.port, 16, 10]],
                      policy(granted.grant))
    assert results == {"parallel_connects": ["ping"]}


def test_connect_uses_the_address_read_once_not_memory_changed_meanwhile(
        granted: Listener, other_address: Listener) -> None:
    results = run_app(NET, [["connect_changed_address", granted.host, granted.port,
                             other_address.host]], policy(granted.grant))
    seen = set(results["connect_changed_address"].split(","))
    assert seen <= {"127.0.0.1", "refused"}, seen


def test_a_host_grant_covers_the_addresses_of_its_name(granted: Listener,
                                                       other_address: Listener) -> None:
    checks = [["connect", granted.host, granted.port],
              ["connect_ctypes", other_address.host, other_address.port]]
    results = run_app(NET, checks, policy(f"localhost:{granted.port}"))
    assert results == {"connect": "ping", "connect_ctypes": "EPERM"}


def test_a_bad_address_pointer_or_descriptor_fails_the_call_not_the_supervisor(
        granted: Listener) -> None:
    checks = [["connect_bad_pointer", granted.port], ["connect_closed_fd", granted.port],
              ["connect", granted.host, granted.port]]
    results = run_app(NET, checks, policy(granted.grant))
    assert results == {"connect_bad_pointer": "EFAULT", "connect_closed_fd": "EBADF",
                       "connect": "ping"}


# -- sends ------------------------------------------------------------------------------------

def test_udp_goes_only_to_the_resolver(granted: Listener, resolver: socket.socket) -> None:
    net = NetPolicy.from_wire({"grants": [f"localhost:{granted.port}"],
                               "resolvers": ["127.0.0.3"]})
    checks = [["udp_sendto", "127.0.0.3", 53], ["udp_sendmsg", "127.0.0.3", 53],
              ["udp_sendmmsg", "127.0.0.3", 53],
              ["udp_sendto", "127.0.0.1", granted.port], ["udp_sendto", "127.0.0.3", 54]]
    results = run_app(NET, checks, net)
    assert results["udp_sendmmsg"] == 2
    assert [resolver.recv(16) for _ in range(4)] == [b"x", b"x", b"one", b"two!"]
    # a later check of the same name overwrites: both refused sends are the last udp_sendto
    assert results["udp_sendto"] == "EPERM"
    assert results["udp_sendmsg"] == 1


def test_udp_to_an_address_not_the_resolver_is_denied(granted: Listener) -> None:
    checks = [["udp_sendto", "127.0.0.1", granted.port],
              ["udp_sendmsg", "127.0.0.2", granted.port],
              ["udp_sendmmsg", "127.0.0.2", granted.port]]
    results = run_app(NET, checks, policy(granted.grant))
    assert results == {"udp_sendto": "EPERM", "udp_sendmsg": "EPERM", "udp_sendmmsg": "EPERM"}


def test_sendmsg_on_a_connected_socket_works(granted: Listener) -> None:
    results = run_app(NET, [["tcp_sendmsg", granted.host, granted.port]], policy(granted.grant))
    assert results == {"tcp_sendmsg": "ping"}


def test_a_fast_open_denial_names_the_address(granted: Listener, redis_url: str) -> None:
    port = urllib.parse.urlsplit(redis_url).port or 6379
    process = subprocess.Popen(
        [sys.executable, APP, json.dumps(NET), json.dumps([["fastopen", "127.0.0.1", port]])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=subprocess_env(), cwd=ROOT)
    assert process.stdin is not None and process.stdout is not None
    hello = json.loads(process.stdout.readline())
    supervisor().attach(hello["pid"], hello["fd"], policy(granted.grant), 0)
    try:
        out, _ = process.communicate("attached\n", timeout=60)
        assert '"errno": "EPERM"' in out
        assert supervisor().denials(process.pid) == [f"connect to 127.0.0.1:{port} (TCP fast open)"]
    finally:
        supervisor().detach(process.pid)


def test_tcp_fast_open_and_source_routes_are_denied(granted: Listener) -> None:
    checks = [["fastopen", granted.host, granted.port], ["source_route"]]
    assert run_app(NET, checks, policy(granted.grant)) == {"fastopen": "EPERM",
                                                           "source_route": "EPERM"}
    assert run_app({}, [["source_route"]]) == {"source_route": "set"}


# -- sockets ----------------------------------------------------------------------------------

def test_only_inet_stream_and_datagram_sockets_and_socketpairs_can_be_made() -> None:
    checks = [["unix_socket"], ["raw_socket"], ["socketpair"], ["listen"]]
    assert run_app(NET, checks, policy("*:443")) == {
        "unix_socket": "EPERM", "raw_socket": "EPERM", "socketpair": "hi", "listen": "EPERM"}


def test_without_net_grants_no_inet_socket_can_be_made() -> None:
    assert run_app(BARE, [["connect", "127.0.0.1", 9], ["socketpair"]]) == {
        "connect": "EPERM", "socketpair": "hi"}


def test_udp_binds_only_to_a_port_the_kernel_picks(granted: Listener) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    results = run_app(NET, [["udp_bind", free]], policy(granted.grant))
    assert results == {"udp_bind": "EPERM"}
    assert run_app(NET, [["udp_bind", 0]], policy(granted.grant))["udp_bind"] > 0


def test_no_abstract_unix_name_can_be_bound(granted: Listener) -> None:
    assert run_app(NET, [["abstract_bind"]], policy(granted.grant)) == {"abstract_bind": "EPERM"}
    assert run_app(BARE, [["abstract_bind"]]) == {"abstract_bind": "EPERM"}
    assert run_app({}, [["abstract_bind"]]) == {"abstract_bind": "bound"}


def test_listen_needs_a_listen_grant() -> None:
    assert run_app({**BARE, "listen": True}, [["listen"]]) == {"listen": "listening"}


# -- processes ----------------------------------------------------------------------------------

def test_fork_is_denied_without_processes() -> None:
    assert run_app(BARE, [["fork"]]) == {"fork": "EPERM"}


def test_processes_counts_live_children() -> None:
    results = run_app({**BARE, "processes": 1}, [["fork_two"]], processes=1)
    assert results == {"fork_two": ["first", "EAGAIN", "third"]}


def test_a_started_process_is_held_by_the_same_rules(granted: Listener,
                                                      other_address: Listener) -> None:
    checks = [["fork_connect", granted.host, granted.port],
              ["fork_two"], ["fork_connect", other_address.host, other_address.port]]
    results = run_app({**NET, "processes": 1}, checks, policy(granted.grant), processes=1)
    assert results == {"fork_connect": "EPERM", "fork_two": ["first", "EAGAIN", "third"]}


def test_a_started_process_connects_to_a_granted_address(granted: Listener) -> None:
    results = run_app({**NET, "processes": 1}, [["fork_connect", granted.host, granted.port]],
                      policy(granted.grant), processes=1)
    assert results == {"fork_connect": "ping"}


def test_execve_is_denied_without_run() -> None:
    assert run_app(BARE, [["execve"]]) == {"execve": "EPERM"}


# -- undoing the rules ------------------------------------------------------------------------

@pytest.mark.parametrize("check", ["ptrace", "prctl_seccomp", "prctl_seccomp_high_bits",
                                   "prctl_dumpable", "seccomp_syscall", "unshare", "setns",
                                   "chroot", "landlock", "setrlimit_raise", "io_uring",
                                   "sysv_ipc", "posix_mq"])
def test_calls_that_would_undo_or_step_around_the_rules_are_denied(check: str) -> None:
    assert run_app(BARE, [[check]]) == {check: "EPERM"}


def test_the_same_calls_work_without_the_filter() -> None:
    # The checks above can fail: unfiltered, these succeed (this process is root).
    results = run_app({}, [["prctl_dumpable"], ["landlock"], ["setrlimit_raise"], ["io_uring"],
                           ["fork"]])
    assert results["prctl_dumpable"] == 0 and results["setrlimit_raise"] == "raised"
    assert results["landlock"] > 0 and results["io_uring"] > 0 and results["fork"] == 1


def test_a_call_of_another_abi_kills_the_whole_process_not_only_its_thread() -> None:
    done = subprocess.run([sys.executable, APP, json.dumps(BARE),
                           json.dumps([["foreign_abi_in_a_thread"]])],
                          capture_output=True, text=True, env=subprocess_env(), cwd=ROOT,
                          timeout=60)
    assert done.returncode == -signal.SIGSYS, done
    assert "survived" not in done.stdout


@pytest.fixture
def bystander() -> Iterator[int]:
    """A process of the same user that no child started (it stands for the worker)."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


HOWS = ["nice", "affinity", "policy", "io priority"]


@pytest.mark.parametrize("how", HOWS)
def test_the_scheduling_of_another_process_cannot_be_changed(how: str, bystander: int) -> None:
    assert run_app(BARE, [["schedule", how, bystander]]) == {"schedule": "EPERM"}
    assert run_app({**BARE, "processes": 1}, [["schedule", how, bystander]],
                   processes=1) == {"schedule": "EPERM"}
    assert run_app({}, [["schedule", how, bystander]]) == {"schedule": "changed"}


@pytest.mark.parametrize("how", HOWS)
def test_the_scheduling_of_the_childs_own_threads_and_processes_can_be_changed(how: str) -> None:
    checks = [["schedule", how, "thread"], ["schedule", how, "child"]]
    results = run_app({**BARE, "processes": 1}, checks, processes=1)
    assert results == {"schedule": "changed"}  # both: the later overwrites the first
    assert run_app({**BARE, "processes": 1}, checks[:1], processes=1) == {"schedule": "changed"}


def test_threads_and_harmless_prctls_still_work() -> None:
    assert run_app(BARE, [["threads"], ["prctl_name"], ["getrlimit"]])["threads"] == 5
    assert run_app(BARE, [["prctl_name"]]) == {"prctl_name": "renamed"}


def test_the_child_does_not_keep_its_listener(granted: Listener) -> None:
    results = run_app(NET, [["listener_closed"]], policy(granted.grant))
    assert results == {"listener_closed": "EBADF"}


# -- the filter's building blocks -------------------------------------------------------------

@pytest.mark.parametrize("allowed", [set(), {0}, {1, 15, 16}, {0xFFFFFFFF, 0x53564D41, 2}])
def test_outside_covers_exactly_the_values_not_allowed(allowed: set[int]) -> None:
    classes = outside(allowed)
    samples = set(range(70)) | allowed | {0x53564D40, 0x53564D42, 0xFFFFFFFE, 1 << 31}
    for value in samples:
        hit = any(value & mask == match for mask, match in classes)
        assert hit == (value not in allowed), hex(value)


# -- robustness -------------------------------------------------------------------------------

@pytest.fixture
def unanswered() -> Iterator[int]:
    """A port whose listener's one-slot backlog is full: it drops further handshakes."""
    with socket.socket() as stuck:
        stuck.bind(("127.0.0.1", 0))
        stuck.listen(0)
        with socket.create_connection(stuck.getsockname()):
            yield stuck.getsockname()[1]


def test_a_child_cannot_exhaust_the_workers_descriptors_with_waiting_calls(
        unanswered: int) -> None:
    results = run_app(NET, [["many_waiting_connects", "127.0.0.1", unanswered, 80, 64]],
                      policy(f"127.0.0.1:{unanswered}"))
    assert results == {"many_waiting_connects": ["EAGAIN"]}


def _supervisor_fds() -> list[str]:
    """What the supervisor opens per child: pidfds, listeners, /proc/<pid>/mem."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if "pidfd" in target or "seccomp" in target or target.endswith("/mem"):
                found.append(target)
    return found


def test_a_child_killed_while_its_connect_waits_leaves_the_supervisor_serving(
        granted: Listener) -> None:
    # A listener whose one-slot backlog is full drops further handshakes: connect waits.
    stuck = socket.socket()
    stuck.bind(("127.0.0.1", 0))
    stuck.listen(0)
    filler = socket.create_connection(stuck.getsockname())
    port = stuck.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, APP, json.dumps(NET), json.dumps([["connect", "127.0.0.1", port]])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=subprocess_env(), cwd=ROOT)
    assert process.stdin is not None and process.stdout is not None
    try:
        hello = json.loads(process.stdout.readline())
        supervisor().attach(hello["pid"], hello["fd"], policy(f"127.0.0.1:{port}"), 0)
        process.stdin.write("attached\n")
        process.stdin.flush()
        connect = str(syscall_number("connect"))

        def in_connect() -> bool:
            with open(f"/proc/{process.pid}/syscall") as file:
                return file.read().split()[0] == connect

        # the child waits in connect (its answer waits for the handshake); others are served
        wait_until(in_connect, what="the child waiting in connect")
        results = run_app(NET, [["connect", granted.host, granted.port]], policy(granted.grant))
        assert results == {"connect": "ping"}
        assert process.poll() is None
    finally:
        process.kill()
        process.communicate()
        supervisor().detach(process.pid)
        filler.close()
        stuck.close()
    assert _supervisor_fds() == []
    assert run_app(NET, [["connect", granted.host, granted.port]],
                   policy(granted.grant)) == {"connect": "ping"}


def test_attach_refuses_a_descriptor_that_is_not_a_listener() -> None:
    process = subprocess.Popen([sys.executable, APP, json.dumps(BARE), "[]"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=subprocess_env(), cwd=ROOT)
    try:
        assert process.stdout is not None
        json.loads(process.stdout.readline())
        with pytest.raises(OSError, match="not a seccomp listener"):
            supervisor().attach(process.pid, 0, policy(), 0)
        assert process.pid not in supervisor().attached()
    finally:
        process.communicate("\n", timeout=60)
    assert _supervisor_fds() == []


def test_detach_closes_what_attach_opened(granted: Listener) -> None:
    assert run_app(NET, [["connect", granted.host, granted.port], ["fork"]],
                   policy(granted.grant)) == {"connect": "ping", "fork": "EPERM"}
    assert _supervisor_fds() == []


# -- the address policy -----------------------------------------------------------------------

@pytest.mark.parametrize(("entry", "canonical"), [
    ("127.0.0.1:8080", "127.0.0.1:8080"), ("Example.COM:443", "example.com:443"),
    ("[::1]:443", "[::1]:443"), ("10.0.0.0/8:6379", "10.0.0.0/8:6379"),
    ("[2001:db8::/32]:443", "[2001:db8::/32]:443"), ("*:443", "*:443"),
])
def test_net_grants_parse(entry: str, canonical: str) -> None:
    assert NetPolicy.from_grants([entry]).grants == (canonical,)


@pytest.mark.parametrize(("entry", "message"), [
    ("127.0.0.1", "needs an address and a port"), ("127.0.0.1:0", "from 1 to 65535"),
    ("host:http", "from 1 to 65535"), ("::1:443", "in brackets"),
    ("10.0.0.1/8:443", "host bits set; write the network, 10.0.0.0/8"),
    ("[127.0.0.1]:443", "brackets are for IPv6"), ("bad host:443", "is not a host name"),
    ("1.2.3:443", "not an IP address"),
])
def test_bad_net_grants_say_what_is_wrong_in_one_line(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        NetPolicy.from_grants([entry])
    assert "\n" not in str(info.value) and repr(entry) in str(info.value)


def test_a_policy_crosses_the_wire_unchanged() -> None:
    net = NetPolicy.from_grants(["127.0.0.1:1", "localhost:2", "*:3", "[::1]:4"])
    again = NetPolicy.from_wire(json.loads(json.dumps(net.to_wire())))
    assert again.grants == net.grants and again.to_wire() == net.to_wire()


def test_allows_holds_by_address_and_port() -> None:
    net = NetPolicy.from_wire({"grants": ["127.0.0.1:80", "10.0.0.0/8:443", "*:22",
                                          "localhost:8080"], "resolvers": ["127.0.0.53"]})
    assert net.allows("127.0.0.1", 80, udp=False)
    assert not net.allows("127.0.0.2", 80, udp=False)
    assert not net.allows("127.0.0.1", 81, udp=False)
    assert not net.allows("127.0.0.1", 80, udp=True)
    assert net.allows("10.1.2.3", 443, udp=False) and not net.allows("11.0.0.1", 443, udp=False)
    assert net.allows("192.0.2.1", 22, udp=False)
    assert net.allows("::ffff:127.0.0.1", 80, udp=False)
    assert net.allows("127.0.0.1", 8080, udp=False)
    assert not net.allows("127.0.0.2", 8080, udp=False)
    assert net.allows("127.0.0.53", 53, udp=True) and net.allows("127.0.0.53", 53, udp=False)
    assert not net.allows("127.0.0.53", 54, udp=True) and not net.allows("8.8.8.8", 53, udp=True)
    assert net.ports() == {80, 443, 22, 8080, 53}


def test_without_a_host_grant_the_resolver_is_not_reachable() -> None:
    net = NetPolicy.from_wire({"grants": ["127.0.0.1:80"], "resolvers": ["127.0.0.53"]})
    assert not net.allows("127.0.0.53", 53, udp=True)
    assert net.ports() == {80}


def test_allows_literal_says_when_only_resolving_could_tell() -> None:
    net = NetPolicy.from_wire({"grants": ["127.0.0.1:80", "example.com:443"], "resolvers": []})
    assert net.allows_literal("127.0.0.1", 80) is True
    assert net.allows_literal("127.0.0.2", 80) is False
    assert net.allows_literal("192.0.2.1", 443) is None
    assert net.allows_literal("192.0.2.1", 6379) is False
    assert net.allows_literal("example.com", 443) is None
