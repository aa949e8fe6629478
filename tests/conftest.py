"""Shared fixtures: a private Redis-compatible server per test session, on a free port.

Tests never touch a server they did not start. Each test gets an empty database and a fresh
queue name; runtime tests run on both anyio backends.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from panqueue.embedded import RedisServer
from tests.helpers import WorkerProcess

# Our own tests use the fixtures we ship to users: a private server per session (per xdist
# worker: each worker is a process of its own); tests/store_fixtures.py adds ``store``, one
# queue's scripts called directly.
pytest_plugins = ["panqueue.testing", "tests.store_fixtures"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--model-examples", type=int, default=30, metavar="N",
                     help="examples tests/test_model.py runs per backend (default 30)")
    parser.addoption("--long", action="store_true",
                     help="the long versions of the endurance tests (a 5-minute Redis outage)")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def redis_url(panqueue_url: str) -> str:
    """The session server's URL (panqueue.testing's private server), database emptied."""
    return panqueue_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A plain redis-py client for assertions on the raw data."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``panqueue worker cli_app:queues ARGS`` processes; each is killed at the end."""
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        worker = WorkerProcess(tmp_path, *args)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A server of this test's own, which the test may stop."""
    server = RedisServer().start()
    yield server
    server.cleanup()
