"""The lake door: :class:`Lake`, a narrow table API over a lake root, the only code of the Spark side
that reads or writes Delta tables, with two engines: delta-spark (Delta's own data source, where its
jars are on the classpath) and the bridge (Spark's Parquet reader and writer on the files a Delta
log lists, committed with delta-rs). Both honour the catalog's columns, NOT NULL and application
transactions; the bridge refuses tables it cannot read exactly. See docs/lake.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.transaction import CommitProperties, Transaction

from broker_model.store import load_table, pack_small_files, read_changes, retry_listing_gap
from jobs.lake.bridge import BridgeEngine, WrittenFiles, commit_data_files, scan_files, write_data_files
from jobs.lake.conform import (
    check_catalog_schema,
    check_partition_filter,
    conform_to_catalog,
    create_table,
    not_null_violation,
    partition_targets,
)
from jobs.lake.costs import ReadCost, files_cost, overlapping
from jobs.lake.delta_spark import DeltaSparkEngine
from jobs.lake.driver_reads import FileReader, read_files, read_matching, scan_chunks
from jobs.lake.engine import LakeEngine, PartitionFilter, PartitionValues, TableWrite, WriteMode
from jobs.lake.session import resolve_engine
from jobs.lake.snapshots import (
    IncrementalReadError,
    RowFilters,
    active_files,
    add_actions,
    already_committed,
    appended_files,
    bridge_can_read,
    check_bridge_can_read,
    file_statistic,
    files_around,
    is_table,
    local_directory,
    local_or_none,
    log_schema,
    open_table,
    ordered_files,
    prune,
    table_version,
)
from schemas.catalog import TableSpec, table
from schemas.errors import LakeError, UnsupportedTableError, ValidationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


SHARED_APPEND_BYTES = 64 << 20
"""Appended rows in data files of at most this many bytes are read whole once and shared."""
# Tables appended to a row or two at a time and never read incrementally, whose small files
# :meth:`Lake.append_rows` packs once they pile up (a packing rewrites appended files, which sends
# an incremental reader of a range across it back to a whole read).
PACKED_ON_APPEND = frozenset({"job_runs"})
SHARED_APPEND_TABLES = 8  # tables whose latest appended rows are kept
# per table directory, the latest small range of appended rows read on the driver, every column: the
# jobs of one nightly read the same new rows one after another, and committed versions never change
_RECENT_APPENDS: dict[str, tuple[tuple[int, int, tuple[str, ...]], pa.Table]] = {}


def _append_key(after_version: int, dt: DeltaTable, files: pa.Table) -> tuple[int, int, tuple[str, ...]]:
    """The key of an appended range's rows in :data:`_RECENT_APPENDS`: a replaced table has new file names."""
    return after_version, dt.version(), tuple(files.column("path").to_pylist())


class Lake:
    """Read and write the lake's Delta tables from Spark.

    Args:
        spark: the session (see :func:`jobs.lake.session.build_session`).
        root: the lake root; catalog table ``t`` lives at ``root / t.path``.
        engine: ``"auto"``, ``"bridge"`` or ``"delta-spark"`` (see :func:`jobs.lake.session.resolve_engine`).

    Raises:
        ValidationError: unknown engine name.
        LakeError: ``"delta-spark"`` asked for without the Delta jars.
    """

    def __init__(self, spark: SparkSession, root: str | Path, engine: str = "auto") -> None:
        self.spark = spark
        self.root = Path(root)
        self.engine = resolve_engine(spark, engine)
        self._io: LakeEngine = BridgeEngine(spark) if self.engine == "bridge" else DeltaSparkEngine(spark)
        # the appended files of version ranges already planned: committed versions never change
        self._appended_ranges: dict[tuple[str, int, int], tuple[str, DeltaTable, pa.Table]] = {}

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
        check_partition_filter(partition_filter, spec.partition_by, spec.name)
        df = self.read_path(self.location(spec), version, partition_filter)
        check_catalog_schema(spec, df.schema, str(self.location(spec)))
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

    def read_rows(
        self,
        name_or_spec: str | TableSpec,
        columns: Sequence[str] | None = None,
        filters: RowFilters | None = None,
        version: int | None = None,
    ) -> pa.Table:
        """The rows of a catalog table (at ``version``; None: the latest) read on the driver for
        both engines (no Spark job): all ``columns`` by default, only rows matching every
        ``(column, op, value)`` of ``filters``, or any list of them when ``filters`` is a list of
        lists (partition values prune files, statistics prune the rest; read with delta-rs). For
        tables, or filtered parts, small enough to hold on the driver; an absent table reads as
        empty. A whole local table the bridge can read goes through one dataset scan of its files
        (:func:`read_files`), which opens many small files for a fraction of what delta-rs's
        reader costs per file (a broker appends one file of offset commits per flush)."""
        spec = _spec(name_or_spec)
        _check_version(version)
        names = list(columns) if columns is not None else list(spec.column_names)
        path = str(self.location(spec))
        if not is_table(path):
            return spec.arrow_schema.empty_table().select(names)
        dt = open_table(path, version)  # the process's snapshot of that version
        check_catalog_schema(spec, log_schema(dt), path, names if columns is not None else None)
        table_dir = local_or_none(path)
        if table_dir is not None and bridge_can_read(dt):
            actions = add_actions(dt)
            if filters:
                return read_matching(table_dir, actions, spec, names, filters)
            return read_files(table_dir, active_files(actions, spec.partition_by), spec, names)
        return dt.to_pyarrow_table(columns=names, filters=list(filters) if filters else None)

    def schema(self, name_or_spec: str | TableSpec) -> pa.Schema | None:
        """The Arrow schema the table's Delta log declares, None when there is no table."""
        path = str(self.location(name_or_spec))
        return pa.schema(open_table(path).schema().to_arrow()) if is_table(path) else None

    def newest_value(
        self, name_or_spec: str | TableSpec, column: str, version: int | None = None, strict: bool = False
    ) -> Any:
        """The greatest value of ``column`` in the table's active files (at ``version``; None: the
        latest), from the ``max`` statistics of the Delta log (no file is read); None when the
        table is absent or no file has that statistic. ``strict``: None also when a file that may
        hold rows lacks it, so that a value returned bounds every row."""
        _check_version(version)
        path = str(self.location(name_or_spec))
        if not is_table(path):
            return None
        actions = add_actions(open_table(path, version))
        name = f"max.{column}"
        if not actions.num_rows or name not in actions.column_names:
            return None
        if strict:
            records = actions.column("num_records") if "num_records" in actions.column_names else None
            may_hold = pc.invert(pc.fill_null(pc.equal(records, 0), False)) if records is not None else None
            lacking = pc.is_null(actions.column(name))
            if pc.any(pc.and_(lacking, may_hold) if may_hold is not None else lacking).as_py():
                return None
        return pc.max(actions.column(name)).as_py()

    def row_count(self, name_or_spec: str | TableSpec, version: int | None = None) -> int:
        """The number of rows of the table (at ``version``; None: the latest): the sum of the
        ``numRecords`` statistics of its active files, counted by a scan when a file lacks it; 0
        when the table is absent."""
        _check_version(version)
        spec = _spec(name_or_spec)
        path = str(self.location(spec))
        if not is_table(path):
            return 0
        actions = add_actions(open_table(path, version))
        if not actions.num_rows:
            return 0
        records = actions.column("num_records") if "num_records" in actions.column_names else None
        if records is None or records.null_count:
            return self.read(spec, version=version).count()
        return int(pc.sum(records).as_py())

    def read_cost(
        self,
        name_or_spec: str | TableSpec,
        version: int | None = None,
        partition_filter: PartitionFilter | None = None,
        ranges: Mapping[str, tuple[Any, Any]] | None = None,
    ) -> ReadCost:
        """What a read on the driver of the table (at ``version``; None: the latest) would go
        through, from its log alone: the files ``partition_filter`` keeps (as :meth:`read`) whose
        statistics overlap each closed range of ``ranges`` (column -> (low, high)). Nothing for an
        absent table.

        Raises:
            ValidationError: a bad version, partition filter or range column.
        """
        spec = _spec(name_or_spec)
        _check_version(version)
        check_partition_filter(partition_filter, list(spec.partition_by), spec.name)
        check_column_names(spec, "ranges", list(ranges or {}), spec.data_columns)
        table_dir = local_directory(self.location(spec))
        if not is_table(table_dir):
            return ReadCost()
        actions = add_actions(open_table(table_dir, version))
        if partition_filter and actions.num_rows:
            kept = prune(active_files(actions, spec.partition_by), partition_filter).column("path")
            actions = actions.filter(pc.is_in(actions.column("path"), value_set=kept))
        return files_cost(table_dir, overlapping(actions, ranges or {}))

    def appended_cost(
        self, name_or_spec: str | TableSpec, after_version: int, up_to_version: int | None = None
    ) -> ReadCost:
        """What :meth:`read_appended_rows` of the range would go through, from the log alone: no
        file when a job of this process read the range already (its rows are kept, see
        :meth:`read_appended_rows`; a nightly's jobs read the same appends one after another).
        Errors as :meth:`read_appended`."""
        table_dir, dt, files = self._appended(_spec(name_or_spec), after_version, up_to_version)
        actions = add_actions(dt)
        if actions.num_rows:
            actions = actions.filter(pc.is_in(actions.column("path"), value_set=files.column("path")))
        cost = files_cost(table_dir, actions)
        shared = _RECENT_APPENDS.get(table_dir)
        if shared is not None and shared[0] == _append_key(after_version, dt, files):
            return ReadCost(rows=shared[1].num_rows, bytes=cost.bytes)
        return cost

    def stage_files(self, name_or_spec: str | TableSpec, df: DataFrame, stage_by: str) -> WrittenFiles:
        """Write ``df`` (the table's columns plus ``stage_by``) as data files inside the table,
        split by the values of ``stage_by``, and commit nothing: the files stay invisible until
        :meth:`commit_staged`. Bridge engine only; creates the table when absent.

        Raises:
            LakeError: the engine is delta-spark (it has no uncommitted writes), or the table
                exists with features the bridge cannot honour.
        """
        if self.engine != "bridge":
            raise LakeError("staged writes need the bridge engine; with delta-spark write each batch with append")
        spec = _spec(name_or_spec)
        table_dir = local_directory(self.location(spec))
        if not is_table(table_dir):
            create_table(table_dir, spec)
        check_bridge_can_read(open_table(table_dir), table_dir)
        return write_data_files(df, table_dir, [stage_by])

    def commit_staged(
        self, name_or_spec: str | TableSpec, files: WrittenFiles, app_id: str, app_version: int
    ) -> int | None:
        """Commit staged files (:meth:`stage_files`, their staging partition values dropped) as one
        append with the application transaction ``(app_id, app_version)``; skipped (None) when the
        table already holds that version (a commit that raised after it landed)."""
        table_dir = local_directory(self.location(name_or_spec))
        committed = open_table(table_dir).transaction_version(app_id)
        if committed is not None and committed >= app_version:
            return None
        commit_data_files(table_dir, files, "append", None, Transaction(app_id, app_version))
        return open_table(table_dir).version()

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
        self, name_or_spec: str | TableSpec, rows: pa.Table, app_id: str | None = None, app_version: int | None = None
    ) -> int | None:
        """Replace the rows of a small unpartitioned catalog table by ``rows``, written from the
        driver with delta-rs for both engines (one commit, no Spark job), with the application
        transaction ``(app_id, app_version)`` when given; skipped (None) when the table already
        holds it.

        Raises:
            ValidationError: ``rows`` lacks a catalog column or has a null in a NOT NULL one, or a
                bad ``app_id``/``app_version``. Nothing is committed.
            LakeError: the table is partitioned (overwrite only), or the existing table does not
                match the catalog.
        """
        return self._write_rows(_spec(name_or_spec), rows, "overwrite", _transaction(app_id, app_version))

    def replace_rows_where(self, name_or_spec: str | TableSpec, rows: pa.Table, predicate: str) -> int | None:
        """Replace the rows of a small unpartitioned catalog table that match the SQL ``predicate``
        by ``rows`` (each of which must match it), from the driver with delta-rs for both engines:
        one commit. The version committed. Errors as :meth:`overwrite_rows`."""
        return self._write_rows(_spec(name_or_spec), rows, "overwrite", None, predicate)

    def _write_rows(
        self, spec: TableSpec, rows: pa.Table, mode: str, txn: Transaction | None, predicate: str | None = None
    ) -> int | None:
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
        if not is_table(path):
            create_table(path, spec)
        dt = open_table(path)
        check_catalog_schema(spec, log_schema(dt), path)
        if txn is not None and already_committed(dt, txn):
            return None
        properties = CommitProperties(app_transactions=[txn]) if txn is not None else None
        if mode == "overwrite":
            retry_listing_gap(
                lambda: write_deltalake(
                    path, conformed, mode="overwrite", predicate=predicate, commit_properties=properties
                )
            )
        else:
            partition_by = list(spec.partition_by) or None
            retry_listing_gap(
                lambda: write_deltalake(
                    path, conformed, mode="append", partition_by=partition_by, commit_properties=properties
                )
            )
        # the new version from a probe or a listing of the log: loading it would replay the log
        version = table_version(local_directory(path))
        if mode == "append" and spec.name in PACKED_ON_APPEND:
            pack_small_files(path, dt, appended=1 if conformed.num_rows else 0)
        return version

    def pack_read_files(self, name_or_spec: str | TableSpec, version: int) -> int | None:
        """Pack the small files of a table its reader reads incrementally, among the files active
        at ``version``, the version that reader has read (:func:`pack_small_files`: once a
        partition holds more than 16, one commit that changes no row); the files appended after
        it stay, so that the reader's next run still reads its range without reading whole. The
        version committed; None when there was nothing to pack, the table is absent or not
        local, or a concurrent commit conflicted."""
        try:
            table_dir = local_directory(self.location(name_or_spec))
        except LakeError:  # delta-spark on remote storage: Delta's own OPTIMIZE is the tool there
            return None
        if not is_table(table_dir):
            return None
        _check_version(version)
        return pack_small_files(table_dir, files_up_to=version)

    def add_missing_columns(self, name_or_spec: str | TableSpec) -> int | None:
        """Add to an existing table the nullable catalog columns it lacks (a table an older version
        of the product created), with delta-rs for both engines: one commit that changes no row;
        rows written before read the new columns as null. The version committed; None when the
        table is absent or has every column.

        Raises:
            LakeError: the table lacks a NOT NULL catalog column, or a column it has differs from
                the catalog (see :meth:`read`): no write can make it the catalog's.
        """
        spec = _spec(name_or_spec)
        path = str(self.location(spec))
        if not is_table(path):
            return None
        present = set(log_schema(open_table(path)).fieldNames())
        missing = [column for column in spec.columns if column.name not in present]
        if not missing:
            return None
        required = [column.name for column in missing if not column.nullable]
        if required:
            raise LakeError(f"the Delta table at {path} lacks the NOT NULL catalog columns {required}; migrate it")
        schema = DeltaSchema.from_arrow(pa.schema([spec.arrow_schema.field(column.name) for column in missing]))
        load_table(path).alter.add_columns(list(schema.fields))
        version = table_version(local_directory(path))
        check_catalog_schema(spec, log_schema(open_table(path)), path)
        return version

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
        return open_table(path).transaction_version(app_id) if is_table(path) else None

    def read_appended(
        self, name_or_spec: str | TableSpec, after_version: int, up_to_version: int | None = None
    ) -> DataFrame:
        """The rows that the commits after ``after_version`` (up to ``up_to_version``) added.

        Reads the commit files of versions ``after_version + 1`` to
        ``up_to_version`` (default: the latest) and scans exactly the data files they added with
        ``dataChange=true``, whatever the engine (the files are read as Parquet, with the partition
        values of the log). Files added with ``dataChange=false`` (compaction) hold rows that were
        already there and are skipped, unless they rewrite files appended in the range only (a
        packing of them, :func:`jobs.lake.packing.pack_appended`): they stand for those files then.
        An empty range gives an empty frame.

        Raises:
            ValidationError: a bad version, or ``after_version`` above ``up_to_version``.
            IncrementalReadError: the range cannot be read as appends (a commit file is gone, a
                commit removed data or changed the metadata, an added file is gone, or the table
                needs reader features the file scan cannot honour); read the whole table instead.
            LakeError: the table is missing, lacks ``up_to_version``, or differs from the catalog.
        """
        spec = _spec(name_or_spec)
        table_dir, dt, files = self._appended(spec, after_version, up_to_version)
        df = scan_files(self.spark, table_dir, log_schema(dt), spec.partition_by, files)
        check_catalog_schema(spec, df.schema, table_dir)
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
        changes = read_changes(table_dir, version, later)
        return all(change is not None and change.data_neutral for change in changes)

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
        job needs before it plans its Spark work. A range whose data files hold at most
        :data:`SHARED_APPEND_BYTES` is read whole once and kept for the next call on the same
        range and files, from any ``Lake`` of the process. Errors as :meth:`read_appended`."""
        spec = _spec(name_or_spec)
        check_column_names(spec, "columns", columns)
        table_dir, dt, files = self._appended(spec, after_version, up_to_version)
        if int(pc.sum(files.column("size_bytes")).as_py() or 0) > SHARED_APPEND_BYTES:
            return read_files(table_dir, files, spec, columns)
        key = _append_key(after_version, dt, files)
        shared = _RECENT_APPENDS.get(table_dir)
        if shared is None or shared[0] != key:
            shared = key, read_files(table_dir, files, spec, spec.column_names)
            _RECENT_APPENDS.pop(table_dir, None)
            _RECENT_APPENDS[table_dir] = shared
            while len(_RECENT_APPENDS) > SHARED_APPEND_TABLES:
                del _RECENT_APPENDS[next(iter(_RECENT_APPENDS))]  # the least recently read table
        return shared[1].select(list(columns))

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
        check_partition_filter(partition_filter, spec.partition_by, spec.name)
        check_column_names(spec, "equal", list(equal or {}), spec.data_columns)
        opened = self._open_for_driver(spec, version, columns, dictionaries)
        if opened is None:
            return iter(())
        table_dir, dt = opened
        files = prune(active_files(add_actions(dt), spec.partition_by), partition_filter)
        return map(FileReader(table_dir, files, spec, columns, equal, dictionaries), range(files.num_rows))

    def iter_row_chunks(
        self,
        name_or_spec: str | TableSpec,
        columns: Sequence[str],
        version: int | None = None,
        dictionaries: Sequence[str] = (),
        chunk_rows: int = 1 << 21,
        order_by: str | None = None,
        partition_filter: PartitionFilter | None = None,
    ) -> Iterator[pa.Table]:
        """``columns`` of every row of the table (at ``version``; None: the latest), read on the
        driver as tables of consecutive data files holding about ``chunk_rows`` rows together (a
        file is never split), several files at once: for facts a job folds over the table without
        holding it, faster than :meth:`iter_file_rows` on tables of many small files. Files are
        ordered by partition values, then by the least ``order_by`` value each holds (its
        statistic), so that a chunk holds a range of each partition. ``partition_filter`` keeps
        the files of the listed partition values (as :meth:`read`). ``dictionaries`` and errors
        (raised at the call) as :meth:`iter_file_rows`."""
        spec = _spec(name_or_spec)
        if chunk_rows < 1:
            raise ValidationError("chunk_rows", chunk_rows, "must be at least 1")
        if order_by is not None:
            check_column_names(spec, "order_by", [order_by], spec.data_columns)
        check_partition_filter(partition_filter, list(spec.partition_by), spec.name)
        opened = self._open_for_driver(spec, version, columns, dictionaries)
        if opened is None:
            return iter(())
        table_dir, dt = opened
        files = prune(ordered_files(dt, spec, order_by), partition_filter)
        return scan_chunks(table_dir, files, spec, columns, dictionaries, chunk_rows)

    def _open_for_driver(
        self, spec: TableSpec, version: int | None, columns: Sequence[str], dictionaries: Sequence[str]
    ) -> tuple[str, DeltaTable] | None:
        """(table directory, table at ``version``) for a read on the driver of ``columns``, the
        string ones in ``dictionaries`` dictionary-encoded; None when the table does not exist.

        Raises:
            ValidationError: a bad version, a column not in the table, a dictionary column that
                is no string column or not among ``columns``.
            UnsupportedTableError: the table uses features the bridge cannot read.
        """
        _check_version(version)
        check_column_names(spec, "columns", columns)
        check_column_names(spec, "dictionaries", dictionaries, list(columns))
        strings = [c for c in dictionaries if spec.arrow_schema.field(c).type != pa.string()]
        if strings:
            raise ValidationError("dictionaries", strings, "are not string columns", "name string columns only")
        table_dir = local_directory(self.location(spec))
        if not is_table(table_dir):
            return None
        dt = open_table(table_dir, version)
        check_bridge_can_read(dt, table_dir)
        return table_dir, dt

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
        check_column_names(spec, "columns", [*columns, column])
        table_dir = local_directory(self.location(spec))
        dt = open_table(table_dir, version)
        check_bridge_can_read(dt, table_dir)
        actions = add_actions(dt)
        if actions.num_rows == 0:
            return pa.schema([spec.arrow_schema.field(c) for c in columns]).empty_table()
        values, highs = actions.column(f"partition.{by}").to_pylist(), file_statistic(actions, f"max.{column}")
        best: dict[Any, Any] = {}
        for value, high in zip(values, highs, strict=True):
            if high is not None and (value not in best or high > best[value]):
                best[value] = high
        keep = [high is None or high == best.get(value) for value, high in zip(values, highs, strict=True)]
        files = active_files(actions.filter(pa.array(keep, pa.bool_())), spec.partition_by)
        rows = read_files(table_dir, files, spec, list(dict.fromkeys([*columns, column, by])))
        if rows.num_rows == 0:
            return rows.select(list(columns))
        # the greatest value of each partition value among the rows read
        maxima = rows.group_by(by).aggregate([(column, "max")])
        joined = rows.join(maxima, by)
        return joined.filter(pc.equal(joined[column], joined[f"{column}_max"])).select(list(columns))

    def _appended(
        self, spec: TableSpec, after_version: int, up_to_version: int | None
    ) -> tuple[str, DeltaTable, pa.Table]:
        """(table directory, table at ``up_to_version``, :func:`appended_files`) of :meth:`read_appended`;
        kept for the next call with the same explicit range."""
        _check_version(after_version)
        _check_version(up_to_version)
        table_dir = local_directory(self.location(spec))
        key = (table_dir, after_version, up_to_version) if up_to_version is not None else None
        planned = self._appended_ranges.get(key) if key is not None else None
        if planned is not None:
            return planned
        dt = open_table(table_dir, up_to_version)
        last = dt.version()
        if after_version > last:
            raise ValidationError("after_version", after_version, f"is beyond version {last} of {spec.name!r}")
        try:
            check_bridge_can_read(dt, table_dir)
        except UnsupportedTableError as err:
            raise IncrementalReadError(str(err)) from err
        planned = table_dir, dt, appended_files(table_dir, after_version, last, spec)
        if key is not None:
            self._appended_ranges[key] = planned
        return planned

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
        files = files_around(add_actions(dt), column, bounds, by, spec.partition_by)
        df = scan_files(self.spark, table_dir, log_schema(dt), spec.partition_by, files)
        check_catalog_schema(spec, df.schema, table_dir)
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
        targets = partition_targets(spec, partition_values) if mode == "partitions" else None
        conformed_df = conform_to_catalog(df, spec)
        path = str(self.location(spec))
        if not self._io.exists(path):
            self._io.create(path, spec)
        check_catalog_schema(spec, self._io.schema(path), path)
        try:
            return self._io.write(path, TableWrite(spec, conformed_df, mode, targets, txn))
        except Exception as err:
            violation = not_null_violation(err)
            if violation is None:
                raise
            raise violation from err


# ---------------------------------------------------------------------------------------------
# Validation shared by both engines
# ---------------------------------------------------------------------------------------------


def _spec(name_or_spec: str | TableSpec) -> TableSpec:
    return name_or_spec if isinstance(name_or_spec, TableSpec) else table(name_or_spec)


def check_column_names(
    spec: TableSpec, option: str, columns: Sequence[str], allowed: Sequence[str] | None = None
) -> None:
    """Refuse ``columns`` that are not among ``allowed`` (default: every column of ``spec``).

    Raises:
        ValidationError: naming ``option`` and the unknown columns.
    """
    allowed = spec.column_names if allowed is None else allowed
    unknown = [c for c in columns if c not in allowed]
    if unknown:
        raise ValidationError(option, unknown, f"not columns of {spec.name!r} here", f"use {list(allowed)}")


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
