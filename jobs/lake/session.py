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
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.catalog import PLAIN_ENCODED_COLUMNS
from schemas.errors import LakeError, ValidationError

if TYPE_CHECKING:
    from pyspark import SparkContext
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

DELTA_SCALA_VERSION = "2.13"  # the Scala of pyspark 4's jars


def delta_package() -> str:
    """The Maven coordinate of the Delta jar that goes with the installed ``delta-spark`` package
    and pyspark, as ``delta.pip_utils.configure_spark_with_delta_pip`` names it: from Delta 4 the
    artifact carries Spark's major.minor, e.g. ``io.delta:delta-spark_4.2_2.13:4.4.0``.

    Raises:
        LakeError: the ``delta-spark`` Python package is not installed.
    """
    from importlib import metadata

    import pyspark

    try:
        delta_version = metadata.version("delta-spark")
    except metadata.PackageNotFoundError:
        raise LakeError(
            "the delta-spark engine needs the Python package delta-spark: pip install delta-spark"
        ) from None
    spark_major_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_major_minor}_{DELTA_SCALA_VERSION}:{delta_version}"


# Ivy's settings: given any of them (in the confs or in PYSPARK_SUBMIT_ARGS), the Delta jars are
# resolved by Ivy as they say, never taken from the record of a resolution with Ivy's defaults
IVY_SETTINGS = ("spark.jars.ivy", "spark.jars.ivySettings", "spark.jars.repositories", "spark.jars.excludes")
SUBMIT_ARGS_ENV = "PYSPARK_SUBMIT_ARGS"
CACHE_HOME_ENV = "XDG_CACHE_HOME"


def delta_jars_record() -> Path:
    """Where the jars Ivy resolved for :func:`delta_package` with its default settings are listed:
    ``rmq-lake/<package>.jars`` in the user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    cache = os.environ.get(CACHE_HOME_ENV) or str(Path.home() / ".cache")
    return Path(cache) / "rmq-lake" / f"{delta_package().replace(':', '_')}.jars"


def _names_ivy(submit_args: str) -> bool:
    """Whether spark-submit flags set Ivy (its settings, or ``--repositories``)."""
    return any(key in submit_args for key in IVY_SETTINGS) or "--repositories" in submit_args


def _ivy_is_configured(conf: dict[str, str]) -> bool:
    return any(key in conf for key in IVY_SETTINGS) or _names_ivy(os.environ.get(SUBMIT_ARGS_ENV, ""))


def delta_submit_flags(submit_args: Sequence[str]) -> list[str]:
    """The spark-submit flags that give a job the Delta jars, for flags ``submit_args`` that name
    none: ``--jars`` with :func:`recorded_delta_jars` (no resolution) unless the flags set Ivy or
    jars of their own; else ``--packages`` with :func:`delta_package`, for Ivy to resolve."""
    given = " ".join(submit_args)
    own_jars = "--jars" in given or "spark.jars=" in given
    recorded = [] if own_jars or _names_ivy(given) else recorded_delta_jars()
    return ["--jars", ",".join(recorded)] if recorded else ["--packages", delta_package()]


def recorded_delta_jars() -> list[str]:
    """The jars of :func:`delta_jars_record`, when it lists the Delta jar and every file it lists is
    there; else none (no record yet, or Ivy's cache was cleared since)."""
    try:
        jars = delta_jars_record().read_text(encoding="utf-8").split()
    except OSError:
        return []
    if not any("delta-spark_" in Path(jar).name for jar in jars) or not all(Path(jar).is_file() for jar in jars):
        return []
    return jars


def with_delta_jars(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with the Delta jars, unless it already names a Delta jar in ``spark.jars.packages``
    or ``spark.jars``: the jars an earlier start had Ivy resolve (:func:`recorded_delta_jars`) in
    ``spark.jars`` while Ivy has its default settings, which saves the resolution (about 4 s at every
    JVM start); else :func:`delta_package` among ``spark.jars.packages``, for Ivy to fetch from its
    cache or Maven Central when the JVM starts."""
    if any("delta-spark" in conf.get(key, "") for key in ("spark.jars.packages", "spark.jars")):
        return conf
    recorded = [] if _ivy_is_configured(conf) else recorded_delta_jars()
    if recorded:
        jars = [jar for jar in conf.get("spark.jars", "").split(",") if jar]
        return {**conf, "spark.jars": ",".join([*jars, *recorded])}
    packages = [p for p in conf.get("spark.jars.packages", "").split(",") if p]
    return {**conf, "spark.jars.packages": ",".join([*packages, delta_package()])}


def record_delta_jars(spark: SparkSession, conf: dict[str, str]) -> None:
    """After a start whose Delta jars Ivy resolved with its default settings (``conf`` as
    :func:`with_delta_jars` gave it), list the jars it resolved (Spark puts them in ``spark.jars``)
    in :func:`delta_jars_record`, written whole or not at all; a cache that cannot be written
    only costs the next start its resolution."""
    packages = conf.get("spark.jars.packages", "")
    if "delta-spark" not in packages or delta_package() not in packages or _ivy_is_configured(conf):
        return
    resolved = spark.sparkContext.getConf().get("spark.jars", "") or ""
    jars = [jar.removeprefix("file://") for jar in resolved.split(",") if jar]
    if not any("delta-spark_" in Path(jar).name for jar in jars) or not all(Path(jar).is_file() for jar in jars):
        return
    record = delta_jars_record()
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        written = record.with_name(f"{record.name}.{os.getpid()}")
        written.write_text("\n".join(jars) + "\n", encoding="utf-8")
        written.replace(record)
    except OSError:
        return


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
        The session, with :data:`BASE_CONF`, and ``spark.rmq.lake.engine`` set when the engine is
        explicit. For ``"delta-spark"`` also the Delta extension and catalog and, unless the confs
        already name Delta jars, the Delta jar of :func:`delta_package` in ``spark.jars.packages``
        (fetched by Ivy when this call starts the JVM; under ``spark-submit`` the JVM is already up
        and ``spark-submit.sh`` passes ``--packages`` itself). ``"auto"`` adds no Delta confs: it
        cannot know before the JVM starts whether the jars are there.

    Raises:
        ValidationError: ``engine`` is not one of :data:`ENGINES`.
        LakeError: ``"delta-spark"`` was asked for and the Delta jars could not be fetched, or
            the session was already running without them.
    """
    from pyspark.sql import SparkSession

    extra = dict(extra_conf or {})
    chosen = _explicit_engine(engine, extra.get(ENGINE_CONF))
    conf = {**BASE_CONF, **(DELTA_CONF if chosen == "delta-spark" else {}), **extra}
    if chosen == "delta-spark":
        conf = with_delta_jars(conf)
    if chosen != "auto":
        conf[ENGINE_CONF] = chosen
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as err:
        if chosen != "delta-spark" or "JAVA_GATEWAY_EXITED" not in str(err):
            raise
        raise LakeError(
            f"Spark did not start with the Delta jars ({conf.get('spark.jars.packages') or conf.get('spark.jars')}): "
            "Ivy could not fetch "
            "them (its messages are above); let the machine reach Maven Central once, or name local jars "
            "in spark.jars, or use the bridge engine (--engine bridge)"
        ) from err
    record_delta_jars(spark, conf)
    if chosen == "delta-spark":
        _require_delta_classes(spark)
        _size_delta_snapshots(spark)
    return spark


# Delta rebuilds a table's state from its log in this many Spark partitions (Delta's default, 50,
# is made for clusters); see _size_delta_snapshots
SNAPSHOT_PARTITIONS_CONF = "spark.databricks.delta.snapshotPartitions"


def _size_delta_snapshots(spark: SparkSession) -> None:
    """On a local master, unless set: one snapshot partition per core. Every Delta read and write
    of a table replays its log in :data:`SNAPSHOT_PARTITIONS_CONF` tasks, and the lake's tables
    are many and mostly small: 50 tasks of a few rows each cost more than the replay."""
    context = spark.sparkContext
    if (context.master or "").startswith("local") and spark.conf.get(SNAPSHOT_PARTITIONS_CONF, None) is None:
        spark.conf.set(SNAPSHOT_PARTITIONS_CONF, str(max(1, context.defaultParallelism)))


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


# the engine detected per Spark context: its classpath is set when it starts, and a lookup that fails
# costs tens of milliseconds (the JVM's exception crosses the gateway) at every Lake a job opens
_DETECTED: weakref.WeakKeyDictionary[SparkContext, str] = weakref.WeakKeyDictionary()


def detect_engine(spark: SparkSession) -> str:
    """``"delta-spark"`` if the JVM can load ``io.delta.tables.DeltaTable``, else ``"bridge"``.

    The class is looked up through the context class loader, which sees ``--packages`` and
    ``spark.jars`` jars, once per Spark context. Deterministic for a given classpath; starts no
    Spark job.

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
    context = spark.sparkContext
    known = _DETECTED.get(context)
    if known is not None:
        return known
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        jvm.java.lang.Class.forName(DELTA_CLASS, False, loader)
        detected = "delta-spark"
    except Py4JError:
        detected = "bridge"
    _DETECTED[context] = detected
    return detected


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
            f"start Spark with the Delta jars (spark-submit --packages {delta_package()}) "
            f"or use the bridge engine ({ENGINE_CONF}=bridge)"
        )
