"""The ``replay_ordered`` job: replay message queues strictly in queue order, queues in parallel, from
the commit log (topic queues, a group's backlog, or dead letters) into a Delta table, a broker topic or
a handler, restartable without skipping or repeating a message, and ending with an ordering report.

This module runs a replay's steps: plan, write to the sink batch by batch with progress, report.
Options are in :mod:`jobs.replay.config`, the sinks in their own modules. See docs/jobs.md
(replay_ordered: "Sources", "Sinks", "Batches and exactly once", "The ordering report").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker_model.common import (
    QUEUE_KEY,
    now_ms,
)
from broker_model.common import constants as c
from jobs.cli import run_spark_job
from jobs.lake import (
    Lake,
)
from jobs.replay.config import JOB, SOURCE_SEPARATOR, ReplayConfig, build_config, sink_spec
from jobs.replay.handler import ReplayHandler, load_handler, replay_to_handler
from jobs.replay.progress import ReplayLock, read_progress
from jobs.replay.report import format_report
from jobs.replay.source import (
    BOUND_COLUMNS,
    SUMMARY_COLUMNS,
    bound_aggregates,
    build_backlog_starts,
    build_dlq_selection,
    filter_source_records,
    merge_queue_bounds,
    queues_out_of_log_order,
    summarize_source,
)
from jobs.replay.state import ReplayOutcome, ReplayRun
from jobs.replay.table_sink import replay_to_table
from jobs.replay.topic_sink import replay_to_topic
from jobs.runs import JobRun, recorded_run
from schemas.catalog import (
    COMMITLOG,
    CONSUMER_OFFSET_COMMITS,
    DLQ,
)
from schemas.errors import LakeError, ValidationError

# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------


def run(spark: SparkSession, config: ReplayConfig) -> JobRun:
    """Replay the source into the sink, print and record the ordering report, record the run.

    Reads ``commitlog`` at its current version (and ``consumer_offset_commits`` or ``dlq``),
    ``replay_progress``; writes the sink, ``replay_progress``, ``replay_report`` and one ``job_runs``
    row: SUCCEEDED, NOOP (nothing left to replay) or FAILED (a handler queue failed: the other
    queues completed; or an error, re-raised).

    Raises:
        ValidationError: bad handler, a Delta sink with other columns, a source missing its table.
        BrokerLockedError: a target broker runs in another process.
        LakeError: the lake has no commit log.
    """
    lake = Lake(spark, config.lake, config.engine)
    handler = load_handler(config.handler) if config.handler is not None else None
    if config.to_table is not None:
        _check_sink_table(lake, config.to_table)
    with ReplayLock(config.lake, config.replay_id), recorded_run(lake, JOB, {"replay_id": config.replay_id}) as job_run:
        state = _prepare(lake, config)
        job_run.input_versions = {COMMITLOG.name: state.commitlog_version}
        outcome = _replay(state, job_run, handler)
        job_run.row_counts = {"replayed": outcome.rows, "batches": outcome.batches, "queues": len(outcome.report)}
        print("\n".join(format_report(outcome.report, config.replay_id, config.sink_label)))
        failed = "; ".join(
            f"{SOURCE_SEPARATOR.join(map(str, key))}: {why}" for key, why in sorted(outcome.failed.items())
        )
        status = "FAILED" if outcome.failed else ("SUCCEEDED" if outcome.batches else "NOOP")
        message = f"{outcome.rows} rows in {outcome.batches} batches"
        job_run.conclude(status, message + (f"; failed queues: {failed}" if failed else ""))
    if failed:
        print(f"{JOB}: queues failed (the others completed): {failed}")
    return job_run


def _check_sink_table(lake: Lake, path: Path) -> None:
    actual = lake.schema(sink_spec(path))
    if actual is None:
        if path.exists() and any(path.iterdir()):
            raise ValidationError("--to-table", str(path), "is a non-empty directory but no Delta table")
        return
    expected = sink_spec(path).arrow_schema
    if [(f.name, str(f.type)) for f in actual] != [(f.name, str(f.type)) for f in expected]:
        raise ValidationError(
            "--to-table",
            str(path),
            "is a Delta table with other columns than a replay sink",
            "replay into a new table",
        )


def _prepare(lake: Lake, config: ReplayConfig) -> ReplayRun:
    """Read the source's queue bounds and the replay's progress (before any write)."""
    version = lake.version(COMMITLOG)
    if version is None:
        raise LakeError(f"no commitlog table under {config.lake}; write messages first (python -m broker_model)")
    partition_filter = {"broker_name": list(config.brokers)} if config.brokers else None
    log_df = lake.read(COMMITLOG, version=version, partition_filter=partition_filter)
    records_df = filter_source_records(log_df, config.topics)
    selection_df = None
    if config.source == "dlq":
        if not lake.exists(DLQ):
            raise ValidationError("--dlq", str(config.lake), "the lake has no dlq table", "run route_dlq first")
        selection_df = build_dlq_selection(lake.read(DLQ), records_df, config.dlq_groups).cache()
        records_df = records_df.where(F.col("topic").startswith(c.DLQ_GROUP_TOPIC_PREFIX))
        positions_df = selection_df.withColumn("store_timestamp", F.lit(0).cast("long"))
        summary_df = positions_df.groupBy(*QUEUE_KEY).agg(
            *bound_aggregates(config.from_time, config.to_time), F.collect_list("queue_offset").alias("offsets")
        )
        summary = summary_df.select(*QUEUE_KEY, *BOUND_COLUMNS, "offsets").toArrow()
    else:
        # the source summarized per file and queue on the driver, from the narrow columns (bounds,
        # and the offsets the report expects): no Spark job before the write
        chunks = lake.iter_file_rows(COMMITLOG, SUMMARY_COLUMNS, version=version, partition_filter=partition_filter)
        summary = summarize_source(chunks, config.topics, config.from_time, config.to_time)
    # only a Delta sink writes with Spark; handlers and topics take the rows to the driver in order
    log_ordered = config.to_table is not None and config.source != "dlq" and _log_ordered(summary)
    bounds = merge_queue_bounds(summary)
    if config.source == "backlog":
        if not lake.exists(CONSUMER_OFFSET_COMMITS):
            raise ValidationError("--group", config.group, "the lake has no consumer_offset_commits table")
        starts_df = build_backlog_starts(lake.read(CONSUMER_OFFSET_COMMITS), config.group or "", now_ms())
        starts = {(r["broker_name"], r["topic"], r["queue_id"]): r["committed"] for r in starts_df.collect()}
        bounds = [replace(b, committed=starts[b.key]) for b in bounds if b.key in starts]
    progress = read_progress(lake, config.replay_id)
    return ReplayRun(
        lake,
        config,
        version,
        records_df,
        summary.select([*QUEUE_KEY, "offsets"]),
        selection_df,
        progress,
        bounds,
        log_ordered,
    )


def _log_ordered(summary: pa.Table) -> bool:
    """Whether every queue of ``summary`` is in queue order in the commit log; else say which are not."""
    unordered = queues_out_of_log_order(summary)
    if unordered:
        named = ", ".join(SOURCE_SEPARATOR.join(map(str, key)) for key in unordered[:5])
        more = f" and {len(unordered) - 5} more" if len(unordered) > 5 else ""
        print(
            f"{JOB}: the commit log's data files do not hold {named}{more} in queue order file after file (a "
            "corrupt or foreign log, or files whose offset ranges overlap); the rows are shuffled by queue and "
            "sorted by queue offset"
        )
    return not unordered


def _replay(state: ReplayRun, job_run: JobRun, handler: ReplayHandler | None) -> ReplayOutcome:
    config = state.config
    try:
        if config.to_table is not None:
            return replay_to_table(state, job_run, config.to_table)
        if config.to_topic is not None:
            return replay_to_topic(state, job_run, config.to_topic)
        assert handler is not None
        return replay_to_handler(state, job_run, handler)
    finally:
        if state.selection_df is not None:
            state.selection_df.unpersist()


# -- Delta table --------------------------------------------------------------------------------


# -- rows to the driver -------------------------------------------------------------------------


# -- handler ------------------------------------------------------------------------------------


# -- broker topic -------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse and validate ``argv`` (before starting Spark), build the session, run.
    Returns 1 when a handler queue failed (the other queues completed), else 0."""
    job_run = run_spark_job(JOB, build_config(argv), run)
    return 1 if job_run.status == "FAILED" else 0
