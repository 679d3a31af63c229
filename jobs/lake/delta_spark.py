"""The delta-spark engine: Delta's own Spark data source, where its JVM classes are on the classpath."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from jobs.lake.engine import PartitionFilter, PartitionTargets, TableWrite
from schemas.catalog import TableSpec, spark_schema
from schemas.errors import LakeError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType


class DeltaSparkEngine:
    """Spark's own Delta data source; needs the Delta jars (not available on this machine)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def read(self, path: str, version: int | None, partition_filter: PartitionFilter | None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        df = reader.load(path)
        for column, values in (partition_filter or {}).items():
            df = df.where(_is_in(column, values))
        return df

    def exists(self, path: str) -> bool:
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
        from delta.tables import DeltaTable as SparkDeltaTable

        latest = SparkDeltaTable.forPath(self.spark, path).history(1).select("version").first()
        if latest is None:
            raise LakeError(f"the Delta table at {path} has no history")
        return int(latest[0])

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
        writer.save(path)
        after = self.version(path)
        return None if txn is not None and after == before else after


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
