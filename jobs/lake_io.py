"""Lake I/O: the only code of the Spark side that reads or writes Delta tables.

:class:`Lake` is a narrow table API over a lake root, with two engines (DESIGN.md section 2):

``delta-spark``
    Spark's own Delta data source: ``format("delta")``, ``versionAsOf``, ``replaceWhere``,
    ``txnAppId``/``txnVersion``. Needs the Delta jars on the classpath.

``bridge``
    No Delta jars. Writes: Spark's Parquet writer puts the data files in a fresh directory inside
    the table directory (``<table>/bridge-<uuid>/<k>=<v>/part-*.parquet``, partition columns not
    stored in the files), then the driver commits them as Delta ``add`` actions with delta-rs,
    with partition values and per-file statistics read from the Parquet footers. Until that commit
    the files are invisible to every Delta reader, so an interrupted write changes nothing.
    Reads: delta-rs gives the active files and their typed partition values for a version; Spark's
    Parquet reader reads exactly those files with the table's data schema, and the partition
    values are joined back by file path (never parsed from Hive-style directory names).

The bridge refuses (:class:`UnsupportedTableError`) tables whose reader features it cannot
honour, rather than return wrong rows: column mapping (``delta.columnMapping.mode`` ``name`` or
``id``: the files hold physical column names), deletion vectors, and any reader feature it does
not know. Deletion vectors are refused as soon as the protocol lists the ``deletionVectors``
reader feature, even when no active file carries one: the protocol forbids a reader to read a
table with a reader feature it does not support, and the check needs no scan of the log's files.

Both engines: create a missing catalog table on first write with the catalog schema and
partition columns (bridge: delta-rs ``DeltaTable.create``; delta-spark:
``DeltaTable.createIfNotExists``), check that written frames have exactly the catalog columns and
types, enforce the catalog's NOT NULL columns, and make writes idempotent with Delta application
transactions: a write with ``(app_id, app_version)`` is skipped (returns None) when the table's
transaction version for ``app_id`` is already ``>= app_version``. delta-spark checks that
atomically with its commit; the bridge checks it just before writing and records the transaction
in the same commit as the files, so run one bridge writer per ``app_id`` at a time.

The bridge reads and writes a local (or locally mounted) lake root only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from jobs.session import resolve_engine
from schemas.catalog import Column as CatalogColumn
from schemas.catalog import TableSpec, spark_schema, table
from schemas.errors import LakeError, UnsupportedTableError, ValidationError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

WriteMode = Literal["append", "overwrite", "partitions"]
PartitionFilter = Mapping[str, Sequence[Any]]
PartitionValues = Mapping[str, Any]

# Reader features that change nothing for a reader of the active-file list and the Parquet files:
# timestampNtz only adds a type Spark reads natively; vacuumProtocolCheck only constrains VACUUM.
BRIDGE_READER_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck"})

# Spark (and Hive) write a null partition value as this directory value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

# delta-spark keeps 32-character prefixes of strings as stats; longer bounds are left out instead
# of truncated, which keeps every recorded bound exact.
STATS_STRING_LIMIT = 32

# Text of the raise_error a NOT NULL guard fails the write job with; a write error holding it
# becomes a ValidationError naming the column.
NOT_NULL_MARK = "rmq-lake NOT NULL violated by a null (or an empty partition string) in "

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


class IncrementalReadError(LakeError):
    """The rows added after a version cannot be read on their own: a commit file of the range is
    gone (log cleanup), a commit removed or rewrote data, changed the schema, or a file it added is
    gone. Read the whole table instead."""


@dataclass(frozen=True)
class WrittenFiles:
    """The output of one bridge write: its directory (under the table) and its data files."""

    directory: Path
    files: tuple[WrittenFile, ...]


class Lake:
    """Read and write the lake's Delta tables from Spark.

    Args:
        spark: the session (see :func:`jobs.session.build_session`).
        root: the lake root; catalog table ``t`` lives at ``root / t.path``.
        engine: ``"auto"``, ``"bridge"`` or ``"delta-spark"`` (see :func:`jobs.session.resolve_engine`).

    Raises:
        ValidationError: unknown engine name.
        LakeError: ``"delta-spark"`` asked for without the Delta jars.
    """

    def __init__(self, spark: SparkSession, root: str | Path, engine: str = "auto") -> None:
        self.spark = spark
        self.root = Path(root)
        self.engine = resolve_engine(spark, engine)
        self._io: _BridgeEngine | _DeltaSparkEngine = (
            _BridgeEngine(spark) if self.engine == "bridge" else _DeltaSparkEngine(spark)
        )

    def location(self, name_or_spec: str | TableSpec) -> Path:
        """The directory of a catalog table under the lake root."""
        return _spec(name_or_spec).location(self.root)

    def read(
        self,
        name_or_spec: str | TableSpec,
        version: int | None = None,
        partition_filter: PartitionFilter | None = None,
    ) -> DataFrame:
        """Read a catalog table: its columns in catalog order, with the catalog's types.

        Args:
            version: the Delta version to read; None reads the latest.
            partition_filter: ``{partition column: [values]}``; only files whose partition values
                are in every list are read (None in a list matches null).

        Raises:
            ValidationError: bad ``version`` or ``partition_filter``.
            LakeError: the table is missing, lacks ``version``, or its columns differ from the catalog.
            UnsupportedTableError: the bridge cannot read the table (see the module docstring).
        """
        spec = _spec(name_or_spec)
        _check_partition_filter(partition_filter, spec.partition_by, spec.name)
        df = self.read_path(self.location(spec), version, partition_filter)
        _check_catalog_schema(spec, df.schema, str(self.location(spec)))
        return df.select(*spec.column_names)

    def read_path(
        self,
        path: str | Path,
        version: int | None = None,
        partition_filter: PartitionFilter | None = None,
    ) -> DataFrame:
        """Read any Delta table at ``path`` with the schema of its log (columns in log order).

        Same arguments and errors as :meth:`read`, without the catalog checks.
        """
        _check_version(version)
        return self._io.read(str(path), version, partition_filter)

    def append(
        self,
        name_or_spec: str | TableSpec,
        df: DataFrame,
        app_id: str | None = None,
        app_version: int | None = None,
    ) -> int | None:
        """Append the rows of ``df`` to a catalog table, creating the table when missing.

        Args:
            df: exactly the catalog columns (any order), with the catalog types.
            app_id, app_version: a Delta application transaction; the write is skipped when the
                table already holds ``app_version`` or higher for ``app_id``.

        Returns:
            The Delta version committed, or None when the write was skipped.

        Raises:
            ValidationError: wrong columns or types, a null (or empty partition string) in a NOT
                NULL column, or a bad ``app_id``/``app_version``. Nothing is committed.
            LakeError: the existing table does not match the catalog, or the commit failed.
        """
        return self._write(name_or_spec, df, "append", None, app_id, app_version)

    def overwrite(
        self,
        name_or_spec: str | TableSpec,
        df: DataFrame,
        app_id: str | None = None,
        app_version: int | None = None,
    ) -> int | None:
        """Replace every row of a catalog table by the rows of ``df``; as :meth:`append` otherwise."""
        return self._write(name_or_spec, df, "overwrite", None, app_id, app_version)

    def overwrite_partitions(
        self,
        name_or_spec: str | TableSpec,
        df: DataFrame,
        partition_values: Sequence[PartitionValues],
        app_id: str | None = None,
        app_version: int | None = None,
    ) -> int | None:
        """Replace the rows of the given partitions by the rows of ``df``; other partitions stay.

        Args:
            partition_values: one dict per partition to replace, ``{partition column: value}``;
                a dict naming a subset of the partition columns matches every partition with
                those values. Every row of ``df`` must fall in one of them.

        Raises:
            ValidationError: as :meth:`append`, or a bad ``partition_values``, or a row of ``df``
                outside ``partition_values``. Nothing is committed.
        """
        return self._write(name_or_spec, df, "partitions", partition_values, app_id, app_version)

    def read_rows(self, name_or_spec: str | TableSpec) -> pa.Table:
        """The latest rows of a small unpartitioned catalog table, read on the driver with
        delta-rs for both engines (no Spark job); an absent table reads as empty."""
        spec = _spec(name_or_spec)
        path = str(self.location(spec))
        if not DeltaTable.is_deltatable(path):
            return spec.arrow_schema.empty_table()
        dt = open_table(path)
        _check_catalog_schema(spec, _log_schema(dt), path)
        return dt.to_pyarrow_table(columns=list(spec.column_names))

    def append_rows(
        self, name_or_spec: str | TableSpec, rows: pa.Table, app_id: str | None = None, app_version: int | None = None
    ) -> int | None:
        """Append ``rows`` to a catalog table from the driver with delta-rs, for both engines (one
        commit, no Spark job; a partitioned table gets one file per partition value), with the
        application transaction ``(app_id, app_version)`` when given; the version committed,
        None when the table already holds that transaction. For rows few enough to hold on the
        driver. Errors as :meth:`overwrite_rows`."""
        return self._write_rows(_spec(name_or_spec), rows, "append", _transaction(app_id, app_version))

    def overwrite_rows(
        self, name_or_spec: str | TableSpec, rows: pa.Table, app_id: str, app_version: int
    ) -> int | None:
        """Replace the rows of a small unpartitioned catalog table by ``rows``, written from the
        driver with delta-rs for both engines (one commit, no Spark job), with the application
        transaction ``(app_id, app_version)``; skipped (None) when the table already holds it.

        Raises:
            ValidationError: ``rows`` lacks a catalog column or has a null in a NOT NULL one, or a
                bad ``app_id``/``app_version``. Nothing is committed.
            LakeError: the table is partitioned (overwrite only), or the existing table does not
                match the catalog.
        """
        return self._write_rows(_spec(name_or_spec), rows, "overwrite", _transaction(app_id, app_version))

    def _write_rows(self, spec: TableSpec, rows: pa.Table, mode: str, txn: Transaction | None) -> int | None:
        if spec.partition_by and mode == "overwrite":
            raise LakeError(f"{spec.name} is partitioned: overwrite it with Spark (Lake.overwrite)")
        missing = [n for n in spec.column_names if n not in rows.column_names]
        if missing:
            raise ValidationError("rows", missing, f"columns of {spec.name!r} missing from the rows")
        conformed = rows.select(list(spec.column_names)).cast(spec.arrow_schema)
        for column in spec.columns:
            if not column.nullable and conformed.column(column.name).null_count:
                raise ValidationError(column.name, None, f"is NOT NULL in {spec.name!r}")
        path = str(self.location(spec))
        if not DeltaTable.is_deltatable(path):
            create_table(path, spec)
        dt = open_table(path)
        _check_catalog_schema(spec, _log_schema(dt), path)
        if txn is not None and _already_committed(dt, txn):
            return None
        properties = CommitProperties(app_transactions=[txn]) if txn is not None else None
        write_deltalake(
            path,
            conformed,
            mode="overwrite" if mode == "overwrite" else "append",
            partition_by=list(spec.partition_by) or None,
            commit_properties=properties,
        )
        return open_table(path).version()

    def version(self, name_or_spec: str | TableSpec) -> int | None:
        """The latest Delta version of a catalog table, None when the table does not exist."""
        path = str(self.location(name_or_spec))
        return self._io.version(path) if self._io.exists(path) else None

    def exists(self, name_or_spec: str | TableSpec) -> bool:
        """Whether a catalog table exists (has a Delta log)."""
        return self._io.exists(str(self.location(name_or_spec)))

    def transaction_version(self, name_or_spec: str | TableSpec, app_id: str) -> int | None:
        """The latest committed application transaction version of ``app_id``, None when none.

        Read from the log with delta-rs for both engines (delta-spark has no public API for it).
        """
        path = str(self.location(name_or_spec))
        return DeltaTable(path).transaction_version(app_id) if DeltaTable.is_deltatable(path) else None

    def read_appended(
        self, name_or_spec: str | TableSpec, after_version: int, up_to_version: int | None = None
    ) -> DataFrame:
        """The rows that the commits after ``after_version`` (up to ``up_to_version``) added.

        Reads the commit files ``_delta_log/<v>.json`` of versions ``after_version + 1`` to
        ``up_to_version`` (default: the latest) and scans exactly the data files they added with
        ``dataChange=true``, whatever the engine (the files are read as Parquet, with the partition
        values of the log). Files added with ``dataChange=false`` (compaction) hold rows that were
        already there and are skipped. An empty range gives an empty frame.

        Raises:
            ValidationError: a bad version, or ``after_version`` above ``up_to_version``.
            IncrementalReadError: the range cannot be read as appends (a commit file is gone, a
                commit removed data or changed the metadata, an added file is gone, or the table
                needs reader features the file scan cannot honour); read the whole table instead.
            LakeError: the table is missing, lacks ``up_to_version``, or differs from the catalog.
        """
        spec = _spec(name_or_spec)
        table_dir, dt, files = self._appended(spec, after_version, up_to_version)
        df = scan_files(self.spark, table_dir, _log_schema(dt), spec.partition_by, files)
        _check_catalog_schema(spec, df.schema, table_dir)
        return df.select(*spec.column_names)

    def same_data(self, name_or_spec: str | TableSpec, version: int, later: int) -> bool:
        """Whether versions ``version`` and ``later`` of the table hold the same rows, as its log
        tells: the same version, or a later one reached only by commits that add and remove no file
        with ``dataChange=true`` and change neither metadata nor protocol (a compaction, or an
        empty commit that records an application transaction). A commit file gone from the log
        (log cleanup) counts as a change: what it did cannot be told any more."""
        if version == later:
            return True
        if later < version:
            return False
        table_dir = local_directory(self.location(_spec(name_or_spec)))
        try:
            return all(
                _data_neutral(action) for v in range(version + 1, later + 1) for action in _commit_actions(table_dir, v)
            )
        except IncrementalReadError:
            return False

    def appended_size(self, name_or_spec: str | TableSpec, after_version: int, up_to_version: int | None = None) -> int:
        """Bytes of the data files :meth:`read_appended` reads (their sizes in the log), to decide
        where they are read. Errors as :meth:`read_appended`."""
        _, _, files = self._appended(_spec(name_or_spec), after_version, up_to_version)
        return int(sum(files.column("size_bytes").to_pylist()))

    def read_appended_rows(
        self,
        name_or_spec: str | TableSpec,
        columns: Sequence[str],
        after_version: int,
        up_to_version: int | None = None,
    ) -> pa.Table:
        """``columns`` of the rows of :meth:`read_appended`, read on the driver with pyarrow (no
        Spark job), partition columns typed from the log: for the narrow facts an incremental
        job needs before it plans its Spark work. Errors as :meth:`read_appended`."""
        spec = _spec(name_or_spec)
        _check_column_names(spec, "columns", columns)
        table_dir, _, files = self._appended(spec, after_version, up_to_version)
        return _read_files(table_dir, files, spec, columns)

    def iter_file_rows(
        self,
        name_or_spec: str | TableSpec,
        columns: Sequence[str],
        equal: Mapping[str, Any] | None = None,
        version: int | None = None,
        partition_filter: PartitionFilter | None = None,
        dictionaries: Sequence[str] = (),
    ) -> Iterator[pa.Table]:
        """``columns`` of the rows of the table (at ``version``; None: the latest), read on the
        driver with pyarrow one data file at a time (a table per file, in the log's order), only
        the files ``partition_filter`` keeps (see :meth:`read`) and the rows where each data
        column of ``equal`` has its value: for facts a job folds file by file without holding the
        table. An absent table yields nothing. Bridge-readable tables only; errors (raised at the
        call, before any file is read) as :meth:`read`.

        The string ``columns`` named in ``dictionaries`` come dictionary-encoded, one dictionary
        per column and file: data columns from the Parquet dictionary pages as stored (no string
        is decoded), partition columns as a one-value dictionary. For grouping by few values."""
        spec = _spec(name_or_spec)
        _check_version(version)
        _check_partition_filter(partition_filter, spec.partition_by, spec.name)
        _check_column_names(spec, "columns", columns)
        _check_column_names(spec, "equal", list(equal or {}), spec.data_columns)
        _check_column_names(spec, "dictionaries", dictionaries, list(columns))
        strings = [c for c in dictionaries if spec.arrow_schema.field(c).type != pa.string()]
        if strings:
            raise ValidationError("dictionaries", strings, "are not string columns", "name string columns only")
        table_dir = local_directory(self.location(spec))
        if not DeltaTable.is_deltatable(table_dir):
            return iter(())
        dt = open_table(table_dir, version)
        check_bridge_can_read(dt, table_dir)
        files = _prune(_active_files(dt, spec.partition_by), partition_filter)
        return _file_tables(table_dir, files, spec, columns, equal, dictionaries)

    def read_max_rows(
        self, name_or_spec: str | TableSpec, column: str, by: str, columns: Sequence[str], version: int | None = None
    ) -> pa.Table:
        """``columns`` of the rows holding the greatest ``column`` value of each value of partition
        column ``by``, read on the driver with pyarrow from the files whose statistics may hold it
        (the files with the greatest maximum of ``column``, and any file without that statistic).
        Bridge-readable tables only; errors as :meth:`read`."""
        spec = _spec(name_or_spec)
        _check_version(version)
        if by not in spec.partition_by:
            raise ValidationError("by", by, f"not a partition column of {spec.name!r}", f"use {spec.partition_by}")
        _check_column_names(spec, "columns", [*columns, column])
        table_dir = local_directory(self.location(spec))
        dt = open_table(table_dir, version)
        check_bridge_can_read(dt, table_dir)
        actions = pa.table(dt.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return pa.schema([spec.arrow_schema.field(c) for c in columns]).empty_table()
        values, highs = actions.column(f"partition.{by}").to_pylist(), _stat(actions, f"max.{column}")
        best: dict[Any, Any] = {}
        for value, high in zip(values, highs, strict=True):
            if high is not None and (value not in best or high > best[value]):
                best[value] = high
        keep = [high is None or high == best.get(value) for value, high in zip(values, highs, strict=True)]
        files = _active_files_of(actions.filter(pa.array(keep, pa.bool_())), spec.partition_by)
        rows = _read_files(table_dir, files, spec, list(dict.fromkeys([*columns, column, by])))
        if rows.num_rows == 0:
            return rows.select(list(columns))
        # the greatest value of each partition value among the rows read
        maxima = rows.group_by(by).aggregate([(column, "max")])
        joined = rows.join(maxima, by)
        return joined.filter(pc.equal(joined[column], joined[f"{column}_max"])).select(list(columns))

    def _appended(
        self, spec: TableSpec, after_version: int, up_to_version: int | None
    ) -> tuple[str, DeltaTable, pa.Table]:
        """(table directory, table at ``up_to_version``, :func:`appended_files`) of :meth:`read_appended`."""
        _check_version(after_version)
        _check_version(up_to_version)
        table_dir = local_directory(self.location(spec))
        dt = open_table(table_dir, up_to_version)
        last = dt.version()
        if after_version > last:
            raise ValidationError("after_version", after_version, f"is beyond version {last} of {spec.name!r}")
        try:
            check_bridge_can_read(dt, table_dir)
        except UnsupportedTableError as err:
            raise IncrementalReadError(str(err)) from err
        return table_dir, dt, appended_files(table_dir, after_version, last, spec)

    def read_around(
        self,
        name_or_spec: str | TableSpec,
        column: str,
        bounds: Mapping[str, int],
        by: str,
        version: int | None = None,
    ) -> DataFrame:
        """The rows of the files that may hold, for each value of partition column ``by`` listed in
        ``bounds``, the greatest ``column`` value below the bound, or any value at or above it.

        A superset chosen from the per-file min/max statistics of ``column`` in the Delta log
        (files without them are always read): with ``L`` the greatest file minimum below the
        bound, every file whose maximum is at least ``L`` is read. Callers filter the rows
        themselves. An incremental job uses it to read the few old rows next to new ones.

        Raises:
            ValidationError: ``by`` is not a partition column, or ``version`` is bad.
            IncrementalReadError: ``version`` cannot be loaded any more (log cleanup).
            LakeError, UnsupportedTableError: as :meth:`read`.
        """
        spec = _spec(name_or_spec)
        _check_version(version)
        if by not in spec.partition_by:
            raise ValidationError("by", by, f"not a partition column of {spec.name!r}", f"use {spec.partition_by}")
        table_dir = local_directory(self.location(spec))
        try:
            dt = open_table(table_dir, version)
        except LakeError as err:
            raise IncrementalReadError(str(err)) from err
        check_bridge_can_read(dt, table_dir)
        files = files_around(pa.table(dt.get_add_actions(flatten=True)), column, bounds, by, spec.partition_by)
        df = scan_files(self.spark, table_dir, _log_schema(dt), spec.partition_by, files)
        _check_catalog_schema(spec, df.schema, table_dir)
        return df.select(*spec.column_names)

    def _write(
        self,
        name_or_spec: str | TableSpec,
        df: DataFrame,
        mode: WriteMode,
        partition_values: Sequence[PartitionValues] | None,
        app_id: str | None,
        app_version: int | None,
    ) -> int | None:
        spec = _spec(name_or_spec)
        txn = _transaction(app_id, app_version)
        targets = _partition_targets(spec, partition_values) if mode == "partitions" else None
        conformed_df = conform_to_catalog(df, spec)
        path = str(self.location(spec))
        if not self._io.exists(path):
            self._io.create(path, spec)
        _check_catalog_schema(spec, self._io.schema(path), path)
        try:
            return self._io.write(path, spec, conformed_df, mode, targets, txn)
        except Exception as err:
            violation = _not_null_violation(err)
            if violation is None:
                raise
            raise violation from err


# ---------------------------------------------------------------------------------------------
# Validation shared by both engines
# ---------------------------------------------------------------------------------------------


def _spec(name_or_spec: str | TableSpec) -> TableSpec:
    return name_or_spec if isinstance(name_or_spec, TableSpec) else table(name_or_spec)


def _check_version(version: int | None) -> None:
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise ValidationError("version", version, "not a Delta version", "pass an int >= 0 or None")


def _transaction(app_id: str | None, app_version: int | None) -> Transaction | None:
    """The application transaction of a write, None when both arguments are None."""
    if app_id is None and app_version is None:
        return None
    if not isinstance(app_id, str) or not app_id:
        raise ValidationError("app_id", app_id, "not a non-empty string", "pass both app_id and app_version")
    if isinstance(app_version, bool) or not isinstance(app_version, int) or app_version < 0:
        raise ValidationError("app_version", app_version, "not an int >= 0", "pass both app_id and app_version")
    return Transaction(app_id, app_version)


def _check_partition_filter(
    partition_filter: PartitionFilter | None, partition_by: Sequence[str], table_name: str
) -> None:
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


def _partition_targets(
    spec: TableSpec, partition_values: Sequence[PartitionValues] | None
) -> list[dict[str, str | None]]:
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


def _not_null_violation(err: Exception) -> ValidationError | None:
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


def _check_catalog_schema(spec: TableSpec, actual: StructType, path: str) -> None:
    """Raise LakeError unless ``actual`` has the catalog's column names and types (any order)."""
    expected = {f.name: f.dataType.simpleString() for f in spark_schema(spec).fields}
    found = {f.name: f.dataType.simpleString() for f in actual.fields}
    if found != expected:
        differing = sorted(n for n in expected.keys() | found.keys() if expected.get(n) != found.get(n))
        raise LakeError(
            f"the Delta table at {path} does not match catalog table {spec.name!r}: columns {differing} "
            f"differ (table {[found.get(n) for n in differing]}, catalog {[expected.get(n) for n in differing]}); "
            "migrate the table or fix the lake root"
        )


def _already_committed(dt: DeltaTable, txn: Transaction) -> bool:
    committed = dt.transaction_version(txn.app_id)
    return committed is not None and committed >= txn.version


# ---------------------------------------------------------------------------------------------
# Reading the Delta log with delta-rs
# ---------------------------------------------------------------------------------------------


def open_table(path: str, version: int | None = None) -> DeltaTable:
    """The delta-rs table at ``path`` (at ``version``).

    Raises:
        LakeError: no Delta table at ``path``, or it has no ``version``.
    """
    try:
        return DeltaTable(path, version=version)
    except TableNotFoundError:
        raise LakeError(f"no Delta table at {path}; check the lake root or write the table first") from None
    except DeltaError as err:
        raise LakeError(f"cannot load version {version} of the Delta table at {path}: {err}") from err


def check_bridge_can_read(dt: DeltaTable, path: str) -> None:
    """Refuse a table whose reader features the bridge cannot honour.

    Raises:
        UnsupportedTableError: column mapping, deletion vectors, or an unknown reader feature.
    """
    protocol = dt.protocol()
    mapping = dt.metadata().configuration.get("delta.columnMapping.mode", "none")
    features = set(protocol.reader_features or []) - {"columnMapping"}
    problem = ""
    if mapping != "none":
        problem = f"column mapping (delta.columnMapping.mode={mapping!r}: files hold physical column names)"
    elif "deletionVectors" in features:
        problem = "deletion vectors (reader feature 'deletionVectors': rows deleted without rewriting files)"
    elif features - BRIDGE_READER_FEATURES:
        problem = f"reader features {sorted(features - BRIDGE_READER_FEATURES)}"
    elif protocol.min_reader_version > 3:
        problem = f"reader protocol version {protocol.min_reader_version}"
    if problem:
        raise UnsupportedTableError(
            f"the bridge engine cannot read the Delta table at {path}: it uses {problem}, and reading it "
            "file by file would return wrong rows; read it with the delta-spark engine "
            "(Delta jars on the classpath, spark.rmq.lake.engine=delta-spark)"
        )


def _log_schema(dt: DeltaTable) -> StructType:
    """The table's logical schema as a Spark StructType (Delta's schema JSON is Spark's)."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(dt.schema().to_json()))


def _active_files(dt: DeltaTable, partition_by: Sequence[str]) -> pa.Table:
    """One row per active file: ``path`` (as in the log, URL-encoded), ``size_bytes``, ``partition.<col>``."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return pa.table({"path": pa.array([], pa.string()), "size_bytes": pa.array([], pa.int64())})
    return actions.select(["path", "size_bytes", *[f"partition.{c}" for c in partition_by]])


def _prune(files: pa.Table, partition_filter: PartitionFilter | None) -> pa.Table:
    """The files whose partition values are in every list of ``partition_filter``."""
    if not partition_filter or files.num_rows == 0:
        return files
    mask = pa.array([True] * files.num_rows, pa.bool_())
    for column, values in partition_filter.items():
        typed = files.column(f"partition.{column}")
        try:
            value_set = pa.array(list(values), type=typed.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as err:
            raise ValidationError(f"partition_filter[{column!r}]", values, f"not values of type {typed.type}") from err
        mask = pc.and_(mask, pc.fill_null(pc.is_in(typed, value_set=value_set, skip_nulls=False), False))
    return files.filter(mask)


def _delta_string(value: Any) -> str | None:
    """A typed partition value (from delta-rs) as its Delta partition value string."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def appended_files(table_dir: str, after_version: int, last_version: int, spec: TableSpec) -> pa.Table:
    """The data files added with ``dataChange=true`` by commits ``after_version + 1 .. last_version``.

    Returns the shape of :func:`_active_files`: ``path`` (as in the log), ``size_bytes`` and
    ``partition.<col>`` typed as the catalog declares.

    Raises:
        IncrementalReadError: see :meth:`Lake.read_appended`.
    """
    adds: dict[str, dict[str, Any]] = {}
    for version in range(after_version + 1, last_version + 1):
        for action in _commit_actions(table_dir, version):
            _collect_append(adds, action, version, table_dir)
    missing = [p for p in adds if not os.path.exists(file_location(table_dir, p))]
    if missing:
        raise IncrementalReadError(f"files added to {table_dir} after version {after_version} are gone: {missing[:3]}")
    types = {c.name: c.type for c in spec.columns}
    columns: dict[str, pa.Array] = {
        "path": pa.array(list(adds), pa.string()),
        "size_bytes": pa.array([a["size"] for a in adds.values()], pa.int64()),
    }
    for name in spec.partition_by:
        values = [a["partitionValues"].get(name) for a in adds.values()]
        columns[f"partition.{name}"] = pa.array(values, pa.string()).cast(types[name])
    return pa.table(columns)


def _commit_actions(table_dir: str, version: int) -> list[dict[str, Any]]:
    path = Path(table_dir) / "_delta_log" / f"{version:020d}.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise IncrementalReadError(
            f"the commit file {path} is gone (log cleanup); the rows added since then cannot be told apart"
        ) from None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _data_neutral(action: Mapping[str, Any]) -> bool:
    """Whether a log action leaves the table's rows and schema as they were."""
    if "metaData" in action or "protocol" in action:
        return False
    for kind in ("add", "remove"):
        if kind in action and action[kind].get("dataChange", True):
            return False
    return True


def _collect_append(adds: dict[str, dict[str, Any]], action: dict[str, Any], version: int, table_dir: str) -> None:
    """Record an ``add`` of ``action`` in ``adds``; refuse actions that are not appends."""
    if "metaData" in action:
        raise IncrementalReadError(f"version {version} of {table_dir} changed the table's metadata")
    if "add" in action and action["add"].get("dataChange", True):
        adds[action["add"]["path"]] = action["add"]
    elif "remove" in action:
        removed = action["remove"]
        if removed.get("dataChange", True) or removed["path"] in adds:
            raise IncrementalReadError(f"version {version} of {table_dir} removed or rewrote {removed['path']!r}")


def files_around(
    actions: pa.Table, column: str, bounds: Mapping[str, int], by: str, partition_by: Sequence[str]
) -> pa.Table:
    """The files of ``actions`` (``get_add_actions(flatten=True)``) that :meth:`Lake.read_around` reads.

    The greatest value below a bound lies in a file whose maximum is at least ``L``, the greatest
    known file minimum below the bound (that file holds ``L`` itself); rows at or above the bound
    lie in files whose maximum is at least the bound, which is above ``L``.
    """
    if actions.num_rows == 0:
        return _active_files_of(actions, partition_by)
    values = actions.column(f"partition.{by}").to_pylist()
    lows, highs = _stat(actions, f"min.{column}"), _stat(actions, f"max.{column}")
    floors: dict[str, int] = {}
    for value, low in zip(values, lows, strict=True):
        if value in bounds and low is not None and low < bounds[value]:
            floors[value] = max(floors.get(value, low), low)
    keep = [
        value in bounds and (low is None or high is None or high >= floors.get(value, bounds[value]))
        for value, low, high in zip(values, lows, highs, strict=True)
    ]
    return _active_files_of(actions.filter(pa.array(keep, pa.bool_())), partition_by)


def _check_column_names(
    spec: TableSpec, option: str, columns: Sequence[str], allowed: Sequence[str] | None = None
) -> None:
    """Refuse ``columns`` that are not among ``allowed`` (default: every column of ``spec``)."""
    allowed = spec.column_names if allowed is None else allowed
    unknown = [c for c in columns if c not in allowed]
    if unknown:
        raise ValidationError(option, unknown, f"not columns of {spec.name!r} here", f"use {list(allowed)}")


def _read_files(table_dir: str, files: pa.Table, spec: TableSpec, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the rows of ``files`` (the shape of :func:`_active_files`), read with pyarrow
    on the driver; partition columns from the log's values, every column typed as the catalog says."""
    parts = list(_file_tables(table_dir, files, spec, columns))
    return pa.concat_tables(parts) if parts else pa.schema([spec.arrow_schema.field(c) for c in columns]).empty_table()


def _file_tables(
    table_dir: str,
    files: pa.Table,
    spec: TableSpec,
    columns: Sequence[str],
    equal: Mapping[str, Any] | None = None,
    dictionaries: Sequence[str] = (),
) -> Iterator[pa.Table]:
    """:func:`_read_files` one file at a time, each file's rows where every data column of
    ``equal`` has its value (a filter the Parquet reader applies); ``dictionaries`` as
    :meth:`Lake.iter_file_rows` says."""
    schema = spec.arrow_schema
    data_columns = [c for c in columns if c not in spec.partition_by]
    coded = pa.dictionary(pa.int32(), pa.string())
    target = pa.schema([schema.field(c).with_type(coded) if c in dictionaries else schema.field(c) for c in columns])
    filters = [(column, "=", value) for column, value in (equal or {}).items()] or None
    read_dictionary = [c for c in dictionaries if c in data_columns] or None
    for i, path in enumerate(files.column("path").to_pylist()):
        part = pq.read_table(
            file_location(table_dir, path), columns=data_columns, filters=filters, read_dictionary=read_dictionary
        )
        for column in (c for c in columns if c in spec.partition_by):
            value = files.column(f"partition.{column}")[i]
            if column in dictionaries:
                indices = pa.array(np.zeros(part.num_rows, np.int32))
                constant: pa.Array = pa.DictionaryArray.from_arrays(indices, pa.array([value.as_py()], pa.string()))
            else:
                constant = pa.repeat(value, part.num_rows).cast(value.type)
            part = part.append_column(target.field(column), constant)
        yield part.select(list(columns)).cast(target).unify_dictionaries()


def _stat(actions: pa.Table, name: str) -> list[Any]:
    """A per-file statistic column as a list, all None when no file has it."""
    return actions.column(name).to_pylist() if name in actions.column_names else [None] * actions.num_rows


def _active_files_of(actions: pa.Table, partition_by: Sequence[str]) -> pa.Table:
    if actions.num_rows == 0:
        return pa.table({"path": pa.array([], pa.string()), "size_bytes": pa.array([], pa.int64())})
    return actions.select(["path", "size_bytes", *[f"partition.{c}" for c in partition_by]])


# ---------------------------------------------------------------------------------------------
# The bridge engine
# ---------------------------------------------------------------------------------------------


def local_directory(path: str | Path) -> str:
    """The absolute local path of a table location (a path or a ``file:`` URI).

    Raises:
        LakeError: the location is on another file system (the bridge writes local files only).
    """
    text = str(path)
    parts = urlsplit(text)
    if len(parts.scheme) > 1 and parts.scheme != "file":
        raise LakeError(
            f"the bridge engine reads and writes local paths only, not {text!r}; "
            "use the delta-spark engine for remote storage"
        )
    return os.path.abspath(unquote(parts.path) if parts.scheme == "file" else text)


def file_location(table_dir: str, log_path: str) -> str:
    """The absolute local path of a file named in the log (relative and URL-encoded, or a URI)."""
    parts = urlsplit(log_path)
    if len(parts.scheme) > 1:
        return local_directory(log_path)
    return f"{table_dir}/{unquote(log_path)}"


class _BridgeEngine:
    """Spark Parquet files committed and listed through delta-rs (see the module docstring)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def read(self, path: str, version: int | None, partition_filter: PartitionFilter | None) -> DataFrame:
        table_dir = local_directory(path)
        dt = open_table(table_dir, version)
        check_bridge_can_read(dt, path)
        schema = _log_schema(dt)
        partition_by = list(dt.metadata().partition_columns)
        _check_partition_filter(partition_filter, partition_by, path)
        files = _prune(_active_files(dt, partition_by), partition_filter)
        return scan_files(self.spark, table_dir, schema, partition_by, files)

    def exists(self, path: str) -> bool:
        return DeltaTable.is_deltatable(local_directory(path))

    def version(self, path: str) -> int:
        return open_table(local_directory(path)).version()

    def schema(self, path: str) -> StructType:
        return _log_schema(open_table(local_directory(path)))

    def create(self, path: str, spec: TableSpec) -> None:
        create_table(local_directory(path), spec)

    def write(
        self,
        path: str,
        spec: TableSpec,
        df: DataFrame,
        mode: WriteMode,
        targets: list[dict[str, str | None]] | None,
        txn: Transaction | None,
    ) -> int | None:
        """Write and commit ``df``; None when ``txn`` is already committed (nothing written)."""
        table_dir = local_directory(path)
        dt = open_table(table_dir)
        check_bridge_can_read(dt, path)
        if txn is not None and _already_committed(dt, txn):
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
    """A DataFrame of exactly ``files`` (from :func:`_active_files`), columns in ``schema`` order.

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
    targets: list[dict[str, str | None]] | None,
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
        dt.create_write_transaction(
            actions,
            mode="overwrite" if mode == "overwrite" else "append",
            schema=dt.schema(),
            partition_by=partition_by,
            commit_properties=properties,
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
    for file in _active_files(dt, partition_by).to_pylist():
        values = {c: _delta_string(file[f"partition.{c}"]) for c in partition_by}
        if any(_matches(values, t) for t in targets):
            # delta-rs URL-encodes a RemoveAction's path itself: give it the decoded path
            removes.append(RemoveAction(unquote(file["path"]), True, now, file["size_bytes"], values))
    return removes


def _check_removed(table_dir: str, removes: list[RemoveAction]) -> None:
    # delta-rs accepts a remove of a path it does not know, so a remove that missed its file
    # would silently leave old rows next to the new ones
    active = {unquote(p) for p in _active_files(open_table(table_dir), []).column("path").to_pylist()}
    still_active = {r.path for r in removes} & active
    if still_active:
        raise LakeError(
            f"the partition overwrite of {table_dir} committed but left {sorted(still_active)[:3]} active; "
            "the table holds old and new rows for those partitions, overwrite them again"
        )


def _is_committed(table_dir: str, written: WrittenFiles) -> bool:
    """Whether any file of ``written`` is active in the latest version (a commit raised late)."""
    try:
        active = _active_files(open_table(table_dir), []).column("path").to_pylist()
    except LakeError:
        return False
    prefix = f"{written.directory.name}/"
    return any(unquote(p).startswith(prefix) for p in active)


# ---------------------------------------------------------------------------------------------
# The delta-spark engine
# ---------------------------------------------------------------------------------------------


class _DeltaSparkEngine:
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

    def write(
        self,
        path: str,
        spec: TableSpec,
        df: DataFrame,
        mode: WriteMode,
        targets: list[dict[str, str | None]] | None,
        txn: Transaction | None,
    ) -> int | None:
        """Write ``df``; None when Delta skipped it as an already committed ``txn``.

        Delta itself skips a write whose ``txnVersion`` is not above the table's version for
        ``txnAppId``; the skip is seen as an unchanged table version (a concurrent writer's commit
        in between would hide it).
        """
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


def replace_where(spec: TableSpec, targets: list[dict[str, str | None]]) -> str:
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
