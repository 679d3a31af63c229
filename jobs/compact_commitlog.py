"""The ``compact_commitlog`` job: the small files of the commit log's segments packed into few large
ones (the broker's group commits leave many), by default only files every incremental job has read.
The plan and the rewrite are in :mod:`jobs.lake.compaction`. See docs/jobs.md (compact_commitlog).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from jobs import hours
from jobs.cli import job_parser, run_spark_job
from jobs.lake import (
    CompactSummary,
    Lake,
    commitlog_files,
    compact,
    pack_appended,
    plan_compaction,
)
from jobs.runs import JobRun, last_reusable, recorded_run
from schemas.catalog import (
    COMMIT_HOURS,
    COMMITLOG,
    CONSUME_QUEUE,
    CONSUMER_OFFSET_COMMITS,
    RETRY_RECORDS,
    TRANSACTION_RECORDS,
)
from schemas.errors import ValidationError

JOB = "compact_commitlog"

# the usual Delta target for files read by Spark: large enough for few files per segment (1 GiB),
# small enough for one task to sort a bin in memory
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
# files at least this fraction of the target are left alone: rewriting them gains little
DEFAULT_MIN_FILE_FRACTION = 0.75
# bounds the files written before a commit, and so the work a failed commit throws away
DEFAULT_SEGMENTS_PER_COMMIT = 64


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


# ---------------------------------------------------------------------------------------------
# Reading the log
# ---------------------------------------------------------------------------------------------


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


# the jobs that read the offset commits incrementally, each from the version its last run read
COMMIT_READERS = ("consumer_offsets", "route_dlq")


def commits_read_versions(lake: Lake) -> list[int]:
    """The ``consumer_offset_commits`` versions the jobs that read its appends have read: the
    hourly summaries' (:mod:`jobs.hours`) and the last runs' of :data:`COMMIT_READERS` (none for
    a reader that has not read it)."""
    versions = [lake.transaction_version(COMMIT_HOURS, hours.APP_ID) if lake.exists(COMMIT_HOURS) else None]
    for job in COMMIT_READERS:
        previous = last_reusable(lake, job)
        versions.append(previous["input_versions"].get(CONSUMER_OFFSET_COMMITS.name) if previous else None)
    return [v for v in versions if v is not None]


def commits_read_up_to(lake: Lake) -> int | None:
    """The ``consumer_offset_commits`` version every job that reads its appends has read (None when
    none has read it)."""
    return min(commits_read_versions(lake), default=None)


def pack_offset_commits(lake: Lake) -> int | None:
    """Pack the small files of ``consumer_offset_commits`` (a broker appends one per offset flush,
    every few seconds): those every incremental reader has read (:func:`commits_read_up_to`, the
    latest version when none has; :meth:`Lake.pack_read_files`), then those appended after, in
    groups no reader's range splits (:func:`jobs.lake.pack_appended`), so that the next runs read
    a few files where the brokers left thousands. The last version committed, None when nothing
    was packed."""
    versions = commits_read_versions(lake)
    up_to = min(versions, default=None)
    if up_to is None:
        up_to = lake.version(CONSUMER_OFFSET_COMMITS)
    if up_to is None:
        return None
    packed = lake.pack_read_files(CONSUMER_OFFSET_COMMITS, up_to)
    later = pack_appended(lake, CONSUMER_OFFSET_COMMITS, versions)
    return later[-1] if later else packed


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
    lake = Lake(spark, config.lake, config.engine)
    settings = {"target_file_size": config.target_file_size, "segments_per_commit": config.segments_per_commit}
    with recorded_run(lake, JOB, settings) as job_run:
        if not lake.exists(COMMITLOG):
            print(f"{JOB}: nothing to do, no commitlog table under {config.lake}")
            job_run.conclude("NOOP", "no commitlog table")
            return job_run
        summary = CompactSummary()
        try:
            up_to = config.files_up_to_version if config.files_up_to_version is not None else read_up_to(lake)
            version, before, bins = plan_compaction(lake, config.target_file_size, config.min_file_fraction, up_to)
            job_run.input_versions = {COMMITLOG.name: version}
            if bins:
                compact(lake, bins, config.segments_per_commit, job_run.run_id, summary)
            summary.count_files(before, commitlog_files(lake))
            packed = pack_offset_commits(lake)
        finally:
            job_run.row_counts = summary.row_counts()
        if packed is not None:
            job_run.output_versions[CONSUMER_OFFSET_COMMITS.name] = packed
            print(f"{JOB}: packed the small files of {CONSUMER_OFFSET_COMMITS.name} (version {packed})")
        if not bins:
            print(f"{JOB}: nothing to do, no segment has adjacent small files to pack (lake {config.lake})")
            if packed is not None:
                job_run.conclude("SUCCEEDED", "offset commits packed")
            else:
                job_run.conclude("NOOP", "nothing to compact")
            return job_run
        job_run.output_versions[COMMITLOG.name] = lake.version(COMMITLOG) or 0
        print(
            f"{JOB}: compacted {summary.segments_compacted} segment(s) in {summary.commits} commit(s) "
            f"(lake {config.lake}, engine {lake.engine})"
        )
        print("\n".join(summary.lines()))
        job_run.conclude("SUCCEEDED", f"{summary.segments_compacted} segments compacted")
    return job_run


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
