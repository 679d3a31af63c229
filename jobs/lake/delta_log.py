"""Reading the Delta log of a table: its files, its commits and what they add, and the reader
features the bridge honours.
"""

from __future__ import annotations

import functools
import json
import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import Transaction
from pyarrow.fs import LocalFileSystem

from broker_model.store import latest_version
from schemas.catalog import TableSpec
from schemas.errors import LakeError, UnsupportedTableError, ValidationError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


# Reader features that change nothing for a reader of the active-file list and the Parquet files:
# timestampNtz only adds a type Spark reads natively; vacuumProtocolCheck only constrains VACUUM.
BRIDGE_READER_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck"})


# Spark (and Hive) write a null partition value as this directory value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _already_committed(dt: DeltaTable, txn: Transaction) -> bool:
    committed = dt.transaction_version(txn.app_id)
    return committed is not None and committed >= txn.version


def open_table(path: str, version: int | None = None) -> DeltaTable:
    """The delta-rs table at ``path`` (at ``version``; None: the latest), a snapshot shared by every
    caller of the process (:class:`_Snapshots`): callers read it and never change it.

    Raises:
        LakeError: no Delta table at ``path``, or it has no ``version``.
    """
    table_dir = _local_or_none(path)
    if table_dir is not None:
        kept = _SNAPSHOTS.get(table_dir, version)
        if kept is not None:
            return kept
    try:
        dt = DeltaTable(path, version=version)
    except TableNotFoundError:
        raise LakeError(f"no Delta table at {path}; check the lake root or write the table first") from None
    except DeltaError as err:
        raise LakeError(f"cannot load version {version} of the Delta table at {path}: {err}") from err
    if table_dir is not None:
        _SNAPSHOTS.keep(table_dir, dt, latest=version is None)
    return dt


def table_version(table_dir: str) -> int:
    """The latest version of the Delta table in the local directory ``table_dir``, -1 without a
    log: the kept snapshot's when no commit followed it (one file probe), else from a listing of the
    log (newest commit or checkpoint)."""
    latest = _SNAPSHOTS.latest_version(table_dir)
    return latest if latest is not None else latest_version(table_dir)


_LOG_DIR = "_delta_log"


def _local_or_none(path: str) -> str | None:
    try:
        return local_directory(path)
    except LakeError:
        return None


# bytes of a commit file compared besides its identity: its first line, the commit info with its
# time, without reading a compaction's megabytes of remove and add actions on every open
_MARK_BYTES = 4096


def _commit_mark(table_dir: str, version: int) -> tuple[int, int, int, int, bytes] | None:
    """What identifies commit ``version`` of a table: its file's device, inode, size, change time
    and first bytes; None when the file is gone (log cleanup) or unreadable."""
    name = f"{table_dir}/{_LOG_DIR}/{version:020d}.json"
    try:
        with open(name, "rb") as handle:
            status = os.fstat(handle.fileno())
            return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, handle.read(_MARK_BYTES)
    except OSError:
        return None


class _Snapshots:
    """The delta-rs snapshots opened in this process, shared so that a table is loaded once per
    version instead of once per caller: loading lists the whole log directory, which for a commit
    log of tens of thousands of commits costs tens of milliseconds.

    A kept snapshot of version ``v`` is served only while the object still stands at ``v`` and
    commit ``v``'s file is the very file it was loaded from (device, inode, size, time and first
    bytes): a table deleted and written again is loaded anew. A request for the latest version is
    served from the latest snapshot kept while commit ``v + 1`` does not exist (Delta commits are
    numbered without gaps), else loaded again.
    At most :attr:`LIMIT` snapshots are kept, the least recently used dropped first. Thread-safe.
    """

    LIMIT = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, int], tuple[tuple[int, int, int, int, bytes], DeltaTable]] = OrderedDict()
        self._latest: dict[str, int] = {}  # table directory -> version of its latest snapshot kept

    def get(self, table_dir: str, version: int | None) -> DeltaTable | None:
        """The kept snapshot of ``version`` (None: the latest) while it may be served, else None."""
        if version is None:
            latest = self._latest_kept(table_dir)
            return latest[1] if latest is not None else None
        with self._lock:
            kept = self._kept.get((table_dir, version))
        if kept is None or not self._servable(table_dir, version, kept):
            return None
        with self._lock:
            if (table_dir, version) in self._kept:
                self._kept.move_to_end((table_dir, version))
        return kept[1]

    def latest_version(self, table_dir: str) -> int | None:
        """The version of the latest snapshot kept of ``table_dir`` while it is still the table's
        latest (and the same table), else None."""
        latest = self._latest_kept(table_dir)
        return latest[0] if latest is not None else None

    def _latest_kept(self, table_dir: str) -> tuple[int, DeltaTable] | None:
        with self._lock:
            version = self._latest.get(table_dir)
            kept = self._kept.get((table_dir, version)) if version is not None else None
        if version is None or kept is None:
            return None
        if os.path.exists(f"{table_dir}/{_LOG_DIR}/{version + 1:020d}.json"):
            return None
        return (version, kept[1]) if self._servable(table_dir, version, kept) else None

    @staticmethod
    def _servable(table_dir: str, version: int, kept: tuple[tuple[int, int, int, int, bytes], DeltaTable]) -> bool:
        # not moved to another version by a caller, and commit ``version`` is still the file it was
        return kept[1].version() == version and _commit_mark(table_dir, version) == kept[0]

    def keep(self, table_dir: str, dt: DeltaTable, latest: bool) -> None:
        version = dt.version()
        mark = _commit_mark(table_dir, version)
        if mark is None:  # loaded from a checkpoint whose commit file is gone: nothing to check it by
            return
        with self._lock:
            self._kept[(table_dir, version)] = mark, dt
            self._kept.move_to_end((table_dir, version))
            if latest or version > self._latest.get(table_dir, -1):
                self._latest[table_dir] = version
            while len(self._kept) > self.LIMIT:
                (dropped_dir, dropped), _ = self._kept.popitem(last=False)
                if self._latest.get(dropped_dir) == dropped:
                    del self._latest[dropped_dir]


_SNAPSHOTS = _Snapshots()


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
    on the driver, in the order of ``files``; partition columns from the log's values, every column
    typed as the catalog says. Many files go through one dataset scan (:func:`scan_chunks`: the
    files are opened and decoded in pyarrow's threads, which costs far less per small file than a
    reader per file)."""
    if files.num_rows <= 1:
        read = FileReader(table_dir, files, spec, columns)
        return read(0) if files.num_rows else read.target.empty_table()
    unknown_counts = files.append_column("num_records", pa.array(np.zeros(files.num_rows, np.int64)))
    chunks = list(scan_chunks(table_dir, unknown_counts, spec, columns, (), 0))
    return pa.concat_tables(chunks) if len(chunks) > 1 else chunks[0]


class FileReader:
    """Reads the ``i``-th file of ``files`` (the shape of :func:`_active_files`): ``columns`` of its
    rows where every data column of ``equal`` has its value (a filter the Parquet reader applies),
    partition columns from the log's values, ``dictionaries`` as :meth:`Lake.iter_file_rows` says."""

    def __init__(
        self,
        table_dir: str,
        files: pa.Table,
        spec: TableSpec,
        columns: Sequence[str],
        equal: Mapping[str, Any] | None = None,
        dictionaries: Sequence[str] = (),
    ) -> None:
        self.table_dir, self.files, self.spec, self.columns = table_dir, files, spec, list(columns)
        self.paths = files.column("path").to_pylist()
        self.dictionaries = dictionaries
        self.data_columns = [c for c in columns if c not in spec.partition_by]
        self.target = _read_schema(spec, columns, dictionaries)
        self.filters = [(column, "=", value) for column, value in (equal or {}).items()] or None
        self.read_dictionary = [c for c in dictionaries if c in self.data_columns] or None

    def __call__(self, i: int) -> pa.Table:
        location = file_location(self.table_dir, self.paths[i])
        if self.filters is None and self.data_columns:
            part = pq.ParquetFile(location, read_dictionary=self.read_dictionary).read(columns=self.data_columns)
        else:
            part = pq.read_table(
                location, columns=self.data_columns, filters=self.filters, read_dictionary=self.read_dictionary
            )
        for column in (c for c in self.columns if c in self.spec.partition_by):
            value = self.files.column(f"partition.{column}")[i]
            if column in self.dictionaries:
                indices = pa.array(np.zeros(part.num_rows, np.int32))
                constant: pa.Array = pa.DictionaryArray.from_arrays(indices, pa.array([value.as_py()], pa.string()))
            else:
                constant = pa.repeat(value, part.num_rows).cast(value.type)
            part = part.append_column(self.target.field(column), constant)
        return part.select(self.columns).cast(self.target).unify_dictionaries()


def ordered_files(dt: DeltaTable, spec: TableSpec, order_by: str | None) -> pa.Table:
    """:func:`_active_files` plus ``num_records`` (0 when the log has no count), sorted by the
    partition values and then by the least ``order_by`` value of each file (its statistic; files
    without one last), when ``order_by`` is given."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    files = _active_files_of(actions, spec.partition_by)
    counts = actions.column("num_records") if "num_records" in actions.column_names else None
    files = files.append_column(
        "num_records",
        pa.array([0] * files.num_rows, pa.int64()) if counts is None else pc.fill_null(counts.cast(pa.int64()), 0),
    )
    if order_by is None or files.num_rows == 0:
        return files
    low = f"min.{order_by}"
    least = actions.column(low) if low in actions.column_names else pa.nulls(files.num_rows, pa.int64())
    keys = [(f"partition.{c}", "ascending") for c in spec.partition_by] + [("_least", "ascending")]
    return files.append_column("_least", least).sort_by(keys).drop_columns(["_least"])


def scan_chunks(
    table_dir: str,
    files: pa.Table,
    spec: TableSpec,
    columns: Sequence[str],
    dictionaries: Sequence[str],
    chunk_rows: int,
) -> Iterator[pa.Table]:
    """``columns`` of the rows of ``files`` (the shape of :func:`ordered_files`) as tables of
    consecutive files holding about ``chunk_rows`` rows together (a file is never split), each
    read by pyarrow's dataset scanner, several files at once in its threads: partition columns from
    the log's values, ``dictionaries`` as :meth:`Lake.iter_file_rows` says (one dictionary per
    column and chunk)."""
    if files.num_rows == 0:  # a table without data files has no partition columns to read either
        return
    schema = spec.arrow_schema
    read_coded = [c for c in dictionaries if c not in spec.partition_by]
    target = _read_schema(spec, columns, dictionaries)
    scanned = pa.schema([target.field(c) if c in read_coded else schema.field(c) for c in columns])
    file_format = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=read_coded))
    paths = files.column("path").to_pylist()
    counts = files.column("num_records").to_pylist()
    values = {c: files.column(f"partition.{c}") for c in spec.partition_by}
    start = 0
    while start < len(paths):
        end, held = start + 1, counts[start]
        while end < len(paths) and end - start < _CHUNK_FILES and held + counts[end] <= chunk_rows:
            held += counts[end]
            end += 1
        partitions = [_partition_expression(values, i) for i in range(start, end)]
        dataset = ds.FileSystemDataset.from_paths(
            [file_location(table_dir, p) for p in paths[start:end]],
            schema=scanned,
            format=file_format,
            filesystem=LocalFileSystem(),
            partitions=partitions,
        )
        yield _typed_chunk(dataset.to_table(columns=list(columns), use_threads=True), target)
        start = end


_CHUNK_FILES = 4096  # files of one chunk at most (a log without row counts still reads in chunks)


def _partition_expression(values: Mapping[str, pa.ChunkedArray], i: int) -> ds.Expression:
    """What the ``i``-th file's partition values say of its rows, for the dataset scanner."""
    terms = [ds.field(c).is_null() if v[i].as_py() is None else ds.field(c) == v[i] for c, v in values.items()]
    return functools.reduce(operator.and_, terms) if terms else ds.scalar(True)


def _typed_chunk(chunk: pa.Table, target: pa.Schema) -> pa.Table:
    for index, field_ in enumerate(target):
        if field_.type != chunk.schema.field(index).type:  # a partition column asked for dictionary-encoded
            chunk = chunk.set_column(index, field_, pc.dictionary_encode(chunk.column(index)).cast(field_.type))
    return chunk.unify_dictionaries()


def _read_schema(spec: TableSpec, columns: Sequence[str], dictionaries: Sequence[str]) -> pa.Schema:
    """The catalog schema of ``columns``, the string columns in ``dictionaries`` dictionary-encoded."""
    schema, coded = spec.arrow_schema, pa.dictionary(pa.int32(), pa.string())
    return pa.schema([schema.field(c).with_type(coded) if c in dictionaries else schema.field(c) for c in columns])


def _stat(actions: pa.Table, name: str) -> list[Any]:
    """A per-file statistic column as a list, all None when no file has it."""
    return actions.column(name).to_pylist() if name in actions.column_names else [None] * actions.num_rows


def _active_files_of(actions: pa.Table, partition_by: Sequence[str]) -> pa.Table:
    if actions.num_rows == 0:
        return pa.table({"path": pa.array([], pa.string()), "size_bytes": pa.array([], pa.int64())})
    return actions.select(["path", "size_bytes", *[f"partition.{c}" for c in partition_by]])


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


WriteMode = Literal["append", "overwrite", "partitions"]


PartitionFilter = Mapping[str, Sequence[Any]]


PartitionValues = Mapping[str, Any]


class IncrementalReadError(LakeError):
    """The rows added after a version cannot be read on their own: a commit file of the range is
    gone (log cleanup), a commit removed or rewrote data, changed the schema, or a file it added is
    gone. Read the whole table instead."""
