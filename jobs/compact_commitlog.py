"""The ``compact_commitlog`` job: bin-packs the small files of the commit log's segments.

The broker commits often (group commit), so each commit log segment (partition ``broker_name``,
``segment``) ends up as many small Parquet files, and every reader of the log pays for each one.
The broker only ever adds files: it never rewrites or removes one. So the files of any segment,
the one still being written included, can be rewritten into a few large ones without changing a
row, while the broker goes on appending beside them.

What is compacted:

- in every segment, the files smaller than ``min_file_fraction * target_file_size`` are the
  candidates. Ordered by their first ``commit_log_offset`` (from the file statistics of the
  Delta log), the segment's files fall into runs of consecutive candidates: a file that is not one
  (a large file, or one ``files_up_to_version`` keeps out) ends a run. Each run is packed greedily
  into bins of at most ``target_file_size`` bytes, and each bin becomes one file. So a new file
  never spans the offsets of a file it does not replace: the files of a segment keep disjoint
  offset ranges, which readers use to skip files and to take the log in order file by file. Files
  without offset statistics (other writers') are packed only among themselves. A bin of a single
  file is dropped (rewriting one file gains nothing);
- with ``files_up_to_version`` only the files already active at that commit log version are
  candidates (see "Incremental readers" below); in the segment being written, those are the
  oldest files, so the newer ones simply follow the compacted file.

How (bridge engine): the rows of a bin are read with Arrow, checked against the catalog types
(a null in a NOT NULL column stops the run, nothing is committed), sorted by
``commit_log_offset`` and written with the broker's own file writer
(:meth:`broker_model.store.AppendLog.write_files`): same Arrow schema, same NOT NULL fields,
same statistics as the files the broker writes, so the broker's own readers, which concatenate
the Arrow tables of many files, read compacted and fresh files alike. Spark's Parquet writer is not
used here because it writes every column as nullable. Then one Delta commit per batch of at most
``segments_per_commit`` segments, made with delta-rs: ``remove`` of the bins' files and ``add`` of
the new files, all with ``dataChange=false``.

Concurrency: the broker never touches a file this job removes. The commit is made against a
snapshot in which every file to remove is checked to be active; delta-rs then checks every commit
made after that snapshot before it writes its own log entry (put-if-absent): the broker's blind
appends, to the segment being compacted as much as to any other, do not conflict and the commit
lands after them; a concurrent compaction that removed the same files makes the commit fail. On a
failure the new files are deleted and nothing is committed. A running broker's consume side points
its entries of the removed files at the same rows in the new ones (found by commit log offset),
without indexing its log again.

Crash safety: new files first, one atomic log entry last. A run killed before its commit leaves
files that no version references: invisible to every reader and harmless. They, and the small
files a compaction removed (kept for time travel and for incremental jobs reading older
versions), are deleted by a Delta VACUUM once older than its retention: delta-rs
``DeltaTable(path).vacuum(retention_hours=168, dry_run=False, full=True)`` (``full`` also
deletes files never committed) or delta-spark's ``VACUUM``. Keep the retention longer than the
longest pause between two runs of the incremental jobs.

Incremental readers: :meth:`jobs.lake.Lake.read_appended` skips ``dataChange=false`` adds, so
compacted rows never look new. A version range that both added a file and compacted it away
cannot be read as appends (``IncrementalReadError``), and an incremental job would then rebuild in
full. So by default only the files every incremental job that has run has read are candidates
(:data:`INCREMENTAL_READERS`: the least commit log version their application transactions
record; a job that never ran reads the whole log on its first run anyway); with none run, every
file is. ``--files-up-to-version`` sets that version instead.

delta-spark engine: ``OPTIMIZE ... WHERE`` on the planned segments, with Delta's optimize minimum
and maximum file sizes set to this job's options for the statement. Delta then bin-packs those
partitions itself, skips single-file bins and commits ``dataChange=false`` with its own conflict
checks; the rows of a compacted file come in the order of their source files (each in offset
order), not re-sorted. ``OPTIMIZE`` takes whole partitions, whatever ``files_up_to_version``
says and whether or not files are adjacent, so with this engine only **sealed** segments (a later
segment of the same broker exists: nothing is added to them any more) are planned; the segment
each broker is writing is left alone.

A run with nothing to compact commits nothing and records a NOOP run.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction
from pyspark.sql import SparkSession

from broker_model.store import AddFile, AppendLog
from jobs.cli import job_parser, run_spark_job
from jobs.lake import (
    Lake,
    check_bridge_can_read,
    file_location,
    local_directory,
    open_table,
    replace_where,
)
from jobs.runs import JobRun, record_run
from schemas.catalog import COMMITLOG, CONSUME_QUEUE, RETRY_RECORDS, TRANSACTION_RECORDS
from schemas.errors import LakeError, ValidationError

JOB = "compact_commitlog"

# the usual Delta target for files read by Spark: large enough for few files per segment (1 GiB),
# small enough for one task to sort a bin in memory
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
# files at least this fraction of the target are left alone: rewriting them gains little
DEFAULT_MIN_FILE_FRACTION = 0.75
# bounds the files written before a commit, and so the work a failed commit throws away
DEFAULT_SEGMENTS_PER_COMMIT = 64
# every retry re-checks only the commits made since the previous attempt; the broker commits often
COMMIT_RETRIES = 100

SegmentKey = tuple[str, int]

_DATA_SCHEMA = pa.schema([f for f in COMMITLOG.arrow_schema if f.name in COMMITLOG.data_columns])
_DELTA_MAX_FILE_SIZE = "spark.databricks.delta.optimize.maxFileSize"
_DELTA_MIN_FILE_SIZE = "spark.databricks.delta.optimize.minFileSize"


@dataclass(frozen=True)
class CompactConfig:
    """Options of the job.

    Attributes:
        lake: the lake root.
        target_file_size: the size (bytes) a bin of files is packed up to, > 0.
        min_file_fraction: files of at least this fraction of ``target_file_size`` are left alone;
            in (0, 1].
        segments_per_commit: at most this many segments are rewritten per Delta commit, >= 1.
        files_up_to_version: only files active at this commit log version are candidates; None
            for the version the incremental jobs have read (:func:`read_up_to`).
        engine: lake engine, ``auto``, ``bridge`` or ``delta-spark``.

    Raises:
        ValidationError: a setting out of range.
    """

    lake: Path
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    min_file_fraction: float = DEFAULT_MIN_FILE_FRACTION
    segments_per_commit: int = DEFAULT_SEGMENTS_PER_COMMIT
    files_up_to_version: int | None = None
    engine: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.target_file_size, bool) or self.target_file_size <= 0:
            raise ValidationError("target_file_size", self.target_file_size, "not a size in bytes > 0")
        if not 0 < self.min_file_fraction <= 1:
            raise ValidationError("min_file_fraction", self.min_file_fraction, "not in (0, 1]", "e.g. 0.75")
        if self.segments_per_commit < 1:
            raise ValidationError("segments_per_commit", self.segments_per_commit, "not >= 1")
        if self.files_up_to_version is not None and self.files_up_to_version < 0:
            raise ValidationError("files_up_to_version", self.files_up_to_version, "not a Delta version >= 0")


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

    def lines(self) -> list[str]:
        """The summary printed on stdout."""
        return [f"  {name:<22}{value:>14}" for name, value in self.row_counts().items()]


# ---------------------------------------------------------------------------------------------
# The plan (pure Python)
# ---------------------------------------------------------------------------------------------


def sealed_segments(files: Iterable[DataFile]) -> frozenset[SegmentKey]:
    """The segments that have a later segment of the same broker among ``files``."""
    keys = {f.segment_key for f in files}
    last: dict[str, int] = {}
    for broker_name, segment in keys:
        last[broker_name] = max(last.get(broker_name, segment), segment)
    return frozenset(k for k in keys if k[1] < last[k[0]])


def plan_bins(
    files: Sequence[DataFile],
    target_file_size: int,
    min_file_fraction: float,
    eligible: Collection[str] | None = None,
    sealed_only: bool = False,
) -> list[Bin]:
    """The bins to rewrite: see the module docstring for the rule.

    Args:
        files: every active file of the commit log.
        target_file_size, min_file_fraction: see :class:`CompactConfig`.
        eligible: the paths that may be compacted (see :func:`eligible_paths`); None for all.
        sealed_only: plan only the segments that have a later segment of the same broker (the
            delta-spark engine's rule), not the one each broker is writing.

    Deterministic: segments in (broker_name, segment) order, files in (first_offset, path) order
    (files without statistics last), bins in packing order.
    """
    sealed = sealed_segments(files)
    threshold = min_file_fraction * target_file_size
    by_segment: dict[SegmentKey, list[DataFile]] = {}
    for data_file in files:
        if not sealed_only or data_file.segment_key in sealed:
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


# ---------------------------------------------------------------------------------------------
# Reading the log
# ---------------------------------------------------------------------------------------------


def list_files(dt: DeltaTable) -> list[DataFile]:
    """The active files of a commit log snapshot, with the statistics the plan uses."""
    actions = pa.table(dt.get_add_actions(flatten=True))
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


# the jobs that read the commit log incrementally: (table, application transaction id) of the
# commit log version each has read
INCREMENTAL_READERS = (
    (CONSUME_QUEUE, "rebuild_consume_queue"),
    (TRANSACTION_RECORDS, "resolve_transactions"),
    (RETRY_RECORDS, "route_dlq"),
)


def read_up_to(lake: Lake) -> int | None:
    """The commit log version every incremental job that has run has read (None when none has):
    compaction leaves later files alone, so those jobs read them as appends."""
    versions = [lake.transaction_version(spec, app_id) for spec, app_id in INCREMENTAL_READERS]
    return min((v for v in versions if v is not None), default=None)


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


# ---------------------------------------------------------------------------------------------
# The bridge: rewrite with Arrow, commit with delta-rs
# ---------------------------------------------------------------------------------------------


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


def commit_bins(table_dir: str, bins: Sequence[Bin], written: Sequence[AddFile], run_id: str) -> int:
    """Commit ``written`` in place of the bins' files, one Delta commit, every action ``dataChange=false``.

    The commit is made against the latest snapshot once every file to remove is checked active in
    it; delta-rs checks the commits made after that snapshot and retries over the ones that do not
    conflict (appends). Returns the table version after the commit.

    Raises:
        LakeError: a file to remove is no longer active (another compaction), delta-rs refused the
            commit (a conflicting commit), or the commit left a removed file active. Nothing of
            this batch is then committed, except in the last case (the error says so).
    """
    dt = open_table(table_dir)
    active = {f.path for f in list_files(dt)}
    gone = [f.path for b in bins for f in b.files if f.path not in active]
    if gone:
        raise LakeError(f"files to compact in {table_dir} were removed by another writer: {gone[:3]}; run again")
    now = int(time.time() * 1000)
    removes = [RemoveAction(unquote(f.path), False, now, f.size, b.partition_values) for b in bins for f in b.files]
    adds = [
        AddAction(unquote(a.path), a.size, a.partition_values, now, False, json.dumps(a.stats, separators=(",", ":")))
        for a in written
    ]
    properties = CommitProperties(custom_metadata={"job": JOB, "run_id": run_id}, max_commit_retries=COMMIT_RETRIES)
    try:
        dt.create_write_transaction(
            [*adds, *removes],
            mode="append",
            schema=dt.schema(),
            partition_by=list(COMMITLOG.partition_by),
            commit_properties=properties,
        )
    except DeltaError as err:
        raise LakeError(f"delta-rs refused the compaction commit to {table_dir}: {err}; nothing was committed") from err
    after = open_table(table_dir)
    still = {f.path for f in list_files(after)} & {f.path for b in bins for f in b.files}
    if still:
        raise LakeError(
            f"the compaction of {table_dir} committed but left {sorted(still)[:3]} active; "
            "the table holds their rows twice, remove the compacted files of those segments"
        )
    return after.version()


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
            commit_bins(table_dir, batch, written, run_id)
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


# ---------------------------------------------------------------------------------------------
# delta-spark: Delta's own OPTIMIZE
# ---------------------------------------------------------------------------------------------


def optimize_statement(path: str, bins: Sequence[Bin]) -> str:
    """The ``OPTIMIZE`` statement restricted to the segments of ``bins``."""
    targets = sorted({(b.broker_name, b.segment) for b in bins})
    predicate = replace_where(COMMITLOG, [{"broker_name": name, "segment": str(segment)} for name, segment in targets])
    return f"OPTIMIZE delta.`{path.replace('`', '``')}` WHERE {predicate}"


def compact_delta_spark(
    spark: SparkSession, path: str, bins: Sequence[Bin], config: CompactConfig, summary: CompactSummary
) -> None:
    """Run Delta's ``OPTIMIZE`` on the segments of ``bins``, one statement per batch of segments."""
    sizes = {
        _DELTA_MAX_FILE_SIZE: str(config.target_file_size),
        _DELTA_MIN_FILE_SIZE: str(math.ceil(config.min_file_fraction * config.target_file_size)),
    }
    previous = {key: spark.conf.get(key, None) for key in sizes}
    try:
        for key, value in sizes.items():
            spark.conf.set(key, value)
        for batch in batches(bins, config.segments_per_commit):
            metrics = spark.sql(optimize_statement(path, batch)).select("metrics.*").first()
            summary.commits += 1
            summary.segments_compacted += len({(b.broker_name, b.segment) for b in batch})
            if metrics is not None:
                summary.files_removed += int(metrics["numFilesRemoved"])
                summary.files_added += int(metrics["numFilesAdded"])
    finally:
        for key, old in previous.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


def run(spark: SparkSession, config: CompactConfig) -> JobRun:
    """Compact the segments of the lake's commit log (see the module docstring); print and record the run.

    Returns:
        The recorded run: SUCCEEDED (``output_versions`` the commit log version after the last
        commit), NOOP (nothing to compact, nothing committed) or FAILED (re-raised).

    Raises:
        LakeError: the bridge cannot read the table, a file cannot be compacted, or a commit
            conflicted (see :func:`commit_bins`).
    """
    job_run = JobRun(JOB)
    lake = Lake(spark, config.lake, config.engine)
    if not lake.exists(COMMITLOG):
        print(f"{JOB}: nothing to do, no commitlog table under {config.lake}")
        record_run(lake, job_run.finish("NOOP", "no commitlog table"))
        return job_run
    table_dir = local_directory(lake.location(COMMITLOG))
    summary = CompactSummary()
    try:
        dt = open_table(table_dir)
        if lake.engine == "bridge":
            check_bridge_can_read(dt, table_dir)
        up_to = config.files_up_to_version if config.files_up_to_version is not None else read_up_to(lake)
        eligible = eligible_paths(table_dir, dt, up_to)
        job_run.input_versions = {COMMITLOG.name: dt.version()}
        bins = plan_bins(
            list_files(dt),
            config.target_file_size,
            config.min_file_fraction,
            eligible,
            sealed_only=lake.engine != "bridge",
        )
        if bins and lake.engine == "bridge":
            compact_bridge(table_dir, bins, config.segments_per_commit, job_run.run_id, summary)
        elif bins:
            compact_delta_spark(spark, table_dir, bins, config, summary)
        _count_files(summary, list_files(dt), list_files(open_table(table_dir)))
    except Exception as err:
        job_run.row_counts = summary.row_counts()
        record_run(lake, job_run.finish("FAILED", f"{type(err).__name__}: {err}"))
        raise
    job_run.row_counts = summary.row_counts()
    if not bins:
        print(f"{JOB}: nothing to do, no segment has adjacent small files to pack (lake {config.lake})")
        record_run(lake, job_run.finish("NOOP", "nothing to compact"))
        return job_run
    job_run.output_versions = {COMMITLOG.name: open_table(table_dir).version()}
    print(
        f"{JOB}: compacted {summary.segments_compacted} segment(s) in {summary.commits} commit(s) "
        f"(lake {config.lake}, engine {lake.engine})"
    )
    print("\n".join(summary.lines()))
    record_run(lake, job_run.finish("SUCCEEDED", f"{summary.segments_compacted} segments compacted"))
    return job_run


def _count_files(summary: CompactSummary, before: Sequence[DataFile], after: Sequence[DataFile]) -> None:
    summary.files_before, summary.bytes_before = len(before), sum(f.size for f in before)
    summary.files_after, summary.bytes_after = len(after), sum(f.size for f in after)


def build_parser() -> argparse.ArgumentParser:
    """Options of ``compact_commitlog``."""
    parser = job_parser(JOB, __doc__)
    parser.add_argument(
        "--target-file-size",
        type=int,
        default=DEFAULT_TARGET_FILE_SIZE,
        help=f"bytes a bin of small files is packed up to (default {DEFAULT_TARGET_FILE_SIZE})",
    )
    parser.add_argument(
        "--min-file-fraction",
        type=float,
        default=DEFAULT_MIN_FILE_FRACTION,
        help=f"files of at least this fraction of the target size are left alone (default {DEFAULT_MIN_FILE_FRACTION})",
    )
    parser.add_argument(
        "--segments-per-commit",
        type=int,
        default=DEFAULT_SEGMENTS_PER_COMMIT,
        help=f"segments rewritten per Delta commit (default {DEFAULT_SEGMENTS_PER_COMMIT})",
    )
    parser.add_argument(
        "--files-up-to-version",
        type=int,
        default=None,
        help="only compact files already in this commit log version; default: the version every "
        "incremental job that has run has read (all files when none has run)",
    )
    return parser


def build_config(argv: Sequence[str] | None = None) -> CompactConfig:
    """The config of ``argv``.

    Raises:
        ValidationError: a setting out of range.
        SystemExit: argparse usage errors and ``--help``.
    """
    args = build_parser().parse_args(argv)
    return CompactConfig(
        Path(args.lake),
        args.target_file_size,
        args.min_file_fraction,
        args.segments_per_commit,
        args.files_up_to_version,
        args.engine,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` (before starting Spark), build the session, run."""
    run_spark_job(JOB, build_config(argv), run)
    return 0
