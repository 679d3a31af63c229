"""Snapshots of the lake's Delta tables on the Spark side: a table loaded once per version and
shared by the process, its active files and their statistics, the files a range of commits
appended, and the reader features the bridge honours. Built on the store's reading of the Delta
log (:mod:`broker_model.store.delta_commits`).
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import Transaction

from broker_model.store import CommitChange, FileAction, commit_path, latest_version, load_table, read_changes
from broker_model.store.delta_commits import LAST_CHECKPOINT, checkpointed_after, commit_mark, log_dir
from jobs.lake.engine import PartitionFilter
from schemas.catalog import TableSpec
from schemas.errors import LakeError, UnsupportedTableError, ValidationError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


# Reader features that change nothing for a reader of the active-file list and the Parquet files:
# timestampNtz only adds a type Spark reads natively; vacuumProtocolCheck only constrains VACUUM.
BRIDGE_READER_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck"})


# Spark (and Hive) write a null partition value as this directory value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


class IncrementalReadError(LakeError):
    """The rows added after a version cannot be read on their own: a commit file of the range is
    gone (log cleanup), a commit removed or rewrote data, changed the schema, or a file it added is
    gone. Read the whole table instead."""


def open_table(path: str, version: int | None = None) -> DeltaTable:
    """The delta-rs table at ``path`` (at ``version``; None: the latest), a snapshot shared by every
    caller of the process (:class:`_Snapshots`): callers read it and never change it.

    Raises:
        LakeError: no Delta table at ``path``, or it has no ``version``.
    """
    table_dir = local_or_none(path)
    if table_dir is not None:
        kept = _SNAPSHOTS.get(table_dir, version)
        if kept is not None:
            return kept
    try:
        # a local table is pinned to its newest commit before delta-rs lists its log (load_table says why)
        dt = load_table(table_dir, version) if table_dir is not None else DeltaTable(path, version=version)
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


def is_table(path: str) -> bool:
    """Whether a Delta table is at ``path``. For a local directory: its first commit or its last
    checkpoint's pointer probed, else its log listed; delta-rs's check lists the whole log, which
    for a table of thousands of commits (offset commits, one per broker flush) costs milliseconds
    each time a job asks. Elsewhere, delta-rs's check."""
    table_dir = local_or_none(path)
    if table_dir is None:
        return bool(DeltaTable.is_deltatable(path))
    logs = log_dir(table_dir)
    if commit_path(table_dir, 0).is_file() or (logs / LAST_CHECKPOINT).is_file():
        return True
    return latest_version(table_dir) >= 0


def local_or_none(path: str) -> str | None:
    """The local directory of ``path`` (:func:`local_directory`), None where it is not local."""
    try:
        return local_directory(path)
    except LakeError:
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
        if commit_path(table_dir, version + 1).exists() or checkpointed_after(table_dir, version):
            return None
        return (version, kept[1]) if self._servable(table_dir, version, kept) else None

    @staticmethod
    def _servable(table_dir: str, version: int, kept: tuple[tuple[int, int, int, int, bytes], DeltaTable]) -> bool:
        # not moved to another version by a caller, and commit ``version`` is still the file it was
        return kept[1].version() == version and commit_mark(table_dir, version) == kept[0]

    def keep(self, table_dir: str, dt: DeltaTable, latest: bool) -> None:
        version = dt.version()
        mark = commit_mark(table_dir, version)
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

    def state(self) -> SnapshotState:
        """What is kept now (:func:`snapshot_state`)."""
        with self._lock:
            return SnapshotState(OrderedDict(self._kept), dict(self._latest))

    def restore(self, state: SnapshotState) -> None:
        """Keep exactly what ``state`` kept (:func:`restore_snapshots`)."""
        with self._lock:
            self._kept = OrderedDict(state.kept)
            self._latest = dict(state.latest)


@dataclass(frozen=True)
class SnapshotState:
    """The snapshots a process kept at one moment (the snapshots themselves are never changed)."""

    kept: OrderedDict[tuple[str, int], tuple[tuple[int, int, int, int, bytes], DeltaTable]]
    latest: dict[str, int]


_SNAPSHOTS = _Snapshots()


def snapshot_state() -> SnapshotState:
    """The snapshots this process keeps now: for a measurement that times two runs from the same
    start (e.g. a full run against the incremental run it replaces), :func:`restore_snapshots`."""
    return _SNAPSHOTS.state()


def restore_snapshots(state: SnapshotState) -> None:
    """Keep exactly the snapshots of ``state``: the tables loaded since are loaded again when read."""
    _SNAPSHOTS.restore(state)


def already_committed(dt: DeltaTable, txn: Transaction) -> bool:
    committed = dt.transaction_version(txn.app_id)
    return committed is not None and committed >= txn.version


def bridge_can_read(dt: DeltaTable) -> bool:
    """Whether the bridge reads the table's data files exactly (:func:`check_bridge_can_read`)."""
    try:
        check_bridge_can_read(dt, "")
    except UnsupportedTableError:
        return False
    return True


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


def log_schema(dt: DeltaTable) -> StructType:
    """The table's logical schema as a Spark StructType (Delta's schema JSON is Spark's)."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(dt.schema().to_json()))


def add_actions(dt: DeltaTable) -> pa.Table:
    """One row per active file of ``dt``: delta-rs's flattened add actions (``path`` as in the log,
    ``size_bytes``, ``num_records``, ``partition.<col>``, ``min.<col>``, ``max.<col>``, ...)."""
    return pa.table(dt.get_add_actions(flatten=True))


def active_files(actions: pa.Table, partition_by: Sequence[str]) -> pa.Table:
    """The file list of ``actions`` (:func:`add_actions`), one row per file: ``path`` (as in the
    log, URL-encoded), ``size_bytes`` and ``partition.<col>``."""
    if actions.num_rows == 0:
        return pa.table({"path": pa.array([], pa.string()), "size_bytes": pa.array([], pa.int64())})
    return actions.select(["path", "size_bytes", *[f"partition.{c}" for c in partition_by]])


def prune(files: pa.Table, partition_filter: PartitionFilter | None) -> pa.Table:
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


RowFilters = Sequence[tuple[str, str, Any]] | Sequence[Sequence[tuple[str, str, Any]]]
"""Filters in disjunctive normal form as :meth:`jobs.lake.Lake.read_rows` takes them: a list of
``(column, op, value)`` that every row must match, or a list of such lists, any of which it must."""


def conjunctions(filters: RowFilters) -> Sequence[Sequence[tuple[str, str, Any]]]:
    """``filters`` as a list of conjunctions (one when it is a list of terms)."""
    if filters and isinstance(filters[0], tuple):
        return [cast("Sequence[tuple[str, str, Any]]", filters)]
    return cast("Sequence[Sequence[tuple[str, str, Any]]]", filters)


def files_that_may_match(actions: pa.Table, filters: RowFilters, partition_by: Sequence[str]) -> pa.Table:
    """The files of ``actions`` (:func:`add_actions`) that may hold a row matching ``filters``: a file
    is left out only when its partition values, or the ``min``/``max`` statistics of an integer
    column, show that no row of it can match (the rows are filtered after, as the filters say)."""
    if actions.num_rows == 0 or not filters:
        return actions
    may = pa.array(np.zeros(actions.num_rows, bool))
    for conjunction in conjunctions(filters):
        every = pa.array(np.ones(actions.num_rows, bool))
        for column, op, value in conjunction:
            if column in partition_by:
                term = _partition_term(actions, column, op, value)
            else:
                term = _statistics_term(actions, column, op, value)
            every = pc.and_(every, term)
        may = pc.or_(may, every)
    return actions.filter(may)


_COMPARE = {
    "=": pc.equal,
    "==": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def _partition_term(actions: pa.Table, column: str, op: str, value: Any) -> pa.Array:
    """Per file, whether its partition value may match ``column op value`` (a null value may)."""
    name = f"partition.{column}"
    unknown = pa.array(np.ones(actions.num_rows, bool))
    if name not in actions.column_names:
        return unknown
    values = actions.column(name)
    try:
        if op in ("in", "not in"):
            found = pc.is_in(values, value_set=pa.array(list(value), values.type))
            term = found if op == "in" else pc.invert(found)
        elif op in _COMPARE:
            term = _COMPARE[op](values, pa.scalar(value, values.type))
        else:
            return unknown
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError):
        return unknown
    return pc.fill_null(term, True)


def _statistics_term(actions: pa.Table, column: str, op: str, value: Any) -> pa.Array:
    """Per file, whether the ``min``/``max`` statistics of integer ``column`` leave room for a row
    matching ``column op value``; a file without them, another column type or operator, may."""
    unknown = pa.array(np.ones(actions.num_rows, bool))
    low_name, high_name = f"min.{column}", f"max.{column}"
    if low_name not in actions.column_names or high_name not in actions.column_names:
        return unknown
    low, high = actions.column(low_name), actions.column(high_name)
    if not (pa.types.is_integer(low.type) and pa.types.is_integer(high.type)):
        return unknown
    wanted = list(value) if op == "in" else [value]
    if not wanted or any(type(v) is not int or not _INT64_MIN <= v <= _INT64_MAX for v in wanted):
        return unknown
    lows = pc.fill_null(low.cast(pa.int64()), _INT64_MIN).to_numpy()  # no statistic: no bound
    highs = pc.fill_null(high.cast(pa.int64()), _INT64_MAX).to_numpy()
    if op in ("=", "==", "in"):
        values = np.unique(np.array(wanted, np.int64))
        first = np.searchsorted(values, lows, side="left")  # the least wanted value >= a file's min
        inside = first < len(values)
        inside[inside] = values[first[inside]] <= highs[inside]
        return pa.array(inside)
    if op in ("<", "<="):
        return pa.array(np.less(lows, value) if op == "<" else np.less_equal(lows, value))
    if op in (">", ">="):
        return pa.array(np.greater(highs, value) if op == ">" else np.greater_equal(highs, value))
    return unknown


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def delta_string(value: Any) -> str | None:
    """A typed partition value (from delta-rs) as its Delta partition value string."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def appended_files(table_dir: str, after_version: int, last_version: int, spec: TableSpec) -> pa.Table:
    """The data files added with ``dataChange=true`` by commits ``after_version + 1 .. last_version``.

    Returns the shape of :func:`active_files`: ``path`` (as in the log), ``size_bytes`` and
    ``partition.<col>`` typed as the catalog declares.

    Raises:
        IncrementalReadError: see :meth:`Lake.read_appended`.
    """
    adds: dict[str, FileAction] = {}
    for version, change in enumerate(read_changes(table_dir, after_version, last_version), after_version + 1):
        if change is None:
            raise IncrementalReadError(
                f"the commit file {commit_path(table_dir, version)} is gone (log cleanup); the rows added "
                "since then cannot be told apart"
            )
        _collect_appends(adds, change, table_dir)
    missing = [p for p in adds if not os.path.exists(file_location(table_dir, p))]
    if missing:
        raise IncrementalReadError(f"files added to {table_dir} after version {after_version} are gone: {missing[:3]}")
    types = {c.name: c.type for c in spec.columns}
    columns: dict[str, pa.Array] = {
        "path": pa.array(list(adds), pa.string()),
        "size_bytes": pa.array([a.size for a in adds.values()], pa.int64()),
    }
    for name in spec.partition_by:
        values = [a.partition_values.get(name) for a in adds.values()]
        columns[f"partition.{name}"] = pa.array(values, pa.string()).cast(types[name])
    return pa.table(columns)


def _collect_appends(adds: dict[str, FileAction], change: CommitChange, table_dir: str) -> None:
    """Record the files ``change`` appended in ``adds`` (keyed by their path in the log); refuse a
    commit that is not an append: one that changed the metadata or removed rows. A rewrite
    (``dataChange`` false) of files from before the range is skipped; one of files appended in the
    range only puts its files in their place (they hold those rows and no other: nothing else was
    removed, :mod:`jobs.lake.packing`); one of both kinds at once is refused."""
    if change.metadata_changed:
        raise IncrementalReadError(f"version {change.version} of {table_dir} changed the table's metadata")
    for added in change.added:
        adds[added.log_path] = added
    for removed in change.removed:
        if removed.data_change:
            raise IncrementalReadError(f"version {change.version} of {table_dir} removed {removed.log_path!r}")
    inside = [removed.log_path for removed in change.removed if removed.log_path in adds]
    if not inside:
        return
    if len(inside) != len(change.removed) or change.added:
        raise IncrementalReadError(
            f"version {change.version} of {table_dir} rewrote files appended in the range together with others "
            f"({inside[:3]})"
        )
    for path in inside:
        del adds[path]
    for rewritten in change.rewritten:
        adds[rewritten.log_path] = rewritten


def files_around(
    actions: pa.Table, column: str, bounds: Mapping[str, int], by: str, partition_by: Sequence[str]
) -> pa.Table:
    """The files of ``actions`` (``get_add_actions(flatten=True)``) that :meth:`Lake.read_around` reads.

    The greatest value below a bound lies in a file whose maximum is at least ``L``, the greatest
    known file minimum below the bound (that file holds ``L`` itself); rows at or above the bound
    lie in files whose maximum is at least the bound, which is above ``L``.
    """
    if actions.num_rows == 0:
        return active_files(actions, partition_by)
    values = actions.column(f"partition.{by}").to_pylist()
    lows, highs = file_statistic(actions, f"min.{column}"), file_statistic(actions, f"max.{column}")
    floors: dict[str, int] = {}
    for value, low in zip(values, lows, strict=True):
        if value in bounds and low is not None and low < bounds[value]:
            floors[value] = max(floors.get(value, low), low)
    keep = [
        value in bounds and (low is None or high is None or high >= floors.get(value, bounds[value]))
        for value, low, high in zip(values, lows, highs, strict=True)
    ]
    return active_files(actions.filter(pa.array(keep, pa.bool_())), partition_by)


def ordered_files(dt: DeltaTable, spec: TableSpec, order_by: str | None) -> pa.Table:
    """:func:`active_files` plus ``num_records`` (0 when the log has no count), sorted by the
    partition values and then by the least ``order_by`` value of each file (its statistic; files
    without one last), when ``order_by`` is given."""
    actions = add_actions(dt)
    files = active_files(actions, spec.partition_by)
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


def file_statistic(actions: pa.Table, name: str) -> list[Any]:
    """A per-file statistic column as a list, all None when no file has it."""
    return actions.column(name).to_pylist() if name in actions.column_names else [None] * actions.num_rows


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
