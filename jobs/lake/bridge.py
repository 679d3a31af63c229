"""The bridge engine: Spark's Parquet reader and writer on the table's files, committed to the
Delta log with delta-rs.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from broker_model.store import retry_listing_gap
from jobs.lake.conform import check_partition_filter, create_table
from jobs.lake.engine import PartitionFilter, PartitionTargets, TableWrite, WriteMode
from jobs.lake.snapshots import (
    HIVE_NULL,
    active_files,
    add_actions,
    already_committed,
    check_bridge_can_read,
    delta_string,
    file_location,
    is_table,
    local_directory,
    log_schema,
    open_table,
    prune,
    table_version,
)
from schemas.catalog import TableSpec
from schemas.errors import LakeError, ValidationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


# delta-spark keeps 32-character prefixes of strings as stats; longer bounds are left out instead
# of truncated, which keeps every recorded bound exact.
STATS_STRING_LIMIT = 32


# Names of the helper columns of a bridge read; a data column may not use them.
_FILE_KEY = "__rmq_lake_file"


_KNOWN = "__rmq_lake_known"


@dataclass(frozen=True)
class WrittenFile:
    """One data file written by the bridge and not yet committed.

    Attributes:
        path: path relative to the table directory, not URL-encoded (delta-rs encodes it).
        size: file size in bytes.
        modification_time: file modification time, epoch milliseconds.
        partition_values: Delta partition value strings, None for null.
        stats: the Delta stats JSON (numRecords, minValues, maxValues, nullCount).
    """

    path: str
    size: int
    modification_time: int
    partition_values: dict[str, str | None]
    stats: str

    def add_action(self) -> AddAction:
        """The Delta ``add`` action committing this file."""
        return AddAction(self.path, self.size, self.partition_values, self.modification_time, True, self.stats)


@dataclass(frozen=True)
class WrittenFiles:
    """The output of one bridge write: its directory (under the table) and its data files."""

    directory: Path
    files: tuple[WrittenFile, ...]


class BridgeEngine:
    """Spark Parquet files committed and listed through delta-rs (see the module docstring)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def read(self, path: str, version: int | None, partition_filter: PartitionFilter | None) -> DataFrame:
        table_dir = local_directory(path)
        dt = open_table(table_dir, version)
        check_bridge_can_read(dt, path)
        schema = log_schema(dt)
        partition_by = list(dt.metadata().partition_columns)
        check_partition_filter(partition_filter, partition_by, path)
        files = prune(active_files(add_actions(dt), partition_by), partition_filter)
        return scan_files(self.spark, table_dir, schema, partition_by, files)

    def exists(self, path: str) -> bool:
        return is_table(local_directory(path))

    def version(self, path: str) -> int:
        # the kept snapshot's version, or the newest commit or checkpoint file of the log: a probe
        # or a listing, not a replay of the log
        newest = table_version(local_directory(path))
        return newest if newest >= 0 else open_table(local_directory(path)).version()

    def schema(self, path: str) -> StructType:
        return log_schema(open_table(local_directory(path)))

    def create(self, path: str, spec: TableSpec) -> None:
        create_table(local_directory(path), spec)

    def write(self, path: str, write: TableWrite) -> int | None:
        """Write and commit the rows; None when the transaction is already committed (nothing written)."""
        spec, df, mode, targets, txn = write.spec, write.df, write.mode, write.targets, write.txn
        table_dir = local_directory(path)
        dt = open_table(table_dir)
        check_bridge_can_read(dt, path)
        if txn is not None and already_committed(dt, txn):
            return None
        written = write_data_files(df, table_dir, spec.partition_by)
        try:
            _check_written_partitions(written, spec, targets)
            commit_data_files(table_dir, written, mode, targets, txn)
        except BaseException:
            if not _is_committed(table_dir, written):
                shutil.rmtree(written.directory, ignore_errors=True)
            raise
        return open_table(table_dir).version()


def scan_files(
    spark: SparkSession, table_dir: str, schema: StructType, partition_by: Sequence[str], files: pa.Table
) -> DataFrame:
    """A DataFrame of exactly ``files`` (from :func:`~jobs.lake.snapshots.active_files`), columns in ``schema`` order.

    Data columns come from the Parquet files read with the data schema; partition columns are
    joined back from the log's typed values by file path. A row whose file is unknown to the log
    fails the query (``raise_error``) instead of getting null partition values.

    Raises:
        LakeError: Spark resolved the paths to other files than the log's.
    """
    if files.num_rows == 0:
        return spark.createDataFrame([], schema)
    from pyspark.sql.types import StructType

    locations = [file_location(table_dir, p) for p in files.column("path").to_pylist()]
    data_schema = StructType([f for f in schema.fields if f.name not in partition_by])
    # __globPaths__=false: a file named "a[1].parquet" must not be read as a glob pattern
    data_df = spark.read.option("__globPaths__", "false").schema(data_schema).parquet(*[f"file:{p}" for p in locations])
    _check_scanned(data_df, locations, table_dir)
    if not partition_by:
        return data_df.select(*schema.fieldNames())
    return _with_partition_values(spark, data_df, schema, partition_by, files, locations)


def _check_scanned(data_df: DataFrame, locations: list[str], table_dir: str) -> None:
    scanned = {unquote(urlsplit(uri).path) for uri in data_df.inputFiles()}
    if scanned != set(locations):
        unexpected = sorted(scanned ^ set(locations))[:3]
        raise LakeError(f"Spark did not resolve the files of the Delta table at {table_dir} as listed: {unexpected}")


def _with_partition_values(
    spark: SparkSession,
    data_df: DataFrame,
    schema: StructType,
    partition_by: Sequence[str],
    files: pa.Table,
    locations: list[str],
) -> DataFrame:
    """``data_df`` with its partition columns joined from the log's typed values by file path."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, StringType, StructField, StructType

    fields = {f.name: f for f in schema.fields}
    files_schema = StructType(
        [StructField(_FILE_KEY, StringType()), StructField(_KNOWN, BooleanType())]
        + [StructField(f"{_FILE_KEY}_{i}", fields[c].dataType) for i, c in enumerate(partition_by)]
    )
    values = [files.column(f"partition.{c}").to_pylist() for c in partition_by]
    rows = [(f"file:{loc}", True, *[v[i] for v in values]) for i, loc in enumerate(locations)]
    files_df = spark.createDataFrame(rows, files_schema)
    # _metadata.file_path is the Hadoop URI of the file; decode it to the path handed to Spark
    # ('+' is literal in a URI path but a space to url_decode)
    file_path = data_df.metadataColumn("_metadata").getField("file_path")
    keyed_df = data_df.withColumn(_FILE_KEY, F.url_decode(F.replace(file_path, F.lit("+"), F.lit("%2B"))))
    joined_df = keyed_df.join(F.broadcast(files_df), on=_FILE_KEY, how="left")
    unknown = F.concat(F.lit("file not in the Delta log, cannot attach partition values: "), F.col(_FILE_KEY))
    partition_cols = {
        c: F.when(F.col(_KNOWN).isNull(), F.raise_error(unknown)).otherwise(F.col(f"{_FILE_KEY}_{i}")).alias(c)
        for i, c in enumerate(partition_by)
    }
    return joined_df.select(*[partition_cols.get(n, F.col(n)) for n in schema.fieldNames()])


def write_data_files(df: DataFrame, table_dir: str, partition_by: Sequence[str]) -> WrittenFiles:
    """Write ``df`` as Parquet files in a fresh directory inside ``table_dir``; commit nothing.

    This is the first step of a bridge write: the files stay invisible to Delta readers until
    :func:`commit_data_files` commits them. Partition columns go to ``k=v`` directories, not
    into the files.

    Returns:
        The directory and, per data file, its relative path, size, partition values and stats.

    Raises:
        LakeError: a partition column is neither a string nor an integer (Spark's directory
            names of other types are not Delta partition value strings).
        Exception: the Spark write error, after the directory is removed.
    """
    _check_partition_types(df, partition_by)
    name = f"bridge-{uuid.uuid4()}"
    directory = Path(table_dir) / name
    try:
        df.write.partitionBy(*partition_by).parquet(f"file:{directory}")
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    files = [_written_file(table_dir, name, relative, partition_by) for relative in sorted(_data_files(directory))]
    return WrittenFiles(directory, tuple(files))


def _check_partition_types(df: DataFrame, partition_by: Sequence[str]) -> None:
    from pyspark.sql.types import IntegralType, StringType

    types = {f.name: f.dataType for f in df.schema.fields}
    odd = [c for c in partition_by if not isinstance(types[c], StringType | IntegralType)]
    if odd:
        raise LakeError(f"the bridge writes string and integer partition columns only, not {odd}; use delta-spark")


def _data_files(directory: Path) -> Iterable[str]:
    """Paths (relative to ``directory``) of the Parquet files Spark wrote, hidden files aside."""
    for parent, _, names in os.walk(directory):
        for file_name in names:
            if file_name.endswith(".parquet") and not file_name.startswith((".", "_")):
                yield os.path.relpath(os.path.join(parent, file_name), directory)


def _written_file(table_dir: str, write_dir: str, relative: str, partition_by: Sequence[str]) -> WrittenFile:
    path = f"{write_dir}/{relative}"
    local = os.path.join(table_dir, path)
    status = os.stat(local)
    return WrittenFile(
        path=path,
        size=status.st_size,
        modification_time=int(status.st_mtime * 1000),
        partition_values=_directory_partition_values(relative, partition_by),
        stats=parquet_stats(local),
    )


def _directory_partition_values(relative: str, partition_by: Sequence[str]) -> dict[str, str | None]:
    """Partition values of a file Spark wrote, from its ``k=v`` directories.

    Spark escapes only ASCII characters, as ``%XX``, and ``%`` itself, so ``unquote`` inverts it.
    Spark writes both null and "" as ``__HIVE_DEFAULT_PARTITION__``; both come back as null.
    """
    segments = relative.split("/")[:-1]
    pairs = [segment.split("=", 1) for segment in segments]
    if [unquote(p[0]) for p in pairs] != list(partition_by) or any(len(p) != 2 for p in pairs):
        raise LakeError(f"Spark wrote {relative!r}, expected directories for {list(partition_by)}")
    return {unquote(k): (None if v == HIVE_NULL else unquote(v)) for k, v in pairs}


def parquet_stats(local_path: str) -> str:
    """The Delta stats JSON of a Parquet file, from its footer.

    ``numRecords``; ``nullCount`` of top-level primitive columns; exact ``minValues``/``maxValues``
    of integer, date and string (up to :data:`STATS_STRING_LIMIT` characters) columns. Bounds
    that are unknown or inexact are left out, which Delta readers treat as "any value".
    """
    meta = pq.read_metadata(local_path)
    leaves = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    stats: dict[str, Any] = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for field in meta.schema.to_arrow_schema():
        if pa.types.is_nested(field.type) or field.name not in leaves:
            continue
        chunks = [meta.row_group(g).column(leaves[field.name]).statistics for g in range(meta.num_row_groups)]
        nulls = _null_count(chunks)
        if nulls is not None:
            stats["nullCount"][field.name] = nulls
        bounds = _bounds(chunks, field.type)
        if bounds is not None:
            stats["minValues"][field.name], stats["maxValues"][field.name] = bounds
    return json.dumps(stats, separators=(",", ":"))


def _null_count(chunks: list[Any]) -> int | None:
    if any(c is None or not c.has_null_count for c in chunks):
        return None
    return sum(int(c.null_count) for c in chunks)


def _bounds(chunks: list[Any], arrow_type: pa.DataType) -> tuple[Any, Any] | None:
    """Exact (min, max) of a column over its row groups, JSON-ready, or None."""
    exact = pa.types.is_integer(arrow_type) or pa.types.is_string(arrow_type) or pa.types.is_date32(arrow_type)
    if not exact or any(c is None for c in chunks):
        return None
    with_values = [c for c in chunks if c.has_min_max]
    if not with_values or any(not c.has_min_max and c.null_count != c.num_values for c in chunks):
        return None
    low, high = min(c.min for c in with_values), max(c.max for c in with_values)
    if isinstance(low, str) and max(len(low), len(high)) > STATS_STRING_LIMIT:
        return None
    if pa.types.is_date32(arrow_type):
        return low.isoformat(), high.isoformat()
    return low, high


def _check_written_partitions(
    written: WrittenFiles, spec: TableSpec, targets: list[dict[str, str | None]] | None
) -> None:
    """Refuse null values in NOT NULL partition columns, and files outside ``targets``."""
    not_null = [c.name for c in spec.columns if c.name in spec.partition_by and not c.nullable]
    for written_file in written.files:
        values = written_file.partition_values
        if any(values[c] is None for c in not_null):
            raise ValidationError("partition_values", values, f"null in NOT NULL partition columns {not_null}")
        if targets is not None and not any(_matches(values, t) for t in targets):
            raise ValidationError(
                "partition_values",
                values,
                "the frame has rows outside the partitions being replaced",
                "filter the frame to those partitions or list them in partition_values",
            )


def _matches(values: Mapping[str, str | None], target: Mapping[str, str | None]) -> bool:
    return all(values.get(k) == v for k, v in target.items())


def commit_data_files(
    table_dir: str,
    written: WrittenFiles,
    mode: WriteMode,
    targets: PartitionTargets | None,
    txn: Transaction | None,
) -> None:
    """Commit the files of :func:`write_data_files` to the Delta table in one transaction.

    ``append`` adds them; ``overwrite`` also removes every active file; ``partitions`` also
    removes the active files of ``targets``. ``txn`` is recorded in the same commit.

    Raises:
        LakeError: delta-rs refused the commit, or a file to remove is still active afterwards.
    """
    dt = open_table(table_dir)
    partition_by = list(dt.metadata().partition_columns)
    properties = CommitProperties(app_transactions=[txn]) if txn is not None else None
    removes = _removes_in(dt, partition_by, targets or []) if mode == "partitions" else []
    actions: list[AddAction | RemoveAction] = [*[f.add_action() for f in written.files], *removes]
    try:
        retry_listing_gap(
            lambda: dt.create_write_transaction(
                actions,
                mode="overwrite" if mode == "overwrite" else "append",
                schema=dt.schema(),
                partition_by=partition_by,
                commit_properties=properties,
            )
        )
    except DeltaError as err:
        raise LakeError(f"delta-rs refused the commit to {table_dir}: {err}") from err
    _check_removed(table_dir, removes)


def _removes_in(
    dt: DeltaTable, partition_by: Sequence[str], targets: list[dict[str, str | None]]
) -> list[RemoveAction]:
    """Remove actions for the active files whose partition values match one of ``targets``."""
    now = int(time.time() * 1000)
    removes = []
    for file in active_files(add_actions(dt), partition_by).to_pylist():
        values = {c: delta_string(file[f"partition.{c}"]) for c in partition_by}
        if any(_matches(values, t) for t in targets):
            # delta-rs URL-encodes a RemoveAction's path itself: give it the decoded path
            removes.append(RemoveAction(unquote(file["path"]), True, now, file["size_bytes"], values))
    return removes


def _check_removed(table_dir: str, removes: list[RemoveAction]) -> None:
    # delta-rs accepts a remove of a path it does not know, so a remove that missed its file
    # would silently leave old rows next to the new ones
    active = {unquote(p) for p in active_files(add_actions(open_table(table_dir)), []).column("path").to_pylist()}
    still_active = {r.path for r in removes} & active
    if still_active:
        raise LakeError(
            f"the partition overwrite of {table_dir} committed but left {sorted(still_active)[:3]} active; "
            "the table holds old and new rows for those partitions, overwrite them again"
        )


def _is_committed(table_dir: str, written: WrittenFiles) -> bool:
    """Whether any file of ``written`` is active in the latest version (a commit raised late)."""
    try:
        active = active_files(add_actions(open_table(table_dir)), []).column("path").to_pylist()
    except LakeError:
        return False
    prefix = f"{written.directory.name}/"
    return any(unquote(p).startswith(prefix) for p in active)
