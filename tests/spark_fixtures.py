"""The Spark session of the tests that use PySpark (test_spark, test_history,
test_spark_datasource): one JVM for all,
made on first use. tests/conftest.py keeps every test that uses PySpark on one xdist worker, so
the session is started once per run.

A plugin of tests/conftest.py, as tests/store_fixtures.py: pyspark is imported only when a test
asks for ``spark``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2,4]")  # 2 cores, up to 4 task attempts
               .appName("panqueue-tests")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("OFF")
    yield session
    session.stop()


# The test that first asks for ``spark`` starts the JVM in its setup: about 5 s alone, over a
# minute while the suite's other workers hold both cores. Every test of the session gets the
# JVM examples' guard against a hang (tests/test_examples.py), not pytest's default 120 s, which
# a loaded run reached; and a test interrupted by that guard leaves the session broken for every
# test after it.
SPARK_TIMEOUT = 300


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()) and item.get_closest_marker(
                "timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))
