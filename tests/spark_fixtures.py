"""The Spark session of the tests that use PySpark (test_spark, test_history): one JVM for both,
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
