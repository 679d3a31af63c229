"""Shared fixtures: the one session-scoped Spark session of the test run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from jobs.lake import build_session
from tests.helpers import ManualClock

# local[2], 2 shuffle partitions, UI off; UTC and ANSI come from build_session.
TEST_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The Spark session of the whole run, on the bridge engine (this machine has no Delta jars)."""
    session = build_session("tests", master="local[2]", engine="bridge", extra_conf=TEST_SPARK_CONF)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def clock() -> ManualClock:
    """A clock at :data:`tests.helpers.CLOCK_START` that the test moves."""
    return ManualClock()
