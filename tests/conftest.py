"""Shared fixtures: the one session-scoped Spark session of the test run; the JVM flag of the Spark
processes the tests start; the engine's tests; and, in CI, a run that fails when a test was
skipped."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from broker_model.broker import Broker, BrokerConfig
from jobs.lake import build_session
from tests.helpers import ENGINE, ManualClock

# local[2], 2 shuffle partitions, UI off; UTC and ANSI come from build_session.
TEST_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
# The tests' session evaluates expressions interpreted, not through generated Java code: the tests'
# data is small, so compiling a class per query costs more than it saves (a quarter of the session's
# CPU on the consumer_offsets tests: 94 s of the JVM's CPU against 123 s). Spark gives the same
# results either way and tests both in its own suites; every job the tests start as a process of its
# own (spark-submit, the jobs' CLI, the replays killed mid-way, the cluster) runs with code generation.
# On delta-spark the session also plans without dynamic partition pruning: interpreted, Spark 4.2
# evaluates a pruning filter over Delta's scan before its subquery ran and fails the query ("IN
# dynamicpruning#... has not finished", consumer_offsets' incremental chain); pruning changes which
# files a query reads, never its rows, and the processes the tests start keep it.
INTERPRETED_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
DYNAMIC_PRUNING = "spark.sql.optimizer.dynamicPartitionPruning.enabled"

# The Spark processes the tests start (the jobs' command lines, spark-submit, the replays killed
# mid-way) live seconds, and their JVM spends more CPU compiling with C2 than C2 saves them: with C1
# alone a consumer_offsets run on a 200-message lake took 7.6-8.9 s of user CPU instead of 12.8-14.4 s,
# with the same results (the JIT tier never changes what code computes). spark-submit, and so every
# pyspark process, reads SPARK_SUBMIT_OPTS into the driver JVM's command.
# The tests' own session lives the whole run. On the bridge it runs with C1 alone too: over a whole
# pass each worker's session JVM compiled 52,000 methods with C2 and C1 in 335-357 s of compile time
# (848 s of the two sessions' CPU), against 78,000-83,000 methods in 44 s with C1 alone (738 s of
# CPU); the pass took 878 s instead of 979 s, its tests 1,717 s instead of 1,871 s. Alone on the
# machine a Spark-heavy module is faster with C2 (test_route_dlq_incremental 147 s against 160 s,
# C2 compiling on the idle core), but in the pass the two workers share the two cores. The
# delta-spark pass runs only the Spark-heavy tests and keeps both compilers.
# The value the run was given is kept in RUN_SUBMIT_OPTS_ENV by the first process that loads this
# file (xdist's workers inherit the changed environment of the process that starts them).
SUBMIT_OPTS_ENV = "SPARK_SUBMIT_OPTS"
RUN_SUBMIT_OPTS_ENV = "RMQ_TEST_RUN_SPARK_SUBMIT_OPTS"
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1"
_SESSION_SUBMIT_OPTS = os.environ.setdefault(RUN_SUBMIT_OPTS_ENV, os.environ.get(SUBMIT_OPTS_ENV, ""))
os.environ[SUBMIT_OPTS_ENV] = " ".join(filter(None, (_SESSION_SUBMIT_OPTS, SHORT_LIVED_JVM)))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The Spark session of the whole run, on :data:`tests.helpers.ENGINE` (bridge unless
    ``RMQ_TEST_ENGINE=delta-spark``, which adds the Delta jars: Ivy fetches them on first use, the
    next starts take the jars it resolved, :func:`jobs.lake.session.with_delta_jars`)."""
    conf = {**TEST_SPARK_CONF, **INTERPRETED_CONF}
    if ENGINE == "delta-spark":
        conf[DYNAMIC_PRUNING] = "false"
    processes_opts = os.environ[SUBMIT_OPTS_ENV]
    # the session's JVM starts with what the run was given, and on the bridge with C1 alone
    session_opts = " ".join(filter(None, (_SESSION_SUBMIT_OPTS, SHORT_LIVED_JVM if ENGINE == "bridge" else "")))
    if not session_opts:
        del os.environ[SUBMIT_OPTS_ENV]
    else:
        os.environ[SUBMIT_OPTS_ENV] = session_opts
    try:
        session = build_session("tests", master="local[2]", engine=ENGINE, extra_conf=conf)
    finally:
        os.environ[SUBMIT_OPTS_ENV] = processes_opts
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def clock() -> ManualClock:
    """A clock at :data:`tests.helpers.CLOCK_START` that the test moves."""
    return ManualClock()


@pytest.fixture
def broker(tmp_path: Path, clock: ManualClock) -> Iterator[Broker]:
    """A SYNC_FLUSH broker of a lake under ``tmp_path`` on the test's :func:`clock`, with topic
    ``T`` of two queues (a module may define its own ``broker``)."""
    started = Broker(BrokerConfig(tmp_path, flush_mode="SYNC_FLUSH", clock=clock)).start()
    started.ensure_topic("T", 2)
    yield started
    started.shutdown()


# RMQ_TEST_SCOPE=all: on delta-spark, every Spark test, not only those marked both_engines
SCOPE_ENV = "RMQ_TEST_SCOPE"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked for the other lake engine (``@pytest.mark.engine("bridge")``) are deselected:
    they check what only that engine does. On delta-spark, so are the tests without Spark (they do
    not depend on the engine, and the bridge run has run them) and, unless
    ``RMQ_TEST_SCOPE=all``, the Spark tests not marked ``both_engines``.

    The two workers each take a whole module at a time, in xdist's order (the most tests first),
    not this one: handing out the longest modules first ran the bridge pass slower (952 s against
    910 s), its heavy modules contending for the two cores side by side."""
    every_spark_test = os.environ.get(SCOPE_ENV) == "all"

    def other_engine(item: pytest.Item) -> bool:
        mark = item.get_closest_marker("engine")
        if mark is not None:
            return bool(mark.args[0] != ENGINE)
        if ENGINE == "bridge":
            return False
        if item.get_closest_marker("spark") is None:
            return True
        return not every_spark_test and item.get_closest_marker("both_engines") is None

    other = [item for item in items if other_engine(item)]
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = [item for item in items if item not in other]


# CI sets this: a test skipped there is a check that did not run, so the run fails
FAIL_ON_SKIP_ENV = "RMQ_FAIL_ON_SKIP"
_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect the skipped tests (the reports of every worker reach the controlling process)."""
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ``RMQ_FAIL_ON_SKIP=1``, a run that skipped any test fails, naming them."""
    if os.environ.get(FAIL_ON_SKIP_ENV) == "1" and _skipped and not hasattr(session.config, "workerinput"):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"{FAIL_ON_SKIP_ENV}=1 and {len(_skipped)} test(s) skipped: {sorted(set(_skipped))}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
