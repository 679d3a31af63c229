"""The broker's append path into a Delta table: Parquet files written by the broker itself and one
atomic JSON commit each.

The broker's send path commits many small appends. delta-rs re-derives its snapshot on every
write, which costs 10-30 ms and grows with the Delta log; :class:`AppendLog` instead writes the
Parquet files itself and commits them with one commit file, created atomically with put-if-absent
(``os.link``), exactly as the Delta protocol requires of a writer. Reading, checkpoints, overwrites
and idempotent job commits stay with delta-rs and Spark.

Blind appends are committed here: they never conflict with other writers, so a lost race for a
version number is retried at the next version after checking the winner changed no schema or
protocol. So are rewrites of files that hold the same rows (the commit log's compaction), checked
against every commit after the version they read (:meth:`AppendLog.rewrite`).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from broker_model.store.delta_commits import (
    CommitChange,
    FileAction,
    commit_path,
    latest_version,
    load_table,
    log_dir,
    read_change,
)
from schemas.catalog import PLAIN_ENCODED_COLUMNS, TableSpec
from schemas.errors import CommitConflictError, LakeError, UnsupportedTableError

# Writer features an append honours trivially (no invariants or constraints are ever declared).
_SUPPORTED_WRITER_FEATURES = frozenset({"appendOnly", "invariants"})
_STATS_TYPES = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
# active files per commit of the checkpoint interval past which the interval doubles: a checkpoint
# then costs at most twice this many add actions per commit (:meth:`AppendLog._checkpoint_due`)
FILES_PER_CHECKPOINT_COMMIT = 50
_MAX_STATS_STRING = 32  # Delta truncates string stats at 32 chars; longer values get no stats
# decoded (Arrow) bytes of a row group: a broker's pull decodes the row group holding its rows, so a
# compacted file of a whole segment is read a few MiB at a time (docs/broker.md, "Reading a pull's rows")
ROW_GROUP_BYTES = 4 << 20


@dataclass(frozen=True)
class AddFile:
    """A data file written into the table directory, ready to be committed; ``rows`` keeps the
    file's rows (without partition columns) for readers in the writing process."""

    path: str
    partition_values: dict[str, str | None]
    size: int
    num_records: int
    stats: dict[str, Any]
    rows: pa.Table | None = field(default=None, compare=False, repr=False)

    def action(self, modification_time: int) -> dict[str, Any]:
        """The Delta ``add`` action for this file."""
        return {
            "add": {
                "path": self.path,
                "partitionValues": self.partition_values,
                "size": self.size,
                "modificationTime": modification_time,
                "dataChange": True,
                "stats": json.dumps(self.stats, separators=(",", ":")),
            }
        }


class AppendLog:
    """Append-only writer of one Delta table: Parquet files plus one atomic JSON commit.

    Thread-compatible, not thread-safe: one committer thread per instance. ``fsync=True`` makes a
    returned commit durable (data files, log entry and log directory are synced).
    """

    def __init__(self, path: str | Path, spec: TableSpec, fsync: bool = True, checkpoint_interval: int = 100):
        self.path = Path(path)
        self.spec = spec
        self.fsync = fsync
        self.checkpoint_interval = checkpoint_interval
        self._log = log_dir(self.path)
        self._check_protocol()
        self._next_version = self._latest_version() + 1
        self._checkpointer: threading.Thread | None = None
        self._active_files = 0  # at the last checkpoint this writer made (:meth:`_checkpoint_due`)
        data_fields = [f for f in spec.arrow_schema if f.name not in spec.partition_by]
        self._dictionary = [p for p in _leaf_paths(data_fields) if p not in PLAIN_ENCODED_COLUMNS]

    # -- files ------------------------------------------------------------------------------------

    def write_files(self, rows: pa.Table) -> list[AddFile]:
        """Write ``rows`` as one Parquet file per partition inside the table; nothing is committed.

        Files that are never committed are invisible to readers.
        """
        keys = list(self.spec.partition_by)
        if not keys:
            return [self._write_file(rows, {})]
        adds = []
        for values, part in _split_by(rows, keys):
            adds.append(self._write_file(part.drop_columns(keys), values))
        return adds

    def _write_file(self, data: pa.Table, partition_values: dict[str, str | None]) -> AddFile:
        directory = "/".join(f"{k}={escape_partition_value(v)}" for k, v in partition_values.items())
        name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        relative = f"{directory}/{name}" if directory else name
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        data = data.select(self.spec.data_columns)
        with open(target, "wb") as handle:
            pq.write_table(
                data,
                handle,
                compression="snappy",
                use_dictionary=self._dictionary,
                row_group_size=row_group_rows(data),
            )
            if self.fsync:
                handle.flush()
                os.fsync(handle.fileno())
        stats = file_stats(data)
        size = target.stat().st_size
        return AddFile(quote(relative, safe="/="), partition_values, size, data.num_rows, stats, data)

    # -- commits ----------------------------------------------------------------------------------

    def commit(
        self,
        adds: list[AddFile],
        operation: str = "WRITE",
        info: dict[str, Any] | None = None,
        app_transaction: tuple[str, int] | None = None,
    ) -> int:
        """Commit ``adds`` as one blind append; return the new table version. With
        ``app_transaction`` (application id, version) the commit also records that Delta
        application transaction (a ``txn`` action), atomically with the files.

        Raises:
            UnsupportedTableError: a concurrent writer changed the protocol to one this writer
                cannot honour.
        """
        now = int(time.time() * 1000)
        commit_info = {
            "commitInfo": {
                "timestamp": now,
                "operation": operation,
                "operationParameters": {"mode": "Append"},
                "isBlindAppend": True,
                **(info or {}),
            }
        }
        lines = [json.dumps(commit_info)] + [json.dumps(a.action(now)) for a in adds]
        if app_transaction is not None:
            app_id, app_version = app_transaction
            lines.append(json.dumps({"txn": {"appId": app_id, "version": app_version, "lastUpdated": now}}))
        payload = ("\n".join(lines) + "\n").encode("utf-8")
        version = self._put_if_absent(payload)
        if self._checkpoint_due(version):
            self._checkpoint_async()
        return version

    def rewrite(
        self, adds: list[AddFile], removes: list[FileAction], read_version: int, info: dict[str, Any] | None = None
    ) -> int:
        """Commit ``adds`` in place of ``removes``, files active at ``read_version`` holding the same
        rows (a compaction): every action ``dataChange`` false, one put-if-absent commit. Return
        the new table version.

        The commits made after ``read_version`` are read first, by version, and so are those taken
        while this one is put: appends do not conflict with a rewrite, but a commit that removed one
        of ``removes`` (another rewrite of the same files) or changed the table's metadata or
        protocol does, and then nothing is committed. No listing of the log is involved (delta-rs's
        own conflict check lists it, and a listing taken while a broker commits can miss a commit:
        docs/lake.md#readers-beside-a-writer).

        Raises:
            CommitConflictError: a conflicting commit came after ``read_version``; nothing was committed.
        """
        removing = {f.path for f in removes}

        def check(change: CommitChange) -> None:
            if change.metadata_changed or change.protocol_changed:
                raise CommitConflictError(
                    f"version {change.version} of {self.path} changed the table's metadata or protocol after "
                    f"version {read_version}, which the rewrite read; nothing was committed, run again"
                )
            taken = sorted(removing & {f.path for f in change.removed})
            if taken:
                raise CommitConflictError(
                    f"version {change.version} of {self.path} removed {taken[:3]} after version {read_version}, "
                    "which the rewrite read (another rewrite of the same files); nothing was committed, run again"
                )

        self._next_version = max(self._next_version, read_version + 1)
        for version in range(read_version + 1, self._next_version):
            change = read_change(self.path, version)
            if change is not None:  # None: cleaned up since, older than what the rewrite read
                check(change)
        now = int(time.time() * 1000)
        commit_info = {
            "commitInfo": {
                "timestamp": now,
                "operation": "OPTIMIZE",
                "operationParameters": {},
                "readVersion": read_version,
                "isBlindAppend": False,
                **(info or {}),
            }
        }
        actions = [commit_info, *({"add": {**a.action(now)["add"], "dataChange": False}} for a in adds)]
        actions += [
            {
                "remove": {
                    "path": f.log_path,
                    "deletionTimestamp": now,
                    "dataChange": False,
                    "extendedFileMetadata": True,
                    "partitionValues": f.partition_values,
                    "size": f.size,
                }
            }
            for f in removes
        ]
        payload = "".join(json.dumps(action) + "\n" for action in actions).encode("utf-8")
        version = self._put_if_absent(payload, check)
        if self._checkpoint_due(version):
            self._checkpoint_async()
        return version

    def append(self, rows: pa.Table, operation: str = "WRITE") -> int:
        """Write ``rows`` and commit them; return the new version."""
        return self.commit(self.write_files(rows), operation)

    def _put_if_absent(self, payload: bytes, check: Callable[[CommitChange], None] | None = None) -> int:
        self._resync_if_cleaned_up()
        temp = self._log / f"_commit_{uuid.uuid4()}.json.tmp"
        with open(temp, "wb") as handle:
            handle.write(payload)
            if self.fsync:
                handle.flush()
                os.fsync(handle.fileno())
        try:
            while True:
                target = commit_path(self.path, self._next_version)
                try:
                    os.link(temp, target)
                except FileExistsError:
                    self._catch_up(check)
                    continue
                version = self._next_version
                self._next_version += 1
                if self.fsync:
                    _fsync_dir(self._log)
                return version
        finally:
            temp.unlink(missing_ok=True)

    def _catch_up(self, check: Callable[[CommitChange], None] | None = None) -> None:
        """Skip versions other writers took, refusing any that changed protocol or schema, and any
        that ``check`` raises on.

        Versions are contiguous, so it reads forward from the next version until one is missing:
        the cost follows the commits taken meanwhile, not the length of the log.
        """
        while True:
            change = read_change(self.path, self._next_version)
            if change is None:
                return
            if check is not None:
                check(change)
            if change.protocol_changed or change.metadata_changed:
                self._check_protocol()
            self._next_version += 1

    def _resync_if_cleaned_up(self) -> None:
        """Move the next version past a log cleanup that removed this writer's last known version.

        Log cleanup removes the oldest commits (those before a checkpoint, past the retention), so
        a writer idle for longer may find its next version free although the table went far
        beyond it: a commit written there would sit before the checkpoint, unread. When the version
        before the next is gone, the next one is taken from the log's newest commit instead, and the
        protocol checked again (the commits in between cannot be read).
        """
        if self._next_version > 0 and not commit_path(self.path, self._next_version - 1).exists():
            self._next_version = self._latest_version() + 1
            self._check_protocol()

    def _latest_version(self) -> int:
        version = latest_version(self.path)
        if version < 0:
            raise LakeError(f"{self.path} is not a Delta table: no commits in {self._log}")
        return version

    def _check_protocol(self) -> None:
        protocol = load_table(self.path).protocol()
        features = set(protocol.writer_features or [])
        if protocol.min_writer_version > 2 and not (
            protocol.min_writer_version == 7 and features <= _SUPPORTED_WRITER_FEATURES
        ):
            raise UnsupportedTableError(
                f"{self.path}: writer protocol {protocol.min_writer_version} with features "
                f"{sorted(features)} is beyond what the broker's append path honours; "
                "recreate the table or write it with delta-rs"
            )

    def _checkpoint_due(self, version: int) -> bool:
        """Whether ``version`` is one to checkpoint at: a multiple of ``checkpoint_interval``
        times the power of two that keeps a checkpoint's cost a constant share of the commits'.

        A checkpoint rewrites the add action of every active file: a table of many small files (a
        broker's commits before the compaction packs them) checkpointed every 100 commits grows its
        log with the square of its commits (2,000,000 users'-shape messages: 51,548 files, 506
        checkpoints of 74 MB). So the interval doubles for each doubling of the active files past
        :data:`FILES_PER_CHECKPOINT_COMMIT` per commit of the interval, as the last checkpoint
        counted them. Versions that are multiples of a larger power of two are multiples of every
        smaller one, so the writers of one table (the brokers of a lake) checkpoint at the versions
        of the finest interval any of them holds, however their counts differ."""
        if not self.checkpoint_interval:
            return False
        every = self.checkpoint_interval
        while self._active_files >= 2 * every * FILES_PER_CHECKPOINT_COMMIT:
            every *= 2
        return version % every == 0

    def _checkpoint_async(self) -> None:
        if self._checkpointer is not None and self._checkpointer.is_alive():
            return
        self._checkpointer = threading.Thread(target=self._checkpoint, name="delta-checkpoint", daemon=True)
        self._checkpointer.start()

    def _checkpoint(self) -> None:
        # a checkpoint only speeds up readers; a failure leaves the log as valid as before
        try:
            table = load_table(self.path)
            table.create_checkpoint()
            self._active_files = len(table.file_uris())  # read by the committer thread: one int, set whole
        except Exception:
            pass

    def wait_for_checkpoint(self) -> None:
        """Block until a running background checkpoint finishes (for clean shutdown)."""
        if self._checkpointer is not None:
            self._checkpointer.join()


def file_stats(data: pa.Table) -> dict[str, Any]:
    """Delta file statistics: numRecords, and min/max/nullCount of primitive columns."""
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, column in zip(data.column_names, data.columns, strict=True):
        kind = column.type
        if not (any(test(kind) for test in _STATS_TYPES) or pa.types.is_string(kind)):
            continue
        nulls[name] = column.null_count
        if column.null_count == len(column):
            continue
        low, high = pc.min_max(column).values()
        low_value, high_value = low.as_py(), high.as_py()
        if isinstance(high_value, str) and len(high_value) > _MAX_STATS_STRING:
            continue
        minimum[name], maximum[name] = low_value, high_value
    return {"numRecords": data.num_rows, "minValues": minimum, "maxValues": maximum, "nullCount": nulls}


def _leaf_paths(fields: list[pa.Field]) -> list[str]:
    """The Parquet column paths of ``fields`` (a map's are ``name.key_value.key`` and ``.value``)."""
    paths = []
    for field_ in fields:
        kind = field_.type
        if pa.types.is_map(kind):
            paths += [f"{field_.name}.key_value.key", f"{field_.name}.key_value.value"]
        elif pa.types.is_struct(kind):
            paths += [f"{field_.name}.{p}" for p in _leaf_paths(list(kind))]
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            paths += [f"{field_.name}.list.{p}" for p in _leaf_paths([pa.field("element", kind.value_type)])]
        else:
            paths.append(field_.name)
    return paths


def _split_by(rows: pa.Table, keys: list[str]) -> list[tuple[dict[str, str | None], pa.Table]]:
    if rows.num_rows == 0:
        return []
    uniques = [pc.unique(rows[key]) for key in keys]
    if all(len(u) == 1 for u in uniques):  # the usual case: one partition, no filtering
        values = {key: u[0].as_py() for key, u in zip(keys, uniques, strict=True)}
        return [({k: (None if v is None else str(v)) for k, v in values.items()}, rows)]
    groups = rows.select(keys).group_by(keys, use_threads=False).aggregate([])
    parts = []
    for values in groups.to_pylist():
        mask = None
        for key in keys:
            value = values[key]
            term = pc.is_null(rows[key]) if value is None else pc.equal(rows[key], value)
            mask = term if mask is None else pc.and_(mask, term)
        partition = {k: (None if v is None else str(v)) for k, v in values.items()}
        parts.append((partition, rows.filter(mask)))
    return parts


def escape_partition_value(value: str | None) -> str:
    """A partition value as a directory name writes it (Hive's escaping; ``__HIVE_DEFAULT_PARTITION__`` for null)."""
    if value is None:
        return "__HIVE_DEFAULT_PARTITION__"
    return "".join(ch if ch.isalnum() or ch in "_.-" else "".join(f"%{b:02X}" for b in ch.encode()) for ch in value)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def row_group_rows(data: pa.Table) -> int:
    """Rows per row group for ``data``: about :data:`ROW_GROUP_BYTES` of it, at least one row."""
    rows: int = data.num_rows
    return max(1, ROW_GROUP_BYTES * rows // max(1, int(data.nbytes)))
