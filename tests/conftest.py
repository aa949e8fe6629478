"""Shared fixtures: a private Redis-compatible server per test session, on a free port.

Tests never touch a server they did not start. Each test gets an empty database and a fresh
queue name; runtime tests run on both anyio backends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from panqueue.embedded import RedisServer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(appendonly=False)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session server's URL, with an empty database for this test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A plain redis-py client for assertions on the raw data."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


def panqueue_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "panqueue", *args]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: the tests directory importable, no inherited URL."""
    env = {k: v for k, v in os.environ.items() if k != "PANQUEUE_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "apps"), str(ROOT)])
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(panqueue_command(*args), capture_output=True, text=True,
                          timeout=timeout, env=subprocess_env(**env), cwd=ROOT)
