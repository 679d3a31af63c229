"""The one Spark session builder, and the choice of lake engine.

Only this module (and ``spark-submit.sh``) knows masters, jars and Delta configuration. Jobs call
:func:`build_session`; the lake I/O calls :func:`resolve_engine` to pick its engine:

- ``"delta-spark"``: the Delta JVM classes are on the classpath (``--packages io.delta:...``);
  Spark reads and writes ``format("delta")`` itself.
- ``"bridge"``: no Delta jars; Spark writes Parquet files and the driver commits them with
  delta-rs (see :mod:`jobs.lake.facade`).
- ``"auto"``: ``"delta-spark"`` when the classes load, else ``"bridge"``.

An explicit choice wins over detection, in this order: the ``engine`` argument, the Spark conf
``spark.rmq.lake.engine``, the environment variable ``RMQ_LAKE_ENGINE``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

from schemas.catalog import PLAIN_ENCODED_COLUMNS
from schemas.errors import LakeError, ValidationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENGINES = ("auto", "bridge", "delta-spark")

# Spark conf key and environment variable that choose the lake engine. The conf key starts with
# "spark." because spark-submit drops --conf keys that do not ("Ignoring non-Spark config property").
ENGINE_CONF = "spark.rmq.lake.engine"
ENGINE_ENV = "RMQ_LAKE_ENGINE"

# A class of the delta-spark jar that the Python package `delta` also needs.
DELTA_CLASS = "io.delta.tables.DeltaTable"

BASE_CONF: dict[str, str] = {
    # every epoch-ms column and Delta timestamp is UTC; the machine's zone must not leak in
    "spark.sql.session.timeZone": "UTC",
    # Spark 4 defaults to ANSI; set it so an upgrade or a cluster default cannot flip overflow rules
    "spark.sql.ansi.enabled": "true",
    # INT96 is deprecated; delta-rs and the Delta protocol read microsecond timestamps
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # per-run lake data is small; the default 200 partitions make hundreds of tiny tasks
    "spark.sql.shuffle.partitions": "8",
    # the bridge hands Spark the exact data files of a Delta version; above this many paths Spark
    # checks them in a Spark job of one task per file (a second per few hundred files) instead
    # of on the driver, where a local file costs a stat call
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1000000",
    # the bridge writes inside Delta table directories, where a _SUCCESS marker is litter
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # job output is the summary the job prints; progress bars would interleave with it
    "spark.ui.showConsoleProgress": "false",
    # Parquet's per-column dictionary switch (read by every Spark Parquet write, Delta's included)
    **{f"spark.hadoop.parquet.enable.dictionary#{path}": "false" for path in PLAIN_ENCODED_COLUMNS},
}

# how long a stopped session's JVM may take to end (its shutdown hooks delete Spark's temp dirs)
JVM_EXIT_TIMEOUT_S = 60

DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def build_session(
    app_name: str,
    master: str | None = None,
    engine: str = "auto",
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Build (or get) the Spark session of a job or test run.

    Args:
        app_name: the Spark application name.
        master: a Spark master URL (``"local[2]"``); None leaves it to ``spark-submit``.
        engine: ``"auto"``, ``"bridge"`` or ``"delta-spark"``; ``extra_conf[spark.rmq.lake.engine]`` or
            ``RMQ_LAKE_ENGINE`` apply when this is ``"auto"``.
        extra_conf: more Spark confs; they override :data:`BASE_CONF` (e.g. shuffle partitions,
            ``spark.ui.enabled=false``).

    Returns:
        The session, with :data:`BASE_CONF`, the Delta extension and catalog confs only when the
        engine is ``"delta-spark"``, and ``spark.rmq.lake.engine`` set when the engine is explicit.
        ``"auto"`` adds no Delta confs: it cannot know before the JVM starts whether the jars are
        there, so clusters with Delta pass ``engine="delta-spark"``.

    Raises:
        ValidationError: ``engine`` is not one of :data:`ENGINES`.
        LakeError: ``"delta-spark"`` was asked for but the Delta classes are not on the classpath.
    """
    from pyspark.sql import SparkSession

    extra = dict(extra_conf or {})
    chosen = _explicit_engine(engine, extra.get(ENGINE_CONF))
    conf = {**BASE_CONF, **(DELTA_CONF if chosen == "delta-spark" else {}), **extra}
    if chosen != "auto":
        conf[ENGINE_CONF] = chosen
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if chosen == "delta-spark":
        _require_delta_classes(spark)
    return spark


def stop_spark() -> None:
    """Stop this process's Spark session, if one was started, and wait for the JVM it launched.

    The end of a job's process (``python -m jobs``, the ``spark-submit`` driver script) calls this
    before it exits: the SparkContext stops cleanly, and a JVM that ``pyspark`` launched as a child
    (``python -m jobs``; under ``spark-submit`` the JVM is the parent and ends after this process)
    is told to exit by closing its stdin, as the end of the Python process would, and is waited
    for, so that it does not outlive the process. A JVM that has not ended after
    :data:`JVM_EXIT_TIMEOUT_S` seconds is killed. Does nothing when pyspark was never imported.
    """
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:
        context.stop()
    jvm = getattr(SparkContext._gateway, "proc", None)
    if not isinstance(jvm, subprocess.Popen):
        return
    if jvm.stdin is not None:
        jvm.stdin.close()  # PythonGatewayServer exits on end of file of its stdin
    try:
        jvm.wait(timeout=JVM_EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        jvm.kill()
        jvm.wait()


def resolve_engine(spark: SparkSession, engine: str = "auto") -> str:
    """The engine to use with ``spark``: ``"bridge"`` or ``"delta-spark"``.

    An explicit ``engine`` wins, then the Spark conf ``spark.rmq.lake.engine``, then ``RMQ_LAKE_ENGINE``,
    then :func:`detect_engine`.

    Raises:
        ValidationError: an engine name is not one of :data:`ENGINES`.
        LakeError: ``"delta-spark"`` was asked for but the Delta classes are not on the classpath.
    """
    chosen = _explicit_engine(engine, spark.conf.get(ENGINE_CONF, None))
    if chosen == "auto":
        return detect_engine(spark)
    if chosen == "delta-spark":
        _require_delta_classes(spark)
    return chosen


def detect_engine(spark: SparkSession) -> str:
    """``"delta-spark"`` if the JVM can load ``io.delta.tables.DeltaTable``, else ``"bridge"``.

    The class is looked up through the context class loader, which sees ``--packages`` and
    ``spark.jars`` jars. Deterministic for a given classpath; starts no Spark job.

    Raises:
        LakeError: ``spark`` has no JVM gateway (Spark Connect); set ``spark.rmq.lake.engine`` instead.
    """
    from py4j.protocol import Py4JError

    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        raise LakeError(
            "cannot detect the lake engine on a session without a JVM gateway (Spark Connect); "
            f"set the Spark conf {ENGINE_CONF} to 'bridge' or 'delta-spark'"
        )
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        jvm.java.lang.Class.forName(DELTA_CLASS, False, loader)
    except Py4JError:
        return "bridge"
    return "delta-spark"


def _explicit_engine(engine: str, conf_value: str | None) -> str:
    """The first explicit engine among the argument, the conf and the environment, or "auto"."""
    for source, value in (
        ("engine", engine),
        (ENGINE_CONF, conf_value),
        (ENGINE_ENV, os.environ.get(ENGINE_ENV)),
    ):
        if value is None:
            continue
        if value not in ENGINES:
            raise ValidationError(source, value, "unknown lake engine", f"use one of {list(ENGINES)}")
        if value != "auto":
            return value
    return "auto"


def _require_delta_classes(spark: SparkSession) -> None:
    if detect_engine(spark) != "delta-spark":
        raise LakeError(
            f"the delta-spark engine was asked for but {DELTA_CLASS} is not on the Spark classpath; "
            "start Spark with the Delta jars (spark-submit --packages io.delta:delta-spark_2.13:<version>) "
            f"or use the bridge engine ({ENGINE_CONF}=bridge)"
        )
