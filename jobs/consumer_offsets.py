"""The ``consumer_offsets`` job: committed offsets and lag per consumer group and queue as of a time
T (RocketMQ's ``mqadmin consumerProgress`` figures), from ``consumer_offset_commits`` and
``consume_queue``; a rerun on the same inputs and T changes nothing. See docs/jobs.md.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_model.common import GROUP_QUEUE_KEY, QUEUE_KEY, RETRY_GROUP_TOPIC_PREFIX
from jobs.cli import add_as_of, as_of_of, iso_utc, job_parser, run_spark_job, text_table
from jobs.lake import Lake
from jobs.rules import build_current_offsets
from jobs.runs import JobRun, latest_reusable_run, read_or_empty, record_run, same_inputs, table_versions
from schemas.catalog import CONSUME_QUEUE, CONSUMER_OFFSET_COMMITS, CONSUMER_OFFSETS
from schemas.errors import LakeError

JOB = "consumer_offsets"
QUEUE_NOT_FOUND = "QUEUE_NOT_FOUND"
INPUTS = (CONSUMER_OFFSET_COMMITS, CONSUME_QUEUE)
QUEUE_BOUNDS_COLUMNS = (*QUEUE_KEY, "broker_min_offset", "broker_offset")

# Statuses of earlier runs whose recorded inputs make a rerun a no-op (FAILED runs wrote nothing).
_AS_OF_MESSAGE = re.compile(r"^as_of=(-?\d+)(?:;|$)")


@dataclass(frozen=True)
class ConsumerOffsetsConfig:
    """Options of the job.

    Attributes:
        lake: the lake root.
        as_of: the time T the figures are computed for, epoch milliseconds.
        groups: groups to print (empty: all); the table always holds every group.
        engine: lake engine, ``auto``, ``bridge`` or ``delta-spark``.
    """

    lake: Path
    as_of: int
    groups: tuple[str, ...] = ()
    engine: str = "auto"


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------


def build_queue_bounds(consume_queue_df: DataFrame, as_of: int) -> DataFrame:
    """Per queue, the bounds of its consume-queue rows stored at or before ``as_of``.

    Args:
        consume_queue_df: rows of ``consume_queue`` (at least the queue key, ``queue_offset`` and
            ``store_timestamp``).
        as_of: epoch milliseconds; entries with ``store_timestamp <= as_of`` count.

    Returns:
        :data:`QUEUE_BOUNDS_COLUMNS`: ``broker_min_offset`` is the smallest queue offset,
        ``broker_offset`` the largest plus one (the next offset to be written). A queue with no
        such entry has no row.
    """
    return (
        filter_cq_rows_as_of(consume_queue_df, as_of)
        .groupBy(*QUEUE_KEY)
        .agg(
            F.min("queue_offset").alias("broker_min_offset"),
            (F.max("queue_offset") + F.lit(1)).alias("broker_offset"),
        )
        .select(*QUEUE_BOUNDS_COLUMNS)
    )


def filter_cq_rows_as_of(consume_queue_df: DataFrame, as_of: int) -> DataFrame:
    """The consume-queue rows stored at or before ``as_of`` (epoch ms), columns unchanged."""
    return consume_queue_df.where(F.col("store_timestamp") <= F.lit(as_of))


def build_consumer_offsets(
    current_df: DataFrame, bounds_df: DataFrame, consume_queue_df: DataFrame, as_of: int
) -> DataFrame:
    """The ``consumer_offsets`` table: offsets and lag per (group, broker_name, topic, queue_id).

    Args:
        current_df: :func:`build_current_offsets` at ``as_of``.
        bounds_df: :func:`build_queue_bounds` at ``as_of``.
        consume_queue_df: rows of ``consume_queue``; entries stored after ``as_of`` are ignored.
        as_of: epoch milliseconds, written to every row.

    Returns:
        Exactly the ``consumer_offsets`` catalog columns, one row per listed queue (see the module
        docstring for which queues are listed). With ``c = coalesce(consumer_offset, 0)``:
        ``diff = broker_offset - c`` (negative when a commit is beyond the queue's end; null for
        QUEUE_NOT_FOUND); ``last_timestamp`` is the store time of the entry at
        ``consumer_offset - 1`` (null when there is none: no commit, an offset at or below the
        first entry or beyond the last, a gap); ``oldest_unconsumed_timestamp`` is the store time
        of the entry at ``greatest(c, broker_min_offset)`` when ``c < broker_offset`` (an offset
        below the first entry is served from the first entry on, as RocketMQ moves it there).
        Should the consume queue hold two entries at one queue offset, the earlier store time is
        taken, so each key still has exactly one row.
    """
    rows_df = build_listed_queues(current_df, bounds_df).join(bounds_df, on=list(QUEUE_KEY), how="left")
    cq_rows_df = filter_cq_rows_as_of(consume_queue_df, as_of)
    counted = F.coalesce(F.col("consumer_offset"), F.lit(0).cast("long"))
    last_df = _cq_row_times(rows_df, cq_rows_df, F.col("consumer_offset") - F.lit(1), "last_timestamp")
    unconsumed_df = rows_df.where(counted < F.col("broker_offset"))
    oldest_df = _cq_row_times(
        unconsumed_df, cq_rows_df, F.greatest(counted, F.col("broker_min_offset")), "oldest_unconsumed_timestamp"
    )
    return (
        rows_df.join(last_df, on=list(GROUP_QUEUE_KEY), how="left")
        .join(oldest_df, on=list(GROUP_QUEUE_KEY), how="left")
        .select(
            *GROUP_QUEUE_KEY,
            "consumer_offset",
            "broker_min_offset",
            "broker_offset",
            (F.col("broker_offset") - counted).alias("diff"),
            "last_timestamp",
            "oldest_unconsumed_timestamp",
            F.lit(as_of).cast("long").alias("as_of"),
            _anomaly().alias("anomaly"),
        )
    )


def build_listed_queues(current_df: DataFrame, bounds_df: DataFrame) -> DataFrame:
    """The committed queues plus, per group, every queue of its topics and of its retry topic.

    Args:
        current_df: :func:`build_current_offsets`.
        bounds_df: :func:`build_queue_bounds`; only its queues are added.

    Returns:
        ``group, broker_name, topic, queue_id, consumer_offset``, one row per key; added queues
        have a null ``consumer_offset``.
    """
    retry_topic = F.concat(F.lit(RETRY_GROUP_TOPIC_PREFIX), F.col("group")).alias("topic")
    subscribed_df = current_df.select("group", "topic").unionByName(current_df.select("group", retry_topic)).distinct()
    listed_df = subscribed_df.join(bounds_df.select(*QUEUE_KEY), on="topic", how="inner").select(*GROUP_QUEUE_KEY)
    return (
        current_df.select(*GROUP_QUEUE_KEY, "consumer_offset")
        .join(listed_df, on=list(GROUP_QUEUE_KEY), how="full")
        .select(*GROUP_QUEUE_KEY, "consumer_offset")
    )


def _cq_row_times(rows_df: DataFrame, cq_rows_df: DataFrame, queue_offset: Column, name: str) -> DataFrame:
    """``group`` + queue key + ``name``: the store time of the entry at ``queue_offset`` of each row.

    An equi-join on (broker_name, topic, queue_id, queue_offset), not a per-row lookup; rows
    without such an entry are absent; duplicate entries resolve to the earliest store time.
    """
    wanted_df = rows_df.select(*GROUP_QUEUE_KEY, queue_offset.alias("queue_offset"))
    found_df = wanted_df.join(
        cq_rows_df.select(*QUEUE_KEY, "queue_offset", "store_timestamp"),
        on=[*QUEUE_KEY, "queue_offset"],
        how="inner",
    )
    return found_df.groupBy(*GROUP_QUEUE_KEY).agg(F.min("store_timestamp").alias(name)).select(*GROUP_QUEUE_KEY, name)


def _anomaly() -> Column:
    return F.when(F.col("broker_offset").isNull(), F.lit(QUEUE_NOT_FOUND)).otherwise(F.lit(None).cast("string"))


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


def run(spark: SparkSession, config: ConsumerOffsetsConfig) -> JobRun:
    """Compute ``consumer_offsets`` as of ``config.as_of``, print the progress view, record the run.

    Reads the current versions of ``consumer_offset_commits`` and ``consume_queue`` (a missing
    table counts as empty, giving an empty output table), overwrites ``consumer_offsets`` unless
    the run is a no-op (module docstring), and appends one ``job_runs`` row: SUCCEEDED or NOOP
    with the input versions, the output version and row counts, or FAILED before re-raising.

    Returns:
        The recorded run.
    """
    lake = Lake(spark, config.lake, config.engine)
    job_run = JobRun(JOB)
    job_run.input_versions = table_versions(lake, [spec.name for spec in INPUTS])
    try:
        version = _reusable_output_version(lake, job_run.input_versions, config.as_of)
        status = "NOOP" if version is not None else "SUCCEEDED"
        if version is None:
            version = _compute_and_write(lake, job_run, config.as_of)
        offsets_df = lake.read(CONSUMER_OFFSETS, version=version)
        job_run.output_versions[CONSUMER_OFFSETS.name] = version
        job_run.row_counts[CONSUMER_OFFSETS.name] = offsets_df.count()
        print("\n".join(format_progress(_progress_rows(offsets_df, config.groups), config.as_of, config.groups)))
    except Exception as err:
        record_run(lake, job_run.finish("FAILED", f"as_of={config.as_of}; {type(err).__name__}: {err}"))
        raise
    record_run(lake, job_run.finish(status, f"as_of={config.as_of}; {_summary(status)}"))
    return job_run


def _compute_and_write(lake: Lake, job_run: JobRun, as_of: int) -> int:
    """Read the inputs at the recorded versions, compute, overwrite; the committed version."""
    commits_df = read_or_empty(lake, CONSUMER_OFFSET_COMMITS, job_run.input_versions)
    queue_df = read_or_empty(lake, CONSUME_QUEUE, job_run.input_versions)
    current_df = build_current_offsets(commits_df, as_of)
    offsets_df = build_consumer_offsets(current_df, build_queue_bounds(queue_df, as_of), queue_df, as_of)
    version = lake.overwrite(CONSUMER_OFFSETS, offsets_df)
    if version is None:
        raise LakeError(f"the overwrite of {lake.location(CONSUMER_OFFSETS)} committed no version; run the job again")
    job_run.row_counts[CONSUMER_OFFSET_COMMITS.name] = commits_df.count()
    job_run.row_counts[CONSUME_QUEUE.name] = queue_df.count()
    return version


def _reusable_output_version(lake: Lake, input_versions: Mapping[str, int], as_of: int) -> int | None:
    """The current ``consumer_offsets`` version when the latest reusable run had these inputs and
    this ``as_of`` and wrote (or kept) that very version; else None (compute again)."""
    current = lake.version(CONSUMER_OFFSETS)
    previous = latest_reusable_run(lake, JOB) if current is not None else None
    if previous is None:
        return None
    unchanged = same_inputs(lake, previous["input_versions"], input_versions)
    same_output = previous["output_versions"].get(CONSUMER_OFFSETS.name) == current
    return current if unchanged and same_output and as_of_of_message(previous["message"]) == as_of else None


def as_of_of_message(message: str | None) -> int | None:
    """The ``as_of`` a run of this job recorded in its job_runs ``message``, None when absent."""
    found = _AS_OF_MESSAGE.match(message or "")
    return int(found.group(1)) if found else None


def _summary(status: str) -> str:
    return "inputs and as_of unchanged, nothing written" if status == "NOOP" else "consumer_offsets overwritten"


def _progress_rows(offsets_df: DataFrame, groups: Sequence[str]) -> list[dict[str, Any]]:
    if groups:
        offsets_df = offsets_df.where(F.col("group").isin(*groups))
    return [row.asDict() for row in offsets_df.collect()]


# ---------------------------------------------------------------------------------------------
# The printed view
# ---------------------------------------------------------------------------------------------

_HEADER = ("#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff", "#LastTime", "#Note")


def format_progress(rows: Sequence[Mapping[str, Any]], as_of: int, groups: Sequence[str] = ()) -> list[str]:
    """The lines of a consumerProgress-like view of ``consumer_offsets`` rows, per group.

    Per group (sorted by name): a title, then one line per queue sorted by (topic, broker_name,
    queue_id) as RocketMQ sorts message queues, then ``Diff Total`` (sum of the known diffs).
    A null consumer offset prints as 0 (as RocketMQ prints a missing offset) with the note
    ``no commit``; unknown bounds print as ``-``; times are UTC ISO-8601, ``N/A`` when null.
    Each group of ``groups`` without rows gets a line saying so.
    """
    lines = [f"consumer progress as of {iso_utc(as_of)} ({as_of})"]
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_group.setdefault(row["group"], []).append(row)
    for group in sorted(by_group):
        queue_rows = sorted(by_group[group], key=lambda r: (r["topic"], r["broker_name"], r["queue_id"]))
        lines += ["", f"Group: {group}", *text_table([_HEADER, *(_cells(r) for r in queue_rows)])]
        lines.append(f"Diff Total: {sum(r['diff'] for r in queue_rows if r['diff'] is not None)}")
    lines += [f"Group: {group}: no offsets as of {iso_utc(as_of)}" for group in groups if group not in by_group]
    return lines


def _cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    note = row["anomaly"] or ("no commit" if row["consumer_offset"] is None else "")
    return (
        row["topic"],
        row["broker_name"],
        str(row["queue_id"]),
        _or_dash(row["broker_offset"]),
        str(row["consumer_offset"] if row["consumer_offset"] is not None else 0),
        _or_dash(row["diff"]),
        iso_utc(row["last_timestamp"]) if row["last_timestamp"] is not None else "N/A",
        note,
    )


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Options of ``consumer_offsets``."""
    parser = job_parser(JOB, __doc__)
    add_as_of(parser)
    parser.add_argument(
        "--group",
        action="append",
        default=[],
        help="print only this group (repeatable); the table always holds every group",
    )
    return parser


def build_config(argv: Sequence[str] | None = None) -> ConsumerOffsetsConfig:
    """The config of ``argv``; ``--as-of`` defaults to the current time.

    Raises:
        ValidationError: ``--as-of`` is neither epoch ms nor ISO-8601 with a zone.
        SystemExit: argparse usage errors and ``--help``.
    """
    args = build_parser().parse_args(argv)
    as_of = as_of_of(args.as_of)
    return ConsumerOffsetsConfig(Path(args.lake), as_of, tuple(dict.fromkeys(args.group)), args.engine)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` (before starting Spark), build the session, run."""
    run_spark_job(JOB, build_config(argv), run)
    return 0
