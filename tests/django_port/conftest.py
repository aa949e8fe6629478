"""The ported suites' fixtures: Django configured from tests/django_project, the test session's
Redis, and one ``panqueue worker tests.django_port.worker:registry`` per test module, serving
the ``port`` backend's queue ``port``."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from panqueue import SyncQueueClient
from panqueue.embedded import RedisServer
from tests.django_setup import SETTINGS, configure_django
from tests.helpers import ROOT, panqueue_command, subprocess_env, wait_until


@pytest.fixture(scope="module")
def port_django(tmp_path_factory: pytest.TempPathFactory, panqueue_server: RedisServer
                ) -> Iterator[Path]:
    """Django set up in this process, on an emptied database of the session's server."""
    db = configure_django(tmp_path_factory, panqueue_server.url)
    connection = redis.Redis.from_url(panqueue_server.url)
    try:
        connection.flushdb()
    finally:
        connection.close()
    yield db


@pytest.fixture(scope="module")
def port_client(port_django: Path, panqueue_server: RedisServer
                ) -> Iterator[SyncQueueClient]:
    with SyncQueueClient(panqueue_server.url) as client:
        yield client


@pytest.fixture(scope="module")
def port_worker(port_django: Path, port_client: SyncQueueClient,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    """A real worker process for the module's tests (killed at the end)."""
    err_path = tmp_path_factory.mktemp("port-worker") / "worker.err"
    with err_path.open("wb") as err:
        process = subprocess.Popen(
            panqueue_command("worker", "tests.django_port.worker:registry", "--url",
                             port_client.url),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
            env=subprocess_env(DJANGO_SETTINGS_MODULE=SETTINGS, PQ_DJANGO_DB=str(port_django),
                               PANQUEUE_URL=port_client.url, PQ_DJANGO_ANY_QUEUE="1"))

    def serving() -> bool:
        if process.poll() is not None:
            raise AssertionError(err_path.read_text())
        return bool(port_client.workers("port"))

    try:
        wait_until(serving, timeout=20, what="the ported suites' worker to start")
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def finished(result: Any, timeout: float = 10.0) -> Any:
    """Wait until the worker has finished ``result``'s task (refreshing it); returns it."""
    def check() -> bool:
        result.refresh()
        return bool(result.is_finished)

    wait_until(check, timeout=timeout, what=f"task {result.id} to finish")
    return result


RunTask = Callable[[Any], Any]
