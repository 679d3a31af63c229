"""Compaction of the commit log's small files, for both engines: the active files and their
statistics, the plan (runs of adjacent small files of a segment packed into bins), and the rewrite:
each bin is written as one file with Arrow and committed in place of its files with a put-if-absent
commit (every action dataChange=false), whatever the engine (:func:`compact` says why not Delta's
OPTIMIZE). See docs/jobs.md (compact_commitlog)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from broker_model.store import AddFile, AppendLog, FileAction
from jobs.lake.facade import Lake
from jobs.lake.snapshots import add_actions, check_bridge_can_read, file_location, local_directory, open_table
from schemas.catalog import COMMITLOG
from schemas.errors import LakeError, ValidationError

SegmentKey = tuple[str, int]


_DATA_SCHEMA = pa.schema([f for f in COMMITLOG.arrow_schema if f.name in COMMITLOG.data_columns])


@dataclass(frozen=True)
class DataFile:
    """One active data file of the commit log, as the Delta log describes it.

    Attributes:
        path: the path in the log (relative to the table, URL-encoded).
        size: bytes.
        broker_name, segment: the file's partition.
        first_offset: the smallest ``commit_log_offset`` of its rows (None without statistics).
        records: its row count (None without statistics).
    """

    path: str
    size: int
    broker_name: str
    segment: int
    first_offset: int | None = None
    records: int | None = None

    @property
    def segment_key(self) -> SegmentKey:
        """``(broker_name, segment)``."""
        return (self.broker_name, self.segment)


@dataclass(frozen=True)
class Bin:
    """Files of one segment to be rewritten as one file."""

    broker_name: str
    segment: int
    files: tuple[DataFile, ...]

    @property
    def size(self) -> int:
        """Total bytes of the files."""
        return sum(f.size for f in self.files)

    @property
    def partition_values(self) -> dict[str, str | None]:
        """The Delta partition value strings of the bin's segment."""
        return {"broker_name": self.broker_name, "segment": str(self.segment)}


@dataclass
class CompactSummary:
    """What a run found and did; ``row_counts`` of its ``job_runs`` row."""

    files_before: int = 0
    bytes_before: int = 0
    files_after: int = 0
    bytes_after: int = 0
    segments_compacted: int = 0
    files_removed: int = 0
    files_added: int = 0
    bytes_removed: int = 0
    bytes_added: int = 0
    rows_rewritten: int = 0
    commits: int = 0

    def row_counts(self) -> dict[str, int]:
        """The counts by name."""
        return dict(self.__dict__)

    def count_files(self, before: Sequence[DataFile], after: Sequence[DataFile]) -> None:
        """Record the number and bytes of the active files before and after the run."""
        self.files_before, self.bytes_before = len(before), sum(f.size for f in before)
        self.files_after, self.bytes_after = len(after), sum(f.size for f in after)

    def lines(self) -> list[str]:
        """The summary printed on stdout."""
        return [f"  {name:<22}{value:>14}" for name, value in self.row_counts().items()]


def plan_bins(
    files: Sequence[DataFile],
    target_file_size: int,
    min_file_fraction: float,
    eligible: Collection[str] | None = None,
) -> list[Bin]:
    """The bins to rewrite (docs/jobs.md, compact_commitlog, "What is compacted").

    Args:
        files: every active file of the commit log.
        target_file_size, min_file_fraction: see :class:`CompactConfig`.
        eligible: the paths that may be compacted (see :func:`eligible_paths`); None for all.

    Deterministic: segments in (broker_name, segment) order, files in (first_offset, path) order
    (files without statistics last), bins in packing order.
    """
    threshold = min_file_fraction * target_file_size
    by_segment: dict[SegmentKey, list[DataFile]] = {}
    for data_file in files:
        by_segment.setdefault(data_file.segment_key, []).append(data_file)

    def candidate(data_file: DataFile) -> bool:
        return (eligible is None or data_file.path in eligible) and data_file.size < threshold

    bins: list[Bin] = []
    for key in sorted(by_segment):
        ordered = sorted(by_segment[key], key=lambda f: (f.first_offset is None, f.first_offset or 0, f.path))
        for run in _candidate_runs(ordered, candidate):
            bins.extend(Bin(key[0], key[1], tuple(group)) for group in _pack(run, target_file_size))
    return [b for b in bins if len(b.files) > 1]


def _candidate_runs(files: Sequence[DataFile], candidate: Callable[[DataFile], bool]) -> list[list[DataFile]]:
    """The maximal runs of consecutive ``files`` that are candidates; files without offset
    statistics (placed last) never share a run with files that have them."""
    runs: list[list[DataFile]] = [[]]
    for data_file in files:
        if runs[-1] and (runs[-1][-1].first_offset is None) != (data_file.first_offset is None):
            runs.append([])
        if candidate(data_file):
            runs[-1].append(data_file)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _pack(files: Sequence[DataFile], capacity: int) -> list[list[DataFile]]:
    """Consecutive groups of ``files`` of at most ``capacity`` bytes (a larger file stays alone)."""
    groups: list[list[DataFile]] = []
    size = 0
    for data_file in files:
        if not groups or size + data_file.size > capacity:
            groups.append([])
            size = 0
        groups[-1].append(data_file)
        size += data_file.size
    return groups


def batches(bins: Sequence[Bin], segments_per_commit: int) -> list[list[Bin]]:
    """``bins`` in groups covering at most ``segments_per_commit`` segments each; the bins of one
    segment always share a group (so a segment is compacted by one commit)."""
    groups: list[list[Bin]] = []
    segments: set[SegmentKey] = set()
    for one in bins:
        key = (one.broker_name, one.segment)
        if not groups or (key not in segments and len(segments) >= segments_per_commit):
            groups.append([])
            segments = set()
        groups[-1].append(one)
        segments.add(key)
    return groups


def list_files(dt: DeltaTable) -> list[DataFile]:
    """The active files of a commit log snapshot, with the statistics the plan uses."""
    actions = add_actions(dt)
    if actions.num_rows == 0:
        return []
    columns = actions.to_pydict()
    firsts = columns.get("min.commit_log_offset", [None] * actions.num_rows)
    records = columns.get("num_records", [None] * actions.num_rows)
    return [
        DataFile(path, int(size), broker, int(segment), first, count)
        for path, size, broker, segment, first, count in zip(
            columns["path"],
            columns["size_bytes"],
            columns["partition.broker_name"],
            columns["partition.segment"],
            firsts,
            records,
            strict=True,
        )
    ]


def eligible_paths(table_dir: str, dt: DeltaTable, files_up_to_version: int | None) -> frozenset[str] | None:
    """The paths of the files active at ``files_up_to_version`` (None: no restriction).

    Raises:
        ValidationError: ``files_up_to_version`` is beyond the version of ``dt``.
        LakeError: that version cannot be loaded any more (log cleanup).
    """
    if files_up_to_version is None:
        return None
    if files_up_to_version > dt.version():
        raise ValidationError(
            "files_up_to_version", files_up_to_version, f"is beyond version {dt.version()} of {table_dir}"
        )
    return frozenset(f.path for f in list_files(open_table(table_dir, files_up_to_version)))


def read_bin(table_dir: str, one: Bin) -> pa.Table:
    """The rows of the bin's files with the catalog's data columns and types, sorted by
    ``commit_log_offset`` (a stable sort: equal offsets keep their file order).

    Raises:
        LakeError: a file is missing, lacks a column, or holds a value the catalog type refuses
            (a null in a NOT NULL column).
    """
    parts = []
    for data_file in one.files:
        location = file_location(table_dir, data_file.path)
        try:
            parts.append(pq.ParquetFile(location).read(columns=COMMITLOG.data_columns).cast(_DATA_SCHEMA))
        except (OSError, KeyError, ValueError, pa.ArrowException) as err:
            raise LakeError(
                f"cannot compact {location}: {err}; nothing was committed, check the file "
                "(rebuild_consume_queue reports corrupt rows)"
            ) from err
    return pa.concat_tables(parts).sort_by("commit_log_offset")


def write_bins(writer: AppendLog, table_dir: str, bins: Sequence[Bin]) -> list[AddFile]:
    """Write one file per bin into its segment's directory; nothing is committed.

    Raises:
        LakeError: a bin cannot be read (:func:`read_bin`), or its row count differs from the
            statistics of its files. Files written before the error are deleted.
    """
    written: list[AddFile] = []
    try:
        for one in bins:
            rows = read_bin(table_dir, one)
            _check_row_count(one, rows.num_rows)
            keyed = rows.append_column("broker_name", pa.array([one.broker_name] * rows.num_rows, pa.string()))
            keyed = keyed.append_column("segment", pa.array([one.segment] * rows.num_rows, pa.int64()))
            written.extend(writer.write_files(keyed))
    except BaseException:
        delete_files(table_dir, written)
        raise
    return written


def _check_row_count(one: Bin, rows: int) -> None:
    counts = [f.records for f in one.files]
    if all(c is not None for c in counts) and rows != sum(c for c in counts if c is not None):
        raise LakeError(
            f"the files of segment {one.segment} of {one.broker_name!r} to compact hold {rows} rows, but their "
            f"statistics in the Delta log say {sum(c for c in counts if c is not None)}; nothing was committed"
        )


def commit_bins(writer: AppendLog, table_dir: str, bins: Sequence[Bin], written: Sequence[AddFile], run_id: str) -> int:
    """Commit ``written`` in place of the bins' files, one put-if-absent Delta commit, every action
    ``dataChange=false`` (:meth:`AppendLog.rewrite`).

    The files to remove are checked active in the latest snapshot, and every commit after it is
    checked before the commit lands: appends (the brokers') do not conflict, a commit that removed
    one of the files or changed the table's metadata does. Returns the table version after the
    commit.

    Raises:
        LakeError: a file to remove is no longer active, or a conflicting commit came (another
            compaction): nothing of this batch is committed. Or the commit left a removed file
            active (the error says so).
    """
    dt = open_table(table_dir)
    active = {f.path for f in list_files(dt)}
    gone = [f.path for b in bins for f in b.files if f.path not in active]
    if gone:
        raise LakeError(f"files to compact in {table_dir} were removed by another writer: {gone[:3]}; run again")
    removes = [FileAction(f.path, b.partition_values, f.size, False) for b in bins for f in b.files]
    # not "job": delta-spark reads commitInfo.job as its JobInfo struct, and a string there fails its
    # time travel, history and conflict checks over this commit (MALFORMED_RECORD_IN_PARSING)
    version = writer.rewrite(list(written), removes, dt.version(), {"rmqJob": "compact_commitlog", "rmqRunId": run_id})
    still = {f.path for f in list_files(open_table(table_dir, version))} & {f.path for b in bins for f in b.files}
    if still:
        raise LakeError(
            f"the compaction of {table_dir} committed but left {sorted(still)[:3]} active; "
            "the table holds their rows twice, remove the compacted files of those segments"
        )
    return version


def delete_files(table_dir: str, written: Iterable[AddFile]) -> None:
    """Delete files written by :func:`write_bins` that were not committed (best effort)."""
    for added in written:
        Path(file_location(table_dir, added.path)).unlink(missing_ok=True)


def _is_committed(table_dir: str, written: Sequence[AddFile]) -> bool:
    """Whether a file of ``written`` is active (a commit that raised after landing)."""
    try:
        active = {unquote(f.path) for f in list_files(open_table(table_dir))}
    except LakeError:
        return False
    return any(unquote(a.path) in active for a in written)


def compact_bridge(
    table_dir: str, bins: Sequence[Bin], segments_per_commit: int, run_id: str, summary: CompactSummary
) -> None:
    """Rewrite and commit ``bins``, one commit per batch of segments; fills ``summary``.

    Raises:
        LakeError: see :func:`write_bins` and :func:`commit_bins`; batches committed before the
            failing one stay committed (each is a complete compaction of its segments).
    """
    writer = AppendLog(table_dir, COMMITLOG)
    for batch in batches(bins, segments_per_commit):
        written = write_bins(writer, table_dir, batch)
        try:
            commit_bins(writer, table_dir, batch, written, run_id)
        except BaseException:
            if not _is_committed(table_dir, written):
                delete_files(table_dir, written)
            raise
        summary.commits += 1
        summary.segments_compacted += len({(b.broker_name, b.segment) for b in batch})
        summary.files_removed += sum(len(b.files) for b in batch)
        summary.bytes_removed += sum(b.size for b in batch)
        summary.files_added += len(written)
        summary.bytes_added += sum(a.size for a in written)
        summary.rows_rewritten += sum(a.num_records for a in written)


def plan_compaction(
    lake: Lake, target_file_size: int, min_file_fraction: float, files_up_to_version: int | None
) -> tuple[int, list[DataFile], list[Bin]]:
    """The commit log's version, its active files, and the bins to compact among the files active
    at ``files_up_to_version`` (all when None), for :func:`compact` (either engine).

    Raises:
        UnsupportedTableError: the bridge cannot read the table.
        ValidationError: ``files_up_to_version`` is beyond the table's version.
    """
    table_dir = local_directory(lake.location(COMMITLOG))
    dt = open_table(table_dir)
    check_bridge_can_read(dt, table_dir)
    eligible = eligible_paths(table_dir, dt, files_up_to_version)
    files = list_files(dt)
    bins = plan_bins(files, target_file_size, min_file_fraction, eligible)
    return dt.version(), files, bins


def compact(lake: Lake, bins: Sequence[Bin], segments_per_commit: int, run_id: str, summary: CompactSummary) -> None:
    """Rewrite ``bins``, ``segments_per_commit`` segments per commit, with put-if-absent commits
    whatever the lake's engine; fills ``summary``.

    Not delta-spark's OPTIMIZE: the brokers append to the commit log while it is compacted, with
    exclusive commits (``link(2)``), but delta-spark's LogStore for local files (``HDFSLogStore``)
    checks that a commit file is absent and then renames over it, so a broker commit landing
    between the two is silently replaced; and OPTIMIZE cannot keep to the files active at
    ``files_up_to_version``. See docs/lake.md (mixed writers).
    """
    table_dir = local_directory(lake.location(COMMITLOG))
    compact_bridge(table_dir, bins, segments_per_commit, run_id, summary)


def commitlog_files(lake: Lake) -> list[DataFile]:
    """The commit log's active files now."""
    return list_files(open_table(local_directory(lake.location(COMMITLOG))))
