"""panqueue.testing works the way a user runs it: pytest in a child process, on a user's test file.

The user's tests use ``panqueue_url`` and ``run_worker`` on asyncio and trio; the child pytest
must pass them all, flush the database between tests, and stop its server at the end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import ROOT, subprocess_env

USER_TESTS = '''
import os
from pathlib import Path

import anyio
import pytest
import redis

from panqueue import Fail, Job, QueueClient, Registry, TimeoutError
from panqueue.testing import drain, run_worker

pytestmark = pytest.mark.anyio

queues = Registry()


@queues.handler("emails", concurrency=4)
async def send_email(job: Job) -> dict[str, str]:
    if job.data["to"] == "nobody":
        raise Fail("no such recipient")
    await anyio.sleep(0.01)
    return {"sent": job.data["to"]}


async def test_handler_runs_on_a_real_server(panqueue_url: str) -> None:
    async with run_worker(queues, "emails", panqueue_url) as worker:
        async with QueueClient(panqueue_url) as client:
            job = await client.queue("emails").add({"to": "ada@example.com"})
            assert await job.result(timeout=10) == {"sent": "ada@example.com"}
    assert worker.processed == 1


async def test_drain_returns_the_counts(panqueue_url: str) -> None:
    async with QueueClient(panqueue_url) as client:
        queue = client.queue("emails")
        for to in ("a", "b", "c", "nobody"):
            await queue.add({"to": to})
        async with run_worker(queues, "emails", panqueue_url, concurrency=2):
            counts = await drain(panqueue_url, "emails", timeout=10)
    assert counts["completed"] == 3
    assert counts["failed"] == 1


async def test_drain_times_out_without_a_worker(panqueue_url: str) -> None:
    async with QueueClient(panqueue_url) as client:
        await client.queue("emails").add({"to": "a"})
    with pytest.raises(TimeoutError, match="not drained after 0.2 s"):
        await drain(panqueue_url, "emails", timeout=0.2)


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_an_empty_database(panqueue_url: str, panqueue_server, run) -> None:
    # The second run would see the key of the first if the database were not flushed.
    client = redis.Redis.from_url(panqueue_url)
    assert client.dbsize() == 0
    client.set("left-behind", 1)
    client.close()
    assert panqueue_url == panqueue_server.url
    assert panqueue_url.startswith("redis://127.0.0.1:")
    assert not panqueue_url.startswith("redis://127.0.0.1:6379/")
    Path(os.environ["PID_FILE"]).write_text(str(panqueue_server.pid))
'''

CONFTEST = '''
import pytest
{plugins}

@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param
'''


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.mark.parametrize("enable", ["-p", "pytest_plugins"])
def test_user_tests_pass_with_the_plugin(tmp_path: Path, enable: str) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    plugins = 'pytest_plugins = ["panqueue.testing"]' if enable == "pytest_plugins" else ""
    (project / "conftest.py").write_text(textwrap.dedent(CONFTEST.format(plugins=plugins)))
    pid_file = tmp_path / "server.pid"
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if enable == "-p":
        args += ["-p", "panqueue.testing"]
    args.append(str(project / "test_user.py"))
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=project,
                          env=subprocess_env(PID_FILE=str(pid_file)))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    # 3 async tests x 2 backends, and the sync test twice.
    assert re.search(r"\b8 passed\b", output), output
    server_pid = int(pid_file.read_text())
    assert not pid_alive(server_pid), "the session server is still running after pytest"


def test_without_the_plugin_the_fixtures_are_missing(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text("def test_x(panqueue_url):\n    pass\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(tmp_path / "test_user.py")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=subprocess_env())
    assert proc.returncode != 0
    assert "fixture 'panqueue_url' not found" in proc.stdout


def test_the_helpers_import_without_pytest() -> None:
    code = ("import sys; sys.modules['pytest'] = None\n"
            "import panqueue.testing as t\n"
            "assert not hasattr(t, 'panqueue_url')\n"
            "print(t.run_worker.__name__, t.drain.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["run_worker", "drain"]
