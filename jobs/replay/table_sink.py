"""Replay into a Delta table: each batch is one commit carrying the application transaction
(replay id, batch), so a restarted run skips what the table already holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from broker_model.common import (
    QUEUE_KEY,
    QueueKey,
)
from jobs.lake import (
    Lake,
    WrittenFile,
    WrittenFiles,
    conform_to_catalog,
)
from jobs.replay.config import BATCH_DIR_KEY, MAX_PARTITIONS, ReplayConfig, sink_spec
from jobs.replay.plan import QueueRange, batch_count, plan_ranges, progress_after
from jobs.replay.progress import write_progress
from jobs.replay.report import build_replayed_from_sink, read_replayed_from_sink
from jobs.replay.source import build_sink_rows, build_source_rows, order_by_log, order_within_queues
from jobs.replay.state import ReplayOutcome, ReplayRun, expected_rows, finish_report, ranges_df, start_replay
from jobs.runs import JobRun
from schemas.catalog import (
    TableSpec,
)


def replay_to_table(state: ReplayRun, job_run: JobRun, path: Path) -> ReplayOutcome:
    lake, config = state.lake, state.config
    spec = sink_spec(path)
    committed = lake.transaction_version(spec, config.replay_id)
    sink_last: dict[QueueKey, int] = {}
    if committed is not None:
        last_df = (
            build_replayed_from_sink(lake.read(spec), config.replay_id)
            .groupBy(*QUEUE_KEY)
            .agg(F.max("queue_offset").alias("last"))
        )
        sink_last = {(r["broker_name"], r["topic"], r["queue_id"]): r["last"] for r in last_df.collect()}
    ranges = plan_ranges(state.bounds, config, state.progress, sink_last)
    start_replay(state, ranges)
    first_batch = 0 if committed is None else committed + 1
    outcome = ReplayOutcome(batches=batch_count(ranges, config.batch_rows))
    if outcome.batches:
        source_df = build_source_rows(
            state.records_df, ranges_df(lake.spark, ranges, first_batch), config.batch_rows, state.selection_df
        )
        if state.log_ordered:
            ordered_df = order_by_log(source_df)
        else:
            ordered_df = order_within_queues(source_df, min(MAX_PARTITIONS, max(1, sum(r.pending > 0 for r in ranges))))
        sink_df = build_sink_rows(ordered_df, config.replay_id)
        write = _write_batches_bridge if lake.engine == "bridge" else _write_batches_delta_spark
        outcome.rows = write(lake, spec, sink_df, ranges, first_batch, outcome.batches, config)
        job_run.output_versions["sink"] = lake.version(spec) or 0
    expected = expected_rows(state, ranges, from_resume=False)
    return finish_report(state, job_run, read_replayed_from_sink(lake, spec, config.replay_id), expected, outcome)


def _write_batches_bridge(
    lake: Lake,
    spec: TableSpec,
    sink_df: DataFrame,
    ranges: Sequence[QueueRange],
    first_batch: int,
    batches: int,
    config: ReplayConfig,
) -> int:
    """One Spark pass writes every batch's files (invisible until committed), then each batch is
    committed with its application transaction and its progress written after; the rows committed."""
    conform_to_catalog(sink_df, spec)  # checks the columns and types; its NOT NULL guards are left out:
    # a guard rewrites replay_batch, and the writer would then sort the rows by batch again, unstably.
    # Every sink column is a literal or a NOT NULL commit log column. The staging key is replay_batch
    # itself, the first key of the sort, so the writer keeps the order as it is.
    staged_df = sink_df.select(*spec.column_names, F.col("replay_batch").alias(BATCH_DIR_KEY))
    written = lake.stage_files(spec, staged_df, BATCH_DIR_KEY)
    by_batch: dict[int, list[WrittenFile]] = {}
    for file in written.files:
        batch = int(file.partition_values[BATCH_DIR_KEY] or 0)
        by_batch.setdefault(batch, []).append(replace(file, partition_values={}))
    rows = 0
    try:
        for index in range(batches):
            files = by_batch.pop(first_batch + index, [])
            if files:
                lake.commit_staged(
                    spec, WrittenFiles(written.directory, tuple(files)), config.replay_id, first_batch + index
                )
                rows += sum(_num_records(f) for f in files)
            write_progress(lake, config.replay_id, progress_after(ranges, index + 1, config.batch_rows))
    finally:
        for files in by_batch.values():  # files of batches an error kept from their commit
            for file in files:
                Path(lake.location(spec), file.path).unlink(missing_ok=True)
    return rows


def _num_records(file: WrittenFile) -> int:
    import json

    return int(json.loads(file.stats)["numRecords"])


def _write_batches_delta_spark(
    lake: Lake,
    spec: TableSpec,
    sink_df: DataFrame,
    ranges: Sequence[QueueRange],
    first_batch: int,
    batches: int,
    config: ReplayConfig,
) -> int:
    """One write per batch through :meth:`Lake.append` with the application transaction (Delta's
    own writer keeps no staged files between commits); the rows written."""
    rows = 0
    for index in range(batches):
        batch = first_batch + index
        batch_df = sink_df.where(F.col("replay_batch") == F.lit(batch)).cache()
        try:
            count = batch_df.count()
            if count:
                lake.append(spec, batch_df, config.replay_id, batch)
                rows += count
        finally:
            batch_df.unpersist()
        write_progress(lake, config.replay_id, progress_after(ranges, index + 1, config.batch_rows))
    return rows
