"""Permissions of subprocess handlers: what registration refuses, a confined child that does
its granted work, a few of the reads it is refused (tests/test_permissions_escapes.py tries
every escape), and fail closed on a host without Landlock, on asyncio and trio.

The host without Landlock is real to the worker: tests/no_landlock.py starts it under a seccomp
filter that makes the Landlock system calls fail with ENOSYS, as a kernel without Landlock does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from panqueue import ConfigError, JobFailed, Limits, Permissions, QueueClient, Registry
from panqueue._sandbox.policy import child_env, runtime_paths
from panqueue._sandbox.probe import support
from panqueue.testing import run_worker
from tests.helpers import APPS, ROOT, capture_panqueue_logs, panqueue_command, subprocess_env

sys.path.insert(0, str(APPS))
import perm_app

# ----------------------------------------------------------------------------- registration


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"read": ["data"]}, "Permissions.read entries must be absolute paths, got 'data'"),
    ({"write": "/tmp"}, "Permissions.write must be a list of paths"),
    ({"run": ["bin/tool"]}, "Permissions.run entries must be absolute paths or program names"),
    ({"net": ["example.com"]}, "expected 'host:port'"),
    ({"net": ["example.com:0"]}, "the port must be a number from 1 to 65535"),
    ({"net": ["example.com:https"]}, "the port must be a number from 1 to 65535"),
    ({"net": ["::1:443"]}, "write an IPv6 address in brackets"),
    ({"net": ["[10.0.0.1]:443"]}, "brackets are for IPv6 addresses only"),
    ({"net": ["bad host:443"]}, "is not a host name, an address or a network"),
    ({"listen": [0]}, "Permissions.listen entries must be ports"),
    ({"listen": ["8080"]}, "Permissions.listen entries must be ports"),
    ({"env": ["A=B"]}, "Permissions.env entries must be variable names or globs"),
    ({"processes": -1}, "Permissions.processes must be an int >= 0"),
    ({"processes": True}, "Permissions.processes must be an int >= 0"),
    ({"on_unsupported": "ignore"}, "Permissions.on_unsupported must be 'fail' or 'warn'"),
    ({"run": ["/bin/echo"]}, "Permissions.run needs processes >= 1"),
])
def test_permissions_refuse_bad_grants(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Permissions(**kwargs)
    assert message in str(refused.value)


def test_permissions_accept_every_net_form_and_normalise_paths() -> None:
    perms = Permissions(read=["/srv/in/", Path("/srv/other")], write=["/tmp/out"],
                        net=["s3.eu-west-1.amazonaws.com:443", "10.0.0.5:6379", "[::1]:8080",
                             "10.0.0.0/8:443", "[fd00::/8]:443", "*:80"],
                        listen=[8000], env=["AWS_*"], processes=2)
    assert perms.read == ("/srv/in", "/srv/other")
    assert perms.net_ports() == {443, 6379, 8080, 80}
    # The worker's address policy reads the same grants the same way (and adds the
    # resolver's TCP port, for answers too long for UDP).
    from panqueue._sandbox.net import NetPolicy

    assert NetPolicy.from_grants(perms.net).ports() - {53} == {443, 6379, 8080, 80}


def test_permissions_need_the_subprocess_executor() -> None:
    registry = Registry()
    with pytest.raises(ConfigError, match="apply to executor='subprocess' only"):
        registry.handler("q", executor="thread", permissions=Permissions())(perm_app.read)
    with pytest.raises(ConfigError, match="apply to executor='subprocess' only"):
        registry.handler("q2", permissions=Permissions())(perm_app.read)


def test_permissions_take_the_environment_in_their_own_env() -> None:
    with pytest.raises(ConfigError, match=r"Permissions\(env=\.\.\.\)"):
        Registry().handler("q", executor="subprocess", env=["HOME"],
                           permissions=Permissions())(perm_app.read)


def test_permissions_keep_the_child_in_a_session_of_its_own() -> None:
    with pytest.raises(ConfigError, match="new_session=False cannot go with permissions="):
        Registry().handler("q", executor="subprocess", new_session=False,
                           permissions=Permissions())(perm_app.read)


def test_run_programs_resolve_at_registration(tmp_path: Path) -> None:
    registry = Registry()
    handler = registry.handler("q", executor="subprocess",
                               permissions=Permissions(run=["sh"], processes=1))(perm_app.read)
    [program] = handler.options.permissions.run  # type: ignore[union-attr]
    assert os.path.isabs(program) and os.path.basename(program) == "sh"
    with pytest.raises(ConfigError, match="run program 'no-such-program-xyz' is not on PATH"):
        Registry().handler("q", executor="subprocess", permissions=Permissions(
            run=["no-such-program-xyz"], processes=1))(perm_app.read)
    (tmp_path / "data").write_text("")
    with pytest.raises(ConfigError, match="is not an executable file"):
        Registry().handler("q", executor="subprocess", permissions=Permissions(
            run=[str(tmp_path / "data")], processes=1))(perm_app.read)


def test_child_environment_comes_from_the_env_globs_and_tmpdir_from_the_first_write() -> None:
    environ = {"AWS_REGION": "eu", "AWS_SECRET_KEY": "s", "HOME": "/root", "PATH": "/bin",
               "TMPDIR": "/tmp"}
    perms = Permissions(env=["AWS_*", "PATH"], write=["/srv/out", "/srv/other"])
    assert child_env(perms, environ) == {"AWS_REGION": "eu", "AWS_SECRET_KEY": "s",
                                         "PATH": "/bin", "TMPDIR": "/srv/out"}
    assert child_env(Permissions(), environ) == {}


def test_runtime_set_holds_the_interpreter_and_not_the_project() -> None:
    paths = runtime_paths()
    assert os.path.dirname(os.__file__) in paths
    assert "/etc" not in paths and "/" not in paths
    assert not any(path == str(ROOT) or path == str(APPS) or str(APPS).startswith(path + "/")
                   for path in paths)


def test_probe_reports_what_is_missing_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from panqueue._sandbox import probe

    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    found = probe.support.__wrapped__()
    assert found.missing(Permissions()) == [
        "not Linux (the rules are Landlock and seccomp, Linux kernel features)"]


def test_probe_finds_what_this_host_offers() -> None:
    found = support()
    assert found.linux and found.landlock_abi >= 1
    if found.landlock_abi >= 6:
        assert found.missing(Permissions(net=["127.0.0.1:1"], processes=1)) == []


# ----------------------------------------------------------------------------- confined child

# Skipped only where the kernel lacks what permissions need (panqueue's own pieces must be there).
needs_enforcement = pytest.mark.skipif(
    support().landlock_abi < 6, reason=f"this host cannot enforce permissions: "
                                       f"{'; '.join(support().missing())}")


@pytest.fixture
def grants(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "in" / "source.txt").write_text("granted\n")
    (tmp_path / "secret.txt").write_text("not granted\n")
    yield tmp_path


def confined_registry(base: Path, **extra: Any) -> Registry:
    registry = Registry()
    perms = Permissions(read=[str(base / "in")], write=[str(base / "out")], env=["LANG"],
                        **extra)
    registry.handler("transform", executor="subprocess", permissions=perms)(perm_app.transform)
    registry.handler("read", executor="subprocess", permissions=perms)(perm_app.read)
    registry.handler("listdir", executor="subprocess", permissions=perms)(perm_app.listdir)
    return registry


async def outcome(url: str, registry: Registry, queue: str, data: Any) -> Any:
    """The job's result, or the JobFailed it ended with."""
    async with QueueClient(url) as client, run_worker(registry, queue, url):
        handle = await client.queue(queue).add(data)
        try:
            return await handle.result(timeout=30)
        except JobFailed as failed:
            return failed


@needs_enforcement
@pytest.mark.anyio
async def test_confined_handler_does_its_granted_work(redis_url: str, grants: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    result = await outcome(redis_url, confined_registry(grants), "transform", {
        "src": str(grants / "in" / "source.txt"), "dst": str(grants / "out" / "copy.txt")})
    assert not isinstance(result, JobFailed), result
    assert (grants / "out" / "copy.txt").read_text() == "GRANTED\n"
    assert result["tmp"] == str(grants / "out")
    assert result["cas"] > 0  # the system's CA certificates are readable
    assert result["sum"] == "0.3" and result["tz"] == "Europe/Paris"
    assert set(result["env"]) <= {"LANG", "TMPDIR", "LC_CTYPE"}
    # No descriptor of the worker: stdin is /dev/null, stdout and stderr a pipe the worker
    # relays, and the two protocol pipes.
    fds = result["fds"]
    assert fds["0"] == "/dev/null" and fds["1"] == fds["2"] and fds["2"].startswith("pipe:")
    assert len(fds) == 5 and all(t.startswith("pipe:") for k, t in fds.items() if k != "0")
    assert "transform done" in capfd.readouterr().err


@needs_enforcement
@pytest.mark.anyio
@pytest.mark.parametrize("target", ["/etc/shadow", "project", "module", "secret", "worker",
                                    "root link", "sockets"])
async def test_confined_handler_cannot_read_outside_its_grants(redis_url: str, grants: Path,
                                                               target: str) -> None:
    path = {"/etc/shadow": "/etc/shadow", "project": str(ROOT / "pyproject.toml"),
            "module": perm_app.__file__, "secret": str(grants / "secret.txt"),
            "worker": "WORKER_ENVIRON", "root link": "/proc/self/root/etc/shadow",
            "sockets": "/proc/self/net/tcp"}[target]
    registry = confined_registry(grants)
    async with QueueClient(redis_url) as client, run_worker(registry, "read", redis_url):
        denied = await client.queue("read").add({"path": path})
        with pytest.raises(JobFailed) as failed:
            await denied.result(timeout=30)
        # The worker keeps serving: a granted read on the same worker completes.
        allowed = await client.queue("read").add({"path": str(grants / "in" / "source.txt")})
        assert await allowed.result(timeout=30) == "granted\n"
    error = failed.value.error
    assert error is not None and error.type == "PermissionError", error
    shown = f"/proc/{os.getpid()}/environ" if target == "worker" else path
    assert shown in error.message


@needs_enforcement
@pytest.mark.anyio
async def test_confined_handler_cannot_list_the_worker_directory(redis_url: str,
                                                                 grants: Path) -> None:
    failed = await outcome(redis_url, confined_registry(grants), "listdir", {"path": str(ROOT)})
    assert isinstance(failed, JobFailed) and failed.error is not None
    assert failed.error.type == "PermissionError"


@needs_enforcement
@pytest.mark.anyio
@pytest.mark.parametrize("how", ["path", "fd"])
async def test_confined_handler_cannot_change_a_files_mode(redis_url: str, grants: Path,
                                                           how: str) -> None:
    """Landlock does not cover metadata: without the filter, a child running as the file's
    owner could make any of its files world-readable."""
    victim = grants / "secret.txt"
    victim.chmod(0o600)
    registry = confined_registry(grants)
    registry.handler("chmod", executor="subprocess", permissions=Permissions(
        read=[str(grants)]))(perm_app.chmod)
    failed = await outcome(redis_url, registry, "chmod", {"path": str(victim), "fd": how == "fd"})
    assert isinstance(failed, JobFailed) and failed.error is not None
    assert failed.error.type == "PermissionError"
    assert ("changing the mode" if how == "path" else str(victim)) in failed.error.message
    assert victim.stat().st_mode & 0o777 == 0o600


@needs_enforcement
@pytest.mark.anyio
async def test_a_grant_of_a_path_that_does_not_exist_is_logged(redis_url: str,
                                                               grants: Path) -> None:
    registry = Registry()
    absent = str(grants / "not-yet")
    registry.handler("read", executor="subprocess", permissions=Permissions(
        read=[str(grants / "in")], write=[absent]))(perm_app.read)
    with capture_panqueue_logs() as logs:
        assert await outcome(redis_url, registry, "read",
                             {"path": str(grants / "in" / "source.txt")}) == "granted\n"
    warnings = [e for e in logs if e["event"].startswith("permissions grant paths")]
    assert len(warnings) == 1 and warnings[0]["paths"] == [absent]


@needs_enforcement
@pytest.mark.anyio
async def test_code_run_on_import_is_held_by_the_rules(redis_url: str) -> None:
    """The handler's module is imported inside the rules' first layer: a dependency that
    reads a secret when imported is refused too, and so is one that sends a datagram out or
    starts a process of a session of its own (which outlived the child): the seccomp filter
    held only from after the import."""
    import perm_import_app

    registry = Registry()
    registry.handler("import", executor="subprocess",
                     permissions=Permissions())(perm_import_app.secret)
    result = await outcome(redis_url, registry, "import", None)
    assert result == ["denied: [Errno 13] Permission denied: '/etc/shadow'",
                      *["denied: [Errno 1] Operation not permitted"] * 4]


@needs_enforcement
@pytest.mark.anyio
async def test_confined_async_handler_runs_its_event_loop(redis_url: str, grants: Path) -> None:
    registry = Registry()
    registry.handler("async", executor="subprocess", permissions=Permissions(
        read=[str(grants / "in")]))(perm_app.read_async)
    assert await outcome(redis_url, registry, "async",
                         {"path": str(grants / "in" / "source.txt")}) == "granted\n"


@needs_enforcement
@pytest.mark.anyio
async def test_confined_child_keeps_its_cpu_limit_per_job(redis_url: str, grants: Path) -> None:
    """The child may not raise its own limits: the worker sets each job's CPU budget."""
    registry = Registry()
    registry.handler("spin", executor="subprocess", limits=Limits(cpu_seconds=1),
                     permissions=Permissions())(perm_app.spin)
    failed = await outcome(redis_url, registry, "spin", None)
    assert isinstance(failed, JobFailed) and failed.error is not None
    assert "child exceeded CPU limit 1 s (SIGXCPU)" in failed.error.message


@needs_enforcement
@pytest.mark.anyio
async def test_confined_child_connects_only_where_granted(redis_url: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        registry = Registry()
        registry.handler("connect", executor="subprocess", permissions=Permissions(
            net=[f"127.0.0.1:{port}"]))(perm_app.connect)
        async with QueueClient(redis_url) as client, run_worker(registry, "connect", redis_url):
            queue = client.queue("connect")
            granted = await queue.add({"host": "127.0.0.1", "port": port})
            assert await granted.result(timeout=30) == "connected"
            redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
            failures = []
            # A literal address (refused in Python first), then a name (refused by the kernel
            # and the worker's supervisor, which names the address).
            for host in ("127.0.0.1", "localhost"):
                denied = await queue.add({"host": host, "port": redis_port})
                with pytest.raises(JobFailed) as failed:
                    await denied.result(timeout=30)
                failures.append(failed.value.error)
    for error in failures:
        assert error is not None and error.type == "PermissionError", error
        assert f"127.0.0.1:{redis_port}" in error.message, error.message


@needs_enforcement
@pytest.mark.anyio
async def test_confined_child_runs_only_granted_programs(redis_url: str) -> None:
    registry = Registry()
    registry.handler("run", executor="subprocess", permissions=Permissions(
        run=["echo"], processes=1, env=["PATH"]))(perm_app.run)
    async with QueueClient(redis_url) as client, run_worker(registry, "run", redis_url):
        queue = client.queue("run")
        granted = await queue.add({"argv": ["echo", "hello"]})
        assert await granted.result(timeout=30) == "hello\n"
        denied = await queue.add({"argv": ["cat", "/etc/hostname"]})
        with pytest.raises(JobFailed) as failed:
            await denied.result(timeout=30)
    error = failed.value.error
    assert error is not None and error.type == "PermissionError"
    assert "permissions deny running cat" in error.message


@needs_enforcement
@pytest.mark.anyio
async def test_a_granted_script_runs_with_its_interpreter(redis_url: str, tmp_path: Path) -> None:
    script = tmp_path / "tool.sh"
    script.write_text("#!/bin/sh\necho script ran\n")
    script.chmod(0o755)
    registry = Registry()
    registry.handler("script", executor="subprocess", permissions=Permissions(
        run=[str(script)], processes=1))(perm_app.run)
    assert await outcome(redis_url, registry, "script", {"argv": [str(script)]}) == \
        "script ran\n"


# ----------------------------------------------------------------------------- fail closed


def run_worker_without_landlock(tmp_path: Path, redis_url: str, queue: str
                                ) -> subprocess.Popen[bytes]:
    """``panqueue worker perm_app:queues QUEUE`` on what looks to it like a host without
    Landlock; stderr goes to tmp_path/worker.err."""
    env = subprocess_env(PERM_APP_DIR=str(tmp_path))
    err = (tmp_path / "worker.err").open("wb")
    with err:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "no_landlock.py"),
             *panqueue_command("worker", "perm_app:queues", "-q", queue, "--url", redis_url)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)


def test_worker_refuses_a_queue_it_cannot_confine(tmp_path: Path, redis_url: str) -> None:
    worker = run_worker_without_landlock(tmp_path, redis_url, "perm-read")
    try:
        code = worker.wait(timeout=60)
    finally:
        worker.kill()
    err = (tmp_path / "worker.err").read_text()
    assert code != 0, err
    lines = [line for line in err.splitlines() if "permissions cannot be enforced" in line]
    assert len(lines) == 1, err
    assert "'perm-read'" in lines[0] and "Landlock is not available (ENOSYS)" in lines[0]


def test_warn_runs_unconfined_with_one_warning_per_child(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a").write_text("")
    worker = run_worker_without_landlock(tmp_path, redis_url, "perm-warn")
    try:
        with QueueClientSync(redis_url) as client:
            for _ in range(2):  # one child (concurrency 1) runs both
                assert client.run("perm-warn", {"path": str(ROOT / "tests" / "apps")})
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    err = (tmp_path / "worker.err").read_text()
    warnings = [line for line in err.splitlines() if "permissions not enforced" in line]
    assert len(warnings) == 1, err
    assert "Landlock is not available (ENOSYS)" in warnings[0]


class QueueClientSync:
    """Adds a job with the sync client and waits for its result."""

    def __init__(self, url: str) -> None:
        from panqueue import SyncQueueClient

        self._client = SyncQueueClient(url)

    def __enter__(self) -> QueueClientSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def run(self, queue: str, data: Any) -> Any:
        return self._client.queue(queue).add(data).result(timeout=60)
