"""The delta-spark engine: Delta's own Spark data source, where its JVM classes are on the classpath."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from broker_model.store import latest_version
from jobs.lake.engine import PartitionFilter, PartitionTargets, TableWrite
from jobs.lake.snapshots import local_or_none
from schemas.catalog import TableSpec, spark_schema
from schemas.errors import LakeError, ValidationError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType


class DeltaSparkEngine:
    """Spark's own Delta data source; needs the Delta jars (:func:`jobs.lake.session.delta_package`)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def read(self, path: str, version: int | None, partition_filter: PartitionFilter | None) -> DataFrame:
        # the facade's errors, as the bridge raises them (Delta's would be AnalysisExceptions)
        if not self.exists(path):
            raise LakeError(f"no Delta table at {path}; check the lake root or write the table first")
        latest = self.version(path)
        if version is not None and version > latest:
            raise LakeError(f"cannot load version {version} of the Delta table at {path}: no such version")
        # pinned, as the bridge's reads are to the files the log lists now: a frame loaded without
        # versionAsOf is resolved to the newest snapshot again at every action, so a job that reads a
        # table, writes it, then acts on the frame again would see its own new rows
        pinned = latest if version is None else version
        df = self.spark.read.format("delta").option("versionAsOf", pinned).load(path)
        for column, values in (partition_filter or {}).items():
            df = df.where(_is_in(column, values))
        return df

    def exists(self, path: str) -> bool:
        table_dir = local_or_none(path)
        if table_dir is not None:  # one listing of its Delta log, no Spark job (as :meth:`version`)
            return latest_version(table_dir) >= 0
        from delta.tables import DeltaTable as SparkDeltaTable

        return bool(SparkDeltaTable.isDeltaTable(self.spark, path))

    def schema(self, path: str) -> StructType:
        from delta.tables import DeltaTable as SparkDeltaTable

        return SparkDeltaTable.forPath(self.spark, path).toDF().schema

    def create(self, path: str, spec: TableSpec) -> None:
        from delta.tables import DeltaTable as SparkDeltaTable

        builder = SparkDeltaTable.createIfNotExists(self.spark).location(path).addColumns(spark_schema(spec))
        builder.partitionedBy(*spec.partition_by).execute()

    def version(self, path: str) -> int:
        """The latest version: of a local table from one listing of its Delta log, as the bridge and
        the driver reads take it (``history`` runs Spark jobs, and fails once log cleanup removed the
        commits before a checkpoint); elsewhere from ``history``."""
        table_dir = local_or_none(path)
        if table_dir is not None:
            latest = latest_version(table_dir)
            if latest < 0:
                raise LakeError(f"the Delta table at {path} has no history")
            return latest
        from delta.tables import DeltaTable as SparkDeltaTable

        newest = SparkDeltaTable.forPath(self.spark, path).history(1).select("version").first()
        if newest is None:
            raise LakeError(f"the Delta table at {path} has no history")
        return int(newest[0])

    def write(self, path: str, write: TableWrite) -> int | None:
        """Write ``df``; None when Delta skipped it as an already committed ``txn``.

        Delta itself skips a write whose ``txnVersion`` is not above the table's version for
        ``txnAppId``; the skip is seen as an unchanged table version (a concurrent writer's commit
        in between would hide it).
        """
        spec, df, mode, targets, txn = write.spec, write.df, write.mode, write.targets, write.txn
        before = self.version(path)
        writer = df.write.format("delta").mode("append" if mode == "append" else "overwrite")
        if mode == "partitions":
            writer = writer.option("replaceWhere", replace_where(spec, targets or []))
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", str(txn.version))
        try:
            writer.save(path)
        except Exception as err:
            raise _lake_error(err, path, targets) from err
        after = self.version(path)
        return None if txn is not None and after == before else after


def _lake_error(err: Exception, path: str, targets: PartitionTargets | None) -> Exception:
    """The facade's error for a failed delta-spark write, as the bridge raises them: rows outside
    the partitions replaced are a ValidationError (Delta checked them and committed nothing), a
    Delta error of the commit (a conflict, a protocol or table property refusing it) a LakeError;
    anything else as it came."""
    text = str(err)
    if "DELTA_REPLACE_WHERE_MISMATCH" in text:
        return ValidationError(
            "partition_values",
            targets,
            "the frame has rows outside the partitions being replaced",
            "filter the frame to those partitions or list them in partition_values",
        )
    if "DELTA_" in text or "io.delta" in text:
        first_line = text.strip().splitlines()[0] if text.strip() else type(err).__name__
        return LakeError(f"delta-spark refused the commit to {path}: {first_line}")
    return err


def _is_in(column: str, values: Sequence[Any]) -> Column:
    from pyspark.sql import functions as F

    present = [v for v in values if v is not None]
    condition = F.col(column).isin(present)
    return condition | F.col(column).isNull() if len(present) < len(values) else condition


def replace_where(spec: TableSpec, targets: PartitionTargets) -> str:
    """The ``replaceWhere`` SQL predicate selecting the partitions ``targets`` of ``spec``."""
    types = {c.name: c.type for c in spec.columns}
    terms = [
        " AND ".join(_sql_equals(column, value, types[column]) for column, value in target.items())
        for target in targets
    ]
    return " OR ".join(f"({term})" for term in terms)


def _sql_equals(column: str, value: str | None, arrow_type: pa.DataType) -> str:
    name = f"`{column.replace('`', '``')}`"
    if value is None:
        return f"{name} IS NULL"
    if pa.types.is_integer(arrow_type):
        return f"{name} = {int(value)}"
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"{name} = '{escaped}'"
