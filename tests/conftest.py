"""Shared fixtures: a private Redis-compatible server per test session, on a free port.

Tests never touch a server they did not start. Each test gets an empty database and a fresh
queue name; runtime tests run on both anyio backends.

Parallel runs (pytest-xdist, ``-n 6 --dist loadgroup``, as scripts/test.sh runs them): each
worker is a process with its own session server, temp directories and environment. A test
module with a module-scoped fixture (a cluster, a Spark session, a built wheel) runs whole on
one worker, so that fixture is made once; every other test goes wherever a worker is free.
The slowest tests of the previous run (from pytest's cache) are handed out first, so that no
long test starts last.

``--long`` runs the full versions of the endurance tests (tests/bounds.py); every run has their
bounded versions.
"""

from __future__ import annotations

import functools
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

import tests.bounds
from panqueue._faultproxy import FaultProxy
from panqueue.embedded import RedisServer
from tests.helpers import ROOT, WorkerProcess

# Our own tests use the fixtures we ship to users: a private server per session (per xdist
# worker: each worker is a process of its own); tests/store_fixtures.py adds ``store``, one
# queue's scripts called directly.
pytest_plugins = ["panqueue.testing", "tests.store_fixtures", "tests.spark_fixtures"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--model-examples", type=int, default=None, metavar="N",
                     help="examples tests/test_model.py runs per backend (default 10; 30 "
                          "with --long)")
    parser.addoption("--long", action="store_true",
                     help="the full versions of the endurance tests (a 5-minute Redis outage, "
                          "every property test's full count of examples, the model's 30 "
                          "examples, a minute of torture); without it, bounded versions")


# Every JVM the tests start (the Spark session, the JVM examples, a killed export) lives well
# under a minute: with the client compiler alone and the serial collector one uses about 40 %
# less CPU than with the defaults (history_export.py: 21 s -> 12-14 s), which a run on two cores
# spends elsewhere. PySpark reads this when it starts a JVM; child processes inherit it.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS",
                          f"--driver-java-options '{JVM_OPTIONS}' pyspark-shell")
    # Before any test module is imported: modules read it in their @settings.
    tests.bounds.LONG = bool(config.getoption("--long"))
    if config.getoption("--model-examples") is None:
        config.option.model_examples = tests.bounds.examples(10, 30)


DURATIONS = "panqueue/durations"  # pytest cache: seconds per test id, from the last runs
# Where the cache has no figure yet (a fresh checkout): what these took on two busy cores.
KNOWN_SLOW = {
    "tests/test_torture.py::test_a_minute_of_chaos_loses_no_job_and_completes_none_twice": 80.0,
    "tests/test_model.py::test_the_system_matches_the_model": 60.0,
    "tests/test_long_outages.py::test_workers_claim_again_within_2_s": 45.0,
    "tests/test_script_machine.py::test_scripts_keep_the_queue_consistent": 20.0,
    "tests/test_integrity.py::test_dependency_graph_invariants_under_any_interleaving": 20.0,
    "tests/test_history.py": 20.0,
    "tests/test_spark.py": 20.0,
    "tests/test_spark_datasource.py": 40.0,
    "tests/test_examples.py::test_example_runs_against_the_url_in_panqueue_url[spark": 60.0,
    "tests/test_examples.py::test_example_runs_against_the_url_in_panqueue_url[history": 60.0,
    "tests/test_metrics.py::test_worker_and_exporter_count_every_outcome": 40.0,
    "tests/test_job_control.py::test_retention_bounds_a_stream_of_10000_jobs": 25.0,
}


def _seconds(nodeid: str, seconds: dict[str, float]) -> float:
    if nodeid in seconds:
        return seconds[nodeid]
    return next((v for k, v in KNOWN_SLOW.items() if nodeid.startswith(k)), 1.0)


# Tests that start a JVM (PySpark) run in two groups, each on one worker: the modules that use
# PySpark (one Spark session for all, tests/spark_fixtures.py) and the JVM examples (one child
# process and one JVM for the three, tests/test_examples.py: the first of them to run runs them
# all). Two JVMs at once at most: four starting at once on two cores took minutes each. Found by
# what the module imports, and the examples' names.
JVM_EXAMPLES = ("[spark_enqueue.py]", "[history_export.py]", "[spark_datasource.py]")
_SHARED = re.compile(r"""scope=["'](module|class)["']""")


@functools.cache
def _module_group(path: str) -> str | None:
    """``pyspark`` for a test module that uses Spark, the module itself for one that defines a
    fixture of module (or class) scope (its tests share it: one worker makes it once), else
    None. Read from the module's source, so that the xdist controller, which collects
    nothing, decides as the workers do."""
    try:
        source = (ROOT / path).read_text()
    except OSError:
        return None
    if "pyspark" in source:
        return "pyspark"
    return path if _SHARED.search(source) else None


def _unit(nodeid: str) -> str:
    """The xdist work unit of a test: its group, or the test alone."""
    if nodeid.endswith(JVM_EXAMPLES):
        return "jvm-examples"
    return _module_group(nodeid.split("::")[0]) or nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: the groups of :func:`_unit` (xdist's own, by ``xdist_group``
    marks, does not reach the controller under pytest 9), handed out in collection order."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # keep the order the workers collected in
    return Scheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # only xdist workers reorder: a plain run keeps the file order
    cache = getattr(config, "cache", None)
    seconds: dict[str, float] = cache.get(DURATIONS, {}) if cache is not None else {}
    # Work units slowest first (the order is the same on every worker: xdist checks that they
    # all collected the same list), each unit's tests together.
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_unit(item.nodeid), []).append(item)
    ordered = sorted(units.values(),
                     key=lambda unit: -sum(_seconds(i.nodeid, seconds) for i in unit))
    items[:] = [item for unit in ordered for item in unit]


_taken: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # In the controller of an xdist run (or a plain run): setup + call + teardown per test.
    _taken[report.nodeid] = _taken.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    cache = getattr(config, "cache", None)
    if cache is None or hasattr(config, "workerinput") or not _taken:
        return
    seconds = dict(cache.get(DURATIONS, {}))
    seconds.update({k: round(v, 2) for k, v in _taken.items()})
    cache.set(DURATIONS, seconds)


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
def proxy(redis_url: str) -> Iterator[FaultProxy]:
    """A fault proxy (panqueue.testing.FaultProxy) in front of the session's server: connect
    through ``proxy.url`` to lose, hold or cut what goes through it."""
    with FaultProxy(urlsplit(redis_url).port or 6379) as fault_proxy:
        yield fault_proxy


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
