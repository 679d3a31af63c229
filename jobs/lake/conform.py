"""Frames conformed to the catalog before a write: columns, types and NOT NULL, and partition targets."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable

from jobs.lake.engine import PartitionFilter, PartitionTargets, PartitionValues
from schemas.catalog import Column as CatalogColumn
from schemas.catalog import TableSpec, spark_schema
from schemas.errors import LakeError, ValidationError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType


# Text of the raise_error a NOT NULL guard fails the write job with; a write error holding it
# becomes a ValidationError naming the column.
NOT_NULL_MARK = "rmq-lake NOT NULL violated by a null (or an empty partition string) in "


def check_partition_filter(
    partition_filter: PartitionFilter | None, partition_by: Sequence[str], table_name: str
) -> None:
    """Refuse a ``partition_filter`` that names a column outside ``partition_by`` or a value list
    that is not a sequence.

    Raises:
        ValidationError: naming the column or its values.
    """
    for column, values in (partition_filter or {}).items():
        if column not in partition_by:
            raise ValidationError(
                "partition_filter",
                column,
                f"not a partition column of {table_name!r}",
                f"filter on {list(partition_by)}",
            )
        if isinstance(values, str | bytes) or not isinstance(values, Sequence):
            raise ValidationError(f"partition_filter[{column!r}]", values, "not a list of values")


def partition_targets(spec: TableSpec, partition_values: Sequence[PartitionValues] | None) -> PartitionTargets:
    """``partition_values`` as Delta partition value strings, after checking them."""
    if not spec.partition_by:
        raise ValidationError("table", spec.name, "is not partitioned", "use overwrite instead")
    if not partition_values:
        raise ValidationError("partition_values", partition_values, "empty", "name at least one partition")
    types = {c.name: c.type for c in spec.columns}
    targets = []
    for target in partition_values:
        if not target or any(k not in spec.partition_by for k in target):
            raise ValidationError(
                "partition_values",
                target,
                f"not a partition of {spec.name!r}",
                f"use dicts keyed by some of {list(spec.partition_by)}",
            )
        targets.append({k: _partition_string(v, types[k], k) for k, v in target.items()})
    return targets


def _partition_string(value: Any, arrow_type: pa.DataType, column: str) -> str | None:
    """The Delta partition value string of ``value`` in a column of ``arrow_type``."""
    if value is None:
        return None
    if pa.types.is_integer(arrow_type) and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if pa.types.is_string(arrow_type) and isinstance(value, str):
        return value
    raise ValidationError(f"partition_values[{column!r}]", value, f"not a value of type {arrow_type}")


def conform_to_catalog(df: DataFrame, spec: TableSpec) -> DataFrame:
    """``df`` with exactly the catalog columns, in catalog order, guarded by NOT NULL checks.

    The guards fail the write job (``raise_error``) on a null in a NOT NULL column, or an empty
    string in a NOT NULL string partition column (Spark writes "" as a null partition).

    Raises:
        ValidationError: a catalog column is missing, a column is extra or duplicated, or a type
            differs from the catalog (nullability aside).
    """
    _check_columns(df, spec)
    expected = spark_schema(spec)
    actual = {f.name: f.dataType for f in df.schema.fields}
    for field in expected.fields:
        if actual[field.name].simpleString() != field.dataType.simpleString():
            raise ValidationError(
                f"{spec.name}.{field.name}",
                actual[field.name].simpleString(),
                f"the catalog declares {field.dataType.simpleString()}",
                "cast the column before writing",
            )
    return df.select(*[_not_null_guard(c, spec) for c in spec.columns])


def _check_columns(df: DataFrame, spec: TableSpec) -> None:
    names = df.columns
    duplicated = sorted({n for n in names if names.count(n) > 1})
    missing = [n for n in spec.column_names if n not in names]
    extra = sorted(set(names) - set(spec.column_names))
    fix = f"select exactly {spec.column_names}"
    if duplicated:
        raise ValidationError("columns", duplicated, f"duplicated in the frame written to {spec.name!r}", fix)
    if missing:
        raise ValidationError("columns", missing, f"missing from the frame written to {spec.name!r}", fix)
    if extra:
        raise ValidationError("columns", extra, f"not columns of table {spec.name!r}", fix)


def _not_null_guard(column: CatalogColumn, spec: TableSpec) -> Column:
    from pyspark.sql import functions as F

    value = F.col(column.name)
    if column.nullable:
        return value
    bad = value.isNull()
    if column.name in spec.partition_by and pa.types.is_string(column.type):
        bad = bad | (value == F.lit(""))
    message = f"{NOT_NULL_MARK}{spec.name}.{column.name}"
    return F.when(bad, F.raise_error(F.lit(message))).otherwise(value).alias(column.name)


def not_null_violation(err: Exception) -> ValidationError | None:
    """The ValidationError for a write job failed by a NOT NULL guard, None for other errors."""
    found = re.search(re.escape(NOT_NULL_MARK) + r"([\w.]+)", str(err))
    if found is None:
        return None
    return ValidationError(
        found.group(1),
        None,
        "NOT NULL column holds a null (or an empty partition string); nothing was committed",
        "filter or fill those rows before writing",
    )


def create_table(path: str, spec: TableSpec) -> None:
    """Create the empty catalog table at ``path`` with delta-rs (catalog schema and partitions)."""
    # mode="ignore": a concurrent creator winning the race is fine, the schema is the same
    DeltaTable.create(
        path,
        schema=spec.arrow_schema,
        mode="ignore",
        partition_by=list(spec.partition_by) or None,
        name=spec.name,
        description=spec.meaning,
    )


def check_catalog_schema(spec: TableSpec, actual: StructType, path: str, columns: Sequence[str] | None = None) -> None:
    """Raise LakeError unless ``actual`` has the catalog's column names and types (any order); with
    ``columns``, only those (a reader of some columns can read a table an older release created)."""
    expected: dict[str, str | None] = {f.name: f.dataType.simpleString() for f in spark_schema(spec).fields}
    found: dict[str, str | None] = {f.name: f.dataType.simpleString() for f in actual.fields}
    if columns is not None:
        expected = {name: expected.get(name) for name in columns}
        found = {name: found.get(name) for name in columns}
    if found != expected:
        differing = sorted(n for n in expected.keys() | found.keys() if expected.get(n) != found.get(n))
        raise LakeError(
            f"the Delta table at {path} does not match catalog table {spec.name!r}: columns {differing} "
            f"differ (table {[found.get(n) for n in differing]}, catalog {[expected.get(n) for n in differing]}); "
            "migrate the table or fix the lake root"
        )
