"""``panqueue check-permissions MODULE:ATTR [-q QUEUE]``, run as a real command: the grants of
each sandboxed queue and whether this host enforces them (exit 0), what is missing where it
does not (exit 1, shown on a real route: the command run under tests/no_landlock.py, a
seccomp filter that makes the Landlock system calls fail as on a kernel without Landlock), and
one error line for bad input (exit 2)."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import pytest

from tests.helpers import ROOT, panqueue_command, run_cli, subprocess_env

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux's")

APP = "permissions_cli_app:queues"


def landlock_abi() -> int:
    """Landlock's ABI version as the kernel reports it (0: none), asked without panqueue."""
    if platform.machine() not in ("x86_64", "aarch64"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    version = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, VERSION)
    return max(version, 0)


# The "enforced" answers need a kernel that enforces; the "NOT enforced" ones run anywhere.
needs_landlock = pytest.mark.skipif(landlock_abi() < 6, reason="this kernel lacks Landlock ABI 6")


def run_without_landlock(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(ROOT / "tests" / "no_landlock.py"), *panqueue_command(*args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env=subprocess_env(), cwd=ROOT)


def blocks(stdout: str) -> dict[str, list[str]]:
    """The report's block of each queue, by queue name (its first line's first word)."""
    found = {}
    for block in stdout.strip().split("\n\n"):
        lines = block.splitlines()
        found[lines[0].split()[0]] = lines
    return found


@needs_landlock
def test_every_sandboxed_queue_with_its_grants_enforced_here() -> None:
    proc = run_cli("check-permissions", APP)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    report = blocks(proc.stdout)
    assert sorted(report) == ["perm-files", "perm-net", "perm-warn"]  # not "plain"
    files = report["perm-files"]
    assert files[0] == "perm-files (permissions_cli_app:files)"
    assert [line.split(None, 1) for line in files[1:]] == [
        ["read", "/usr/share"], ["write", "/tmp"], ["net", "none"], ["listen", "none"],
        ["env", "LANG, APP_*"], ["run", "none"], ["processes", "0"], ["enforced"]]
    net = report["perm-net"]
    assert "  net        127.0.0.1:6399, *:443" in net
    assert "  listen     8099" in net
    assert any(line.startswith("  run ") and line.endswith("/true") for line in net)
    assert "  processes  2" in net
    assert net[-1] == "  enforced"
    assert "NOT" not in proc.stdout


@needs_landlock
def test_one_queue_with_q() -> None:
    proc = run_cli("check-permissions", APP, "-q", "perm-net")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(blocks(proc.stdout)) == ["perm-net"]


def test_not_enforced_on_a_host_without_landlock_exits_1_naming_what_is_missing() -> None:
    proc = run_without_landlock("check-permissions", APP)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = blocks(proc.stdout)
    assert sorted(report) == ["perm-files", "perm-net", "perm-warn"]
    for queue, lines in report.items():
        verdict = lines[-1]
        assert verdict.startswith("  NOT enforced: "), (queue, lines)
        assert "Landlock" in verdict, verdict
    assert report["perm-files"][-1].endswith("(the worker refuses to serve it)")
    assert report["perm-warn"][-1].endswith("(the worker runs it unsandboxed, with a warning)")
    assert "  enforced" not in proc.stdout


def test_not_enforced_for_one_queue_with_q() -> None:
    proc = run_without_landlock("check-permissions", APP, "-q", "perm-warn")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert list(blocks(proc.stdout)) == ["perm-warn"]


def test_a_registry_without_sandboxed_queues_has_nothing_to_check() -> None:
    proc = run_cli("check-permissions", "permissions_cli_app:plain_only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "no queue of permissions_cli_app:plain_only has permissions\n"


@pytest.mark.parametrize(("args", "message"), [
    ((APP, "-q", "nope"), "unknown queue 'nope' (queues of permissions_cli_app:queues: "
                          "perm-files, perm-net, perm-warn, plain)"),
    ((APP, "-q", "perm-files", "-q", "plain"), "queue 'plain' has no permissions"),
    (("no_such_module:queues",), "cannot import module 'no_such_module'"),
    (("permissions_cli_app",), "expected MODULE:ATTR"),
    (("permissions_cli_app:nothing",), "has no attribute 'nothing'"),
], ids=["unknown-queue", "queue-without-permissions", "unknown-module", "no-attr", "bad-attr"])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    proc = run_cli("check-permissions", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("panqueue: error: ") and message in line, line
