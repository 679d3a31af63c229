"""What a running replay carries between its steps: the resolved plan, the lake, and the outcome."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from broker_model.common import (
    QUEUE_KEY,
    QueueKey,
    now_ms,
)
from jobs.lake import (
    Lake,
)
from jobs.replay.config import ReplayConfig
from jobs.replay.plan import Progress, QueueBounds, QueueRange
from jobs.replay.progress import write_progress
from jobs.replay.report import build_ordering_report
from jobs.runs import JobRun
from schemas.catalog import (
    REPLAY_REPORT,
)


@dataclass
class ReplayOutcome:
    """What a run did: rows replayed, batches, queues that failed (handler) and the report rows."""

    rows: int = 0
    batches: int = 0
    failed: dict[QueueKey, str] = field(default_factory=dict)
    report: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ReplayRun:
    """The state a run shares between its steps."""

    lake: Lake
    config: ReplayConfig
    commitlog_version: int
    records_df: DataFrame
    offsets: pa.Table  # queue key and offsets (list): the queue offsets of the source's records
    selection_df: DataFrame | None  # cached while the run lasts
    progress: dict[QueueKey, Progress]
    bounds: list[QueueBounds]
    log_ordered: bool  # the commit log order of every source queue is its queue order (order_by_log)


def start_replay(state: ReplayRun, ranges: list[QueueRange]) -> None:
    """Pin the start of queues new to the replay with a progress row at ``first - 1``."""
    new = {r.key: r.first - 1 for r in ranges if r.key not in state.progress}
    write_progress(state.lake, state.config.replay_id, new)


def ranges_df(spark: SparkSession, ranges: Sequence[QueueRange], first_batch: int) -> DataFrame:
    rows = [(*r.key, r.resume, r.end, first_batch) for r in ranges if r.pending]
    schema = "broker_name string, topic string, queue_id int, resume long, end long, first_batch long"
    return spark.createDataFrame(rows, schema)


def expected_rows(state: ReplayRun, ranges: Sequence[QueueRange], from_resume: bool) -> pa.Table:
    """Queue key and ``queue_offset`` of the source messages the report covers, from each queue's
    first offset (or this run's resume point) to its end."""
    lists = state.offsets["offsets"]
    flat = state.offsets.select(list(QUEUE_KEY)).take(pc.list_parent_indices(lists))
    flat = flat.append_column("queue_offset", pc.list_flatten(lists))
    limits = pa.table(
        {
            "broker_name": [r.broker_name for r in ranges],
            "topic": [r.topic for r in ranges],
            "queue_id": pa.array([r.queue_id for r in ranges], pa.int32()),
            "_from": pa.array([r.resume if from_resume else r.first for r in ranges], pa.int64()),
            "_end": pa.array([r.end for r in ranges], pa.int64()),
        }
    )
    joined = flat.join(limits, list(QUEUE_KEY), join_type="inner", use_threads=False)
    offset = joined["queue_offset"]
    kept = pc.and_(pc.greater_equal(offset, joined["_from"]), pc.less(offset, joined["_end"]))
    return joined.filter(kept).select([*QUEUE_KEY, "queue_offset"])


def finish_report(
    state: ReplayRun, job_run: JobRun, replayed: Iterable[pa.Table], expected: pa.Table, outcome: ReplayOutcome
) -> ReplayOutcome:
    """Compute the ordering report and append it to ``replay_report`` from the driver (one commit)."""
    config = state.config
    outcome.report = build_ordering_report(
        replayed, expected, config.replay_id, job_run.run_id, config.sink_label, now_ms()
    )
    if outcome.report:
        state.lake.append_rows(REPLAY_REPORT, pa.Table.from_pylist(outcome.report, REPLAY_REPORT.arrow_schema))
    return outcome
